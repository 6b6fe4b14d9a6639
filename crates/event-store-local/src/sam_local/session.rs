//! A `sam local` session: the engine, the gateway and its forwarder, the local template and variables, the command.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{bail, Context, Result};

use super::engine::Engine;
use super::environment::env_vars;
use super::forwarder::{forward, listen_on};
use super::template::LocalTemplate;
use super::NETWORK;
use crate::settings::Settings;

/// Its subnet when this command creates it (`INVOKE_SUBNET` overrides); the gateway is its first address.
const DEFAULT_SUBNET: &str = "10.89.71.0/24";
/// What the function's endpoint names; `--add-host` maps it to the network's gateway.
const HOST_ALIAS: &str = "host.docker.internal";

/// A directory of this process's own (mode 0700, a fresh name: never one
/// someone else made first), removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn create() -> Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        let path = std::env::temp_dir().join(format!("event-store-invoke-{}", uuid::Uuid::new_v4().simple()));
        std::fs::DirBuilder::new().mode(0o700).create(&path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self(path))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What `invoke` and `api` share: the engine, the network's gateway with the
/// forwarder on it, and the local template and its variables in a scratch
/// directory. [`Session::close`] removes the containers sam left; dropping it
/// stops the rest (fields drop in this order).
pub(super) struct Session {
    engine: Engine,
    gateway: Ipv4Addr,
    /// The functions' `AWS_ENDPOINT_URL`: no session running at the same time has the same.
    endpoint: String,
    forwarder: tokio::task::JoinHandle<()>,
    scratch: Scratch,
}

impl Drop for Session {
    fn drop(&mut self) {
        self.forwarder.abort();
    }
}

impl Session {
    pub(super) async fn open(settings: &Settings, template: &LocalTemplate) -> Result<Self> {
        require_emulator(&settings.emulator_endpoint(), settings.emulator_port)?;
        let scratch = Scratch::create()?;
        eprintln!("== working in {}", scratch.0.display());
        let engine = Engine::connect(&scratch.0).await?;
        let subnet =
            std::env::var("INVOKE_SUBNET").ok().filter(|s| !s.is_empty()).unwrap_or_else(|| DEFAULT_SUBNET.into());
        let gateway = engine.network_gateway(&subnet).await?;
        let listener = listen_on(gateway)?;
        let port = listener.local_addr()?.port();
        let endpoint = format!("http://{HOST_ALIAS}:{port}");
        std::fs::write(scratch.0.join("template.yaml"), template.render(&endpoint)?)?;
        let vars = env_vars(template, &endpoint, |name| std::env::var(name).ok());
        std::fs::write(scratch.0.join("env.json"), serde_json::to_vec_pretty(&vars)?)?;
        let forwarder = tokio::spawn(forward(listener, SocketAddr::from(([127, 0, 0, 1], settings.emulator_port))));
        eprintln!("== the emulator is forwarded from {gateway}:{port}, on the containers' network {NETWORK}");
        Ok(Self { engine, gateway, endpoint, forwarder, scratch })
    }

    /// Removes what sam left of this session's containers, then stops everything.
    pub(super) async fn close(self) {
        match self.engine.remove_containers_with(&format!("AWS_ENDPOINT_URL={}", self.endpoint)).await {
            Ok(0) => {}
            Ok(removed) => eprintln!("== removed {removed} function containers sam left behind"),
            Err(err) => eprintln!("warning: could not look for containers sam left behind: {err:#}"),
        }
    }

    pub(super) fn dir(&self) -> &Path {
        &self.scratch.0
    }

    /// `sam local <args>` on the local template, its variables and network,
    /// with nothing that could reach AWS.
    pub(super) fn sam(&self, sam: &Path, settings: &Settings, args: &[&str]) -> tokio::process::Command {
        let region = std::env::var("AWS_REGION").unwrap_or_else(|_| "us-east-1".into());
        let mut command = tokio::process::Command::new(sam);
        command
            .arg("local")
            .args(args)
            .arg("--template")
            .arg(self.dir().join("template.yaml"))
            .arg("--env-vars")
            .arg(self.dir().join("env.json"))
            .arg("--skip-pull-image")
            .args(["--docker-network", NETWORK])
            .args(["--add-host", &format!("{HOST_ALIAS}:{}", self.gateway)])
            .current_dir(self.dir())
            .env("DOCKER_HOST", format!("unix://{}", self.engine.socket.display()))
            .env("SAM_CLI_TELEMETRY", "0")
            // SAM's own AWS calls (STS, for the account id) go to the emulator, with dummy
            // credentials, and those are the credentials it hands the container. The
            // containers' endpoint comes from env.json, which SAM ranks over this.
            .env("AWS_ENDPOINT_URL", settings.emulator_endpoint())
            .env_remove("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")
            .env("AWS_ACCESS_KEY_ID", "local")
            .env("AWS_SECRET_ACCESS_KEY", "local")
            .env("AWS_REGION", &region)
            .env("AWS_DEFAULT_REGION", &region)
            .env_remove("AWS_SESSION_TOKEN")
            .env_remove("AWS_PROFILE")
            .stdin(Stdio::null())
            // Its own process group: this command decides when sam is stopped, and how.
            .process_group(0)
            .kill_on_drop(true);
        command
    }
}

/// The running local stack's emulator, or an error saying to start it.
fn require_emulator(endpoint: &str, port: u16) -> Result<()> {
    if std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        bail!("no emulator answers at {endpoint}: start the local stack first (`make local` in another terminal)");
    }
    Ok(())
}
