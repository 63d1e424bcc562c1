//! The gRPC services and the one interceptor that establishes who calls.

pub mod agent_link;
pub mod pool;

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
