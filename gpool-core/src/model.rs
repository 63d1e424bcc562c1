//! The domain model: jobs and their specs, nodes and their GPUs, pools.

use crate::ids::{JobId, Timestamp};
use crate::job_state::JobState;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;
pub use thin_vec::ThinVec;

mod notify;
pub use notify::{Begin, Change, Notify, NotifyRules};
mod pool;
pub use pool::{PoolDef, PoolDefaults};
mod requirements;
pub use requirements::{NvlinkNeed, Requirements, TerminalSize};

/// A GPU model as the scheduler matches it: a lowercase name such as `h100`,
/// `a100-40gb`, `l4` or a MIG profile like `h100-1g.10gb`. Matching is exact
/// (after lowercasing), so a MIG slice never stands in for a whole GPU.
/// Shared, not copied: a cycle clones and compares the model of every GPU
/// of the fleet, and copies of one model compare equal by address.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GpuModel(std::sync::Arc<str>);

impl GpuModel {
    pub fn new(name: &str) -> GpuModel {
        GpuModel(name.trim().to_ascii_lowercase().into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A MIG slice's model (`a100-3g.20gb`, `h100-1g.10gb+me`): a job gets
    /// one only by naming it, and only one per node (CUDA uses one MIG
    /// device per process).
    pub fn is_mig_slice(&self) -> bool {
        // Asked for every GPU in placement loops: most names have no "g.".
        if !self.0.as_bytes().windows(2).any(|pair| pair == b"g.") {
            return false;
        }
        self.0.split('-').skip(1).any(|part| {
            part.split_once("g.").is_some_and(|(slices, memory)| {
                slices.parse::<u32>().is_ok() && memory.split('+').next().is_some_and(|m| m.ends_with("gb"))
            })
        })
    }

    /// Whether a job asking for `wanted` models (empty: any) may take a
    /// GPU of this one: a MIG slice only when named.
    pub fn accepted_by(&self, wanted: &[GpuModel]) -> bool {
        if wanted.is_empty() {
            !self.is_mig_slice()
        } else {
            wanted.contains(self)
        }
    }
}

impl fmt::Display for GpuModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One GPU of a node, as the node's agent discovered it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// Node-local index (what `CUDA_VISIBLE_DEVICES` names).
    pub index: u32,
    pub uuid: String,
    pub model: GpuModel,
    pub memory_mib: u64,
    /// What the driver keeps of it (NVML's reserved memory at agent start).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub reserved_mib: u64,
    pub pci_bus_id: String,
    /// A MIG slice: the index of the GPU it is carved from (a GPU in MIG
    /// mode is offered only as its slices, never whole).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig_parent: Option<u32>,
    /// The NUMA node its PCIe slot hangs off, where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa_node: Option<u32>,
    /// CUDA compute capability, `9.0`; empty where unknown.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub compute_capability: String,
}

/// A node as the controller knows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    pub gpus: Vec<Gpu>,
    pub labels: BTreeMap<String, String>,
    /// Set by `gpool drain`: no new work is placed here.
    pub drain_reason: Option<String>,
    /// Who drained it (`gpool drain`), and when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drained_by: Option<(String, Timestamp)>,
    /// False once heartbeats stopped for longer than the node timeout.
    pub alive: bool,
    /// How its GPUs are connected, as its agent reported.
    #[serde(default)]
    pub topology: crate::topology::Topology,
    /// GPUs out of service (a fault, or an operator's pin), by index: no
    /// work is placed on them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub gpus_out: BTreeMap<u32, crate::health::OutOfService>,
    /// The node itself is out of service for a fault (its health program
    /// fails): `drain_reason` says why, and it returns by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_drain: Option<crate::health::OutOfService>,
    /// GPU and node health transitions, newest last.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub health_log: Vec<crate::health::HealthEvent>,
    /// The kernel's id of the node's current boot, as its agent reported:
    /// a new one means the node rebooted (which resets its GPUs).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub boot_id: String,
    /// CPUs and memory (bytes) its agent reported; 0: not known (an agent
    /// of an earlier release).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub cpus: u32,
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub memory_bytes: u64,
}

