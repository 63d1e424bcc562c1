//! Dialling gpoold, the same way for the CLI and the agent: `unix:PATH`
//! (the local socket), `https://HOST:PORT` or `HOST:PORT` with a CA (TLS),
//! `http://HOST:PORT` or `HOST:PORT` without one (plaintext).

use std::path::PathBuf;
use std::time::Duration;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// Where gpoold is, as given by `--server`, `GPOOL_SERVER` or agent.toml.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    Unix(PathBuf),
    Tcp { host_port: String, tls: Option<bool> },
}

impl Address {
    pub fn parse(text: &str) -> Result<Address, String> {
        let text = text.trim();
        let (tls, host_port) = if let Some(path) = text.strip_prefix("unix:") {
            if path.is_empty() {
                return Err("unix: needs the socket's path, e.g. unix:/var/lib/gpool/gpoold.sock".into());
            }
            return Ok(Address::Unix(PathBuf::from(path)));
        } else if let Some(rest) = text.strip_prefix("https://") {
            (Some(true), rest)
        } else if let Some(rest) = text.strip_prefix("http://") {
            (Some(false), rest)
        } else if text.contains("://") {
            return Err(format!("{text:?}: the scheme must be https://, http:// or unix:"));
        } else {
            (None, text)
        };
        let host_port = host_port.trim_end_matches('/');
        match host_port.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(Address::Tcp {
                host_port: host_port.to_string(),
                tls,
            }),
            _ => Err(format!("{text:?} is not HOST:PORT")),
        }
    }
}

/// One address, or several separated by commas: the controllers of a pool
/// run with `[ha]`, tried in turn (a standby names the leader).
pub fn parse_list(text: &str) -> Result<Vec<Address>, String> {
    let addresses = text
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(Address::parse)
        .collect::<Result<Vec<_>, _>>()?;
    if addresses.is_empty() {
        return Err(format!("{text:?} names no address"));
    }
    Ok(addresses)
}

/// The metadata in which a standby names the leader's address.
pub const LEADER_METADATA: &str = "gpool-leader";

/// How many standbys' redirects one connection follows.
const MAX_REDIRECTS: usize = 3;

/// Why no connection was made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DialError {
    /// No address answered, or none named a leader that did: why, for each.
    Unreachable(String),
    /// A standby named a leader that the caller's bearer token may not go
    /// to in clear text (`TokenRule`): it was not dialled.
    ClearTextRedirect { standby: String, leader: String },
}

impl std::error::Error for DialError {}

impl std::fmt::Display for DialError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DialError::Unreachable(reason) => f.write_str(reason),
            DialError::ClearTextRedirect { standby, leader } => write!(
                f,
                "{standby} is a standby and names the leader at {leader}, where a token would go in clear text"
            ),
        }
    }
}

/// Where a caller's bearer token may go in clear text: over loopback,
/// which never leaves the host, and to the addresses the caller itself
/// wrote with `http://` (it means it). The same holds for the leader a
/// standby names, so a redirect never carries a token off the host in
/// clear text that the caller would not have sent there itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRule {
    /// `HOST:PORT` of each address named with `http://`.
    insisted: Vec<String>,
}

impl TokenRule {
    /// The rule for a caller that named `addresses`.
    pub fn for_addresses(addresses: &[Address]) -> TokenRule {
        let insisted = addresses
            .iter()
            .filter_map(|address| match address {
                Address::Tcp {
                    host_port,
                    tls: Some(false),
                } => Some(host_port.clone()),
                _ => None,
            })
            .collect();
        TokenRule { insisted }
    }

    /// Whether the token may go to `address`, dialled as `tls` makes it
    /// (TLS for `https://`, and for a bare `HOST:PORT` with a CA).
    pub fn allows(&self, address: &Address, tls: &ClientTls) -> bool {
        let Address::Tcp { host_port, tls: wanted } = address else {
            return true;
        };
        let encrypted = wanted.unwrap_or(tls.ca_pem.is_some());
        encrypted || is_loopback(host_port) || self.insisted.contains(host_port)
    }
}

/// Whether `host_port` names this host over loopback: `localhost`, an
/// address in 127.0.0.0/8, or `::1` (`[::1]:PORT`).
pub fn is_loopback(host_port: &str) -> bool {
    host_port
        .rsplit_once(':')
        .map(|(host, _)| host.trim_start_matches('[').trim_end_matches(']'))
        .is_some_and(|host| host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback()))
}

