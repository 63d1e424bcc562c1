//! One scheduling cycle as gpoold's loop and `gpool sim` both run it: which
//! waiting jobs the view holds (the whole queue, or each shape's window),
//! which plan is made of it (starts only, or every job explained), and the
//! whole queue's plan where the window's would not do (`Plan::needs_whole`).
//! The daemon and the simulator call these two functions and nothing else
//! of `sched` to decide, so a replay shows what gpoold would do. When a
//! cycle is due at all is here too (`cycle_needed`).

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
    (policy, now): (&Policy, Timestamp),
    queue: &Queue,
    n_others: usize,
    explain: bool,
) -> Option<u64> {
    if explain || !could_act(nodes, running, policy, now) {
        return None;
    }
    window_gpus(nodes, running, (policy, now), queue, n_others)
}

/// How many of one array's waiting tasks (each asking `task_gpus`) a
/// cycle's view needs, at most `window`: no more of them start or take
/// GPUs back in one cycle than a fleet of `fleet_gpus` holds, and the one
/// after them is the first that waits (a backfill reservation may be for
/// it). Tasks without GPUs are bounded by `window` alone.
pub fn array_tasks_seen(window: usize, fleet_gpus: u64, task_gpus: u64) -> usize {
    match task_gpus {
        0 => window,
        gpus => window.min(usize::try_from(fleet_gpus / gpus + 1).unwrap_or(usize::MAX)),
    }
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
    if nothing_to_plan(view) {
        return Plan {
            complete: !view.windowed,
            ..Plan::default()
        };
    }
    let acts = could_act(&view.nodes, &view.running, policy, now);
    let plan = if view.windowed || (!explain && acts) {
        schedule_starts(view, policy, now)
    } else {
        schedule(view, policy, now)
    };
    if plan.needs_whole {
        let whole = whole();
        return checked(&whole, policy, now, schedule(&whole, policy, now));
    }
    checked(view, policy, now, plan)
}

/// Nothing waits and no victim is in its grace: no job could start or be
/// taken, no preemption withdrawn, and no job needs words, so the plan is
/// empty without being made (a cycle of a replay with idle GPUs is mostly
/// this, after each job's end).
fn nothing_to_plan(view: &ClusterView) -> bool {
    view.pending.is_empty() && !view.running.iter().any(|job| job.preempting)
}

/// `plan` with the first invariant it breaks against the view it was made
/// of (`Plan::broken`). A plan that starts, preempts and rescinds nothing
/// breaks nothing, so only those that act are checked, in every build.
fn checked(view: &ClusterView, policy: &Policy, now: Timestamp, mut plan: Plan) -> Plan {
    let acts = !plan.starts.is_empty() || !plan.preemptions.is_empty() || !plan.rescinds.is_empty();
    if acts {
        plan.broken = super::invariants::check(view, policy, now, &plan).err();
    }
    plan
}

/// What the scheduling loop keeps of its last full cycle: the generation of
/// the state it saw (bumped by every change the scheduler could see) and
/// whether that state let a cycle act (`could_act`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastCycle {
    pub generation: u64,
    pub could_act: bool,
}

/// How old the words on why jobs wait (priorities, places, reasons) may
/// grow while nothing changes and nothing could start: only the age and
/// fair-share terms of priorities move then.
pub const RESTATE_IDLE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// While cycles start or preempt jobs, the words on why each waiting job
/// waits (its reasons, priority and place) are restated at most this often.
pub const WORDS_EVERY: std::time::Duration = std::time::Duration::from_millis(500);
/// ...and at most this share of the time goes to stating them: with a
/// long queue (100,000 jobs wait) they cost tens of ms, which every 500 ms
/// would take the time cycles need to start jobs.
pub const WORDS_SHARE: u32 = 50;

/// How long after words that took `cost` to state the next are due:
/// `WORDS_EVERY`, or `cost` times `WORDS_SHARE` where that is longer.
pub fn words_interval(cost: std::time::Duration) -> std::time::Duration {
    WORDS_EVERY.max(cost.saturating_mul(WORDS_SHARE))
}

