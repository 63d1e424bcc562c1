//! GPU health: what a node's readings and Xid events say about each GPU,
//! and when a GPU (or a whole node) leaves service and comes back.
//!
//! Pure: gpoold feeds it each heartbeat and the time. A fault takes the GPU
//! out of service and its attempts are requeued; after a quiet period with
//! no fault, and a passing probe (the node's health program, where one
//! runs), it returns by itself. A fault that only a GPU reset (or a reboot)
//! clears, as NVIDIA documents for Xid 79, 48, 95 and the like, keeps it
//! out until an operator resumes it (`[health] reset_faults_return` lets
//! those return by themselves too). An operator's pin never returns by
//! itself.

use crate::ids::Timestamp;
use serde::{Deserialize, Serialize};
use std::fmt;

/// What gpool does about an Xid, from NVIDIA's Xid catalogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XidClass {
    /// The job's own doing (a bad kernel, a memory fault): recorded against
    /// the job, the GPU stays in service.
    Application,
    /// The GPU's hardware failed: it leaves service.
    Hardware,
    /// The GPU or its firmware is in a state only a reset clears: it leaves
    /// service.
    ResetRequired,
    /// Nothing about the GPU's health: kept in the node's health log.
    Informational,
}

/// The bucket of Xid `xid` and what it means, in words.
pub fn classify_xid(xid: u32) -> (XidClass, &'static str) {
    use XidClass::*;
    match xid {
        13 => (Application, "graphics engine exception"),
        31 => (Application, "GPU memory page fault"),
        43 => (Application, "GPU stopped processing"),
        45 => (Application, "preemptive cleanup after an earlier error"),
        68 => (Application, "video decoder exception"),
        109 => (Application, "context switch timeout"),
        48 => (Hardware, "double-bit ECC error"),
        63 => (Hardware, "ECC page retirement or row remapping event"),
        64 => (Hardware, "ECC page retirement or row remapping failure"),
        74 => (Hardware, "NVLink error"),
        79 => (Hardware, "GPU has fallen off the bus"),
        92 => (Hardware, "high single-bit ECC error rate"),
        94 => (Hardware, "contained ECC error"),
        95 => (Hardware, "uncontained ECC error"),
        140 => (Hardware, "unrecovered ECC error"),
        143 => (Hardware, "GPU initialisation failure"),
        144..=150 => (Hardware, "NVLink error"),
        38 => (ResetRequired, "driver firmware error"),
        56 => (ResetRequired, "display engine error"),
        57 => (ResetRequired, "error programming video memory interface"),
        58 => (ResetRequired, "unstable video memory interface"),
        61 => (ResetRequired, "internal micro-controller breakpoint"),
        62 => (ResetRequired, "internal micro-controller halt"),
        69 => (ResetRequired, "graphics engine class error"),
        119 => (ResetRequired, "GSP RPC timeout"),
        120 => (ResetRequired, "GSP error"),
        154 => (ResetRequired, "GPU recovery action changed"),
        _ => (Informational, "not in gpool's catalogue"),
    }
}

/// Whether NVIDIA documents Xid `xid` as needing a GPU reset (or a reboot)
/// before the GPU can be trusted again: the reset-required class, a GPU
/// fallen off the bus, double-bit and uncontained ECC errors, failed row
/// remapping, NVLink and GSP failures, failed initialisation.
pub fn xid_needs_reset(xid: u32) -> bool {
    matches!(classify_xid(xid).0, XidClass::ResetRequired)
        || matches!(xid, 48 | 64 | 74 | 79 | 95 | 140 | 143 | 144..=150)
}

/// The operator's thresholds (`[health]` in gpoold.toml).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthPolicy {
    /// A GPU at or above this temperature...
    pub max_temperature_c: u32,
    /// ...for this long leaves service.
    pub hot_for_ms: i64,
    /// A GPU (or node) out of service for a fault returns after this long
    /// with no fault and a passing probe.
    pub quiet_ms: i64,
    /// A GPU missing from its node's readings this long is a fault (one
    /// unreadable heartbeat is not).
    pub missing_for_ms: i64,
    /// Faults that need a GPU reset return by themselves after the quiet
    /// period too (default: they wait for an operator's resume).
    pub reset_faults_return: bool,
}

impl Default for HealthPolicy {
    fn default() -> HealthPolicy {
        HealthPolicy {
            max_temperature_c: 90,
            hot_for_ms: 60_000,
            quiet_ms: 10 * 60_000,
            missing_for_ms: 10_000,
            reset_faults_return: false,
        }
    }
}

