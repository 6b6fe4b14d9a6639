//! `api`: the HTTP API served by `sam local start-api` from the deployed artefacts, until Ctrl-C.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};

use super::session::Session;
use super::template::read_template;
use crate::settings::Settings;

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
