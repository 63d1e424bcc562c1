//! What the replay does as gpoold's state task does with a plan's
//! preemptions: the checkpoint signal and its grace, a victim no longer
//! needed, the GPUs held for a reclaiming job, and the kill.

use super::*;
use crate::sched::apply::{Actions, Ledgers, Victim, Victims};
use crate::sched::waste::Waste;

/// The replay's side of `sched::apply`: its view's running jobs, their
/// attempts and the kill events their grace sets.
pub(super) struct Carrying<'s, 'a> {
    pub(super) sim: &'s mut Sim<'a>,
    /// The jobs whose claims the plan let go (for the rescinds' reasons).
    pub(super) released: &'s [JobId],
}

impl Victims for Carrying<'_, '_> {
    fn victim(&self, preemption: &Preemption) -> Victim {
        let sim = &self.sim;
        let running = sim
            .view
            .running
            .iter()
            .any(|r| r.id == preemption.victim && r.epoch == preemption.epoch && !r.preempting);
        match sim.attempts.get(&preemption.victim) {
            _ if !running => Victim::Gone,
            Some(attempt) if attempt.withdrawn => Victim::Withdrawn {
                charged: attempt.kill_at.map(|(_, waste)| waste),
            },
            _ => Victim::Running,
        }
    }

    /// Taken again in a grace that was withdrawn: the signal went out
    /// then, and its grace still ends when it was to.
    fn take_again(&mut self, preemption: &Preemption, _now: Timestamp) -> u64 {
        let grace_secs = self.sim.mark_preempted(preemption);
        if let Some(attempt) = self.sim.attempts.get_mut(&preemption.victim) {
            attempt.withdrawn = false;
        }
        grace_secs
    }

    /// The preempted attempt gets its checkpoint signal now. A job that
    /// works on through it is killed when its grace (its QoS's) runs out,
    /// unless it ends first; any other ends now, saving its work or not.
    /// What is at stake is the plan's figure: gpoold cannot know either
    /// that the job will checkpoint when signalled.
    fn signal(&mut self, preemption: &Preemption, now: Timestamp) -> Option<(u64, f64)> {
        let grace_secs = self.sim.mark_preempted(preemption);
        let sim = &mut *self.sim;
        let on_signal = sim.jobs[preemption.victim.0 as usize - 1].on_signal.unwrap_or_default();
        let kill_at = match on_signal {
            OnSignal::WorkOn => Timestamp(now.0 + grace_secs as i64 * 1000),
            OnSignal::Exit | OnSignal::Checkpoint => now,
        };
        let waste = (now, preemption.lost_gpu_secs);
        if let Some(attempt) = sim.attempts.get_mut(&preemption.victim).filter(|a| kill_at < a.ends_at) {
            attempt.checkpointed_on_signal = on_signal == OnSignal::Checkpoint;
            attempt.kill_at = Some((kill_at, waste));
            sim.events
                .push(Reverse((kill_at, Event::Kill(preemption.victim, preemption.epoch))));
        }
        Some((grace_secs, preemption.lost_gpu_secs))
    }

    /// A victim in its grace is not needed any more: it was signalled, so
    /// it is still requeued if it ends within its grace (as gpoold does),
    /// but it is not killed when the grace is over, and the waste it was
    /// charged is given back. Only jobs that work on through the signal
    /// are still running then.
    fn withdraw(&mut self, (victim, epoch): (JobId, Epoch), _now: Timestamp) -> Option<Option<Waste>> {
        let sim = &mut *self.sim;
        let index = sim
            .view
            .running
            .iter()
            .position(|r| r.id == victim && r.epoch == epoch && r.preempting)?;
        let running = sim.view.running[index].clone();
        if let Some(for_job) = running.preempted_for {
            let reason = sim.rescind_reason(for_job, self.released);
            sim.note_event(super::super::EventKind::Rescinded, &running, for_job, reason);
        }
        let running = &mut sim.view.running[index];
        running.preempting = false;
        running.preempted_for = None;
        let attempt = sim.attempts.get_mut(&victim)?;
        attempt.withdrawn = true;
        Some(attempt.kill_at.map(|(_, waste)| waste))
    }

    /// The free GPUs a job that now waits on new victims holds are
    /// promised to it until its victims' grace is over (as gpoold's state
    /// keeps them).
    fn free_now(&self, node: &str, idx: u32) -> bool {
        let (nodes, node_index) = (&self.sim.view.nodes, &self.sim.node_index);
        node_index
            .get(node)
            .is_some_and(|i| nodes[*i].gpus.iter().any(|gpu| gpu.index == idx && !gpu.busy))
    }

    fn ledgers(&mut self) -> Ledgers<'_> {
        Ledgers {
            promises: &mut self.sim.promises,
            waste: &mut self.sim.waste,
        }
    }
}

impl Sim<'_> {
    /// The plan's preemptions, holds and rescinds, carried out as gpoold's
    /// state task carries them out (`sched::apply`).
    pub(super) fn carry_out(&mut self, plan: &Plan) {
        let now = self.now;
        let actions = Actions {
            preemptions: &plan.preemptions,
            holds: &plan.holds,
            rescinds: &plan.rescinds,
        };
        let mut side = Carrying {
            sim: self,
            released: &plan.released_claims,
        };
        crate::sched::apply::carry_out(&mut side, &actions, now);
    }

    /// The victim is preempted for its plan's job, as the plan says (the
    /// event is noted); returns its grace (its QoS's), in seconds.
    fn mark_preempted(&mut self, preemption: &Preemption) -> u64 {
        let sharing = &self.setup.policy.sharing;
        let Some(running) = self
            .view
            .running
            .iter_mut()
            .find(|r| r.id == preemption.victim && r.epoch == preemption.epoch && !r.preempting)
        else {
            return 0;
        };
        running.preempting = true;
        running.preempted_for = Some(preemption.for_job);
        let running = running.clone();
        let grace_secs = sharing.qos_grace_secs(&running.qos);
        let reason = self.preemption_reason(&running, preemption);
        self.note_event(super::super::EventKind::Preempted, &running, preemption.for_job, reason);
        grace_secs
    }

    /// A preempted attempt's grace ran out: the work since its last
    /// checkpoint is lost, and the job waits again, keeping its submit time.
    pub(super) fn kill(&mut self, job: JobId, epoch: Epoch) {
        let now = self.now;
        if self
            .attempts
            .get(&job)
            .is_none_or(|a| a.kill_at.is_none_or(|(at, _)| at != now))
        {
            return;
        }
        if let Some(attempt) = self.attempts.get_mut(&job).filter(|a| a.withdrawn) {
            // Its grace is over and nobody needs its GPUs: it runs on.
            (attempt.withdrawn, attempt.kill_at) = (false, None);
            return;
        }
        let Some((running, attempt)) = self.stop(job, epoch) else {
            return;
        };
        let index = job.0 as usize - 1;
        let ran = now.0 - running.started_at.0;
        let kept = if attempt.checkpointed_on_signal {
            ran
        } else {
            attempt.checkpoint_every_ms.map_or(0, |every| ran / every * every)
        };
        self.done_ms[index] += kept;
        self.service_gpu_secs[index] = running.service_now(now);
        self.out
            .preempted(&running, now, (ran - kept) as f64 / 1000.0 * running.gpus() as f64);
        self.release(&running, super::super::EndState::Preempted);
        let jobs = self.jobs;
        self.arrive(index, &jobs[index]);
    }
}
