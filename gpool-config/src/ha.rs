//! `[ha]`: two or more controllers, one leader elected through etcd.

use super::*;

/// `[ha]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HaFile {
    etcd: Vec<String>,
    name: String,
    advertise: Option<String>,
    lease_ttl: Option<String>,
    election: Option<String>,
    /// TLS to etcd: its CA, and this controller's client certificate.
    ca: Option<PathBuf>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    /// Plaintext etcd (`http://` endpoints) accepted, knowing the risk.
    #[serde(default)]
    insecure_etcd: bool,
}

/// High availability: this controller campaigns for leadership and serves
/// only while it leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ha {
    /// etcd's client endpoints (`https://host:2379`, or `http://` with
    /// `insecure_etcd`).
    pub etcd: Vec<String>,
    /// This controller's name, unique among them.
    pub name: String,
    /// The address agents and users dial to reach this controller (and
    /// that standbys send them to): `listen` where it is left out.
    pub advertise: String,
    /// The leader's etcd lease: a dead leader's standby takes over after
    /// about this long.
    pub lease_ttl: Duration,
    /// The etcd election every controller of this pool campaigns in.
    pub election: String,
    /// TLS to etcd (`https://` endpoints).
    pub tls: Option<EtcdTls>,
}

/// The files of TLS to etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    /// The CA that signed etcd's server certificates.
    pub ca: PathBuf,
    /// This controller's client certificate and key, where etcd asks for
    /// one (`--client-cert-auth`).
    pub cert_key: Option<(PathBuf, PathBuf)>,
}

pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(15);
const MIN_LEASE_TTL: Duration = Duration::from_secs(2);
/// A leader dead this long goes unnoticed: longer makes no sense.
const MAX_LEASE_TTL: Duration = Duration::from_secs(3600);
pub const DEFAULT_ELECTION: &str = "gpool/leader";

pub(crate) fn ha_of(
    ha: Option<toml::Spanned<HaFile>>,
    listen: std::net::SocketAddr,
    invalid: from_file::Invalid,
) -> Result<Option<Ha>, ConfigError> {
    let Some(spanned) = ha else { return Ok(None) };
    let offset = spanned.span().start;
    let file = spanned.into_inner();
    if file.etcd.is_empty() {
        return Err(invalid(
            offset,
            "ha.etcd: name at least one etcd endpoint, e.g. [\"https://10.0.0.5:2379\"]".into(),
        ));
    }
    let tls = file.ca.is_some();
    check_endpoints(&file.etcd, tls).map_err(|reason| invalid(offset, reason))?;
    check_insecure_etcd(&file.etcd, tls, file.insecure_etcd).map_err(|reason| invalid(offset, reason))?;
    let cert_key = cert_and_key(file.cert, file.key, tls).map_err(|reason| invalid(offset, reason))?;
    let name_ok = !file.name.is_empty()
        && file
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !name_ok {
        return Err(invalid(
            offset,
            format!("ha.name: {:?} must be letters, digits, '-', '_' or '.'", file.name),
        ));
    }
    let advertise = advertise_of(file.advertise, listen).map_err(|reason| invalid(offset, reason))?;
    let lease_ttl = match &file.lease_ttl {
        None => DEFAULT_LEASE_TTL,
        Some(text) => match humantime::parse_duration(text) {
            Ok(ttl) if (MIN_LEASE_TTL..=MAX_LEASE_TTL).contains(&ttl) && ttl.subsec_nanos() == 0 => ttl,
            _ => {
                return Err(invalid(
                    offset,
                    format!("ha.lease_ttl: {text:?} is not a whole number of seconds from 2s to 1h, such as 15s"),
                ))
            }
        },
    };
    Ok(Some(Ha {
        etcd: file.etcd,
        name: file.name,
        advertise,
        lease_ttl,
        election: election_of(file.election).map_err(|reason| invalid(offset, reason))?,
        tls: file.ca.map(|ca| EtcdTls { ca, cert_key }),
    }))
}