/// A node's state as operators see it, derived from drain, liveness and load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeState {
    Up,
    Draining,
    Drained,
    Down,
}

impl Node {
    /// `n_busy_gpus` is how many of its GPUs running attempts hold.
    pub fn state(&self, n_busy_gpus: usize) -> NodeState {
        match (self.alive, &self.drain_reason) {
            (false, _) => NodeState::Down,
            (true, Some(_)) if n_busy_gpus > 0 => NodeState::Draining,
            (true, Some(_)) => NodeState::Drained,
            (true, None) => NodeState::Up,
        }
    }

    /// New work may be placed here.
    pub fn schedulable(&self) -> bool {
        self.alive && self.drain_reason.is_none()
    }

    /// Its GPUs that take work when the node does (not out of service).
    pub fn gpus_in_service(&self) -> impl Iterator<Item = &Gpu> {
        self.gpus.iter().filter(|gpu| !self.gpus_out.contains_key(&gpu.index))
    }
}

/// Why an attempt was sent back to the queue. Only `Preempted` counts as
/// a preemption.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RequeueCause {
    /// Its GPUs were taken back for another job.
    Preempted,
    /// Its node went silent or down, or was drained at once.
    NodeLost,
    /// A GPU of its attempt left service (an Xid, ECC, heat...).
    GpuFault,
    /// Its node left service for a fault (its health program, a node-wide
    /// Xid).
    NodeFault,
    /// An operator's `gpool requeue`.
    Requeued,
}

impl RequeueCause {
    /// The stable snake_case name (the JSON's `requeue_cause`).
    pub fn as_str(self) -> &'static str {
        match self {
            RequeueCause::Preempted => "preempted",
            RequeueCause::NodeLost => "node_lost",
            RequeueCause::GpuFault => "gpu_fault",
            RequeueCause::NodeFault => "node_fault",
            RequeueCause::Requeued => "requeued",
        }
    }
}

/// A batch script's text, and where in the command its path stands (the
/// node puts its copy's path there).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchScript {
    pub text: String,
    pub at: u32,
}

/// The most a batch script may hold (Slurm's default is 4 MB too).
pub const MAX_SCRIPT_BYTES: usize = 4 << 20;

