//! An entity's snapshot: the state the caller folded up to a version,
//! stored beside the stream's tip so loading an entity reads the events
//! after it only. A snapshot is written only for a version the stream has,
//! and never replaces one of a later version.

use aws_sdk_dynamodb::types::{ConditionCheck, Put, TransactWriteItem};

use super::append::is_cancelled;
use super::model::{check_name, Invalid, SnapshotItem, StreamItem, MAX_SNAPSHOT_BYTES, RANGE_KEY, SNAPSHOT, TIP};
use super::{key, n, EntityError, EntityStore};
use crate::error::Error;
use crate::time::now_ms;

/// A snapshot as the caller stored it.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    pub version: u64,
    pub state: serde_json::Value,
}

impl From<SnapshotItem> for Snapshot {
    fn from(item: SnapshotItem) -> Self {
        // Stored by this code from a JSON value: it parses back.
        let state = serde_json::from_str(&item.state).unwrap_or(serde_json::Value::String(item.state));
        Snapshot { version: item.version, state }
    }
}

/// A snapshot's state as stored (JSON text), within the size limit.
pub(super) fn snapshot_text(state: &serde_json::Value) -> Result<String, Invalid> {
    let text = state.to_string();
    if text.len() > MAX_SNAPSHOT_BYTES {
        return Err(Invalid::TooLarge(format!(
            "the snapshot is {} bytes; the limit is {MAX_SNAPSHOT_BYTES}",
            text.len()
        )));
    }
    Ok(text)
}

impl EntityStore {
    /// Stores `state` as the snapshot folded up to `version` (which the stream
    /// must have). A snapshot never replaces one of a later version.
    pub async fn save_snapshot(
        &self,
        stream: &str,
        version: u64,
        state: &serde_json::Value,
    ) -> Result<(), EntityError> {
        check_name(stream)?;
        let stored = self.seal_state(stream, snapshot_text(state)?).await?;
        for attempt in 0..self.backoff.max_attempts {
            let snapshot = SnapshotItem {
                stream: stream.to_owned(),
                item: SNAPSHOT.to_owned(),
                version,
                state: stored.state.clone(),
                at: now_ms(),
                subject: stored.subject.clone(),
                sealed: stored.sealed.clone(),
            };
            let item = serde_dynamo::to_item(&snapshot).map_err(|e| Error::encode("snapshot item", e))?;
            let check = ConditionCheck::builder()
                .table_name(&self.table)
                .set_key(Some(key(stream, TIP)))
                .condition_expression("#version >= :version")
                .expression_attribute_names("#version", "version")
                .expression_attribute_values(":version", n(version))
                .build()
                .map_err(Error::from)?;
            let put = Put::builder()
                .table_name(&self.table)
                .set_item(Some(item))
                .condition_expression("attribute_not_exists(#item) OR #version <= :version")
                .expression_attribute_names("#item", RANGE_KEY)
                .expression_attribute_names("#version", "version")
                .expression_attribute_values(":version", n(version))
                .build()
                .map_err(Error::from)?;
            let result = self
                .dynamo
                .transact_write_items()
                .transact_items(TransactWriteItem::builder().condition_check(check).build())
                .transact_items(TransactWriteItem::builder().put(put).build())
                .send()
                .await;
            match result {
                Ok(_) => return Ok(()),
                Err(err) if is_cancelled(&err) => {}
                Err(err) => return Err(Error::dynamo("TransactWriteItems", err).into()),
            }
            match self.tip(stream).await? {
                None => return Err(EntityError::NotFound),
                Some(tip) if tip.version < version => return Err(EntityError::Conflict { current: tip.version }),
                Some(_) => {}
            }
            if let Some(stored) = self.snapshot(stream).await?.filter(|s| s.version > version) {
                return Err(EntityError::StaleSnapshot { stored: stored.version });
            }
            self.backoff.wait(attempt).await;
        }
        Err(Error::Throttled {
            service: "dynamodb",
            operation: "TransactWriteItems",
            source: format!("snapshot of {stream}: still contended").into(),
        }
        .into())
    }

    /// The stream's latest snapshot, if it has one (one `GetItem`).
    pub async fn latest_snapshot(&self, stream: &str) -> Result<Option<Snapshot>, EntityError> {
        check_name(stream)?;
        match self.snapshot(stream).await? {
            Some(item) => Ok(Some(self.open_snapshot(item).await?)),
            None => Ok(None),
        }
    }

    async fn snapshot(&self, stream: &str) -> Result<Option<SnapshotItem>, Error> {
        match self.get(stream, SNAPSHOT).await? {
            Some(StreamItem::Snapshot(snapshot)) => Ok(Some(snapshot)),
            _ => Ok(None),
        }
    }
}
