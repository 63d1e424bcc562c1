//! gpoold.toml, and the settings of a run (from the file or from `--dev`).

use gpool_core::model::GpuModel;
use gpool_core::policy::{Period, Qos, Sharing, Team, UserLimits, Weights};
use gpool_core::sched::Policy;
use gpool_core::spec::parse_duration;
use gpool_core::toml_text;
pub use gpool_core::toml_text::ConfigError;

mod from_file;
mod ha;
mod power;
pub use ha::{EtcdTls, Ha, DEFAULT_ELECTION, DEFAULT_LEASE_TTL};
pub use power::PowerGroup;
mod tables;
#[cfg(test)]
mod tests;

use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tables::*;

/// How long an agent may be silent before its node is down.
/// Ended jobs and accounting records per sealed history file, unless
/// `history_file_records` says otherwise.
pub const RECORDS_PER_FILE: usize = 4096;
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_secs(30);
/// The shortest node timeout: its last quarter, the fencing margin (see
/// ARCHITECTURE.md), must be at least a second.
pub const MIN_NODE_TIMEOUT: Duration = Duration::from_secs(4);

/// A node timeout given on the command line, at least `MIN_NODE_TIMEOUT`.
pub fn parse_node_timeout(text: &str) -> Result<Duration, String> {
    let timeout = humantime::parse_duration(text).map_err(|err| format!("{text:?}: {err}"))?;
    if timeout < MIN_NODE_TIMEOUT {
        return Err(format!("{text:?} is shorter than the shortest node timeout, 4s"));
    }
    Ok(timeout)
}
/// How long a down node is remembered by default: a week.
pub const DEFAULT_FORGET_NODES_AFTER: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long a GPU must lag behind its job's others to be a straggler, by
/// default.
pub const DEFAULT_STRAGGLER_AFTER: Duration = Duration::from_secs(10 * 60);
/// How long an interactive job may have no client attached, by default.
pub const DEFAULT_DETACH_GRACE: Duration = Duration::from_secs(60);
/// How long ended jobs stay listed (`gpool history`) by default: 30 days.
pub const DEFAULT_KEEP_ENDED_JOBS: Duration = Duration::from_secs(30 * 24 * 3600);
/// How long accounting records are kept by default: 400 days, so a year
/// can be reported on with its month before.
pub const DEFAULT_KEEP_ACCOUNTING: Duration = Duration::from_secs(400 * 24 * 3600);

/// `[accounting]`: prices, cost centres, how long records are kept, and how
/// savings reports size dedicated GPUs.
#[derive(Debug, Clone)]
pub struct Accounting {
    pub pricing: gpool_core::accounting::Pricing,
    /// Records of attempts that ended this long ago are removed; `None`:
    /// kept forever.
    pub keep: Option<Duration>,
    pub savings: gpool_core::accounting::SavingsRule,
}

impl Default for Accounting {
    fn default() -> Accounting {
        Accounting {
            pricing: gpool_core::accounting::Pricing {
                currency: "USD".into(),
                ..Default::default()
            },
            keep: Some(DEFAULT_KEEP_ACCOUNTING),
            savings: Default::default(),
        }
    }
}

/// Everything a run of gpoold needs to know.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    /// `[ha]`: campaign for leadership through etcd, serve only as leader.
    pub ha: Option<Ha>,
    pub state_dir: PathBuf,
    /// Dev mode: loopback only, no TLS, the caller's user name is trusted.
    pub dev: bool,
    pub policy: Policy,
    /// Users who may cancel anyone's job and drain or resume nodes.
    pub admins: Vec<String>,
    /// A node whose agent is silent this long is down.
    pub node_timeout: Duration,
    /// A node down this long is forgotten; `None`: never.
    pub forget_nodes_after: Option<Duration>,
    /// Jobs that ended this long ago are removed; `None`: kept forever.
    pub keep_ended_jobs: Option<Duration>,
    /// Ended jobs, and accounting records, moved from the database to a
    /// sealed history file at a time, once it holds 1,024 more (or twice as
    /// many, where that is fewer).
    pub history_file_records: usize,
    pub accounting: Accounting,
    /// Where `/metrics` is served (Prometheus); `None`: not served.
    pub metrics_listen: Option<SocketAddr>,
    /// A GPU lagging behind its job's others this long is a straggler.
    pub straggler_after: Duration,
    /// An interactive job (`gpool alloc`, `run --pty`) with no client
    /// attached this long is hung up on (SIGHUP), then ended, as salloc's
    /// allocation ends with salloc.
    pub detach_grace: Duration,
    /// The largest request gpoold takes, in bytes.
    pub max_message_size: usize,
    /// Dev mode: agents to run inside gpoold, linked over loopback.
    pub dev_agents: Option<DevAgents>,
    /// The file it came from, which `gpool admin reload` and SIGHUP re-read.
    pub path: Option<PathBuf>,
    /// The Unix socket local users reach gpoold through, identified by
    /// their peer credentials; `None` in dev mode.
    pub socket: Option<PathBuf>,
    /// TLS on the TCP listener; `None` means plaintext (dev mode, or
    /// `insecure_plaintext`).
    pub tls: Option<TlsFiles>,
    /// Without TLS: the only peers a plaintext connection is accepted from
    /// (loopback where gpoold listens on loopback).
    pub plaintext_from: Vec<ipnet::IpNet>,
    /// The operator allowed plaintext from other hosts.
    pub insecure_plaintext: bool,
    /// `[health]`: when a GPU's heat is a fault, and how long a GPU or node
    /// stays out after its last fault.
    pub health: gpool_core::health::HealthPolicy,
    /// `[notify]`: where `--notify` may post or mail.
    pub notify: gpool_core::model::NotifyRules,
    /// `[[power]]`: nodes that sleep when idle, or are created on demand.
    pub power: Vec<PowerGroup>,
}

