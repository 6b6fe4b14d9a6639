//! The forwarder: the emulator on the host's 127.0.0.1, reachable from the containers' network.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::net::{TcpListener, TcpStream};

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

#[cfg(test)]
mod tests {
    use super::*;

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
