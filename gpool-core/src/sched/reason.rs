//! A waiting job's reasons as data, to the edge: each reason's stable code,
//! its sentence, what would help, and the facts it is made of (counts,
//! models, team, limit). Scripts branch on the code and read the facts;
//! the sentence is for people and may change.

use super::gates::Gate;
use super::plan::Reject;
use crate::ids::{JobId, Timestamp};
use crate::model::Job;

/// One reason a job waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reason {
    /// Stable snake_case: `resources`, `team_cap`, `dependency`...
    pub code: &'static str,
    pub words: String,
    /// What would make the job start sooner, where something would.
    pub hint: Option<String>,
    pub facts: ReasonFacts,
}

/// What a reason is made of: each field is set where the reason has it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReasonFacts {
    pub pool: Option<String>,
    pub team: Option<String>,
    pub user: Option<String>,
    /// The limit reached: a team's or user's cap, a team's guarantee, an
    /// array's `%N`.
    pub limit: Option<u64>,
    /// How much of that limit is in use.
    pub in_use: Option<u64>,
    /// The GPUs the job asks for (per node where `nodes_wanted` is set).
    pub gpus_wanted: Option<u64>,
    /// GPUs free in the pool, on its best node, and kept for others (QoS
    /// reserves it may not take).
    pub gpus_free: Option<u64>,
    pub gpus_free_on_one_node: Option<u64>,
    pub gpus_kept: Option<u64>,
    pub nodes_wanted: Option<u64>,
    pub nodes_with_enough: Option<u64>,
    pub nodes_down: Option<u64>,
    pub nodes_draining: Option<u64>,
    pub models_wanted: Vec<String>,
    pub models_available: Vec<String>,
    /// The reservation it is about, and seconds until it opens or closes
    /// (or until the job behind which this one waits should start).
    pub reservation: Option<String>,
    pub in_secs: Option<u64>,
    /// The job it is about: the reservation's holder, or its array.
    pub job: Option<JobId>,
    /// How many: preemptions under way for it, or times it was preempted.
    pub count: Option<u64>,
    /// When it may start (`--begin`).
    pub at: Option<Timestamp>,
    /// The limits it asks for that nodes do not enforce (`cpu`, `memory`).
    pub limits: Vec<String>,
}

impl Reason {
    pub fn of_reject(reject: &Reject) -> Reason {
        Reason {
            code: reject.code(),
            words: reject.to_string(),
            hint: reject.hint(),
            facts: reject.facts(),
        }
    }

    pub fn of_gate(gate: &Gate) -> Reason {
        let facts = match gate {
            Gate::Begin { at } => ReasonFacts {
                at: Some(*at),
                ..ReasonFacts::default()
            },
            Gate::ArrayLimit { array, max } => ReasonFacts {
                job: Some(*array),
                limit: Some(u64::from(*max)),
                in_use: Some(u64::from(*max)),
                ..ReasonFacts::default()
            },
            Gate::Dependency { .. } | Gate::Held { .. } | Gate::NotYetScheduled => ReasonFacts::default(),
        };
        Reason {
            code: gate.code(),
            words: gate.words(),
            hint: None,
            facts,
        }
    }

    /// Why a requeued job's last attempt went back to the queue, if it did.
    pub fn requeued(job: &Job) -> Option<Reason> {
        let (words, code) = super::gates::requeued(job)?;
        let facts = ReasonFacts {
            count: (job.n_preemptions > 0).then_some(u64::from(job.n_preemptions)),
            ..ReasonFacts::default()
        };
        Some(Reason {
            code,
            words,
            hint: None,
            facts,
        })
    }
}

fn some(n: impl TryInto<u64>) -> Option<u64> {
    n.try_into().ok()
}

