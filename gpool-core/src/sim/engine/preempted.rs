//! What the replay does as gpoold's state task does with a plan's
//! preemptions: the checkpoint signal and its grace, a victim no longer
//! needed, the GPUs held for a reclaiming job, and the kill.

use super::*;

impl Sim<'_> {
    /// The preempted attempt gets its checkpoint signal now. A job that
    /// works on through it is killed when its grace (its QoS's) runs out,
    /// unless it ends first; any other ends now, saving its work or not.
    pub(super) fn signal(&mut self, preemption: &Preemption) {
        let now = self.now;
        let sharing = &self.setup.policy.sharing;
        let Some(running) = self
            .view
            .running
            .iter_mut()
            .find(|r| r.id == preemption.victim && r.epoch == preemption.epoch && !r.preempting)
        else {
            return;
        };
        running.preempting = true;
        running.preempted_for = Some(preemption.for_job);
        let running = running.clone();
        let reason = self.preemption_reason(&running, preemption);
        self.note_event(super::super::EventKind::Preempted, &running, preemption.for_job, reason);
        // Taken again in a grace that was withdrawn: the signal went out
        // then, and its grace still ends when it was to.
        if let Some(attempt) = self.attempts.get_mut(&running.id).filter(|a| a.withdrawn) {
            attempt.withdrawn = false;
            if let Some((_, waste)) = attempt.kill_at {
                self.waste.charge(waste);
            }
            return;
        }
        let on_signal = self.jobs[running.id.0 as usize - 1].on_signal.unwrap_or_default();
        let grace_secs = sharing.qos(&running.qos).map_or(60, |qos| qos.grace_secs);
        let grace_ms = grace_secs.min(sharing.max_grace_secs) as i64 * 1000;
        let kill_at = match on_signal {
            OnSignal::WorkOn => Timestamp(now.0 + grace_ms),
            OnSignal::Exit | OnSignal::Checkpoint => now,
        };
        let checkpointed = on_signal == OnSignal::Checkpoint;
        // The budget is charged what is at stake, as gpoold charges it: it
        // cannot know that the job will checkpoint when signalled.
        let waste = (now, preemption.lost_gpu_secs);
        self.waste.charge(waste);
        if let Some(attempt) = self.attempts.get_mut(&running.id).filter(|a| kill_at < a.ends_at) {
            attempt.checkpointed_on_signal = checkpointed;
            attempt.kill_at = Some((kill_at, waste));
            self.events
                .push(Reverse((kill_at, Event::Kill(running.id, running.epoch))));
        }
    }

    /// A victim in its grace is not needed any more: it was signalled, so
    /// it is still requeued if it ends within its grace (as gpoold does),
    /// but it is not killed when the grace is over, and the waste it was
    /// charged is given back. Only jobs that work on through the signal
    /// are still running then.
    pub(super) fn rescind(&mut self, victim: JobId, epoch: Epoch, released: &[JobId]) {
        if let Some(running) = self
            .view
            .running
            .iter()
            .find(|r| r.id == victim && r.epoch == epoch && r.preempting)
            .cloned()
        {
            if let Some(for_job) = running.preempted_for {
                let reason = self.rescind_reason(for_job, released);
                self.note_event(super::super::EventKind::Rescinded, &running, for_job, reason);
            }
        }
        let Some(running) = self
            .view
            .running
            .iter_mut()
            .find(|r| r.id == victim && r.epoch == epoch && r.preempting)
        else {
            return;
        };
        running.preempting = false;
        running.preempted_for = None;
        if let Some(attempt) = self.attempts.get_mut(&victim) {
            attempt.withdrawn = true;
            if let Some((_, waste)) = attempt.kill_at {
                self.waste.give_back(waste);
            }
        }
    }

    /// The free GPUs a job that now waits on new victims holds are
    /// promised to it until its victims' grace is over (as gpoold's state
    /// keeps them).
    pub(super) fn keep_holds(
        &mut self,
        holds: &[(JobId, Vec<crate::model::NodePlacement>)],
        preemptions: &[Preemption],
    ) {
        let sharing = &self.setup.policy.sharing;
        let (running, nodes, node_index) = (&self.view.running, &self.view.nodes, &self.node_index);
        let grace_of = |p: &Preemption| {
            let victim = running.iter().find(|r| r.id == p.victim)?;
            Some(
                sharing
                    .qos(&victim.qos)
                    .map_or(60, |qos| qos.grace_secs)
                    .min(sharing.max_grace_secs),
            )
        };
        let free_now = |node: &str, idx: u32| {
            node_index
                .get(node)
                .is_some_and(|i| nodes[*i].gpus.iter().any(|gpu| gpu.index == idx && !gpu.busy))
        };
        self.promises.hold(holds, (preemptions, grace_of), self.now, free_now);
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
