//! What the latest scheduling cycle said of the jobs that wait: why each
//! waits and what would help it, its priority, and its place in the queue.
//! Not durable; each `Command::Planned` replaces it whole.
//!
//! One entry per waiting job, in a vector sorted by id, pointing at reason
//! lists that jobs alike share, and at priorities that jobs submitted
//! together share: with 100,000 jobs waiting that is 2.4 MB, and building
//! it hashes nothing. A listing keeps each list's wire form beside it,
//! until the next cycle's words replace it.

use gpool_core::policy::Priority;
use gpool_core::sched::{Plan, Reason, Reject};
use gpool_core::{JobId, Timestamp};
use std::collections::HashMap;
use std::sync::OnceLock;

/// A list of reasons as data and text, rendered once for the jobs that
/// share it.
#[derive(Debug, Default)]
pub struct Rendered {
    /// Each with its code (`resources`, `budget_exhausted`...), sentence,
    /// hint and facts; never changed once rendered (`encoded` keeps them).
    reasons: Vec<Reason>,
    /// The reasons as the wire's, encoded: the first listing that shows
    /// them encodes them, for every job that shares them.
    encoded: OnceLock<Vec<u8>>,
}

impl PartialEq for Rendered {
    fn eq(&self, other: &Rendered) -> bool {
        self.reasons == other.reasons
    }
}

impl Rendered {
    fn of(rejects: &[Reject]) -> Rendered {
        Rendered {
            reasons: rejects.iter().map(Reason::of_reject).collect(),
            encoded: OnceLock::new(),
        }
    }

    pub fn reasons(&self) -> &[Reason] {
        &self.reasons
    }

    /// The reasons as entries of a wire `Job`'s, to follow its own
    /// (`gpool_proto::listing`).
    pub fn encoded(&self) -> &[u8] {
        self.encoded.get_or_init(|| {
            let wire: Vec<_> = self.reasons.iter().map(gpool_proto::convert::reason_to_wire).collect();
            gpool_proto::listing::encode_reasons(&wire)
        })
    }
}

/// What the cycle said of one waiting job's priority and place.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Said {
    pub priority: Option<Priority>,
    /// Its place in the queue, 1 first: highest priority first, then the
    /// earlier id.
    pub position: Option<u32>,
}

/// One job's words: its reasons (an index in `Words::lists`), priority (in
/// `Words::priorities`) and place; `NONE` where it has none.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Entry {
    list: u32,
    priority: u32,
    position: u32,
}

const NONE: u32 = u32::MAX;

#[derive(Debug, Default)]
pub struct Words {
    lists: Vec<Rendered>,
    /// Each run of equal priorities in the plan once (jobs of one batch
    /// have the same).
    priorities: Vec<Priority>,
    /// By id, each once.
    jobs: Vec<(JobId, Entry)>,
    /// Arrays that wait for the words of one of their tasks (the first that
    /// is not a job yet: the scheduler saw that task, not the array).
    lent: HashMap<JobId, JobId>,
    /// When the job the backfill reservation is for should start.
    estimated_start: Option<(JobId, Timestamp)>,
    /// When others should (`gpool_core::sched::estimate`), where known.
    estimates: HashMap<JobId, Timestamp>,
}

impl Words {
    /// What `plan` says of the jobs that wait.
    pub fn of_plan(plan: Plan) -> Words {
        let Plan {
            pending,
            lists,
            priorities,
            reservation,
            ..
        } = plan;
        let mut shared: Vec<Priority> = Vec::new();
        let mut jobs: Vec<(JobId, Entry)> = priorities
            .into_iter()
            .map(|(id, priority)| {
                if shared.last() != Some(&priority) {
                    shared.push(priority);
                }
                let entry = Entry {
                    list: NONE,
                    priority: shared.len() as u32 - 1,
                    position: NONE,
                };
                (id, entry)
            })
            .collect();
        // The view's order is the ids' within the jobs that wait on GPUs
        // alone, then within the others: two sorted runs, nearly.
        jobs.sort_by_key(|(id, _)| *id);
        jobs.dedup_by_key(|(id, _)| *id);
        let mut order: Vec<(f64, JobId, u32)> = jobs
            .iter()
            .enumerate()
            .map(|(index, (id, entry))| (shared[entry.priority as usize].total, *id, index as u32))
            .collect();
        order.sort_unstable_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        for (position, (_, _, index)) in order.into_iter().enumerate() {
            jobs[index as usize].1.position = position as u32 + 1;
        }
        // Each of the plan's lists once, by its place there.
        let lists: Vec<Rendered> = lists.iter().map(|rejects| Rendered::of(rejects)).collect();
        let mut unranked = Vec::new();
        for (id, list) in pending {
            match jobs.binary_search_by_key(&id, |(id, _)| *id) {
                Ok(index) => jobs[index].1.list = list,
                Err(_) => unranked.push((
                    id,
                    Entry {
                        list,
                        priority: NONE,
                        position: NONE,
                    },
                )),
            }
        }
        if !unranked.is_empty() {
            jobs.extend(unranked);
            jobs.sort_by_key(|(id, _)| *id);
        }
        Words {
            lists,
            priorities: shared,
            jobs,
            lent: HashMap::new(),
            estimated_start: reservation.map(|(job, at, _)| (job, at)),
            estimates: HashMap::new(),
        }
    }

