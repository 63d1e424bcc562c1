//! The gRPC services and the one interceptor that establishes who calls.

pub mod agent_link;
mod job_io;
pub mod job_wire;
pub mod open_leader;
pub mod pool;
pub mod sessions;

use gpool_proto::pb;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// What one `JobLogs` stream carries. Boxed: a channel keeps room for 32
/// of its messages from the start, and a `Status` is large (5 KB a reader).
type LogItem = Box<Result<pb::LogChunk, Status>>;
/// The sending end of one `JobLogs` stream.
type LogSender = mpsc::Sender<LogItem>;

/// Chunks (up to 16 KiB each, as agents read them: 4 MiB in all; an agent
/// older than gpoold may still send 64 KiB ones) a log reader may fall
/// behind.
const LOG_BUFFER: usize = 256;

/// Routes LogData from agents to the `JobLogs` streams that asked for it.
/// Each request is bound to the node it was sent to: no other agent can
/// write into it.
#[derive(Clone, Default)]
pub struct LogRelay {
    next_request_id: Arc<AtomicU64>,
    streams: Arc<Mutex<HashMap<u64, (String, LogSender)>>>,
}

impl LogRelay {
    /// A new request id for a read from `node`, and the receiving end of
    /// its stream.
    pub fn open(&self, node: &str) -> (u64, mpsc::Receiver<LogItem>) {
        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (sender, receiver) = mpsc::channel(LOG_BUFFER);
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(request_id, (node.to_string(), sender));
        (request_id, receiver)
    }

    /// Passes one LogData from `node` on; ends the stream at eof, an error,
    /// or when the client went away. Data for a request sent to another
    /// node is dropped. Never waits: a reader that falls more than the
    /// stream's buffer behind is told so and dropped, so no reader can slow
    /// the agent's link (its heartbeats and job events). Returns true when
    /// the reader is gone before the end of the output, so the agent
    /// should stop sending it.
    pub fn deliver(&self, node: &str, data: pb::LogData) -> bool {
        let sender = match self
            .streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&data.request_id)
        {
            Some((asked, sender)) if asked == node => sender.clone(),
            Some((asked, _)) => {
                tracing::warn!(node, asked = %asked, request = data.request_id, "log data for a request sent to another node dropped");
                return false;
            }
            // Closed earlier; the agent was told to stop.
            None => return false,
        };
        let ends_itself = data.eof || !data.error.is_empty();
        let mut dropped = false;
        // One slot stays free for the message that ends the stream.
        if !data.data.is_empty() {
            if sender.capacity() > 1 {
                dropped = sender.try_send(Box::new(Ok(pb::LogChunk { data: data.data }))).is_err();
            } else {
                let _ = sender.try_send(Box::new(Err(Status::resource_exhausted(format!(
                    "this reader fell more than {LOG_BUFFER} chunks behind the output of node {node} and was dropped; read again (e.g. without a pager)"
                )))));
                dropped = true;
            }
        }
        if !data.error.is_empty() && !dropped {
            let _ = sender.try_send(Box::new(Err(Status::failed_precondition(data.error))));
        }
        let done = dropped || ends_itself;
        if done {
            self.close(data.request_id);
        }
        dropped && !ends_itself
    }

    pub fn close(&self, request_id: u64) {
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&request_id);
    }
}

use crate::error::Error;
use crate::security::loopback::PlainTcpInfo;
use crate::security::{AuditEntry, Security};
use crate::state::SharedState;
use gpool_core::auth::token::{self, Credential};
use gpool_core::auth::{admit_agent_link, AgentCredential, Caller};
use gpool_proto::USER_METADATA_KEY;
use tonic::transport::server::{TcpConnectInfo, TlsConnectInfo, UdsConnectInfo};
use tonic::{Request, Status};

/// The authenticated caller, put into each request's extensions.
#[derive(Debug, Clone)]
pub struct Identity {
    pub caller: Caller,
    /// How it was established: "unix socket", "token 3", "job token",
    /// "dev mode".
    pub via: String,
    pub peer: String,
}

/// Who an agent's link speaks for, put into its request's extensions.
#[derive(Debug, Clone)]
pub struct AgentIdentity {
    /// The node name of its client certificate; `None` on a plaintext
    /// link (dev mode, insecure_plaintext).
    pub cert_node: Option<String>,
    pub cert_serial: Option<String>,
    pub peer: String,
}

