//! gpoold.toml's tables checked and turned into a `Config`, one named step
//! per part: the listener, the pools, the durations and sizes, the sharing
//! policy and what it names, TLS, and GPU health. Each refusal names the
//! field and its line.

use super::*;

/// Turns a byte offset of the file and a message into the error that
/// names the file, line and field.
pub(crate) type Invalid<'a> = &'a dyn Fn(usize, String) -> ConfigError;

impl Config {
    pub(super) fn from_file(file: &str, text: &str, parsed: ConfigFile) -> Result<Config, ConfigError> {
        let invalid = |offset: usize, message: String| toml_text::invalid(file, text, offset, message);
        let state_dir = parsed.state_dir.unwrap_or_default();
        let listen = listen_of(parsed.listen, &invalid)?;
        check_pool_names(&parsed.pool, text, &invalid)?;
        let mut policy = pools_of(parsed.pool, parsed.default_pool, &invalid)?;
        // `[ha]` first: the node timeout's default and its least depend on
        // its lease.
        let ha = super::ha::ha_of(parsed.ha, listen, &invalid)?;
        let node_timeout = node_timeout_of(parsed.node_timeout, ha.as_ref(), &invalid)?;
        // Checked in the file's order of old, so that of two mistakes the
        // same one is named first.
        let forget_nodes_after = forget_nodes_after_of(parsed.forget_nodes_after, node_timeout, &invalid)?;
        let keep_ended_jobs = keep_ended_jobs_of(parsed.keep_ended_jobs, &invalid)?;
        let history_file_records = history_file_records_of(parsed.history_file_records, &invalid)?;
        let metrics_listen = metrics_listen_of(parsed.metrics_listen, &invalid)?;
        let straggler_after = straggler_after_of(parsed.straggler_after, &invalid)?;
        let detach_grace = detach_grace_of(parsed.detach_grace, &invalid)?;
        let max_message_size = max_message_size_of(parsed.max_message_size, &invalid)?;
        let accounting = match parsed.accounting {
            None => Accounting::default(),
            Some(file) => accounting_from_file(file, &invalid)?,
        };
        let pools: Vec<String> = policy.pools.iter().map(|pool| pool.name.clone()).collect();
        policy.sharing = sharing_from_file(parsed.sharing, parsed.team, parsed.qos, &pools, &invalid)?;
        policy.reservations = parsed
            .reservation
            .into_iter()
            .map(|spanned| reservation_from_file(spanned, &invalid))
            .collect::<Result<_, _>>()?;
        check_names(&policy, &accounting, &invalid)?;
        policy.enforce_limits = enforce_limits_of(parsed.enforce_limits, &invalid)?;
        let plaintext_from = plaintext_ranges(&parsed.plaintext_from, &invalid)?;
        let tls = tls_of(
            parsed.tls,
            (parsed.insecure_plaintext, plaintext_from.is_empty()),
            (listen, &state_dir),
            &invalid,
        )?;
        let health = health_of(parsed.health, &invalid)?;
        let power = super::power::power_of(parsed.power, &accounting, &policy, &invalid)?;
        let notify = parsed.notify.map_or_else(Default::default, notify_rules);
        Ok(Config {
            ha,
            power,
            health,
            notify,
            listen,
            dev: false,
            policy,
            admins: parsed.admins,
            node_timeout,
            forget_nodes_after,
            keep_ended_jobs,
            history_file_records,
            accounting,
            metrics_listen,
            straggler_after,
            detach_grace,
            max_message_size,
            dev_agents: None,
            path: None,
            socket: Some(parsed.socket.unwrap_or_else(|| state_dir.join("gpoold.sock"))),
            tls,
            plaintext_from: if parsed.insecure_plaintext {
                plaintext_from
            } else {
                loopback_ranges()
            },
            insecure_plaintext: parsed.insecure_plaintext,
            state_dir,
        })
    }
}

/// `node_timeout`: 30 s by default, or with `[ha]` the least under which a
/// node's jobs outlive a failover; one shorter than that is refused.
fn node_timeout_of(
    field: Option<toml::Spanned<String>>,
    ha: Option<&Ha>,
    invalid: Invalid,
) -> Result<Duration, ConfigError> {
    let Some(text) = field else {
        let least = ha.map(|ha| gpool_core::fencing::least_node_timeout(ha.lease_ttl));
        return Ok(least.map_or(DEFAULT_NODE_TIMEOUT, |least| least.max(DEFAULT_NODE_TIMEOUT)));
    };
    let node_timeout = parse_node_timeout(text.get_ref()).map_err(|reason| {
        invalid(
            text.span().start,
            format!("node_timeout: {reason} (a duration such as 30s, at least 4s)"),
        )
    })?;
    if let Some(ha) = ha {
        gpool_core::fencing::check_failover(node_timeout, ha.lease_ttl)
            .map_err(|reason| invalid(text.span().start, reason))?;
    }
    Ok(node_timeout)
}

