//! The CLI's channel to gpoold. It connects to the first address that
//! answers and sends each call straight there, with no `Leader` question
//! first (one round trip fewer per command). A standby refuses every call
//! (UNAVAILABLE, `gpool-standby` metadata), so a refused call was not
//! carried out: it is sent again to the leader the standby names in
//! `gpool-leader` (where the caller's token may go, `follow`), or, from a
//! standby that knows no leader yet, to the next address given. Each
//! request is kept until its answer comes to be sent again: every call of
//! the `Pool` service sends one message.
//!
//! Agents keep `connect_first`: their link is a stream both ways.

use super::{connect, follow, Address, ClientTls, Deadlines, DialError, TokenRule, LEADER_METADATA, MAX_REDIRECTS};
use http_body_util::BodyExt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use tonic::body::Body;
use tonic::codegen::{http, Bytes, StdError};
use tonic::transport::Channel;

/// The metadata in which a standby names itself on every refusal.
pub const STANDBY_METADATA: &str = "gpool-standby";

/// A channel to the leader, found by following standbys' refusals.
#[derive(Clone)]
pub struct Following {
    shared: Arc<Shared>,
}

struct Shared {
    addresses: Vec<Address>,
    tls: ClientTls,
    deadlines: Deadlines,
    /// Where the caller's token may go, if it sends one.
    token: Option<TokenRule>,
    /// Where calls go now, and the address that reached it.
    current: Mutex<(Channel, Address)>,
}

/// Connects to the first of `addresses` that answers, in order, as
/// `connect_first` does, but asks nothing: the first call finds out
/// whether a standby answered. `token`: the caller sends a bearer token,
/// which a refusal is followed only where `token` allows.
pub async fn connect_following(
    addresses: &[Address],
    tls: &ClientTls,
    deadlines: Deadlines,
    token: Option<&TokenRule>,
) -> Result<(Following, Address), DialError> {
    let mut failures = Vec::new();
    for address in addresses {
        match connect(address, tls, deadlines).await {
            Ok(channel) => {
                let shared = Shared {
                    addresses: addresses.to_vec(),
                    tls: tls.clone(),
                    deadlines,
                    token: token.cloned(),
                    current: Mutex::new((channel, address.clone())),
                };
                let following = Following {
                    shared: Arc::new(shared),
                };
                return Ok((following, address.clone()));
            }
            Err(err) if addresses.len() == 1 => return Err(DialError::Unreachable(err)),
            Err(err) => failures.push(format!("{}: {err}", address.text())),
        }
    }
    Err(DialError::Unreachable(failures.join("; ")))
}

/// How a standby refused a call.
enum Refusal {
    /// It names the leader's address.
    Leader(String),
    /// It knows no leader that serves yet.
    NoLeader,
}

impl Refusal {
    /// A standby's refusal comes as headers alone: UNAVAILABLE (14), from
    /// a controller that says it is a standby.
    fn of(response: &http::Response<Body>) -> Option<Refusal> {
        let headers = response.headers();
        let unavailable = headers.get("grpc-status").is_some_and(|code| code.as_bytes() == b"14");
        if !unavailable || !headers.contains_key(STANDBY_METADATA) {
            return None;
        }
        Some(
            match headers.get(LEADER_METADATA).and_then(|value| value.to_str().ok()) {
                Some(leader) => Refusal::Leader(leader.to_string()),
                None => Refusal::NoLeader,
            },
        )
    }
}

impl tower::Service<http::Request<Body>> for Following {
    type Response = http::Response<Body>;
    type Error = StdError;
    type Future = Pin<Box<dyn Future<Output = Result<http::Response<Body>, StdError>> + Send>>;

    /// Always ready: each call waits for its channel (`oneshot`).
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), StdError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let shared = self.shared.clone();
        Box::pin(async move { shared.send(request).await })
    }
}

impl Shared {
    fn current(&self) -> (Channel, Address) {
        self.current.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Sends `request`, and again wherever standbys send it on.
    async fn send(&self, request: http::Request<Body>) -> Result<http::Response<Body>, StdError> {
        let (parts, body) = request.into_parts();
        let body = body.collect().await?.to_bytes();
        let mut followed: Vec<String> = Vec::new();
        loop {
            let (channel, address) = self.current();
            let response = tower::ServiceExt::oneshot(channel, again(&parts, body.clone())).await?;
            let Some(refusal) = Refusal::of(&response) else {
                return Ok(response);
            };
            let next = match &refusal {
                Refusal::Leader(leader) => follow(&address, leader, &self.tls, self.token.as_ref())?,
                Refusal::NoLeader => match self.after(&address) {
                    Some(next) => next,
                    // Nobody else to ask: the refusal says why.
                    None => return Ok(response),
                },
            };
            followed.push(address.text());
            if followed.len() > MAX_REDIRECTS || followed.contains(&next.text()) {
                return Err(Box::new(DialError::Unreachable(format!(
                    "standbys sent the call on too often or round in a circle: {} then {}",
                    followed.join(", "),
                    next.text()
                ))));
            }
            let channel = connect(&next, &self.tls, self.deadlines).await.map_err(|err| {
                let (standby, next) = (address.text(), next.text());
                DialError::Unreachable(match refusal {
                    Refusal::Leader(_) => format!("{standby} is a standby; the leader it names, {next}: {err}"),
                    Refusal::NoLeader => format!("{standby} is a standby that knows no leader yet; {next}: {err}"),
                })
            })?;
            *self.current.lock().unwrap_or_else(PoisonError::into_inner) = (channel, next);
        }
    }

    /// The address given after `address`, for a standby that knows no
    /// leader: `None` where it is the last (or was not given: a leader's
    /// address a standby named).
    fn after(&self, address: &Address) -> Option<Address> {
        let at = self.addresses.iter().position(|given| given == address)?;
        self.addresses.get(at + 1).cloned()
    }
}

/// `parts` and `body` as a request again (the channel sets the origin).
fn again(parts: &http::request::Parts, body: Bytes) -> http::Request<Body> {
    let mut request = http::Request::new(Body::new(http_body_util::Full::new(body)));
    *request.method_mut() = parts.method.clone();
    *request.uri_mut() = parts.uri.clone();
    *request.version_mut() = parts.version;
    *request.headers_mut() = parts.headers.clone();
    request
}
