//! The gRPC services and the one interceptor that establishes who calls.

pub mod agent_link;
pub mod pool;

use gpool_proto::pb;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

/// The sending end of one `JobLogs` stream.
type LogSender = mpsc::Sender<Result<pb::LogChunk, Status>>;

/// Routes LogData from agents to the `JobLogs` streams that asked for it.
#[derive(Clone, Default)]
pub struct LogRelay {
    next_request_id: Arc<AtomicU64>,
    streams: Arc<Mutex<HashMap<u64, LogSender>>>,
}

impl LogRelay {
    /// A new request id and the receiving end of its stream.
    pub fn open(&self) -> (u64, mpsc::Receiver<Result<pb::LogChunk, Status>>) {
        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed) + 1;
        let (sender, receiver) = mpsc::channel(16);
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(request_id, sender);
        (request_id, receiver)
    }

    /// Passes one LogData on; ends the stream at eof, an error, or when the
    /// client went away.
    pub async fn deliver(&self, data: pb::LogData) {
        let sender = self
            .streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&data.request_id)
            .cloned();
        let Some(sender) = sender else { return };
        let mut done = data.eof;
        if !data.data.is_empty() && sender.send(Ok(pb::LogChunk { data: data.data })).await.is_err() {
            done = true;
        }
        if !data.error.is_empty() {
            let _ = sender.send(Err(Status::failed_precondition(data.error))).await;
            done = true;
        }
        if done {
            self.close(data.request_id);
        }
    }

    pub fn close(&self, request_id: u64) {
        self.streams
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&request_id);
    }
}

use crate::error::Error;
use gpool_proto::USER_METADATA_KEY;
use tonic::{Request, Status};

/// The authenticated caller, put into each request's extensions.
#[derive(Debug, Clone)]
pub struct Identity {
    pub user: String,
}

/// Resolves the caller of every Pool request. For now the user name comes
/// from the `x-gpool-user` entry, trusted in dev mode and from loopback
/// peers; token and certificate authentication replace this one function.
pub fn authenticate(dev: bool) -> impl Fn(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |mut request: Request<()>| {
        let from_loopback = request.remote_addr().is_some_and(|addr| addr.ip().is_loopback());
        if !dev && !from_loopback {
            return Err(Error::Unauthenticated(
                "remote callers need TLS authentication, which is not configured".into(),
            )
            .into());
        }
        let user = request
            .metadata()
            .get(USER_METADATA_KEY)
            .ok_or_else(|| Error::Unauthenticated(format!("no {USER_METADATA_KEY} metadata")))?
            .to_str()
            .map_err(|_| Error::Unauthenticated(format!("{USER_METADATA_KEY} is not ASCII")))?
            .to_string();
        let valid = !user.is_empty()
            && user.len() <= 64
            && user
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !valid {
            return Err(Error::Unauthenticated(format!("{user:?} is not a user name")).into());
        }
        request.extensions_mut().insert(Identity { user });
        Ok(request)
    }
}

/// Admits agents: in dev mode any, otherwise loopback peers only, until
/// agents present client certificates.
pub fn authenticate_agent(dev: bool) -> impl Fn(Request<()>) -> Result<Request<()>, Status> + Clone {
    move |request: Request<()>| {
        let from_loopback = request.remote_addr().is_some_and(|addr| addr.ip().is_loopback());
        if dev || from_loopback {
            Ok(request)
        } else {
            Err(
                Error::Unauthenticated("remote agents need TLS client certificates, which are not configured".into())
                    .into(),
            )
        }
    }
}

/// The caller `authenticate` established.
pub fn caller<T>(request: &Request<T>) -> Result<String, Status> {
    request
        .extensions()
        .get::<Identity>()
        .map(|identity| identity.user.clone())
        .ok_or_else(|| Error::Unauthenticated("request did not pass authentication".into()).into())
}
