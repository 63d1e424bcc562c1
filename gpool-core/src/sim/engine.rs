//! The discrete-event loop: arrivals, starts, completions, time limits,
//! preemption signals and kills, on a virtual clock, with
//! `sched::cycle` deciding every start and preemption exactly as gpoold's
//! scheduling loop does (the same window of the queue, the same fallback
//! to the whole queue). Between cycles it does what gpoold's state task
//! does: victims end at their checkpoint signal (saving their work or
//! not) or work on through their grace, the GPUs of a victim that ended are promised to the job it
//! was taken for, and preempted jobs wait again. Every plan is checked
//! against `sched::invariants` and every start against the cluster
//! (`audit`), in release builds too. While no cycle could change anything
//! until the next event, the clock jumps to it (`quiet`).

use super::outcome::{Collector, Outcome};
use super::trace::{OnSignal, TraceJob};
use super::Setup;
use crate::ids::{Epoch, JobId, Timestamp};
use crate::sched::{cycle, ClusterView, JobShape, PendingJob, Plan, Preemption, Queue, Reject, RunningJob, Start};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::sync::Arc;

mod audit;
mod fractions;
mod power;
mod preempted;
mod quiet;
mod take_back;
mod view;
pub use power::PowerOutcome;

/// What a caller may watch while a simulation runs: each cycle (to time
/// it; it must call `run` once and return its plan) and the progress of the
/// virtual clock.
pub trait Observer {
    fn cycle(&mut self, run: &mut dyn FnMut() -> Plan) -> Plan {
        run()
    }
    fn progress(&mut self, _done_ms: i64, _total_ms: i64) {}
}

/// Watches nothing.
pub struct Quiet;
impl Observer for Quiet {}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// While jobs wait, a cycle also runs this often with nothing else
    /// happening (gpoold's timer), so time-based decisions (ages, budgets,
    /// minimum runtimes before preemption) are taken.
    pub tick_secs: u64,
    /// Width of one point of the time series (allocation, queue, shares).
    pub bucket_secs: u64,
    /// After a cycle, the next one waits at least this long: what happens
    /// meanwhile shares it (gpoold's pause after each cycle, in virtual
    /// time; 0: a cycle at every arrival and end).
    pub pause_secs: u64,
    /// How long a resumed node of a power group takes to take work.
    pub resume_delay_secs: u64,
    /// Keep every attempt and every preemption and rescind
    /// (`Outcome::attempts`, `Outcome::events`).
    pub record: bool,
    /// State why every waiting job waits at gpoold's pace
    /// (`sched::WORDS_EVERY`), as gpoold's cycles do. Off, a cycle plans
    /// its starts and preemptions alone, over the queue's window where one
    /// does (`cycle::window_for`), and the whole queue only where the words
    /// are due and a victim is in its grace or GPUs are promised (a
    /// withdrawal may be due, and only a whole plan makes one), or the
    /// setup has power groups (they wake nodes for the waiting jobs the plan
    /// names): the same decisions, at a fraction of the cost with a long
    /// queue, but `Outcome::fragmentation_blocked_jobs`, read from the
    /// words, is not kept. The savings search, which reads only the waits,
    /// replays without them.
    pub words: bool,
    /// Tests only: the start with this number (from 1) is moved onto a
    /// GPU that is taken or of a model its job does not allow, as a broken
    /// scheduler would, for the checks to find.
    #[cfg(any(test, feature = "testing"))]
    pub corrupt_start: Option<u64>,
    /// Tests only: tick even where nothing could change until the next
    /// event (to show that jumping to it changes no decision).
    #[cfg(any(test, feature = "testing"))]
    pub every_tick: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            tick_secs: 60,
            bucket_secs: 3600,
            pause_secs: 0,
            resume_delay_secs: 300,
            record: false,
            words: true,
            #[cfg(any(test, feature = "testing"))]
            corrupt_start: None,
            #[cfg(any(test, feature = "testing"))]
            every_tick: false,
        }
    }
}

