//! Finding gpoold, connecting to it, and saying who calls.

use crate::CliError;
use gpool_proto::pb::pool_client::PoolClient;
use gpool_proto::USER_METADATA_KEY;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};

pub type Interceptor = Box<dyn FnMut(Request<()>) -> Result<Request<()>, Status> + Send>;
pub type Client = PoolClient<InterceptedService<Channel, Interceptor>>;

/// `--server` / `GPOOL_SERVER`, else the address a dev controller recorded.
pub fn resolve_address(flag: Option<String>) -> Result<String, CliError> {
    if let Some(addr) = flag.filter(|a| !a.trim().is_empty()) {
        return Ok(addr.trim().to_string());
    }
    let pointer = gpool_proto::dev_address_file();
    match std::fs::read_to_string(&pointer) {
        Ok(text) if !text.trim().is_empty() => Ok(text.trim().to_string()),
        _ => Err(CliError::Usage(format!(
            "no controller address: give --server HOST:PORT or set GPOOL_SERVER (no dev controller recorded one in {})",
            pointer.display()
        ))),
    }
}

/// The Unix user name of this process.
pub fn current_user() -> Result<String, CliError> {
    let uid = nix::unistd::getuid();
    match nix::unistd::User::from_uid(uid) {
        Ok(Some(user)) => Ok(user.name),
        _ => std::env::var("USER")
            .ok()
            .filter(|name| !name.is_empty())
            .ok_or_else(|| CliError::Usage(format!("cannot find the user name of uid {uid}"))),
    }
}

pub async fn connect(addr: &str) -> Result<Client, CliError> {
    let unreachable = |reason: String| CliError::Unreachable {
        addr: addr.to_string(),
        reason,
    };
    let uri = if addr.contains("://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    };
    let endpoint = Endpoint::from_shared(uri).map_err(|err| unreachable(format!("not an address: {err}")))?;
    let channel = endpoint
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|err| unreachable(error_chain(&err)))?;
    let user = current_user()?;
    let user_value: MetadataValue<_> = user
        .parse()
        .map_err(|_| CliError::Usage(format!("user name {user:?} cannot be sent")))?;
    let interceptor: Interceptor = Box::new(move |mut request: Request<()>| {
        request.metadata_mut().insert(USER_METADATA_KEY, user_value.clone());
        Ok(request)
    });
    Ok(PoolClient::with_interceptor(channel, interceptor).max_decoding_message_size(1024 * 1024 * 1024))
}

/// "transport error: tcp connect error: Connection refused" in one line.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}
