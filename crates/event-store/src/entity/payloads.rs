//! Entity event data in S3 ([`crate::payload`]): an append stores the data
//! of its large events there, and reads put it back.

use super::model::{prepare, Limits, StoredEventItem, MAX_INLINE_EVENT};
use super::{EntityError, EntityStore, NewEvent, RecordedEvent};
use crate::archive::object::Bucket;
use crate::error::Error;
use crate::payload::{self, Payloads, MAX_LARGE_EVENT_BYTES};

impl EntityStore {
    /// Offloads event data larger than `inline_max` bytes into `bucket` (the
    /// one `ARCHIVE_BUCKET` names), and so accepts events up to
    /// [`crate::payload::MAX_LARGE_EVENT_BYTES`]; reads put the data back.
    pub fn with_bucket(mut self, bucket: Option<Bucket>, inline_max: usize) -> Self {
        self.payloads = bucket.map(|bucket| Payloads { bucket, inline_max });
        self
    }

    pub(super) fn limits(&self) -> Limits {
        match &self.payloads {
            // An entity event stays inline up to 64 KiB at most, whatever INLINE_MAX_BYTES allows posted events.
            Some(p) => Limits { event: MAX_LARGE_EVENT_BYTES, offload_over: Some(p.inline_max.min(MAX_INLINE_EVENT)) },
            None => Limits::INLINE,
        }
    }

    /// Checks an append and stores the data of its large events in S3.
    pub(super) async fn prepare(&self, events: Vec<NewEvent>) -> Result<Vec<StoredEventItem>, EntityError> {
        let limits = self.limits();
        let mut stored = prepare(events, limits)?;
        if let Some(payloads) = &self.payloads {
            for event in stored.iter_mut().filter(|e| limits.offloads(e.size())) {
                let data = std::mem::replace(&mut event.data, "null".to_owned());
                event.data_ref = Some(payloads.store(data.into_bytes()).await?);
            }
        }
        Ok(stored)
    }

    /// Puts offloaded data back into `events`.
    pub(super) async fn resolve(&self, events: &mut [RecordedEvent]) -> Result<(), Error> {
        for event in events.iter_mut().filter(|e| e.data_ref.is_some()) {
            let Some(bucket) = self.payloads.as_ref().map(|p| &p.bucket) else {
                return Err(Error::Config(format!(
                    "{} event {} has its data in S3, and this function has no ARCHIVE_BUCKET",
                    event.stream, event.version
                )));
            };
            if let Some(reference) = event.data_ref.take() {
                event.data = payload::parse(&payload::fetch(bucket, &reference).await?);
            }
        }
        Ok(())
    }
}