/// A running attempt, beside what the scheduler sees of it.
struct Attempt {
    /// When it ends by itself: it completes, or its time limit runs out.
    ends_at: Timestamp,
    timeout: bool,
    checkpoint_every_ms: Option<i64>,
    /// It checkpointed and exited when signalled: nothing is lost.
    checkpointed_on_signal: bool,
    /// Preempted: when its grace ends, and the waste charged when it was
    /// signalled. A `Kill` event holds only at this time: a rescinded
    /// preemption clears it.
    kill_at: Option<(Timestamp, (Timestamp, f64))>,
    /// Its preemption was rescinded in the grace: it runs on past it.
    withdrawn: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// The attempt completes, or reaches its time limit.
    End(JobId, Epoch),
    /// A preempted attempt's grace is over.
    Kill(JobId, Epoch),
    /// A resumed node of a power group (by index in the view) is up.
    NodeUp(usize),
    /// A cycle while nodes of power groups are awake, so that idle ones
    /// are put to sleep in time.
    PowerTick,
}

struct Sim<'a> {
    setup: &'a Setup,
    jobs: &'a [TraceJob],
    now: Timestamp,
    view: ClusterView,
    node_index: HashMap<String, usize>,
    /// Looked up for every running job at every cycle: a fast hasher.
    attempts: HashMap<JobId, Attempt, foldhash::fast::RandomState>,
    /// Work each job has checkpointed (it resumes from there).
    done_ms: Vec<i64>,
    /// Per job: GPU-seconds its ended attempts used (`sched::Las`).
    service_gpu_secs: Vec<u64>,
    next_epoch: u64,
    events: BinaryHeap<Reverse<(Timestamp, Event)>>,
    /// The hour's waste budget, as gpoold charges it.
    waste: crate::sched::WasteBudget,
    /// The waiting jobs by shape, as gpoold's queue keeps them (for the
    /// window of a starts-only cycle); `view.pending` holds the same jobs.
    queue: Queue,
    /// One shape for all the jobs that ask alike, as a batch shares one in
    /// gpoold: a cycle reads every waiting job's, and a few hundred shapes
    /// stay in the cache where 80,000 would not.
    shapes: HashSet<Arc<JobShape>, foldhash::fast::RandomState>,
    /// What is kept for waiting jobs that take GPUs back.
    promises: crate::sched::Promises,
    /// When a cycle last explained every waiting job (gpoold's words),
    /// and whether cycles do (`Options::words`).
    explained_at: Option<Timestamp>,
    words: bool,
    default_limit_secs: Option<u64>,
    out: Collector,
    power: Option<power::PowerSim>,
    audit: audit::Audit,
    /// Starts so far, and the one to corrupt (tests only).
    n_starts: u64,
    corrupt_start: Option<u64>,
    /// Tick through quiet stretches too (tests only).
    every_tick: bool,
}

/// Replays `jobs` (sorted by submit time) on `setup`'s nodes under its
/// policy. Deterministic: the same inputs give the same outcome.
pub fn simulate(setup: &Setup, jobs: &[TraceJob], options: &Options, observer: &mut dyn Observer) -> Outcome {
    let mut sim = Sim::new(setup, jobs, options);
    let first = sim.now;
    let last_submit = jobs.last().map_or(first, |job| job.submit);
    let tick_ms = options.tick_secs.max(1) as i64 * 1000;
    let mut next_arrival = 0;
    let mut last_cycle = first;
    let pause_ms = options.pause_secs as i64 * 1000;
    let mut idle = false;
    // Something happened that the next cycle must see.
    let mut due = false;
    loop {
        let arrival = jobs.get(next_arrival).map(|job| job.submit);
        let event = sim.events.peek().map(|Reverse((at, _))| *at);
        // Ticks only while jobs wait and the last cycle did something or
        // something else will happen (a queue that can never start stops),
        // and not while nothing could change before the next event.
        let quiet = idle && pause_ms == 0 && !sim.every_tick && sim.quiet();
        // A quiet stretch ends at the first tick where a job may be taken
        // back for a less served one of its team (none: it is not quiet).
        let take_back = quiet.then(|| sim.next_take_back()).flatten();
        let quiet = quiet && take_back.is_none_or(|at| at > sim.now);
        let take_back = take_back
            .filter(|_| quiet)
            .map(|at| take_back::first_tick_from(last_cycle, at, tick_ms));
        let tick = (!(sim.view.pending.is_empty() || idle && arrival.is_none() && event.is_none() || quiet))
            .then_some(Timestamp(last_cycle.0 + tick_ms));
        let paused = due.then_some(Timestamp(last_cycle.0 + pause_ms));
        let window = sim.next_window().filter(|_| !sim.view.pending.is_empty());
        let Some(at) = [arrival, event, tick, paused, window, take_back]
            .into_iter()
            .flatten()
            .min()
        else {
            break;
        };
        if quiet {
            sim.skip_ticks(last_cycle, at, tick_ms);
        }
        sim.out.advance(sim.now, at);
        sim.now = at;
        while let Some(job) = jobs.get(next_arrival).filter(|job| job.submit <= at) {
            sim.arrive(next_arrival, job);
            next_arrival += 1;
        }
        while let Some(Reverse((when, event))) = sim.events.peek().copied() {
            if when > at {
                break;
            }
            sim.events.pop();
            match event {
                Event::End(job, epoch) => sim.end(job, epoch),
                Event::Kill(job, epoch) => sim.kill(job, epoch),
                Event::NodeUp(index) => sim.node_up(index),
                Event::PowerTick => {}
            }
        }
        if at.0 < last_cycle.0 + pause_ms && at != first {
            // Within the pause after the last cycle: the next one sees it.
            due = true;
            continue;
        }
        due = false;
        let changed = sim.cycle_unless_quiet(observer, pause_ms);
        idle = !changed;
        last_cycle = at;
        sim.out.snapshot(&sim.view, &sim.queue, &setup.policy);
        observer.progress(at.0 - first.0, (last_submit.0 - first.0).max(1));
    }
    let power = sim.power.take().map(|power| power.finish(sim.now, first));
    let (attempts, events, never_started_by_shape) = sim.finish_records();
    let mut outcome = sim.out.finish(sim.now, sim.view.pending.iter().map(|job| job.id));
    outcome.power = power;
    (outcome.attempts, outcome.events, outcome.never_started_by_shape) = (attempts, events, never_started_by_shape);
    outcome
}

