//! When each waiting job should start (`gpool jobs --start`, as Slurm's
//! `squeue --start`): the cycle is played forward over running jobs' time
//! limits, on the same scheduling code, as if nothing new came and no job
//! ended early or was preempted.

use super::{schedule_starts, ClusterView, Plan, Policy, RunningJob};
use crate::ids::{JobId, Timestamp};
use std::collections::HashMap;

/// Jobs played forward for their estimated starts: the first ones by
/// priority, so the cost stays bounded however long the queue.
pub const ESTIMATED_JOBS: usize = 2_000;
/// Job ends played forward.
pub const ESTIMATE_STEPS: usize = 64;

/// When the first `ESTIMATED_JOBS` waiting jobs by priority should start,
/// the ones that start now left out (the cycle starts them).
pub fn of_plan(view: &ClusterView, plan: &Plan, policy: &Policy, now: Timestamp) -> HashMap<JobId, Timestamp> {
    if view.pending.is_empty() || view.windowed {
        return Default::default();
    }
    let mut pending = view.pending.clone();
    if pending.len() > ESTIMATED_JOBS {
        let priority: HashMap<_, f64> = plan.priorities.iter().map(|(id, p)| (*id, p.total)).collect();
        pending.sort_by(|a, b| {
            let of = |id| priority.get(&id).copied().unwrap_or(f64::MIN);
            of(b.id).total_cmp(&of(a.id)).then(a.id.cmp(&b.id))
        });
        pending.truncate(ESTIMATED_JOBS);
    }
    let bounded = ClusterView {
        pending,
        ..view.clone()
    };
    let mut estimates = starts(&bounded, policy, now, ESTIMATE_STEPS);
    estimates.retain(|_, at| *at > now);
    estimates
}

/// Each job waiting in `view` that starts within `max_steps` job ends, with
/// when (jobs that could start now get `now`). Jobs behind one without a
/// time limit, or that start only by preempting, get none.
pub fn starts(view: &ClusterView, policy: &Policy, now: Timestamp, max_steps: usize) -> HashMap<JobId, Timestamp> {
    // Reservations open and close on their own: steps of the play too.
    let windows: Vec<Timestamp> = policy.reservations.iter().flat_map(|r| [r.start, r.end]).collect();
    let mut view = ClusterView {
        windowed: false,
        ..view.clone()
    };
    let mut estimates = HashMap::new();
    let mut at = now;
    for _ in 0..max_steps {
        let plan = schedule_starts(&view, policy, at);
        let started: HashMap<JobId, _> = plan.starts.into_iter().map(|start| (start.job, start)).collect();
        let mut waiting = Vec::with_capacity(view.pending.len());
        for job in std::mem::take(&mut view.pending) {
            let Some(start) = started.get(&job.id) else {
                waiting.push(job);
                continue;
            };
            estimates.insert(job.id, at);
            for part in &start.placement {
                set_busy(&mut view, &part.node, &part.gpu_indices, Some(job.shape.host));
            }
            view.running.push(RunningJob::started(
                &job,
                crate::ids::Epoch(0),
                start.burst,
                start.placement.clone(),
                at,
            ));
        }
        view.pending = waiting;
        if view.pending.is_empty() {
            break;
        }
        // On to the next end of a running job with a limit, or the next
        // window that opens or closes.
        let Some(next) = view
            .running
            .iter()
            .filter_map(|job| job.ends_at)
            .chain(windows.iter().copied())
            .filter(|end| *end > at)
            .min()
        else {
            break;
        };
        at = next;
        let (ended, running): (Vec<RunningJob>, Vec<RunningJob>) = std::mem::take(&mut view.running)
            .into_iter()
            .partition(|job| job.ends_at.is_some_and(|end| end <= at));
        view.running = running;
        for job in ended {
            for part in &job.placement {
                set_busy(&mut view, &part.node, &part.gpu_indices, None);
            }
        }
        // Promises end with their victims: all ended by now in this play.
        view.promised.clear();
    }
    estimates
}

/// Marks `gpus` busy for a start, with the CPUs and memory it asks for
/// (`Some`), or free at an end, with theirs (`None`).
fn set_busy(view: &mut ClusterView, node: &str, gpus: &[u32], started: Option<Option<crate::sched::HostAsk>>) {
    if let Some(node) = view.nodes.iter_mut().find(|n| n.name == node) {
        match started {
            Some(ask) => node.occupy(gpus, ask),
            None => node.release(gpus),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::cluster_view_with;

    #[test]
    fn each_waiting_job_gets_the_start_its_turn_comes() {
        // 4 GPUs, all busy: r1 (2 GPUs) ends at 100 s, r2 (2) at 300 s.
        // j3 (2 GPUs, 200 s) starts at 100 and ends at 300; j4 (4 GPUs,
        // 50 s) starts at 300, taking all 4; j5 (1 GPU) at its end, 350.
        let view = cluster_view_with(
            "n1 4xh100",
            "r1 on=n1:0-1 ends=100\nr2 on=n1:2-3 ends=300",
            "j3 gpus=2 time=200 at=1\nj4 gpus=4 time=50 at=2\nj5 gpus=1 at=3",
        );
        let estimates = starts(&view, &Policy::default(), Timestamp(0), 100);
        let secs = |id: u64| estimates.get(&JobId(id)).map(|at| at.0 / 1000);
        assert_eq!((secs(3), secs(4), secs(5)), (Some(100), Some(300), Some(350)));
    }

    /// What a cycle hands over: no estimate for a job it starts now.
    #[test]
    fn a_plans_estimates_leave_out_the_jobs_it_starts() {
        let view = cluster_view_with(
            "n1 2xh100",
            "r1 on=n1:0 ends=100",
            "j2 gpus=1 time=50 at=1\nj3 gpus=2 at=2",
        );
        let plan = crate::sched::schedule(&view, &Policy::default(), Timestamp(0));
        let estimates = of_plan(&view, &plan, &Policy::default(), Timestamp(0));
        // j2 starts now on the free GPU; j3 once r1 (100 s) and j2 (50 s) end.
        assert_eq!(estimates.get(&JobId(2)), None);
        assert_eq!(estimates.get(&JobId(3)), Some(&Timestamp(100_000)));
    }

    #[test]
    fn behind_a_job_without_a_limit_there_is_no_estimate() {
        let view = cluster_view_with("n1 2xh100", "r1 on=n1:0-1", "j2 gpus=1 time=10 at=1");
        assert!(starts(&view, &Policy::default(), Timestamp(0), 100).is_empty());
    }
}
