//! Turning sockets into connections the gRPC server takes: TLS handshakes
//! on the TCP listener, or plaintext where the config allows it (each
//! plaintext connection logged with a warning), and the local Unix socket.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream, UnixListener};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// How long a peer may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections accepted but not yet taken by the server.
const BACKLOG: usize = 256;

pub type TlsConnections = mpsc::Receiver<std::io::Result<tokio_rustls::server::TlsStream<TcpStream>>>;
pub type PlainConnections = mpsc::Receiver<std::io::Result<super::loopback::PlainTcp>>;

/// Accepts TCP connections and hands over those that complete a TLS
/// handshake; a refused one (a bad client certificate, say) is logged and
/// audited where `security` is given (a standby has no audit log open).
/// Runs until the receiver is dropped; the listener is shared so that a
/// standby's listener goes on to serve as the leader's.
pub fn accept_tls(
    listener: Arc<TcpListener>,
    config: Arc<rustls::ServerConfig>,
    security: Option<Arc<super::Security>>,
    tasks: &mut JoinSet<()>,
) -> TlsConnections {
    let (sender, receiver) = mpsc::channel(BACKLOG);
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tasks.spawn(async move {
        let mut handshakes = JoinSet::new();
        loop {
            let (stream, peer) = tokio::select! {
                accepted = accept(&listener) => accepted,
                () = sender.closed() => return,
                Some(_) = handshakes.join_next() => continue,
            };
            let _ = stream.set_nodelay(true);
            let acceptor = acceptor.clone();
            let sender = sender.clone();
            let security = security.clone();
            handshakes.spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                    Ok(Ok(tls)) => drop(sender.send(Ok(tls)).await),
                    Ok(Err(err)) if err.kind() == std::io::ErrorKind::UnexpectedEof => {
                        // A port probe, or a client that gave up: nothing to audit.
                        tracing::debug!(%peer, "TLS handshake not begun: {err}");
                    }
                    Ok(Err(err)) => {
                        tracing::warn!(%peer, "TLS handshake refused: {err}");
                        let Some(security) = security else { return };
                        security.audit(&super::AuditEntry {
                            at: super::now_text(),
                            caller: "",
                            via: "tls",
                            peer: &peer.to_string(),
                            action: "tls handshake",
                            object: "",
                            outcome: format!("refused: {err}"),
                        });
                    }
                    Err(_) => tracing::warn!(%peer, "TLS handshake not finished within {HANDSHAKE_TIMEOUT:?}"),
                }
            });
        }
    });
    receiver
}

/// Accepts plaintext TCP connections from `allowed` ranges only (a
/// loopback listener: loopback), each with a warning if `warn` (the
/// operator's insecure_plaintext). Loopback peers are known by the uid
/// owning their socket.
pub fn accept_plain(
    listener: Arc<TcpListener>,
    allowed: Vec<ipnet::IpNet>,
    warn: bool,
    tasks: &mut JoinSet<()>,
) -> PlainConnections {
    let (sender, receiver) = mpsc::channel(BACKLOG);
    tasks.spawn(async move {
        loop {
            let (stream, peer) = tokio::select! {
                accepted = accept(&listener) => accepted,
                () = sender.closed() => return,
            };
            if !allowed.iter().any(|range| range.contains(&peer.ip())) {
                tracing::warn!(%peer, "plaintext connection refused: the peer is outside plaintext_from");
                continue;
            }
            if warn {
                tracing::warn!(%peer, "plaintext connection (insecure_plaintext): nothing on it is encrypted");
            }
            let _ = stream.set_nodelay(true);
            if sender
                .send(Ok(super::loopback::PlainTcp::new(stream, peer)))
                .await
                .is_err()
            {
                return;
            }
        }
    });
    receiver
}

/// The next connection; a failed accept (out of file descriptors, say) is
/// logged and tried again a moment later.
async fn accept(listener: &TcpListener) -> (TcpStream, std::net::SocketAddr) {
    loop {
        match listener.accept().await {
            Ok(accepted) => return accepted,
            Err(err) => {
                tracing::warn!("accept: {err}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Binds the local socket (replacing a stale one) with mode 0666: every
/// local user may connect, and is known by the peer credentials.
pub fn bind_unix(path: &Path) -> anyhow::Result<UnixListener> {
    use anyhow::Context;
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(err).with_context(|| format!("socket {}: cannot remove the old one", path.display())),
    }
    let listener = UnixListener::bind(path).with_context(|| format!("socket {}: cannot bind", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))
        .with_context(|| format!("socket {}: cannot chmod", path.display()))?;
    Ok(listener)
}

/// What `serve_tcp` returns: the server, running until its shutdown.
pub type Served = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), tonic::transport::Error>> + Send>>;

/// Serves `router` on the TCP `listener` until `shutdown`, over TLS where
/// `tls` is given (a refused handshake audited where `security` is), else
/// plaintext from the config's `plaintext_from`: the leader's listener and
/// a standby's alike.
pub fn serve_tcp<L, ResBody>(
    router: tonic::transport::server::Router<L>,
    config: &crate::config::Config,
    (listener, tls, security): (
        Arc<TcpListener>,
        Option<Arc<rustls::ServerConfig>>,
        Option<Arc<super::Security>>,
    ),
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    tasks: &mut JoinSet<()>,
) -> Served
where
    L: tower::Layer<tonic::service::Routes> + Send + 'static,
    L::Service:
        tower::Service<hyper::Request<tonic::body::Body>, Response = hyper::Response<ResBody>> + Clone + Send + 'static,
    <L::Service as tower::Service<hyper::Request<tonic::body::Body>>>::Future: Send,
    <L::Service as tower::Service<hyper::Request<tonic::body::Body>>>::Error:
        Into<Box<dyn std::error::Error + Send + Sync>> + Send,
    ResBody: hyper::body::Body<Data = hyper::body::Bytes> + Send + 'static,
    ResBody::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match tls {
        Some(tls) => {
            let incoming = accept_tls(listener, tls, security, tasks);
            Box::pin(
                router.serve_with_incoming_shutdown(tokio_stream::wrappers::ReceiverStream::new(incoming), shutdown),
            )
        }
        None => {
            let incoming = accept_plain(
                listener,
                config.plaintext_from.clone(),
                config.insecure_plaintext,
                tasks,
            );
            Box::pin(
                router.serve_with_incoming_shutdown(tokio_stream::wrappers::ReceiverStream::new(incoming), shutdown),
            )
        }
    }
}
