//! The container engine (`DOCKER_HOST`'s, or a podman service started for the call) and its API over its Unix socket.

use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::UnixStream;

use super::NETWORK;

/// The podman API service's settings. runc: podman's default crun fails on
/// these VMs (cgroup v1 and v2 mounted together). Ulimits at Lambda's 1024:
/// podman's defaults raise them above the hard limits, which needs a
/// capability the VMs do not give. cgroupfs and a file event log: no systemd.
pub const CONTAINERS_CONF: &str = "\
[containers]
default_ulimits = [\"nofile=1024:1024\", \"nproc=1024:1024\"]
[engine]
runtime = \"runc\"
cgroup_manager = \"cgroupfs\"
events_logger = \"file\"
";

/// The first host address of an IPv4 subnet: `10.89.71.0/24` → `10.89.71.1`.
pub fn gateway_of(subnet: &str) -> Result<Ipv4Addr> {
    let (address, bits) = subnet.split_once('/').context("a subnet is address/bits, like 10.89.71.0/24")?;
    let address: Ipv4Addr = address.parse().with_context(|| format!("{address:?} is not an IPv4 address"))?;
    let bits: u32 = bits.parse().ok().filter(|b| (8..=30).contains(b)).context("subnet bits must be 8..=30")?;
    let mask = u32::MAX << (32 - bits);
    Ok(Ipv4Addr::from((u32::from(address) & mask) + 1))
}

/// The engine's API socket from `DOCKER_HOST` (`unix://` only: the forwarder
/// must be on the same host as the containers).
pub fn docker_host_socket(docker_host: &str) -> Result<PathBuf> {
    match docker_host.strip_prefix("unix://") {
        Some(path) if !path.is_empty() => Ok(PathBuf::from(path)),
        _ => {
            bail!("DOCKER_HOST={docker_host:?}: only a local engine (unix:///path/to/socket) can reach the local stack")
        }
    }
}

/// A Docker-compatible engine's API, over its Unix socket.
pub(super) struct Engine {
    pub(super) socket: PathBuf,
    /// The podman service started for this call: held only to be stopped (by PID) when dropped.
    _service: Option<Service>,
}

struct Service(std::process::Child);

impl Drop for Service {
    fn drop(&mut self) {
        // SIGTERM lets podman clean up; the wait is bounded, then SIGKILL.
        event_store_emulator::stop(&mut self.0, Duration::from_secs(10));
    }
}

/// True when this process runs as root (the owner of `/proc/self` is the effective user).
fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// How long one call to the engine's API may take.
const ENGINE_CALL_TIMEOUT: Duration = Duration::from_secs(60);

impl Engine {
    /// `DOCKER_HOST`'s engine, else a podman service on a socket in `dir`.
    pub(super) async fn connect(dir: &Path) -> Result<Self> {
        if let Some(host) = std::env::var("DOCKER_HOST").ok().filter(|h| !h.is_empty()) {
            let engine = Self { socket: docker_host_socket(&host)?, _service: None };
            engine.ping().await.with_context(|| format!("no container engine answers at DOCKER_HOST={host}"))?;
            return Ok(engine);
        }
        if !is_root() {
            bail!("without DOCKER_HOST, make invoke runs containers with rootful podman: run it as root, or set DOCKER_HOST to a Docker engine's socket");
        }
        let socket = dir.join("podman.sock");
        let conf = dir.join("containers.conf");
        std::fs::write(&conf, CONTAINERS_CONF)?;
        let log_path = dir.join("podman-service.log");
        let log = std::fs::File::create(&log_path)?;
        let child = std::process::Command::new("podman")
            .args(["system", "service", "--time=0", &format!("unix://{}", socket.display())])
            .env("CONTAINERS_CONF", &conf)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            // Its own process group: a terminal's Ctrl-C must not stop the engine
            // before sam and this command have removed their containers.
            .process_group(0)
            .spawn()
            .context("starting `podman system service` (no DOCKER_HOST set; `make tools-container` installs podman)")?;
        let mut engine = Self { socket, _service: Some(Service(child)) };
        let started = Instant::now();
        while let Err(err) = engine.ping().await {
            let exited = engine._service.as_mut().and_then(|s| s.0.try_wait().ok().flatten());
            if exited.is_some() || started.elapsed() > Duration::from_secs(30) {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                return Err(err.context(format!("podman's API service did not answer ({exited:?}): {log}")));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(engine)
    }

    async fn ping(&self) -> Result<()> {
        let (status, _) = self.call(Method::GET, "/_ping", None).await?;
        if !status.is_success() {
            bail!("the engine answered /_ping with {status}");
        }
        Ok(())
    }

    /// One request to the engine's API: its status and its body as JSON (`Null` when not JSON).
    async fn call(&self, method: Method, path: &str, body: Option<Value>) -> Result<(StatusCode, Value)> {
        tokio::time::timeout(ENGINE_CALL_TIMEOUT, self.call_once(method, path, body))
            .await
            .with_context(|| format!("the engine did not answer {path} within {ENGINE_CALL_TIMEOUT:?}"))?
    }

    async fn call_once(&self, method: Method, path: &str, body: Option<Value>) -> Result<(StatusCode, Value)> {
        let stream = UnixStream::connect(&self.socket)
            .await
            .with_context(|| format!("connecting to {}", self.socket.display()))?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let body = body.map(|b| b.to_string()).unwrap_or_default();
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "engine")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let bytes = response.into_body().collect().await?.to_bytes();
        Ok((status, serde_json::from_slice(&bytes).unwrap_or(Value::Null)))
    }

    /// Removes the function containers whose environment holds the variable
    /// `marker` (`NAME=value`: a session's endpoint, which no session running at
    /// the same time shares), running or not: what sam leaves when it is
    /// stopped without the chance to clean up.
    pub(super) async fn remove_containers_with(&self, marker: &str) -> Result<usize> {
        let filter = json!({ "label": ["sam.cli.container.type=lambda"] }).to_string();
        let path = format!("/containers/json?all=true&filters={}", percent_encode(&filter));
        let (_, listed) = self.call(Method::GET, &path, None).await?;
        let mut removed = 0;
        for id in listed.as_array().into_iter().flatten().filter_map(|c| c["Id"].as_str()) {
            let (_, details) = self.call(Method::GET, &format!("/containers/{id}/json"), None).await?;
            let env = details["Config"]["Env"].as_array().cloned().unwrap_or_default();
            if env.iter().any(|e| e.as_str() == Some(marker)) {
                let (status, answer) = self.call(Method::DELETE, &format!("/containers/{id}?force=true"), None).await?;
                // 404: sam removed it meanwhile.
                if !status.is_success() && status != StatusCode::NOT_FOUND {
                    bail!("removing container {id}: {status} {answer}");
                }
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// The gateway of [`NETWORK`], created with `subnet` when missing.
    pub(super) async fn network_gateway(&self, subnet: &str) -> Result<Ipv4Addr> {
        let path = format!("/networks/{NETWORK}");
        let (mut status, mut network) = self.call(Method::GET, &path, None).await?;
        if status == StatusCode::NOT_FOUND {
            let gateway = gateway_of(subnet)?;
            let create = json!({
                "Name": NETWORK,
                "Driver": "bridge",
                "IPAM": { "Config": [{ "Subnet": subnet, "Gateway": gateway.to_string() }] },
                "Labels": { "purpose": "make invoke: function containers reach the local stack through its gateway" },
            });
            let (created, answer) = self.call(Method::POST, "/networks/create", Some(create)).await?;
            // 409: another session created it meanwhile.
            if !created.is_success() && created != StatusCode::CONFLICT {
                bail!("creating network {NETWORK} ({subnet}) failed: {created} {answer} (INVOKE_SUBNET picks another subnet)");
            }
            (status, network) = self.call(Method::GET, &path, None).await?;
        }
        if !status.is_success() {
            bail!("inspecting network {NETWORK}: {status} {network}");
        }
        network["IPAM"]["Config"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|config| config["Gateway"].as_str().and_then(|g| g.parse().ok()))
            .with_context(|| format!("network {NETWORK} has no IPv4 gateway: {network}"))
    }
}

/// Characters a URL's query keeps as they are (RFC 3986's unreserved ones).
const UNRESERVED: &percent_encoding::AsciiSet =
    &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// `text` made safe for a URL's query.
fn percent_encode(text: &str) -> String {
    percent_encoding::utf8_percent_encode(text, UNRESERVED).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gateways_and_sockets_parse() {
        assert_eq!(gateway_of("10.89.71.0/24").unwrap(), Ipv4Addr::new(10, 89, 71, 1));
        assert_eq!(gateway_of("172.30.5.7/16").unwrap(), Ipv4Addr::new(172, 30, 0, 1));
        assert!(gateway_of("10.89.71.0").is_err());
        assert!(gateway_of("10.89.71.0/31").is_err());
        assert_eq!(docker_host_socket("unix:///run/podman.sock").unwrap(), PathBuf::from("/run/podman.sock"));
        assert!(docker_host_socket("tcp://10.0.0.1:2375").is_err());
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(percent_encode(r#"{"label":["a=b"]}"#), "%7B%22label%22%3A%5B%22a%3Db%22%5D%7D");
        assert_eq!(percent_encode("plain-text_1.0~"), "plain-text_1.0~");
    }
}
