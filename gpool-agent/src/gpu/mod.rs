//! GPU discovery: NVML where the driver is there, else the simulated GPUs of
//! agent.toml. Both produce the same `Gpu` values.

pub mod health;
pub mod nvml;
pub mod simulated;

use crate::config::AgentConfig;
use gpool_core::model::{Gpu, GpuModel};
use gpool_core::topology::Topology;

/// What NVML reported for one device (a whole GPU, or a MIG slice of
/// one), before it becomes a `Gpu`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RawDevice {
    pub index: u32,
    pub uuid: String,
    pub name: String,
    pub memory_bytes: u64,
    /// What the driver keeps of it (NVML's reserved memory).
    pub reserved_bytes: u64,
    pub pci_bus_id: String,
    pub mig_parent: Option<u32>,
    pub numa_node: Option<u32>,
    pub compute_capability: String,
}

/// How a job names each GPU of the node: in `CUDA_VISIBLE_DEVICES` (a
/// whole GPU by its index, a MIG slice by its UUID), to a container runtime
/// (the same names, as CDI has them), and in device cgroup rules (the
/// device node's minor: a slice's is its parent's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuDevices(std::collections::BTreeMap<u32, (String, u32)>);

impl GpuDevices {
    pub fn of(gpus: &[Gpu]) -> GpuDevices {
        GpuDevices(
            gpus.iter()
                .map(|gpu| {
                    let named = match gpu.mig_parent {
                        Some(parent) => (gpu.uuid.clone(), parent),
                        None => (gpu.index.to_string(), gpu.index),
                    };
                    (gpu.index, named)
                })
                .collect(),
        )
    }

    /// The names of `indices`, in their order (an unknown index as itself).
    pub fn names(&self, indices: &[u32]) -> Vec<String> {
        indices
            .iter()
            .map(|index| {
                self.0
                    .get(index)
                    .map_or_else(|| index.to_string(), |(name, _)| name.clone())
            })
            .collect()
    }

    /// The device minors of `indices`, each once.
    pub fn minors(&self, indices: &[u32]) -> Vec<u32> {
        let mut minors: Vec<u32> = indices
            .iter()
            .map(|index| self.0.get(index).map_or(*index, |(_, minor)| *minor))
            .collect();
        minors.sort_unstable();
        minors.dedup();
        minors
    }

    /// Every device minor of the node.
    pub fn all_minors(&self) -> Vec<u32> {
        let indices: Vec<u32> = self.0.keys().copied().collect();
        self.minors(&indices)
    }
}

/// Where the node's GPUs came from, for the agent's start-up message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Simulated,
    Nvml,
    None,
}

/// What the agent found on its node.
pub struct Discovered {
    pub gpus: Vec<Gpu>,
    pub topology: Topology,
    pub source: Source,
    /// Facts for the node's labels (driver and CUDA versions, MIG).
    pub labels: std::collections::BTreeMap<String, String>,
}

/// The label a node of simulated GPUs carries (`gpool nodes` marks them).
pub const SIMULATED_LABEL: &str = "gpool.simulated";

/// The node's GPUs and how they are connected: simulated ones when
/// agent.toml declares any (tests and dev machines), else NVML's (the
/// driver's library, or the one agent.toml names), else none. Refuses
/// simulated GPUs on a node where NVML finds real ones, unless agent.toml
/// says `simulate = true`: such a node would be given jobs for GPUs that
/// do not exist.
pub fn discover(config: &AgentConfig) -> Result<Discovered, String> {
    let (gpus, topology, source, mut labels) = if !config.simulated_gpus.is_empty() {
        if !config.simulate {
            check_no_real_gpus(config)?;
        }
        let labels = [(SIMULATED_LABEL.to_string(), "true".to_string())].into();
        (
            simulated::gpus(&config.node_name, &config.simulated_gpus),
            config.simulated_topology.clone(),
            Source::Simulated,
            labels,
        )
    } else {
        match nvml::open(&config.nvml_library).and_then(|nvml| Ok((nvml::devices(&nvml)?, nvml))) {
            Ok((devices, nvml)) => {
                let topology = nvml::topology(&nvml, &devices).unwrap_or_else(|err| {
                    tracing::warn!("cannot read the GPU topology from NVML ({err}); placing without it");
                    Topology::default()
                });
                let gpus = devices.iter().map(gpu_from_raw).collect();
                (gpus, topology, Source::Nvml, nvml::node_labels(&nvml))
            }
            Err(err) => {
                tracing::warn!(
                    "no NVML ({}: {err}) and no [[simulated_gpu]] in the config: this node offers no GPU",
                    config.nvml_library.display()
                );
                (Vec::new(), Topology::default(), Source::None, Default::default())
            }
        }
    };
    if gpus.iter().any(|gpu: &Gpu| gpu.mig_parent.is_some()) {
        labels.insert("nvidia.mig".into(), "enabled".into());
    }
    Ok(Discovered {
        gpus,
        topology,
        source,
        labels,
    })
}

