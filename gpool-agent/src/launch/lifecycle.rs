//! An attempt's life here: its launch (or its wait for a stale attempt
//! of the same job to end), signals and kills, the watch on its
//! supervisor, and its end, journaled and reported to gpoold.

use super::process::{await_record, end_event, leads_session, signal_group, supervisor_alive, ProcessExit};
use super::*;
use crate::journal::AttemptRecord as RunningAttempt;
use crate::supervise::{kill_all_but_supervisor, Ended};
use nix::sys::signal::Signal;

/// Grace between SIGTERM and SIGKILL for a stale attempt of a job that
/// has a newer one waiting to start here.
const STALE_GRACE: Duration = Duration::from_secs(10);
/// How long after an attempt's time limit and grace the agent ends it
/// itself, should its supervisor not have.
const BACKSTOP_SLACK_MS: i64 = 5_000;

impl Attempts {
    /// Takes over the attempts a previous agent left in the journal: those
    /// still running are watched again, those that ended are reported.
    pub fn recover(self: &Arc<Self>) {
        // Until the previous agent's spawner is gone, a launch it was asked
        // for may still be handed over.
        crate::supervise::Spawner::wait_for_old(&self.state_dir.join(SPAWNER_PID_FILE), OLD_SPAWNER_PATIENCE);
        let recorded: Vec<RunningAttempt> = self.journal().live().values().cloned().collect();
        for mut attempt in recorded {
            // A launch journaled before the spawner acted on it: its
            // supervisor's pid is in the exit slot if it was handed over.
            if attempt.pgid <= 0 {
                match crate::supervise::launched(&attempt.exit_file, attempt.job_id, attempt.epoch) {
                    Some((pid, launcher)) => {
                        attempt.pgid = pid;
                        attempt.launcher = launcher;
                        self.journal().started(attempt.clone());
                    }
                    // Never handed over (its end, had it run, would be there):
                    // not listed at registration, so gpoold requeues it.
                    None if Ended::read(&attempt.exit_file, attempt.job_id, attempt.epoch).is_none() => {
                        tracing::info!(job = attempt.job_id, "attempt was never launched; gpoold requeues it");
                        self.journal().abandoned(attempt.job_id, attempt.epoch);
                        continue;
                    }
                    None => {}
                }
            }
            if let Some(ended) = Ended::read(&attempt.exit_file, attempt.job_id, attempt.epoch) {
                tracing::info!(
                    job = attempt.job_id,
                    "attempt ended while the agent was away: {ended:?}"
                );
                self.ended(&attempt, ended);
            } else if attempt.launcher.is_some() || (attempt.pgid > 0 && supervisor_alive(attempt.pgid)) {
                // A job its launcher forked is watched while it runs, and its
                // end waited for while its launcher or keeper lives.
                tracing::info!(job = attempt.job_id, pid = attempt.pgid, "re-adopting running attempt");
                let attempts = self.clone();
                self.spawn_task(async move { attempts.watch(attempt).await });
            } else {
                tracing::warn!(job = attempt.job_id, "attempt vanished without an exit record");
                self.ended(&attempt, Ended::Vanished);
            }
        }
    }

