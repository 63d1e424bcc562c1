//! Teams sharing the pool, on the controller's side: charging attempts to
//! their team's ledger, carrying out the scheduler's preemptions (checkpoint
//! signal, grace, kill), checkpoint reports, and the hour's waste budget.

use super::agents::{kill_message, signal_message};
use super::{Batch, Preempting, State, Write};
use crate::error::Error;
use gpool_core::accounting::AttemptRecord;
use gpool_core::job_state::{JobEvent, JobState};
use gpool_core::model::{GpuModel, GpuUse};
use gpool_core::sched::RunningJob;
use gpool_core::{Epoch, JobId, Timestamp};

mod running_index;
mod victims;
use running_index::move_running_index;

/// SIGUSR1 on Linux: the checkpoint signal of jobs that name none.
pub const DEFAULT_CHECKPOINT_SIGNAL: i32 = 10;
/// A preempted attempt past its grace is told to end again this often,
/// until it does (its agent may have been away when the first kill went).
const KILL_RESEND_MS: i64 = 15_000;

/// What `gpool checkpoint` learns back.
#[derive(Debug, Clone)]
pub struct CheckpointOutcome {
    /// The attempt is being preempted: it is ended now.
    pub preempted: bool,
}

impl State {
    /// Applies `event` to job `id` and, when that ends its running attempt,
    /// charges the attempt's GPU time to its team. Returns whether the event
    /// applied.
    pub(super) fn apply_event(&mut self, id: JobId, event: &JobEvent, now: Timestamp, out: &mut Batch) -> bool {
        let Some(job) = self.jobs.get_mut(&id) else {
            return false;
        };
        let before = job.state.clone();
        if job.apply(event).is_err() {
            return false;
        }
        let waiting_changed = before == JobState::Pending || job.state == JobState::Pending;
        // The index of running jobs by node follows the job's placement.
        move_running_index(&mut self.running_on, id, &before, &job.state);
        let array_task = job.array_task;
        let ended = job.state.is_finished() && !before.is_finished();
        if job.state.is_finished() {
            self.active.remove(&id);
            if job.array.is_some() {
                self.array_running.remove(&id);
            }
        }
        out.writes.push(Write::Job(id));
        out.changed.push(id);
        if let JobState::Running {
            epoch,
            ref placement,
            started_at,
            burst,
            ..
        } = before
        {
            let same_attempt = matches!(&job.state, JobState::Running { epoch: now_epoch, .. } if *now_epoch == epoch);
            if !same_attempt {
                let share = super::view::share_on(&self.nodes, &self.policy.sharing.shares, &job.spec, placement);
                let gpus = share.map_or_else(
                    || placement.iter().map(|p| p.gpu_indices.len() as f64).sum(),
                    |share| share.part(),
                );
                let team = job.spec.team.to_string();
                // The attempt's record goes: its GPU use into the job's.
                let attempt = self.attempt_ended(id).unwrap_or_default();
                let ended_use = attempt.gpu_use;
                if ended_use != GpuUse::default() {
                    if let Some(job) = self.jobs.get_mut(&id) {
                        job.gpu_use.get_or_insert_with(Default::default).merge(&ended_use);
                    }
                }
                let for_job = attempt.preemption.and_then(|preempting| preempting.for_job);
                self.keep_promise(id, for_job, placement, now);
                self.usage
                    .entry(team.clone())
                    .or_default()
                    .charge(gpus, started_at, now, burst, &self.policy.sharing);
                out.writes.push(Write::Usage(team));
                let record = self.attempt_record(id, &before, ended_use, now);
                out.writes.extend(record.map(|record| Write::Attempt(Box::new(record))));
            }
        }
        if waiting_changed {
            self.refresh_waiting(id);
        }
        if let Some(task) = array_task {
            self.array_task_changed(id, task, &before, now, out);
        }
        if ended {
            self.ended_now(id);
        }
        true
    }

