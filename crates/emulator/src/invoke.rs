//! Lambda's asynchronous invocations, in-process: payloads go to a channel,
//! and [`run_until_idle`] runs each as its own task.

use std::future::Future;

use event_store::invoke::Invoker;
use event_store::{Error, Result};
use futures::future::BoxFuture;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// In-process self-invocation: payloads go to a channel that [`run_until_idle`] drains.
#[derive(Clone)]
pub struct LocalInvoker {
    tx: mpsc::UnboundedSender<Value>,
}

impl LocalInvoker {
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<Value>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { tx }, rx)
    }

    /// Queues a payload as if a schedule or a user had invoked the function.
    pub fn send(&self, payload: Value) -> Result<()> {
        self.tx.send(payload).map_err(|_| Error::Invoke { source: "local runner stopped".into() })
    }
}

impl Invoker for LocalInvoker {
    fn invoke_async(&self, payload: Value) -> BoxFuture<'_, Result<()>> {
        Box::pin(async move { self.send(payload) })
    }
}

/// Runs every queued invocation as its own task, including those the runs
/// queue themselves, and returns when none is queued or running: the local
/// stand-in for Lambda's asynchronous invocations.
pub async fn run_until_idle<F, Fut, T>(rx: &mut mpsc::UnboundedReceiver<Value>, handler: F) -> Vec<T>
where
    F: Fn(Value) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let mut running = JoinSet::new();
    let mut results = Vec::new();
    loop {
        if running.is_empty() {
            match rx.try_recv() {
                Ok(payload) => {
                    running.spawn(handler(payload));
                }
                Err(_) => return results,
            }
            continue;
        }
        tokio::select! {
            Some(payload) = rx.recv() => {
                running.spawn(handler(payload));
            }
            Some(joined) = running.join_next() => match joined {
                Ok(result) => results.push(result),
                Err(join_error) => tracing::error!(error = %join_error, "local invocation panicked"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn local_runner_follows_chains_of_self_invocations() {
        let (invoker, mut rx) = LocalInvoker::channel();
        let runs = Arc::new(AtomicUsize::new(0));
        invoker.invoke_async(serde_json::json!({"left": 3})).await.unwrap();
        let results = run_until_idle(&mut rx, |payload| {
            let invoker = invoker.clone();
            let runs = runs.clone();
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                let left = payload["left"].as_u64().unwrap_or(0);
                if left > 0 {
                    invoker.send(serde_json::json!({"left": left - 1})).unwrap();
                }
                left
            }
        })
        .await;
        assert_eq!(runs.load(Ordering::SeqCst), 4);
        let mut results = results;
        results.sort();
        assert_eq!(results, vec![0, 1, 2, 3]);
    }
}