/// Loopback, IPv4 and IPv6.
pub fn loopback_ranges() -> Vec<ipnet::IpNet> {
    ["127.0.0.0/8", "::1/128"]
        .iter()
        .filter_map(|range| range.parse().ok())
        .collect()
}

/// `[tls]`: the controller's certificate and key, and the cluster CA that
/// agents' client certificates must chain to.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl Config {
    /// Where the cluster CA (`gpool admin ca init`) and its revocation list
    /// live.
    pub fn ca_dir(state_dir: &Path) -> PathBuf {
        state_dir.join("ca")
    }

    /// The audit log: one JSON line per admin action and refused request.
    pub fn audit_log(&self) -> PathBuf {
        self.state_dir.join("audit.log")
    }

    /// Serial numbers of revoked certificates, one per line (hex).
    pub fn revoked_certs(&self) -> PathBuf {
        Config::ca_dir(&self.state_dir).join("revoked")
    }
}

/// The in-process agents of `gpoold --dev`.
#[derive(Debug, Clone)]
pub struct DevAgents {
    pub n_nodes: u32,
    pub gpus_per_node: u32,
    pub gpu_model: String,
    pub gpu_memory_mib: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConfigFile {
    /// Required of a controller's file (`Config::parse`); a file read only
    /// for its policy (`Config::parse_policy`) may leave both out.
    #[serde(default)]
    listen: Option<toml::Spanned<String>>,
    #[serde(default)]
    state_dir: Option<PathBuf>,
    #[serde(default)]
    default_pool: Option<toml::Spanned<String>>,
    #[serde(default)]
    admins: Vec<String>,
    #[serde(default)]
    node_timeout: Option<toml::Spanned<String>>,
    #[serde(default)]
    forget_nodes_after: Option<toml::Spanned<String>>,
    #[serde(default)]
    keep_ended_jobs: Option<toml::Spanned<String>>,
    #[serde(default)]
    history_file_records: Option<toml::Spanned<i64>>,
    #[serde(default)]
    metrics_listen: Option<toml::Spanned<String>>,
    #[serde(default)]
    straggler_after: Option<toml::Spanned<String>>,
    #[serde(default)]
    detach_grace: Option<toml::Spanned<String>>,
    #[serde(default)]
    max_message_size: Option<toml::Spanned<String>>,
    /// `refuse` (the default) or `warn`.
    #[serde(default)]
    enforce_limits: Option<toml::Spanned<String>>,
    socket: Option<PathBuf>,
    tls: Option<toml::Spanned<TlsFile>>,
    #[serde(default)]
    insecure_plaintext: bool,
    #[serde(default)]
    plaintext_from: Vec<toml::Spanned<String>>,
    #[serde(default)]
    pool: Vec<PoolFile>,
    #[serde(default)]
    sharing: Option<toml::Spanned<SharingFile>>,
    #[serde(default)]
    team: Vec<toml::Spanned<TeamFile>>,
    #[serde(default)]
    qos: Vec<toml::Spanned<QosFile>>,
    #[serde(default)]
    accounting: Option<toml::Spanned<AccountingFile>>,
    #[serde(default)]
    health: Option<toml::Spanned<HealthFile>>,
    #[serde(default)]
    notify: Option<NotifyFile>,
    #[serde(default)]
    reservation: Vec<toml::Spanned<ReservationFile>>,
    #[serde(default)]
    ha: Option<toml::Spanned<ha::HaFile>>,
    #[serde(default)]
    power: Vec<toml::Spanned<power::PowerFile>>,
}

/// `[[reservation]]`: nodes kept for a window.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReservationFile {
    name: String,
    nodes: Vec<String>,
    /// `2026-12-01T08:00:00Z` (UTC).
    start: String,
    /// How long, or until when.
    duration: Option<String>,
    end: Option<String>,
    #[serde(default)]
    users: Vec<String>,
    #[serde(default)]
    teams: Vec<String>,
}

