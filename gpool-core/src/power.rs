//! Power saving and cloud nodes, as Slurm's power saving: the nodes of a
//! `[[power]]` group sleep (or do not exist yet) until jobs that wait need
//! them, and go back to sleep once idle. Which nodes to wake, which to put
//! to sleep, and what a resume that never came back means are decided
//! here, as plain functions of the time: gpoold runs the programs, and
//! `gpool sim` prices the trade-off with the same decisions.
//!
//! A node that misses its resume timeout goes back to `powered_down` with
//! the reason and is tried again after a backoff, never left down for an
//! admin; a group whose resumes fail `pause_after_failures` times in a row
//! pauses for `pause`, and says so.

use crate::ids::{JobId, Timestamp};
use crate::model::{Gpu, GpuModel, Node};
use crate::sched::{PendingJob, Policy};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// A group of nodes that sleep when idle, or are created on demand.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    pub name: String,
    pub nodes: Vec<String>,
    pub model: GpuModel,
    pub gpus: u32,
    /// Memory of each GPU; `None`: not known, so a job's GPU memory ask
    /// is not held against the group.
    pub gpu_memory_mib: Option<u64>,
    pub labels: BTreeMap<String, String>,
    pub price_per_gpu_hour: f64,
    /// Idle this long, with nothing waiting that it could take, a node is
    /// suspended; `None`: never.
    pub suspend_after_secs: Option<u64>,
    pub resume_timeout_secs: u64,
    pub suspend_timeout_secs: u64,
    /// Resumes and suspends per minute; 0: no limit.
    pub resume_rate: u32,
    pub suspend_rate: u32,
    /// Nodes up or on their way at once; `None`: all of them.
    pub max_nodes: Option<u32>,
    /// GPU-hours its nodes may be up in one period of the policy's
    /// `[sharing]` (a day, week or month); `None`: no limit.
    pub max_gpu_hours: Option<f64>,
    /// Nodes woken for one team's jobs up at once, and the GPU-hours they
    /// may be up in a period; `None`: no limit.
    pub max_nodes_per_team: Option<u32>,
    pub max_gpu_hours_per_team: Option<f64>,
    /// Failed resumes in a row after which the group pauses, and how long.
    pub pause_after_failures: u32,
    pub pause_secs: u64,
}

/// Where a node of a group stands (sinfo's `~`, `#` and `%`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum PowerState {
    PoweredDown,
    PoweringUp,
    Up,
    PoweringDown,
}

impl PowerState {
    pub fn as_str(self) -> &'static str {
        match self {
            PowerState::PoweredDown => "powered_down",
            PowerState::PoweringUp => "powering_up",
            PowerState::Up => "up",
            PowerState::PoweringDown => "powering_down",
        }
    }

    pub const ALL: [PowerState; 4] = [
        PowerState::PoweredDown,
        PowerState::PoweringUp,
        PowerState::Up,
        PowerState::PoweringDown,
    ];
}

/// One node of a group.
#[derive(Debug, Clone, PartialEq)]
pub struct NodePower {
    /// Its group, by index in `Book::groups`.
    pub group: usize,
    pub state: PowerState,
    /// When it entered `state`.
    pub since: Timestamp,
    /// Up and holding no attempt since then; `None`: busy, or not up.
    pub idle_since: Option<Timestamp>,
    /// Failed resumes in a row.
    pub failures: u32,
    /// Not resumed again before this (the backoff after a failure).
    pub retry_at: Timestamp,
    /// Why it last went back to `powered_down`, where that was a failure.
    pub reason: Option<String>,
    /// The team whose job it was woken for, while it is awake.
    pub woken_for: Option<String>,
    /// While it is powering down: its `suspend` program has ended, and its
    /// agent's link has.
    pub suspend_ran: bool,
    pub agent_left: bool,
}

/// A group's own standing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GroupState {
    /// Failed resumes in a row, across its nodes.
    pub failures_in_row: u32,
    /// No resumes until then.
    pub paused_until: Option<Timestamp>,
    /// Resumes and suspends of the last minute (the rates).
    resumes: VecDeque<Timestamp>,
    suspends: VecDeque<Timestamp>,
    /// How many resumes failed, and how many nodes were resumed, in all.
    pub n_resumes: u64,
    pub n_failed: u64,
    /// The period its GPU-hours count in, and those of its nodes awake in
    /// it (GPU-milliseconds), all and by the team each was woken for.
    pub period_start: Timestamp,
    pub gpu_ms: f64,
    pub team_gpu_ms: BTreeMap<String, f64>,
}

