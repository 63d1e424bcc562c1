//! A group's defaults, which jobs it serves, and its nodes as they will
//! register.

use super::*;

/// A group's defaults, where gpoold.toml leaves a key out.
pub const DEFAULT_SUSPEND_AFTER_SECS: u64 = 600;
pub const DEFAULT_RESUME_TIMEOUT_SECS: u64 = 300;
pub const DEFAULT_SUSPEND_TIMEOUT_SECS: u64 = 120;
pub const DEFAULT_PAUSE_AFTER_FAILURES: u32 = 3;
pub const DEFAULT_PAUSE_SECS: u64 = 1800;

impl Group {
    /// A group of `nodes` with `gpus` GPUs of `model` each, at `price` a
    /// GPU-hour, and the defaults for the rest: suspended after 10 idle
    /// minutes, 5 minutes to resume, 2 to suspend, no rates or budgets, a
    /// pause of 30 minutes after 3 failed resumes in a row.
    pub fn new(name: &str, nodes: Vec<String>, model: GpuModel, gpus: u32, price_per_gpu_hour: f64) -> Group {
        Group {
            name: name.to_string(),
            nodes,
            model,
            gpus,
            gpu_memory_mib: None,
            labels: BTreeMap::new(),
            price_per_gpu_hour,
            suspend_after_secs: Some(DEFAULT_SUSPEND_AFTER_SECS),
            resume_timeout_secs: DEFAULT_RESUME_TIMEOUT_SECS,
            suspend_timeout_secs: DEFAULT_SUSPEND_TIMEOUT_SECS,
            resume_rate: 0,
            suspend_rate: 0,
            max_nodes: None,
            max_gpu_hours: None,
            max_nodes_per_team: None,
            max_gpu_hours_per_team: None,
            pause_after_failures: DEFAULT_PAUSE_AFTER_FAILURES,
            pause_secs: DEFAULT_PAUSE_SECS,
        }
    }

    /// Whether `job` could run on `node` of this group once it is up: its
    /// GPUs per node, model, GPU memory, pool and node requirements.
    pub fn serves(&self, node: &str, job: &PendingJob, policy: &Policy) -> bool {
        job.shape.gpus_per_node <= self.gpus
            && job.shape.gpus_per_node > 0
            && self.model.accepted_by(&job.shape.gpu_types)
            && self.gpu_memory_mib.is_none_or(|mib| job.allows_memory(mib))
            && policy
                .pool(&job.shape.pool)
                .is_some_and(|pool| pool.selects(&self.labels))
            && job
                .shape
                .requires
                .as_deref()
                .is_none_or(|requires| requires.allows_node(node, &self.labels))
    }

    /// `node` as it will register: for the submit-time check of what the
    /// fleet could ever run.
    pub fn node_as_registered(&self, node: &str) -> Node {
        let gpus = (0..self.gpus)
            .map(|index| Gpu {
                index,
                uuid: String::new(),
                model: self.model.clone(),
                memory_mib: self.gpu_memory_mib.unwrap_or(u64::MAX / 2),
                reserved_mib: 0,
                pci_bus_id: String::new(),
                mig_parent: None,
                numa_node: None,
                compute_capability: String::new(),
            })
            .collect();
        Node {
            name: node.to_string(),
            gpus,
            labels: self.labels.clone(),
            drain_reason: None,
            drained_by: None,
            alive: true,
            topology: Default::default(),
            gpus_out: BTreeMap::new(),
            health_drain: None,
            health_log: Vec::new(),
            boot_id: String::new(),
            cpus: 0,
            memory_bytes: 0,
        }
    }
}
