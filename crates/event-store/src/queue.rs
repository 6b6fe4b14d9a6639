//! Draining a dead-letter queue: each message handed to the caller
//! (the pump's re-buffer, the relay's re-relay) and deleted only once that
//! succeeded; a message that fails stays in the queue, logged.

use serde::Serialize;
use tracing::warn;

use crate::error::{Error, Result};

/// What draining a dead-letter queue did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Drained {
    /// Messages handled in full and deleted.
    pub messages: usize,
    pub records: usize,
    /// Messages left in the queue (unreadable, or not every record buffered); their reasons are logged.
    pub left: usize,
}

/// Drains a dead-letter queue: every message goes to `handle_one` (its
/// body in, how many records or versions it put back out); a message is
/// deleted only after `handle_one` succeeded, and left (logged) otherwise.
pub async fn drain_with<F, Fut>(sqs: &aws_sdk_sqs::Client, queue_url: &str, mut handle_one: F) -> Result<Drained>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<usize>>,
{
    let mut drained = Drained::default();
    let mut seen = std::collections::HashSet::new();
    loop {
        let out = sqs
            .receive_message()
            .queue_url(queue_url)
            .max_number_of_messages(10)
            // Long enough to handle a message before another receiver could see it.
            .visibility_timeout(300)
            .send()
            .await
            .map_err(|e| Error::Sqs { operation: "ReceiveMessage", source: Box::new(e) })?;
        let messages = out.messages();
        if messages.is_empty() {
            return Ok(drained);
        }
        for message in messages {
            // A message left in the queue comes back after its visibility timeout: once is enough.
            if !seen.insert(message.message_id().unwrap_or_default().to_owned()) {
                return Ok(drained);
            }
            match handle_one(message.body().unwrap_or_default().to_owned()).await {
                Ok(records) => {
                    sqs.delete_message()
                        .queue_url(queue_url)
                        .receipt_handle(message.receipt_handle().unwrap_or_default())
                        .send()
                        .await
                        .map_err(|e| Error::Sqs { operation: "DeleteMessage", source: Box::new(e) })?;
                    drained.messages += 1;
                    drained.records += records;
                }
                Err(err) => {
                    warn!(error = %err, message = message.message_id(), "message not handled: it stays");
                    drained.left += 1;
                }
            }
        }
    }
}
