//! agent.toml: where the controller is, what this node is called and carries.

use gpool_core::toml_text;
pub use gpool_core::toml_text::ConfigError;
use gpool_core::topology::{group_links, Link, Topology};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// agent.toml's defaults for a node's disk and its attempts' caps.
pub const DEFAULT_MIN_SPOOL_FREE: u64 = 1 << 30;
pub const DEFAULT_MAX_OUTPUT: u64 = 10 << 30;
pub const DEFAULT_KEEP_JOB_FILES: Duration = Duration::from_secs(7 * 24 * 3600);
/// 0: no pids limit. On cgroup v1 the pids hierarchy is one more cgroup
/// an attempt must join at start, about 12 ms (measured with compare.sh),
/// so it is on only where agent.toml asks.
pub const DEFAULT_MAX_PIDS: u64 = 0;

#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// gpoold's address, `host:port`.
    pub controller: String,
    pub node_name: String,
    pub labels: BTreeMap<String, String>,
    /// Job output and checkpoints.
    pub spool_dir: PathBuf,
    /// The lease, the journal of attempts and their exit records (default:
    /// `spool_dir`); a small filesystem of its own keeps them apart from
    /// job output.
    pub state_dir: PathBuf,
    /// The node drains itself while its spool has less free than this.
    pub min_spool_free: u64,
    /// The most an attempt's stdout or stderr may hold; past it the job
    /// is ended with that reason.
    pub max_output: u64,
    /// Job output files are removed this long after they were last
    /// written (their job ended).
    pub keep_job_files: Duration,
    /// The most processes and threads one attempt may have (its cgroup's
    /// pids.max, where cgroups are in use).
    pub max_pids: u64,
    /// CPUs and memory (bytes) jobs may be given on this node, as Slurm's
    /// `CPUs` and `RealMemory`: the host's own unless agent.toml says
    /// less (to keep some for the system).
    pub cpus: u32,
    pub memory_bytes: u64,
    pub heartbeat_interval: Duration,
    pub simulated_gpus: Vec<SimulatedGpu>,
    /// `simulate = true`: offer the simulated GPUs even where NVML finds
    /// real ones (otherwise the agent refuses to start there).
    pub simulate: bool,
    /// How the simulated GPUs are connected (empty: all `system`).
    pub simulated_topology: Topology,
    /// The cluster CA that gpoold's certificate must chain to; with it the
    /// link uses TLS.
    pub ca: Option<PathBuf>,
    /// This node's client certificate and key (`gpool admin cert issue
    /// --node NAME`).
    pub cert: Option<(PathBuf, PathBuf)>,
    /// The OCI runtime for jobs that name an image: podman (default) or
    /// docker, or a path to one.
    pub container_runtime: String,
    /// Each attempt in a cgroup of its own (device rules, nothing left
    /// behind), where the host offers one; `false` turns that off.
    pub cgroups: bool,
    /// Let a job with a memory limit use swap beyond it (cgroup v2's
    /// memory.swap.max is 0 otherwise).
    pub allow_swap: bool,
    /// `[health_check]`: run on a timer; a failure drains the node.
    pub health_program: Option<crate::gpu::health::HealthProgram>,
    /// The NVML library to load: `nvml_library` in agent.toml, else
    /// `GPOOL_NVML_LIBRARY`, else the driver's `libnvidia-ml.so.1`.
    pub nvml_library: PathBuf,
}

/// The driver's NVML, found through the dynamic loader's path.
pub const DEFAULT_NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// Where NVML comes from when agent.toml does not say: the environment,
/// else the driver's library.
pub fn nvml_library_from_env() -> PathBuf {
    std::env::var_os("GPOOL_NVML_LIBRARY")
        .filter(|path| !path.is_empty())
        .map_or_else(|| PathBuf::from(DEFAULT_NVML_LIBRARY), PathBuf::from)
}

impl AgentConfig {
    /// Reads the CA and the node's certificate and key for the link.
    pub fn client_tls(&self) -> anyhow::Result<gpool_proto::dial::ClientTls> {
        let read = |field: &str, path: &Path| {
            std::fs::read_to_string(path).map_err(|err| anyhow::anyhow!("{field} {}: {err}", path.display()))
        };
        Ok(gpool_proto::dial::ClientTls {
            ca_pem: self.ca.as_deref().map(|ca| read("ca", ca)).transpose()?,
            identity_pem: match &self.cert {
                Some((cert, key)) => Some((read("cert", cert)?, read("key", key)?)),
                None => None,
            },
        })
    }
}

