//! Which limits a node enforces on the attempts it runs (its agent's
//! `gpool.enforces` label), which of them a job asks for, and which a job
//! would run without on a node. The scheduler keeps a job off nodes that
//! cannot enforce what it asks for (`enforce_limits = "refuse"`, the
//! default) or, where the operator chose `"warn"`, gpoold starts it there
//! and keeps a warning on the job: never a silent pass.

use crate::model::JobSpec;
use std::collections::BTreeMap;
use std::fmt;

#[cfg(test)]
mod tests;

/// The node label an agent reports what it enforces in: a sorted,
/// comma-separated subset of `cpu,devices,memory,pids`, empty where it
/// enforces nothing. The agent sets it after agent.toml's own labels, so
/// a config cannot claim limits the node does not enforce.
pub const LABEL: &str = "gpool.enforces";

/// One limit a node may enforce on an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Limit {
    /// `--cpus-per-gpu` as the attempt's CPU quota.
    Cpu,
    /// Only the attempt's own GPUs' device nodes may be opened.
    Devices,
    /// `--mem` as the attempt's memory limit.
    Memory,
    /// agent.toml's `max_pids` as the attempt's process limit.
    Pids,
}

impl Limit {
    /// In the label's (alphabetical) order.
    pub const ALL: [Limit; 4] = [Limit::Cpu, Limit::Devices, Limit::Memory, Limit::Pids];

    pub fn name(self) -> &'static str {
        match self {
            Limit::Cpu => "cpu",
            Limit::Devices => "devices",
            Limit::Memory => "memory",
            Limit::Pids => "pids",
        }
    }

    pub fn parse(name: &str) -> Option<Limit> {
        Limit::ALL.into_iter().find(|limit| limit.name() == name)
    }

    /// The flag a job asks for it with; `None` for what no job asks for.
    pub fn flag(self) -> Option<&'static str> {
        match self {
            Limit::Cpu => Some("--cpus-per-gpu"),
            Limit::Memory => Some("--mem"),
            Limit::Devices | Limit::Pids => None,
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of limits (a node's enforced ones, or a job's asked ones).
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LimitSet(u8);

impl LimitSet {
    pub const NONE: LimitSet = LimitSet(0);
    pub const ALL: LimitSet = LimitSet(0b1111);

    pub fn contains(self, limit: Limit) -> bool {
        self.0 & limit.bit() != 0
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn with(self, limit: Limit) -> LimitSet {
        LimitSet(self.0 | limit.bit())
    }

    pub fn union(self, other: LimitSet) -> LimitSet {
        LimitSet(self.0 | other.0)
    }

    /// Those of `self` not in `other`.
    pub fn less(self, other: LimitSet) -> LimitSet {
        LimitSet(self.0 & !other.0)
    }

    pub fn is_subset(self, other: LimitSet) -> bool {
        self.less(other).is_empty()
    }

    /// In the label's order.
    pub fn iter(self) -> impl Iterator<Item = Limit> {
        Limit::ALL.into_iter().filter(move |limit| self.contains(*limit))
    }

    pub fn names(self) -> Vec<&'static str> {
        self.iter().map(Limit::name).collect()
    }

    /// A label's value: names it does not know (a newer agent's) are
    /// passed over, as are blanks.
    pub fn parse(text: &str) -> LimitSet {
        text.split(',').filter_map(|name| Limit::parse(name.trim())).collect()
    }

    /// The label's value: sorted, comma-separated, empty for none.
    pub fn label(self) -> String {
        self.names().join(",")
    }

    /// What a node with `labels` enforces, by its agent's word; nothing
    /// where its agent does not say (an agent older than the label).
    pub fn of_node(labels: &BTreeMap<String, String>) -> LimitSet {
        labels.get(LABEL).map_or(LimitSet::NONE, |value| LimitSet::parse(value))
    }

    /// `cpu, memory`, or `nothing`.
    pub fn words(self) -> String {
        if self.is_empty() {
            "nothing".to_string()
        } else {
            self.names().join(", ")
        }
    }
}

impl FromIterator<Limit> for LimitSet {
    fn from_iter<I: IntoIterator<Item = Limit>>(limits: I) -> LimitSet {
        limits.into_iter().fold(LimitSet::NONE, LimitSet::with)
    }
}

impl fmt::Debug for LimitSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{{{}}}", self.label())
    }
}

