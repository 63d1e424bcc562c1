//! The scheduler's output: which jobs start where, and why the others wait.

use crate::ids::JobId;
use crate::model::NodePlacement;
use crate::policy::Priority;
use std::fmt;

/// What one scheduling cycle decided. Pure data: gpoold turns it into
/// commands, the simulator into events, tests into snapshots.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub starts: Vec<Start>,
    /// Every pending job that does not start, with its reasons: a list of
    /// `lists`, by its place there (jobs alike share one).
    pub pending: Vec<(JobId, u32)>,
    /// The lists of reasons `pending` names, each with at least one.
    pub lists: Vec<Reasons>,
    /// Running jobs to checkpoint and end, so that waiting jobs can start.
    pub preemptions: Vec<Preemption>,
    /// Each job that waits on victims, and the GPUs it will get there: its
    /// victims' and free ones it holds. The free ones stay promised to it
    /// while its victims end (the state keeps them from other jobs), so
    /// that it never needs a victim more because another job took them.
    pub holds: Vec<(JobId, Vec<NodePlacement>)>,
    /// Waiting jobs something was being freed for that may no longer
    /// reclaim GPUs (beyond their guarantee now): what was freed for them
    /// went to whoever needed it this cycle.
    pub released_claims: Vec<JobId>,
    /// Victims in their grace that no waiting job needs any more (the job
    /// they were taken for started elsewhere, or gave up its claims, and
    /// no other job counted on them this cycle): they run on, unharmed,
    /// as if never preempted (attempt named by its epoch).
    pub rescinds: Vec<(JobId, crate::ids::Epoch)>,
    /// Every pending job's priority and its factors, in the view's order.
    pub priorities: Vec<(JobId, Priority)>,
    /// The backfill reservation: the job, from when (its estimated start),
    /// on which GPUs.
    pub reservation: Option<(JobId, crate::ids::Timestamp, Vec<NodePlacement>)>,
    /// Every pending job was looked at (`pending` has all that wait), as
    /// `schedule` always does; `schedule_starts` may stop early.
    pub complete: bool,
    /// A plan of a windowed view that may not be the whole queue's: a job
    /// that would have taken GPUs kept for a QoS class no longer fits at
    /// all, so a later job of its shape past the window may claim the
    /// backfill reservation (`window_gpus`). The whole plan is then needed.
    pub needs_whole: bool,
    /// The first scheduling invariant the plan broke (`invariants::check`,
    /// run by `cycle::plan` on every plan that acts), in words.
    pub broken: Option<String>,
}

impl Plan {
    /// Each job that waits, with its reasons.
    pub fn waiting(&self) -> impl Iterator<Item = (JobId, &[Reject])> {
        self.pending
            .iter()
            .map(|(job, list)| (*job, &*self.lists[*list as usize]))
    }

    /// The reasons `job` waits for, if it waits.
    pub fn reasons_of(&self, job: JobId) -> Option<&[Reject]> {
        self.waiting().find(|(id, _)| *id == job).map(|(_, reasons)| reasons)
    }

    /// Keeps `reasons` as a list jobs may wait for, and gives its place.
    pub fn list(&mut self, reasons: Reasons) -> u32 {
        self.lists.push(reasons);
        self.lists.len() as u32 - 1
    }

    /// `job` waits for the reasons of a new list.
    pub fn wait(&mut self, job: JobId, reasons: Reasons) {
        let list = self.list(reasons);
        self.pending.push((job, list));
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    pub job: JobId,
    /// One entry per node, in rank order (rank 0 first).
    pub placement: Vec<NodePlacement>,
    /// Beyond its team's guarantee: may be preempted.
    pub burst: bool,
    /// A fraction of its one GPU; `None`: whole GPUs.
    pub share: Option<crate::share::Share>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Preemption {
    pub victim: JobId,
    pub epoch: crate::ids::Epoch,
    /// The waiting job its GPUs go to.
    pub for_job: JobId,
    /// GPU-seconds since its last checkpoint (else its start).
    pub lost_gpu_secs: f64,
}

pub use reject::{Reasons, Reject};

mod reject;

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for start in &self.starts {
            write!(f, "start j{}", start.job)?;
            for node in &start.placement {
                write!(f, " {node}")?;
            }
            if start.burst {
                f.write_str(" (burst)")?;
            }
            writeln!(f)?;
        }
        for preemption in &self.preemptions {
            writeln!(
                f,
                "preempt j{} for j{} (loses {:.0} GPU-seconds)",
                preemption.victim, preemption.for_job, preemption.lost_gpu_secs
            )?;
        }
        for (victim, _) in &self.rescinds {
            writeln!(f, "rescind the preemption of j{victim}")?;
        }
        for (job, reasons) in self.waiting() {
            let words: Vec<String> = reasons.iter().map(Reject::to_string).collect();
            writeln!(f, "pending j{job}: {}", words.join("; "))?;
        }
        Ok(())
    }
}
