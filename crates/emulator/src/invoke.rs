//! Lambda's asynchronous invocations, in-process: payloads go to a channel,
//! and [`run_until_idle`] runs each as its own task.
//!
//! Like Lambda, the runner follows each chain of invocations (a run that
//! invokes its own function starts the chain's next hop) and, unless the
//! function allows recursion (`RecursiveLoop: Allow` in the template, read
//! by [`recursive_loop`]), stops a chain after [`LAMBDA_LOOP_LIMIT`] hops:
//! Lambda's recursive loop detection, which covers functions that invoke
//! themselves. The stopped invocation is dropped (Lambda sends it to the
//! failure destination).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use event_store::invoke::Invoker;
use event_store::{Error, Result};
use futures::future::BoxFuture;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// Invocations in one chain after which Lambda's recursive loop detection
/// stops the next one ("about 16"), unless the function allows recursion.
pub const LAMBDA_LOOP_LIMIT: u32 = 16;

/// A function's `RecursiveLoop` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecursiveLoop {
    /// Lambda's default: chains are stopped after [`LAMBDA_LOOP_LIMIT`] hops.
    Terminate,
    Allow,
}

/// The `RecursiveLoop` setting of `function` (a logical id) in the project's template.
pub fn recursive_loop(function: &str) -> RecursiveLoop {
    let template: serde_yaml::Value =
        serde_yaml::from_str(include_str!("../../../template.yaml")).unwrap_or(serde_yaml::Value::Null);
    match template["Resources"][function]["Properties"]["RecursiveLoop"].as_str() {
        Some("Allow") => RecursiveLoop::Allow,
        _ => RecursiveLoop::Terminate,
    }
}

tokio::task_local! {
    /// The hop of the chain the running invocation is (1 for the first).
    static HOP: u32;
}

/// Runs `run` as hop `hop` of its chain (what [`run_until_idle`] does for each invocation).
pub fn at_hop<F: Future>(hop: u32, run: F) -> impl Future<Output = F::Output> {
    HOP.scope(hop, run)
}

/// A queued invocation: its payload and its hop in its chain.
pub type Queued = (Value, u32);

/// In-process self-invocation: payloads go to a channel that [`run_until_idle`] drains.
#[derive(Clone)]
pub struct LocalInvoker {
    tx: mpsc::UnboundedSender<Queued>,
    recursion: RecursiveLoop,
    stopped: Arc<AtomicUsize>,
}

impl LocalInvoker {
    /// A runner with Lambda's default recursion setting.
    pub fn channel() -> (Self, mpsc::UnboundedReceiver<Queued>) {
        Self::with_recursion(RecursiveLoop::Terminate)
    }

    pub fn with_recursion(recursion: RecursiveLoop) -> (Self, mpsc::UnboundedReceiver<Queued>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (Self { tx, recursion, stopped: Arc::default() }, rx)
    }

    /// Queues a payload as if a schedule or a user had invoked the function (a new chain).
    pub fn send(&self, payload: Value) -> Result<()> {
        self.queue(payload, 1)
    }

    /// Invocations recursive loop detection stopped so far.
    pub fn stopped(&self) -> usize {
        self.stopped.load(Ordering::SeqCst)
    }

    fn queue(&self, payload: Value, hop: u32) -> Result<()> {
        if self.recursion == RecursiveLoop::Terminate && hop > LAMBDA_LOOP_LIMIT {
            self.stopped.fetch_add(1, Ordering::SeqCst);
            tracing::warn!(hop, "recursive loop detection: invocation stopped (RecursiveLoop is not Allow)");
            return Ok(());
        }
        self.tx.send((payload, hop)).map_err(|_| Error::Invoke { source: "local runner stopped".into() })
    }
}

impl Invoker for LocalInvoker {
    /// From inside a run, the chain's next hop; from outside, a new chain.
    fn invoke_async(&self, payload: Value) -> BoxFuture<'_, Result<()>> {
        let hop = HOP.try_with(|hop| hop + 1).unwrap_or(1);
        Box::pin(async move { self.queue(payload, hop) })
    }
}

/// Runs every queued invocation as its own task, including those the runs
/// queue themselves, and returns when none is queued or running: the local
/// stand-in for Lambda's asynchronous invocations.
pub async fn run_until_idle<F, Fut, T>(rx: &mut mpsc::UnboundedReceiver<Queued>, handler: F) -> Vec<T>
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
                Ok((payload, hop)) => {
                    running.spawn(at_hop(hop, handler(payload)));
                }
                Err(_) => return results,
            }
            continue;
        }
        tokio::select! {
            Some((payload, hop)) = rx.recv() => {
                running.spawn(at_hop(hop, handler(payload)));
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

    /// A chain that invokes itself `hops` times more; how many runs it got.
    async fn chain(recursion: RecursiveLoop, hops: u64) -> (usize, usize) {
        let (invoker, mut rx) = LocalInvoker::with_recursion(recursion);
        invoker.send(serde_json::json!({"left": hops})).unwrap();
        let runs = run_until_idle(&mut rx, |payload| {
            let invoker = invoker.clone();
            async move {
                let left = payload["left"].as_u64().unwrap_or(0);
                if left > 0 {
                    invoker.invoke_async(serde_json::json!({"left": left - 1})).await.unwrap();
                }
            }
        })
        .await;
        (runs.len(), invoker.stopped())
    }

    #[tokio::test]
    async fn chains_stop_after_16_hops_unless_recursion_is_allowed() {
        assert_eq!(chain(RecursiveLoop::Terminate, 40).await, (16, 1));
        assert_eq!(chain(RecursiveLoop::Allow, 40).await, (41, 0));
        assert_eq!(chain(RecursiveLoop::Terminate, 10).await, (11, 0));
    }
}
