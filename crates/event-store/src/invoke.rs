//! "Invoke a function asynchronously": the one port with two
//! implementations. In Lambda, `Invoke` with `InvocationType::Event`
//! ([`LambdaInvoker`]: on the function's own name for forks and
//! continuations, on the scan's for the pump's wake); locally (stack,
//! tests, bench), a message to an in-process runner (in the
//! `event-store-emulator` crate).

use aws_sdk_lambda::primitives::Blob;
use aws_sdk_lambda::types::InvocationType;
use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::Value;

use crate::error::{Error, Result};

pub trait Invoker: Send + Sync {
    /// Starts a run of the function with `payload`, without waiting for it.
    fn invoke_async(&self, payload: Value) -> BoxFuture<'_, Result<()>>;
}

/// Sends `payload` (a fork's or a continuation's) to a new asynchronous run.
pub(crate) async fn continue_with(invoker: &dyn Invoker, payload: &impl Serialize) -> Result<()> {
    let payload = serde_json::to_value(payload).map_err(|e| Error::encode("continuation payload", e))?;
    invoker.invoke_async(payload).await
}

/// Asynchronous invocation through the Lambda API.
pub struct LambdaInvoker {
    client: aws_sdk_lambda::Client,
    function_name: String,
}

impl LambdaInvoker {
    /// `function_name`: the function's own (`AWS_LAMBDA_FUNCTION_NAME` in Lambda), or the one it wakes.
    pub fn new(client: aws_sdk_lambda::Client, function_name: impl Into<String>) -> Self {
        Self { client, function_name: function_name.into() }
    }
}

impl Invoker for LambdaInvoker {
    fn invoke_async(&self, payload: Value) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move {
            let body = serde_json::to_vec(&payload).map_err(|e| Error::encode("invocation payload", e))?;
            self.client
                .invoke()
                .function_name(&self.function_name)
                .invocation_type(InvocationType::Event)
                .payload(Blob::new(body))
                .send()
                .await
                .map_err(Error::invoke)?;
            Ok(())
        })
    }
}
