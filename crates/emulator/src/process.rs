//! A local AWS emulator process on 127.0.0.1: moto_server (DynamoDB, Kinesis,
//! Lambda, CloudFormation...) by default, or dynalite / kinesalite (npm; one
//! service each, stricter about AWS's limits). Reused when one already answers
//! on the port, else started, and then stopped by PID when dropped.

use std::fmt;
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tracing::info;

/// How long a starting emulator may take to answer.
const START_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

pub struct Emulator {
    pub port: u16,
    pub endpoint: String,
    child: Option<Child>,
    /// Where the emulator's stderr goes (errors and tracebacks), removed when it stops.
    log: Option<PathBuf>,
    moto: bool,
}

/// What to print about an emulator when a test hangs on it: its stderr, and
/// for moto (whose launcher dumps every thread's stack on SIGUSR1) where each
/// of its request threads is.
#[derive(Clone, Debug)]
pub struct Diagnostics {
    pid: u32,
    log: PathBuf,
    moto: bool,
}

impl Diagnostics {
    pub fn report(&self) -> String {
        if self.moto {
            let _ = Command::new("kill").args(["-USR1", &self.pid.to_string()]).stderr(Stdio::null()).status();
            std::thread::sleep(Duration::from_secs(1));
        }
        let tail = log_tail(&self.log, 300);
        format!("== emulator pid {} ({}), the end of its stderr:\n{tail}", self.pid, self.log.display())
    }

    /// Stops the emulator and removes its log, for a process about to exit
    /// without running destructors.
    pub fn stop(&self) {
        let _ = Command::new("kill").args(["-KILL", &self.pid.to_string()]).stderr(Stdio::null()).status();
        let _ = std::fs::remove_file(&self.log);
    }
}

/// The last `lines` lines of a log (bytes that are not UTF-8 shown as U+FFFD).
fn log_tail(path: &Path, lines: usize) -> String {
    let bytes = std::fs::read(path).unwrap_or_default();
    let text = String::from_utf8_lossy(&bytes);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// True when something accepts connections on 127.0.0.1:`port`.
pub fn answers(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(300)).is_ok()
}

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).unwrap_or(0)
}

/// Stops `child` by its PID: SIGTERM, so it can stop cleanly, then SIGKILL
/// when it has not exited within `grace`.
pub fn stop(child: &mut Child, grace: Duration) {
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).stderr(Stdio::null()).status();
    let started = Instant::now();
    while started.elapsed() < grace {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The moto_server to run: `$MOTO_SERVER`, else `.venv/bin/moto-server` under
/// `root` (moto's server with atomic Kinesis puts, `crates/emulator/moto_server.py`).
pub fn moto_server(root: &Path) -> PathBuf {
    std::env::var_os("MOTO_SERVER").map(PathBuf::from).unwrap_or_else(|| root.join(".venv/bin/moto-server"))
}

impl Emulator {
    /// Reuses the emulator on `port`, or starts `binary` there.
    pub fn ensure(port: u16, binary: &Path) -> Result<Self, Error> {
        let endpoint = format!("http://127.0.0.1:{port}");
        if answers(port) {
            info!(%endpoint, "reusing the emulator already running");
            return Ok(Self { port, endpoint, child: None, log: None, moto: false });
        }
        Self::start(port, binary)
    }

    /// Starts moto_server `binary` on a free port (retrying if another process takes it first).
    pub fn start_on_free_port(binary: &Path) -> Result<Self, Error> {
        Self::on_free_port(|port| Self::start(port, binary))
    }

    /// Starts dynalite or kinesalite (`script` from node_modules/.bin) on a free port, in memory,
    /// creating tables and streams at once.
    pub fn start_node_on_free_port(script: &Path) -> Result<Self, Error> {
        let instant =
            ["--createTableMs", "0", "--deleteTableMs", "0", "--createStreamMs", "0", "--deleteStreamMs", "0"];
        let name = script.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let flags: Vec<&str> =
            instant.chunks(2).filter(|f| f[0].contains("Table") == (name == "dynalite")).flatten().copied().collect();
        Self::on_free_port(|port| {
            let mut command = Command::new(script);
            command.args(["--port", &port.to_string()]).args(&flags);
            Self::launch(port, command, script)
        })
    }

    fn on_free_port(start: impl Fn(u16) -> Result<Self, Error>) -> Result<Self, Error> {
        let mut last = Error("no attempt".into());
        for _ in 0..5 {
            match start(free_port()) {
                Ok(emulator) => return Ok(emulator),
                Err(err) => last = err,
            }
        }
        Err(last)
    }

    fn start(port: u16, binary: &Path) -> Result<Self, Error> {
        let mut command = Command::new(binary);
        command.args(["-H", "127.0.0.1", "-p", &port.to_string()]);
        Self::launch(port, command, binary)
    }

    fn launch(port: u16, mut command: Command, binary: &Path) -> Result<Self, Error> {
        if !binary.exists() {
            return Err(Error(format!(
                "{} not found: `make test` installs moto into .venv and dynalite/kinesalite into .node",
                binary.display()
            )));
        }
        let log = std::env::temp_dir().join(format!("emulator-{}-{port}.log", std::process::id()));
        let stderr = std::fs::File::create(&log).map_err(|e| Error(format!("{}: {e}", log.display())))?;
        let mut child = match command.stdout(Stdio::null()).stderr(stderr).spawn() {
            Ok(child) => child,
            Err(err) => {
                let _ = std::fs::remove_file(&log);
                return Err(Error(format!("starting {}: {err}", binary.display())));
            }
        };
        let started = Instant::now();
        while !answers(port) {
            let exited = child.try_wait().ok().flatten();
            if exited.is_some() || started.elapsed() > START_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                let tail = log_tail(&log, 20);
                let _ = std::fs::remove_file(&log);
                return Err(Error(format!(
                    "{} did not start on port {port} (is it free?); its stderr:\n{tail}",
                    binary.display()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let endpoint = format!("http://127.0.0.1:{port}");
        info!(%endpoint, pid = child.id(), emulator = %binary.display(), "started");
        let moto = binary.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.contains("moto"));
        Ok(Self { port, endpoint, child: Some(child), log: Some(log), moto })
    }

    /// What to print about this emulator if a test hangs on it (`None` when
    /// another process started it).
    pub fn diagnostics(&self) -> Option<Diagnostics> {
        let child = self.child.as_ref()?;
        let log = self.log.clone()?;
        Some(Diagnostics { pid: child.id(), log, moto: self.moto })
    }

    /// True when this value started the emulator (and will stop it).
    pub fn owned(&self) -> bool {
        self.child.is_some()
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if let Some(log) = self.log.take() {
            let _ = std::fs::remove_file(log);
        }
    }
}