/// Refuses `[[simulated_gpu]]` where NVML finds real GPUs.
fn check_no_real_gpus(config: &AgentConfig) -> Result<(), String> {
    let n_real = nvml::open(&config.nvml_library)
        .and_then(|nvml| nvml::devices(&nvml))
        .map_or(0, |devices| devices.len());
    if n_real == 0 {
        return Ok(());
    }
    Err(format!(
        "NVML ({}) finds {n_real} real GPUs on this node, and agent.toml declares [[simulated_gpu]]: \
         remove the [[simulated_gpu]] tables to offer the real GPUs, or set simulate = true to offer \
         the simulated ones instead",
        config.nvml_library.display()
    ))
}

/// What `gpool-agent --discover` prints: what this node would register
/// (its GPUs, their links and its labels) and one heartbeat's readings,
/// with how long each step took, as JSON.
pub fn discovery_report(config: &AgentConfig) -> Result<serde_json::Value, String> {
    let started = std::time::Instant::now();
    let found = discover(config)?;
    let discover_ms = started.elapsed().as_secs_f64() * 1000.0;
    let mut links = Vec::new();
    for a in &found.gpus {
        for b in found.gpus.iter().filter(|b| b.index > a.index) {
            links.push(serde_json::json!([
                a.index,
                b.index,
                format!("{:?}", found.topology.link(a.index, b.index))
            ]));
        }
    }
    let started = std::time::Instant::now();
    let reader = Reader::new(found.source, &config.simulated_gpus, &config.nvml_library);
    let samples: Vec<serde_json::Value> = reader
        .read()
        .iter()
        .map(|s| {
            serde_json::json!({
                "index": s.index,
                "utilization_pct": s.utilization_pct,
                "memory_used_mib": s.memory_used_mib,
                "temperature_c": s.temperature_c,
                "power_w": s.power_w,
                "ecc_corrected": s.ecc_corrected,
                "ecc_uncorrected": s.ecc_uncorrected,
                "sm_clock_mhz": s.sm_clock_mhz,
                "remap_pending": s.remap_pending,
                "remap_failure": s.remap_failure,
            })
        })
        .collect();
    let sample_ms = started.elapsed().as_secs_f64() * 1000.0;
    Ok(serde_json::json!({
        "source": format!("{:?}", found.source).to_ascii_lowercase(),
        "gpus": found.gpus,
        "links": links,
        "labels": found.labels,
        "samples": samples,
        "discover_ms": discover_ms,
        "sample_ms": sample_ms,
    }))
}

/// Reads per-GPU samples: from NVML for real GPUs, the values agent.toml
/// declares for simulated ones.
pub enum Reader {
    Nvml(Box<nvml_wrapper::Nvml>),
    /// Each GPU's index and what agent.toml says its samples report.
    Simulated(Vec<(u32, SimulatedLoad)>),
}

/// What a simulated GPU's samples report.
#[derive(Debug, Clone, Copy, Default)]
pub struct SimulatedLoad {
    pub utilization_pct: u32,
    pub memory_used_mib: u64,
    pub ecc_corrected: u64,
    pub ecc_uncorrected: u64,
}

impl Reader {
    /// Samples are of whole GPUs (a MIG slice's are its parent's), by
    /// their physical index: `declared` are agent.toml's simulated GPUs, in
    /// the order that gave them theirs.
    pub fn new(source: Source, declared: &[crate::config::SimulatedGpu], library: &std::path::Path) -> Reader {
        match source {
            Source::Nvml => match nvml::open(library) {
                Ok(nvml) => Reader::Nvml(Box::new(nvml)),
                Err(_) => Reader::Simulated(Vec::new()),
            },
            Source::Simulated | Source::None => {
                let loads = declared.iter().flat_map(|entry| {
                    (0..entry.count).map(|_| SimulatedLoad {
                        utilization_pct: entry.utilization_pct,
                        memory_used_mib: entry.memory_used_mib,
                        ecc_corrected: entry.ecc_corrected,
                        ecc_uncorrected: entry.ecc_uncorrected,
                    })
                });
                Reader::Simulated((0..).zip(loads).collect())
            }
        }
    }

    /// The indices of the GPUs to read.
    pub fn indices(&self) -> Vec<u32> {
        match self {
            Reader::Nvml(nvml) => (0..nvml.device_count().unwrap_or(0)).collect(),
            Reader::Simulated(gpus) => gpus.iter().map(|(index, _)| *index).collect(),
        }
    }

