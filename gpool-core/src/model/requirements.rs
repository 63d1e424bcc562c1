//! Where a job may run beyond its pool and GPU models, and the terminal an
//! interactive job runs on.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The size of an interactive job's terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TerminalSize {
    pub rows: u16,
    pub cols: u16,
}

/// How much a job needs its GPUs on a node joined by NVLink.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NvlinkNeed {
    /// Whatever is free (well-connected GPUs are still chosen first).
    #[default]
    Any,
    /// NVLink-joined GPUs where some are free, others otherwise.
    Preferred,
    /// Only GPUs all joined by NVLink to each other.
    Required,
}

impl NvlinkNeed {
    pub fn parse(text: &str) -> Result<NvlinkNeed, String> {
        match text {
            "any" => Ok(NvlinkNeed::Any),
            "preferred" => Ok(NvlinkNeed::Preferred),
            "required" => Ok(NvlinkNeed::Required),
            other => Err(format!("{other:?} is not required, preferred or any")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            NvlinkNeed::Any => "any",
            NvlinkNeed::Preferred => "preferred",
            NvlinkNeed::Required => "required",
        }
    }
}

/// A job's requirements on nodes and GPUs (`--min-gpu-memory`, `--nvlink`,
/// `--constraint`, `--nodelist`, `--exclude`).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Requirements {
    /// Each GPU has at least this much memory (MiB); 0: any.
    #[serde(default)]
    pub min_gpu_memory_mib: u64,
    #[serde(default)]
    pub nvlink: NvlinkNeed,
    /// Node labels that must all match (`key=value`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub constraints: BTreeMap<String, String>,
    /// Only these nodes (empty: any).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodelist: Vec<String>,
    /// Never these nodes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
}

impl Requirements {
    pub fn is_empty(&self) -> bool {
        self.min_gpu_memory_mib == 0
            && self.nvlink == NvlinkNeed::default()
            && self.constraints.is_empty()
            && self.nodelist.is_empty()
            && self.exclude.is_empty()
    }

    /// The node's name and labels allow the job there.
    pub fn allows_node(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        (self.nodelist.is_empty() || self.nodelist.iter().any(|n| n == name))
            && !self.exclude.iter().any(|n| n == name)
            && self
                .constraints
                .iter()
                .all(|(key, value)| labels.get(key) == Some(value))
    }

    /// A GPU with `memory_mib` of memory is big enough.
    pub fn allows_memory(&self, memory_mib: u64) -> bool {
        memory_mib >= self.min_gpu_memory_mib
    }
}
