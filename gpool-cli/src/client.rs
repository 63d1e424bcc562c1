//! Finding gpoold, connecting to it, and saying who calls.
//!
//! The address comes from `--server` / `GPOOL_SERVER`, else a running dev
//! controller's address file, else the controller host's local socket. Over
//! TCP the caller is a token (`GPOOL_TOKEN`, else `~/.config/gpool/token`)
//! and TLS trusts the cluster CA (`GPOOL_CA`, else `~/.config/gpool/ca.pem`);
//! on the local socket gpoold knows the caller by their Unix credentials.

use crate::CliError;
use gpool_proto::dial::{self, Address, ClientTls, DialError};
use gpool_proto::pb::pool_client::PoolClient;
use gpool_proto::USER_METADATA_KEY;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Status};

/// Names the caller on every request: the user (which a dev controller
/// trusts) and the token, where there is one. A client cloned for a second
/// stream keeps them.
#[derive(Clone)]
pub struct Interceptor {
    user: MetadataValue<tonic::metadata::Ascii>,
    bearer: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl tonic::service::Interceptor for Interceptor {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        request.metadata_mut().insert(USER_METADATA_KEY, self.user.clone());
        if let Some(bearer) = &self.bearer {
            request.metadata_mut().insert("authorization", bearer.clone());
        }
        Ok(request)
    }
}

pub type Client = PoolClient<InterceptedService<dial::Following, Interceptor>>;

/// The local socket of a controller installed with the example config.
const DEFAULT_SOCKET: &str = "/var/lib/gpool/gpoold.sock";

/// `--server` / `GPOOL_SERVER`, else the address a dev controller recorded,
/// else the local socket where it exists.
pub fn resolve_address(flag: Option<String>) -> Result<String, CliError> {
    if let Some(addr) = flag.filter(|a| !a.trim().is_empty()) {
        return Ok(addr.trim().to_string());
    }
    let pointer = gpool_proto::dev_address_file();
    match std::fs::read_to_string(&pointer) {
        Ok(text) if !text.trim().is_empty() => return Ok(text.trim().to_string()),
        _ => {}
    }
    if std::path::Path::new(DEFAULT_SOCKET).exists() {
        return Ok(format!("unix:{DEFAULT_SOCKET}"));
    }
    Err(CliError::Usage(format!(
        "no controller address: give --server HOST:PORT or set GPOOL_SERVER (also https://HOST:PORT or unix:PATH); no dev controller recorded one in {}, and there is no {DEFAULT_SOCKET}",
        pointer.display()
    )))
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

pub async fn connect(addr: &str, timeout: Option<std::time::Duration>) -> Result<Client, CliError> {
    let unreachable = |reason: String| CliError::Unreachable {
        addr: addr.to_string(),
        reason,
    };
    let addresses = dial::parse_list(addr).map_err(|reason| CliError::Usage(format!("--server: {reason}")))?;
    let tcp = addresses.iter().any(|address| matches!(address, Address::Tcp { .. }));
    let tls = ClientTls {
        ca_pem: if tcp { read_ca()? } else { None },
        identity_pem: None,
    };
    let token = if tcp { read_token()? } else { None };
    // A token sent in clear text is a token given away; loopback never
    // leaves the host, and http:// says the user means it. The same holds
    // for the leader a standby sends the call on to.
    let rule = dial::TokenRule::for_addresses(&addresses);
    for address in addresses.iter().filter(|_| token.is_some()) {
        match address {
            Address::Tcp { host_port, .. } if !rule.allows(address, &tls) => {
                return Err(CliError::Usage(format!(
                    "refusing to send your token in clear text to {host_port}: {GIVE_THE_CA}, or write http://{host_port} to insist"
                )))
            }
            _ => {}
        }
    }
    let deadlines = dial::Deadlines {
        connect: timeout.unwrap_or(std::time::Duration::from_secs(3600)),
        request: timeout,
    };
    let connected = dial::connect_following(&addresses, &tls, deadlines, token.as_ref().map(|_| &rule)).await;
    let (channel, _) = connected.map_err(|err| match err {
        DialError::Unreachable(reason) => unreachable(tls_hint(addr).unwrap_or(reason)),
        refused => dial_refused(addr, refused),
    })?;
    let bearer: Option<MetadataValue<_>> = token
        .map(|token| {
            format!("Bearer {token}")
                .parse()
                .map_err(|_| CliError::Usage("the token has characters that cannot be sent".into()))
        })
        .transpose()?;
    // Dev mode trusts this name; a configured gpoold ignores it.
    let user = current_user()?;
    let user_value: MetadataValue<_> = user
        .parse()
        .map_err(|_| CliError::Usage(format!("user name {user:?} cannot be sent")))?;
    let interceptor = Interceptor {
        user: user_value,
        bearer,
    };
    Ok(PoolClient::with_interceptor(channel, interceptor).max_decoding_message_size(gpool_proto::MAX_REPLY_BYTES))
}

/// Why a call, or the connection for it, went nowhere: a standby's
/// redirect the token may not follow, or no controller that serves.
pub fn dial_refused(addr: &str, err: DialError) -> CliError {
    match err {
        DialError::ClearTextRedirect { standby, leader } => CliError::Usage(format!(
            "{standby} is a standby and names the leader at {leader}: refusing to send your token in clear text to {leader}: {GIVE_THE_CA}, or name http://{leader} in --server or GPOOL_SERVER too, to insist"
        )),
        DialError::Unreachable(reason) => CliError::Unreachable {
            addr: addr.to_string(),
            reason,
        },
    }
}

/// How a user whose token would go in clear text sends it over TLS.
const GIVE_THE_CA: &str = "give the cluster CA (GPOOL_CA or ~/.config/gpool/ca.pem)";

/// Why a controller at `addr` that broke the connection did: it speaks
/// TLS and was dialled in plain text (no CA given, or `http://`). `None`
/// when no such address answers as a TLS server does.
pub fn tls_hint(addr: &str) -> Option<String> {
    let have_ca = read_ca().ok().flatten().is_some();
    let addresses = dial::parse_list(addr).ok()?;
    addresses.iter().find_map(|address| {
        let Address::Tcp { host_port, tls } = address else {
            return None;
        };
        let plain = *tls == Some(false) || (tls.is_none() && !have_ca);
        if !plain || !speaks_tls(host_port) {
            return None;
        }
        let how = if *tls == Some(false) {
            format!("write https://{host_port} (not http://) and give")
        } else {
            "give".to_string()
        };
        Some(format!(
            "{host_port} speaks TLS, and gpool dialled it in plain text: {how} the cluster CA with GPOOL_CA=/path/to/ca.pem (or put it in ~/.config/gpool/ca.pem); `gpool admin ca init` wrote it to the controller's <state-dir>/ca/ca.pem"
        ))
    })
}

/// Whether the server at `host_port` answers as a TLS server does: to
/// bytes that are no TLS record (HTTP/2's preface) it replies with a TLS
/// alert (a record of type 21, version 3.x). Bounded: a second to connect
/// and one to answer.
fn speaks_tls(host_port: &str) -> bool {
    use std::io::{Read, Write};
    use std::net::ToSocketAddrs;
    let limit = std::time::Duration::from_secs(1);
    let Some(socket) = host_port.to_socket_addrs().ok().and_then(|mut all| all.next()) else {
        return false;
    };
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&socket, limit) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(limit));
    let _ = stream.set_write_timeout(Some(limit));
    if stream.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").is_err() {
        return false;
    }
    let mut header = [0u8; 3];
    stream.read_exact(&mut header).is_ok() && matches!(header, [21 | 22, 3, _])
}