    /// The readings of GPU `index`; `None` when it cannot be read.
    pub fn read_one(&self, index: u32) -> Option<gpool_proto::pb::GpuSample> {
        match self {
            Reader::Nvml(nvml) => nvml::sample(nvml, index),
            Reader::Simulated(gpus) => {
                let (_, load) = gpus.iter().find(|(at, _)| *at == index)?;
                Some(gpool_proto::pb::GpuSample {
                    index,
                    utilization_pct: load.utilization_pct,
                    memory_used_mib: load.memory_used_mib,
                    temperature_c: 35,
                    // An idle H100 draws about 70 W, a busy one up to 700.
                    power_w: 70 + 6 * load.utilization_pct,
                    ecc_corrected: load.ecc_corrected,
                    ecc_uncorrected: load.ecc_uncorrected,
                    sm_clock_mhz: 1_980,
                    ..gpool_proto::pb::GpuSample::default()
                })
            }
        }
    }

    /// Every GPU's readings, one after the other.
    pub fn read(&self) -> Vec<gpool_proto::pb::GpuSample> {
        self.indices()
            .into_iter()
            .filter_map(|index| self.read_one(index))
            .collect()
    }
}

/// Reads samples on a thread of its own, every `every`, so that a GPU
/// whose NVML calls hang (one fallen off the bus) never holds up the
/// link's heartbeats, and with them the node's lease and its jobs. A read
/// of one GPU that takes longer than `CALL_DEADLINE` leaves that GPU
/// behind: a new thread reads the others (the GPU then goes missing from
/// the readings, and gpoold takes it out of service), and the GPU is read
/// again once its call returns.
pub struct Sampler {
    shared: std::sync::Arc<SamplerShared>,
    every: std::time::Duration,
}

struct SamplerShared {
    reader: Reader,
    readings: std::sync::Mutex<Readings>,
}

#[derive(Default)]
struct Readings {
    samples: Vec<gpool_proto::pb::GpuSample>,
    /// When the latest round of reads ended.
    read_at: Option<std::time::Instant>,
    /// The read under way: of which GPU (none: listing them), since when.
    reading: Option<(Option<u32>, std::time::Instant)>,
    /// Bumped when a thread is left behind; only the thread of the
    /// current generation reads on.
    generation: u64,
    /// GPUs whose read hangs: left out until their call returns.
    left_behind: std::collections::BTreeSet<u32>,
}

/// What the link sends of the latest readings.
pub struct Latest {
    /// The latest round of reads, if it is recent; else none.
    pub samples: Vec<gpool_proto::pb::GpuSample>,
    /// Why readings stopped, once listing the GPUs has been under way for
    /// longer than `STUCK_AFTER`; empty otherwise.
    pub stuck: String,
}

/// A read of one GPU under way this long leaves it behind (NVML answers
/// in milliseconds).
pub const CALL_DEADLINE: std::time::Duration = std::time::Duration::from_secs(5);
/// Listing the GPUs under way this long: every reading has stopped.
pub const STUCK_AFTER: std::time::Duration = std::time::Duration::from_secs(10);

impl Sampler {
    pub fn start(reader: Reader, every: std::time::Duration) -> Sampler {
        let shared = std::sync::Arc::new(SamplerShared {
            reader,
            readings: std::sync::Mutex::new(Readings::default()),
        });
        spawn_reads(shared.clone(), 0, every);
        Sampler { shared, every }
    }

    /// The latest readings, never waiting for a read under way; leaves a
    /// GPU whose read hangs behind.
    pub fn latest(&self) -> Latest {
        let mut readings = self.shared.readings.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((Some(gpu), since)) = readings.reading {
            if since.elapsed() >= CALL_DEADLINE {
                tracing::warn!(
                    gpu,
                    "NVML has not answered a read of this GPU for {} s: reading the others without it",
                    since.elapsed().as_secs()
                );
                readings.left_behind.insert(gpu);
                readings.generation += 1;
                readings.reading = None;
                spawn_reads(self.shared.clone(), readings.generation, self.every);
            }
        }
        let fresh_for = self.every * 3 + CALL_DEADLINE;
        let samples = match readings.read_at {
            Some(at) if at.elapsed() <= fresh_for => readings.samples.clone(),
            _ => Vec::new(),
        };
        let stuck = match readings.reading {
            Some((None, since)) if since.elapsed() >= STUCK_AFTER => format!(
                "GPU readings have not come back for {} s (NVML does not answer)",
                since.elapsed().as_secs()
            ),
            _ => String::new(),
        };
        Latest { samples, stuck }
    }
}