/// Connects to the first of `addresses` that answers, in order, and on to
/// the leader where a standby answers: the channel, and the address it
/// reached (the leader's, after a redirect). Each connection gets
/// `deadlines.connect`. For a caller that sends nothing secret on its
/// calls (an agent: its certificate only ever goes over TLS).
pub async fn connect_first(
    addresses: &[Address],
    tls: &ClientTls,
    deadlines: Deadlines,
) -> Result<(Channel, Address), DialError> {
    connect_first_as(addresses, tls, deadlines, None).await
}

/// `connect_first` for a caller that sends a bearer token on its calls:
/// a standby's redirect is followed only where `rule` allows the token to
/// go.
pub async fn connect_first_with_token(
    addresses: &[Address],
    tls: &ClientTls,
    deadlines: Deadlines,
    rule: &TokenRule,
) -> Result<(Channel, Address), DialError> {
    connect_first_as(addresses, tls, deadlines, Some(rule)).await
}

async fn connect_first_as(
    addresses: &[Address],
    tls: &ClientTls,
    deadlines: Deadlines,
    token: Option<&TokenRule>,
) -> Result<(Channel, Address), DialError> {
    let mut failures = Vec::new();
    let mut refused = None;
    for address in addresses {
        match connect_leader(address, tls, deadlines, token).await {
            Ok(reached) => return Ok(reached),
            Err(err) if addresses.len() == 1 => return Err(err),
            Err(DialError::Unreachable(err)) => failures.push(format!("{}: {err}", address.text())),
            // The next address may reach the leader another way; if none
            // does, the refusal is what the caller can act on.
            Err(err) => refused = refused.or(Some(err)),
        }
    }
    Err(refused.unwrap_or_else(|| DialError::Unreachable(failures.join("; "))))
}

/// Connects to `address`, then asks whether it serves (`Leader`): a
/// standby answers with the leader's address, which is dialled in turn
/// (with the TLS choice `address` made, and where `token` allows). The
/// local socket is only ever the leader's, and is not asked.
async fn connect_leader(
    address: &Address,
    tls: &ClientTls,
    deadlines: Deadlines,
    token: Option<&TokenRule>,
) -> Result<(Channel, Address), DialError> {
    let mut address = address.clone();
    let mut followed = Vec::new();
    loop {
        let channel = match (connect(&address, tls, deadlines).await, followed.last()) {
            (Ok(channel), _) => channel,
            (Err(err), None) => return Err(DialError::Unreachable(err)),
            (Err(err), Some(standby)) => {
                return Err(DialError::Unreachable(format!(
                    "{standby} is a standby; the leader it names, {}: {err}",
                    address.text()
                )))
            }
        };
        if matches!(address, Address::Unix(_)) {
            return Ok((channel, address));
        }
        let status = match crate::pb::pool_client::PoolClient::new(channel.clone())
            .leader(crate::pb::LeaderRequest {})
            .await
        {
            Ok(_) => return Ok((channel, address)),
            Err(status) => status,
        };
        let leader = status
            .metadata()
            .get(LEADER_METADATA)
            .and_then(|value| value.to_str().ok());
        let (tonic::Code::Unavailable, Some(leader)) = (status.code(), leader) else {
            return match status.code() {
                // A standby with no leader elected, or a connection that
                // broke: the next address is tried.
                tonic::Code::Unavailable => Err(DialError::Unreachable(status.message().to_string())),
                // A controller from before `Leader`, or one that wants
                // credentials first: it serves.
                _ => Ok((channel, address)),
            };
        };
        let next = follow(&address, leader, tls, token)?;
        followed.push(address.text());
        if followed.len() > MAX_REDIRECTS || followed.contains(&next.text()) {
            return Err(DialError::Unreachable(format!(
                "standbys sent the call on too often or round in a circle: {} then {}",
                followed.join(", "),
                next.text()
            )));
        }
        address = next;
    }
}

/// Where the standby at `standby` sends the caller, which names `leader`:
/// the leader's address as `redirected` makes it, if the caller's token
/// (where it has one) may go there.
fn follow(standby: &Address, leader: &str, tls: &ClientTls, token: Option<&TokenRule>) -> Result<Address, DialError> {
    let next = redirected(standby, leader).map_err(DialError::Unreachable)?;
    match (token, &next) {
        (Some(rule), Address::Tcp { host_port, .. }) if !rule.allows(&next, tls) => Err(DialError::ClearTextRedirect {
            standby: standby.text(),
            leader: host_port.clone(),
        }),
        _ => Ok(next),
    }
}

