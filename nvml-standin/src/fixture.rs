//! The GPUs a stand-in library offers, read from a TOML file, and the
//! rules that turn them into NVML's answers: MIG slices, the PCIe and
//! NVLink topology, Xid events due, and faults to inject.

use serde::Deserialize;

/// NVML's return codes (nvml.h) that the stand-in gives.
pub mod code {
    pub const SUCCESS: u32 = 0;
    pub const UNINITIALIZED: u32 = 1;
    pub const INVALID_ARGUMENT: u32 = 2;
    pub const NOT_SUPPORTED: u32 = 3;
    pub const NOT_FOUND: u32 = 6;
    pub const INSUFFICIENT_SIZE: u32 = 7;
    pub const TIMEOUT: u32 = 10;
    pub const FUNCTION_NOT_FOUND: u32 = 13;
    pub const GPU_IS_LOST: u32 = 15;
    pub const UNKNOWN: u32 = 999;
}

/// NVML's topology levels (nvmlGpuTopologyLevel_t).
pub mod level {
    pub const SINGLE: u32 = 10;
    pub const HOSTBRIDGE: u32 = 30;
    pub const NODE: u32 = 40;
    pub const SYSTEM: u32 = 50;
}

/// A node's GPUs and what happens to them, as the file describes them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fixture {
    #[serde(default = "default_driver")]
    pub driver_version: String,
    /// As nvmlSystemGetCudaDriverVersion gives it: 12040 is CUDA 12.4.
    #[serde(default = "default_cuda")]
    pub cuda_version: i32,
    /// Calls this driver is too old to have: they answer
    /// NVML_ERROR_FUNCTION_NOT_FOUND.
    #[serde(default)]
    pub missing: Vec<String>,
    #[serde(default)]
    pub gpu: Vec<Gpu>,
    /// Xid events the event sets deliver.
    #[serde(default)]
    pub xid: Vec<Xid>,
    /// Calls that fail or hang.
    #[serde(default)]
    pub fault: Vec<Fault>,
}

fn default_driver() -> String {
    "550.54.15".into()
}

fn default_cuda() -> i32 {
    12040
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Gpu {
    /// As NVML names it: "NVIDIA H100 80GB HBM3".
    pub name: String,
    pub uuid: String,
    /// "00000000:18:00.0".
    pub pci_bus_id: String,
    pub memory_mib: u64,
    #[serde(default)]
    pub memory_used_mib: u64,
    /// What the driver keeps of `memory_mib` (NVML's `reserved`).
    #[serde(default)]
    pub memory_reserved_mib: u64,
    /// The NUMA node its PCIe slot hangs off (its memory affinity).
    #[serde(default)]
    pub numa_node: Option<u32>,
    /// "9.0".
    #[serde(default = "default_cc")]
    pub compute_capability: String,
    #[serde(default = "default_temperature")]
    pub temperature_c: u32,
    #[serde(default = "default_power")]
    pub power_w: u32,
    #[serde(default)]
    pub utilization_pct: u32,
    #[serde(default = "default_clock")]
    pub sm_clock_mhz: u32,
    #[serde(default)]
    pub ecc_corrected: u64,
    #[serde(default)]
    pub ecc_uncorrected: u64,
    /// Row remapping; `None`: a GPU without it (older than A100).
    #[serde(default)]
    pub remapped_rows: Option<RemappedRows>,
    #[serde(default)]
    pub retired_pages_pending: bool,
    /// MIG mode with these instances ("3g.40gb"); empty: MIG off.
    #[serde(default)]
    pub mig: Vec<String>,
    /// Direct NVLinks, one per peer GPU index (a link each).
    #[serde(default)]
    pub nvlink: Vec<u32>,
    /// Links to the node's NVSwitch fabric (a DGX): all active.
    #[serde(default)]
    pub nvswitch_links: u32,
    /// GPUs with the same switch share a PCIe switch.
    #[serde(default)]
    pub pcie_switch: Option<u32>,
}

fn default_cc() -> String {
    "8.0".into()
}

fn default_temperature() -> u32 {
    35
}

fn default_power() -> u32 {
    70
}

fn default_clock() -> u32 {
    1_980
}

#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemappedRows {
    #[serde(default)]
    pub corrected: u32,
    #[serde(default)]
    pub uncorrected: u32,
    #[serde(default)]
    pub pending: bool,
    #[serde(default)]
    pub failed: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Xid {
    pub gpu: u32,
    pub xid: u64,
    /// Due this long after the library was first initialised.
    #[serde(default)]
    pub after_ms: u64,
}

/// A call that fails with `error`, or hangs for `hang_ms` first (then
/// answers as usual, or with `error`), between `after_ms` and `until_ms`
/// after the first init.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// A function's name, or "*" for every call on `gpu`.
    pub call: String,
    /// Only calls on this GPU (and its MIG slices); none: every call.
    #[serde(default)]
    pub gpu: Option<u32>,
    #[serde(default)]
    pub error: Option<u32>,
    #[serde(default)]
    pub hang_ms: Option<u64>,
    #[serde(default)]
    pub after_ms: u64,
    #[serde(default)]
    pub until_ms: Option<u64>,
}