/// One GPU's health readings in one heartbeat.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuReading {
    pub temperature_c: u32,
    /// Volatile uncorrectable ECC errors (since the driver loaded).
    pub ecc_uncorrected: u64,
    /// Row remapping failed: the memory cannot hide a bad row any more.
    pub remap_failure: bool,
    /// A row remap (or page retirement) waits for a reset.
    pub remap_pending: bool,
    /// Xid events since the last heartbeat.
    pub xids: Vec<u32>,
    /// How its MPS daemon failed since the last heartbeat; empty: it did
    /// not (or none runs).
    pub mps_fault: String,
}

/// What gpoold remembers of a GPU between heartbeats (not durable: after a
/// restart the first reading is the new baseline).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuWatch {
    ecc_uncorrected: Option<u64>,
    hot_since: Option<Timestamp>,
    missing_since: Option<Timestamp>,
}

/// What one heartbeat says of one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Assessment {
    /// Why it must leave (or stay out of) service; empty when none.
    pub faults: Vec<String>,
    /// Application Xids: recorded against the job on the GPU.
    pub job_faults: Vec<String>,
    /// Xids that say nothing of its health: kept in the log.
    pub notes: Vec<String>,
    /// One of `faults` needs a GPU reset: it stays out until resumed.
    pub needs_reset: bool,
}

impl GpuWatch {
    /// Reads one heartbeat's reading of the GPU; `None` when the heartbeat
    /// had none (the GPU is gone from its node, or cannot be read).
    pub fn assess(&mut self, reading: Option<&GpuReading>, policy: &HealthPolicy, now: Timestamp) -> Assessment {
        let mut assessment = Assessment::default();
        let Some(reading) = reading else {
            self.hot_since = None;
            let since = *self.missing_since.get_or_insert(now);
            if now.0 - since.0 >= policy.missing_for_ms {
                assessment.faults.push(format!(
                    "missing from its node's readings for {} s (gone from the bus, or unreadable)",
                    (now.0 - since.0) / 1000
                ));
            }
            return assessment;
        };
        self.missing_since = None;
        for xid in &reading.xids {
            assessment.needs_reset |= xid_needs_reset(*xid);
            let (class, meaning) = classify_xid(*xid);
            let text = format!("Xid {xid} ({meaning})");
            match class {
                XidClass::Application => assessment.job_faults.push(text),
                XidClass::Hardware => assessment.faults.push(text),
                XidClass::ResetRequired => assessment.faults.push(format!("{text}, needs a GPU reset")),
                XidClass::Informational => assessment.notes.push(text),
            }
        }
        if let Some(before) = self.ecc_uncorrected {
            if reading.ecc_uncorrected > before {
                assessment.faults.push(format!(
                    "{} new uncorrectable ECC errors",
                    reading.ecc_uncorrected - before
                ));
            }
        }
        self.ecc_uncorrected = Some(reading.ecc_uncorrected);
        if !reading.mps_fault.is_empty() {
            assessment.faults.push(format!("its MPS daemon {}", reading.mps_fault));
        }
        if reading.remap_failure {
            assessment.faults.push("row remapping failed".into());
            assessment.needs_reset = true;
        }
        if reading.remap_pending {
            assessment.faults.push("row remap pending a GPU reset".into());
            assessment.needs_reset = true;
        }
        if reading.temperature_c >= policy.max_temperature_c {
            let since = *self.hot_since.get_or_insert(now);
            if now.0 - since.0 >= policy.hot_for_ms {
                assessment.faults.push(format!(
                    "{} °C, at or above {} °C for {} s",
                    reading.temperature_c,
                    policy.max_temperature_c,
                    (now.0 - since.0) / 1000
                ));
            }
        } else {
            self.hot_since = None;
        }
        assessment
    }
}

/// Who took a GPU or node out of service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TakenBy {
    /// A fault: it returns by itself.
    Health,
    /// `gpool drain --gpu`: it returns only on `gpool resume --gpu`.
    Operator,
    /// A fault only a GPU reset (or a reboot) clears: it returns on `gpool
    /// resume --gpu`, once the operator reset it.
    UntilReset,
}

/// A GPU (or a node) out of service, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutOfService {
    pub reason: String,
    pub since: Timestamp,
    pub by: TakenBy,
    /// The latest fault seen; the quiet period counts from here.
    pub last_fault_at: Timestamp,
}

/// What to do with a GPU or node after a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Nothing changes.
    Keep,
    /// It leaves service, for this reason.
    TakeOut(String),
    /// Out already, and the fault goes on: the quiet period starts again.
    StillFaulty,
    /// Quiet for long enough and the probe passed: back in service.
    Return,
}

