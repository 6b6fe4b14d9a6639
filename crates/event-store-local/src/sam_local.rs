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
//!   with the settings these VMs need (see [`CONTAINERS_CONF`]).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
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
use serde_yaml::Value as Yaml;
use tokio::net::{TcpListener, TcpStream, UnixStream};

use crate::settings::Settings;

/// The bridge network the function containers join besides the engine's default one.
pub const NETWORK: &str = "event-store-local";
/// Its subnet when this command creates it (`INVOKE_SUBNET` overrides); the gateway is its first address.
const DEFAULT_SUBNET: &str = "10.89.71.0/24";
/// What the function's endpoint names; `--add-host` maps it to the network's gateway.
const HOST_ALIAS: &str = "host.docker.internal";
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
/// Window `invoke playback` plays when no event file is given: the last 15 minutes.
const PLAYBACK_WINDOW_MINUTES: i64 = 15;

/// What `invoke` runs: a function of template.yaml, by its short name (its `target/lambda/<name>/`).
pub struct Invocation {
    pub function: String,
    /// The event file; default `events/<function>.json` (for playback: the last 15 minutes).
    pub event: Option<PathBuf>,
}

/// The template as `sam local` should see it locally: every `CodeUri` made
/// absolute (the copy lives elsewhere), and, once [`LocalTemplate::render`]ed,
/// `AWS_ENDPOINT_URL` and `SUBJECT_KMS_KEY` declared for all functions.
/// Everything else, CloudFormation tags included, is kept as it is.
#[derive(Debug)]
pub struct LocalTemplate {
    doc: Yaml,
    pub functions: Vec<LocalFunction>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct LocalFunction {
    /// The name `make build` builds it under: its `target/lambda/<name>/`.
    pub name: String,
    pub logical_id: String,
    /// The variables it declares (its own and the globals), which `--env-vars` may set.
    pub variables: Vec<String>,
}

impl LocalTemplate {
    pub fn function(&self, name: &str) -> Result<&LocalFunction> {
        self.functions.iter().find(|f| f.name == name).with_context(|| {
            let names: Vec<&str> = self.functions.iter().map(|f| f.name.as_str()).collect();
            format!(
                "no function `{name}` in template.yaml (its CodeUri would be target/lambda/{name}/); there are: {}",
                names.join(", ")
            )
        })
    }

    /// The YAML to run, with `AWS_ENDPOINT_URL = endpoint` and `SUBJECT_KMS_KEY` declared in the globals.
    pub fn render(&self, endpoint: &str) -> Result<String> {
        let mut doc = self.doc.clone();
        if let Some(root) = doc.as_mapping_mut() {
            let globals = entry(root, "Globals");
            let function_globals = entry(globals, "Function");
            let environment = entry(function_globals, "Environment");
            let variables = entry(environment, "Variables");
            variables.insert("AWS_ENDPOINT_URL".into(), endpoint.into());
            variables.insert(KMS_KEY.into(), "".into());
        }
        Ok(serde_yaml::to_string(&doc)?)
    }
}

/// Declares who makes subjects' keys in a stack (its keys function); locally
/// there is none, and a writer given an empty one makes them itself...
const KEY_FUNCTION: &str = "KEY_FUNCTION";
/// ...under the local stack's KMS key (declared for the local run: SAM passes
/// only declared variables on).
const KMS_KEY: &str = "SUBJECT_KMS_KEY";

/// template.yaml's text, with its functions' code under `root`.
pub fn local_template(template: &str, root: &Path) -> Result<LocalTemplate> {
    let mut doc: Yaml = serde_yaml::from_str(template).context("template.yaml is not valid YAML")?;
    let globals = doc.get("Globals").and_then(|g| g.get("Function")).map(declared).unwrap_or_default();
    let mut functions = Vec::new();
    let resources = doc.get_mut("Resources").and_then(Yaml::as_mapping_mut).context("template has no Resources")?;
    for (id, resource) in resources.iter_mut() {
        if resource.get("Type").and_then(Yaml::as_str) != Some("AWS::Serverless::Function") {
            continue;
        }
        let mut variables = declared(resource);
        let Some(code_uri) = resource.get_mut("Properties").and_then(|p| p.get_mut("CodeUri")) else { continue };
        let Some(path) = code_uri.as_str().map(str::to_owned) else { continue };
        *code_uri = Yaml::String(format!("{}/", root.join(path.trim_end_matches('/')).display()));
        variables.extend(globals.iter().cloned());
        if variables.iter().any(|v| v == KEY_FUNCTION) {
            variables.push(KMS_KEY.to_owned());
        }
        variables.sort();
        variables.dedup();
        functions.push(LocalFunction {
            name: Path::new(&path).file_name().and_then(|n| n.to_str()).unwrap_or_default().to_owned(),
            logical_id: id.as_str().unwrap_or_default().to_owned(),
            variables,
        });
    }
    if !doc.is_mapping() {
        bail!("template is not a mapping");
    }
    Ok(LocalTemplate { doc, functions })
}

/// The mapping under `key` of `map`, created empty when missing.
fn entry<'a>(map: &'a mut serde_yaml::Mapping, key: &str) -> &'a mut serde_yaml::Mapping {
    let value = map.entry(key.into()).or_insert_with(|| Yaml::Mapping(Default::default()));
    if !value.is_mapping() {
        *value = Yaml::Mapping(Default::default());
    }
    value.as_mapping_mut().expect("made a mapping just above")
}