impl Fixture {
    pub fn load(path: &str) -> Result<Fixture, String> {
        let text = std::fs::read_to_string(path).map_err(|err| format!("{path}: {err}"))?;
        let fixture: Fixture = toml::from_str(&text).map_err(|err| format!("{path}: {err}"))?;
        let n_gpus = fixture.gpu.len() as u32;
        for (index, gpu) in fixture.gpu.iter().enumerate() {
            if let Some(bad) = gpu
                .nvlink
                .iter()
                .find(|peer| **peer >= n_gpus || **peer == index as u32)
            {
                return Err(format!("{path}: gpu {index}: nvlink peer {bad} is not another GPU"));
            }
            if let Some(bad) = gpu.mig.iter().find(|profile| mig_memory_mib(profile).is_none()) {
                return Err(format!(
                    "{path}: gpu {index}: {bad:?} is not a MIG profile such as 3g.40gb"
                ));
            }
            if gpu.mig.len() > MAX_MIG_SLOTS as usize {
                return Err(format!("{path}: gpu {index}: at most {MAX_MIG_SLOTS} MIG instances"));
            }
        }
        Ok(fixture)
    }

    /// The fault that applies to `call` on `gpu`, `since_ms` after the
    /// first init: a missing function first, then the file's faults.
    pub fn fault_for(&self, call: &str, gpu: Option<u32>, since_ms: u64) -> Option<Fault> {
        if self.missing.iter().any(|missing| missing == call) {
            return Some(Fault {
                call: call.into(),
                gpu: None,
                error: Some(code::FUNCTION_NOT_FOUND),
                hang_ms: None,
                after_ms: 0,
                until_ms: None,
            });
        }
        self.fault
            .iter()
            .find(|fault| {
                (fault.call == "*" || fault.call == call)
                    && fault.gpu.is_none_or(|only| Some(only) == gpu)
                    && since_ms >= fault.after_ms
                    && fault.until_ms.is_none_or(|until| since_ms < until)
            })
            .cloned()
    }

    /// How NVML places two whole GPUs when no NVLink joins them.
    pub fn common_ancestor(&self, a: usize, b: usize) -> u32 {
        let (a, b) = (&self.gpu[a], &self.gpu[b]);
        if a.pcie_switch.is_some() && a.pcie_switch == b.pcie_switch {
            level::SINGLE
        } else if a.numa_node.is_some() && a.numa_node == b.numa_node {
            level::NODE
        } else {
            level::SYSTEM
        }
    }

    /// Link `link` of GPU `gpu`: `None` when NVML would say the GPU has no
    /// NVLink at all; else whether it is active and where it goes.
    pub fn nvlink(&self, gpu: usize, link: u32) -> Option<NvLink> {
        let device = &self.gpu[gpu];
        if device.nvswitch_links == 0 && device.nvlink.is_empty() {
            return None;
        }
        if link < device.nvswitch_links {
            return Some(NvLink::Switch);
        }
        Some(match device.nvlink.get((link - device.nvswitch_links) as usize) {
            Some(peer) => NvLink::Gpu(*peer as usize),
            None => NvLink::Inactive,
        })
    }
}

