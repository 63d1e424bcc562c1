//! `Leader` is answered before authentication: the CLI and agents ask it
//! the moment they connect, before any credential is presented, and the
//! answer says no more than that this controller serves (a standby's
//! listener says the same to everyone: where the leader is).

use gpool_proto::pb;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use tonic::body::Body;

/// The path of the `Leader` call.
const LEADER_PATH: &str = "/gpool.v1.Pool/Leader";

/// The Pool service behind its authentication (`authenticated`), with
/// `Leader` sent to the same service without it (`open`).
#[derive(Clone)]
pub struct OpenLeader<A> {
    pub authenticated: A,
    pub open: pb::pool_server::PoolServer<super::pool::PoolService>,
}

impl<A> tonic::server::NamedService for OpenLeader<A> {
    const NAME: &'static str = pb::pool_server::SERVICE_NAME;
}

type Answer = hyper::Response<Body>;

impl<A, B> tower::Service<hyper::Request<Body>> for OpenLeader<A>
where
    A: tower::Service<hyper::Request<Body>, Response = hyper::Response<B>, Error = Infallible> + Clone + Send + 'static,
    A::Future: Send + 'static,
    B: hyper::body::Body<Data = hyper::body::Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Response = Answer;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Answer, Infallible>> + Send>>;

    // Both services are always ready (tonic's generated servers are).
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: hyper::Request<Body>) -> Self::Future {
        if request.uri().path() == LEADER_PATH {
            Box::pin(self.open.call(request))
        } else {
            let answered = self.authenticated.call(request);
            Box::pin(async move { answered.await.map(|answer| answer.map(Body::new)) })
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_path_is_the_generated_services() {
        assert_eq!(
            super::LEADER_PATH,
            format!("/{}/Leader", gpool_proto::pb::pool_server::SERVICE_NAME)
        );
    }
}