/// Names under `Environment.Variables` of a function (or of `Globals.Function`).
fn declared(function: &Yaml) -> Vec<String> {
    let properties = function.get("Properties").unwrap_or(function);
    properties
        .get("Environment")
        .and_then(|e| e.get("Variables"))
        .and_then(Yaml::as_mapping)
        .map(|vars| vars.keys().filter_map(Yaml::as_str).map(str::to_owned).collect())
        .unwrap_or_default()
}

/// `--env-vars` content: for each function, each variable it declares that
/// `lookup` (this process's environment, as the local stack sets it) has a
/// non-empty value for, and `AWS_ENDPOINT_URL = endpoint`: SAM ranks this file
/// over the shell (which holds the emulator's address on the host) and the template.
pub fn env_vars(template: &LocalTemplate, endpoint: &str, lookup: impl Fn(&str) -> Option<String>) -> Value {
    let functions = template.functions.iter().map(|function| {
        let mut values: serde_json::Map<String, Value> = function
            .variables
            .iter()
            .filter_map(|name| lookup(name).filter(|v| !v.trim().is_empty()).map(|v| (name.clone(), Value::String(v))))
            .collect();
        values.insert("AWS_ENDPOINT_URL".into(), endpoint.into());
        if function.variables.iter().any(|v| v == KEY_FUNCTION) {
            // Set, and empty (as unset to the function): else SAM would pass the template's !Ref on.
            values.insert(KEY_FUNCTION.into(), "".into());
        }
        (function.logical_id.clone(), Value::Object(values))
    });
    Value::Object(functions.collect())
}

/// The playback request `invoke playback` sends without an event file: the
/// last 15 minutes up to `now`, waiting for the watermark to pass `now`.
pub fn recent_playback(now: chrono::DateTime<chrono::Utc>, wait_seconds: u64) -> Value {
    let iso = |t: chrono::DateTime<chrono::Utc>| t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    json!({ "start": iso(now - chrono::Duration::minutes(PLAYBACK_WINDOW_MINUTES)), "end": iso(now), "wait_seconds": wait_seconds })
}

