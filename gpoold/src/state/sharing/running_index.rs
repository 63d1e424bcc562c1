//! The index of running jobs by node, kept as jobs change state.

use gpool_core::job_state::JobState;
use gpool_core::JobId;
use std::collections::HashMap;

/// Moves job `id` in the index of running jobs by node from the nodes of
/// its state `before` to those of its state `after`.
pub(super) fn move_running_index(
    running_on: &mut HashMap<String, std::collections::BTreeSet<JobId>>,
    id: JobId,
    before: &JobState,
    after: &JobState,
) {
    let nodes_of = |state: &JobState| match state {
        JobState::Running { placement, .. } => placement.iter().map(|part| part.node.clone()).collect(),
        _ => Vec::new(),
    };
    let (left, entered) = (nodes_of(before), nodes_of(after));
    for node in &left {
        if let Some(ids) = running_on.get_mut(node) {
            ids.remove(&id);
            if ids.is_empty() {
                running_on.remove(node);
            }
        }
    }
    for node in entered {
        running_on.entry(node).or_default().insert(id);
    }
}
