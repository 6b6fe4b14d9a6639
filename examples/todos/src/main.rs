//! A projection in your own code, deployed with SAM: `event-store projection
//! create todos --kind function --function <service>-<stage>-sub-todos
//! --category todo` (docs/projections.md).

mod todos;

#[tokio::main]
async fn main() -> Result<(), lambda_runtime::Error> {
    event_store::views::lambda::run(todos::Todos).await
}
