//! What AWS provides around the Lambda functions, for the places that run
//! them without AWS: the local stack, the integration tests and the bench.
//! Nothing here is compiled into a Lambda binary.
//!
//! - [`process`]: the emulator itself (moto_server, or dynalite + kinesalite) on 127.0.0.1;
//! - [`resources`]: the tables and streams `template.yaml` would create;
//! - [`event_source`]: what a Kinesis event source mapping hands `pump`;
//! - [`table_stream`]: a DynamoDB stream read the way its event source mapping reads it (for `relay`);
//! - [`invoke`]: asynchronous invocations, run in-process;
//! - [`runs`]: a scan pass, a playback or a subscriptions tick with all its forks and continuations;
//! - [`lambda_target`]: a subscription's Lambda target (the `Invoke` API, answered by a programmable consumer);
//! - [`request_counter`]: AWS requests and capacity units, counted by an SDK interceptor;
//! - [`iam`]: what IAM sees of those requests, and the template's policies to evaluate them against;
//! - [`watchdog`]: a hung test ends its binary with the emulators' state, not CI's whole run.

pub mod event_source;
pub mod iam;
pub mod invoke;
pub mod lambda_target;
pub mod process;
pub mod request_counter;
pub mod resources;
pub mod runs;
pub mod table_stream;
pub mod watchdog;

pub use process::{answers, free_port, moto_server, stop, Diagnostics, Emulator, Error};