    /// With each waiting job's estimated start, as played forward.
    pub fn with_estimates(mut self, estimates: HashMap<JobId, Timestamp>) -> Words {
        self.estimates = estimates;
        self
    }

    /// What the cycle said of job `id` (or of the task an array waits for).
    pub fn of(&self, id: JobId) -> Option<Said> {
        let entry = self.entry(id)?;
        Some(Said {
            priority: self.priorities.get(entry.priority as usize).copied(),
            position: (entry.position != NONE).then_some(entry.position),
        })
    }

    fn entry(&self, id: JobId) -> Option<&Entry> {
        let own = |id: JobId| {
            self.jobs
                .binary_search_by_key(&id, |(id, _)| *id)
                .ok()
                .map(|index| &self.jobs[index].1)
        };
        own(id).or_else(|| own(*self.lent.get(&id)?))
    }

    /// Job `id`'s reasons, each with its hint and code, where the cycle gave it some.
    pub fn reasons(&self, id: JobId) -> Option<&Rendered> {
        self.lists.get(self.entry(id)?.list as usize)
    }

    /// The backfill reservation's start for its job; else the start the
    /// cycle played forward gives (none for a job that could start now).
    pub fn estimated_start(&self, id: JobId) -> Option<Timestamp> {
        self.estimated_start
            .filter(|(job, _)| *job == id)
            .map(|(_, at)| at)
            .or_else(|| self.estimates.get(&id).copied())
    }

    /// The ids the cycle said something of, in order.
    pub fn ids(&self) -> impl Iterator<Item = JobId> + '_ {
        self.jobs.iter().map(|(id, _)| *id)
    }

    /// Lends `array` the words of its task `task` (kept until the next
    /// plan), unless it has its own.
    pub fn lend(&mut self, array: JobId, task: JobId) {
        if self.of(array).is_none() {
            self.lent.insert(array, task);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpool_core::sched::Reject;
    use std::sync::Arc;

    fn priority(total: f64) -> Priority {
        Priority {
            total,
            qos: 0.0,
            fair_share: 0.0,
            age: 0.0,
            size: 0.0,
            nice: 0.0,
        }
    }

    #[test]
    fn each_job_gets_its_reasons_priority_and_place_and_lists_are_shared() {
        let busy: Arc<[Reject]> = Arc::from(vec![Reject::NoEstimate]);
        let plan = Plan {
            // In the view's order: an array task (id 9) among the rest.
            priorities: vec![
                (JobId(3), priority(1.0)),
                (JobId(9), priority(5.0)),
                (JobId(4), priority(1.0)),
                (JobId(7), priority(2.0)),
            ],
            pending: vec![(JobId(9), 0), (JobId(4), 0), (JobId(7), 1)],
            lists: vec![busy, Arc::from(vec![])],
            reservation: Some((JobId(7), Timestamp(1_000), Vec::new())),
            ..Plan::default()
        };
        let mut words = Words::of_plan(plan);
        let positions: Vec<(JobId, Option<u32>)> = words.ids().map(|id| (id, words.of(id).unwrap().position)).collect();
        assert_eq!(
            positions,
            [
                (JobId(3), Some(3)),
                (JobId(4), Some(4)),
                (JobId(7), Some(2)),
                (JobId(9), Some(1))
            ]
        );
        assert_eq!(words.lists.len(), 2, "one rendering per shared list");
        assert_eq!(words.reasons(JobId(4)), words.reasons(JobId(9)));
        assert_eq!(
            words.reasons(JobId(4)).unwrap().reasons()[0].code,
            Reject::NoEstimate.code()
        );
        assert_eq!(words.reasons(JobId(3)), None, "starts: no reasons");
        assert_eq!(words.of(JobId(3)).unwrap().priority, Some(priority(1.0)));
        assert_eq!(words.estimated_start(JobId(7)), Some(Timestamp(1_000)));
        assert_eq!(words.estimated_start(JobId(4)), None);
        // An array waits with its task's words, unless it has its own.
        words.lend(JobId(8), JobId(9));
        words.lend(JobId(3), JobId(9));
        assert_eq!(words.of(JobId(8)), words.of(JobId(9)));
        assert_eq!(words.of(JobId(3)).unwrap().position, Some(3));
        assert_eq!(words.of(JobId(5)), None);
    }
}