/// `[simulated_topology]`: groups of simulated GPUs (by index) joined by
/// NVLink, or sharing a PCIe switch. Other pairs are `system`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SimulatedTopology {
    #[serde(default)]
    nvlink: Vec<Vec<u32>>,
    #[serde(default)]
    pcie_switch: Vec<Vec<u32>>,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimulatedGpu {
    pub model: String,
    pub memory_mib: u64,
    /// What the driver keeps of `memory_mib` (MiB; default 0), as NVML
    /// reports it on a real GPU: fractions never get it.
    #[serde(default)]
    pub reserved_mib: u64,
    #[serde(default = "one")]
    pub count: u32,
    /// What these GPUs' samples report (0 to 100; default 0: idle).
    #[serde(default)]
    pub utilization_pct: u32,
    /// Memory their samples report in use (MiB; default 0).
    #[serde(default)]
    pub memory_used_mib: u64,
    /// Volatile ECC error counts their samples report (default 0).
    #[serde(default)]
    pub ecc_corrected: u64,
    #[serde(default)]
    pub ecc_uncorrected: u64,
    /// MIG mode with these instances (`["3g.20gb", "2g.10gb"]`): the GPU is
    /// offered as these slices only.
    #[serde(default)]
    pub mig: Vec<String>,
    #[serde(default)]
    pub numa_node: Option<u32>,
    /// `9.0` for an H100.
    #[serde(default)]
    pub compute_capability: Option<String>,
}

fn one() -> u32 {
    1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentFile {
    controller: String,
    node_name: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    spool_dir: PathBuf,
    state_dir: Option<PathBuf>,
    min_spool_free: Option<toml::Spanned<String>>,
    max_output: Option<toml::Spanned<String>>,
    keep_job_files: Option<toml::Spanned<String>>,
    max_pids: Option<toml::Spanned<u64>>,
    cpus: Option<toml::Spanned<u32>>,
    memory: Option<toml::Spanned<String>>,
    heartbeat_interval: Option<toml::Spanned<String>>,
    #[serde(default)]
    simulated_gpu: Vec<SimulatedGpu>,
    simulate: Option<bool>,
    simulated_topology: Option<toml::Spanned<SimulatedTopology>>,
    ca: Option<PathBuf>,
    container_runtime: Option<toml::Spanned<String>>,
    cgroups: Option<bool>,
    allow_swap: Option<bool>,
    cert: Option<toml::Spanned<PathBuf>>,
    key: Option<toml::Spanned<PathBuf>>,
    health_check: Option<toml::Spanned<HealthCheckFile>>,
    nvml_library: Option<PathBuf>,
}

/// `[health_check]`: the operator's health program.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HealthCheckFile {
    program: PathBuf,
    interval: Option<String>,
    timeout: Option<String>,
}