/// Whether a cycle must run now, or may be skipped because nothing changed
/// since `last`. A change (a new `generation`) always runs one. With the
/// state unchanged:
/// - where the last cycle could start or preempt something, time alone may
///   change the outcome (minimum runtimes run out, budgets and waste caps
///   refill, fair shares decay), so the periodic cycle (`on_timer`) runs;
///   a wake-up with nothing new is skipped;
/// - where it could not (no free GPU, no possible victim), time cannot
///   make it: the cycle runs only to restate the words once they are
///   `RESTATE_IDLE_AFTER` old (`words_age`; `None`: never stated).
pub fn cycle_needed(
    last: Option<&LastCycle>,
    generation: u64,
    on_timer: bool,
    words_age: Option<std::time::Duration>,
) -> bool {
    match last {
        Some(last) if last.generation == generation => {
            if last.could_act {
                on_timer
            } else {
                words_age.is_none_or(|age| age >= RESTATE_IDLE_AFTER)
            }
        }
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cycle sees one more of an array's tasks than the fleet could
    /// run at once, never more than its window; GPU-less tasks fill it.
    #[test]
    fn an_arrays_tasks_seen_are_what_the_fleet_could_start_and_one() {
        assert_eq!(super::array_tasks_seen(512, 32, 1), 33);
        assert_eq!(super::array_tasks_seen(512, 32, 8), 5);
        assert_eq!(super::array_tasks_seen(512, 4, 8), 1);
        assert_eq!(super::array_tasks_seen(8, 32, 1), 8);
        assert_eq!(super::array_tasks_seen(512, 32, 0), 512);
    }

    use crate::ids::JobId;
    use crate::model::NodePlacement;

    /// With nothing waiting and no victim in its grace, the empty plan is
    /// the one the scheduler would have made: burst work, LAS order, a QoS
    /// that preempts and an operator's requeue change nothing. A victim
    /// taken for a job that no longer waits is still withdrawn.
    #[test]
    fn an_empty_queue_plans_nothing_unless_a_victim_is_in_its_grace() {
        let nodes = "n1 4xh100\nn2 4xa100";
        let mut lively = Policy::default();
        lively.sharing.las = Some(crate::sched::las::Las::default());
        lively.sharing.qos.push(crate::policy::Qos {
            name: "high".into(),
            priority: 10,
            preempt_lower: true,
            ..crate::policy::Qos::normal()
        });
        for policy in [Policy::default(), lively] {
            for running in ["r1 on=n1:0-1", "r1 burst on=n1:0-3\nr2 team=b on=n2:0 start=0 ckpt=600"] {
                let view = crate::testing::cluster_view_with(nodes, running, "");
                let at = Timestamp(7_200_000);
                assert!(nothing_to_plan(&view));
                let made = crate::sched::schedule(&view, &policy, at);
                let shortcut = plan(&view, &policy, at, true, &mut || view.clone());
                let acts = |p: &Plan| {
                    (
                        p.starts.len(),
                        p.preemptions.len(),
                        p.rescinds.clone(),
                        p.holds.clone(),
                        p.pending.clone(),
                        p.released_claims.clone(),
                        p.reservation.clone(),
                        p.complete,
                    )
                };
                assert_eq!(acts(&shortcut), acts(&made), "{running}");
            }
        }
        // A window of the queue is never the whole plan, empty or not.
        let mut windowed = crate::testing::cluster_view_with(nodes, "r1 on=n1:0-1", "");
        windowed.windowed = true;
        let made = crate::sched::schedule_starts(&windowed, &Policy::default(), Timestamp(0));
        let shortcut = plan(&windowed, &Policy::default(), Timestamp(0), false, &mut || {
            windowed.clone()
        });
        assert_eq!((shortcut.complete, made.complete), (false, false));
        let view = crate::testing::cluster_view_with(nodes, "r1 burst on=n1:0-3 preempting for=j3", "");
        assert!(!nothing_to_plan(&view));
        let plan = plan(&view, &Policy::default(), Timestamp(0), false, &mut || view.clone());
        assert_eq!(plan.rescinds, [(JobId(1), crate::ids::Epoch(1))]);
    }

    /// A plan that acts is checked, and the first invariant it breaks is
    /// named: here a start on a GPU that runs another job.
    #[test]
    fn a_plan_that_gives_a_busy_gpu_is_named_broken() {
        let view = crate::testing::cluster_view_with("n1 2xh100", "r1 on=n1:0", "j2 gpus=1");
        let policy = Policy::default();
        let plan = plan(&view, &policy, Timestamp(0), true, &mut || view.clone());
        assert_eq!(plan.broken, None, "the scheduler's own plan: {plan:?}");
        let mut bad = plan.clone();
        bad.starts[0].placement = vec![NodePlacement {
            node: "n1".into(),
            gpu_indices: vec![0],
        }];
        bad.broken = None;
        let bad = checked(&view, &policy, Timestamp(0), bad);
        assert_eq!(bad.starts[0].job, JobId(2));
        assert_eq!(bad.broken.as_deref(), Some("j2 starts on n1[0], which is not free"));
    }
}
