//! Least-attained-service order within a team: the least served of a
//! team's jobs go first, a team's fresh job takes GPUs back from its own
//! more served work at a checkpoint, and nothing changes between teams.

use super::teams::{least_served_first, Class};
use super::*;
use crate::policy::Team;
use crate::testing::cluster_view_with;
use expect_test::{expect, Expect};
use proptest::prelude::*;

const NOW: Timestamp = Timestamp(10_000_000);

/// Teams a and b, four guaranteed GPUs each; one queue threshold at 1
/// GPU-hour; promotion after waiting 4 times the job's run; taken back
/// within 2 minutes of a checkpoint.
fn policy(las: bool) -> Policy {
    let team = |name: &str| Team {
        guaranteed_gpus: 4,
        ..Team::unlisted(name)
    };
    let mut policy = Policy::default();
    policy.sharing.teams = vec![team("a"), team("b")];
    policy.sharing.las = las.then(|| Las {
        thresholds_gpu_secs: vec![3600],
        promote_factor: 4.0,
        max_lost_secs: 120,
    });
    policy
}

fn check(las: bool, nodes: &str, running: &str, jobs: &str, expected: Expect) {
    let plan = schedule(&cluster_view_with(nodes, running, jobs), &policy(las), NOW);
    expected.assert_eq(&plan.to_string());
}

/// j1 has had 2 GPU-hours and waits again (since 9,000 s, not long
/// enough to be promoted); j2 is fresh. By priority the older j1 goes
/// first; by LAS the fresh j2 does.
#[test]
fn a_teams_least_served_job_goes_first() {
    let jobs = "j1 team=a gpus=1 at=0 service=7200 since=9000\nj2 team=a gpus=1 at=5000";
    let expected = |first: u64, second: u64| {
        format!("start j{first} n1[0]\npending j{second}: wants 1 GPU on one node; none is free; no start time can be foreseen: not every running job in its way has a time limit\n")
    };
    for (las, first, second) in [(false, 1, 2), (true, 2, 1)] {
        let plan = schedule(&cluster_view_with("n1 1xh100", "", jobs), &policy(las), NOW);
        assert_eq!(plan.to_string(), expected(first, second), "las={las}");
    }
}

