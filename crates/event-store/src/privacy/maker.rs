//! Who makes subjects' keys (see `keys.rs`), and how a writer asks the
//! `keys` function for one: `{"subject": "<hash>"}`, answered
//! `{"subject", "generation"}`. The writer then unwraps that generation as
//! any reader does; the function never hands out a key.

use crate::error::{Error, Result};

/// Who makes a subject's new key generation (writers only: readers unwrap
/// with whatever key wrapped a generation).
#[derive(Clone)]
pub enum Maker {
    /// This process, under this KMS key (a key id, ARN or alias): the `keys` function, and local runs.
    Kms(String),
    /// The `keys` function, invoked by name (`KEY_FUNCTION`): writers in a stack.
    Function { lambda: aws_sdk_lambda::Client, name: String },
}

/// What a writer sends the `keys` function, and what it answers.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MakeRequest {
    pub subject: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
pub struct MadeAnswer {
    pub subject: String,
    pub generation: u64,
}

/// Asks the `keys` function to make `subject`'s key; its generation.
pub(crate) async fn invoke(lambda: &aws_sdk_lambda::Client, name: &str, subject: &str) -> Result<u64> {
    let payload = serde_json::to_vec(&MakeRequest { subject: subject.to_owned() })
        .map_err(|e| Error::Key(format!("encoding a key request: {e}")))?;
    let out = lambda
        .invoke()
        .function_name(name)
        .payload(aws_sdk_lambda::primitives::Blob::new(payload))
        .send()
        .await
        .map_err(Error::invoke)?;
    let body = out.payload().map(|p| p.as_ref()).unwrap_or_default();
    if let Some(kind) = out.function_error() {
        return Err(Error::Key(format!("{name} failed ({kind}): {}", String::from_utf8_lossy(body))));
    }
    let answer: MadeAnswer = serde_json::from_slice(body)
        .map_err(|e| Error::Key(format!("{name} answered {:?}: {e}", String::from_utf8_lossy(body))))?;
    if answer.subject != subject {
        return Err(Error::Key(format!("{name} made a key for {}, not {subject}", answer.subject)));
    }
    Ok(answer.generation)
}
