//! The scheduling loop: on every change that can free or need GPUs and on a
//! timer, runs `gpool_core::sched::schedule` on a view of the state and sends
//! the Plan to the state task. Changes that arrive while a cycle runs, or
//! during the pause after it, share the next cycle. A wake-up that finds
//! the state as the last cycle saw it runs none
//! (`gpool_core::sched::cycle_needed`).

use crate::state::{Command, StateHandle};
use gpool_core::sched::{could_act, cycle_needed, schedule, schedule_starts, words_interval, LastCycle, Plan, Reject};
use gpool_core::{JobId, Timestamp};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A cycle also runs this often when nothing happened (time-based policy).
const PERIOD: Duration = Duration::from_secs(5);
/// After a cycle that took `t`, the next waits at least `t * IDLE_FACTOR`,
/// so that scheduling never takes more than a fifth of a core under a
/// flood of submissions.
const IDLE_FACTOR: u32 = 4;

pub async fn run(handle: StateHandle, clock: fn() -> Timestamp, metrics: Arc<crate::metrics::Metrics>) {
    // Why each waiting job waits, its priority and its place in the queue
    // are rendered and handed to the state when due (`words_interval` of
    // what they cost last time; under a flood of short jobs that work is
    // most of a cycle's); a cycle that changes nothing always hands them
    // over.
    let mut words_at: Option<Instant> = None;
    let mut words_every = words_interval(Duration::ZERO);
    let mut last: Option<LastCycle> = None;
    let mut wait = PERIOD;
    loop {
        let on_timer = tokio::time::timeout(wait, handle.sched_wakeup.notified())
            .await
            .is_err();
        wait = PERIOD;
        let started = Instant::now();
        let now = clock();
        let words_due = words_at.is_none_or(|at| at.elapsed() >= words_every);
        let (view, policy, generation) = {
            let state = handle.shared.read().unwrap_or_else(|poisoned| poisoned.into_inner());
            let generation = state.sched_generation;
            let words_age = words_at.map(|at| at.elapsed());
            if !cycle_needed(last.as_ref(), generation, on_timer, words_age) {
                drop(state);
                metrics.unchanged_cycle_seconds.observe(started.elapsed().as_secs_f64());
                continue;
            }
            // With no free GPU and no possible victim, a cycle could only
            // restate why jobs wait: that waits until it is due, however
            // long the queue (a full pool under a flood of submissions and
            // ends costs a look at its nodes per change), unless a job just
            // submitted has no word yet.
            if !words_due && !state.newest_waits_unexplained() && !state.cycle_could_act() {
                wait = words_at.map_or(Duration::ZERO, |at| words_every.saturating_sub(at.elapsed()));
                continue;
            }
            (state.cluster_view(now), state.policy.clone(), generation)
        };
        let acts = could_act(&view.nodes, &view.running, &policy);
        last = Some(LastCycle {
            generation,
            could_act: acts,
        });
        // The words are handed over from a whole plan only: when they are
        // due, or where nothing can start (the cycle then settles).
        // Otherwise the plan stops once nothing more can start.
        let mut plan = tokio::task::block_in_place(|| {
            if words_due || !acts {
                schedule(&view, &policy, now)
            } else {
                schedule_starts(&view, &policy, now)
            }
        });
        let starts = std::mem::take(&mut plan.starts);
        let preemptions = std::mem::take(&mut plan.preemptions);
        let settled = starts.is_empty() && preemptions.is_empty();
        if settled && !plan.complete {
            // A cycle that changes nothing hands its words over: from the
            // whole plan (the same starts and preemptions: none).
            plan = tokio::task::block_in_place(|| schedule(&view, &policy, now));
        }
        let planned = (settled || words_due).then(|| {
            let planned = planned_in_words(plan);
            words_at = Some(Instant::now());
            // The whole cycle: its words cost most of it.
            words_every = words_interval(started.elapsed());
            planned
        });
        let compute = started.elapsed();
        metrics.cycle_seconds.observe(compute.as_secs_f64());
        if !starts.is_empty() && handle.commands.send(Command::Start { starts }).await.is_err() {
            return;
        }
        if !preemptions.is_empty() && handle.commands.send(Command::Preempt { preemptions }).await.is_err() {
            return;
        }
        if let Some(planned) = planned {
            if handle.commands.send(planned).await.is_err() {
                return;
            }
        }
        tokio::time::sleep(compute * IDLE_FACTOR).await;
    }
}

/// What the plan says of the jobs that wait, as the state keeps it.
fn planned_in_words(mut plan: Plan) -> Command {
    let priorities: HashMap<JobId, gpool_core::policy::Priority> =
        std::mem::take(&mut plan.priorities).into_iter().collect();
    let queue_positions = queue_positions(&priorities);
    let estimated_starts = plan
        .reservation
        .take()
        .map(|(job, at, _)| (job, at))
        .into_iter()
        .collect();
    let (reasons, hints, codes) = reasons_in_words(plan);
    Command::Planned {
        reasons,
        hints,
        codes,
        priorities,
        estimated_starts,
        queue_positions,
    }
}

/// Each pending job's place in the scheduler's order: highest priority
/// first, then the earlier id.
fn queue_positions(priorities: &HashMap<JobId, gpool_core::policy::Priority>) -> HashMap<JobId, u32> {
    let mut order: Vec<(JobId, f64)> = priorities.iter().map(|(id, p)| (*id, p.total)).collect();
    order.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    order
        .into_iter()
        .enumerate()
        .map(|(position, (id, _))| (id, position as u32 + 1))
        .collect()
}

type Words = HashMap<JobId, Arc<[String]>>;
type Codes = HashMap<JobId, Arc<[&'static str]>>;
/// A reason list rendered once: its reasons, hints and codes.
type Rendered = (Arc<[String]>, Arc<[String]>, Arc<[&'static str]>);

/// The plan's reasons and hints as text, each list rendered once and
/// shared by the jobs that share it (the plan's lists are shared by jobs
/// alike, so a list is known by its address while the plan lives).
fn reasons_in_words(plan: Plan) -> (Words, Words, Codes) {
    let mut rendered: HashMap<*const Reject, Rendered> = HashMap::new();
    let mut reasons = HashMap::with_capacity(plan.pending.len());
    let mut hints = HashMap::with_capacity(plan.pending.len());
    let mut codes = HashMap::with_capacity(plan.pending.len());
    for (job_id, rejects) in &plan.pending {
        let job_id = *job_id;
        let (words, hint_words, code_words) = rendered
            .entry(rejects.as_ptr())
            .or_insert_with(|| {
                let words: Arc<[String]> = rejects.iter().map(ToString::to_string).collect();
                let hint_words: Arc<[String]> = rejects.iter().filter_map(Reject::hint).collect();
                let code_words: Arc<[&'static str]> = rejects.iter().map(Reject::code).collect();
                (words, hint_words, code_words)
            })
            .clone();
        reasons.insert(job_id, words);
        hints.insert(job_id, hint_words);
        codes.insert(job_id, code_words);
    }
    (reasons, hints, codes)
}