/// The peer's TCP address, over TLS or plaintext.
pub fn remote_addr<T>(request: &Request<T>) -> Option<std::net::SocketAddr> {
    request
        .remote_addr()
        .or_else(|| request.extensions().get::<PlainTcpInfo>().map(|info| info.remote))
}

/// The peer of a request as text: a TCP address, or "unix socket".
pub fn peer_of<T>(request: &Request<T>) -> String {
    match remote_addr(request) {
        Some(addr) => addr.to_string(),
        None if request.extensions().get::<UdsConnectInfo>().is_some() => "unix socket".into(),
        None => "unknown".into(),
    }
}

/// The uid on this host behind a request: the Unix socket's peer
/// credentials, or the owner of a loopback TCP client's socket.
fn local_uid<T>(request: &Request<T>) -> Option<(u32, &'static str)> {
    if let Some(info) = request.extensions().get::<UdsConnectInfo>() {
        return info.peer_cred.map(|cred| (cred.uid(), "unix socket"));
    }
    request
        .extensions()
        .get::<PlainTcpInfo>()
        .and_then(|info| info.local_uid)
        .map(|uid| (uid, "loopback uid"))
}

/// Establishes the caller of every Pool request: the peer credentials on
/// the Unix socket, else a user or job token in `authorization: Bearer`,
/// else (dev mode only) the `x-gpool-user` name. A refusal is audited.
pub fn authenticate(
    security: Arc<Security>,
    shared: SharedState,
) -> impl Fn(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |mut request: Request<()>| {
        let peer = peer_of(&request);
        match identify(&security, &shared, &request) {
            Ok((caller, via)) => {
                request.extensions_mut().insert(Identity { caller, via, peer });
                Ok(request)
            }
            Err(reason) => {
                security.audit(&AuditEntry {
                    at: crate::security::now_text(),
                    caller: "",
                    via: "",
                    peer: &peer,
                    action: "authenticate",
                    object: "",
                    outcome: format!("refused: {reason}"),
                });
                Err(Error::Unauthenticated(reason).into())
            }
        }
    }
}

fn identify(security: &Security, shared: &SharedState, request: &Request<()>) -> Result<(Caller, String), String> {
    if let Some((uid, via)) = local_uid(request) {
        return local_user(shared, uid, via);
    }
    if request.extensions().get::<UdsConnectInfo>().is_some() {
        return Err("the Unix socket gave no peer credentials".into());
    }
    if let Some(value) = request.metadata().get("authorization") {
        let text = value
            .to_str()
            .map_err(|_| "the authorization entry is not ASCII".to_string())?;
        let presented = text
            .strip_prefix("Bearer ")
            .ok_or("the authorization entry is not `Bearer TOKEN`")?;
        return token_user(security, shared, presented);
    }
    if security.dev {
        let user = request
            .metadata()
            .get(USER_METADATA_KEY)
            .ok_or_else(|| format!("no {USER_METADATA_KEY} metadata"))?
            .to_str()
            .map_err(|_| format!("{USER_METADATA_KEY} is not ASCII"))?
            .to_string();
        if !gpool_core::auth::is_user_name(&user) {
            return Err(format!("{user:?} is not a user name"));
        }
        let state = shared.read().unwrap_or_else(|p| p.into_inner());
        return Ok((state.local_caller(&user), "dev mode".into()));
    }
    Err("no credential: set GPOOL_TOKEN (or ~/.config/gpool/token) to a token from `gpool admin token create`, or use the Unix socket on the controller host".into())
}

/// The caller behind a local uid (a Unix socket's peer, a loopback
/// socket's owner); `via` says which.
pub fn local_user(shared: &SharedState, uid: u32, via: &str) -> Result<(Caller, String), String> {
    let uid = nix::unistd::Uid::from_raw(uid);
    let user = match nix::unistd::User::from_uid(uid) {
        Ok(Some(user)) => user.name,
        _ => return Err(format!("uid {uid} has no user name on the controller host")),
    };
    let state = shared.read().unwrap_or_else(|p| p.into_inner());
    Ok((state.local_caller(&user), via.into()))
}

/// The caller a presented user or job token stands for.
pub fn token_user(security: &Security, shared: &SharedState, presented: &str) -> Result<(Caller, String), String> {
    let credential = token::parse(presented).map_err(|err| err.to_string())?;
    let state = shared.read().unwrap_or_else(|p| p.into_inner());
    state
        .token_caller(&security.token_key, &credential, crate::wall_clock())
        .map(|caller| {
            let via = match credential {
                Credential::User { id, .. } => format!("token {id}"),
                Credential::Job { job, .. } => format!("job token of job {job}"),
            };
            (caller, via)
        })
        .map_err(|err| err.to_string())
}

