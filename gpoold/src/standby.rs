//! A standby's listener. While a controller campaigns it listens on its
//! `listen` address as the leader would, and answers every call, of users
//! and agents alike, UNAVAILABLE with the leader's `advertise` address in
//! `gpool-leader` metadata, and its own name in `gpool-standby`. Agents
//! ask `Leader` right after they connect (`gpool_proto::dial::connect_first`)
//! and go on to the address named; the CLI sends its call at once and
//! sends it again where a standby's refusal names the leader
//! (`gpool_proto::dial::Following`). So naming any one controller
//! reaches the leader. Once
//! elected, the controller stops this listener and serves on the same
//! socket.

use crate::config::Config;
use crate::ha::LeaderAddress;
use crate::security;
use gpool_proto::dial::{LEADER_METADATA, STANDBY_METADATA};
use gpool_proto::pb;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

/// How long a stopping standby waits for its open calls.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// A standby's listener being served, until `stop`.
pub struct Standby {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
    accept: tokio::task::JoinSet<()>,
}

/// Serves redirects on `listener` (with TLS where gpoold.toml asks for
/// it) to the leader `leader` names.
pub fn serve(
    config: &Config,
    listener: Arc<TcpListener>,
    tls: Option<Arc<rustls::ServerConfig>>,
    leader: watch::Receiver<Option<LeaderAddress>>,
) -> Standby {
    let this = config.ha.as_ref().map(|ha| ha.name.clone()).unwrap_or_default();
    let redirect = Redirect { this, leader };
    let router = tonic::transport::Server::builder()
        .add_service(Named::<Pool>::new(redirect.clone()))
        .add_service(Named::<Agents>::new(redirect));
    let mut accept = tokio::task::JoinSet::new();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        let _ = stopped.await;
    };
    let served = tokio::spawn(security::listen::serve_tcp(
        router,
        config,
        (listener, tls, None),
        shutdown,
        &mut accept,
    ));
    Standby {
        stop: Some(stop),
        served,
        accept,
    }
}

impl Standby {
    /// Stops answering: the calls in flight are answered (within
    /// `STOP_GRACE`), and the listener is left to whoever holds it next
    /// (the leader this controller is now).
    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match tokio::time::timeout(STOP_GRACE, &mut self.served).await {
            Ok(Ok(Err(err))) => tracing::warn!("ha: the standby's listener: {err}"),
            Ok(_) => {}
            Err(_) => self.served.abort(),
        }
        while self.accept.join_next().await.is_some() {}
    }
}

/// The answer to every call: where the leader is.
#[derive(Clone)]
struct Redirect {
    this: String,
    leader: watch::Receiver<Option<LeaderAddress>>,
}

impl Redirect {
    /// Every refusal names this controller a standby (`gpool-standby`),
    /// and the leader where one serves (`gpool-leader`).
    fn status(&self) -> tonic::Status {
        let mut status = self.refusal();
        if let Ok(value) = self.this.parse() {
            status.metadata_mut().insert(STANDBY_METADATA, value);
        }
        status
    }

    fn refusal(&self) -> tonic::Status {
        let leader = self.leader.borrow().clone();
        let Some(leader) = leader.filter(|leader| !leader.advertise.is_empty()) else {
            return tonic::Status::unavailable(format!("{} is a standby and no leader is elected yet", self.this));
        };
        if leader.name == self.this {
            return tonic::Status::unavailable(format!(
                "{} is elected and loading its state: ask again in a moment",
                self.this
            ));
        }
        let mut status = tonic::Status::unavailable(format!(
            "{} is a standby; the leader is {} at {}",
            self.this, leader.name, leader.advertise
        ));
        if let Ok(value) = leader.advertise.parse() {
            status.metadata_mut().insert(LEADER_METADATA, value);
        }
        status
    }
}

/// Which gRPC service a `Named` answers for.
trait Service {
    const NAME: &'static str;
}
struct Pool;
impl Service for Pool {
    const NAME: &'static str = pb::pool_server::SERVICE_NAME;
}
struct Agents;
impl Service for Agents {
    const NAME: &'static str = pb::agent_link_server::SERVICE_NAME;
}

/// `Redirect` under the name of service `S`, as the router needs it.
struct Named<S> {
    redirect: Redirect,
    service: std::marker::PhantomData<fn() -> S>,
}

impl<S> Named<S> {
    fn new(redirect: Redirect) -> Named<S> {
        Named {
            redirect,
            service: std::marker::PhantomData,
        }
    }
}

impl<S> Clone for Named<S> {
    fn clone(&self) -> Named<S> {
        Named::new(self.redirect.clone())
    }
}

impl<S: Service> tonic::server::NamedService for Named<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> tower::Service<hyper::Request<B>> for Named<S> {
    type Response = hyper::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: hyper::Request<B>) -> Self::Future {
        std::future::ready(Ok(self.redirect.status().into_http()))
    }
}
