//! The local emulator: reuse one that answers on the port, else start
//! moto_server there and stop it (by PID) when the stack stops.

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tracing::info;

pub struct Emulator {
    pub endpoint: String,
    child: Option<Child>,
}

fn answers(port: u16) -> bool {
    TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_millis(300)).is_ok()
}

impl Emulator {
    pub fn ensure(port: u16, moto_server: &Path) -> Result<Self> {
        let endpoint = format!("http://127.0.0.1:{port}");
        if answers(port) {
            info!(%endpoint, "reusing the emulator already running");
            return Ok(Self { endpoint, child: None });
        }
        if !moto_server.exists() {
            bail!("{} not found: run `make local` or `make demo`, which install moto into .venv", moto_server.display());
        }
        let mut child = Command::new(moto_server)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", moto_server.display()))?;
        let started = Instant::now();
        while !answers(port) {
            if let Some(status) = child.try_wait()? {
                bail!("moto_server exited ({status}); is port {port} free?");
            }
            if started.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                bail!("moto_server did not answer on port {port} within 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        info!(%endpoint, pid = child.id(), "started moto_server");
        Ok(Self { endpoint, child: Some(child) })
    }

    /// True when this stack started the emulator (and will stop it).
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
    }
}
