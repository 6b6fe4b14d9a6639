//! The log's readers and where they stand, kept in the event table's
//! bookkeeping partition beside the watermark they wait for: a playback
//! run's binding, lease and checkpoint ([`playbacks`]); a subscription's
//! definition, its partitions' leases and checkpoints, and its parked events
//! ([`subscriptions`]). Playback and subscriptions write them, under the
//! lease ([`crate::bookkeeping::lease`]); status and the CLI read them.

pub mod playbacks;
pub mod subscriptions;
