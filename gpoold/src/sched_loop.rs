//! The scheduling loop: on every change that can free or need GPUs and on a
//! timer, runs `gpool_core::sched::schedule` on a view of the state and sends
//! the Plan to the state task. Changes that arrive while a cycle runs, or
//! during the pause after it, share the next cycle. A wake-up that finds
//! the state as the last cycle saw it runs none
//! (`gpool_core::sched::cycle_needed`).

use crate::state::words::Words;
use crate::state::{Command, StateHandle};
use gpool_core::sched::{could_act, cycle, cycle_needed, schedule, words_interval, LastCycle};
use gpool_core::Timestamp;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A cycle also runs this often when nothing happened (time-based policy).
const PERIOD: Duration = Duration::from_secs(5);
/// After a cycle that took `t` and started nothing, the next waits at
/// least `t * IDLE_FACTOR`, so that restating a long queue never takes
/// more than a fifth of a core under a flood of submissions.
const IDLE_FACTOR: u32 = 4;
/// After a cycle that started or preempted jobs, the next waits `t *
/// BUSY_FACTOR`: GPUs free up while it waits, and an idle GPU costs more
/// than the controller's CPU (with 100,000 jobs waiting, a cycle takes
/// tens of ms, and four times that of waiting left 32 GPUs idle most of
/// the time). Scheduling then takes at most half a core.
const BUSY_FACTOR: u32 = 1;
/// A cycle whose last one took less runs on the loop's worker thread:
/// handing the worker's place to another thread (`block_in_place`) costs
/// more context switches than such a cycle takes (a stream of short jobs
/// runs hundreds a second). The first cycle, maybe of a long queue
/// restored at start, is taken as long.
const INLINE_UNDER: Duration = Duration::from_millis(1);

/// Runs scheduling cycles until the state task is gone.
pub async fn run(handle: StateHandle, clock: fn() -> Timestamp, metrics: Arc<crate::metrics::Metrics>) {
    // Why each waiting job waits, its priority and its place in the queue
    // are rendered and handed to the state when due (`words_interval` of
    // what they cost last time; under a flood of short jobs that work is
    // most of a cycle's); a whole cycle that changes nothing always hands
    // them over, as does one after a job was submitted that has none yet.
    let mut words_at: Option<Instant> = None;
    let mut words_every = words_interval(Duration::ZERO);
    let mut last: Option<LastCycle> = None;
    let mut wait = PERIOD;
    // The next --begin of a waiting job, or reservation opening or
    // closing: a cycle then, though nothing else changed.
    let mut next_begin: Option<Timestamp> = None;
    let mut last_took = INLINE_UNDER;
    loop {
        let until_begin = next_begin.map(|at| Duration::from_millis((at.0 - clock().0).max(0) as u64));
        let on_timer = tokio::time::timeout(wait.min(until_begin.unwrap_or(wait)), handle.sched_wakeup.notified())
            .await
            .is_err();
        wait = PERIOD;
        let started = Instant::now();
        let now = clock();
        let begun = next_begin.is_some_and(|at| at <= now);
        let words_due = begun || words_at.is_none_or(|at| at.elapsed() >= words_every);
        let (view, policy, generation, unexplained) = match look(
            &handle,
            now,
            (begun, words_due, on_timer),
            last.as_ref(),
            words_at,
            words_every,
        ) {
            Look::Unchanged { next } => {
                next_begin = next;
                metrics.unchanged_cycle_seconds.observe(started.elapsed().as_secs_f64());
                continue;
            }
            Look::Later { next, wait: later } => {
                next_begin = next;
                wait = later;
                continue;
            }
            Look::Cycle { next, view } => {
                next_begin = next;
                *view
            }
        };
        let acts = could_act(&view.nodes, &view.running, &policy, now);
        last = Some(LastCycle {
            generation,
            could_act: acts,
        });
        let (plan, actions) = plan_cycle(&handle, &view, &policy, now, (words_due, unexplained, last_took));
        if let Some(broken) = &actions.broken {
            metrics.sched_invariant_violations.inc();
            tracing::error!(%broken, "a scheduling plan broke an invariant");
        }
        let settled = actions.settled();
        let words_plan = ((settled && plan.complete) || words_due).then_some(plan);
        let compute = started.elapsed();
        last_took = compute;
        metrics.cycle_seconds.observe(compute.as_secs_f64());
        if !actions.send(&handle).await {
            return;
        }
        if let Some(plan) = words_plan {
            // After the starts: playing the queue forward for its
            // estimates costs up to ESTIMATE_STEPS cycles.
            let planned = words_command(&view, plan, &policy, now);
            words_at = Some(Instant::now());
            // The whole cycle: its words cost most of it.
            words_every = words_interval(started.elapsed());
            if handle.commands.send(planned).await.is_err() {
                return;
            }
        }
        let factor = if settled { IDLE_FACTOR } else { BUSY_FACTOR };
        tokio::time::sleep(compute * factor).await;
    }
}