/// `[notify]`: the webhooks and mailer `--notify` may use.
fn notify_rules(file: NotifyFile) -> gpool_core::model::NotifyRules {
    gpool_core::model::NotifyRules {
        webhooks: file.webhooks,
        sendmail: file.sendmail,
    }
}

/// `listen`: host:port, a fixed port beyond loopback.
fn listen_of(field: Option<toml::Spanned<String>>, invalid: Invalid) -> Result<SocketAddr, ConfigError> {
    let field = field.unwrap_or_else(|| toml::Spanned::new(0..0, String::new()));
    let listen = field.get_ref().parse::<SocketAddr>().map_err(|err| {
        invalid(
            field.span().start,
            format!("listen: {:?} is not host:port: {err}", field.get_ref()),
        )
    })?;
    // Other hosts keep dialling the port they were given: a new one at
    // every start would cut them off. On loopback (one host: tests,
    // benchmarks) the bound port is in <state_dir>/gpoold.addr.
    if listen.port() == 0 && !listen.ip().is_loopback() {
        return Err(invalid(
            field.span().start,
            format!(
                "listen: {:?}: port 0 would be a new port at every start, while agents and users on other hosts keep dialling the old one; give a fixed port (port 0 is for loopback and gpoold --dev)",
                field.get_ref()
            ),
        ));
    }
    Ok(listen)
}

/// Each `[[pool]]` has a name of its own, of letters, digits, `.`, `_`, `-`.
fn check_pool_names(pools: &[PoolFile], text: &str, invalid: Invalid) -> Result<(), ConfigError> {
    let mut seen = std::collections::HashSet::new();
    for pool in pools {
        let name_ok = !pool.name.is_empty()
            && pool.name.len() <= 64
            && pool
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !name_ok || !seen.insert(pool.name.clone()) {
            let offset = text.find(&format!("\"{}\"", pool.name)).unwrap_or(0);
            return Err(invalid(
                offset,
                format!(
                    "pool.name: {:?} is repeated or not letters, digits, '.', '_' and '-'",
                    pool.name
                ),
            ));
        }
    }
    Ok(())
}

/// A policy with the file's pools (the first is the default unless
/// `default_pool` names another).
fn pools_of(
    pools: Vec<PoolFile>,
    default_pool: Option<toml::Spanned<String>>,
    invalid: Invalid,
) -> Result<Policy, ConfigError> {
    let mut policy = Policy::default();
    if !pools.is_empty() {
        policy.pools = pools
            .into_iter()
            .map(|pool| pool.into_def(invalid))
            .collect::<Result<_, _>>()?;
        policy.default_pool = policy.pools[0].name.clone();
    }
    if let Some(default_pool) = default_pool {
        if policy.pools.iter().all(|p| &p.name != default_pool.get_ref()) {
            return Err(invalid(
                default_pool.span().start,
                format!("default_pool: no [[pool]] is named {:?}", default_pool.get_ref()),
            ));
        }
        policy.default_pool = default_pool.into_inner();
    }
    Ok(policy)
}

fn forget_nodes_after_of(
    field: Option<toml::Spanned<String>>,
    node_timeout: Duration,
    invalid: Invalid,
) -> Result<Option<Duration>, ConfigError> {
    Ok(match field {
        None => Some(DEFAULT_FORGET_NODES_AFTER),
        Some(text) if text.get_ref() == "never" => None,
        Some(text) => Some(
            humantime::parse_duration(text.get_ref())
                .ok()
                .filter(|age| *age >= node_timeout)
                .ok_or_else(|| {
                    invalid(
                        text.span().start,
                        format!(
                            "forget_nodes_after: {:?} is not \"never\" or a duration such as 7d, at least node_timeout",
                            text.get_ref()
                        ),
                    )
                })?,
        ),
    })
}