fn config_dir() -> Option<PathBuf> {
    std::env::var_os("HOME")
        .filter(|home| !home.is_empty())
        .map(|home| PathBuf::from(home).join(".config").join("gpool"))
}

/// `GPOOL_CA`, else `~/.config/gpool/ca.pem` if it exists.
fn read_ca() -> Result<Option<String>, CliError> {
    let path = match std::env::var_os("GPOOL_CA").filter(|path| !path.is_empty()) {
        Some(path) => PathBuf::from(path),
        None => match config_dir().map(|dir| dir.join("ca.pem")).filter(|path| path.exists()) {
            Some(path) => path,
            None => return Ok(None),
        },
    };
    std::fs::read_to_string(&path)
        .map(Some)
        .map_err(|err| CliError::Usage(format!("CA certificate {}: {err}", path.display())))
}

/// `GPOOL_TOKEN`, else `~/.config/gpool/token`, which must be readable by
/// its owner only.
fn read_token() -> Result<Option<String>, CliError> {
    if let Some(token) = std::env::var("GPOOL_TOKEN")
        .ok()
        .filter(|token| !token.trim().is_empty())
    {
        return Ok(Some(token.trim().to_string()));
    }
    let Some(path) = config_dir().map(|dir| dir.join("token")).filter(|path| path.exists()) else {
        return Ok(None);
    };
    let mode = std::fs::metadata(&path)
        .map_err(|err| CliError::Usage(format!("token file {}: {err}", path.display())))?
        .permissions()
        .mode();
    if mode & 0o077 != 0 {
        return Err(CliError::Usage(format!(
            "token file {}: mode {:o} lets others read it; run chmod 600 {}",
            path.display(),
            mode & 0o777,
            path.display()
        )));
    }
    std::fs::read_to_string(&path)
        .map(|text| Some(text.trim().to_string()))
        .map_err(|err| CliError::Usage(format!("token file {}: {err}", path.display())))
}
