//! The demo's subscription: the stack's subscriptions, on the stack's own
//! clients. Managing subscriptions and following the log are `event-store
//! subscription` and `event-store tail` (crates/cli), for this stack and a deployed one.

use std::sync::Arc;

use anyhow::Result;
use event_store::config::SubscriptionConfig;
use event_store::subscription::Subscriptions;
use event_store_emulator::invoke::{recursive_loop, LocalInvoker};

/// The subscriptions of a started stack (its clients, which count their requests).
pub fn local_with(stack: &crate::stack::Stack) -> Result<Subscriptions> {
    let (invoker, _) = LocalInvoker::with_recursion(recursive_loop("SubscriptionsFunction"));
    Ok(Subscriptions::new(
        stack.dynamo.clone(),
        stack.kinesis.clone(),
        stack.lambda.clone(),
        SubscriptionConfig::from_env()?,
        Arc::new(invoker),
    )
    .with_archive(Some(stack.archive.clone()))
    .with_keys(Some(stack.keys.clone())))
}
