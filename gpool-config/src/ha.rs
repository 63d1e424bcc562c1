//! `[ha]`: two or more controllers, one leader elected through etcd.

use super::*;

/// `[ha]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HaFile {
    etcd: Vec<String>,
    name: String,
    advertise: String,
    lease_ttl: Option<String>,
    election: Option<String>,
}

/// High availability: this controller campaigns for leadership and serves
/// only while it leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ha {
    /// etcd's client endpoints (`http://host:2379`).
    pub etcd: Vec<String>,
    /// This controller's name, unique among them.
    pub name: String,
    /// The address agents and users dial to reach this controller.
    pub advertise: String,
    /// The leader's etcd lease: a dead leader's standby takes over after
    /// about this long.
    pub lease_ttl: Duration,
    /// The etcd election every controller of this pool campaigns in.
    pub election: String,
}

pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(15);
pub const DEFAULT_ELECTION: &str = "gpool/leader";

pub(crate) fn ha_of(ha: Option<toml::Spanned<HaFile>>, invalid: from_file::Invalid) -> Result<Option<Ha>, ConfigError> {
    let Some(spanned) = ha else { return Ok(None) };
    let offset = spanned.span().start;
    let file = spanned.into_inner();
    if file.etcd.is_empty() {
        return Err(invalid(
            offset,
            "ha.etcd: name at least one etcd endpoint, e.g. [\"http://10.0.0.5:2379\"]".into(),
        ));
    }
    for endpoint in &file.etcd {
        let host_port = endpoint.strip_prefix("http://").unwrap_or(endpoint);
        let valid = !endpoint.contains("://") || endpoint.starts_with("http://");
        if !valid
            || host_port
                .rsplit_once(':')
                .is_none_or(|(host, port)| host.is_empty() || port.parse::<u16>().is_err())
        {
            return Err(invalid(
                offset,
                format!("ha.etcd: {endpoint:?} is not http://HOST:PORT (etcd's client URL; TLS to etcd is not supported yet)"),
            ));
        }
    }
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
    if host_port(&file.advertise).is_none() {
        return Err(invalid(
            offset,
            format!(
                "ha.advertise: {:?} is not HOST:PORT (what agents and users dial)",
                file.advertise
            ),
        ));
    }
    let lease_ttl = match &file.lease_ttl {
        None => DEFAULT_LEASE_TTL,
        Some(text) => match humantime::parse_duration(text) {
            Ok(ttl) if ttl >= Duration::from_secs(2) && ttl.subsec_nanos() == 0 => ttl,
            _ => {
                return Err(invalid(
                    offset,
                    format!("ha.lease_ttl: {text:?} is not a whole number of seconds, at least 2s, such as 15s"),
                ))
            }
        },
    };
    Ok(Some(Ha {
        etcd: file.etcd,
        name: file.name,
        advertise: file.advertise,
        lease_ttl,
        election: file.election.unwrap_or_else(|| DEFAULT_ELECTION.to_string()),
    }))
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