impl AgentConfig {
    pub fn load(path: &Path) -> Result<AgentConfig, ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|err| ConfigError::Read {
            file: file.clone(),
            reason: err.to_string(),
        })?;
        AgentConfig::parse(&file, &text)
    }

    /// Parses agent.toml text; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<AgentConfig, ConfigError> {
        let invalid = |offset: usize, message: String| toml_text::invalid(file, text, offset, message);
        let parsed: AgentFile = toml_text::parse(file, text)?;
        let heartbeat_interval = heartbeat_interval_from_file(parsed.heartbeat_interval, &invalid)?;
        let min_spool_free = size_from_file(
            "min_spool_free",
            parsed.min_spool_free,
            DEFAULT_MIN_SPOOL_FREE,
            &invalid,
        )?;
        let max_output = size_from_file("max_output", parsed.max_output, DEFAULT_MAX_OUTPUT, &invalid)?;
        let keep_job_files = keep_job_files_from_file(parsed.keep_job_files, &invalid)?;
        let max_pids = max_pids_from_file(parsed.max_pids, &invalid)?;
        let cpus = cpus_from_file(parsed.cpus, &invalid)?;
        let memory_bytes = memory_from_file(parsed.memory, &invalid)?;
        check_labels(&parsed.labels, &invalid)?;
        check_simulated_gpus(&parsed.simulated_gpu, &invalid)?;
        let simulated_topology = topology_from_file(parsed.simulated_topology, &parsed.simulated_gpu, &invalid)?;
        let node_name = match parsed.node_name {
            Some(name) if !name.trim().is_empty() => name,
            _ => nix::unistd::gethostname()
                .ok()
                .and_then(|name| name.into_string().ok())
                .unwrap_or_else(|| "localhost".into()),
        };
        let cert = cert_from_file(parsed.cert, parsed.key, parsed.ca.is_some(), &invalid)?;
        let container_runtime = container_runtime_from_file(parsed.container_runtime, &invalid)?;
        let health_program = health_check_from_file(parsed.health_check, &invalid)?;
        Ok(AgentConfig {
            nvml_library: parsed.nvml_library.unwrap_or_else(nvml_library_from_env),
            health_program,
            cgroups: parsed.cgroups.unwrap_or(true),
            allow_swap: parsed.allow_swap.unwrap_or(false),
            container_runtime,
            ca: parsed.ca,
            cert,
            controller: parsed.controller,
            node_name,
            labels: parsed.labels,
            state_dir: parsed.state_dir.unwrap_or_else(|| parsed.spool_dir.clone()),
            spool_dir: parsed.spool_dir,
            min_spool_free,
            max_output,
            keep_job_files,
            max_pids,
            cpus,
            memory_bytes,
            heartbeat_interval,
            simulated_gpus: parsed.simulated_gpu,
            simulate: parsed.simulate.unwrap_or(false),
            simulated_topology,
        })
    }
}

