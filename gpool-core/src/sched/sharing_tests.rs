//! Teams sharing the pool: guarantees, burst work, preemption, budgets,
//! and fair share over time.

use super::*;
use crate::policy::{Qos, Team};
use crate::testing::cluster_view_with;
use expect_test::{expect, Expect};
use proptest::prelude::*;

const NOW: Timestamp = Timestamp(10_000_000);

/// Teams a and b, four guaranteed GPUs each; QoS `normal` (the default),
/// `long` (never preempted in its first 20 minutes), `high` (preempts lower
/// classes).
fn policy() -> Policy {
    let team = |name: &str, guaranteed_gpus: u32| Team {
        guaranteed_gpus,
        ..Team::unlisted(name)
    };
    let mut policy = Policy::default();
    policy.sharing.teams = vec![team("a", 4), team("b", 4), team("c", 0)];
    policy.sharing.qos = vec![
        Qos::normal(),
        Qos {
            name: "long".into(),
            min_runtime_secs: 1200,
            ..Qos::normal()
        },
        Qos {
            name: "high".into(),
            priority: 10,
            preempt_lower: true,
            ..Qos::normal()
        },
    ];
    policy
}

fn check(policy: &Policy, nodes: &str, running: &str, jobs: &str, expected: Expect) {
    let plan = schedule(&cluster_view_with(nodes, running, jobs), policy, NOW);
    expected.assert_eq(&plan.to_string());
}