/// `[notify]`: what a job's `--notify` may name.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NotifyFile {
    #[serde(default)]
    webhooks: Vec<String>,
    sendmail: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HealthFile {
    max_temperature_c: Option<u32>,
    hot_for: Option<String>,
    quiet_period: Option<String>,
    missing_for: Option<String>,
    reset_faults_return: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AccountingFile {
    keep: Option<toml::Spanned<String>>,
    currency: Option<String>,
    savings_percentile: Option<f64>,
    /// GPU model -> price of one GPU-hour.
    #[serde(default)]
    prices: BTreeMap<String, f64>,
    #[serde(default)]
    cost_centers: BTreeMap<String, CostCenterFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CostCenterFile {
    #[serde(default)]
    teams: Vec<String>,
    #[serde(default)]
    projects: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TlsFile {
    cert: PathBuf,
    key: PathBuf,
    ca: Option<PathBuf>,
}

/// `[sharing]`: how teams share the pool.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct SharingFile {
    period: Option<String>,
    time_zone: Option<String>,
    half_life: Option<String>,
    waste_cap_gpu_hours_per_hour: Option<f64>,
    max_grace: Option<String>,
    default_qos: Option<String>,
    max_user_priority: Option<i32>,
    max_jobs_per_user: Option<u32>,
    max_gpus_per_user: Option<u32>,
    max_submit_per_user: Option<u32>,
    weights: Option<WeightsFile>,
    /// "las" (the default) or "priority".
    order: Option<String>,
    las: Option<LasFile>,
    /// Fractions' memory asks round up to this (`1G`).
    gpu_share_granularity: Option<String>,
    /// Jobs of different users may share one GPU.
    gpu_share_mixed_users: Option<bool>,
}

/// `[sharing.las]`: the least-attained-service queues.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LasFile {
    thresholds_gpu_hours: Option<Vec<f64>>,
    promote_factor: Option<f64>,
    max_lost: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WeightsFile {
    qos: Option<f64>,
    fair_share: Option<f64>,
    age: Option<f64>,
    size: Option<f64>,
    max_age: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TeamFile {
    name: String,
    #[serde(default = "one_share")]
    shares: u32,
    #[serde(default)]
    guaranteed_gpus: u32,
    /// Pool or GPU model name -> more guaranteed GPUs there.
    #[serde(default)]
    guaranteed_in: BTreeMap<String, u32>,
    gpu_hours: Option<u64>,
    max_gpus: Option<u32>,
    #[serde(default)]
    members: Vec<String>,
    #[serde(default)]
    leads: Vec<String>,
    max_jobs_per_user: Option<u32>,
    max_gpus_per_user: Option<u32>,
    max_submit_per_user: Option<u32>,
}

fn one_share() -> u32 {
    1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QosFile {
    name: String,
    #[serde(default)]
    priority: u32,
    max_time: Option<String>,
    #[serde(default)]
    preempt_lower: bool,
    min_runtime: Option<String>,
    grace: Option<String>,
    #[serde(default)]
    reserve_gpus: u32,
    /// Pool name -> GPUs kept there instead of `reserve_gpus`.
    #[serde(default)]
    reserve_in: BTreeMap<String, u32>,
    max_jobs_per_user: Option<u32>,
    max_gpus_per_user: Option<u32>,
    max_submit_per_user: Option<u32>,
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|err| ConfigError::Read {
            file: file.clone(),
            reason: err.to_string(),
        })?;
        let mut config = Config::parse(&file, &text)?;
        config.path = Some(path.to_path_buf());
        Ok(config)
    }

    /// Parses gpoold.toml text; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Config, ConfigError> {
        let parsed: ConfigFile = toml_text::parse(file, text)?;
        for (field, missing) in [
            ("listen", parsed.listen.is_none()),
            ("state_dir", parsed.state_dir.is_none()),
        ] {
            if missing {
                return Err(toml_text::invalid(file, text, 0, format!("missing field `{field}`")));
            }
        }
        Config::from_file(file, text, parsed)
    }

    /// Parses a gpoold.toml read only for its policy (`gpool sim`): pools,
    /// teams, QoS classes, weights and prices. `listen` and `state_dir`
    /// may be left out.
    pub fn parse_policy(file: &str, text: &str) -> Result<Config, ConfigError> {
        let mut parsed: ConfigFile = toml_text::parse(file, text)?;
        parsed
            .listen
            .get_or_insert_with(|| toml::Spanned::new(0..0, "127.0.0.1:0".to_string()));
        parsed.state_dir.get_or_insert_with(|| PathBuf::from("."));
        Config::from_file(file, text, parsed)
    }
}
