//! Pools (partitions) and what their jobs get by default.

use super::JobSpec;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A pool (partition): the nodes whose labels carry every `selector` pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolDef {
    pub name: String,
    pub selector: BTreeMap<String, String>,
    /// What a job of the pool gets where it asks for nothing itself.
    #[serde(default, skip_serializing_if = "PoolDefaults::is_empty")]
    pub defaults: PoolDefaults,
}

/// A pool's defaults for jobs, as Slurm's `DefCpuPerGPU` and
/// `DefMemPerGPU` are a partition's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolDefaults {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_per_gpu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_per_gpu_bytes: Option<u64>,
}

impl PoolDefaults {
    pub fn is_empty(&self) -> bool {
        *self == PoolDefaults::default()
    }

    /// Fills in what `spec` leaves out: CPUs per GPU, and memory per node
    /// (the default per GPU times its GPUs on a node) where it gives no
    /// `--mem` or `--mem-per-gpu`.
    pub fn apply(&self, spec: &mut JobSpec) {
        if spec.cpus_per_gpu.is_none() {
            spec.cpus_per_gpu = self.cpus_per_gpu;
        }
        if spec.mem_bytes.is_none() {
            spec.mem_bytes = self
                .mem_per_gpu_bytes
                .map(|per_gpu| per_gpu.saturating_mul(u64::from(spec.gpus_per_node.max(1))));
        }
    }
}

impl PoolDef {
    pub fn selects(&self, node_labels: &BTreeMap<String, String>) -> bool {
        self.selector
            .iter()
            .all(|(key, value)| node_labels.get(key) == Some(value))
    }
}