    /// Journals how an attempt ended (kept until gpoold surely has it) and
    /// sends it.
    fn ended(&self, attempt: &RunningAttempt, ended: Ended) {
        let killed = self
            .killed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(attempt.job_id, attempt.epoch));
        // An own end of an attempt this agent killed is recorded as killed.
        let ended = match ended {
            Ended::Code(code) if killed => Ended::Killed(code),
            Ended::Signal(signal) if killed => Ended::KilledBy(signal),
            ended => ended,
        };
        self.journal()
            .ended(attempt.job_id, attempt.epoch, &ended.to_line(), now_ms());
        self.terminals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(attempt.job_id, attempt.epoch));
        {
            let mut recent = self.recent_ends.lock().unwrap_or_else(|p| p.into_inner());
            if recent.len() == RECENT_ENDS {
                recent.pop_front();
            }
            recent.push_back((attempt.job_id, attempt.epoch));
        }
        let _ = self.events.send(end_event(attempt.job_id, attempt.epoch, ended));
    }

    /// Ends gpoold may not have yet: every Register carries them.
    pub fn unreported(&self) -> Vec<pb::JobEvent> {
        self.journal()
            .unreported()
            .into_iter()
            .filter_map(|record| {
                let ended = Ended::parse(&record.outcome)?;
                Some(end_event(record.job_id, record.epoch, ended))
            })
            .collect()
    }

    /// A Register that carried these ends succeeded.
    pub fn reported(&self, events: &[pb::JobEvent]) {
        let ends: Vec<(u64, u64)> = events.iter().map(|e| (e.job_id, e.epoch)).collect();
        self.journal().reported(&ends);
    }

    pub fn launch(self: &Arc<Self>, launch: pb::Launch) {
        // Whether an old attempt runs, and queueing behind it, happen under
        // the queue's lock: `finish` journals an end before it takes that
        // lock to look for a waiting launch, so it cannot miss one.
        let mut queued = self.queued.lock().unwrap_or_else(|p| p.into_inner());
        match self.running_epoch(launch.job_id) {
            Some(epoch) if epoch == launch.epoch => {
                drop(queued);
                tracing::warn!(
                    job = launch.job_id,
                    epoch,
                    "launch of an attempt already running here; ignored"
                );
                return;
            }
            // gpoold moved on to a new attempt while an old one still runs
            // here (it was fenced off while this node was away): the old one
            // is ended, and the new one starts when it has.
            Some(old_epoch) => {
                let job_id = launch.job_id;
                tracing::warn!(
                    job = job_id,
                    old_epoch,
                    epoch = launch.epoch,
                    "new attempt waits for the stale one to end"
                );
                queued.insert(job_id, launch);
                drop(queued);
                self.kill(job_id, old_epoch, STALE_GRACE);
                return;
            }
            None => drop(queued),
        }
        let (job_id, epoch) = (launch.job_id, launch.epoch);
        let short = self.space.lock().unwrap_or_else(|p| p.into_inner()).1.clone();
        if !short.is_empty() {
            // Nothing of it runs: gpoold puts it back in the queue.
            tracing::warn!(job = job_id, epoch, "launch refused: {short}");
            let _ = self.events.send(pb::JobEvent {
                job_id,
                epoch,
                outcome: Some(pb::job_event::Outcome::FailedToStart(format!(
                    "node {} refused it: {short}",
                    self.node
                ))),
                cause: pb::EndCause::NodeRefused as i32,
            });
            return;
        }
        match self.spawn(&launch) {
            Ok((launched, exit_file)) => self.started(&launch, launched, exit_file),
            Err(reason) => {
                self.terminals
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&(job_id, epoch));
                self.send(job_id, epoch, pb::job_event::Outcome::FailedToStart(reason));
            }
        }
    }

    /// A launched attempt: journaled with its pid, reported started and
    /// watched until it ends.
    fn started(self: &Arc<Self>, launch: &pb::Launch, launched: crate::supervise::Launched, exit_file: PathBuf) {
        let (job_id, epoch) = (launch.job_id, launch.epoch);
        let (pgid, launcher) = match launched {
            crate::supervise::Launched::Direct(pid, launcher) => (pid, Some(launcher)),
            crate::supervise::Launched::Running(pid) => (pid, None),
            crate::supervise::Launched::Ended(ended) => {
                return self.ran_unanswered((job_id, epoch), exit_file, ended);
            }
        };
        tracing::info!(job = job_id, epoch, pid = pgid, "attempt {} started", launch.attempt);
        let deadline_ms = launch.time_limit.map(|limit| now_ms() + limit.seconds as i64 * 1000);
        let attempt = RunningAttempt {
            job_id,
            epoch,
            pgid,
            exit_file,
            deadline_ms,
            launcher,
        };
        self.journal().started(attempt.clone());
        self.send(job_id, epoch, pb::job_event::Outcome::Started(true));
        let attempts = self.clone();
        match launcher {
            Some(launcher) => self.spawn_task(async move { attempts.watch_announced(attempt, launcher).await }),
            None => self.spawn_task(async move { attempts.watch(attempt).await }),
        }
    }

    /// An attempt whose spawner died before answering, and which had run
    /// to its end by the time the agent looked: started, and ended.
    fn ran_unanswered(&self, (job_id, epoch): (u64, u64), exit_file: PathBuf, ended: Ended) {
        let attempt = RunningAttempt {
            job_id,
            epoch,
            pgid: 0,
            exit_file,
            deadline_ms: None,
            launcher: None,
        };
        self.send(job_id, epoch, pb::job_event::Outcome::Started(true));
        self.ended(&attempt, ended);
    }

    /// SIGTERM to the attempt's whole process group, SIGKILL after `grace`.
    pub fn kill(self: &Arc<Self>, job_id: u64, epoch: u64, grace: Duration) {
        let attempt = self.journal().live().get(&job_id).cloned();
        let Some(attempt) = attempt.filter(|a| a.epoch == epoch) else {
            return;
        };
        tracing::info!(job = job_id, epoch, "killing attempt");
        self.killed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((job_id, epoch));
        let attempts = self.clone();
        self.spawn_task(async move { attempts.terminate(&attempt, grace).await });
    }

    /// Sends `signal` to the attempt's whole process group (the supervisor
    /// outlives it; the job gets it).
    pub fn signal(&self, job_id: u64, epoch: u64, signal: i32) {
        let Some(pgid) = self
            .journal()
            .live()
            .get(&job_id)
            .filter(|a| a.epoch == epoch)
            .map(|a| a.pgid)
        else {
            return;
        };
        match Signal::try_from(signal) {
            Ok(signal) => {
                tracing::info!(job = job_id, epoch, "sending {signal}");
                signal_group(pgid, signal);
            }
            Err(_) => tracing::warn!(job = job_id, "signal {signal} is not a signal here; not sent"),
        }
    }

    pub(super) fn spawn_task(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).spawn(task);
    }

    async fn terminate(&self, attempt: &RunningAttempt, grace: Duration) {
        signal_group(attempt.pgid, Signal::SIGTERM);
        tokio::time::sleep(grace).await;
        if self.running_epoch(attempt.job_id) == Some(attempt.epoch) {
            // Everything but the supervisor, which then records the end,
            // kills what is left in the cgroup and removes a container.
            let cgroup = self.isolation.rules_for(
                &self.cgroup_scope,
                (attempt.job_id, attempt.epoch),
                (&[], &[]),
                crate::cgroup::Limits::default(),
            );
            kill_all_but_supervisor(attempt.pgid, cgroup.as_ref());
            // A job its launcher forked leads its group itself.
            if attempt.launcher.is_some() {
                signal_group(attempt.pgid, Signal::SIGKILL);
            }
        }
    }

    /// Waits for the attempt's supervisor, or its job where the launcher
    /// forked it, to end (ours or one a previous agent started).
    async fn watch(self: &Arc<Self>, attempt: RunningAttempt) {
        // A job the launcher forked that no longer leads its session is
        // gone (its pid taken by another process).
        let gone = attempt.launcher.is_some() && !leads_session(attempt.pgid);
        let exited = match if gone {
            Ok(ProcessExit::Gone)
        } else {
            ProcessExit::open(attempt.pgid)
        } {
            Ok(exited) => exited,
            Err(err) => {
                // No pidfd (e.g. out of file descriptors): poll instead.
                tracing::warn!(
                    job = attempt.job_id,
                    "cannot open a pidfd for {}: {err}; polling",
                    attempt.pgid
                );
                ProcessExit::Polled(attempt.pgid)
            }
        };
        // The supervisor enforces the time limit (it outlives this agent).
        // A supervisor of an older gpool does not: well past its limit and
        // grace, the attempt is ended here.
        let backstop = attempt.deadline_ms.map(|deadline| {
            let at = deadline + crate::supervise::TIME_LIMIT_GRACE_MS as i64 + BACKSTOP_SLACK_MS;
            Duration::from_millis((at - now_ms()).max(0) as u64)
        });
        let in_time = match backstop {
            None => {
                exited.wait().await;
                true
            }
            Some(limit) => tokio::time::timeout(limit, exited.wait()).await.is_ok(),
        };
        if !in_time {
            tracing::warn!(
                job = attempt.job_id,
                "its supervisor did not end it at its time limit; ending it"
            );
            self.terminate(&attempt, STALE_GRACE).await;
            exited.wait().await;
        }
        if let Some(launcher) = attempt.launcher {
            await_record(&attempt, launcher).await;
        }
        self.finish(&attempt);
    }

    /// Waits for the end that the launcher announces of a job it forked;
    /// should the launcher be gone first, or the job outlast its time
    /// limit and grace, watches the job itself.
    async fn watch_announced(self: &Arc<Self>, attempt: RunningAttempt, launcher: crate::supervise::Launcher) {
        if let Some(woken) = self.notices.wait(attempt.job_id, attempt.epoch, launcher) {
            let in_time = match attempt.deadline_ms {
                None => {
                    let _ = woken.await;
                    true
                }
                Some(deadline) => {
                    let at = deadline + crate::supervise::TIME_LIMIT_GRACE_MS as i64 + BACKSTOP_SLACK_MS;
                    let limit = Duration::from_millis((at - now_ms()).max(0) as u64);
                    tokio::time::timeout(limit, woken).await.is_ok()
                }
            };
            if !in_time {
                return self.watch(attempt).await;
            }
        }
        if Ended::read(&attempt.exit_file, attempt.job_id, attempt.epoch).is_none() {
            return self.watch(attempt).await;
        }
        self.finish(&attempt);
    }

    /// The supervisor is gone: record and report how the attempt ended,
    /// then start an attempt that waited for this one.
    fn finish(self: &Arc<Self>, attempt: &RunningAttempt) {
        // Anything left in the group goes with it.
        signal_group(attempt.pgid, Signal::SIGKILL);
        // No exit record means the supervisor itself was killed (SIGKILL).
        let ended = Ended::read(&attempt.exit_file, attempt.job_id, attempt.epoch).unwrap_or(Ended::Vanished);
        tracing::info!(job = attempt.job_id, epoch = attempt.epoch, "attempt ended: {ended:?}");
        self.ended(attempt, ended);
        let queued = self
            .queued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&attempt.job_id);
        if let Some(launch) = queued {
            self.launch(launch);
        }
    }

    fn send(&self, job_id: u64, epoch: u64, outcome: pb::job_event::Outcome) {
        let _ = self.events.send(pb::JobEvent {
            job_id,
            epoch,
            outcome: Some(outcome),
            cause: pb::EndCause::Own as i32,
        });
    }
}
