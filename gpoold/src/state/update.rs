//! `gpool update`: changing pending jobs (time limit, priority, an array's
//! %N), each id on its own.

use super::{Batch, CancelOutcome, State, Write};
use crate::error::Error;
use gpool_core::auth::{authorize, Action, Caller};
use gpool_core::job_state::JobState;
use gpool_core::JobId;

/// The changes one request asks for; `None` leaves a field alone.
#[derive(Debug, Clone, Copy, Default)]
pub struct JobUpdate {
    pub time_limit_secs: Option<u64>,
    pub priority: Option<i32>,
    /// An array's %N; `Some(None)` lifts it.
    pub max_parallel: Option<Option<u32>>,
}

impl State {
    pub(super) fn update(
        &mut self,
        caller: &Caller,
        ids: &[JobId],
        change: JobUpdate,
        out: &mut Batch,
    ) -> Result<Vec<CancelOutcome>, Error> {
        if ids.is_empty() {
            return Err(Error::InvalidRequest {
                field: "ids",
                reason: "no job id given".into(),
            });
        }
        if change.time_limit_secs.is_none() && change.priority.is_none() && change.max_parallel.is_none() {
            return Err(Error::InvalidRequest {
                field: "update",
                reason: "nothing to change (give --time, --priority or --max-parallel)".into(),
            });
        }
        if let Some(limit) = change.time_limit_secs {
            if limit == 0 || limit > gpool_core::spec::MAX_TIME_LIMIT_SECS {
                return Err(Error::InvalidRequest {
                    field: "time",
                    reason: "must be more than zero and at most 365d".into(),
                });
            }
        }
        let mut outcomes = Vec::with_capacity(ids.len());
        for id in ids {
            let refused = self.check_update(caller, *id, change).err();
            // A task that is not a job yet becomes one to be changed alone.
            if refused.is_none() {
                self.materialize(*id, out);
            }
            let mut outcome = CancelOutcome {
                id: *id,
                refused,
                ..CancelOutcome::default()
            };
            if outcome.refused.is_none() {
                let mut targets = vec![*id];
                if let Some(array) = self.jobs.get(id).filter(|job| job.array.is_some()) {
                    targets.extend(self.array_task_ids(array));
                }
                for target in targets {
                    outcome.updated |= self.update_one(target, change, out);
                }
            }
            outcome.state = self.state_of(*id);
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    fn check_update(&self, caller: &Caller, id: JobId, change: JobUpdate) -> Result<(), Error> {
        let job = self.find_job(id)?.ok_or(Error::UnknownJob(id))?;
        let longer_time = change
            .time_limit_secs
            .is_some_and(|limit| job.spec.time_limit_secs.is_some_and(|now| limit > now));
        authorize(
            caller,
            &Action::UpdateJob {
                job: job.auth_ref(),
                longer_time,
                priority: change.priority,
                max_user_priority: self.policy.sharing.max_user_priority,
            },
        )?;
        if change.max_parallel.is_some() && job.array.is_none() {
            return Err(Error::InvalidRequest {
                field: "max_parallel",
                reason: format!("job {} is not an array", job.display_id()),
            });
        }
        if job.state != JobState::Pending {
            return Err(Error::InvalidRequest {
                field: "ids",
                reason: format!(
                    "job {} is {}: only a pending job can be changed",
                    job.display_id(),
                    job.state.name()
                ),
            });
        }
        Ok(())
    }

    /// Applies `change` to a pending job; true if it changed.
    fn update_one(&mut self, id: JobId, change: JobUpdate, out: &mut Batch) -> bool {
        let Some(job) = self.jobs.get_mut(&id).filter(|job| job.state == JobState::Pending) else {
            return false;
        };
        // Changed on a copy: an unchanged job keeps sharing its spec.
        let mut spec = (*job.spec).clone();
        if let Some(limit) = change.time_limit_secs {
            spec.time_limit_secs = Some(limit);
        }
        if let Some(priority) = change.priority {
            spec.priority = priority;
        }
        if let (Some(max), Some(array)) = (change.max_parallel, spec.array.as_mut()) {
            array.max_parallel = max;
        }
        let changed = spec != *job.spec;
        if changed {
            job.spec = std::sync::Arc::new(spec);
        }
        if changed {
            out.writes.push(Write::Job(id));
            out.changed.push(id);
            self.refresh_waiting(id);
        }
        changed
    }
}
