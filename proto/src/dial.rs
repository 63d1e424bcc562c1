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

/// Connects to the first of `addresses` that answers, in order, and on to
/// the leader where a standby answers: the channel, and the address it
/// reached (the leader's, after a redirect). Each connection gets
/// `deadlines.connect`.
pub async fn connect_first(
    addresses: &[Address],
    tls: &ClientTls,
    deadlines: Deadlines,
) -> Result<(Channel, Address), String> {
    let mut failures = Vec::new();
    for address in addresses {
        match connect_leader(address, tls, deadlines).await {
            Ok(reached) => return Ok(reached),
            Err(err) if addresses.len() == 1 => return Err(err),
            Err(err) => failures.push(format!("{}: {err}", address.text())),
        }
    }
    Err(failures.join("; "))
}

/// Connects to `address`, then asks whether it serves (`Leader`): a
/// standby answers with the leader's address, which is dialled in turn
/// (with the TLS choice `address` made). The local socket is only ever
/// the leader's, and is not asked.
async fn connect_leader(
    address: &Address,
    tls: &ClientTls,
    deadlines: Deadlines,
) -> Result<(Channel, Address), String> {
    let mut address = address.clone();
    let mut followed = Vec::new();
    loop {
        let channel = match (connect(&address, tls, deadlines).await, followed.last()) {
            (Ok(channel), _) => channel,
            (Err(err), None) => return Err(err),
            (Err(err), Some(standby)) => {
                return Err(format!(
                    "{standby} is a standby; the leader it names, {}: {err}",
                    address.text()
                ))
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
                tonic::Code::Unavailable => Err(status.message().to_string()),
                // A controller from before `Leader`, or one that wants
                // credentials first: it serves.
                _ => Ok((channel, address)),
            };
        };
        let next = redirected(&address, leader)?;
        followed.push(address.text());
        if followed.len() > MAX_REDIRECTS || followed.contains(&next.text()) {
            return Err(format!(
                "standbys sent the call on too often or round in a circle: {} then {}",
                followed.join(", "),
                next.text()
            ));
        }
        address = next;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_name_their_transport() {
        assert_eq!(
            Address::parse("unix:/run/g.sock"),
            Ok(Address::Unix("/run/g.sock".into()))
        );
        assert_eq!(
            Address::parse("https://ctl.example:7070"),
            Ok(Address::Tcp {
                host_port: "ctl.example:7070".into(),
                tls: Some(true)
            })
        );
        assert_eq!(
            Address::parse("10.0.0.1:7070"),
            Ok(Address::Tcp {
                host_port: "10.0.0.1:7070".into(),
                tls: None
            })
        );
        assert!(Address::parse("ftp://x:1").is_err());
        assert!(Address::parse("nowhere").is_err());
        assert!(Address::parse("unix:").is_err());
    }

    #[test]
    fn a_list_names_each_controller_in_turn() {
        let list = parse_list("10.0.0.1:7070, https://b.example:7070").unwrap();
        assert_eq!(list.len(), 2);
        assert_eq!(list[1].text(), "https://b.example:7070");
        assert_eq!(
            parse_list("unix:/run/g.sock").unwrap(),
            vec![Address::Unix("/run/g.sock".into())]
        );
        assert!(parse_list(" , ").is_err());
        assert!(parse_list("a:1,nowhere").is_err());
    }

    #[test]
    fn a_redirect_keeps_the_transport_it_came_by() {
        let from = Address::parse("https://a.example:7070").unwrap();
        assert_eq!(
            redirected(&from, "b.example:7070").unwrap().text(),
            "https://b.example:7070"
        );
        let plain = Address::parse("http://a:1").unwrap();
        assert_eq!(redirected(&plain, "b:2").unwrap().text(), "http://b:2");
        // The caller's choice holds: no downgrade, no upgrade it did not ask for.
        assert_eq!(redirected(&from, "http://b:2").unwrap().text(), "https://b:2");
        assert_eq!(redirected(&plain, "https://b:2").unwrap().text(), "http://b:2");
        assert!(redirected(&plain, "unix:/run/x.sock").is_err());
        let err = redirected(&plain, "nowhere").unwrap_err();
        assert!(err.starts_with("http://a:1 names the leader at"), "{err}");
    }
}