/// The leader's address a standby named, reached as `from` was (TLS or
/// not, whatever scheme it names): a redirect never lowers the transport
/// a caller chose, so a token meant for TLS is never sent in clear text,
/// and it names a host and port, never a local socket.
fn redirected(from: &Address, leader: &str) -> Result<Address, String> {
    let named = |err: String| format!("{} names the leader at {err}", from.text());
    match (Address::parse(leader).map_err(named)?, from) {
        (Address::Tcp { host_port, .. }, Address::Tcp { tls, .. }) => Ok(Address::Tcp { host_port, tls: *tls }),
        _ => Err(named(format!("{leader:?}, which is not HOST:PORT"))),
    }
}

impl Address {
    /// As written for people.
    pub fn text(&self) -> String {
        match self {
            Address::Unix(path) => format!("unix:{}", path.display()),
            Address::Tcp {
                host_port,
                tls: Some(true),
            } => format!("https://{host_port}"),
            Address::Tcp {
                host_port,
                tls: Some(false),
            } => format!("http://{host_port}"),
            Address::Tcp { host_port, tls: None } => host_port.clone(),
        }
    }
}

/// What TLS needs on the client side: the cluster CA, and for agents their
/// certificate and key (PEM text).
#[derive(Clone, Default)]
pub struct ClientTls {
    pub ca_pem: Option<String>,
    pub identity_pem: Option<(String, String)>,
}

/// How long to wait: for a connection (TCP, TLS and HTTP/2 handshakes),
/// and for the answer to each call (its response headers; a stream's later
/// messages are not bounded). `None`: no limit.
#[derive(Clone, Copy, Debug)]
pub struct Deadlines {
    pub connect: Duration,
    pub request: Option<Duration>,
}

impl Default for Deadlines {
    fn default() -> Deadlines {
        Deadlines {
            connect: Duration::from_secs(10),
            request: Some(Duration::from_secs(30)),
        }
    }
}

/// Connects to `address` within `deadlines.connect`. TLS is used for
/// `https://`, and for a bare `HOST:PORT` when a CA is given. HTTP/2
/// keepalive pings find a peer that went away without closing.
pub async fn connect(address: &Address, tls: &ClientTls, deadlines: Deadlines) -> Result<Channel, String> {
    let connecting = connect_endpoint(address, tls, deadlines);
    match tokio::time::timeout(deadlines.connect, connecting).await {
        Ok(connected) => connected,
        Err(_) => Err(format!(
            "no connection within {}s (is gpoold listening there, and answering?)",
            deadlines.connect.as_secs_f64()
        )),
    }
}

fn with_deadlines(endpoint: Endpoint, deadlines: Deadlines) -> Endpoint {
    let endpoint = endpoint
        .connect_timeout(deadlines.connect)
        .http2_keep_alive_interval(Duration::from_secs(15))
        .keep_alive_timeout(Duration::from_secs(20));
    match deadlines.request {
        Some(limit) => endpoint.timeout(limit),
        None => endpoint,
    }
}

async fn connect_endpoint(address: &Address, tls: &ClientTls, deadlines: Deadlines) -> Result<Channel, String> {
    match address {
        Address::Unix(path) => {
            let path = path.clone();
            // The URI is required but unused: the connector dials the socket.
            with_deadlines(Endpoint::from_static("http://localhost:0"), deadlines)
                .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                    let path = path.clone();
                    async move {
                        let stream = tokio::net::UnixStream::connect(&path).await?;
                        Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                    }
                }))
                .await
                .map_err(|err| error_chain(&err))
        }
        Address::Tcp { host_port, tls: wanted } => {
            let use_tls = wanted.unwrap_or(tls.ca_pem.is_some());
            let scheme = if use_tls { "https" } else { "http" };
            let endpoint = Endpoint::from_shared(format!("{scheme}://{host_port}"))
                .map_err(|err| format!("{host_port:?} is not an address: {err}"))?
                .tcp_nodelay(true);
            let mut endpoint = with_deadlines(endpoint, deadlines);
            if use_tls {
                let ca = tls.ca_pem.as_ref().ok_or(
                    "TLS needs the cluster CA certificate (GPOOL_CA, ~/.config/gpool/ca.pem, or ca in agent.toml)",
                )?;
                let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
                if let Some((cert, key)) = &tls.identity_pem {
                    config = config.identity(Identity::from_pem(cert, key));
                }
                endpoint = endpoint.tls_config(config).map_err(|err| error_chain(&err))?;
            }
            endpoint.connect().await.map_err(|err| error_chain(&err))
        }
    }
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

mod following;
pub use following::{connect_following, Following, STANDBY_METADATA};

#[cfg(test)]
mod tests;