/// What to run: a group's program with its nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Wake these nodes for these jobs.
    Resume {
        group: String,
        nodes: Vec<String>,
        jobs: Vec<JobId>,
    },
    Suspend {
        group: String,
        nodes: Vec<String>,
    },
    /// These nodes missed their resume: the `resume_failed` program.
    ResumeFailed {
        group: String,
        nodes: Vec<String>,
        reason: String,
    },
}

/// What a tick looks at besides the book.
pub struct Tick<'a> {
    pub now: Timestamp,
    /// Jobs that wait for room (`wants_room`), highest priority first.
    pub waiting: &'a [PendingJob],
    pub policy: &'a Policy,
    /// Nodes where an attempt holds GPUs.
    pub busy: &'a BTreeSet<String>,
    /// Nodes whose agent is linked now.
    pub linked: &'a BTreeSet<String>,
    /// Nodes known to take no work even when up (drained, out for a
    /// fault): never woken, never counted on, and put to sleep when idle.
    pub closed: &'a BTreeSet<String>,
}

/// Every group and node, and the jobs waiting for nodes to wake.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Book {
    pub groups: Vec<Group>,
    pub states: Vec<GroupState>,
    pub nodes: BTreeMap<String, NodePower>,
    /// Each job a waking node is for: the nodes, and since when.
    pub waits: BTreeMap<JobId, (Vec<String>, Timestamp)>,
    /// When awake nodes' GPU-hours were last counted.
    counted_at: Option<Timestamp>,
    /// Failed resumes not yet handed out as `Action::ResumeFailed`: the
    /// group, the node and why.
    failed: Vec<(usize, String, String)>,
}

/// The longest wait between two resumes of a node that keeps failing.
pub const MAX_BACKOFF_SECS: u64 = 3600;

/// Whether a job that waits for the reasons of these codes
/// (`Reject::code`) would start if more nodes were up: it waits for room,
/// not for a cap, a reservation or victims.
pub fn wants_room<'a>(codes: impl IntoIterator<Item = &'a str>) -> bool {
    let mut room = false;
    for code in codes {
        match code {
            "no_nodes" | "nodes_unavailable" | "gpu_model_unavailable" | "resources" | "reserved" => room = true,
            "unknown_pool" | "team_cap" | "user_cap" | "preempting" | "reservation" => return false,
            _ => {}
        }
    }
    room
}

/// The reason a job gives while nodes wake for it (`Book::waiting_for`).
pub fn waiting_reason(words: String) -> crate::sched::Reason {
    crate::sched::Reason {
        code: "powering_up",
        words,
        hint: None,
        facts: Default::default(),
    }
}

/// How long a node whose resume failed `failures` times in a row waits
/// before the next: its resume timeout, doubled each time, at most an hour.
pub fn backoff_secs(resume_timeout_secs: u64, failures: u32) -> u64 {
    let doublings = failures.saturating_sub(1).min(20);
    resume_timeout_secs
        .max(1)
        .saturating_mul(1 << doublings)
        .min(MAX_BACKOFF_SECS)
}

fn after(now: Timestamp, secs: u64) -> Timestamp {
    Timestamp(
        now.0
            .saturating_add(i64::try_from(secs.saturating_mul(1000)).unwrap_or(i64::MAX)),
    )
}

fn secs_since(now: Timestamp, then: Timestamp) -> u64 {
    u64::try_from(now.0.saturating_sub(then.0) / 1000).unwrap_or(0)
}

impl Book {
    /// Every node of `groups` powered down, as at a controller's start (a
    /// node that is in fact up registers and is taken as up).
    pub fn new(groups: Vec<Group>, now: Timestamp) -> Book {
        let mut nodes = BTreeMap::new();
        for (index, group) in groups.iter().enumerate() {
            for name in &group.nodes {
                nodes.insert(name.clone(), NodePower::down(index, now));
            }
        }
        let states = vec![GroupState::default(); groups.len()];
        Book {
            groups,
            states,
            nodes,
            waits: BTreeMap::new(),
            counted_at: None,
            failed: Vec::new(),
        }
    }

    /// Takes `groups` (a reload), keeping what is known of nodes that stay
    /// in the same group.
    pub fn reconfigure(&mut self, groups: Vec<Group>, now: Timestamp) {
        let mut next = Book::new(groups, now);
        for (name, node) in &mut next.nodes {
            if let Some(old) = self.nodes.get(name) {
                if self.groups[old.group].name == next.groups[node.group].name {
                    *node = NodePower {
                        group: node.group,
                        ..old.clone()
                    };
                }
            }
        }
        for (index, group) in next.groups.iter().enumerate() {
            if let Some(old) = self.groups.iter().position(|old| old.name == group.name) {
                next.states[index] = self.states[old].clone();
            }
        }
        next.counted_at = self.counted_at;
        next.waits = std::mem::take(&mut self.waits);
        // Failures not yet handed out, of groups that remain.
        for (old, node, why) in std::mem::take(&mut self.failed) {
            let name = &self.groups[old].name;
            if let Some(index) = next.groups.iter().position(|group| &group.name == name) {
                next.failed.push((index, node, why));
            }
        }
        *self = next;
    }

