//! Re-relaying: a held stream, or every stream behind its tip, is
//! relayed from the entity table (the source of truth; the table's stream
//! keeps only 24 hours), from its position, in version order.

use super::relay::{Outcome, Plan, Relay, MAX_VERSIONS_PER_DELIVERY};
use super::EntityError;
use crate::error::{Error, Result};

/// What a re-relay relayed.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Rerelayed {
    pub streams: usize,
    pub versions: usize,
    /// Streams that could not be relayed (a whole-table re-relay goes on past them).
    pub failed: Vec<String>,
}

impl Relay {
    /// Re-relays what one message of the relay's dead-letter queue stands
    /// for: a held stream (the relay's own notice), or, for the event
    /// source's failure record (which names table-stream shards, not
    /// streams), every stream behind its tip.
    pub async fn rerelay_message(&self, body: &str) -> Result<Rerelayed> {
        let message: serde_json::Value =
            serde_json::from_str(body).map_err(|e| Error::BadInput(format!("relay dead letter: {e}")))?;
        if let Some(stream) = message.get("heldStream").and_then(|s| s.as_str()) {
            let versions = self.rerelay_stream(stream).await?;
            return Ok(Rerelayed { streams: 1, versions, failed: vec![] });
        }
        if message.get("DDBStreamBatchInfo").is_some() {
            let done = self.rerelay_all().await?;
            return match done.failed.is_empty() {
                true => Ok(done),
                false => Err(Error::KinesisPartial {
                    operation: "PutRecords",
                    failed: done.failed.len(),
                    code: format!("streams not relayed: {:?}", done.failed),
                }),
            };
        }
        Err(Error::BadInput("neither a held stream nor a DynamoDB stream failure record".into()))
    }

    /// Re-relays one stream: releases its hold, then relays every version
    /// after its position up to its tip, from the table, in order. Returns
    /// how many versions it put.
    pub(crate) async fn rerelay_stream(&self, stream: &str) -> Result<usize> {
        self.positions.release(stream).await?;
        let mut versions = 0;
        loop {
            let position = self.positions.relay_position(stream).await?;
            if !position.known {
                // Relayed before positions existed: nothing is known to be held.
                return Ok(versions);
            }
            let Some(tip) = self.store.tip(stream).await? else { return Ok(versions) };
            let next = position.next();
            if next > tip.version {
                return Ok(versions);
            }
            let to = tip.version.min(next + MAX_VERSIONS_PER_DELIVERY - 1);
            let events = self.read_versions(stream, next, to).await?;
            if events.first().map(|e| e.version) != Some(next) {
                return Err(Error::Malformed(format!("{stream}: version {next} not in the table below its tip")));
            }
            let count = events.len();
            let plan = Plan { position, events, complete: to == tip.version };
            let outcome = self.put_and_record(vec![plan]).await.remove(stream);
            if !matches!(outcome, Some(Outcome::Relayed | Outcome::Partial)) {
                return Err(Error::KinesisPartial {
                    operation: "PutRecords",
                    failed: count,
                    code: format!("{stream} still not relayed from version {next}: {outcome:?}"),
                });
            }
            versions += count;
        }
    }

    /// Re-relays every stream that relay positions track and whose position
    /// is behind its tip (after the event source itself gave up on a
    /// delivery). A `Scan` of the table (`dynamodb:Scan`, which the relay's
    /// own role does not have): for an operator's rare repairs. Goes on past
    /// a stream that fails, and names it.
    pub(crate) async fn rerelay_all(&self) -> Result<Rerelayed> {
        let names = self.store.stream_names("").await.map_err(|e| match e {
            EntityError::Store(err) => err,
            other => Error::Malformed(other.to_string()),
        })?;
        let mut total = Rerelayed::default();
        for name in names {
            // A stream without a position was relayed before positions existed: nothing is known held.
            if !self.positions.relay_position(&name).await?.known {
                continue;
            }
            match self.rerelay_stream(&name).await {
                Ok(versions) => {
                    total.versions += versions;
                    total.streams += usize::from(versions > 0);
                }
                Err(err) => {
                    tracing::warn!(error = %err, stream = name, "stream not re-relayed");
                    total.failed.push(name);
                }
            }
        }
        Ok(total)
    }
}
