//! `CliError`: everything that ends a `gpool` run early, and its exit code.

use gpool_proto::dial::{DialError, STANDBY_METADATA};

/// Everything that ends a `gpool` run early, mapped to an exit code once.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error("cannot reach gpoold at {addr}: {reason}")]
    Unreachable { addr: String, reason: String },
    #[error("{0}")]
    Refused(String),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Refused(_) => 1,
            CliError::Usage(_) => 2,
            CliError::Unreachable { .. } => 69,
        }
    }

    /// A gRPC error from the controller at `addr`.
    pub fn from_status(addr: &str, status: tonic::Status) -> CliError {
        // The call went nowhere: standbys sent it on where it may not go,
        // or no controller serves.
        let dialled = std::error::Error::source(&status).and_then(|source| source.downcast_ref::<DialError>());
        if let Some(err) = dialled {
            return crate::client::dial_refused(addr, err.clone());
        }
        if status.metadata().contains_key(STANDBY_METADATA) {
            return CliError::Unreachable {
                addr: addr.to_string(),
                reason: status.message().to_string(),
            };
        }
        let message = status.message();
        if status.code() == tonic::Code::Cancelled && message.contains("Timeout expired") {
            return CliError::Unreachable {
                addr: addr.to_string(),
                reason: "no answer within the timeout (--timeout, GPOOL_TIMEOUT)".into(),
            };
        }
        // The connection was made, then the call broke: what answers there
        // closed it, or does not speak gRPC over HTTP/2.
        let broken = "the connection broke before an answer: is the address gpoold's (gRPC over HTTP/2), and does it accept you?";
        let broke = message.contains("protocol error")
            || message.contains("frame with invalid size")
            || (matches!(status.code(), tonic::Code::Unavailable | tonic::Code::Unknown)
                && message.contains("transport")
                && !message.contains("tcp connect"));
        if broke {
            // A TLS server answers plain HTTP/2 with a TLS alert, which
            // HTTP/2 reads as a broken frame: said as what it is.
            let reason = crate::client::tls_hint(addr).unwrap_or_else(|| format!("{broken} ({message})"));
            return CliError::Unreachable {
                addr: addr.to_string(),
                reason,
            };
        }
        match status.code() {
            tonic::Code::Unavailable | tonic::Code::Unknown if message.contains("tcp connect") => {
                CliError::Unreachable {
                    addr: addr.to_string(),
                    reason: message.to_string(),
                }
            }
            tonic::Code::Unavailable | tonic::Code::Unknown if message.contains("transport") => CliError::Unreachable {
                addr: addr.to_string(),
                reason: format!("{broken} ({message})"),
            },
            tonic::Code::Unavailable | tonic::Code::Cancelled => CliError::Unreachable {
                addr: addr.to_string(),
                reason: format!("{broken} ({message})"),
            },
            tonic::Code::InvalidArgument | tonic::Code::FailedPrecondition => {
                CliError::Usage(format!("refused: {}", status.message()))
            }
            _ => CliError::Refused(status.message().to_string()),
        }
    }
}