/// What a look at the state under its read lock found. Each has the next
/// timed change (`next_begin`).
enum Look {
    /// Nothing changed since the last cycle: none runs.
    Unchanged { next: Option<Timestamp> },
    /// A cycle could only restate why jobs wait: it waits `wait`.
    Later { next: Option<Timestamp>, wait: Duration },
    /// A cycle runs on this view, policy, generation, and whether the
    /// newest waiting job has no words yet.
    Cycle {
        next: Option<Timestamp>,
        view: Box<(gpool_core::sched::ClusterView, gpool_core::sched::Policy, u64, bool)>,
    },
}

/// Looks at the state (under its read lock) to decide whether a cycle runs,
/// and takes its view if so.
fn look(
    handle: &StateHandle,
    now: Timestamp,
    (begun, words_due, on_timer): (bool, bool, bool),
    last: Option<&LastCycle>,
    words_at: Option<Instant>,
    words_every: Duration,
) -> Look {
    let state = handle.shared.read().unwrap_or_else(|poisoned| poisoned.into_inner());
    let generation = state.sched_generation;
    let next = state.next_timed_change(now);
    let words_age = words_at.map(|at| at.elapsed());
    if !begun && !cycle_needed(last, generation, on_timer, words_age) {
        return Look::Unchanged { next };
    }
    // With no free GPU and no possible victim, a cycle could only
    // restate why jobs wait: that waits until it is due, however
    // long the queue (a full pool under a flood of submissions and
    // ends costs a look at its nodes per change), unless a job just
    // submitted has no word yet.
    if !words_due && !state.newest_waits_unexplained() && !state.cycle_could_act() {
        let wait = words_at.map_or(Duration::ZERO, |at| words_every.saturating_sub(at.elapsed()));
        return Look::Later { next, wait };
    }
    let unexplained = state.newest_waits_unexplained();
    Look::Cycle {
        next,
        view: Box::new((
            state.cluster_view(now, !words_due),
            state.policy.clone(),
            generation,
            unexplained,
        )),
    }
}

