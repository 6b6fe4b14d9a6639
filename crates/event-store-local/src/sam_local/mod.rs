//! `invoke`: one of the deployed artefacts (the arm64 bootstraps `make build`
//! makes for Lambda) run in a container under `sam local invoke`, against the
//! running local stack. Three things stand between the two, handled here:
//!
//! - **The endpoint.** SAM gives a container only the variables the template
//!   declares, so `AWS_ENDPOINT_URL` would be dropped and the binary would call
//!   AWS. A local copy of the template declares it for every function, pointing
//!   at the emulator; the production template is not touched. SAM itself gets
//!   dummy credentials and the emulator as its endpoint too, and those
//!   credentials are what it hands the container.
//! - **The network.** SAM puts the container on a bridge network (it ignores
//!   `--docker-network host`), and a bridge does not reach the host's 127.0.0.1
//!   where the emulator listens. A forwarder in this process listens on the
//!   gateway of a dedicated bridge network and nowhere else, so the emulator is
//!   reachable from containers on that network without being exposed beyond them.
//! - **The engine.** With `DOCKER_HOST` set, that engine is used as it is; else
//!   a podman API service (rootful: a rootless bridge lives in a namespace the
//!   forwarder cannot reach) is started for this call and stopped after it,
//!   with the settings these VMs need (see [`CONTAINERS_CONF`](engine::CONTAINERS_CONF)).

mod engine;
mod environment;
mod forwarder;
mod invoke;
mod session;
mod start_api;
mod template;

pub use invoke::{invoke, Invocation};
pub use start_api::api;

/// The bridge network the function containers join besides the engine's default one.
pub const NETWORK: &str = "event-store-local";