/// What a user asked for: validated by `JobSpec::validate` before it is stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    pub name: String,
    pub command: Vec<String>,
    /// GPUs on each node.
    pub gpus_per_node: u32,
    /// Nodes of a gang (all or nothing); 1 for a single-node job.
    pub nodes: u32,
    /// Acceptable GPU models; empty means any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpu_types: Vec<GpuModel>,
    pub team: compact_str::CompactString,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub project: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub workload_type: String,
    /// Seconds; `None` means no limit of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time_limit_secs: Option<u64>,
    /// Shared between jobs with the same environment (a shell's exported
    /// variables are the same for every job it submits). Not written with
    /// the rest: it never changes, so gpoold stores it once, apart from the
    /// record it rewrites as the job moves on (older records have it inline).
    #[serde(default, skip_serializing)]
    pub env: std::sync::Arc<[(String, String)]>,
    pub workdir: String,
    #[serde(default, skip_serializing_if = "is_zero_i32")]
    pub priority: i32,
    #[serde(default, skip_serializing_if = "compact_str::CompactString::is_empty")]
    pub pool: compact_str::CompactString,
    /// Whether a lost attempt (its node went down or was drained at once)
    /// puts the job back in the queue; otherwise the job fails.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub requeue: bool,
    /// stdout and stderr go to /dev/null instead of the spool.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub discard_output: bool,
    /// QoS class; empty means the default class.
    #[serde(default, skip_serializing_if = "compact_str::CompactString::is_empty")]
    pub qos: compact_str::CompactString,
    /// Sent when the job is preempted (default SIGUSR1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_signal: Option<i32>,
    /// Between the checkpoint signal and the kill; default: the QoS's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grace_secs: Option<u64>,
    /// An OCI image the job runs in (the node's container runtime); empty
    /// runs it on the host.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub image: String,
    /// Memory limit on each node (its cgroup's), bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem_bytes: Option<u64>,
    /// The most its stdout or stderr may hold on a node, bytes (under the
    /// node's own `max_output`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_output_bytes: Option<u64>,
    /// A batch script as it was at submit (`gpool submit SCRIPT`): the node
    /// runs this copy, so later edits or a deleted file change nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<BatchScript>,
    /// The reservation it runs in (`--reservation`): only its nodes, only
    /// while it is open. Empty: none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reservation: String,
    /// Not before this (`--begin`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub begin: Option<Begin>,
    /// Where to say that it started or ended (`--notify`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<Notify>,
    /// CPU limit: this many CPUs for each GPU (its cgroup's CPU quota).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus_per_gpu: Option<u32>,
    /// Jobs it waits for (`--dependency`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub dependencies: Vec<crate::deps::Dependency>,
    /// Runs only while no other job of its user and name runs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub singleton: bool,
    /// Its nodes run nothing else: it takes every GPU of each.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exclusive: bool,
    /// An interactive job (`gpool alloc`, `gpool run --pty`): it runs on a
    /// terminal of its own on its node, of this size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<TerminalSize>,
    /// Submitted held (`--hold`, sbatch's -H): not scheduled until released.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hold: bool,
    /// Tasks per node (`--ntasks-per-node`; 0 is one): `srun` inside the
    /// job starts them, each with its `SLURM_PROCID`.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub tasks_per_node: u32,
    /// A job array's task indices (`--array`); the record is the array's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<Box<crate::array::ArraySpec>>,
    /// Files for stdout and stderr (`-o/-e` patterns, see
    /// `array::expand_output_pattern`) instead of the node's spool; empty
    /// for the spool. Relative paths are under the workdir.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stdout_path: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub stderr_path: String,
    /// Where it may run beyond its pool and GPU models.
    #[serde(default, skip_serializing_if = "Requirements::is_empty")]
    pub requires: Requirements,
    /// A fraction of one GPU instead of whole ones (`--gpu-mem`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_share: Option<crate::share::ShareAsk>,
}

fn yes() -> bool {
    true
}

// What a stored record leaves out: the value a missing field reads as.
fn is_true(value: &bool) -> bool {
    *value
}

fn is_zero_i32(value: &i32) -> bool {
    *value == 0
}

fn is_zero_u32(value: &u32) -> bool {
    *value == 0
}

fn is_zero_u64(value: &u64) -> bool {
    *value == 0
}

impl JobSpec {
    pub fn total_gpus(&self) -> u64 {
        u64::from(self.gpus_per_node) * u64::from(self.nodes)
    }
}

/// A job's spec as read from JSON: alike jobs read one after another (a
/// batch's, as a restart reads them) share one. The stored text is
/// compared with the last spec this thread read, and only text unlike it
/// is decoded: decoding the spec was three quarters of decoding a job.
fn shared_spec<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<std::sync::Arc<JobSpec>, D::Error> {
    type Last = Option<(Box<serde_json::value::RawValue>, std::sync::Arc<JobSpec>)>;
    thread_local! {
        static LAST: std::cell::RefCell<Last> = const { std::cell::RefCell::new(None) };
    }
    let text = Box::<serde_json::value::RawValue>::deserialize(deserializer)?;
    LAST.with_borrow_mut(|last| match last {
        Some((last_text, spec)) if last_text.get() == text.get() => Ok(spec.clone()),
        _ => {
            let spec = std::sync::Arc::new(
                serde_json::from_str::<JobSpec>(text.get())
                    .map_err(|err| serde::de::Error::custom(format!("spec: {err}")))?,
            );
            *last = Some((text, spec.clone()));
            Ok(spec)
        }
    })
}