/// Team a holds its 4 guaranteed GPUs with one job that has run 1,000 s
/// on 4 GPUs (4,000 GPU-seconds: past the threshold) and checkpointed 50
/// s ago. Its fresh 4-GPU job takes it back; by priority it waits. A
/// fresh 1-GPU job does not: it would free 3 GPUs it does not need.
#[test]
fn a_fresh_job_takes_back_its_teams_more_served_job_at_a_checkpoint() {
    let running = "r1 team=a on=n1:0-3 start=9000 ckpt=9950";
    check(
        true,
        "n1 4xh100",
        running,
        "j2 team=a gpus=4",
        expect![[r#"
            preempt j1 for j2 (loses 200 GPU-seconds)
            pending j2: preempting 1 running job to make room for it; team a runs 4 of its 4 guaranteed GPUs; 4 GPUs more run only as burst work on idle GPUs
        "#]],
    );
    check(
        false,
        "n1 4xh100",
        running,
        "j2 team=a gpus=4",
        expect![[r#"
            pending j2: wants 4 GPUs on one node; none is free; team a runs 4 of its 4 guaranteed GPUs; 4 GPUs more run only as burst work on idle GPUs; no start time can be foreseen: not every running job in its way has a time limit
        "#]],
    );
}

/// Taken back only near a checkpoint: 200 s since its last one is more
/// than the 2 minutes allowed (a job that never checkpoints is never
/// taken back this way once it has run 2 minutes). And never for a job
/// smaller than it.
#[test]
fn work_far_from_its_checkpoint_or_larger_is_not_taken_back() {
    check(
        true,
        "n1 4xh100",
        "r1 team=a on=n1:0-3 start=9000 ckpt=9950",
        "j2 team=a gpus=1",
        expect![[r#"
            pending j2: wants 1 GPU on one node; none is free; team a runs 4 of its 4 guaranteed GPUs; 1 GPU more run only as burst work on idle GPUs; no start time can be foreseen: not every running job in its way has a time limit
        "#]],
    );
    check(
        true,
        "n1 4xh100",
        "r1 team=a on=n1:0-3 start=9000 ckpt=9800",
        "j2 team=a gpus=4",
        expect![[r#"
            pending j2: wants 4 GPUs on one node; none is free; team a runs 4 of its 4 guaranteed GPUs; 4 GPUs more run only as burst work on idle GPUs; no start time can be foreseen: not every running job in its way has a time limit
        "#]],
    );
}

/// The victim, waiting again with its service, does not take its GPUs
/// back from the fresh job (an earlier queue): no trading places. Nor
/// does a fresh job of team a take team b's served, guaranteed work.
#[test]
fn the_served_job_does_not_take_back_and_other_teams_are_left_alone() {
    check(
        true,
        "n1 4xh100\nn2 4xh100",
        "r2 team=a on=n1:0-3 start=9990\nr4 team=b on=n2:0-3 start=9000 ckpt=9950",
        "j1 team=a gpus=4 service=4000 since=9990\nj5 team=a gpus=1",
        expect![[r#"
            pending j5: wants 1 GPU on one node; none is free; team a runs 4 of its 4 guaranteed GPUs; 1 GPU more run only as burst work on idle GPUs; no start time can be foreseen: not every running job in its way has a time limit
            pending j1: wants 4 GPUs on one node; none is free; team a runs 4 of its 4 guaranteed GPUs; 4 GPUs more run only as burst work on idle GPUs
        "#]],
    );
}

/// A served job that has waited 4 times as long as it ran (1,000 s on 4
/// GPUs, waiting since 0) is back in queue 0: it takes back its team's
/// job of queue 1, so the least served never starve it.
#[test]
fn a_job_that_waited_long_enough_is_promoted_and_takes_back() {
    check(
        true,
        "n1 4xh100",
        "r2 team=a on=n1:0-3 start=9000 ckpt=9950",
        "j1 team=a gpus=4 service=4000 since=0",
        expect![[r#"
            preempt j2 for j1 (loses 200 GPU-seconds)
            pending j1: preempting 1 running job to make room for it; team a runs 4 of its 4 guaranteed GPUs; 4 GPUs more run only as burst work on idle GPUs
        "#]],
    );
}

/// With no job served yet, LAS order is the priority order.
#[test]
fn without_service_las_changes_nothing() {
    let jobs = "j1 team=a gpus=2 at=10\nj2 team=b gpus=2 at=20\nj3 team=a gpus=4 at=30\nj4 team=b gpus=1 at=40";
    let running = "r9 team=a on=n1:0-1 start=9900";
    for nodes in ["n1 4xh100", "n1 4xh100\nn2 4xh100"] {
        let view = cluster_view_with(nodes, running, jobs);
        let by_priority = schedule(&view, &policy(false), NOW);
        let by_las = schedule(&view, &policy(true), NOW);
        assert_eq!(by_las.to_string(), by_priority.to_string(), "{nodes}");
        assert_eq!(by_las.priorities, by_priority.priorities);
    }
}

proptest! {
    /// Each team keeps the places its jobs held; within a team, jobs go
    /// by queue, and those of one queue in their old order.
    #[test]
    fn each_team_keeps_its_places_and_goes_by_queue(
        jobs in proptest::collection::vec((0usize..4, 0usize..5), 0..80)
    ) {
        let classes: Vec<Class> = (0..4).map(|team| Class {
            team,
            qos_priority: 0,
            preempt_lower: false,
            pool: "",
            gpu_types: &[],
            fair_share: 1.0,
        }).collect();
        let pending: Vec<PendingJob> = jobs
            .iter()
            .enumerate()
            .map(|(i, (_, queue))| PendingJob {
                service_gpu_secs: *queue as u64,
                ..crate::testing::pending_job(&format!("j{}", i + 1))
            })
            .collect();
        let mut order: Vec<_> = jobs
            .iter()
            .zip(&pending)
            .enumerate()
            .map(|(i, ((team, _), job))| (((i as u128), 0u64), job, &classes[*team]))
            .collect();
        let before: Vec<(usize, u64)> = order.iter().map(|(_, job, class)| (class.team, job.id.0)).collect();
        least_served_first(&mut order, |job| job.service_gpu_secs as usize);
        for (place, (_, job, class)) in order.iter().enumerate() {
            prop_assert_eq!(class.team, before[place].0);
            let _ = job;
        }
        for team in 0..4 {
            let mine: Vec<(u64, u64)> = order
                .iter()
                .filter(|(_, _, class)| class.team == team)
                .map(|(_, job, _)| (job.service_gpu_secs, job.id.0))
                .collect();
            prop_assert!(mine.windows(2).all(|pair| pair[0] < pair[1]), "{:?}", mine);
        }
    }
}