fn keep_ended_jobs_of(field: Option<toml::Spanned<String>>, invalid: Invalid) -> Result<Option<Duration>, ConfigError> {
    Ok(match field {
        None => Some(DEFAULT_KEEP_ENDED_JOBS),
        Some(text) if text.get_ref() == "forever" => None,
        Some(text) => Some(
            humantime::parse_duration(text.get_ref())
                .ok()
                .filter(|age| *age >= Duration::from_secs(1))
                .ok_or_else(|| {
                    invalid(
                        text.span().start,
                        format!(
                            "keep_ended_jobs: {:?} is not \"forever\" or a duration such as 30d",
                            text.get_ref()
                        ),
                    )
                })?,
        ),
    })
}

fn history_file_records_of(field: Option<toml::Spanned<i64>>, invalid: Invalid) -> Result<usize, ConfigError> {
    match field {
        None => Ok(RECORDS_PER_FILE),
        Some(number) => usize::try_from(*number.get_ref())
            .ok()
            .filter(|number| (16..=1_000_000).contains(number))
            .ok_or_else(|| {
                invalid(
                    number.span().start,
                    format!(
                        "history_file_records: {} is not a number from 16 to 1000000",
                        number.get_ref()
                    ),
                )
            }),
    }
}

fn metrics_listen_of(
    field: Option<toml::Spanned<String>>,
    invalid: Invalid,
) -> Result<Option<SocketAddr>, ConfigError> {
    let Some(text) = field else { return Ok(None) };
    text.get_ref().parse::<SocketAddr>().map(Some).map_err(|_| {
        invalid(
            text.span().start,
            format!(
                "metrics_listen: {:?} is not an address such as 127.0.0.1:9464",
                text.get_ref()
            ),
        )
    })
}

fn straggler_after_of(field: Option<toml::Spanned<String>>, invalid: Invalid) -> Result<Duration, ConfigError> {
    match field {
        None => Ok(DEFAULT_STRAGGLER_AFTER),
        Some(text) => humantime::parse_duration(text.get_ref()).map_err(|_| {
            invalid(
                text.span().start,
                format!("straggler_after: {:?} is not a duration such as 10m", text.get_ref()),
            )
        }),
    }
}

/// `enforce_limits`: what becomes of a job whose limits (`--mem`,
/// `--cpus-per-gpu`) a node cannot enforce: `refuse` (the default: the node
/// is no candidate for it) or `warn` (it runs there, with a warning).
fn enforce_limits_of(
    field: Option<toml::Spanned<String>>,
    invalid: Invalid,
) -> Result<gpool_core::enforce::EnforceLimits, ConfigError> {
    let Some(text) = field else {
        return Ok(Default::default());
    };
    gpool_core::enforce::EnforceLimits::parse(text.get_ref())
        .map_err(|reason| invalid(text.span().start, format!("enforce_limits: {reason}")))
}

/// `detach_grace`: a duration from 5s (sessions say they are attached
/// every second) to a day.
fn detach_grace_of(field: Option<toml::Spanned<String>>, invalid: Invalid) -> Result<Duration, ConfigError> {
    let Some(text) = field else {
        return Ok(DEFAULT_DETACH_GRACE);
    };
    humantime::parse_duration(text.get_ref())
        .ok()
        .filter(|grace| (Duration::from_secs(5)..=Duration::from_secs(24 * 3600)).contains(grace))
        .ok_or_else(|| {
            invalid(
                text.span().start,
                format!(
                    "detach_grace: {:?} is not a duration from 5s to 1d, such as 1m",
                    text.get_ref()
                ),
            )
        })
}

fn max_message_size_of(field: Option<toml::Spanned<String>>, invalid: Invalid) -> Result<usize, ConfigError> {
    match field {
        None => Ok(gpool_proto::DEFAULT_MAX_MESSAGE_BYTES),
        Some(text) => gpool_core::spec::parse_size(text.get_ref())
            .ok()
            .filter(|size| (1 << 20..=gpool_proto::MAX_MESSAGE_BYTES as u64).contains(size))
            .map(|size| size as usize)
            .ok_or_else(|| {
                invalid(
                    text.span().start,
                    format!(
                        "max_message_size: {:?} is not a size from 1M to {}M",
                        text.get_ref(),
                        gpool_proto::MAX_MESSAGE_BYTES >> 20
                    ),
                )
            }),
    }
}