/// A job and its whole lifecycle. Lists most jobs leave empty are thin
/// (one pointer, not three: a job waiting in a queue of 100,000 is 64
/// bytes smaller).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Job {
    pub id: JobId,
    /// Shared by jobs submitted alike (a batch of 100,000 identical jobs
    /// holds one); `Arc::make_mut` to change one job's.
    #[serde(deserialize_with = "shared_spec")]
    pub spec: std::sync::Arc<JobSpec>,
    /// Inline up to 24 bytes (every usual user name): no allocation a job.
    pub user: compact_str::CompactString,
    pub submitted_at: Timestamp,
    pub state: JobState,
    /// Launches so far (the current one included).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub n_attempts: u32,
    /// Nodes of the latest attempt, rank 0 first (where its output is).
    #[serde(default, skip_serializing_if = "ThinVec::is_empty")]
    pub last_nodes: ThinVec<String>,
    /// Times it was preempted, and the GPU-seconds of work that lost.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub n_preemptions: u32,
    /// Why its latest attempt went back to the queue, if one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeue_cause: Option<RequeueCause>,
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub lost_gpu_secs: u64,
    /// Seconds of its time limit spent by earlier attempts: a job that
    /// checkpoints resumes where it was, so its limit spans its attempts
    /// (`Job::time_left_secs`).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub used_secs: u64,
    /// GPU-seconds its ended attempts held their GPUs: its attained
    /// service, which orders a team's jobs under LAS (`sched::Las`).
    #[serde(default, skip_serializing_if = "is_zero_u64")]
    pub service_gpu_secs: u64,
    /// When its latest attempt ended and it went back to the queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requeued_at: Option<Timestamp>,
    /// Attempts given up for lost (their node went silent) that may still
    /// report how they ended; newest last, at most `MAX_LOST_ATTEMPTS`.
    #[serde(default, skip_serializing_if = "ThinVec::is_empty")]
    pub lost_attempts: ThinVec<LostAttempt>,
    /// A pending job its owner held (`gpool hold`): not scheduled until
    /// released.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
    /// An array's record: how far its tasks are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array: Option<Box<crate::array::ArrayProgress>>,
    /// A task of an array: which, and its index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub array_task: Option<crate::array::ArrayTask>,
    /// The nodes of each earlier attempt, rank 0 first (where its output
    /// stays); at most `MAX_PAST_ATTEMPTS`, oldest first.
    #[serde(default, skip_serializing_if = "ThinVec::is_empty")]
    pub past_attempts: ThinVec<PastAttempt>,
    /// How much of its GPUs its ended attempts used, from the nodes'
    /// samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_use: Option<Box<GpuUse>>,
    /// What happened to it besides its state (a straggler flagged or
    /// back in step); newest last, at most `MAX_JOB_EVENTS`.
    #[serde(default, skip_serializing_if = "ThinVec::is_empty")]
    pub events: ThinVec<JobNote>,
}

/// Most events a job keeps.
pub const MAX_JOB_EVENTS: usize = 32;

/// One event in a job's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobNote {
    pub at: Timestamp,
    pub text: String,
}

/// An allocation is idle under this mean utilisation (percent)...
pub const IDLE_BELOW_PCT: f64 = 1.0;
/// ...over at least this many samples.
pub const IDLE_MIN_SAMPLES: u64 = 3;

/// The idle-allocation rule on a sample count and mean utilisation (the
/// CLI applies it to what gpoold sends).
pub fn is_idle_allocation(samples: u64, mean_utilization_pct: f64) -> bool {
    samples >= IDLE_MIN_SAMPLES && mean_utilization_pct < IDLE_BELOW_PCT
}

/// Use of a job's GPUs, from the per-GPU samples of its nodes' heartbeats
/// taken while it ran (each sample of each of its GPUs counts once).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuUse {
    pub samples: u64,
    /// Sum of the samples' utilisation, in percent.
    pub utilization_pct_sum: u64,
    pub utilization_pct_peak: u32,
    pub memory_used_mib_peak: u64,
}