/// The error a function answered with, if its answer (sam's stdout) is one.
pub fn function_error(answer: &str) -> Option<String> {
    let value: Value = serde_json::from_str(answer.trim()).ok()?;
    let kind = value.get("errorType")?.as_str().unwrap_or("error");
    Some(format!("{kind}: {}", value.get("errorMessage").and_then(Value::as_str).unwrap_or_default()))
}

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
struct Engine {
    socket: PathBuf,
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
    async fn connect(dir: &Path) -> Result<Self> {
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
    async fn remove_containers_with(&self, marker: &str) -> Result<usize> {
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
    async fn network_gateway(&self, subnet: &str) -> Result<Ipv4Addr> {
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

/// Listens on `address` at a free port, even before the address exists: a
/// podman bridge (and its gateway address) is only set up while a container is on it.
pub fn listen_on(address: Ipv4Addr) -> Result<TcpListener> {
    let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
    #[cfg(target_os = "linux")]
    socket.set_freebind_v4(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&SocketAddrV4::new(address, 0).into()).with_context(|| format!("listening on {address}"))?;
    socket.listen(128)?;
    Ok(TcpListener::from_std(socket.into())?)
}

/// Copies every connection accepted on `listener` to and from `target`, until dropped.
pub async fn forward(listener: TcpListener, target: SocketAddr) {
    loop {
        let mut inbound = match listener.accept().await {
            Ok((inbound, _)) => inbound,
            Err(err) => {
                // Out of descriptors, say: back off rather than spin.
                tracing::warn!(%err, "forwarder: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        tokio::spawn(async move {
            match TcpStream::connect(target).await {
                Ok(mut outbound) => {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
                Err(err) => tracing::warn!(%target, %err, "forwarder: the emulator refused a connection"),
            }
        });
    }
}

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
struct Session {
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
    async fn open(settings: &Settings, template: &LocalTemplate) -> Result<Self> {
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
    async fn close(self) {
        match self.engine.remove_containers_with(&format!("AWS_ENDPOINT_URL={}", self.endpoint)).await {
            Ok(0) => {}
            Ok(removed) => eprintln!("== removed {removed} function containers sam left behind"),
            Err(err) => eprintln!("warning: could not look for containers sam left behind: {err:#}"),
        }
    }

    fn dir(&self) -> &Path {
        &self.scratch.0
    }

    /// `sam local <args>` on the local template, its variables and network,
    /// with nothing that could reach AWS.
    fn sam(&self, sam: &Path, settings: &Settings, args: &[&str]) -> tokio::process::Command {
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

fn read_template(root: &Path) -> Result<LocalTemplate> {
    let path = root.join("template.yaml");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    local_template(&text, root)
}

/// Runs the invocation; true when the function answered without an error.
pub async fn invoke(settings: &Settings, sam: &Path, root: &Path, invocation: Invocation) -> Result<bool> {
    let function = invocation.function.as_str();
    let template = read_template(root)?;
    let logical_id = template.function(function)?.logical_id.clone();
    let bootstrap = root.join("target/lambda").join(function).join("bootstrap");
    if !bootstrap.exists() {
        bail!("{} is missing: `make build` builds the functions (make invoke does it first)", bootstrap.display());
    }
    let event = match &invocation.event {
        Some(path) => Some(std::fs::canonicalize(path).with_context(|| format!("event file {}", path.display()))?),
        None if function == "playback" => None,
        None => {
            let path = root.join("events").join(format!("{function}.json"));
            Some(std::fs::canonicalize(&path).with_context(|| format!("no event given and no {}", path.display()))?)
        }
    };
    let session = Session::open(settings, &template).await?;
    let event = match event {
        Some(path) => path,
        None => {
            let wait = (settings.scan_interval.as_secs() * 4).max(30);
            let path = session.dir().join("playback.json");
            std::fs::write(&path, recent_playback(chrono::Utc::now(), wait).to_string())?;
            path
        }
    };
    eprintln!("== sam local invoke {logical_id} ({}) with {}", bootstrap.display(), event.display());
    let mut command = session.sam(sam, settings, &["invoke", &logical_id]);
    command.arg("--event").arg(&event).stdout(Stdio::piped());
    let started = Instant::now();
    let child = command.spawn().with_context(|| format!("starting {}", sam.display()))?;
    let output = tokio::select! {
        output = child.wait_with_output() => output,
        _ = crate::stack::shutdown_signal() => Err(std::io::Error::other("interrupted")),
    };
    session.close().await;
    let output = output?;
    let answer = String::from_utf8_lossy(&output.stdout);
    println!("{}", answer.trim());
    eprintln!("== {logical_id} answered in {:.1} s", started.elapsed().as_secs_f64());
    if !output.status.success() {
        bail!("sam local invoke failed ({})", output.status);
    }
    if let Some(error) = function_error(&answer) {
        eprintln!("the function answered with an error: {error}");
        return Ok(false);
    }
    Ok(true)
}

/// `sam local start-api` on 127.0.0.1:`port` until Ctrl-C: the HTTP API's
/// routes (the pixel, `/events`, `/streams`) served by the deployed artefacts
/// in warm containers, against the running local stack.
pub async fn api(settings: &Settings, sam: &Path, root: &Path, port: u16) -> Result<bool> {
    let session = Session::open(settings, &read_template(root)?).await?;
    eprintln!("== sam local start-api: http://127.0.0.1:{port}/track.gif (warm containers; Ctrl-C stops)");
    let mut command = session.sam(sam, settings, &["start-api"]);
    command.args(["--host", "127.0.0.1", "--port", &port.to_string(), "--warm-containers", "LAZY"]);
    let mut child = command.spawn().with_context(|| format!("starting {}", sam.display()))?;
    let status = tokio::select! {
        status = child.wait() => Some(status),
        _ = crate::stack::shutdown_signal() => None,
    };
    if status.is_none() {
        // One SIGINT is how sam stops cleanly (it removes its warm containers).
        if let Some(pid) = child.id() {
            let _ = std::process::Command::new("kill").args(["-INT", &pid.to_string()]).status();
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), child.wait()).await;
        let _ = child.start_kill();
    }
    session.close().await;
    match status {
        None => Ok(true),
        Some(status) => Ok(status?.success()),
    }
}

/// The running local stack's emulator, or an error saying to start it.
fn require_emulator(endpoint: &str, port: u16) -> Result<()> {
    if std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        bail!("no emulator answers at {endpoint}: start the local stack first (`make local` in another terminal)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn template() -> String {
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../template.yaml")).unwrap()
    }

    #[test]
    fn the_local_template_changes_code_paths_and_the_endpoint_only() {
        let root = Path::new("/src/event-store");
        let local = local_template(&template(), root).unwrap();
        let playback = local.function("playback").unwrap();
        assert_eq!(playback.logical_id, "PlaybackFunction");
        assert!(playback.variables.contains(&"DYNAMO_EVENT_TABLE".to_owned()), "{:?}", playback.variables);
        assert_eq!(local.functions.len(), 10, "{:?}", local.functions);

        let mut original: Yaml = serde_yaml::from_str(&template()).unwrap();
        let mut changed: Yaml =
            serde_yaml::from_str(&local.render("http://host.docker.internal:4000").unwrap()).unwrap();
        let globals = &changed["Globals"]["Function"]["Environment"]["Variables"];
        assert_eq!(globals["AWS_ENDPOINT_URL"].as_str(), Some("http://host.docker.internal:4000"));
        let code_uri = &changed["Resources"]["PlaybackFunction"]["Properties"]["CodeUri"];
        assert_eq!(code_uri.as_str(), Some("/src/event-store/target/lambda/playback/"));
        // Put back what was changed: the rest, tags such as !Ref and !GetAtt included, is identical.
        let changed_resources = changed["Resources"].as_mapping_mut().unwrap();
        for (id, resource) in original["Resources"].as_mapping().unwrap() {
            if let Some(uri) = resource.get("Properties").and_then(|p| p.get("CodeUri")) {
                changed_resources[id]["Properties"]["CodeUri"] = uri.clone();
            }
        }
        let globals = changed["Globals"]["Function"].as_mapping_mut().unwrap();
        let original_globals = original["Globals"]["Function"].as_mapping_mut().unwrap();
        globals.remove("Environment");
        original_globals.remove("Environment");
        assert_eq!(changed, original);
    }

    #[test]
    fn an_unknown_function_names_the_ones_there_are() {
        let local = local_template(&template(), Path::new("/x")).unwrap();
        let err = local.function("nope").unwrap_err().to_string();
        assert!(err.contains("no function `nope`") && err.contains("playback") && err.contains("load"), "{err}");
    }

    #[test]
    fn env_vars_carry_declared_non_empty_values_and_the_containers_endpoint() {
        let local = local_template(&template(), Path::new("/x")).unwrap();
        let vars = env_vars(&local, "http://h:1", |name| match name {
            "EVENT_STREAM" => Some("s".into()),
            "AWS_ENDPOINT_URL" => Some("http://127.0.0.1:4566".into()),
            "DYNAMO_EVENT_TABLE" => Some("t".into()),
            "IP_MODE" => Some(String::new()), // as make exports an unset variable
            _ => None,
        });
        // The load function does not declare the event table; the pump does not declare the stream.
        assert_eq!(
            vars["LoadFunction"],
            json!({ "EVENT_STREAM": "s", "AWS_ENDPOINT_URL": "http://h:1", "KEY_FUNCTION": "" })
        );
        assert_eq!(vars["PumpFunction"], json!({ "DYNAMO_EVENT_TABLE": "t", "AWS_ENDPOINT_URL": "http://h:1" }));
    }

    #[test]
    fn local_writers_make_subjects_keys_themselves_under_the_local_kms_key() {
        let local = local_template(&template(), Path::new("/x")).unwrap();
        let vars = env_vars(&local, "http://h:1", |name| match name {
            "KEY_TABLE" => Some("keys".into()),
            "SUBJECT_KMS_KEY" => Some("alias/local".into()),
            _ => None,
        });
        for writer in ["LoadFunction", "StreamsFunction"] {
            // The stack's keys function is not there: an empty KEY_FUNCTION, and the local KMS key.
            assert_eq!(vars[writer]["KEY_FUNCTION"], json!(""), "{writer}");
            assert_eq!(vars[writer]["SUBJECT_KMS_KEY"], json!("alias/local"), "{writer}");
        }
        assert_eq!(vars["KeysFunction"]["SUBJECT_KMS_KEY"], json!("alias/local"));
        assert!(vars["PlaybackFunction"].get("SUBJECT_KMS_KEY").is_none(), "a reader makes no key");
        let rendered: Yaml = serde_yaml::from_str(&local.render("http://h:1").unwrap()).unwrap();
        assert!(rendered["Globals"]["Function"]["Environment"]["Variables"].get("SUBJECT_KMS_KEY").is_some());
    }

    #[test]
    fn the_default_playback_is_the_last_15_minutes() {
        let now = chrono::DateTime::parse_from_rfc3339("2026-11-25T10:00:00.250Z").unwrap().to_utc();
        let request = recent_playback(now, 30);
        assert_eq!(
            request,
            json!({ "start": "2026-11-25T09:45:00.250Z", "end": "2026-11-25T10:00:00.250Z", "wait_seconds": 30 })
        );
        let parsed: event_store::playback::PlaybackRequest = serde_json::from_value(request).unwrap();
        assert_eq!(parsed.wait_seconds, Some(30));
    }

    #[test]
    fn errors_answered_by_the_function_are_recognised() {
        let error = r#"{"errorType": "DynamoDbError", "errorMessage": "dynamodb UpdateItem: service error"}"#;
        assert_eq!(function_error(error).as_deref(), Some("DynamoDbError: dynamodb UpdateItem: service error"));
        assert_eq!(function_error(r#"{"status": "complete", "events": 5}"#), None);
        assert_eq!(function_error("not json"), None);
    }

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

    #[tokio::test]
    async fn the_forwarder_copies_both_ways() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = echo.local_addr().unwrap();
        tokio::spawn(async move {
            let (mut socket, _) = echo.accept().await.unwrap();
            let mut buf = [0u8; 5];
            socket.read_exact(&mut buf).await.unwrap();
            socket.write_all(&buf.map(|b| b.to_ascii_uppercase())).await.unwrap();
        });
        let listener = listen_on(Ipv4Addr::LOCALHOST).unwrap();
        let port = listener.local_addr().unwrap().port();
        let forwarder = tokio::spawn(forward(listener, target));
        let mut client = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        client.write_all(b"hello").await.unwrap();
        let mut answer = [0u8; 5];
        client.read_exact(&mut answer).await.unwrap();
        assert_eq!(&answer, b"HELLO");
        forwarder.abort();
    }
}
