//! `[[power]]` groups in the state: the book of their nodes, what a tick
//! looks at, and what the programs' failures mean. The book is not
//! durable: a controller that starts takes every node of a group as
//! powered down until its agent registers (and runs a program again for a
//! node it had already asked for, which is why the programs must be
//! idempotent).

use super::*;
use gpool_core::power::{wants_room, Action, Tick};

/// What a tick asks gpoold to run: an action and its group's programs.
#[derive(Debug, Clone)]
pub struct PowerAction {
    pub action: Action,
    pub programs: crate::config::PowerGroup,
}

impl State {
    /// One power tick: the book's actions, each with its group's programs.
    pub(super) fn power_tick(&mut self, now: Timestamp) -> Vec<PowerAction> {
        if self.power.groups.is_empty() {
            return Vec::new();
        }
        let waiting = self.room_wanted();
        let busy: std::collections::BTreeSet<String> = self
            .running_on
            .iter()
            .filter(|(_, jobs)| !jobs.is_empty())
            .map(|(node, _)| node.clone())
            .collect();
        let linked: std::collections::BTreeSet<String> = self.links.keys().cloned().collect();
        // Drained (by an operator or for a fault), asleep or awake.
        let closed: std::collections::BTreeSet<String> = self
            .nodes
            .values()
            .filter(|node| node.drain_reason.is_some() && self.power.nodes.contains_key(&node.name))
            .map(|node| node.name.clone())
            .collect();
        let actions = self.power.tick(&Tick {
            now,
            waiting: &waiting,
            policy: &self.policy,
            busy: &busy,
            linked: &linked,
            closed: &closed,
        });
        actions
            .into_iter()
            .filter_map(|action| {
                let group = match &action {
                    Action::Resume { group, .. }
                    | Action::Suspend { group, .. }
                    | Action::ResumeFailed { group, .. } => group,
                };
                let programs = self.power_programs.iter().find(|p| &p.group.name == group)?.clone();
                Some(PowerAction { action, programs })
            })
            .collect()
    }

    /// The waiting jobs more nodes would start, highest priority first, as
    /// the latest cycle's words say.
    fn room_wanted(&self) -> Vec<PendingJob> {
        let mut wanted: Vec<(u32, PendingJob)> = self
            .words
            .ids()
            .filter(|id| {
                self.words
                    .reasons(*id)
                    .is_some_and(|rendered| wants_room(rendered.reasons().iter().map(|reason| reason.code)))
            })
            .filter_map(|id| {
                let view = match self.waiting.get(&id) {
                    Some(waiting) => (*waiting.view).clone(),
                    // A task that is not a job yet: its array's shape.
                    None if !self.jobs.contains_key(&id) => {
                        let (array, _) = self.array_of(id)?;
                        PendingJob {
                            id,
                            ..(*self.waiting.get(&array)?.view).clone()
                        }
                    }
                    // A task that started since the words.
                    None => return None,
                };
                let position = self.words.of(id).and_then(|said| said.position).unwrap_or(u32::MAX);
                Some((position, view))
            })
            .collect();
        wanted.sort_by_key(|(position, view)| (*position, view.id));
        wanted.truncate(gpool_core::power::MAX_LOOKED_AT);
        wanted.into_iter().map(|(_, view)| view).collect()
    }

    /// A group's program failed for `nodes` (a resume that exited badly or
    /// ran past its timeout, or a suspend): the book hears of a resume's,
    /// and each registered node's health log of any.
    pub(super) fn power_program_failed(
        &mut self,
        program: &str,
        nodes: &[String],
        why: &str,
        now: Timestamp,
        out: &mut Batch,
    ) {
        for node in nodes {
            if program == "resume" {
                self.power.resume_failed(node, why, now);
            }
            let note = format!("{program} program: {why}");
            self.log_health(node, None, gpool_core::health::Transition::Note, note, now, out);
        }
    }

    /// The nodes of power groups as they will register, where they have
    /// not: a submit is checked against what the fleet could ever run.
    pub fn sleeping_nodes(&self) -> Vec<Node> {
        self.power
            .nodes
            .keys()
            .filter(|name| !self.nodes.contains_key(*name))
            .filter_map(|name| Some(self.power.group_of(name)?.node_as_registered(name)))
            .collect()
    }

    /// Takes the groups of a (re)read config.
    pub(super) fn set_power(&mut self, groups: &[crate::config::PowerGroup], now: Timestamp) {
        self.power
            .reconfigure(groups.iter().map(|group| group.group.clone()).collect(), now);
        self.power_programs = groups.to_vec();
        // Nodes whose agents are linked now are up.
        let linked: Vec<String> = self.links.keys().cloned().collect();
        for node in linked {
            self.power.registered(&node, now);
        }
    }
}
