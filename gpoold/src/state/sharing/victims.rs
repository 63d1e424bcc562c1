//! The state task's side of `gpool_core::sched::apply`, which carries out
//! a plan's preemptions, holds and rescinds as `gpool sim` does: the job
//! records, the signals to agents, and each one's events and metrics.

use super::super::{Batch, State, Write};
use gpool_core::job_state::JobState;
use gpool_core::model::NodePlacement;
use gpool_core::sched::apply::{self, Actions, Ledgers, Victim, Victims};
use gpool_core::sched::waste::Waste;
use gpool_core::sched::Preemption;
use gpool_core::{Epoch, JobId, Timestamp};
use std::cell::OnceCell;
use std::collections::{HashMap, HashSet};

impl State {
    /// The scheduler's preemptions, holds and rescinds that still hold:
    /// each victim gets its checkpoint signal now and is killed when its
    /// grace runs out; each rescinded one runs on.
    pub(in crate::state) fn carry_out(
        &mut self,
        preemptions: &[Preemption],
        holds: &[(JobId, Vec<NodePlacement>)],
        rescinds: &[(JobId, Epoch)],
        now: Timestamp,
        out: &mut Batch,
    ) {
        let actions = Actions {
            preemptions,
            holds,
            rescinds,
        };
        let mut side = Carrying {
            state: self,
            out,
            held: OnceCell::new(),
        };
        apply::carry_out(&mut side, &actions, now);
    }
}

struct Carrying<'s> {
    state: &'s mut State,
    out: &'s mut Batch,
    /// The GPUs running attempts hold, by node (found when first asked).
    held: OnceCell<HashMap<String, HashSet<u32>>>,
}

impl Victims for Carrying<'_> {
    /// The attempt the plan saw, or none: a later one is not preempted.
    fn victim(&self, preemption: &Preemption) -> Victim {
        let state = &self.state;
        let running = state.jobs.get(&preemption.victim).map(|job| &job.state);
        if !matches!(running, Some(JobState::Running { epoch, .. }) if *epoch == preemption.epoch) {
            return Victim::Gone;
        }
        let withdrawn = state
            .attempts
            .get(&preemption.victim)
            .and_then(|attempt| attempt.preemption.as_ref())
            .filter(|preempting| preempting.withdrawn);
        match withdrawn {
            Some(preempting) => Victim::Withdrawn {
                charged: preempting.charged,
            },
            None => Victim::Running,
        }
    }

    /// Taken again while its withdrawn grace runs: the signal went out
    /// then, and the grace still ends as it was to, when what it charged
    /// is lost after all.
    fn take_again(&mut self, preemption: &Preemption, now: Timestamp) -> u64 {
        let (state, victim) = (&mut *self.state, preemption.victim);
        if let Some(preempting) = state
            .attempts
            .get_mut(&victim)
            .and_then(|attempt| attempt.preemption.as_mut())
        {
            preempting.withdrawn = false;
            preempting.for_job = Some(preemption.for_job);
        }
        if let Some(job) = state.jobs.get_mut(&victim) {
            job.record_event(now, format!("preempted again, for job {}", preemption.for_job));
            self.out.writes.push(Write::Job(victim));
        }
        state.grace_secs(victim)
    }

    fn signal(&mut self, preemption: &Preemption, now: Timestamp) -> Option<(u64, f64)> {
        let (state, victim) = (&mut *self.state, preemption.victim);
        let lost = state.jobs.get(&victim)?.state.work_since_checkpoint(now);
        let by = format!("preempted for job {}", preemption.for_job);
        let (signal, grace_secs) = state.stop_and_requeue(victim, preemption.epoch, (false, &by), now, self.out)?;
        if let Some(preempting) = state.preemption_mut(victim) {
            preempting.for_job = Some(preemption.for_job);
            preempting.charged = Some((now, lost));
        }
        tracing::info!(
            job = %victim,
            for_job = %preemption.for_job,
            "preempting: signal {signal}, {grace_secs} s to checkpoint, {lost:.0} GPU-seconds at stake"
        );
        state.metrics.preemptions.inc();
        state.metrics.preempted_gpu_seconds.inc_by(lost);
        Some((grace_secs, lost))
    }

    /// A victim in its grace whose GPUs no waiting job needs any more. The
    /// attempt was signalled, so one that ends within its grace still goes
    /// back to the queue (it may have checkpointed and exited, as asked);
    /// one still running when the grace is over runs on, never killed
    /// (`enforce_preemption_grace`). Only a preemption of the scheduler's
    /// whose kill has not been sent (never an operator's requeue).
    fn withdraw(&mut self, (id, epoch): (JobId, Epoch), now: Timestamp) -> Option<Option<Waste>> {
        let state = &mut *self.state;
        let Some(JobState::Running {
            epoch: running,
            preempted_at: Some(at),
            ..
        }) = state.jobs.get(&id).map(|job| &job.state)
        else {
            return None;
        };
        let grace_over = Timestamp(at.0 + state.grace_secs(id) as i64 * 1000);
        let preempting = state.preemption(id).copied();
        let killing = preempting.map(|p| (p.epoch, p.deadline)) != Some((epoch, grace_over)) || grace_over <= now;
        if *running != epoch || killing || preempting.is_some_and(|p| p.withdrawn) {
            return None;
        }
        let for_job = preempting.and_then(|p| p.for_job)?;
        if let Some(preempting) = state.preemption_mut(id) {
            preempting.for_job = None;
            preempting.withdrawn = true;
        }
        if let Some(job) = state.jobs.get_mut(&id) {
            job.record_event(
                now,
                format!(
                    "preemption withdrawn: job {for_job} no longer needs its GPUs; it runs on past its grace \
                     (if it ends before, it goes back to the queue)"
                ),
            );
            self.out.writes.push(Write::Job(id));
        }
        tracing::info!(job = %id, %for_job, "preemption withdrawn: its GPUs are no longer needed");
        state.metrics.rescinded_preemptions.inc();
        Some(preempting.and_then(|p| p.charged))
    }

    fn free_now(&self, node: &str, gpu: u32) -> bool {
        let held = self.held.get_or_init(|| {
            let mut held: HashMap<String, HashSet<u32>> = HashMap::new();
            for (node, gpu) in self.state.gpu_holders().into_keys() {
                held.entry(node.to_string()).or_default().insert(gpu);
            }
            held
        });
        !held.get(node).is_some_and(|gpus| gpus.contains(&gpu))
    }

    fn ledgers(&mut self) -> Ledgers<'_> {
        Ledgers {
            promises: &mut self.state.promises,
            waste: &mut self.state.waste,
        }
    }
}