/// Plans a cycle: the plan (for its words) and the actions taken out of
/// it; on this thread where the last one took under `INLINE_UNDER`
/// (`last_took`), else beside the runtime's workers.
fn plan_cycle(
    handle: &StateHandle,
    view: &gpool_core::sched::ClusterView,
    policy: &gpool_core::sched::Policy,
    now: Timestamp,
    (words_due, unexplained, last_took): (bool, bool, Duration),
) -> (gpool_core::sched::Plan, Actions) {
    // The words are handed over from a whole plan only: when they are
    // due, or where nothing can start (the cycle then settles).
    // Otherwise the plan stops once nothing more can start, and looks
    // only at the first jobs of each shape (a `windowed` view).
    // Where a QoS keeps GPUs free, the window's plan may not be the
    // whole queue's (`gpool_core::sched::window_gpus`): `cycle::plan`
    // then plans the whole queue, as `gpool sim` does.
    let planned = || cycle::plan(view, policy, now, words_due, &mut || whole_view(handle, now));
    let mut plan = if last_took < INLINE_UNDER {
        planned()
    } else {
        tokio::task::block_in_place(planned)
    };
    let actions = Actions {
        starts: std::mem::take(&mut plan.starts),
        preemptions: std::mem::take(&mut plan.preemptions),
        holds: std::mem::take(&mut plan.holds),
        rescinds: std::mem::take(&mut plan.rescinds),
        broken: plan.broken.take(),
    };
    if actions.settled() && !plan.complete && unexplained {
        // A cycle that changes nothing, after a job was submitted that
        // has no words yet, hands them over: from the whole plan (the
        // same starts and preemptions: none), of the whole queue.
        // Otherwise they wait until due: where a job may be preempted,
        // a full pool runs a cycle at every change (a job that ends),
        // and a whole plan each time would cost the whole queue per
        // change.
        plan = whole_plan(handle, view, policy, now);
    }
    (plan, actions)
}

/// The whole plan, of every waiting job (`view` may be windowed).
fn whole_plan(
    handle: &StateHandle,
    view: &gpool_core::sched::ClusterView,
    policy: &gpool_core::sched::Policy,
    now: Timestamp,
) -> gpool_core::sched::Plan {
    let whole;
    let view = if view.windowed {
        whole = whole_view(handle, now);
        &whole
    } else {
        view
    };
    tokio::task::block_in_place(|| schedule(view, policy, now))
}

/// What a cycle's plan has the state task do.
struct Actions {
    starts: Vec<gpool_core::sched::Start>,
    preemptions: Vec<gpool_core::sched::Preemption>,
    holds: Vec<(gpool_core::JobId, Vec<gpool_core::NodePlacement>)>,
    rescinds: Vec<(gpool_core::JobId, gpool_core::Epoch)>,
    /// The scheduling invariant the plan broke, if any (it is carried out
    /// all the same: the check is a witness, and the state task's own
    /// fencing still refuses a GPU given twice).
    broken: Option<String>,
}

impl Actions {
    /// Whether the cycle changes nothing: no start, preemption or rescind.
    fn settled(&self) -> bool {
        self.starts.is_empty() && self.preemptions.is_empty() && self.rescinds.is_empty()
    }

    /// Sends the starts and preemptions to the state task; false once it
    /// is gone.
    async fn send(self, handle: &StateHandle) -> bool {
        if !self.starts.is_empty()
            && handle
                .commands
                .send(Command::Start { starts: self.starts })
                .await
                .is_err()
        {
            return false;
        }
        if !(self.preemptions.is_empty() && self.rescinds.is_empty())
            && handle
                .commands
                .send(Command::Preempt {
                    preemptions: self.preemptions,
                    holds: self.holds,
                    rescinds: self.rescinds,
                })
                .await
                .is_err()
        {
            return false;
        }
        true
    }
}

/// The words of a whole plan, with the estimates of playing the queue forward.
fn words_command(
    view: &gpool_core::sched::ClusterView,
    plan: gpool_core::sched::Plan,
    policy: &gpool_core::sched::Policy,
    now: Timestamp,
) -> Command {
    let estimates = tokio::task::block_in_place(|| gpool_core::sched::estimate::of_plan(view, &plan, policy, now));
    Command::Planned(Box::new(Words::of_plan(plan).with_estimates(estimates)))
}

/// A view of every waiting job, for a whole plan.
fn whole_view(handle: &StateHandle, now: Timestamp) -> gpool_core::sched::ClusterView {
    let state = handle.shared.read().unwrap_or_else(|poisoned| poisoned.into_inner());
    state.cluster_view(now, false)
}