/// The limits `spec` asks its nodes to enforce: `memory` where it has a
/// memory limit (`--mem`, `--mem-per-gpu`, or its pool's
/// `default_mem_per_gpu`, which gpoold writes into the spec at submit),
/// `cpu` where it has CPUs per GPU (`--cpus-per-gpu`, or the pool's
/// `default_cpus_per_gpu`). A pool's default counts: the job is given that
/// limit, and a node that cannot hold it to it passes it silently.
/// Device fences and process limits are no job's ask: a node applies them
/// (or not) to every job alike, `gpool nodes` says which, and they never
/// keep a job off a node.
pub fn asked_by(spec: &JobSpec) -> LimitSet {
    let mut asked = LimitSet::NONE;
    if spec.mem_bytes.is_some_and(|bytes| bytes > 0) {
        asked = asked.with(Limit::Memory);
    }
    if spec.cpus_per_gpu.is_some_and(|cpus| cpus > 0) {
        asked = asked.with(Limit::Cpu);
    }
    asked
}

/// The limits a job that takes `host` on each node asks for (as
/// `asked_by`, for a trace's job, which has no spec).
pub fn asked_by_host(host: Option<crate::sched::HostAsk>) -> LimitSet {
    let host = host.unwrap_or_default();
    let mut asked = LimitSet::NONE;
    if host.memory_bytes > 0 {
        asked = asked.with(Limit::Memory);
    }
    if host.cpus > 0 {
        asked = asked.with(Limit::Cpu);
    }
    asked
}

/// Of the limits a job asks for (`asked`), those a node enforcing
/// `enforced` would not hold it to (`None`: a node whose agent does not
/// say, which enforces nothing). Empty: the job may run there as asked.
pub fn unenforced(asked: LimitSet, enforced: Option<LimitSet>) -> LimitSet {
    asked.less(enforced.unwrap_or(LimitSet::NONE))
}

/// What becomes of a job whose limits a node cannot enforce
/// (gpoold.toml's `enforce_limits`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum EnforceLimits {
    /// The node is no candidate for it; its pending reasons say why.
    #[default]
    Refuse,
    /// It runs there, with a warning on the job.
    Warn,
}

impl EnforceLimits {
    pub fn parse(text: &str) -> Result<EnforceLimits, String> {
        match text {
            "refuse" => Ok(EnforceLimits::Refuse),
            "warn" => Ok(EnforceLimits::Warn),
            other => Err(format!("{other:?} is not \"refuse\" or \"warn\"")),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            EnforceLimits::Refuse => "refuse",
            EnforceLimits::Warn => "warn",
        }
    }
}

/// `memory (--mem 16G) or cpu (--cpus-per-gpu 4)`: each of `limits` with
/// what `spec` asks of it.
pub fn asked_words(limits: LimitSet, spec: &JobSpec) -> String {
    let words: Vec<String> = limits
        .iter()
        .map(|limit| match limit {
            Limit::Memory => format!("memory (--mem {})", size_words(spec.mem_bytes.unwrap_or(0))),
            Limit::Cpu => format!("cpu (--cpus-per-gpu {})", spec.cpus_per_gpu.unwrap_or(0)),
            other => other.name().to_string(),
        })
        .collect();
    words.join(" or ")
}

/// The warning kept on a job started on `node`, which does not enforce
/// `missing` of what it asks for.
pub fn warning(node: &str, missing: LimitSet, spec: &JobSpec) -> String {
    format!(
        "warning: node {node} does not enforce {}: the job may use more",
        asked_words(missing, spec)
    )
}

/// Bytes as a size flag takes them: `16G`, `256M`, `1536K`, else bytes.
fn size_words(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes > 0 && bytes.is_multiple_of(1u64 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}
