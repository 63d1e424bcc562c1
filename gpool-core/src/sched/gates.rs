//! Why a waiting job waits where the scheduler's plan does not say: gates
//! before the scheduler looks at it (a start time, dependencies, a hold,
//! its array's limit, no cycle yet), and why its last attempt went back to
//! the queue. Each has one code, for scripts, and one sentence; gpoold
//! only gathers the facts.

use crate::ids::{JobId, Timestamp};
use crate::model::{Job, RequeueCause};

/// What holds a waiting job back before any scheduling reason applies,
/// the first that does, in this order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    /// Its `--begin` is still ahead.
    Begin { at: Timestamp },
    /// Its dependencies are not met yet (the words say which).
    Dependency { words: String },
    /// Held: `gpool release` lets it be scheduled.
    Held { job: String },
    /// Its array runs as many tasks as its `%N` allows.
    ArrayLimit { array: JobId, max: u32 },
    /// Submitted since the last cycle's words.
    NotYetScheduled,
}

/// The facts `Gate::of` decides from.
pub struct Facts {
    /// When `--begin` lets it start, if that is still ahead.
    pub begins: Option<Timestamp>,
    /// What its unmet dependencies say, if any.
    pub dependency: Option<String>,
    pub held: bool,
    /// Its array and the array's limit, where the array runs at it.
    pub array_limit: Option<(JobId, u32)>,
    /// The scheduler has said why it waits.
    pub planned: bool,
}

impl Gate {
    /// The gate that holds `job` back, if one does.
    pub fn of(job: &Job, facts: Facts) -> Option<Gate> {
        if let Some(at) = facts.begins {
            return Some(Gate::Begin { at });
        }
        if let Some(words) = facts.dependency {
            return Some(Gate::Dependency { words });
        }
        if facts.held {
            return Some(Gate::Held { job: job.display_id() });
        }
        if let Some((array, max)) = facts.array_limit {
            return Some(Gate::ArrayLimit { array, max });
        }
        (!facts.planned).then_some(Gate::NotYetScheduled)
    }

    pub fn code(&self) -> &'static str {
        match self {
            Gate::Begin { .. } => "begin_time",
            Gate::Dependency { .. } => "dependency",
            Gate::Held { .. } => "held",
            Gate::ArrayLimit { .. } => "array_limit",
            Gate::NotYetScheduled => "not_yet_scheduled",
        }
    }

    pub fn words(&self) -> String {
        match self {
            Gate::Begin { at } => {
                let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(at.0.max(0) as u64);
                format!("not before {} (--begin)", humantime::format_rfc3339_seconds(at))
            }
            Gate::Dependency { words } => words.clone(),
            Gate::Held { job } => format!("held: `gpool release {job}` lets it be scheduled"),
            Gate::ArrayLimit { array, max } => format!(
                "array {array} runs at most {max} tasks at once (%{max}), and {max} run; `gpool update {array} --max-parallel N` changes it"
            ),
            Gate::NotYetScheduled => "waiting for the next scheduling cycle".to_string(),
        }
    }
}

/// A requeued job's first reason and its code: why its attempt went back.
pub fn requeued(job: &Job) -> Option<(String, &'static str)> {
    let cause = job.requeue_cause?;
    let words = match cause {
        RequeueCause::Preempted => format!(
            "preempted ({} time(s)) and requeued: it runs again when it can",
            job.n_preemptions
        ),
        RequeueCause::NodeLost => "requeued: its node was lost (see its events)".to_string(),
        RequeueCause::GpuFault => "requeued: a GPU of its attempt left service (see its events)".to_string(),
        RequeueCause::NodeFault => "requeued: its node left service for a fault (see its events)".to_string(),
        RequeueCause::Requeued => "requeued by an operator: it runs again when it can".to_string(),
    };
    Some((words, cause.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::job_builder;

    fn facts() -> Facts {
        Facts {
            begins: None,
            dependency: None,
            held: false,
            array_limit: None,
            planned: true,
        }
    }

    #[test]
    fn the_first_gate_that_applies_holds_the_job() {
        let job = job_builder(JobId(7)).build();
        assert_eq!(Gate::of(&job, facts()), None);
        let all = Facts {
            begins: Some(Timestamp(86_400_000)),
            dependency: Some("after job 3 completes".into()),
            held: true,
            array_limit: Some((JobId(5), 2)),
            planned: false,
        };
        let gate = Gate::of(&job, all).expect("a gate");
        assert_eq!(gate.code(), "begin_time");
        assert_eq!(gate.words(), "not before 1970-01-02T00:00:00Z (--begin)");
        let held = Gate::of(
            &job,
            Facts {
                held: true,
                array_limit: Some((JobId(5), 2)),
                ..facts()
            },
        )
        .expect("a gate");
        assert_eq!(
            (held.code(), held.words().as_str()),
            ("held", "held: `gpool release 7` lets it be scheduled")
        );
        let limit = Gate::of(
            &job,
            Facts {
                array_limit: Some((JobId(5), 2)),
                ..facts()
            },
        )
        .expect("a gate");
        assert_eq!(limit.code(), "array_limit");
        assert!(limit.words().starts_with("array 5 runs at most 2 tasks at once (%2)"));
        let new = Gate::of(
            &job,
            Facts {
                planned: false,
                ..facts()
            },
        )
        .expect("a gate");
        assert_eq!(new.code(), "not_yet_scheduled");
    }

    #[test]
    fn a_requeued_job_says_why() {
        let mut job = job_builder(JobId(7)).build();
        assert_eq!(requeued(&job), None);
        job.requeue_cause = Some(RequeueCause::GpuFault);
        assert_eq!(requeued(&job).map(|(_, code)| code), Some("gpu_fault"));
    }
}