impl Sim<'_> {
    /// A replay of `jobs` under `setup`, at the first job's submit time.
    fn new<'a>(setup: &'a Setup, jobs: &'a [TraceJob], options: &Options) -> Sim<'a> {
        let sharing = &setup.policy.sharing;
        let default_qos = sharing.qos(&sharing.default_qos);
        Sim {
            setup,
            jobs,
            now: jobs.first().map_or(Timestamp(0), |job| job.submit),
            view: ClusterView {
                nodes: setup.nodes.clone(),
                ..ClusterView::default()
            },
            node_index: setup
                .nodes
                .iter()
                .enumerate()
                .map(|(i, node)| (node.name.clone(), i))
                .collect(),
            attempts: HashMap::default(),
            done_ms: vec![0; jobs.len()],
            service_gpu_secs: vec![0; jobs.len()],
            next_epoch: 1,
            events: BinaryHeap::new(),
            waste: crate::sched::WasteBudget::default(),
            queue: Queue::default(),
            shapes: HashSet::default(),
            promises: crate::sched::Promises::default(),
            explained_at: None,
            words: options.words,
            default_limit_secs: default_qos.and_then(|qos| qos.max_time_secs),
            out: Collector::new(setup, jobs, options.bucket_secs),
            power: power::PowerSim::new(setup, options, jobs.first().map_or(Timestamp(0), |job| job.submit)),
            audit: audit::Audit::new(jobs.len(), options.record),
            n_starts: 0,
            #[cfg(any(test, feature = "testing"))]
            corrupt_start: options.corrupt_start,
            #[cfg(not(any(test, feature = "testing")))]
            corrupt_start: None,
            #[cfg(any(test, feature = "testing"))]
            every_tick: options.every_tick,
            #[cfg(not(any(test, feature = "testing")))]
            every_tick: false,
        }
    }

    /// Counts the waiting jobs that enough free GPUs would fit, were they
    /// in one place.
    fn count_fragmented(&mut self, plan: &Plan) {
        for (job, rejects) in plan.waiting() {
            if let Some(Reject::Resources {
                total_free,
                kept,
                gpus_per_node,
                nodes,
                ..
            }) = rejects.first()
            {
                let gpus = u64::from(*gpus_per_node) * u64::from(*nodes);
                if total_free.saturating_sub(*kept) >= gpus {
                    self.out.fragmented(job);
                }
            }
        }
    }

    /// The plan's starts leave the queue and run.
    fn start_all(&mut self, starts: Vec<Start>) {
        // Looked up for every waiting job: a fast hasher.
        let started: HashSet<JobId, foldhash::fast::RandomState> = starts.iter().map(|start| start.job).collect();
        if started.is_empty() {
            return;
        }
        let mut starting: Vec<Arc<PendingJob>> = Vec::with_capacity(started.len());
        let queue = &mut self.queue;
        self.view.pending.retain(|job| {
            if started.contains(&job.id) {
                queue.remove(job);
                starting.push(job.clone());
                false
            } else {
                true
            }
        });
        let mut by_id: HashMap<JobId, Arc<PendingJob>> = starting.into_iter().map(|job| (job.id, job)).collect();
        for start in starts {
            if let Some(job) = by_id.remove(&start.job) {
                self.start(job, start);
            }
        }
    }

    /// When a reservation next opens or closes (which changes where jobs
    /// may run).
    fn next_window(&self) -> Option<Timestamp> {
        self.setup
            .policy
            .reservations
            .iter()
            .flat_map(|r| [r.start, r.end])
            .filter(|at| *at > self.now)
            .min()
    }

    fn arrive(&mut self, index: usize, job: &TraceJob) {
        let pool = self.setup.team_pools.get(&job.team).cloned().unwrap_or_default();
        let host = match self.setup.policy.pool(&pool) {
            Some(def) => crate::sched::HostAsk::or_defaults(job.host, &def.defaults, job.gpus_per_node),
            None => job.host,
        };
        let shape = JobShape {
            team: job.team.as_str().into(),
            reservation: Default::default(),
            qos: job.qos.as_str().into(),
            pool: pool.as_str().into(),
            gpu_types: job.gpu_types.clone(),
            gpus_per_node: job.gpus_per_node,
            nodes: job.nodes,
            priority: 0,
            time_limit_secs: job.time_limit_secs.or(self.default_limit_secs),
            requires: None,
            host,
            exclusive: false,
            limits: crate::enforce::asked_by_host(host),
            share: self.share_ask(index),
        };
        let service_gpu_secs = self.service_gpu_secs[index];
        let pending = PendingJob {
            id: JobId(index as u64 + 1),
            submitted_at: job.submit,
            shape: self.shape(shape),
            user: job.user.as_str().into(),
            service_gpu_secs,
            waiting_since: if service_gpu_secs > 0 { self.now } else { job.submit },
        };
        self.out.queued(&pending);
        let pending = Arc::new(pending);
        // In the queue's order, as the cycle's view lists its jobs.
        let at = self.queue.position(&pending);
        self.queue.insert(pending.clone());
        self.view.pending.insert(at, pending);
    }

    /// One scheduling cycle and its plan carried out; whether anything
    /// started or was preempted.
    fn cycle(&mut self, observer: &mut dyn Observer) -> bool {
        let now = self.now;
        // Each shape's jobs together, oldest first, as the queue keeps
        // them (arrivals go in their place, starts only take jobs out):
        // the cycle's order is then a merge of these runs.
        debug_assert!(
            self.view
                .pending
                .iter()
                .map(|job| job.id)
                .eq(self.queue.iter().map(|job| job.id)),
            "the view lists the queue's jobs in its order"
        );
        self.refresh_view();
        let policy = &self.setup.policy;
        let words_due = self.words_due();
        if words_due {
            self.explained_at = Some(now);
        }
        // Without words, a cycle still plans the whole queue when they are
        // due and a victim is in its grace or GPUs are promised (only such a
        // plan withdraws a preemption no longer needed, `Reclaimer::unneeded`,
        // and sees every claim), or power groups read the waiting jobs.
        let explain = words_due
            && (self.words
                || self.power.is_some()
                || !self.promises.is_empty()
                || self.view.running.iter().any(|r| r.preempting));
        // The view holds the queue's window, as gpoold's does, or all of it.
        let window = cycle::window_for(
            &self.view.nodes,
            &self.view.running,
            (policy, now),
            &self.queue,
            0,
            explain,
        );
        let all = window.map(|gpus| {
            let windowed: Vec<Arc<PendingJob>> = self.queue.window(gpus).cloned().collect();
            std::mem::replace(&mut self.view.pending, windowed)
        });
        self.view.windowed = all.is_some();
        let view = &self.view;
        let mut plan = observer.cycle(&mut || {
            cycle::plan(view, policy, now, explain, &mut || ClusterView {
                pending: all.clone().unwrap_or_else(|| view.pending.clone()),
                windowed: false,
                ..view.clone()
            })
        });
        if let Some(broken) = &plan.broken {
            self.out.broke(now, broken.clone());
        }
        if let Some(all) = all {
            self.view.pending = all;
            self.view.windowed = false;
        }
        self.out.cycle();
        if self.words {
            self.count_fragmented(&plan);
        }
        let changed = !plan.starts.is_empty() || !plan.preemptions.is_empty();
        self.start_all(std::mem::take(&mut plan.starts));
        if !self.view.pending.is_empty() {
            self.out.rejected(now);
        }
        self.power_step(&plan);
        self.carry_out(&plan);
        changed
    }

    fn start(&mut self, job: Arc<PendingJob>, mut start: Start) {
        let now = self.now;
        self.n_starts += 1;
        if self.corrupt_start == Some(self.n_starts) {
            self.corrupt(&job, &mut start);
        }
        self.check_placement(&job, &start);
        // What was being freed for it is no longer its (gpoold's
        // `claims_met`): victims still in their grace name it, a job that
        // no longer waits, so the next plan rescinds them unless another
        // job counts on them.
        self.promises.claims_met(job.id);
        let index = job.id.0 as usize - 1;
        let trace = &self.jobs[index];
        self.share_start(&start, &job.user);
        for part in start.placement.iter().filter(|_| start.share.is_none()) {
            // A plan never hands out a GPU that is taken or out of service;
            // the outcome counts it if one ever did.
            let taken = self.node_index.get(&part.node).is_none_or(|i| {
                let node = &self.view.nodes[*i];
                node.availability != crate::sched::Availability::Up
                    || part.gpu_indices.iter().any(|index| {
                        node.gpus
                            .iter()
                            .find(|gpu| gpu.index == *index)
                            .is_none_or(|gpu| gpu.busy)
                    })
            });
            if taken {
                self.out.overcommitted();
            }
            self.set_busy(&part.node, &part.gpu_indices, Some(job.shape.host));
        }
        let remaining = (trace.duration_ms - self.done_ms[index]).max(0);
        let limit_ms = job.shape.time_limit_secs.map(|secs| secs as i64 * 1000);
        let (ends_at, timeout) = match limit_ms {
            Some(limit) if limit < remaining => (Timestamp(now.0 + limit), true),
            _ => (Timestamp(now.0 + remaining), false),
        };
        let epoch = Epoch(self.next_epoch);
        self.next_epoch += 1;
        let mut running = RunningJob::started(&job, epoch, start.burst, start.placement, now);
        running.share = start.share;
        self.out.started(&job, &running, now);
        self.fraction_counts(index, &running, true);
        self.opened(&job, &running);
        self.attempts.insert(
            job.id,
            Attempt {
                ends_at,
                timeout,
                checkpoint_every_ms: trace.checkpoint_every_secs.map(|secs| secs.max(1) as i64 * 1000),
                checkpointed_on_signal: false,
                kill_at: None,
                withdrawn: false,
            },
        );
        self.events.push(Reverse((ends_at, Event::End(job.id, epoch))));
        self.view.running.push(running);
    }

    /// Takes the attempt `epoch` of `job` off its GPUs and charges its team.
    fn stop(&mut self, job: JobId, epoch: Epoch) -> Option<(RunningJob, Attempt)> {
        let at = self.view.running.iter().position(|r| r.id == job && r.epoch == epoch)?;
        let running = self.view.running.swap_remove(at);
        let attempt = self.attempts.remove(&job)?;
        if let Some(for_job) = running.preempted_for.filter(|_| running.preempting) {
            self.promises
                .victim_ended(running.id, for_job, &running.placement, self.now);
        }
        for part in running.placement.iter().filter(|_| running.share.is_none()) {
            self.set_busy(&part.node, &part.gpu_indices, None);
        }
        self.share_stop(&running);
        self.fraction_counts(job.0 as usize - 1, &running, false);
        self.view.usage.entry(running.team.clone()).or_default().charge(
            running.charged_gpus(),
            running.started_at,
            self.now,
            running.burst,
            &self.setup.policy.sharing,
        );
        Some((running, attempt))
    }

    fn end(&mut self, job: JobId, epoch: Epoch) {
        if let Some((running, attempt)) = self.stop(job, epoch) {
            self.out.ended(&running, self.now, attempt.timeout);
            let state = if attempt.timeout {
                super::EndState::TimedOut
            } else {
                super::EndState::Completed
            };
            self.release(&running, state);
        }
    }

    /// Marks `gpus` busy for a start, with the CPUs and memory it asks for
    /// (`Some`), or free at an end, with theirs (`None`).
    fn set_busy(&mut self, node: &str, gpus: &[u32], started: Option<Option<crate::sched::HostAsk>>) {
        if let Some(view) = self.node_index.get(node).map(|i| &mut self.view.nodes[*i]) {
            match started {
                Some(ask) => view.occupy(gpus, ask),
                None => view.release(gpus),
            }
        }
    }
}
