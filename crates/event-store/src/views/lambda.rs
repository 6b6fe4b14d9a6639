//! A projection in the user's code, as a Lambda function. The subscriptions
//! function invokes it with each batch of a partition (a Lambda target's
//! payload, with the view it writes); [`handle`] applies the batch with the
//! user's [`Projection`] exactly once, as the store applies a built-in one;
//! [`run`] is the whole `main` of such a function (`examples/todos`).

use serde::Deserialize;
use serde_json::{json, Value};

use super::{table, Projection, ViewEvent, ViewRef};
use crate::batch::Backoff;
use crate::error::Error;

/// What a projection's function is invoked with.
#[derive(Debug, Clone, Deserialize)]
pub struct ViewBatch {
    pub subscription: String,
    pub partition: u32,
    pub view: ViewRef,
    pub events: Vec<ViewEvent>,
}

/// Applies `batch` to its view in `view_table` with `projection`. The answer
/// is the one the subscription's runner reads: `batchItemFailures` from the
/// event the projection refused (retried, then parked), or `unavailable`
/// when the store could not be written (the partition backs off; nothing is
/// parked for a failure that is not the events').
pub async fn handle(
    dynamo: &aws_sdk_dynamodb::Client,
    view_table: &str,
    projection: &dyn Projection,
    batch: ViewBatch,
) -> Value {
    let place = (&batch.view, batch.partition);
    match table::apply(dynamo, view_table, place, projection, &batch.events, &Backoff::default()).await {
        Ok(applied) => match (applied.failed, batch.events.get(applied.done)) {
            (Some(error), Some(event)) => {
                tracing::warn!(view = %batch.view.projection, partition = batch.partition, event_id = %event.event_id, error, "event refused");
                json!({ "batchItemFailures": [{ "itemIdentifier": event.event_id }], "error": error })
            }
            _ => json!({ "batchItemFailures": [] }),
        },
        Err(err) => {
            tracing::warn!(view = %batch.view.projection, partition = batch.partition, error = %err, "view not written");
            json!({ "unavailable": err.to_string() })
        }
    }
}

/// Runs `projection` as the Lambda function a `function` projection names:
/// `VIEW_TABLE` from the environment, the SDK client built once.
pub async fn run<P: Projection + 'static>(projection: P) -> std::result::Result<(), lambda_runtime::Error> {
    lambda_runtime::tracing::init_default_subscriber();
    let view_table = std::env::var("VIEW_TABLE").map_err(|_| Error::Config("VIEW_TABLE is required".into()))?;
    let dynamo = aws_sdk_dynamodb::Client::new(&crate::aws_config().await);
    let (projection, dynamo, view_table) = (&projection, &dynamo, view_table.as_str());
    lambda_runtime::run(lambda_runtime::service_fn(move |event: lambda_runtime::LambdaEvent<ViewBatch>| async move {
        Ok::<Value, Error>(handle(dynamo, view_table, projection, event.payload).await)
    }))
    .await
}
