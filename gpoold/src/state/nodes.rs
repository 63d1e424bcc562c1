//! Node administration: draining, resuming and removing nodes.

use super::*;

impl State {
    /// Node `name`, once `caller` may drain it (`draining`) or resume it.
    pub(super) fn node_to_drain(&mut self, caller: &Caller, name: &str, draining: bool) -> Result<&mut Node, Error> {
        let action = if draining {
            Action::DrainNode(name)
        } else {
            Action::ResumeNode(name)
        };
        authorize(caller, &action)?;
        self.nodes
            .get_mut(name)
            .ok_or_else(|| Error::UnknownNode(name.to_string()))
    }

    pub(super) fn set_drain(
        &mut self,
        caller: &Caller,
        name: &str,
        reason: Option<String>,
        now: Timestamp,
    ) -> Result<(Node, Vec<Write>), Error> {
        let node = self.node_to_drain(caller, name, reason.is_some())?;
        if reason.is_none() {
            // A resume also ends a drain by the node's health program (it
            // drains again if the program still fails).
            node.health_drain = None;
        }
        node.drained_by = reason.is_some().then(|| (caller.user.clone(), now));
        node.drain_reason = reason;
        Ok((node.clone(), vec![Write::Node(name.to_string())]))
    }

    /// Forgets `name`, refused while attempts hold its GPUs. An agent that
    /// registers again brings the node back.
    pub(super) fn remove_node(&mut self, caller: &Caller, name: &str, out: &mut Batch) -> Result<(), Error> {
        authorize(caller, &Action::RemoveNode(name))?;
        if !self.nodes.contains_key(name) {
            return Err(Error::UnknownNode(name.to_string()));
        }
        let holding: Vec<String> = self
            .jobs
            .values()
            .filter(|job| match &job.state {
                JobState::Running { placement, .. } => placement.iter().any(|part| part.node == name),
                _ => false,
            })
            .map(|job| job.id.to_string())
            .collect();
        if !holding.is_empty() {
            let jobs = if holding.len() == 1 {
                format!("job {}", holding[0])
            } else {
                format!("jobs {}", holding.join(", "))
            };
            return Err(Error::NodeBusy {
                node: name.to_string(),
                jobs,
            });
        }
        self.forget_node(name, out);
        tracing::info!(node = name, by = %caller.user, "node removed");
        Ok(())
    }
}