/// Where an NVLink goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NvLink {
    Gpu(usize),
    Switch,
    Inactive,
}

/// The PCI bus id a stand-in NVSwitch answers for a link's remote end.
pub const NVSWITCH_BUS_ID: &str = "00000000:C5:00.0";

/// MIG slots a GPU offers (an A100 or H100 has 7).
pub const MAX_MIG_SLOTS: u32 = 7;

/// The memory of a MIG profile: "3g.40gb" has 40 GiB.
pub fn mig_memory_mib(profile: &str) -> Option<u64> {
    let (slices, memory) = profile.split_once('.')?;
    slices.strip_suffix('g')?.parse::<u32>().ok()?;
    let gib: u64 = memory.strip_suffix("gb")?.parse().ok()?;
    Some(gib * 1024)
}

/// "00000000:18:00.0" as NVML's (domain, bus, device) numbers.
pub fn pci_numbers(bus_id: &str) -> (u32, u32, u32) {
    let mut parts = bus_id.split([':', '.']);
    let mut next = || {
        parts
            .next()
            .and_then(|part| u32::from_str_radix(part, 16).ok())
            .unwrap_or(0)
    };
    (next(), next(), next())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(text: &str) -> Fixture {
        // A file of its own per call: tests run in parallel in one process.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let dir = std::env::temp_dir().join(format!("standin-{}-{call}", std::process::id()));
        std::fs::write(&dir, text).unwrap();
        let loaded = Fixture::load(dir.to_str().unwrap());
        let _ = std::fs::remove_file(&dir);
        loaded.unwrap()
    }

    const TWO: &str = r#"
missing = ["nvmlDeviceGetRemappedRows"]
[[gpu]]
name = "a"
uuid = "GPU-a"
pci_bus_id = "00000000:18:00.0"
memory_mib = 1
numa_node = 0
pcie_switch = 1
nvlink = [1]
[[gpu]]
name = "b"
uuid = "GPU-b"
pci_bus_id = "00000000:2A:00.0"
memory_mib = 1
numa_node = 0
pcie_switch = 1
[[fault]]
call = "*"
gpu = 1
error = 15
after_ms = 100
"#;

    #[test]
    fn faults_apply_to_their_call_gpu_and_time() {
        let fixture = fixture(TWO);
        assert_eq!(
            fixture.fault_for("nvmlDeviceGetName", Some(1), 50).map(|f| f.error),
            None
        );
        let lost = fixture.fault_for("nvmlDeviceGetName", Some(1), 150).unwrap();
        assert_eq!(lost.error, Some(code::GPU_IS_LOST));
        assert!(fixture.fault_for("nvmlDeviceGetName", Some(0), 150).is_none());
        let missing = fixture.fault_for("nvmlDeviceGetRemappedRows", Some(0), 0).unwrap();
        assert_eq!(missing.error, Some(code::FUNCTION_NOT_FOUND));
    }

    #[test]
    fn links_and_levels_follow_the_file() {
        let fixture = fixture(TWO);
        assert_eq!(fixture.nvlink(0, 0), Some(NvLink::Gpu(1)));
        assert_eq!(fixture.nvlink(0, 1), Some(NvLink::Inactive));
        assert_eq!(fixture.nvlink(1, 0), None, "no NVLink on the second GPU");
        assert_eq!(fixture.common_ancestor(0, 1), level::SINGLE);
        assert_eq!(pci_numbers("00000000:2A:00.0"), (0, 0x2a, 0));
        assert_eq!(mig_memory_mib("3g.40gb"), Some(40 * 1024));
        assert_eq!(mig_memory_mib("big"), None);
    }

    #[test]
    fn every_shipped_fixture_loads() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures");
        let mut n_loaded = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            Fixture::load(path.to_str().unwrap()).unwrap_or_else(|err| panic!("{err}"));
            n_loaded += 1;
        }
        assert!(n_loaded >= 4);
    }
}