/// The reading thread of `generation`: reads every GPU not left behind,
/// every `every`, until a newer generation replaces it.
fn spawn_reads(shared: std::sync::Arc<SamplerShared>, generation: u64, every: std::time::Duration) {
    let spawned = std::thread::Builder::new()
        .name(format!("gpu-sampler-{generation}"))
        .spawn(move || loop {
            let current = |shared: &SamplerShared| {
                let readings = shared.readings.lock().unwrap_or_else(|p| p.into_inner());
                readings.generation == generation
            };
            let mark = |gpu: Option<u32>| {
                let mut readings = shared.readings.lock().unwrap_or_else(|p| p.into_inner());
                if readings.generation == generation {
                    readings.reading = Some((gpu, std::time::Instant::now()));
                }
            };
            mark(None);
            let indices = shared.reader.indices();
            let mut samples = Vec::with_capacity(indices.len());
            for index in indices {
                let left_behind = shared
                    .readings
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .left_behind
                    .contains(&index);
                if left_behind {
                    continue;
                }
                mark(Some(index));
                let sample = shared.reader.read_one(index);
                if !current(&shared) {
                    // Left behind on this GPU: it answered at last, so the
                    // current thread reads it again from its next round.
                    let mut readings = shared.readings.lock().unwrap_or_else(|p| p.into_inner());
                    readings.left_behind.remove(&index);
                    tracing::info!(gpu = index, "NVML answers a read of this GPU again");
                    return;
                }
                samples.extend(sample);
            }
            {
                let mut readings = shared.readings.lock().unwrap_or_else(|p| p.into_inner());
                if readings.generation != generation {
                    return;
                }
                readings.samples = samples;
                readings.read_at = Some(std::time::Instant::now());
                readings.reading = None;
            }
            std::thread::sleep(every);
        });
    if let Err(err) = spawned {
        tracing::warn!("cannot start a GPU reading thread: {err}; heartbeats carry no readings");
    }
}

/// `NVIDIA H100 80GB HBM3` -> `h100`; `NVIDIA A100-SXM4-40GB` -> `a100-40gb`;
/// `NVIDIA L4` -> `l4`; a MIG device `NVIDIA H100 80GB HBM3 MIG 1g.10gb` ->
/// `h100-1g.10gb`. Pure, so tested on recorded names.
pub fn model_from_name(name: &str) -> GpuModel {
    let lower = name.to_ascii_lowercase();
    let words: Vec<&str> = lower
        .split(|c: char| c.is_whitespace() || c == '-')
        .filter(|w| !w.is_empty() && *w != "nvidia" && *w != "tesla")
        .collect();
    let Some(family) = words.first() else {
        return GpuModel::new("unknown");
    };
    if let Some(mig_idx) = words.iter().position(|w| *w == "mig") {
        if let Some(profile) = words.get(mig_idx + 1) {
            return GpuModel::new(&format!("{family}-{profile}"));
        }
    }
    // The A100 comes in two memory sizes that jobs must tell apart.
    if *family == "a100" {
        if let Some(size) = words
            .iter()
            .find(|w| w.ends_with("gb") && w[..w.len() - 2].parse::<u32>().is_ok())
        {
            return GpuModel::new(&format!("a100-{size}"));
        }
    }
    GpuModel::new(family)
}

pub fn gpu_from_raw(raw: &RawDevice) -> Gpu {
    Gpu {
        index: raw.index,
        uuid: raw.uuid.clone(),
        model: model_from_name(&raw.name),
        memory_mib: raw.memory_bytes / (1024 * 1024),
        reserved_mib: raw.reserved_bytes.div_ceil(1024 * 1024),
        pci_bus_id: raw.pci_bus_id.clone(),
        mig_parent: raw.mig_parent,
        numa_node: raw.numa_node,
        compute_capability: raw.compute_capability.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_from_nvml() {
        for (name, model) in [
            ("NVIDIA H100 80GB HBM3", "h100"),
            ("NVIDIA H200", "h200"),
            ("NVIDIA A100-SXM4-40GB", "a100-40gb"),
            ("NVIDIA A100 80GB PCIe", "a100-80gb"),
            ("NVIDIA L4", "l4"),
            ("Tesla V100-SXM2-16GB", "v100"),
            ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "h100-1g.10gb"),
            ("", "unknown"),
        ] {
            assert_eq!(model_from_name(name).as_str(), model, "{name}");
        }
    }

    #[test]
    fn raw_devices_become_gpus() {
        let raw = RawDevice {
            index: 3,
            uuid: "GPU-abc".into(),
            name: "NVIDIA H100 80GB HBM3".into(),
            memory_bytes: 85_520_809_984,
            pci_bus_id: "00000000:19:00.0".into(),
            ..RawDevice::default()
        };
        let gpu = gpu_from_raw(&raw);
        assert_eq!((gpu.index, gpu.memory_mib, gpu.model.as_str()), (3, 81_559, "h100"));
    }
}