    /// The accounting record of job `id`'s attempt that was `ended` (its
    /// state before the event that ended it), as the job is now.
    fn attempt_record(&self, id: JobId, ended: &JobState, used: GpuUse, now: Timestamp) -> Option<AttemptRecord> {
        let job = self.jobs.get(&id)?;
        let JobState::Running {
            epoch,
            placement,
            started_at,
            burst,
            preempted_at,
            ..
        } = ended
        else {
            return None;
        };
        let (end, lost_gpu_secs) = match (&job.state, preempted_at) {
            (JobState::Pending, Some(at)) => ("preempted", ended.work_since_checkpoint(*at)),
            (JobState::Pending, None) => ("requeued", ended.work_since_checkpoint(now)),
            (JobState::NodeFail { .. }, _) => ("node_fail", ended.work_since_checkpoint(now)),
            (state, _) => (state.name(), 0.0),
        };
        Some(self.record_of(
            job,
            *epoch,
            placement,
            *started_at,
            now,
            *burst,
            end,
            lost_gpu_secs,
            used,
        ))
    }

    /// An accounting record of `job`'s attempt on `placement` from
    /// `started_at` to `ended_at`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn record_of(
        &self,
        job: &gpool_core::Job,
        epoch: Epoch,
        placement: &[gpool_core::NodePlacement],
        started_at: Timestamp,
        ended_at: Timestamp,
        burst: bool,
        end: &str,
        lost_gpu_secs: f64,
        gpu_use: GpuUse,
    ) -> AttemptRecord {
        let mut gpus: std::collections::BTreeMap<GpuModel, u32> = std::collections::BTreeMap::new();
        for part in placement {
            let node = self.nodes.get(&part.node);
            for index in &part.gpu_indices {
                let model = node
                    .and_then(|node| node.gpus.iter().find(|gpu| gpu.index == *index))
                    .map_or_else(|| GpuModel::new("unknown"), |gpu| gpu.model.clone());
                *gpus.entry(model).or_default() += 1;
            }
        }
        let pool = if job.spec.pool.is_empty() {
            self.policy.default_pool.clone()
        } else {
            job.spec.pool.to_string()
        };
        AttemptRecord {
            job: job.id,
            display_id: job.display_id(),
            attempt: job.n_attempts,
            epoch,
            user: job.user.to_string(),
            team: job.spec.team.to_string(),
            project: job.spec.project.clone(),
            workload_type: job.spec.workload_type.clone(),
            qos: job.spec.qos.to_string(),
            pool,
            gpus,
            nodes: placement.iter().map(|part| part.node.clone()).collect(),
            started_at,
            ended_at,
            burst,
            end: end.to_string(),
            lost_gpu_secs,
            gpu_use,
            share_milli: self.share_of(job, placement).map(|share| share.milli),
        }
    }

    /// Accounting records of the attempts running now, as if they ended
    /// at `now` (reports count them up to now).
    pub fn running_records(&self, now: Timestamp) -> Vec<AttemptRecord> {
        self.active_jobs()
            .filter_map(|job| match &job.state {
                JobState::Running {
                    epoch,
                    placement,
                    started_at,
                    burst,
                    ..
                } => {
                    let used = self.attempt(job.id).map(|attempt| attempt.gpu_use).unwrap_or_default();
                    Some(self.record_of(job, *epoch, placement, *started_at, now, *burst, "running", 0.0, used))
                }
                _ => None,
            })
            .collect()
    }

    /// Each team's usage as of `now` (`gpool usage`, `/metrics`): ended
    /// attempts from the ledgers, running ones up to `now`.
    pub fn usage_report(&self, now: Timestamp) -> Vec<gpool_core::policy::TeamUsage> {
        let running = self.running_jobs();
        let running_use: Vec<gpool_core::policy::RunningUse> = running
            .iter()
            .map(|job| gpool_core::policy::RunningUse {
                team: &job.team,
                gpus: job.gpus(),
                charged_gpus: job.charged_gpus(),
                started_at: job.started_at,
                burst: job.burst,
            })
            .collect();
        gpool_core::policy::usage_report(&self.policy.sharing, &self.usage, &running_use, now)
    }

    /// Running jobs as the scheduler sees them.
    pub fn running_jobs(&self) -> Vec<RunningJob> {
        self.running().filter_map(|job| self.running_view(job)).collect()
    }

    /// GPU-seconds preemption may still throw away in the hour up to `now`.
    pub fn waste_budget(&self, now: Timestamp) -> f64 {
        self.waste.left(now, self.policy.sharing.waste_cap_gpu_hours_per_hour)
    }

    /// A withdrawn preemption's grace is over with its attempt running: the
    /// attempt runs on, as if never preempted (`JobEvent::Rescind`).
    fn withdrawn_grace_over(&mut self, id: JobId, epoch: Epoch, now: Timestamp, out: &mut Batch) {
        if let Some(attempt) = self.attempts.get_mut(&id) {
            attempt.preemption = None;
        }
        if self.apply_event(id, &JobEvent::Rescind { epoch, now }, now, out) {
            if let Some(job) = self.jobs.get_mut(&id) {
                job.record_event(now, "grace over with its preemption withdrawn: it runs on".to_string());
            }
            tracing::info!(job = %id, "grace over with the preemption withdrawn: the attempt runs on");
        }
    }

    /// `gpool requeue`: the running attempt `epoch` of `id` is stopped as a
    /// preemption stops it (its checkpoint signal and grace), and the job
    /// goes back to the queue. True if it is on its way back.
    pub(super) fn requeue_attempt(
        &mut self,
        id: JobId,
        epoch: Epoch,
        by: &str,
        now: Timestamp,
        out: &mut Batch,
    ) -> bool {
        let preempting = matches!(
            self.jobs.get(&id).map(|job| &job.state),
            Some(JobState::Running {
                preempted_at: Some(_),
                ..
            })
        );
        if preempting {
            // A withdrawn preemption stands again, as the operator's.
            let withdrawn = self.preemption_mut(id).filter(|preempting| preempting.withdrawn);
            if let Some(preempting) = withdrawn {
                preempting.withdrawn = false;
                if let Some(job) = self.jobs.get_mut(&id) {
                    job.requeue_cause = Some(gpool_core::model::RequeueCause::Requeued);
                    job.record_event(now, format!("requeued by {by}: its grace ends as it was to"));
                    out.writes.push(Write::Job(id));
                }
            }
            return true;
        }
        match self.stop_and_requeue(id, epoch, (true, &format!("requeued by {by}")), now, out) {
            Some((signal, grace_secs)) => {
                tracing::info!(job = %id, by, "requeue: signal {signal}, {grace_secs} s to checkpoint");
                true
            }
            None => false,
        }
    }

    /// Marks attempt `epoch` of `id` preempted, sends it its checkpoint
    /// signal and sets the end of its grace. The signal and grace, if it
    /// was running that attempt.
    /// `why`: whether an operator asked (else the scheduler preempts), and
    /// the words for the job's events.
    fn stop_and_requeue(
        &mut self,
        id: JobId,
        epoch: Epoch,
        (by_operator, why): (bool, &str),
        now: Timestamp,
        out: &mut Batch,
    ) -> Option<(i32, u64)> {
        let job = self.jobs.get(&id)?;
        let JobState::Running { placement, .. } = &job.state else {
            return None;
        };
        let placement = placement.clone();
        let signal = job.spec.checkpoint_signal.unwrap_or(DEFAULT_CHECKPOINT_SIGNAL);
        let grace_secs = self.grace_secs(id);
        if !self.apply_event(
            id,
            &JobEvent::Preempt {
                epoch,
                now,
                by_operator,
            },
            now,
            out,
        ) {
            return None;
        }
        if let Some(job) = self.jobs.get_mut(&id) {
            job.record_event(now, format!("{why}: signal {signal}, {grace_secs} s to checkpoint"));
        }
        self.attempt_mut(id).preemption = Some(Preempting::new(epoch, Timestamp(now.0 + grace_secs as i64 * 1000)));
        for part in placement {
            out.messages.push((part.node, signal_message(id, epoch, signal)));
        }
        Some((signal, grace_secs))
    }

    /// The grace a preempted job gets: its own (within the maximum), else
    /// its QoS's.
    pub(super) fn grace_secs(&self, id: JobId) -> u64 {
        self.jobs
            .get(&id)
            .map_or(0, |job| self.policy.sharing.grace_secs(&job.spec))
    }

    /// Kills preempted attempts whose grace ran out, and again every
    /// `KILL_RESEND_MS` until the attempt has ended (its end removes the
    /// deadline).
    pub(super) fn enforce_preemption_grace(&mut self, now: Timestamp, out: &mut Batch) {
        self.expire_promises(now);
        let mut due: Vec<(JobId, Preempting)> = self
            .attempts
            .iter()
            .filter_map(|(id, attempt)| Some((*id, attempt.preemption?)))
            .filter(|(_, preempting)| preempting.deadline <= now)
            .collect();
        due.sort_unstable_by_key(|(id, _)| *id);
        for (id, preempting) in due {
            let epoch = preempting.epoch;
            if preempting.withdrawn {
                self.withdrawn_grace_over(id, epoch, now, out);
                continue;
            }
            if let Some(preempting) = self.preemption_mut(id) {
                preempting.deadline = Timestamp(now.0 + KILL_RESEND_MS);
            }
            tracing::info!(job = %id, "grace over: ending the preempted attempt");
            self.kill_attempt(id, epoch, out);
        }
    }

    fn kill_attempt(&self, id: JobId, epoch: Epoch, out: &mut Batch) {
        if let Some(JobState::Running { placement, .. }) = self.jobs.get(&id).map(|job| &job.state) {
            for part in placement {
                out.messages.push((part.node.clone(), kill_message(id, epoch)));
            }
        }
    }

    /// Deadlines of preemptions under way when gpoold (re)started.
    pub(super) fn restore_preempt_deadlines(&mut self) {
        let under_way: Vec<(JobId, Epoch, Timestamp)> = self
            .jobs
            .values()
            .filter_map(|job| match &job.state {
                JobState::Running {
                    epoch,
                    preempted_at: Some(at),
                    ..
                } => Some((job.id, *epoch, *at)),
                _ => None,
            })
            .collect();
        // A deadline already kept (a kill sent, on a reload) stays.
        for (id, epoch, at) in under_way {
            let deadline = Timestamp(at.0 + self.grace_secs(id) as i64 * 1000);
            let attempt = self.attempt_mut(id);
            attempt.preemption.get_or_insert(Preempting::new(epoch, deadline));
        }
    }

    /// `gpool checkpoint`: attempt `attempt` of job `id` finished a
    /// checkpoint. A preempted attempt is ended at once.
    pub(super) fn checkpoint(
        &mut self,
        caller: &gpool_core::auth::Caller,
        id: JobId,
        attempt: u32,
        now: Timestamp,
        out: &mut Batch,
    ) -> Result<CheckpointOutcome, Error> {
        let epoch = {
            let job = self.find_job(id)?.ok_or(Error::UnknownJob(id))?;
            gpool_core::auth::authorize(caller, &gpool_core::auth::Action::CheckpointJob(job.auth_ref()))?;
            let JobState::Running { epoch, .. } = &job.state else {
                return Err(Error::NotRunning(id));
            };
            if attempt != job.n_attempts {
                return Err(Error::InvalidRequest {
                    field: "attempt",
                    reason: format!("job {id} runs attempt {}, not {attempt}", job.n_attempts),
                });
            }
            *epoch
        };
        self.apply_event(id, &JobEvent::Checkpointed { epoch, now }, now, out);
        let preempted = matches!(
            self.jobs.get(&id).map(|job| &job.state),
            Some(JobState::Running {
                preempted_at: Some(_),
                ..
            })
        );
        let withdrawn = self.preemption(id).is_some_and(|preempting| preempting.withdrawn);
        if preempted && !withdrawn {
            let deadline = Timestamp(now.0 + KILL_RESEND_MS);
            match self.preemption_mut(id) {
                Some(preempting) => preempting.deadline = deadline,
                None => self.attempt_mut(id).preemption = Some(Preempting::new(epoch, deadline)),
            }
            tracing::info!(job = %id, "checkpoint done: ending the preempted attempt now");
            self.kill_attempt(id, epoch, out);
        }
        Ok(CheckpointOutcome { preempted })
    }
}