/// Admits agents by `gpool_core::auth::admit_agent_link`: on TLS by their
/// client certificate (whose node name is checked against the Register
/// later), in plaintext by where they come from. A refusal is audited.
pub fn authenticate_agent(security: Arc<Security>) -> impl Fn(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |mut request: Request<()>| {
        let peer = peer_of(&request);
        let refuse = |reason: String| -> Status {
            tracing::warn!(%peer, "agent refused: {reason}");
            security.audit(&AuditEntry {
                at: crate::security::now_text(),
                caller: "",
                via: "agent link",
                peer: &peer,
                action: "agent connect",
                object: "",
                outcome: format!("refused: {reason}"),
            });
            Error::Unauthenticated(reason).into()
        };
        let tls = request.extensions().get::<TlsConnectInfo<TcpConnectInfo>>().cloned();
        let cert = match tls
            .as_ref()
            .and_then(|tls| tls.peer_certs())
            .and_then(|c| c.first().cloned())
        {
            Some(der) => Some(crate::security::tls::cert_identity(&der).map_err(&refuse)?),
            None => None,
        };
        let credential = match (&tls, &cert) {
            (Some(_), Some(cert)) => AgentCredential::Certificate {
                node: &cert.common_name,
                revoked: security.is_revoked(&cert.serial),
            },
            (Some(_), None) => AgentCredential::NoCertificate,
            (None, _) => AgentCredential::Plaintext {
                local_uid: local_uid(&request).map(|(uid, _)| uid),
                controller_uid: nix::unistd::geteuid().as_raw(),
                insecure_allowed: security.insecure_plaintext,
            },
        };
        admit_agent_link(&credential).map_err(&refuse)?;
        let identity = AgentIdentity {
            cert_node: cert.as_ref().map(|cert| cert.common_name.clone()),
            cert_serial: cert.map(|cert| cert.serial),
            peer: peer.clone(),
        };
        request.extensions_mut().insert(identity);
        Ok(request)
    }
}

/// The identity `authenticate` established.
pub fn identity<T>(request: &Request<T>) -> Result<Identity, Status> {
    request
        .extensions()
        .get::<Identity>()
        .cloned()
        .ok_or_else(|| Error::Unauthenticated("request did not pass authentication".into()).into())
}

/// The caller `authenticate` established.
pub fn caller<T>(request: &Request<T>) -> Result<Caller, Status> {
    identity(request).map(|identity| identity.caller)
}

/// A request whose message cannot be decoded is the caller's mistake:
/// INVALID_ARGUMENT, not the INTERNAL that tonic's decoder answers (which
/// reads as gpoold's own fault, and which clients may retry). The refusal
/// comes before any handler runs, so it is in the response's headers.
pub fn undecodable_is_invalid<B>(mut response: tonic::codegen::http::Response<B>) -> tonic::codegen::http::Response<B> {
    const INTERNAL: &str = "13";
    let headers = response.headers_mut();
    let undecodable = headers.get("grpc-status").is_some_and(|status| status == INTERNAL)
        && headers
            .get("grpc-message")
            .and_then(|message| message.to_str().ok())
            .is_some_and(|message| {
                message.starts_with("failed%20to%20decode") || message.starts_with("failed to decode")
            });
    if undecodable {
        headers.insert(
            "grpc-status",
            tonic::codegen::http::HeaderValue::from(tonic::Code::InvalidArgument as i32),
        );
    }
    response
}

#[cfg(test)]
mod decode_tests {
    use tonic::codegen::http::Response;

    #[test]
    fn only_undecodable_requests_become_invalid_argument() {
        let refusal = |status: &str, message: &str| {
            let mut response = Response::new(());
            response.headers_mut().insert("grpc-status", status.parse().unwrap());
            response.headers_mut().insert("grpc-message", message.parse().unwrap());
            super::undecodable_is_invalid(response).headers()["grpc-status"].clone()
        };
        assert_eq!(refusal("13", "failed%20to%20decode%20Protobuf%20message"), "3");
        assert_eq!(refusal("13", "the store failed"), "13");
        assert_eq!(refusal("7", "failed%20to%20decode"), "7");
    }
}