/// `heartbeat_interval`: a duration above zero (default 2s).
fn heartbeat_interval_from_file(
    given: Option<toml::Spanned<String>>,
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<Duration, ConfigError> {
    Ok(match given {
        None => Duration::from_secs(2),
        Some(spanned) => humantime::parse_duration(spanned.get_ref())
            .ok()
            .filter(|interval| !interval.is_zero())
            .ok_or_else(|| {
                invalid(
                    spanned.span().start,
                    format!(
                        "heartbeat_interval: {:?} is not a duration such as 2s",
                        spanned.get_ref()
                    ),
                )
            })?,
    })
}

/// A size field such as `min_spool_free` (`10G`), in bytes; `default` where left out.
fn size_from_file(
    field: &str,
    given: Option<toml::Spanned<String>>,
    default: u64,
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<u64, ConfigError> {
    match given {
        None => Ok(default),
        Some(spanned) => gpool_core::spec::parse_size(spanned.get_ref())
            .map_err(|reason| invalid(spanned.span().start, format!("{field}: {reason}"))),
    }
}

/// `keep_job_files`: a duration above zero (default 7 days).
fn keep_job_files_from_file(
    given: Option<toml::Spanned<String>>,
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<Duration, ConfigError> {
    Ok(match given {
        None => DEFAULT_KEEP_JOB_FILES,
        Some(spanned) => humantime::parse_duration(spanned.get_ref())
            .ok()
            .filter(|keep| !keep.is_zero())
            .ok_or_else(|| {
                invalid(
                    spanned.span().start,
                    format!("keep_job_files: {:?} is not a duration such as 7d", spanned.get_ref()),
                )
            })?,
    })
}

/// `max_pids`: 0 (no limit) or at least 16.
fn max_pids_from_file(
    given: Option<toml::Spanned<u64>>,
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<u64, ConfigError> {
    Ok(match given {
        None => DEFAULT_MAX_PIDS,
        Some(spanned) if *spanned.get_ref() >= 16 || *spanned.get_ref() == 0 => spanned.into_inner(),
        Some(spanned) => {
            return Err(invalid(
                spanned.span().start,
                format!(
                    "max_pids: {} is too few for any job (at least 16; 0: no limit)",
                    spanned.get_ref()
                ),
            ))
        }
    })
}

/// `cpus`: at least 1; the host's own where left out.
fn cpus_from_file(
    given: Option<toml::Spanned<u32>>,
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<u32, ConfigError> {
    Ok(match given {
        None => crate::host::cpus(),
        Some(spanned) if *spanned.get_ref() > 0 => spanned.into_inner(),
        Some(spanned) => {
            return Err(invalid(
                spanned.span().start,
                "cpus: 0 would leave jobs none; leave it out for the host's own".to_string(),
            ))
        }
    })
}

/// `memory`: a size above zero, in bytes; the host's own where left out.
fn memory_from_file(
    given: Option<toml::Spanned<String>>,
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<u64, ConfigError> {
    Ok(match given {
        None => crate::host::memory_bytes(),
        Some(spanned) => match size_from_file("memory", Some(spanned.clone()), 0, invalid)? {
            0 => {
                return Err(invalid(
                    spanned.span().start,
                    "memory: 0 would leave jobs none; leave it out for the host's own".to_string(),
                ))
            }
            bytes => bytes,
        },
    })
}

/// `[labels]`: at most 64, each key 1 to 63 bytes and each value at most 253.
fn check_labels(
    labels: &BTreeMap<String, String>,
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<(), ConfigError> {
    // What gpoold takes in a Register.
    if labels.len() > 64 {
        return Err(invalid(0, format!("labels: {} labels, more than 64", labels.len())));
    }
    if let Some((key, _)) = labels
        .iter()
        .find(|(key, value)| key.is_empty() || key.len() > 63 || value.len() > 253)
    {
        return Err(invalid(
            0,
            format!("labels: {key:.63?} needs a key of 1 to 63 bytes and a value of at most 253"),
        ));
    }
    Ok(())
}

/// Each `[[simulated_gpu]]`: samples in range, MIG profiles known, a name and a count.
fn check_simulated_gpus(
    gpus: &[SimulatedGpu],
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<(), ConfigError> {
    for gpu in gpus {
        if gpu.utilization_pct > 100 || gpu.memory_used_mib > gpu.memory_mib {
            return Err(invalid(
                0,
                format!(
                    "simulated_gpu: model {:?}: utilization_pct is at most 100, memory_used_mib at most memory_mib",
                    gpu.model
                ),
            ));
        }
        if let Some(bad) = gpu
            .mig
            .iter()
            .find(|profile| crate::gpu::simulated::mig_memory_mib(profile).is_none())
        {
            return Err(invalid(
                0,
                format!(
                    "simulated_gpu: model {:?}: mig: {bad:?} is not a MIG profile such as 3g.20gb",
                    gpu.model
                ),
            ));
        }
        if gpu.count == 0 || gpu.model.trim().is_empty() {
            return Err(invalid(
                0,
                format!(
                    "simulated_gpu: model {:?} needs a name and a count of at least 1",
                    gpu.model
                ),
            ));
        }
    }
    Ok(())
}

/// `[simulated_topology]` as a `Topology`, each index one of the simulated GPUs.
fn topology_from_file(
    given: Option<toml::Spanned<SimulatedTopology>>,
    gpus: &[SimulatedGpu],
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<Topology, ConfigError> {
    let n_simulated: u32 = gpus.iter().map(|gpu| gpu.count).sum();
    Ok(match given {
        None => Topology::default(),
        Some(spanned) => {
            let declared = spanned.get_ref();
            for (field, groups) in [("nvlink", &declared.nvlink), ("pcie_switch", &declared.pcie_switch)] {
                if let Some(bad) = groups.iter().flatten().find(|index| **index >= n_simulated) {
                    return Err(invalid(
                        spanned.span().start,
                        format!(
                            "simulated_topology.{field}: GPU {bad} is not one of the {n_simulated} simulated GPUs (indices from 0)"
                        ),
                    ));
                }
            }
            let mut links = group_links(&declared.nvlink, Link::Nvlink);
            links.extend(group_links(&declared.pcie_switch, Link::PcieSwitch));
            Topology::new(links)
        }
    })
}

/// `cert` and `key`: both or neither, and with them a `ca`.
fn cert_from_file(
    cert: Option<toml::Spanned<PathBuf>>,
    key: Option<toml::Spanned<PathBuf>>,
    has_ca: bool,
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<Option<(PathBuf, PathBuf)>, ConfigError> {
    let cert = match (cert, key) {
        (Some(cert), Some(key)) => Some((cert.into_inner(), key.into_inner())),
        (None, None) => None,
        (Some(spanned), None) | (None, Some(spanned)) => {
            return Err(invalid(
                spanned.span().start,
                "cert, key: give both the node's certificate and its key, or neither".into(),
            ))
        }
    };
    if cert.is_some() && !has_ca {
        return Err(invalid(
            0,
            "ca: a client certificate needs the cluster CA to check gpoold's".into(),
        ));
    }
    Ok(cert)
}

/// `container_runtime`: podman or docker, or a path to one (default podman).
fn container_runtime_from_file(
    given: Option<toml::Spanned<String>>,
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<String, ConfigError> {
    Ok(match given {
        None => "podman".to_string(),
        Some(spanned) => {
            let runtime = spanned.get_ref();
            let name = Path::new(runtime)
                .file_name()
                .and_then(|name| name.to_str())
                .unwrap_or("");
            if !matches!(name, "podman" | "docker") {
                return Err(invalid(
                    spanned.span().start,
                    format!("container_runtime: {runtime:?} is not podman or docker (or a path to one)"),
                ));
            }
            spanned.into_inner()
        }
    })
}

/// `[health_check]`: an absolute program path, then its interval and timeout.
fn health_check_from_file(
    given: Option<toml::Spanned<HealthCheckFile>>,
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<Option<crate::gpu::health::HealthProgram>, ConfigError> {
    Ok(match given {
        None => None,
        Some(spanned) => {
            let offset = spanned.span().start;
            let declared = spanned.into_inner();
            let duration = |field: &str, given: &Option<String>, default: Duration| match given {
                None => Ok(default),
                Some(text) => humantime::parse_duration(text)
                    .ok()
                    .filter(|d| !d.is_zero())
                    .ok_or_else(|| {
                        invalid(
                            offset,
                            format!("health_check.{field}: {text:?} is not a duration such as 30s"),
                        )
                    }),
            };
            if !declared.program.is_absolute() {
                return Err(invalid(
                    offset,
                    format!(
                        "health_check.program: {} is not an absolute path",
                        declared.program.display()
                    ),
                ));
            }
            Some(crate::gpu::health::HealthProgram {
                interval: duration("interval", &declared.interval, Duration::from_secs(60))?,
                timeout: duration("timeout", &declared.timeout, Duration::from_secs(60))?,
                program: declared.program,
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn example_config_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/agent.toml");
        let config = AgentConfig::load(&path).unwrap_or_else(|err| panic!("{err}"));
        // A real node offers its real GPUs: the shipped file simulates none.
        assert!(config.simulated_gpus.is_empty() && !config.simulate);
        // Its commented simulated tables, uncommented, are a working
        // example for a machine with no GPU.
        let text = std::fs::read_to_string(&path).unwrap();
        let from = text.find("# [[simulated_gpu]]").expect("the simulated example");
        let example: String = text[from..]
            .lines()
            .map(|line| {
                line.strip_prefix("# ")
                    .filter(|rest| !rest.contains(' ') || rest.contains(" = "))
            })
            .map(|line| line.unwrap_or(""))
            .collect::<Vec<_>>()
            .join("\n");
        let uncommented = AgentConfig::parse("agent.toml", &format!("{}\n{example}", &text[..from]))
            .unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(uncommented.simulated_gpus.iter().map(|g| g.count).sum::<u32>(), 8);
    }

    #[test]
    fn errors_name_file_line_and_field() {
        let text = "controller = \"127.0.0.1:1\"\nspool_dir = \"/x\"\nheartbeat_interval = \"often\"\n";
        let err = AgentConfig::parse("a.toml", text).unwrap_err();
        assert!(
            err.to_string().starts_with("a.toml:3: heartbeat_interval: \"often\""),
            "{err}"
        );
        let err = AgentConfig::parse("a.toml", "controller = \"x\"\nspool_dir = \"/x\"\ngpus = 3\n").unwrap_err();
        assert!(err.to_string().starts_with("a.toml:3: unknown field `gpus`"), "{err}");
        let text = "controller = \"x\"\nspool_dir = \"/x\"\n[[simulated_gpu]]\nmodel = \"l4\"\nmemory_mib = 1\ncount = 2\n\n[simulated_topology]\nnvlink = [[0, 2]]\n";
        let err = AgentConfig::parse("a.toml", text).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("a.toml:8: simulated_topology.nvlink: GPU 2 is not one of the 2 simulated GPUs"),
            "{err}"
        );
    }
}
