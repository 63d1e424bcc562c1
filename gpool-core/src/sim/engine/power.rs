//! Power groups in a replay: their nodes sleep until jobs that wait need
//! them, wake `resume_delay` after they are resumed, and sleep again once
//! idle for `suspend_after`. The same `power::Book` decisions gpoold
//! takes, on the virtual clock (a suspend takes no time here), and what
//! the hours they were powered cost.

use super::*;
use crate::power::{wants_room, Action, Book, PowerState, Tick};
use crate::sched::Availability;
use std::collections::BTreeSet;

/// What power groups cost and saved over a replay.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct PowerOutcome {
    /// GPU-hours the groups' nodes were powered (resumed until suspended):
    /// what a cloud bills.
    pub powered_gpu_hours: f64,
    /// At each group's price.
    pub cost: f64,
    /// GPU-hours they slept: what keeping them on all along would have
    /// cost more.
    pub saved_gpu_hours: f64,
    pub resumes: u64,
}

pub(super) struct PowerSim {
    book: Book,
    resume_delay_ms: i64,
    /// When each awake node was resumed.
    powered_since: HashMap<String, Timestamp>,
    powered_gpu_ms: f64,
    cost: f64,
    resumes: u64,
    next_tick: Option<Timestamp>,
}

impl PowerSim {
    pub(super) fn new(setup: &Setup, options: &Options, now: Timestamp) -> Option<PowerSim> {
        (!setup.power.is_empty()).then(|| PowerSim {
            book: Book::new(setup.power.clone(), now),
            resume_delay_ms: options.resume_delay_secs as i64 * 1000,
            powered_since: HashMap::new(),
            powered_gpu_ms: 0.0,
            cost: 0.0,
            resumes: 0,
            next_tick: None,
        })
    }

    /// Charges `node`'s powered time up to `now`.
    fn power_off(&mut self, node: &str, now: Timestamp) {
        if let (Some(since), Some(group)) = (self.powered_since.remove(node), self.book.group_of(node)) {
            let gpu_ms = (now.0 - since.0).max(0) as f64 * f64::from(group.gpus);
            self.powered_gpu_ms += gpu_ms;
            self.cost += gpu_ms / 3_600_000.0 * group.price_per_gpu_hour;
        }
    }

    pub(super) fn finish(mut self, end: Timestamp, start: Timestamp) -> PowerOutcome {
        let awake: Vec<String> = self.powered_since.keys().cloned().collect();
        for node in awake {
            self.power_off(&node, end);
        }
        let all_gpu_ms: f64 = self
            .book
            .groups
            .iter()
            .map(|group| group.nodes.len() as f64 * f64::from(group.gpus))
            .sum::<f64>()
            * (end.0 - start.0).max(0) as f64;
        PowerOutcome {
            powered_gpu_hours: self.powered_gpu_ms / 3_600_000.0,
            cost: self.cost,
            saved_gpu_hours: (all_gpu_ms - self.powered_gpu_ms).max(0.0) / 3_600_000.0,
            resumes: self.resumes,
        }
    }
}

impl Sim<'_> {
    /// After a cycle's starts: the book's tick over the jobs the plan left
    /// waiting for room (`Plan::waiting`, by its `priorities`), carried out (resumes
    /// wake nodes later, suspends at once), and a cycle when an idle node
    /// could next be put to sleep.
    pub(super) fn power_step(&mut self, plan: &crate::sched::Plan) {
        let Some(power) = self.power.as_mut() else { return };
        let now = self.now;
        let pending: HashMap<JobId, &Arc<PendingJob>> = self.view.pending.iter().map(|job| (job.id, job)).collect();
        let priority: HashMap<JobId, f64> = plan.priorities.iter().map(|(id, p)| (*id, p.total)).collect();
        let mut waiting: Vec<PendingJob> = plan
            .waiting()
            .filter(|(_, reasons)| wants_room(reasons.iter().map(Reject::code)))
            .filter_map(|(id, _)| pending.get(&id).map(|job| (***job).clone()))
            .collect();
        waiting.sort_by(|a, b| {
            let (pa, pb) = (priority.get(&a.id).copied(), priority.get(&b.id).copied());
            pb.unwrap_or(0.0).total_cmp(&pa.unwrap_or(0.0)).then(a.id.cmp(&b.id))
        });
        let mut busy = BTreeSet::new();
        let mut linked = BTreeSet::new();
        for name in power.book.nodes.keys() {
            if let Some(node) = self.node_index.get(name).map(|i| &self.view.nodes[*i]) {
                if node.gpus.iter().any(|gpu| gpu.busy) {
                    busy.insert(name.clone());
                }
                if node.availability == Availability::Up {
                    linked.insert(name.clone());
                }
            }
        }
        let closed = BTreeSet::new();
        let tick = Tick {
            now,
            waiting: &waiting,
            policy: &self.setup.policy,
            busy: &busy,
            linked: &linked,
            closed: &closed,
        };
        let actions = power.book.tick(&tick);
        for action in actions {
            match action {
                Action::Resume { nodes, .. } => {
                    for node in nodes {
                        let Some(index) = self.node_index.get(&node) else {
                            continue;
                        };
                        power.powered_since.insert(node.clone(), now);
                        power.resumes += 1;
                        let up_at = Timestamp(now.0 + power.resume_delay_ms);
                        self.events.push(Reverse((up_at, Event::NodeUp(*index))));
                    }
                }
                Action::Suspend { nodes, .. } => {
                    for node in nodes {
                        if let Some(index) = self.node_index.get(&node) {
                            self.view.nodes[*index].availability = Availability::Down;
                        }
                        power.book.gone(&node, now);
                        power.book.suspend_done(&node, now);
                        power.power_off(&node, now);
                    }
                }
                Action::ResumeFailed { .. } => {}
            }
        }
        if let Some(at) = power.book.next_suspend(&tick) {
            if power.next_tick.is_none_or(|next| next <= now || at < next) {
                power.next_tick = Some(at);
                self.events.push(Reverse((at, Event::PowerTick)));
            }
        }
    }

    /// A resumed node's agent registers: it takes work.
    pub(super) fn node_up(&mut self, index: usize) {
        let Some(power) = self.power.as_mut() else { return };
        let name = &self.view.nodes[index].name;
        if power
            .book
            .nodes
            .get(name)
            .is_some_and(|node| node.state == PowerState::PoweringUp)
        {
            power.book.registered(name, self.now);
            self.view.nodes[index].availability = Availability::Up;
        }
    }
}
