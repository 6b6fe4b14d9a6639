//! The functions that write the key table (`docs/privacy.md`):
//! - `privacy`: `{"action": "forget", "subject": "<id>", "by": "<who asks>"}`.
//!   Only it holds the right to destroy keys, so who may forget is who IAM
//!   lets invoke it (CloudTrail records each invocation and its caller).
//! - `keys`: `{"subject": "<hash>"}` makes the subject's current key if it
//!   needs one ([`Keys::make`]). Writers invoke it instead of writing the
//!   table: its code only adds generations, so a writer cannot lose a key.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::{json, Value};
use tracing::info;

use super::keys::{Forgot, Keys};
use super::maker::{MadeAnswer, MakeRequest};
use crate::config::PrivacyConfig;
use crate::crypto::{stream_subject_hash, subject_hash};
use crate::error::{Error, Result};

/// The AWS actions this function calls, and so the only ones its IAM role grants.
pub const AWS_ACTIONS: &[&str] = &["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "dynamodb:Query"];
/// The `keys` function's.
pub const KEYS_AWS_ACTIONS: &[&str] =
    &["dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:UpdateItem", "kms:GenerateDataKeyWithoutPlaintext"];

#[derive(Debug, Deserialize)]
#[serde(tag = "action", rename_all = "snake_case", deny_unknown_fields)]
pub enum Request {
    /// Destroys every key of `subject` (its plain id: hashed here, never stored).
    Forget {
        subject: String,
        /// Who asks (the CLI sends the caller's ARN); recorded with the forget.
        #[serde(default)]
        by: Option<String>,
    },
}

pub struct Privacy {
    keys: Arc<Keys>,
    hash_key: Vec<u8>,
    /// The projections' views (`VIEW_TABLE`) and a client of them.
    views: Option<(aws_sdk_dynamodb::Client, String)>,
}

impl Privacy {
    pub fn new(keys: Arc<Keys>, config: &PrivacyConfig) -> Self {
        Self { keys, hash_key: config.hash_key.as_bytes().to_vec(), views: None }
    }

    /// Forgets in the projections' views too: a `state` view's item of the stream of that name.
    pub fn with_views(self, dynamo: aws_sdk_dynamodb::Client, config: &PrivacyConfig) -> Self {
        Self { views: config.view_table.clone().map(|table| (dynamo, table)), ..self }
    }

    /// Answers one action: `{"subject": <hash>, "stream_subject": <hash>, "forgotten": "done" | "already" |
    /// "unknown", "generations": n}`. The id is forgotten as both: the subject of ingested events (and
    /// of streams before streams had a hash of their own), and the stream of that name.
    pub async fn handle(&self, payload: Value) -> Result<Value> {
        let request: Request = serde_json::from_value(payload)
            .map_err(|e| Error::BadInput(format!("expected {{\"action\": \"forget\", \"subject\": ...}}: {e}")))?;
        match request {
            Request::Forget { subject, by } => {
                if subject.trim().is_empty() {
                    return Err(Error::BadInput("an empty subject".into()));
                }
                let hash = subject_hash(&self.hash_key, &subject);
                let stream = stream_subject_hash(&self.hash_key, &subject);
                let by = by.filter(|b| !b.trim().is_empty()).unwrap_or_else(|| "unnamed (see CloudTrail)".into());
                let (mut outcome, mut generations) = ("unknown", 0);
                for forgot in [self.keys.forget(&hash, &by).await?, self.keys.forget(&stream, &by).await?] {
                    match forgot {
                        Forgot::Done { generations: n } => (outcome, generations) = ("done", generations + n),
                        Forgot::Already if outcome == "unknown" => outcome = "already",
                        Forgot::Already | Forgot::Unknown => {}
                    }
                }
                // The views' copies: whatever the keys' outcome (a forget repeated after a crash finishes it).
                let views = match &self.views {
                    Some((dynamo, table)) => {
                        let marker = json!({ "at": crate::time::format_ms(crate::time::now_ms()) });
                        crate::views::registry::forget(dynamo, table, &subject, &marker).await?
                    }
                    None => 0,
                };
                info!(subject = %hash, stream_subject = %stream, by = %by, outcome, generations, views, "forget");
                Ok(json!({ "subject": hash, "stream_subject": stream, "forgotten": outcome, "generations": generations,
                    "view_items": views }))
            }
        }
    }
}

/// The `keys` function: makes a subject's key when it needs one, and says
/// which generation to seal under (the writer unwraps it as readers do).
pub async fn make_key(keys: &Keys, payload: Value) -> Result<Value> {
    let MakeRequest { subject } = serde_json::from_value(payload)
        .map_err(|e| Error::BadInput(format!("expected {{\"subject\": \"<the subject's hash>\"}}: {e}")))?;
    // Hashes only: a plain id has no business here (nor in this function's logs).
    if subject.len() != 64 || !subject.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return Err(Error::BadInput("subject: a subject's hash (64 lowercase hex digits)".into()));
    }
    let generation = keys.make(&subject).await?;
    info!(subject = %subject, generation, "key");
    serde_json::to_value(MadeAnswer { subject, generation }).map_err(|e| Error::encode("the key's answer", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_forget_with_a_subject_is_an_action() {
        let forget: Request = serde_json::from_value(json!({"action": "forget", "subject": "u-1"})).unwrap();
        assert!(matches!(forget, Request::Forget { subject, by: None } if subject == "u-1"));
        for bad in [json!({"action": "forget"}), json!({"action": "erase", "subject": "u"}), json!({"subject": "u"})] {
            assert!(serde_json::from_value::<Request>(bad.clone()).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn the_keys_function_takes_a_subject_s_hash_and_nothing_else() {
        let aws = aws_config::SdkConfig::builder().behavior_version(aws_config::BehaviorVersion::latest()).build();
        let keys = Keys::new(aws_sdk_dynamodb::Client::new(&aws), aws_sdk_kms::Client::new(&aws), "t".into());
        let hash = "ab".repeat(32);
        for bad in [
            json!({"subject": "user-42"}),
            json!({"subject": hash.to_uppercase()}),
            json!({"subject": &hash[1..]}),
            json!({"subject": hash, "action": "forget"}),
            json!({}),
        ] {
            assert!(matches!(make_key(&keys, bad.clone()).await, Err(Error::BadInput(_))), "{bad}");
        }
    }
}
