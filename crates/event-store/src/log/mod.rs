//! The complete log as its readers see it: the floor that playback,
//! subscriptions, the archiver, status and `tail` all stand on, each as a peer. Where a
//! reader stands in it ([`crate::position`]) sits below, with the bookkeeping
//! that stores it.
//!
//! - [`window`]: what part of the log a reader wants (a window of arrival
//!   time, filters on the events' JSON);
//! - [`reader`]: the window's complete slots, page by page, in order, from
//!   whichever tier holds them ([`tiers`]: the event table or the archive's
//!   objects in S3, kept as fetched by [`objects`]), opened when sealed for a subject;
//! - [`copies`]: the second copy of an accepted event, dropped as it is read;
//! - [`record`]: the record a reader hands on (the played and delivered
//!   record's shape) and how records become Kinesis records;
//! - [`page`]: a page of the log from a position, for readers over HTTP;
//!   [`http`]: `GET /log`, which serves it.

pub mod copies;
pub mod http;
pub(crate) mod objects;
pub mod page;
pub mod reader;
pub mod record;
pub mod tiers;
pub(crate) mod window;

pub use crate::position::{Checkpoint, Lookback};
pub use crate::select::{Select, Source};
pub use record::{PlayedEvent, RecordFormat};
pub use window::{Filter, Window};
