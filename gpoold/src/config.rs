//! gpoold.toml, and the settings of a run (from the file or from `--dev`).

use gpool_core::model::PoolDef;
use gpool_core::sched::Policy;
use gpool_core::toml_text;
pub use gpool_core::toml_text::ConfigError;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long an agent may be silent before its node is down.
pub const DEFAULT_NODE_TIMEOUT: Duration = Duration::from_secs(30);

/// Everything a run of gpoold needs to know.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: SocketAddr,
    pub state_dir: PathBuf,
    /// Dev mode: loopback only, no TLS, the caller's user name is trusted.
    pub dev: bool,
    pub policy: Policy,
    /// Users who may cancel anyone's job and drain or resume nodes.
    pub admins: Vec<String>,
    /// A node whose agent is silent this long is down.
    pub node_timeout: Duration,
    /// Dev mode: agents to run inside gpoold, linked over loopback.
    pub dev_agents: Option<DevAgents>,
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
    listen: toml::Spanned<String>,
    state_dir: PathBuf,
    #[serde(default)]
    default_pool: Option<toml::Spanned<String>>,
    #[serde(default)]
    admins: Vec<String>,
    #[serde(default)]
    node_timeout: Option<toml::Spanned<String>>,
    #[serde(default)]
    pool: Vec<PoolFile>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolFile {
    name: String,
    #[serde(default)]
    selector: BTreeMap<String, String>,
}

impl Config {
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|err| ConfigError::Read {
            file: file.clone(),
            reason: err.to_string(),
        })?;
        Config::parse(&file, &text)
    }

    /// Parses gpoold.toml text; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Config, ConfigError> {
        let invalid = |offset: usize, message: String| toml_text::invalid(file, text, offset, message);
        let parsed: ConfigFile = toml_text::parse(file, text)?;
        let listen = parsed.listen.get_ref().parse::<SocketAddr>().map_err(|err| {
            invalid(
                parsed.listen.span().start,
                format!("listen: {:?} is not host:port: {err}", parsed.listen.get_ref()),
            )
        })?;
        let mut seen = std::collections::HashSet::new();
        for pool in &parsed.pool {
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
        let mut policy = Policy::default();
        if !parsed.pool.is_empty() {
            policy.pools = parsed
                .pool
                .into_iter()
                .map(|pool| PoolDef {
                    name: pool.name,
                    selector: pool.selector,
                })
                .collect();
            policy.default_pool = policy.pools[0].name.clone();
        }
        if let Some(default_pool) = parsed.default_pool {
            if policy.pools.iter().all(|p| &p.name != default_pool.get_ref()) {
                return Err(invalid(
                    default_pool.span().start,
                    format!("default_pool: no [[pool]] is named {:?}", default_pool.get_ref()),
                ));
            }
            policy.default_pool = default_pool.into_inner();
        }
        let node_timeout = match parsed.node_timeout {
            None => DEFAULT_NODE_TIMEOUT,
            Some(text) => humantime::parse_duration(text.get_ref())
                .ok()
                .filter(|timeout| !timeout.is_zero())
                .ok_or_else(|| {
                    invalid(
                        text.span().start,
                        format!("node_timeout: {:?} is not a duration such as 30s", text.get_ref()),
                    )
                })?,
        };
        Ok(Config {
            listen,
            state_dir: parsed.state_dir,
            dev: false,
            policy,
            admins: parsed.admins,
            node_timeout,
            dev_agents: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_example_config_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config");
        let path = dir.join("gpoold.toml");
        let config = Config::load(&path).unwrap_or_else(|err| panic!("{err}"));
        assert!(config.policy.pool("").is_some());
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let err = Config::parse("g.toml", "listen = \"127.0.0.1:1\"\nstate_dir = \"/x\"\nlisen = 3\n").unwrap_err();
        assert_eq!(
            err.to_string().split(',').next().unwrap(),
            "g.toml:3: unknown field `lisen`"
        );
        let err = Config::parse("g.toml", "state_dir = \"/x\"\nlisten = \"nowhere\"\n").unwrap_err();
        assert!(
            err.to_string()
                .starts_with("g.toml:2: listen: \"nowhere\" is not host:port"),
            "{err}"
        );
        let err = Config::parse(
            "g.toml",
            "listen = \"127.0.0.1:1\"\nstate_dir = \"/x\"\ndefault_pool = \"big\"\n",
        )
        .unwrap_err();
        assert_eq!(err.to_string(), "g.toml:3: default_pool: no [[pool]] is named \"big\"");
    }
}