    /// May new work be placed on `node`: it is in no group, or it is up.
    pub fn takes_work(&self, node: &str) -> bool {
        self.nodes.get(node).is_none_or(|power| power.state == PowerState::Up)
    }

    pub fn group_of(&self, node: &str) -> Option<&Group> {
        self.nodes.get(node).map(|power| &self.groups[power.group])
    }

    /// Its agent registered: it is up, whatever it was (one that comes
    /// after its timeout is welcome), except while it is being suspended.
    pub fn registered(&mut self, node: &str, now: Timestamp) {
        let Some(power) = self.nodes.get_mut(node) else { return };
        match power.state {
            PowerState::PoweringDown | PowerState::Up => return,
            PowerState::PoweringUp => {
                // A resume that worked ends the group's run of failures.
                self.states[power.group].failures_in_row = 0;
            }
            PowerState::PoweredDown => {}
        }
        power.state = PowerState::Up;
        power.since = now;
        power.idle_since = Some(now);
        power.failures = 0;
        power.reason = None;
        self.waits
            .retain(|_, (nodes, _)| !nodes.iter().any(|name| name == node));
    }

    /// Its agent's link ended: a node being suspended is down once its
    /// `suspend` program has also ended (`suspend_done`); an up one is down
    /// now (it registers again if it comes back).
    pub fn gone(&mut self, node: &str, now: Timestamp) {
        let Some(power) = self.nodes.get_mut(node) else { return };
        match power.state {
            PowerState::PoweringDown if power.suspend_ran => {
                *power = NodePower {
                    failures: power.failures,
                    ..NodePower::down(power.group, now)
                }
            }
            PowerState::PoweringDown => power.agent_left = true,
            PowerState::Up => {
                *power = NodePower {
                    reason: Some("its agent left while it was up".to_string()),
                    ..NodePower::down(power.group, now)
                }
            }
            PowerState::PoweredDown | PowerState::PoweringUp => {}
        }
    }

    /// Its `suspend` program ended: the node is down once its agent's link
    /// has ended too (`gone`), and never before, so that it is not resumed
    /// while the program still runs.
    pub fn suspend_done(&mut self, node: &str, now: Timestamp) {
        let Some(power) = self.nodes.get_mut(node) else { return };
        if power.state != PowerState::PoweringDown {
            return;
        }
        if power.agent_left {
            *power = NodePower {
                failures: power.failures,
                ..NodePower::down(power.group, now)
            };
        } else {
            power.suspend_ran = true;
        }
    }

    /// Its resume failed (`why`: the program's exit, or the timeout): back
    /// to powered down with the reason, tried again after a backoff. Returns
    /// whether it was powering up (a second report of one failure is not
    /// counted again).
    pub fn resume_failed(&mut self, node: &str, why: &str, now: Timestamp) -> bool {
        let Some(power) = self.nodes.get_mut(node) else {
            return false;
        };
        if power.state != PowerState::PoweringUp {
            return false;
        }
        let group = &self.groups[power.group];
        let failures = power.failures + 1;
        *power = NodePower {
            failures,
            retry_at: after(now, backoff_secs(group.resume_timeout_secs, failures)),
            reason: Some(format!("resume_failed: {why}")),
            ..NodePower::down(power.group, now)
        };
        let state = &mut self.states[power.group];
        state.failures_in_row += 1;
        state.n_failed += 1;
        if group.pause_after_failures > 0 && state.failures_in_row >= group.pause_after_failures {
            state.paused_until = Some(after(now, group.pause_secs));
        }
        self.failed.push((power.group, node.to_string(), why.to_string()));
        self.waits
            .retain(|_, (nodes, _)| !nodes.iter().any(|name| name == node));
        true
    }

    /// The group is paused now (and why, in words).
    pub fn paused(&self, group: usize, now: Timestamp) -> Option<String> {
        let state = &self.states[group];
        let until = state.paused_until.filter(|until| *until > now)?;
        Some(format!(
            "paused after {} failed resumes in a row, for {} s more",
            state.failures_in_row,
            secs_since(until, now)
        ))
    }

    /// What a waiting job waits for, in words: the nodes waking for it.
    pub fn waiting_for(&self, job: JobId, now: Timestamp) -> Option<String> {
        let (nodes, since) = self.waits.get(&job)?;
        Some(format!(
            "waiting for {} to power up (since {} s)",
            nodes.join(", "),
            secs_since(now, *since)
        ))
    }