impl GpuUse {
    pub fn add_sample(&mut self, utilization_pct: u32, memory_used_mib: u64) {
        self.samples += 1;
        self.utilization_pct_sum += u64::from(utilization_pct.min(100));
        self.utilization_pct_peak = self.utilization_pct_peak.max(utilization_pct.min(100));
        self.memory_used_mib_peak = self.memory_used_mib_peak.max(memory_used_mib);
    }

    pub fn merge(&mut self, other: &GpuUse) {
        self.samples += other.samples;
        self.utilization_pct_sum += other.utilization_pct_sum;
        self.utilization_pct_peak = self.utilization_pct_peak.max(other.utilization_pct_peak);
        self.memory_used_mib_peak = self.memory_used_mib_peak.max(other.memory_used_mib_peak);
    }

    /// Mean utilisation in percent; `None` without samples.
    pub fn mean_utilization_pct(&self) -> Option<f64> {
        (self.samples > 0).then(|| self.utilization_pct_sum as f64 / self.samples as f64)
    }
}

/// Most earlier attempts a job remembers the nodes of.
pub const MAX_PAST_ATTEMPTS: usize = 16;

/// Where an earlier attempt ran.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PastAttempt {
    pub attempt: u32,
    pub nodes: Vec<String>,
}

/// Most lost attempts a job remembers.
pub const MAX_LOST_ATTEMPTS: usize = 4;

/// An attempt requeued because its node was lost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LostAttempt {
    pub epoch: crate::Epoch,
    pub started_at: crate::Timestamp,
}

impl Job {
    /// A job just submitted by `user`: pending, never run.
    pub fn pending(id: JobId, spec: std::sync::Arc<JobSpec>, user: &str, submitted_at: Timestamp) -> Job {
        let held = spec.hold;
        Job {
            id,
            spec,
            user: user.into(),
            submitted_at,
            state: JobState::Pending,
            n_attempts: 0,
            last_nodes: ThinVec::new(),
            n_preemptions: 0,
            requeue_cause: None,
            lost_gpu_secs: 0,
            used_secs: 0,
            service_gpu_secs: 0,
            requeued_at: None,
            lost_attempts: ThinVec::new(),
            held,
            array: None,
            array_task: None,
            past_attempts: ThinVec::new(),
            gpu_use: None,
            events: ThinVec::new(),
        }
    }

    /// Keeps `text` in the job's history, dropping the oldest beyond
    /// `MAX_JOB_EVENTS`.
    pub fn record_event(&mut self, at: Timestamp, text: String) {
        self.events.push(JobNote { at, text });
        let excess = self.events.len().saturating_sub(MAX_JOB_EVENTS);
        self.events.drain(..excess);
    }

    /// `123_4` for an array task, else the id.
    pub fn display_id(&self) -> String {
        crate::array::display_id(self.id, self.array_task.as_ref())
    }

    /// The job as authorisation sees it.
    pub fn auth_ref(&self) -> crate::auth::JobRef<'_> {
        crate::auth::JobRef {
            id: self.id,
            owner: &self.user,
            team: &self.spec.team,
        }
    }
}

/// The GPUs one node gives to one attempt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodePlacement {
    pub node: String,
    pub gpu_indices: Vec<u32>,
}

impl fmt::Display for NodePlacement {
    /// `n1[0-3]`, `n2[0,2,5]`: ranges where indices are consecutive.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.node)?;
        let mut first = true;
        let mut idx = 0;
        while idx < self.gpu_indices.len() {
            let start = self.gpu_indices[idx];
            let mut end_idx = idx;
            while end_idx + 1 < self.gpu_indices.len() && self.gpu_indices[end_idx + 1] == self.gpu_indices[end_idx] + 1
            {
                end_idx += 1;
            }
            let end = self.gpu_indices[end_idx];
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if end > start {
                write!(f, "{start}-{end}")?;
            } else {
                write!(f, "{start}")?;
            }
            idx = end_idx + 1;
        }
        f.write_str("]")
    }
}

#[cfg(test)]
mod tests;
