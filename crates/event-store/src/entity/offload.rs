//! Entity event data in S3 ([`crate::offload`]): an append stores the data
//! of its large events there, and reads put it back.

use super::model::{prepare, Limits, StoredEventItem, MAX_INLINE_EVENT};
use super::{EntityError, EntityStore, NewEvent, RecordedEvent};
use crate::archive::object::Bucket;
use crate::error::Error;
use crate::offload::{self, Offloads, MAX_LARGE_EVENT_BYTES};

impl EntityStore {
    /// Offloads event data larger than `inline_max` bytes into `bucket` (the
    /// one `ARCHIVE_BUCKET` names), and so accepts events up to
    /// [`crate::offload::MAX_LARGE_EVENT_BYTES`]; reads put the data back.
    pub fn with_archive(mut self, bucket: Option<Bucket>, inline_max: usize) -> Self {
        self.offloads = bucket.map(|bucket| Offloads { bucket, inline_max });
        self
    }

    /// The library's earlier name of [`Self::with_archive`], kept so callers of
    /// `EntityStore` build unchanged.
    #[deprecated(note = "renamed with_archive (docs/design.md#glossary: one name for the store's bucket)")]
    pub fn with_bucket(self, bucket: Option<Bucket>, inline_max: usize) -> Self {
        self.with_archive(bucket, inline_max)
    }

    pub(super) fn limits(&self) -> Limits {
        match &self.offloads {
            // An entity event stays inline up to 64 KiB at most, whatever INLINE_MAX_BYTES allows posted events.
            Some(p) => Limits { event: MAX_LARGE_EVENT_BYTES, offload_over: Some(p.inline_max.min(MAX_INLINE_EVENT)) },
            None => Limits::INLINE,
        }
    }

    /// Checks an append, seals its data when `stream` is a data subject's,
    /// and stores the data (or sealed block) of its large events in S3.
    pub(super) async fn prepare(
        &self,
        stream: &str,
        events: Vec<NewEvent>,
    ) -> Result<Vec<StoredEventItem>, EntityError> {
        let limits = self.limits();
        let mut stored = prepare(events, limits)?;
        self.seal_events(stream, &mut stored, limits).await?;
        if let Some(offloads) = &self.offloads {
            for event in stored.iter_mut().filter(|e| limits.offloads(e.size())) {
                let content = match event.sealed.take() {
                    Some(sealed) => serde_json::to_vec(&sealed).map_err(|e| Error::encode("sealed data", e))?,
                    None => std::mem::replace(&mut event.data, "null".to_owned()).into_bytes(),
                };
                event.data_ref = Some(offloads.store(content).await?);
            }
        }
        Ok(stored)
    }

    /// Puts offloaded data back into `events`, opens sealed data, and upcasts it.
    pub(super) async fn resolve(&self, events: &mut [RecordedEvent]) -> Result<(), Error> {
        for event in events.iter_mut() {
            if let Some(reference) = event.data_ref.take() {
                let Some(bucket) = self.offloads.as_ref().map(|p| &p.bucket) else {
                    return Err(Error::Config(format!(
                        "{} event {} has its data in S3, and this function has no ARCHIVE_BUCKET",
                        event.stream, event.version
                    )));
                };
                let content = offload::fetch(bucket, &reference).await?;
                if event.subject.is_some() {
                    // A subject's event has its sealed block there.
                    let sealed = serde_json::from_slice(&content)
                        .map_err(|e| Error::Payload(format!("{}: not a sealed block: {e}", reference.location())))?;
                    event.sealed = Some(sealed);
                } else {
                    event.data = offload::parse(&content);
                }
            }
            self.open_event(event).await?;
            self.upcast(event)?;
        }
        Ok(())
    }
}