/// The decision for one GPU or node: `current` is its state, `faults` what
/// this heartbeat found, `probe_passed` whether the node's health program
/// (where one runs) passed since its last fault.
pub fn decide(
    current: Option<&OutOfService>,
    faults: &[String],
    probe_passed: bool,
    policy: &HealthPolicy,
    now: Timestamp,
) -> Change {
    match current {
        None if faults.is_empty() => Change::Keep,
        None => Change::TakeOut(faults.join("; ")),
        // A pinned GPU stays out whatever it does, but its faults count
        // (a resume then leaves it out until it is quiet).
        Some(out) if out.by == TakenBy::Operator && !faults.is_empty() => Change::StillFaulty,
        Some(out) if out.by == TakenBy::Operator => Change::Keep,
        Some(out) if out.by == TakenBy::UntilReset && !policy.reset_faults_return && faults.is_empty() => Change::Keep,
        Some(_) if !faults.is_empty() => Change::StillFaulty,
        Some(out) if probe_passed && now.0 - out.last_fault_at.0 >= policy.quiet_ms => Change::Return,
        Some(_) => Change::Keep,
    }
}

/// Most entries a node's health log keeps.
pub const MAX_HEALTH_EVENTS: usize = 64;

/// What happened, in a node's health log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transition {
    /// Out of service for a fault.
    Failed,
    /// Pinned out by an operator.
    Drained,
    /// Back in service.
    Returned,
    /// An application Xid, recorded against the job that ran there.
    JobFault,
    /// An Xid that says nothing of its health.
    Note,
    /// A GPU left or joined the node's inventory.
    Inventory,
}

impl fmt::Display for Transition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transition::Failed => "failed",
            Transition::Drained => "drained",
            Transition::Returned => "returned",
            Transition::JobFault => "job_fault",
            Transition::Note => "note",
            Transition::Inventory => "inventory",
        })
    }
}

/// One entry of a node's health log: a GPU's (or, with no GPU, the whole
/// node's) transition and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthEvent {
    pub at: Timestamp,
    pub gpu: Option<u32>,
    pub transition: Transition,
    pub reason: String,
}

/// How a node's GPUs changed between two registrations of its agent (a
/// GPU fell off the bus and the driver dropped it, a MIG layout changed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drift {
    /// GPU `index` is gone, or is now another device: what it was.
    Gone { index: u32, was: String },
    /// A GPU that was not there before.
    Joined { index: u32, now: String },
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Drift::Gone { index, was } => write!(f, "GPU {index} ({was}) left the inventory"),
            Drift::Joined { index, now } => write!(f, "GPU {index} ({now}) joined the inventory"),
        }
    }
}

/// A node's drain for something its agent reports (a full spool, stuck GPU
/// readings), told by the reason's `prefix` from an operator's: the new
/// drain reason when it changes (`Some(None)`: lifted), `None` when it
/// stays. It drains only an undrained node (an operator's reason stays),
/// and lifts only its own drain.
pub fn agent_drain(current: Option<&str>, prefix: &str, why: &str) -> Option<Option<String>> {
    match current {
        None if !why.is_empty() => Some(Some(format!("{prefix}{why}"))),
        Some(reason) if why.is_empty() && reason.starts_with(prefix) => Some(None),
        _ => None,
    }
}

/// The GPUs a reboot brings back: those out until a reset, when the node's
/// boot id changed (a reboot resets every GPU). Unknown boot ids (an agent
/// of an earlier release) tell nothing.
pub fn reset_by_reboot(
    known_boot: &str,
    new_boot: &str,
    gpus_out: &std::collections::BTreeMap<u32, OutOfService>,
) -> Vec<u32> {
    if known_boot.is_empty() || new_boot.is_empty() || known_boot == new_boot {
        return Vec::new();
    }
    gpus_out
        .iter()
        .filter(|(_, out)| out.by == TakenBy::UntilReset)
        .map(|(index, _)| *index)
        .collect()
}

/// What changed from `before` to `after`: a GPU is the same while its index
/// and UUID are.
pub fn drift(before: &[crate::model::Gpu], after: &[crate::model::Gpu]) -> Vec<Drift> {
    let same = |a: &crate::model::Gpu, b: &crate::model::Gpu| a.index == b.index && a.uuid == b.uuid;
    let describe = |gpu: &crate::model::Gpu| format!("{} {}", gpu.model, gpu.uuid);
    let gone = before
        .iter()
        .filter(|old| !after.iter().any(|new| same(old, new)))
        .map(|old| Drift::Gone {
            index: old.index,
            was: describe(old),
        });
    let joined = after
        .iter()
        .filter(|new| !before.iter().any(|old| same(old, new)))
        .map(|new| Drift::Joined {
            index: new.index,
            now: describe(new),
        });
    gone.chain(joined).collect()
}

/// Appends `event` to `log`, keeping the newest `MAX_HEALTH_EVENTS`.
pub fn record(log: &mut Vec<HealthEvent>, event: HealthEvent) {
    log.push(event);
    let excess = log.len().saturating_sub(MAX_HEALTH_EVENTS);
    log.drain(..excess);
}

#[cfg(test)]
mod tests;