/// Where others dial this controller: `advertise`, else `listen` where
/// that names one host and port.
fn advertise_of(advertise: Option<String>, listen: std::net::SocketAddr) -> Result<String, String> {
    match advertise {
        Some(advertise) if host_port(&advertise).is_none() => Err(format!(
            "ha.advertise: {advertise:?} is not HOST:PORT (what agents and users dial)"
        )),
        Some(advertise) => Ok(advertise),
        None if listen.ip().is_unspecified() || listen.port() == 0 => Err(format!(
            "ha.advertise: needed, since listen = \"{listen}\" is not an address agents and users can dial"
        )),
        None => Ok(listen.to_string()),
    }
}

/// The etcd election's name: its candidates' keys are `<election>/...`, so
/// it must not end with `/`, and no pool's may be a prefix of another's.
fn election_of(election: Option<String>) -> Result<String, String> {
    let election = election.unwrap_or_else(|| DEFAULT_ELECTION.to_string());
    let valid = !election.is_empty()
        && !election.ends_with('/')
        && election
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'));
    if !valid {
        return Err(format!(
            "ha.election: {election:?} must be letters, digits, '-', '_', '.' and '/', not ending with '/' (one name per pool, e.g. \"gpool/prod\")"
        ));
    }
    Ok(election)
}

/// Each of `endpoints` is etcd's client URL: `https://` with TLS (`tls`),
/// else `http://`.
fn check_endpoints(endpoints: &[String], tls: bool) -> Result<(), String> {
    let scheme = if tls { "https://" } else { "http://" };
    for endpoint in endpoints {
        let host_port = endpoint.strip_prefix(scheme).unwrap_or(endpoint);
        let valid = !host_port.contains("://");
        if !valid
            || host_port
                .rsplit_once(':')
                .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
        {
            let why = if tls {
                "with ha.ca, etcd is reached over TLS"
            } else {
                "https:// needs ha.ca, the CA of etcd's certificates; http:// needs insecure_etcd = true"
            };
            return Err(format!(
                "ha.etcd: {endpoint:?} is not {scheme}HOST:PORT (etcd's client URL; {why})"
            ));
        }
    }
    Ok(())
}

/// Plaintext etcd only with `insecure_etcd = true`: whoever can reach an
/// etcd that asks no credentials can rewrite the election's keys, and so
/// name a leader of their choosing, to which standbys send agents and
/// users (with their tokens). That holds on loopback too, where every
/// account of the host can reach it, so loopback is not exempt.
fn check_insecure_etcd(endpoints: &[String], tls: bool, insecure_etcd: bool) -> Result<(), String> {
    match (tls, insecure_etcd) {
        (true, true) => Err("ha.insecure_etcd: with ha.ca etcd is reached over TLS; insecure_etcd = true is for http:// endpoints only".into()),
        (false, false) => Err(format!(
            "ha.insecure_etcd: ha.etcd names plaintext etcd ({:?}), where anyone who reaches it can rewrite the election's keys and point agents and users at a leader of their own: give ha.ca (https:// endpoints; ha.cert and ha.key where etcd asks for client certificates), or set insecure_etcd = true in [ha] to accept that",
            endpoints.first().map(String::as_str).unwrap_or_default()
        )),
        _ => Ok(()),
    }
}

/// This controller's client certificate for etcd and its key: both or
/// neither, and only with TLS.
fn cert_and_key(cert: Option<PathBuf>, key: Option<PathBuf>, tls: bool) -> Result<Option<(PathBuf, PathBuf)>, String> {
    let cert_key = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        (None, None) => None,
        _ => {
            return Err(
                "ha.cert and ha.key go together: this controller's client certificate for etcd and its key".into(),
            )
        }
    };
    if cert_key.is_some() && !tls {
        return Err("ha.cert: a client certificate needs ha.ca (TLS to etcd)".into());
    }
    Ok(cert_key)
}

/// `HOST:PORT`, with an optional `http://` or `https://` in front.
fn host_port(text: &str) -> Option<(&str, u16)> {
    let bare = text
        .strip_prefix("https://")
        .or_else(|| text.strip_prefix("http://"))
        .unwrap_or(text);
    let (host, port) = bare.rsplit_once(':')?;
    let port = port.parse::<u16>().ok().filter(|port| *port != 0)?;
    (!host.is_empty()).then_some((host, port))
}
