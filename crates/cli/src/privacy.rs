//! `event-store forget SUBJECT`: the `privacy` function's `forget`
//! (`docs/privacy.md#forgetting`). On a deployed stack the function is
//! invoked, so who may forget is who IAM lets invoke it, and the caller's ARN
//! is recorded with the forget; against the local stack it runs in this
//! process with the stack's key table and hash key.

use anyhow::{Context, Result};
use event_store::config::PrivacyConfig;
use event_store::privacy::manage::Privacy;
use serde_json::{json, Value};

use crate::stack::Stack;

/// Forgets `subject` on `target`; the function's answer.
pub async fn forget(stack: &Stack, subject: &str) -> Result<Value> {
    let payload = json!({ "action": "forget", "subject": subject, "by": caller(stack).await });
    match (&stack.name, &stack.privacy_function) {
        (Some(_), Some(function)) => crate::subscription::invoke(stack, function, payload).await,
        (Some(_), None) => anyhow::bail!("no PrivacyFunctionName output (deploy the current template)"),
        (None, _) => {
            let key_table = stack.key_table.clone().context("this stack has no key table")?;
            // The local stack's secret, as `make local` sets it.
            let hash_key = std::env::var("SUBJECT_HASH_KEY")
                .ok()
                .filter(|k| !k.trim().is_empty())
                .unwrap_or_else(|| event_store_emulator::resources::LOCAL_SUBJECT_HASH_KEY.to_owned());
            let config = PrivacyConfig { key_table: key_table.clone(), hash_key, view_table: stack.view_table.clone() };
            let privacy = Privacy::new(
                event_store::privacy::key_store(&stack.sdk, event_store::privacy::KeyStore::reading(key_table)),
                &config,
            )
            .with_views(aws_sdk_dynamodb::Client::new(&stack.sdk), &config);
            Ok(privacy.handle(payload).await?)
        }
    }
}

/// Who asks: the caller's ARN on a deployed stack (CloudTrail has the invocation too), else the local user.
async fn caller(stack: &Stack) -> String {
    if stack.name.is_none() {
        return format!("local:{}", std::env::var("USER").unwrap_or_else(|_| "unknown".into()));
    }
    match aws_sdk_sts::Client::new(&stack.sdk).get_caller_identity().send().await {
        Ok(identity) => identity.arn().unwrap_or("unknown").to_owned(),
        Err(_) => "unknown (see CloudTrail)".into(),
    }
}

/// One line for a person: what the answer means.
pub fn describe(subject: &str, answer: &Value) -> String {
    let hash = answer["subject"].as_str().unwrap_or("?");
    match answer["forgotten"].as_str() {
        Some("done") => format!(
            "forgot {subject:?} (subject {hash}): {} key generation(s) destroyed; its events now read as forgotten",
            answer["generations"]
        ),
        Some("already") => format!("{subject:?} (subject {hash}) was forgotten before; nothing of it was left"),
        _ => format!("no key was ever made for {subject:?} (subject {hash}): nothing to forget (check the id)"),
    }
}