impl Reject {
    /// The facts this reason is made of.
    // Long by design: one arm per reason, as `code` and `hint` have.
    pub fn facts(&self) -> ReasonFacts {
        let none = ReasonFacts::default();
        match self {
            Reject::UnknownPool { pool } | Reject::NoNodes { pool } => ReasonFacts {
                pool: Some(pool.clone()),
                ..none
            },
            Reject::NodesUnavailable {
                pool,
                n_down,
                n_draining,
            }
            | Reject::SomeNodesUnavailable {
                pool,
                n_down,
                n_draining,
            } => ReasonFacts {
                pool: Some(pool.clone()),
                nodes_down: some(*n_down),
                nodes_draining: some(*n_draining),
                ..none
            },
            Reject::NoGpuModel {
                pool,
                wanted,
                available,
            } => ReasonFacts {
                pool: Some(pool.clone()),
                models_wanted: wanted.iter().map(|model| model.as_str().to_string()).collect(),
                models_available: available.iter().map(|model| model.as_str().to_string()).collect(),
                ..none
            },
            Reject::TeamCap { team, max_gpus, in_use } => ReasonFacts {
                team: Some(team.clone()),
                limit: some(*max_gpus),
                in_use: Some(*in_use),
                ..none
            },
            Reject::UserCap { user, max, in_use, .. } => ReasonFacts {
                user: Some(user.clone()),
                limit: Some(*max),
                in_use: Some(*in_use),
                ..none
            },
            Reject::NodesReserved { windows, n_nodes } => ReasonFacts {
                reservation: windows.first().map(|(name, _)| name.clone()),
                in_secs: windows.iter().map(|(_, in_secs)| *in_secs).min(),
                count: some(*n_nodes),
                ..none
            },
            Reject::ReservationClosed { name, opens_in_secs } => ReasonFacts {
                reservation: Some(name.clone()),
                in_secs: *opens_in_secs,
                ..none
            },
            Reject::OutlastsReservation { name, closes_in_secs } => ReasonFacts {
                reservation: Some(name.clone()),
                in_secs: Some(*closes_in_secs),
                ..none
            },
            Reject::BehindReservation { job, in_secs } => ReasonFacts {
                job: Some(*job),
                in_secs: Some(*in_secs),
                ..none
            },
            Reject::Reserved { gpus, .. } => ReasonFacts {
                gpus_kept: Some(*gpus),
                ..none
            },
            Reject::NoEstimate | Reject::Requirements { .. } => none,
            Reject::ShareRoom { n_shared, .. } => ReasonFacts {
                count: some(*n_shared),
                ..none
            },
            Reject::Unenforced { limits, n_nodes, .. } => ReasonFacts {
                count: some(*n_nodes),
                limits: limits.names().into_iter().map(String::from).collect(),
                ..none
            },
            Reject::Reclaiming { n_jobs } => ReasonFacts {
                count: some(*n_jobs),
                ..none
            },
            Reject::OverBudget { team, .. } => ReasonFacts {
                team: Some(team.clone()),
                ..none
            },
            Reject::BeyondGuarantee {
                team,
                guaranteed_gpus,
                in_use,
                wanted,
            } => ReasonFacts {
                team: Some(team.clone()),
                limit: some(*guaranteed_gpus),
                in_use: Some(*in_use),
                gpus_wanted: Some(*wanted),
                ..none
            },
            Reject::Resources {
                gpus_per_node,
                nodes,
                total_free,
                max_free_on_one_node,
                n_nodes_with_enough,
                kept,
            } => ReasonFacts {
                gpus_wanted: some(*gpus_per_node),
                nodes_wanted: some(*nodes),
                gpus_free: Some(*total_free),
                gpus_free_on_one_node: some(*max_free_on_one_node),
                nodes_with_enough: some(*n_nodes_with_enough),
                gpus_kept: Some(*kept),
                ..none
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::GpuModel;

    #[test]
    fn a_reason_carries_its_code_words_hint_and_facts() {
        let reason = Reason::of_reject(&Reject::TeamCap {
            team: "nlp".into(),
            max_gpus: 8,
            in_use: 8,
        });
        assert_eq!(reason.code, "team_cap");
        assert_eq!(reason.facts.team.as_deref(), Some("nlp"));
        assert_eq!((reason.facts.limit, reason.facts.in_use), (Some(8), Some(8)));
        assert_eq!(reason.hint.as_deref(), Some("wait for team nlp's running jobs to end"));
        assert_eq!(
            reason.words,
            Reject::TeamCap {
                team: "nlp".into(),
                max_gpus: 8,
                in_use: 8,
            }
            .to_string()
        );

        let models = Reason::of_reject(&Reject::NoGpuModel {
            pool: "default".into(),
            wanted: vec![GpuModel::new("H100")],
            available: vec![GpuModel::new("L4")],
        });
        assert_eq!(models.code, "gpu_model_unavailable");
        assert_eq!(models.facts.models_wanted, vec!["h100".to_string()]);
        assert_eq!(models.facts.models_available, vec!["l4".to_string()]);
    }

    #[test]
    fn resources_says_what_was_asked_and_what_is_free() {
        let reason = Reason::of_reject(&Reject::Resources {
            gpus_per_node: 4,
            nodes: 2,
            total_free: 5,
            max_free_on_one_node: 3,
            n_nodes_with_enough: 0,
            kept: 1,
        });
        let facts = reason.facts;
        assert_eq!((facts.gpus_wanted, facts.nodes_wanted), (Some(4), Some(2)));
        assert_eq!((facts.gpus_free, facts.gpus_free_on_one_node), (Some(5), Some(3)));
        assert_eq!((facts.nodes_with_enough, facts.gpus_kept), (Some(0), Some(1)));
        assert_eq!(facts.team, None);
    }

    #[test]
    fn a_gate_is_a_reason_too() {
        let gate = Reason::of_gate(&Gate::ArrayLimit {
            array: JobId(40),
            max: 3,
        });
        assert_eq!(gate.code, "array_limit");
        assert_eq!((gate.facts.job, gate.facts.limit), (Some(JobId(40)), Some(3)));
    }
}