#[test]
fn a_guaranteed_job_reclaims_from_burst_work() {
    // Team a fills the node with burst work; b's guaranteed job takes back
    // what it needs, from the jobs that lose least.
    check(
        &policy(),
        "n1 8xh100",
        "r1 team=a on=n1:0-3\nr2 team=a burst on=n1:4-5 start=9000 ckpt=9900\nr3 team=a burst on=n1:6-7 start=9000",
        "j4 team=b gpus=2",
        expect![[r#"
            preempt j2 for j4 (loses 200 GPU-seconds)
            pending j4: preempting 1 running job to make room for it
        "#]],
    );
}

#[test]
fn no_preemption_when_the_job_still_could_not_start() {
    // Freeing every burst GPU still leaves no node with 4 free.
    check(
        &policy(),
        "n1 4xh100\nn2 4xh100",
        "r1 team=a on=n1:0-1\nr2 team=c burst on=n1:2-3\nr3 team=a on=n2:0-1\nr4 team=c burst on=n2:2-3",
        "j5 team=b gpus=4",
        expect![[r#"
            pending j5: wants 4 GPUs on one node; none is free; no start time can be foreseen: not every running job in its way has a time limit
        "#]],
    );
}

#[test]
fn guaranteed_work_is_never_preempted_and_gangs_reclaim_whole() {
    // Only r2 and r3 are burst; the 2-node gang needs both nodes' burst GPUs.
    check(
        &policy(),
        "n1 4xh100\nn2 4xh100",
        "r1 team=a on=n1:0-1\nr2 team=c burst on=n1:2-3\nr3 team=c burst on=n2:0-3",
        "j4 team=b gpus=2 nodes=2",
        expect![[r#"
            preempt j2 for j4 (loses 20000 GPU-seconds)
            preempt j3 for j4 (loses 40000 GPU-seconds)
            pending j4: preempting 2 running jobs to make room for it
        "#]],
    );
}

#[test]
fn victims_the_job_turned_out_not_to_need_are_given_back() {
    // Least lost work first: r1 frees half of n1 (too little), then r3 and
    // r4 free all of n2, where j5 goes; r1 is given back.
    check(
        &policy(),
        "n1 4xh100\nn2 4xh100",
        "r1 team=c burst on=n1:0-1 start=9950\nr2 team=a on=n1:2-3\nr3 team=c burst on=n2:0-1 start=9900\nr4 team=c burst on=n2:2-3 start=9800",
        "j5 team=b gpus=4",
        expect![[r#"
            preempt j3 for j5 (loses 200 GPU-seconds)
            preempt j4 for j5 (loses 400 GPU-seconds)
            pending j5: preempting 2 running jobs to make room for it
        "#]],
    );
    // The same for a gang: r1 frees too little of n1, r3 and r4 free
    // enough of n2 and n3, where j7 goes; r1 is given back.
    check(
        &policy(),
        "n1 4xh100\nn2 4xh100\nn3 4xh100",
        "r1 team=c burst on=n1:0 start=9990\nr2 team=a on=n1:1-3\nr3 team=c burst on=n2:0-1 start=9900\nr4 team=c burst on=n3:0-1 start=9800\nr5 team=a on=n2:2-3\nr6 team=a on=n3:2-3",
        "j7 team=b gpus=2 nodes=2",
        expect![[r#"
            preempt j3 for j7 (loses 200 GPU-seconds)
            preempt j4 for j7 (loses 400 GPU-seconds)
            pending j7: preempting 2 running jobs to make room for it
        "#]],
    );
}

#[test]
fn victims_come_from_the_team_furthest_over_its_share() {
    let mut policy = policy();
    let mut view = cluster_view_with(
        "n1 4xh100",
        "r1 team=a burst on=n1:0-1 start=9900\nr2 team=c burst on=n1:2-3 start=9990",
        "j3 team=b gpus=2",
    );
    // Team c used far more than a: its job goes, though it lost less.
    view.usage.insert(
        "c".into(),
        Ledger {
            decayed: 1e6,
            decayed_at: NOW,
            ..Ledger::default()
        },
    );
    policy.sharing.half_life_secs = 1e9;
    let plan = schedule(&view, &policy, NOW);
    expect![[r#"
        preempt j2 for j3 (loses 20 GPU-seconds)
        pending j3: preempting 1 running job to make room for it
    "#]]
    .assert_eq(&plan.to_string());
}

#[test]
fn young_jobs_of_a_min_runtime_class_are_spared() {
    check(
        &policy(),
        "n1 4xh100",
        "r1 team=a burst qos=long on=n1:0-1 start=9500\nr2 team=a burst qos=long on=n1:2-3 start=8000",
        "j3 team=b gpus=2",
        expect![[r#"
            preempt j2 for j3 (loses 4000 GPU-seconds)
            pending j3: preempting 1 running job to make room for it
        "#]],
    );
    check(
        &policy(),
        "n1 4xh100",
        "r1 team=a burst qos=long on=n1:0-3 start=9500",
        "j3 team=b gpus=2",
        expect![[r#"
            pending j3: wants 2 GPUs on one node; none is free; no start time can be foreseen: not every running job in its way has a time limit
        "#]],
    );
}

#[test]
fn the_waste_cap_holds() {
    let mut view = cluster_view_with("n1 4xh100", "r1 team=a burst on=n1:0-3 start=9000", "j2 team=b gpus=2");
    view.waste_budget_gpu_secs = 3999.0;
    let plan = schedule(&view, &policy(), NOW);
    assert!(plan.preemptions.is_empty(), "{plan}");
    view.waste_budget_gpu_secs = 4000.0;
    let plan = schedule(&view, &policy(), NOW);
    assert_eq!(plan.preemptions.len(), 1, "{plan}");
}

#[test]
fn jobs_already_being_preempted_are_counted_on_not_preempted_again() {
    check(
        &policy(),
        "n1 4xh100",
        "r1 team=a burst preempting on=n1:0-1\nr2 team=a burst on=n1:2-3",
        "j3 team=b gpus=2\nj4 team=b gpus=2",
        expect![[r#"
            preempt j2 for j4 (loses 20000 GPU-seconds)
            pending j3: preempting 1 running job to make room for it
            pending j4: preempting 1 running job to make room for it
        "#]],
    );
}

#[test]
fn a_team_beyond_its_guarantee_or_budget_runs_burst_only() {
    let mut policy = policy();
    policy.sharing.teams[1].gpu_hours = Some(1);
    let mut view = cluster_view_with("n1 8xh100", "r1 team=a on=n1:0-3", "j2 team=a gpus=2\nj3 team=b gpus=1");
    // b used 2 GPU-hours of guaranteed time this week already.
    let mut ledger = Ledger::default();
    ledger.charge(2.0, Timestamp(NOW.0 - 3_600_000), NOW, false, &policy.sharing);
    view.usage.insert("b".into(), ledger);
    let plan = schedule(&view, &policy, NOW);
    expect![[r#"
        start j3 n1[4] (burst)
        start j2 n1[5-6] (burst)
    "#]]
    .assert_eq(&plan.to_string());
    // With no room, the reasons say why they are burst work.
    let view = cluster_view_with("n1 4xh100", "r1 team=a on=n1:0-3", "j2 team=a gpus=2\nj3 team=b gpus=1");
    let mut budget = policy.clone();
    budget.sharing.teams[1].gpu_hours = Some(0);
    expect![[r#"
        pending j3: wants 1 GPU on one node; none is free; team b used its 0 guaranteed GPU-hours this period, so it runs only as burst work on idle GPUs; no start time can be foreseen: not every running job in its way has a time limit
        pending j2: wants 2 GPUs on one node; none is free; team a runs 4 of its 4 guaranteed GPUs; 2 GPUs more run only as burst work on idle GPUs
    "#]]
    .assert_eq(&schedule(&view, &budget, NOW).to_string());
}

#[test]
fn higher_qos_preempts_lower_and_guaranteed_goes_first() {
    // j3 (high) may preempt normal work even within its team's guarantee.
    check(
        &policy(),
        "n1 2xh100",
        "r1 team=a on=n1:0-1",
        "j2 team=c gpus=1\nj3 team=c qos=high gpus=2",
        expect![[r#"
            preempt j1 for j3 (loses 20000 GPU-seconds)
            pending j3: preempting 1 running job to make room for it; team c runs 0 of its 0 guaranteed GPUs; 2 GPUs more run only as burst work on idle GPUs
            pending j2: wants 1 GPU on one node; none is free; team c runs 0 of its 0 guaranteed GPUs; 1 GPU more run only as burst work on idle GPUs; no start time can be foreseen: not every running job in its way has a time limit
        "#]],
    );
    // A guaranteed job goes before burst work of higher priority.
    check(
        &policy(),
        "n1 2xh100",
        "",
        "j1 team=c gpus=2 prio=100\nj2 team=a gpus=2",
        expect![[r#"
            start j2 n1[0-1]
            pending j1: wants 2 GPUs on one node; none is free; team c runs 0 of its 0 guaranteed GPUs; 2 GPUs more run only as burst work on idle GPUs; no start time can be foreseen: not every running job in its way has a time limit
        "#]],
    );
}

/// Two teams with equal shares and endless demand for one-hour, one-GPU
/// jobs on 8 GPUs, simulated over a week: each gets half the GPU-hours.
#[test]
fn equal_shares_get_equal_gpu_hours_over_a_week() {
    let mut policy = Policy::default();
    policy.sharing.teams = vec![Team::unlisted("a"), Team::unlisted("b")];
    policy.sharing.half_life_secs = 86_400.0;
    let hour = 3_600_000;
    let nodes = vec![NodeView::from_node(&crate::testing::node("n1", 8, "h100"), &[])];
    let mut usage: BTreeMap<String, Ledger> = BTreeMap::new();
    let mut running: Vec<RunningJob> = Vec::new();
    let mut next_id = 1;
    let mut hours = BTreeMap::from([("a".to_string(), 0u64), ("b".to_string(), 0u64)]);
    for step in 0..(7 * 24) {
        let now = Timestamp(step * hour);
        // Jobs end after an hour; their GPU-hours go to the ledgers.
        for job in running.drain(..) {
            usage
                .entry(job.team.clone())
                .or_default()
                .charge(1.0, job.started_at, now, job.burst, &policy.sharing);
            *hours.get_mut(&job.team).unwrap() += 1;
        }
        // Endless demand: 8 queued jobs per team at all times.
        let pending: Vec<std::sync::Arc<PendingJob>> = ["a", "b"]
            .iter()
            .flat_map(|team| (0..8).map(move |i| (team, i)))
            .map(|(team, i)| PendingJob {
                id: JobId(next_id + i as u64 + if *team == "a" { 0 } else { 8 }),
                submitted_at: now,
                shape: std::sync::Arc::new(crate::testing::one_gpu_shape(team)),
                user: "user".into(),
                service_gpu_secs: 0,
                waiting_since: now,
            })
            .map(std::sync::Arc::new)
            .collect();
        next_id += 16;
        let view = ClusterView {
            nodes: nodes.clone(),
            pending: pending.clone(),
            running: Vec::new(),
            usage: usage.clone(),
            promised: Vec::new(),
            waste_budget_gpu_secs: f64::INFINITY,
            windowed: false,
        };
        let plan = schedule(&view, &policy, now);
        assert_eq!(plan.starts.len(), 8, "the pool never idles");
        for start in plan.starts {
            let team = pending
                .iter()
                .find(|j| j.id == start.job)
                .map(|j| j.shape.team.clone())
                .unwrap_or_default();
            running.push(RunningJob {
                user: "user".into(),
                id: start.job,
                epoch: crate::ids::Epoch(1),
                team: team.to_string(),
                qos: String::new(),
                pool: String::new(),
                gpu_types: Vec::new(),
                burst: start.burst,
                placement: start.placement,
                started_at: now,
                last_checkpoint_at: None,
                preempting: false,
                preempted_for: None,
                ends_at: None,
                service_before_gpu_secs: 0,
                share: None,
            });
        }
    }
    let total = (hours["a"] + hours["b"]) as f64;
    let share_a = hours["a"] as f64 / total;
    assert!(
        (share_a - 0.5).abs() <= 0.05 * 0.5,
        "a got {share_a:.3} of {total} GPU-hours"
    );
}

/// Running jobs as fixture lines, from (team, burst, flags, GPUs, start),
/// on nodes of 4 GPUs in turn (one that has no room skips the job): some
/// preempting, some of QoS `long`, and with `ends` some with a time limit.
fn running_fixture(running: &[(usize, bool, u8, u32, i64)], n_nodes: usize, ends: bool) -> Vec<String> {
    let teams = ["a", "b", "c"];
    let mut free: Vec<Vec<u32>> = vec![(0..4).collect(); n_nodes];
    let mut lines = Vec::new();
    for (i, (team, burst, flags, gpus, start)) in running.iter().enumerate() {
        let node = i % n_nodes;
        if free[node].len() < *gpus as usize {
            continue;
        }
        let taken: Vec<String> = free[node].drain(..*gpus as usize).map(|g| g.to_string()).collect();
        let mut line = format!(
            "r{} team={} on=n{node}:{} start={start}",
            100 + i,
            teams[*team],
            taken.join(",")
        );
        if *burst {
            line += " burst";
        }
        if flags % 4 == 0 {
            line += " preempting";
        }
        if flags % 3 == 0 {
            line += " qos=long";
        }
        if ends && flags % 2 == 0 {
            line += &format!(" ends={}", NOW.0 / 1000 + 100 * i64::from(*flags));
        }
        // Near its checkpoint: under LAS order, its team's less served
        // jobs may take it back.
        if flags % 5 == 1 {
            line += &format!(" ckpt={}", NOW.0 / 1000 - 60);
        }
        lines.push(line);
    }
    lines
}

fn arb_sharing_view() -> impl Strategy<Value = ClusterView> {
    // Nodes of 4 GPUs; running jobs of teams a/b/c, burst or not, some
    // preempting, some young; pending jobs of all teams and QoS classes.
    let running = proptest::collection::vec((0usize..3, any::<bool>(), 0u8..8, 1u32..=4, 0i64..10_000), 0..10);
    let pending = proptest::collection::vec((0usize..3, 0usize..3, 1u32..=4, 1u32..=2), 0..8);
    (1usize..5, running, pending).prop_map(|(n_nodes, running, pending)| {
        let teams = ["a", "b", "c"];
        let qos = ["normal", "long", "high"];
        let nodes: Vec<String> = (0..n_nodes).map(|i| format!("n{i} 4xh100")).collect();
        let running_lines = running_fixture(&running, n_nodes, false);
        let jobs: Vec<String> = pending
            .iter()
            .enumerate()
            .map(|(i, (team, q, gpus, n))| {
                // Every third ran before (LAS queues 0 to 2).
                let service = if i % 3 == 2 { (i as u64 % 4) * 15_000 } else { 0 };
                format!(
                    "j{} team={} qos={} gpus={gpus} nodes={n} service={service}",
                    i + 1,
                    teams[*team],
                    qos[*q]
                )
            })
            .collect();
        cluster_view_with(&nodes.join("\n"), &running_lines.join("\n"), &jobs.join("\n"))
    })
}

proptest! {
    /// Where `could_act` says a cycle could do nothing, `schedule` starts
    /// and preempts nothing, under either policy (with and without a QoS
    /// that preempts lower classes); and the same pool made full, with no
    /// burst work, no preempting QoS and no LAS order, is always such a
    /// case.
    #[test]
    fn a_cycle_that_could_not_act_does_nothing(view in arb_sharing_view()) {
        let mut no_preempting_qos = policy();
        no_preempting_qos.sharing.qos.iter_mut().for_each(|qos| qos.preempt_lower = false);
        no_preempting_qos.sharing.las = None;
        for policy in [&policy(), &no_preempting_qos] {
            if !could_act(&view.nodes, &view.running, policy, NOW) {
                let plan = schedule(&view, policy, NOW);
                prop_assert!(plan.starts.is_empty() && plan.preemptions.is_empty(), "{}", plan);
            }
        }
        let mut full = view.clone();
        full.nodes.iter_mut().flat_map(|node| node.gpus.iter_mut()).for_each(|gpu| gpu.busy = true);
        full.running.iter_mut().for_each(|job| job.burst = false);
        prop_assert!(!could_act(&full.nodes, &full.running, &no_preempting_qos, NOW));
        let plan = schedule(&full, &no_preempting_qos, NOW);
        prop_assert!(plan.starts.is_empty() && plan.preemptions.is_empty(), "{}", plan);
    }

    /// Stopping once nothing more can start or preempt changes nothing
    /// that starts or is preempted, with and without backfill, reserves
    /// and preempting classes; and the full plan says it is complete.
    #[test]
    fn a_plan_of_starts_alone_has_the_full_plans_starts_and_preemptions(
        view in prop_oneof![arb_sharing_view(), arb_backfill_view()],
        reserve in 0u32..3,
    ) {
        let mut with_reserve = policy();
        with_reserve.sharing.qos[2].reserve_gpus = reserve;
        for policy in [&policy(), &with_reserve, &Policy::default()] {
            let full = schedule(&view, policy, NOW);
            let starts = schedule_starts(&view, policy, NOW);
            prop_assert!(full.complete);
            prop_assert_eq!(&starts.starts, &full.starts);
            prop_assert_eq!(&starts.preemptions, &full.preemptions);
            if starts.complete {
                prop_assert_eq!(&starts, &full);
            }
        }
    }

    /// Every preemption is allowed (burst victim of a guaranteed job, a
    /// lower class under a preempting one, or its own team's more served
    /// job under LAS order; old enough; not already ending),
    /// and once the victims (and the jobs being preempted) are gone, the job
    /// it was for starts.
    #[test]
    fn preemptions_are_allowed_and_let_their_job_start(view in arb_sharing_view()) {
        let policy = policy();
        let plan = schedule(&view, &policy, NOW);
        prop_assert_eq!(&plan, &schedule(&view, &policy, NOW));
        let running: BTreeMap<JobId, &RunningJob> = view.running.iter().map(|r| (r.id, r)).collect();
        let mut for_jobs: BTreeMap<JobId, Vec<JobId>> = BTreeMap::new();
        for preemption in &plan.preemptions {
            let victim = running[&preemption.victim];
            prop_assert!(!victim.preempting);
            let job = view.pending.iter().find(|j| j.id == preemption.for_job).unwrap();
            let victim_qos = policy.sharing.qos(&victim.qos).unwrap();
            let job_qos = policy.sharing.qos(&job.shape.qos).unwrap();
            let las = policy.sharing.las.as_ref().is_some_and(|las| las.takes_back(victim, job, NOW));
            prop_assert!(las || victim.burst || (job_qos.preempt_lower && victim_qos.priority < job_qos.priority));
            prop_assert!(NOW.0 - victim.started_at.0 >= victim_qos.min_runtime_secs as i64 * 1000);
            for_jobs.entry(preemption.for_job).or_default().push(preemption.victim);
        }
        prop_assert!(plan.starts.iter().all(|s| !for_jobs.contains_key(&s.job)));
        for (job_id, victims) in for_jobs {
            // Free the victims and every job already ending; the job alone fits.
            let mut freed = view.clone();
            freed.running.retain(|r| !victims.contains(&r.id) && !r.preempting);
            for node in &mut freed.nodes {
                for gpu in &mut node.gpus {
                    gpu.busy = freed.running.iter().any(|r| r.placement.iter().any(|p| p.node == node.name && p.gpu_indices.contains(&gpu.index)));
                }
            }
            freed.pending.retain(|j| j.id == job_id);
            let alone = Policy { pools: policy.pools.clone(), ..Policy::default() };
            let replan = schedule(&freed, &alone, NOW);
            prop_assert!(replan.starts.iter().any(|s| s.job == job_id), "j{} does not start once its victims are gone:\n{}", job_id, replan);
        }
    }
}

#[test]
fn backfill_runs_short_jobs_ahead_but_never_on_reserved_gpus_past_the_reservation() {
    // r1 frees n1 in 1,000 s: j2 (8 GPUs) is reserved n1 from then. j3
    // would still run then, so it waits; j4 ends before, so it runs now.
    let plan = schedule(
        &cluster_view_with(
            "n1 8xh100",
            "r1 on=n1:0-5 ends=11000",
            "j2 gpus=8\nj3 gpus=2 time=5000\nj4 gpus=2 time=500",
        ),
        &Policy::default(),
        NOW,
    );
    expect![[r#"
        start j4 n1[6-7]
        pending j2: wants 8 GPUs on one node; 2 free in total but at most 2 on one node
        pending j3: it would delay job 2, which has GPUs reserved from 16 min from now
    "#]]
    .assert_eq(&plan.to_string());
    let (reserved, at, _) = plan.reservation.clone().unwrap();
    assert_eq!((reserved, at), (JobId(2), Timestamp(11_000_000)));
}

#[test]
fn backfill_uses_gpus_the_reservation_does_not_need() {
    check(
        &Policy::default(),
        "n1 8xh100\nn2 4xh100",
        "r1 on=n1:0-7 ends=11000\nr2 on=n2:0-1 ends=20000",
        "j3 gpus=8\nj4 gpus=2",
        expect![[r#"
            start j4 n2[2-3]
            pending j3: wants 8 GPUs on one node; 2 free in total but at most 2 on one node
        "#]],
    );
}

#[test]
fn reserves_hold_gpus_for_higher_classes_and_from_burst_work() {
    let mut policy = policy();
    policy.sharing.qos[2].reserve_gpus = 2;
    // 4 free: a normal 3-GPU job would leave 1 of the 2 kept for `high`.
    check(
        &policy,
        "n1 4xh100",
        "",
        "j1 team=a gpus=3\nj2 team=a gpus=2",
        expect![[r#"
            start j2 n1[0-1]
            pending j1: the free GPUs are the 2 GPUs that higher QoS classes keep free
        "#]],
    );
    check(
        &policy,
        "n1 4xh100",
        "",
        "j1 team=a qos=high gpus=3",
        expect![[r#"
            start j1 n1[0-2]
        "#]],
    );
    // Burst work of the top class still leaves its reserve alone.
    check(
        &policy,
        "n1 4xh100",
        "",
        "j1 team=c qos=high gpus=3",
        expect![[r#"
            pending j1: the free GPUs are the 2 GPUs that QoS reserves keep for guaranteed work, and this job would run as burst work
        "#]],
    );
}

/// Adds pool `infer`: the nodes labelled `tier=infer`.
fn add_infer_pool(policy: &mut Policy) {
    policy.pools.push(crate::model::PoolDef {
        name: "infer".into(),
        selector: [("tier".to_string(), "infer".to_string())].into(),
        defaults: Default::default(),
    });
}

#[test]
fn a_reserve_may_differ_by_pool() {
    // As the shipped gpoold.toml: `high` keeps 4 GPUs in each pool, and
    // none in the 2-GPU pool infer, where team c is guaranteed 2.
    let mut policy = policy();
    add_infer_pool(&mut policy);
    policy.sharing.teams[2].guaranteed_in = [("infer".to_string(), 2)].into();
    policy.sharing.qos[2].reserve_gpus = 4;
    let nodes = "n1 2xl4 tier=infer\nn2 4xh100";
    // The default pool takes every node: 6 GPUs, 2 of them not kept.
    let jobs = "j1 team=c pool=infer gpus=1\nj2 team=a type=h100 gpus=1";
    // The reserve of 4 keeps at most half of pool infer's 2 GPUs: one, so
    // its guaranteed job of one GPU starts.
    check(
        &policy,
        nodes,
        "",
        jobs,
        expect![[r#"
            start j1 n1[0]
            start j2 n2[0]
        "#]],
    );
    // Kept in the default pool alone, infer's guaranteed job starts there.
    policy.sharing.qos[2].reserve_in = [("infer".to_string(), 0)].into();
    check(
        &policy,
        nodes,
        "",
        jobs,
        expect![[r#"
            start j1 n1[0]
            start j2 n2[0]
        "#]],
    );
    // A pool's own number also keeps GPUs where the class keeps none
    // elsewhere.
    policy.sharing.qos[2].reserve_gpus = 0;
    policy.sharing.qos[2].reserve_in = [("infer".to_string(), 1)].into();
    check(
        &policy,
        nodes,
        "",
        "j1 team=c pool=infer gpus=2\nj2 team=a type=h100 gpus=4",
        expect![[r#"
            start j2 n2[0-3]
            pending j1: the free GPUs are the 1 GPU that higher QoS classes keep free
        "#]],
    );
}

#[test]
fn alike_jobs_no_shape_cache_covers_share_one_list_of_reasons() {
    // Jobs that may preempt, where GPUs are kept: each is tried, as what it
    // may take depends on what is free; alike ones still share their
    // reasons (words keep each list once by its address).
    let mut policy = policy();
    policy.sharing.qos[2].reserve_gpus = 2;
    // Team a's jobs are within its guarantee; b's guaranteed job, which
    // none may preempt, holds the node.
    let jobs: String = (2..=51).map(|n| format!("j{n} team=a gpus=2\n")).collect();
    let view = cluster_view_with("n1 2xh100", "r1 team=b on=n1:0-1", &jobs);
    let plan = schedule(&view, &policy, NOW);
    assert_eq!(plan.pending.len(), 50, "{plan}");
    let (_, first) = plan.pending[1];
    for (id, list) in &plan.pending[1..] {
        assert_eq!(
            *list, first,
            "{id}: {:?} apart from {:?}",
            plan.lists[*list as usize], plan.lists[first as usize]
        );
    }
}

fn arb_backfill_view() -> impl Strategy<Value = ClusterView> {
    let running = proptest::collection::vec((1u32..=8, 1i64..4000), 0..8);
    let pending = proptest::collection::vec((1u32..=8, 1u32..=2, proptest::option::of(1u64..5000)), 1..10);
    (1usize..4, running, pending).prop_map(|(n_nodes, running, pending)| {
        let nodes: Vec<String> = (0..n_nodes).map(|i| format!("n{i} 8xh100")).collect();
        let mut free: Vec<Vec<u32>> = vec![(0..8).collect(); n_nodes];
        let mut lines = Vec::new();
        for (i, (gpus, ends_in)) in running.iter().enumerate() {
            let node = i % n_nodes;
            if free[node].len() < *gpus as usize {
                continue;
            }
            let taken: Vec<String> = free[node].drain(..*gpus as usize).map(|g| g.to_string()).collect();
            lines.push(format!(
                "r{} on=n{node}:{} ends={}",
                100 + i,
                taken.join(","),
                NOW.0 / 1000 + ends_in
            ));
        }
        let jobs: Vec<String> = pending
            .iter()
            .enumerate()
            .map(|(i, (gpus, n, time))| {
                let mut line = format!("j{} gpus={gpus} nodes={n}", i + 1);
                if let Some(time) = time {
                    line += &format!(" time={time}");
                }
                line
            })
            .collect();
        cluster_view_with(&nodes.join("\n"), &lines.join("\n"), &jobs.join("\n"))
    })
}

proptest! {
    /// Backfill never delays the reserved job: its GPUs are free now or
    /// held by jobs (running or started now) that end by the reservation,
    /// and nothing that runs past it starts on them.
    #[test]
    fn backfill_never_delays_the_reserved_job(view in arb_backfill_view()) {
        let plan = schedule(&view, &Policy::default(), NOW);
        let Some((reserved, at, gpus)) = plan.reservation.clone() else {
            return Ok(());
        };
        let on_reserved = |placement: &[NodePlacement]| {
            placement.iter().any(|p| {
                gpus.iter()
                    .any(|r| r.node == p.node && r.gpu_indices.iter().any(|g| p.gpu_indices.contains(g)))
            })
        };
        for start in &plan.starts {
            let job = view.pending.iter().find(|j| j.id == start.job).unwrap();
            let ends = job.shape.time_limit_secs.map(|s| NOW.0 + s as i64 * 1000);
            if ends.is_none_or(|end| end > at.0) {
                prop_assert!(!on_reserved(&start.placement), "j{} runs past the reservation of j{} on its GPUs:\n{}", start.job, reserved, plan);
            }
        }
        for running in &view.running {
            if on_reserved(&running.placement) {
                prop_assert!(running.ends_at.is_some_and(|end| end <= at));
            }
        }
    }
}

#[test]
fn free_gpus_a_reclaiming_job_counts_on_are_held_for_it() {
    // j3 needs 0-1 (free) and 2-3 (r1's); j4, later, may not take 0-1.
    check(
        &policy(),
        "n1 8xh100",
        "r1 team=c burst on=n1:2-3\nr2 team=a on=n1:4-7",
        "j3 team=b gpus=4\nj4 team=c gpus=2",
        expect![[r#"
            preempt j1 for j3 (loses 20000 GPU-seconds)
            pending j3: preempting 1 running job to make room for it
            pending j4: wants 2 GPUs on one node; none is free; team c runs 0 of its 0 guaranteed GPUs; 2 GPUs more run only as burst work on idle GPUs; no start time can be foreseen: not every running job in its way has a time limit
        "#]],
    );
}

#[test]
fn guaranteed_work_takes_kept_gpus_only_as_far_as_lent_ones_back_them() {
    let mut policy = policy();
    policy.sharing.qos[2].reserve_gpus = 2;
    // 2 free, both kept for `high`, and 2 lent to c's burst job, which
    // `high` would take back: a's guaranteed job starts on the kept GPUs
    // rather than preempt r1 now.
    check(
        &policy,
        "n1 4xh100",
        "r1 team=c burst on=n1:2-3",
        "j2 team=a gpus=2",
        expect![[r#"
            start j2 n1[0-1]
        "#]],
    );
    // 1 lent backs 1 of the 2 kept: the first 1-GPU job starts, the second
    // takes r1's GPU back rather than leave `high` nothing, now or after a
    // grace.
    check(
        &policy,
        "n1 4xh100",
        "r1 team=c burst on=n1:3\nr2 team=b on=n1:2",
        "j3 team=a gpus=1\nj4 team=a gpus=1",
        expect![[r#"
            start j3 n1[0]
            preempt j1 for j4 (loses 10000 GPU-seconds)
            pending j4: preempting 1 running job to make room for it
        "#]],
    );
    // Burst work never takes kept GPUs, lent ones or not.
    check(
        &policy,
        "n1 4xh100",
        "r1 team=c burst on=n1:2-3",
        "j2 team=c gpus=1",
        expect![[r#"
            pending j2: the free GPUs are the 2 GPUs that QoS reserves keep for guaranteed work, and this job would run as burst work
        "#]],
    );
}

#[test]
fn a_victim_no_waiting_job_needs_is_rescinded_unless_another_counts_on_it() {
    // r1 was taken for j9, which no longer waits (it started elsewhere):
    // nothing needs its GPUs, so it runs on.
    check(
        &policy(),
        "n1 4xh100",
        "r1 team=c burst on=n1:2-3 for=j9\nr2 team=a on=n1:0-1",
        "",
        expect![[r#"
            rescind the preemption of j1
        "#]],
    );
    // b's guaranteed job needs 2 GPUs: it counts on r1 (no new victim,
    // nothing rescinded).
    check(
        &policy(),
        "n1 4xh100",
        "r1 team=c burst on=n1:2-3 for=j9\nr2 team=a on=n1:0-1",
        "j3 team=b gpus=2",
        expect![[r#"
            pending j3: preempting 1 running job to make room for it
        "#]],
    );
    // An operator's requeue (taken for no job) is never rescinded.
    check(
        &policy(),
        "n1 4xh100",
        "r1 team=c burst on=n1:2-3 preempting",
        "",
        expect![""],
    );
}

#[test]
fn guarantees_per_pool_and_per_gpu_model() {
    let mut policy = policy();
    add_infer_pool(&mut policy);
    policy.sharing.teams[2].guaranteed_in = [("infer".to_string(), 2), ("a100".to_string(), 2)].into();
    // Team c has no general guarantee: 2 GPUs in pool infer, 2 A100s.
    check(
        &policy,
        "n1 4xh100 tier=infer\nn2 4xa100\nn3 4xh100",
        "",
        "j1 team=c pool=infer gpus=2\nj2 team=c pool=infer gpus=1\nj3 team=c type=a100 gpus=2\nj4 team=c type=h100 gpus=1",
        expect![[r#"
            start j1 n1[0-1]
            start j2 n1[2] (burst)
            start j3 n2[0-1]
            start j4 n1[3] (burst)
        "#]],
    );
    // Running guaranteed work in the pool counts against its entry.
    check(
        &policy,
        "n1 4xh100 tier=infer",
        "r9 team=c pool=infer on=n1:0-1",
        "j1 team=c pool=infer gpus=1",
        expect![[r#"
            start j1 n1[2] (burst)
        "#]],
    );
}

/// The hints `gpool why` gives each pending job of the plan.
fn hints(policy: &Policy, nodes: &str, jobs: &str) -> Vec<String> {
    let plan = schedule(&cluster_view_with(nodes, "", jobs), policy, NOW);
    plan.waiting()
        .map(|(job, reasons)| {
            let hints: Vec<String> = reasons.iter().filter_map(Reject::hint).collect();
            format!("j{job}: {}", hints.join("; "))
        })
        .collect()
}

/// A job's reasons name only what it asked for, and only nodes of its
/// pool: one that asks nothing is not told to relax its requirements, and
/// one of pool infer is not told it may not run on a node outside it.
#[test]
fn reasons_name_only_what_the_job_asked_and_only_its_pools_nodes() {
    let mut policy = policy();
    add_infer_pool(&mut policy);
    let nodes = "n1 2xl4 tier=infer used=0-1\nn2 4xh100";
    let plan = schedule(
        &cluster_view_with(nodes, "", "j1 team=a pool=infer gpus=1"),
        &policy,
        NOW,
    );
    let words = plan.to_string();
    assert!(!words.contains("requirements") && !words.contains("narrows"), "{words}");
    assert!(plan
        .waiting()
        .flat_map(|(_, r)| r.iter())
        .all(|r| r.hint().is_none_or(|h| !h.contains("relax"))));
    let plan = schedule(
        &cluster_view_with(nodes, "", "j1 team=a pool=infer gpus=1 not=n2"),
        &policy,
        NOW,
    );
    assert!(!plan.to_string().contains("not on n2"), "{plan}");
    let plan = schedule(
        &cluster_view_with(nodes, "", "j1 team=a pool=infer gpus=1 not=n1,n2"),
        &policy,
        NOW,
    );
    assert!(
        plan.to_string().contains("not on n1") && !plan.to_string().contains("n2"),
        "{plan}"
    );
}

/// A reserve written for large pools keeps at most half of a small one:
/// on one node of 4 GPUs a reserve of 4 keeps 2, and guaranteed work of a
/// lower class takes the other 2.
#[test]
fn a_reserve_keeps_at_most_half_of_its_pool() {
    let mut policy = policy();
    policy.sharing.qos[2].reserve_gpus = 4;
    let plan = schedule(&cluster_view_with("n1 4xh100", "", "j1 team=a gpus=2"), &policy, NOW);
    assert_eq!(plan.to_string(), "start j1 n1[0-1]\n");
    let plan = schedule(&cluster_view_with("n1 4xh100", "", "j1 team=a gpus=3"), &policy, NOW);
    assert!(plan.starts.is_empty(), "{plan}");
    // Its reason says the reserve was capped, naming the pool.
    assert!(
        plan.to_string()
            .contains("the 2 GPUs that higher QoS classes keep free (their reserves ask 4 of pool \"default\"'s 4"),
        "{plan}"
    );
    // Two nodes of 4: the whole reserve of 4 is kept.
    let plan = schedule(
        &cluster_view_with("n1 4xh100\nn2 4xh100", "", "j1 team=a gpus=4"),
        &policy,
        NOW,
    );
    assert_eq!(plan.to_string(), "start j1 n1[0-3]\n");
    let plan = schedule(
        &cluster_view_with("n1 4xh100\nn2 4xh100 used=0", "", "j1 team=a gpus=4"),
        &policy,
        NOW,
    );
    assert!(plan.starts.is_empty(), "{plan}");
}

#[test]
fn hints_are_true_of_the_state_they_come_from() {
    let mut policy = policy();
    policy.sharing.qos[2].reserve_gpus = 2;
    // 3 free, 2 of them kept for `high`: a smaller job starts only if it
    // leaves those alone, so at most 1 GPU, not 3.
    assert_eq!(
        hints(&policy, "n1 4xh100 used=0", "j1 team=a gpus=4"),
        ["j1: ask for at most 1 GPU to start now, or wait for running jobs to end"]
    );
    // Nothing free beyond the kept GPUs: nothing smaller helps.
    assert_eq!(
        hints(&policy, "n1 4xh100 used=0-1", "j1 team=a gpus=4"),
        ["j1: wait for running jobs to end"]
    );
    // A guaranteed job below the reserving class is told which class may
    // take the kept GPUs...
    assert_eq!(
        hints(&policy, "n1 4xh100", "j1 team=a gpus=3"),
        ["j1: use QoS class high, which may take them, or wait for GPUs beyond the reserve to free up"]
    );
    // ...burst work of the top class is not told to change class: it is
    // told why its own class's reserve is not for it.
    assert_eq!(
        hints(&policy, "n1 4xh100", "j1 team=c qos=high gpus=3"),
        ["j1: wait for GPUs beyond the reserve to free up, or for the team's guaranteed jobs to end so that it runs guaranteed"]
    );
}

#[test]
fn a_cycle_could_act_only_with_a_free_gpu_or_a_possible_victim() {
    let could = |policy: &Policy, nodes: &str, running: &str| {
        let view = cluster_view_with(nodes, running, "j1 team=b gpus=2");
        could_act(&view.nodes, &view.running, policy, NOW)
    };
    let plain = Policy::default();
    assert!(could(&plain, "n1 8xh100", "r1 team=a on=n1:0-3"), "GPUs 4-7 are free");
    assert!(
        !could(&plain, "n1 4xh100", "r1 team=a on=n1:0-3"),
        "full, nothing to preempt"
    );
    assert!(!could(&plain, "n1 4xh100 down", ""), "a down node's GPUs take no work");
    assert!(
        could(&plain, "n1 4xh100", "r1 team=a burst on=n1:0-3"),
        "burst work may be reclaimed"
    );
    assert!(
        could(&policy(), "n1 4xh100", "r1 team=a on=n1:0-3"),
        "a QoS here preempts lower classes"
    );
    // Whatever could act, `schedule` agrees: a full pool without victims
    // starts and preempts nothing.
    let view = cluster_view_with("n1 4xh100", "r1 team=a on=n1:0-3", "j1 team=b gpus=2");
    let plan = schedule(&view, &plain, NOW);
    assert!(plan.starts.is_empty() && plan.preemptions.is_empty());
}

/// A long queue of few shapes: teams, QoS classes, sizes, nice values and
/// time limits, submitted in no particular order of id (and many at once),
/// on nodes some of which are out or busy with running work (guaranteed,
/// burst, being preempted, with and without an end).
fn arb_queue_view() -> impl Strategy<Value = ClusterView> {
    let running = proptest::collection::vec((0usize..3, any::<bool>(), 0u8..8, 1u32..=4, 0i64..10_000), 0..10);
    let shape = (
        0usize..3,
        0usize..3,
        1u32..=4,
        1u32..=2,
        -1i32..=1,
        proptest::option::of(1u64..3000),
    );
    let shapes = proptest::collection::vec(shape, 1..5);
    let pending = proptest::collection::vec((0usize..4, 0i64..4), 0..60);
    (1usize..6, running, shapes, pending).prop_map(|(n_nodes, running, shapes, pending)| {
        let teams = ["a", "b", "c"];
        let qos = ["normal", "long", "high"];
        let nodes: Vec<String> = (0..n_nodes)
            .map(|i| match i {
                3 => format!("n{i} 4xh100 drain"),
                4 => format!("n{i} 2xh100 2xl4"),
                _ => format!("n{i} 4xh100"),
            })
            .collect();
        let running_lines = running_fixture(&running, n_nodes, true);
        let jobs: Vec<String> = pending
            .iter()
            .enumerate()
            .map(|(i, (shape, at))| {
                let (team, q, gpus, n, prio, time) = shapes[shape % shapes.len()];
                let mut line = format!(
                    "j{} team={} qos={} gpus={gpus} nodes={n} prio={prio} at={}",
                    i + 1,
                    teams[team],
                    qos[q],
                    NOW.0 / 1000 - 100 * at
                );
                if let Some(time) = time {
                    line += &format!(" time={time}");
                }
                if i % 5 == 4 {
                    line += &format!(" service={}", (*at as u64 % 3) * 20_000);
                }
                line
            })
            .collect();
        cluster_view_with(&nodes.join("\n"), &running_lines.join("\n"), &jobs.join("\n"))
    })
}

proptest! {
    /// A starts-only cycle on the first jobs of each shape (`Queue::window`)
    /// starts and preempts what a full cycle on the whole queue does, with
    /// and without teams, victims (burst work, jobs being preempted, a QoS
    /// that preempts lower classes), GPUs kept for a class (where no job
    /// may be preempted, and unless the plan says it needs the whole
    /// queue) and an age weight, where the waste
    /// budget does not stop a reclaim (see `queue.rs` for where it may);
    /// and the queue gives back every job it was given.
    #[test]
    fn a_cycle_on_the_queues_window_starts_what_the_whole_queue_would(view in arb_queue_view(), reserved in 1u32..6) {
        let mut no_preempting_qos = policy();
        no_preempting_qos.sharing.qos.iter_mut().for_each(|qos| qos.preempt_lower = false);
        let mut no_age = no_preempting_qos.clone();
        no_age.sharing.weights.age = 0.0;
        let mut queue = Queue::default();
        for job in &view.pending {
            queue.insert(job.clone());
        }
        prop_assert_eq!(queue.len(), view.pending.len());
        // The same queue with no running job a victim.
        let mut no_victims = view.clone();
        no_victims.running.iter_mut().for_each(|job| {
            job.burst = false;
            job.preempting = false;
        });
        // GPUs kept free for the top class (and so from burst work).
        let mut reserve = no_preempting_qos.clone();
        reserve.sharing.qos[2].reserve_gpus = reserved;
        let mut default_reserve = Policy::default();
        default_reserve.sharing.qos[0].reserve_gpus = reserved;
        for view in [&view, &no_victims] {
            for policy in [&policy(), &no_preempting_qos, &no_age, &Policy::default(), &reserve, &default_reserve] {
                // Under LAS order, a job near its checkpoint may be one.
                let las = policy.sharing.las.as_ref();
                let victims = view
                    .running
                    .iter()
                    .any(|job| job.burst || job.preempting || las.is_some_and(|las| las.may_be_taken(job, NOW)));
                // At most 4 shapes: too few to spend the failed tries.
                let gpus = window_gpus(&view.nodes, &view.running, (policy, NOW), &queue, 0);
                let reserves = policy.sharing.qos.iter().any(|qos| qos.reserves_any());
                let served = view.pending.iter().any(|job| job.service_gpu_secs > 0);
                let Some(gpus) = gpus else {
                    prop_assert!(reserves && victims || las.is_some() && served, "no window");
                    continue;
                };
                let windowed = ClusterView {
                    pending: queue.window(gpus).cloned().collect(),
                    windowed: true,
                    ..view.clone()
                };
                let full = schedule(view, policy, NOW);
                let starts = schedule_starts(&windowed, policy, NOW);
                prop_assert!(reserves || !starts.needs_whole);
                if starts.needs_whole {
                    continue;
                }
                prop_assert_eq!(&starts.starts, &full.starts, "window of {} jobs of {}:\n{}", windowed.pending.len(), view.pending.len(), full);
                prop_assert_eq!(&starts.preemptions, &full.preemptions, "window of {} jobs of {}:\n{}", windowed.pending.len(), view.pending.len(), full);
                prop_assert!(!starts.complete);
            }
        }
        for job in &view.pending {
            prop_assert!(queue.contains(job));
            prop_assert!(queue.remove(job));
            prop_assert!(!queue.remove(job));
        }
        prop_assert!(queue.is_empty());
    }
}

proptest! {
    /// Jobs that share one shape (as a batch's do) are planned as jobs of
    /// equal shapes of their own are: the same starts, preemptions,
    /// reasons and priorities, in whole plans and in plans of starts
    /// alone (a cycle gives a job the reasons a job of its shape met
    /// while nothing changed since, without sizing it up).
    #[test]
    fn jobs_that_share_a_shape_are_planned_as_jobs_of_equal_shapes(view in arb_queue_view(), reserved in 1u32..6) {
        let shared = with_shared_shapes(&view);
        let mut reserve = policy();
        reserve.sharing.qos[2].reserve_gpus = reserved;
        let mut no_las = policy();
        no_las.sharing.las = None;
        for policy in [&policy(), &no_las, &Policy::default(), &reserve] {
            prop_assert_eq!(schedule(&shared, policy, NOW), schedule(&view, policy, NOW));
            prop_assert_eq!(schedule_starts(&shared, policy, NOW), schedule_starts(&view, policy, NOW));
        }
    }
}

/// `view` with its waiting jobs of equal shapes sharing one.
fn with_shared_shapes(view: &ClusterView) -> ClusterView {
    let mut shapes: Vec<std::sync::Arc<JobShape>> = Vec::new();
    let pending = view
        .pending
        .iter()
        .map(|job| {
            let shape = match shapes.iter().find(|shape| **shape == job.shape) {
                Some(shape) => shape.clone(),
                None => {
                    shapes.push(job.shape.clone());
                    job.shape.clone()
                }
            };
            std::sync::Arc::new(PendingJob {
                shape,
                ..(**job).clone()
            })
        })
        .collect();
    ClusterView {
        pending,
        ..view.clone()
    }
}

#[test]
fn a_window_holds_the_gpus_victims_hold_unless_many_shapes_could_spend_the_failed_tries() {
    let view = cluster_view_with("n1 4xh100\nn2 4xh100 drain", "r1 team=a on=n1:0-1", "j1 team=a");
    let mut queue = Queue::default();
    queue.insert(view.pending[0].clone());
    // Free GPUs of nodes that take work.
    assert_eq!(
        window_gpus(&view.nodes, &view.running, (&Policy::default(), NOW), &queue, 0),
        Some(2)
    );
    // A preempting class, burst work, a job being preempted: every GPU of
    // the nodes that take work.
    assert_eq!(
        window_gpus(&view.nodes, &view.running, (&policy(), NOW), &queue, 0),
        Some(4)
    );
    let burst = cluster_view_with("n1 4xh100", "r1 team=a burst on=n1:0-1", "");
    assert_eq!(
        window_gpus(&burst.nodes, &burst.running, (&Policy::default(), NOW), &queue, 0),
        Some(4)
    );
    let ending = cluster_view_with("n1 4xh100", "r1 team=a preempting on=n1:0-1", "");
    assert_eq!(
        window_gpus(&ending.nodes, &ending.running, (&Policy::default(), NOW), &queue, 0),
        Some(4)
    );
    // Shapes and other jobs that could spend the cycle's failed tries.
    let many = preempt::MAX_FAILED_RECLAIMS_PER_CYCLE - 4;
    assert_eq!(
        window_gpus(
            &burst.nodes,
            &burst.running,
            (&Policy::default(), NOW),
            &queue,
            many - 1
        ),
        Some(4)
    );
    assert_eq!(
        window_gpus(&burst.nodes, &burst.running, (&Policy::default(), NOW), &queue, many),
        None
    );
    // Without victims the failed tries do not matter.
    assert_eq!(
        window_gpus(&view.nodes, &view.running, (&Policy::default(), NOW), &queue, 1000),
        Some(2)
    );
    // GPUs kept for a class: a window only where nothing may be preempted.
    let mut with_reserve = Policy::default();
    with_reserve.sharing.qos[0].reserve_gpus = 1;
    assert_eq!(
        window_gpus(&view.nodes, &view.running, (&with_reserve, NOW), &queue, 0),
        Some(2)
    );
    assert_eq!(
        window_gpus(&burst.nodes, &burst.running, (&with_reserve, NOW), &queue, 0),
        None
    );
}

#[test]
fn a_job_short_of_cpus_reclaims_the_victim_whose_cpus_it_needs() {
    // GPUs 6-7 are free but hold 2 CPUs: b's job needs 8. Ending r2 would
    // free 2 more, not enough; r1's 12 are.
    check(
        &policy(),
        "n1 8xh100 cpus=16 memgib=64 hold=0-3:12:0 hold=4-5:2:0",
        "r1 team=a burst on=n1:0-3 start=9000\nr2 team=a burst on=n1:4-5 start=9000",
        "j3 team=b gpus=2 cpus=8",
        expect![[r#"
            preempt j1 for j3 (loses 4000 GPU-seconds)
            pending j3: preempting 1 running job to make room for it
        "#]],
    );
}

#[test]
fn an_exclusive_job_counts_every_gpu_of_its_node_against_its_teams_cap() {
    // Team c may hold 8 GPUs: j1 asks for 1 but takes the 8 of n1, so j2
    // is over c's cap in the same cycle, though n2 has GPUs free.
    let mut policy = policy();
    policy.sharing.teams[2].max_gpus = Some(8);
    check(
        &policy,
        "n1 8xh100\nn2 8xh100 used=0",
        "",
        "j1 team=c gpus=1 exclusive=yes\nj2 team=c gpus=1",
        expect![[r#"
            start j1 n1[0-7] (burst)
            pending j2: team c is at its cap: 8 of at most 8 GPUs in use
        "#]],
    );
}