    /// One step: timeouts first, then the nodes to wake for the jobs that
    /// wait, then the idle nodes to put to sleep. The book changes as the
    /// returned actions say (the programs' own failures come back through
    /// `resume_failed`).
    pub fn tick(&mut self, tick: &Tick<'_>) -> Vec<Action> {
        self.count_gpu_hours(tick);
        let mut actions = self.time_out(tick);
        for state in &mut self.states {
            let minute_ago = Timestamp(tick.now.0 - 60_000);
            state.resumes.retain(|at| *at > minute_ago);
            state.suspends.retain(|at| *at > minute_ago);
            if state.paused_until.is_some_and(|until| until <= tick.now) {
                state.paused_until = None;
                state.failures_in_row = 0;
            }
        }
        self.track_idle(tick);
        actions.extend(self.wake(tick));
        actions.extend(self.put_to_sleep(tick));
        actions
    }

    /// Resumes past their timeout fail; suspends past theirs end (a node
    /// whose agent is still linked is up again); and every failed resume
    /// since the last tick is handed out for `resume_failed`.
    fn time_out(&mut self, tick: &Tick<'_>) -> Vec<Action> {
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        for name in names {
            let (state, since, index) = {
                let power = &self.nodes[&name];
                (power.state, power.since, power.group)
            };
            let group = &self.groups[index];
            let (resume_timeout, suspend_timeout) = (group.resume_timeout_secs, group.suspend_timeout_secs);
            let waited = secs_since(tick.now, since);
            match state {
                PowerState::PoweringUp if waited >= resume_timeout => {
                    let why = format!("no agent registered within {resume_timeout} s");
                    self.resume_failed(&name, &why, tick.now);
                }
                PowerState::PoweringDown if waited >= suspend_timeout => {
                    let power = self.nodes.get_mut(&name).expect("listed");
                    if tick.linked.contains(&name) {
                        // The suspend did not stop its agent: it is up still.
                        *power = NodePower {
                            state: PowerState::Up,
                            idle_since: Some(tick.now),
                            reason: Some("its suspend left its agent running".to_string()),
                            ..NodePower::down(index, tick.now)
                        };
                    } else {
                        *power = NodePower {
                            failures: power.failures,
                            ..NodePower::down(index, tick.now)
                        };
                    }
                }
                _ => {}
            }
        }
        let mut failed: BTreeMap<(usize, String), Vec<String>> = BTreeMap::new();
        for (index, node, why) in std::mem::take(&mut self.failed) {
            failed.entry((index, why)).or_default().push(node);
        }
        failed
            .into_iter()
            .map(|((index, reason), nodes)| Action::ResumeFailed {
                group: self.groups[index].name.clone(),
                nodes,
                reason,
            })
            .collect()
    }

    /// Adds the GPU-time of awake nodes since the last count to their
    /// groups' (and teams') period, which starts over with each period of
    /// the policy.
    fn count_gpu_hours(&mut self, tick: &Tick<'_>) {
        let sharing = &tick.policy.sharing;
        let period_start = sharing.period.start(tick.now, &sharing.time_zone);
        let since = self.counted_at.unwrap_or(tick.now).max(period_start);
        let elapsed = (tick.now.0 - since.0).max(0) as f64;
        self.counted_at = Some(tick.now);
        for state in &mut self.states {
            if state.period_start != period_start {
                state.period_start = period_start;
                state.gpu_ms = 0.0;
                state.team_gpu_ms.clear();
            }
        }
        for power in self.nodes.values() {
            if power.state == PowerState::PoweredDown {
                continue;
            }
            let gpu_ms = elapsed * f64::from(self.groups[power.group].gpus);
            let state = &mut self.states[power.group];
            state.gpu_ms += gpu_ms;
            if let Some(team) = &power.woken_for {
                *state.team_gpu_ms.entry(team.clone()).or_default() += gpu_ms;
            }
        }
    }

    fn track_idle(&mut self, tick: &Tick<'_>) {
        for (name, power) in &mut self.nodes {
            power.idle_since = match power.state {
                PowerState::Up if tick.busy.contains(name) => None,
                PowerState::Up => Some(power.idle_since.unwrap_or(tick.now)),
                _ => None,
            };
        }
    }
}

impl NodePower {
    fn down(group: usize, now: Timestamp) -> NodePower {
        NodePower {
            group,
            state: PowerState::PoweredDown,
            since: now,
            idle_since: None,
            failures: 0,
            retry_at: now,
            reason: None,
            woken_for: None,
            suspend_ran: false,
            agent_left: false,
        }
    }
}

mod decide;
mod group;
pub use decide::MAX_LOOKED_AT;
pub use group::*;
pub mod hostlist;

#[cfg(test)]
mod tests;