/// Reservations and cost centres name teams of this file (a misspelt one
/// would reserve for, or charge, nobody), and reservations' names are
/// their own.
fn check_names(policy: &Policy, accounting: &Accounting, invalid: Invalid) -> Result<(), ConfigError> {
    if let Some((reservation, team)) = policy.reservations.iter().find_map(|r| {
        r.teams
            .iter()
            .find(|team| !policy.sharing.teams.iter().any(|known| &known.name == *team))
            .map(|team| (r, team))
    }) {
        return Err(invalid(
            0,
            format!(
                "reservation.teams: reservation {} names {team:?}, which is not a [[team]] of this file",
                reservation.name
            ),
        ));
    }
    for (i, reservation) in policy.reservations.iter().enumerate() {
        if policy.reservations[..i].iter().any(|r| r.name == reservation.name) {
            return Err(invalid(
                0,
                format!("reservation.name: {:?} is given twice", reservation.name),
            ));
        }
    }
    if let Some((team, center)) = accounting
        .pricing
        .team_centers
        .iter()
        .find(|(team, _)| !policy.sharing.teams.iter().any(|known| &known.name == *team))
    {
        return Err(invalid(
            0,
            format!("accounting.cost_centers.{center}.teams: {team:?} is not a [[team]] of this file"),
        ));
    }
    Ok(())
}

fn plaintext_ranges(ranges: &[toml::Spanned<String>], invalid: Invalid) -> Result<Vec<ipnet::IpNet>, ConfigError> {
    ranges
        .iter()
        .map(|range| {
            let text = range.get_ref();
            text.parse::<ipnet::IpNet>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| {
                    invalid(
                        range.span().start,
                        format!("plaintext_from: {text:?} is not an address range such as 10.0.0.0/8"),
                    )
                })
        })
        .collect()
}

/// `[tls]`, required for TCP beyond loopback unless `insecure_plaintext`
/// (with the ranges plaintext is accepted from).
fn tls_of(
    tls: Option<toml::Spanned<TlsFile>>,
    (insecure_plaintext, no_plaintext_ranges): (bool, bool),
    (listen, state_dir): (SocketAddr, &Path),
    invalid: Invalid,
) -> Result<Option<TlsFiles>, ConfigError> {
    match tls {
        Some(tls) => {
            if insecure_plaintext {
                return Err(invalid(
                    tls.span().start,
                    "tls: insecure_plaintext = true and [tls] exclude each other".into(),
                ));
            }
            let tls = tls.into_inner();
            Ok(Some(TlsFiles {
                cert: tls.cert,
                key: tls.key,
                ca: tls.ca.unwrap_or_else(|| Config::ca_dir(state_dir).join("ca.pem")),
            }))
        }
        // Loopback never leaves the host, and its callers are known by
        // their socket's uid: no TLS needed.
        None if !insecure_plaintext && listen.ip().is_loopback() => Ok(None),
        None if !insecure_plaintext => Err(invalid(
            0,
            format!("tls: no [tls] table: gpoold serves TCP beyond loopback ({listen}) over TLS only, unless insecure_plaintext = true with plaintext_from ranges"),
        )),
        None if no_plaintext_ranges => Err(invalid(
            0,
            "plaintext_from: insecure_plaintext = true needs the address ranges plaintext is accepted from".into(),
        )),
        None => Ok(None),
    }
}

/// `[health]`: when a GPU is too hot, quiet or missing for how long.
fn health_of(
    health: Option<toml::Spanned<HealthFile>>,
    invalid: Invalid,
) -> Result<gpool_core::health::HealthPolicy, ConfigError> {
    let defaults = gpool_core::health::HealthPolicy::default();
    let Some(spanned) = health else { return Ok(defaults) };
    let offset = spanned.span().start;
    let declared = spanned.into_inner();
    let duration_ms = |field: &str, given: &Option<String>, default: i64| match given {
        None => Ok(default),
        Some(text) => humantime::parse_duration(text)
            .ok()
            .map(|d| d.as_millis().min(i64::MAX as u128) as i64)
            .ok_or_else(|| {
                invalid(
                    offset,
                    format!("health.{field}: {text:?} is not a duration such as 10m"),
                )
            }),
    };
    let max_temperature_c = declared.max_temperature_c.unwrap_or(defaults.max_temperature_c);
    if !(40..=150).contains(&max_temperature_c) {
        return Err(invalid(
            offset,
            format!("health.max_temperature_c: {max_temperature_c} is not from 40 to 150"),
        ));
    }
    Ok(gpool_core::health::HealthPolicy {
        max_temperature_c,
        hot_for_ms: duration_ms("hot_for", &declared.hot_for, defaults.hot_for_ms)?,
        quiet_ms: duration_ms("quiet_period", &declared.quiet_period, defaults.quiet_ms)?,
        missing_for_ms: duration_ms("missing_for", &declared.missing_for, defaults.missing_for_ms)?,
        reset_faults_return: declared.reset_faults_return.unwrap_or(defaults.reset_faults_return),
    })
}
