//! One scheduling cycle as gpoold's loop and `gpool sim` both run it: which
//! waiting jobs the view holds (the whole queue, or each shape's window),
//! which plan is made of it (starts only, or every job explained), and the
//! whole queue's plan where the window's would not do (`Plan::needs_whole`).
//! The daemon and the simulator call these two functions and nothing else
//! of `sched` to decide, so a replay shows what gpoold would do.

use super::{
    could_act, schedule, schedule_starts, window_gpus, ClusterView, NodeView, Plan, Policy, Queue, RunningJob,
};
use crate::ids::Timestamp;

/// How many GPUs a cycle's window of the queue is sized for: `None` where
/// the view must hold every waiting job (the cycle explains every job, or
/// nothing could start or be preempted, or a window would not give the
/// whole queue's starts, see `window_gpus`). `n_others`: the waiting jobs
/// the view holds beside the queue's (held, gated, arrays' tasks).
pub fn window_for(
    nodes: &[NodeView],
    running: &[RunningJob],
    policy: &Policy,
    queue: &Queue,
    n_others: usize,
    explain: bool,
) -> Option<u64> {
    if explain || !could_act(nodes, running, policy) {
        return None;
    }
    window_gpus(nodes, running, policy, queue, n_others)
}

/// The plan of one cycle over `view` (made with `window_for`): every job
/// explained where `explain` (or where nothing can act), else the starts
/// and preemptions alone; `whole` gives the view of every waiting job for
/// when the window's plan is not the whole queue's.
pub fn plan(
    view: &ClusterView,
    policy: &Policy,
    now: Timestamp,
    explain: bool,
    whole: &mut dyn FnMut() -> ClusterView,
) -> Plan {
    let acts = could_act(&view.nodes, &view.running, policy);
    let plan = if view.windowed || (!explain && acts) {
        schedule_starts(view, policy, now)
    } else {
        schedule(view, policy, now)
    };
    if plan.needs_whole {
        return schedule(&whole(), policy, now);
    }
    plan
}
