//! Nodes that cannot enforce a job's limits: kept from it with a reason
//! (`enforce_limits = "refuse"`), or given it as before (`"warn"`).

use super::*;
use crate::enforce::{EnforceLimits, LimitSet};
use crate::policy::Team;
use crate::testing::{cluster_view, cluster_view_with};
use expect_test::{expect, Expect};
use proptest::prelude::*;

fn policy(mode: EnforceLimits) -> Policy {
    Policy {
        enforce_limits: mode,
        ..Policy::default()
    }
}

fn check(mode: EnforceLimits, nodes: &str, jobs: &str, expected: Expect) {
    let plan = schedule(&cluster_view(nodes, jobs), &policy(mode), Timestamp(0));
    expected.assert_eq(&plan.to_string());
}

#[test]
fn a_job_asking_for_memory_goes_to_a_node_that_enforces_it() {
    // n1 is the best fit (2 GPUs free), but enforces nothing.
    check(
        EnforceLimits::Refuse,
        "n1 4xh100 used=0-1 enforces=\nn2 4xh100 enforces=cpu,devices,memory,pids",
        "j1 memgib=1\nj2 gpus=2",
        expect![[r#"
            start j1 n2[0]
            start j2 n1[2-3]
        "#]],
    );
}

#[test]
fn refused_everywhere_it_waits_naming_the_limit_and_the_nodes() {
    check(
        EnforceLimits::Refuse,
        "n1 4xh100 enforces=devices\nn2 4xh100 enforces=memory",
        "j1 memgib=1 cpus=2\nj2 gpus=1",
        expect![[r#"
            start j2 n1[0]
            pending j1: wants 1 GPU on one node; none is free; counting only what its requirements allow: 2 free CPUs and 1.0 GiB of free memory on each node; cpu and memory limits (--cpus-per-gpu, --mem) not enforced on 2 nodes: n1, n2; no start time can be foreseen: not every running job in its way has a time limit
        "#]],
    );
    let plan = schedule(
        &cluster_view(
            "n1 1xh100 enforces=\nn2 1xh100 enforces=\nn3 1xh100 enforces=\nn4 1xh100 enforces=",
            "j1 memgib=1",
        ),
        &Policy::default(),
        Timestamp(0),
    );
    let words = plan.to_string();
    assert!(
        words.contains("memory limit (--mem) not enforced on 4 nodes: n1, n2, n3, ..."),
        "{words}"
    );
    let reasons = &plan.lists[plan.pending[0].1 as usize];
    let unenforced = reasons
        .iter()
        .find(|r| r.code() == "limits_not_enforced")
        .expect("the reason");
    let reason = Reason::of_reject(unenforced);
    assert_eq!(reason.facts.limits, vec!["memory".to_string()]);
    assert_eq!(reason.facts.count, Some(4));
    assert!(reason.hint.unwrap_or_default().contains("without --mem"));
}

#[test]
fn with_warn_it_runs_where_it_fits_best() {
    check(
        EnforceLimits::Warn,
        "n1 4xh100 used=0-1 enforces=\nn2 4xh100",
        "j1 memgib=1",
        expect![[r#"
            start j1 n1[2]
        "#]],
    );
}

#[test]
fn a_job_asking_for_no_limit_runs_on_a_node_that_enforces_none() {
    check(
        EnforceLimits::Refuse,
        "n1 2xh100 enforces=",
        "j1 gpus=2",
        expect![[r#"
            start j1 n1[0-1]
        "#]],
    );
}

#[test]
fn no_burst_work_is_preempted_on_a_node_that_would_not_enforce_the_limits() {
    let mut policy = policy(EnforceLimits::Refuse);
    policy.sharing.teams = vec![
        Team {
            guaranteed_gpus: 4,
            ..Team::unlisted("b")
        },
        Team::unlisted("a"),
    ];
    let view = cluster_view_with(
        "n1 2xh100 enforces=\nn2 2xh100",
        "r1 team=a burst on=n1:0-1 start=0\nr2 team=a burst on=n2:0-1 start=0",
        "j3 team=b gpus=2 memgib=1",
    );
    let plan = schedule(&view, &policy, Timestamp(10_000));
    assert_eq!(plan.preemptions.len(), 1, "{plan}");
    assert_eq!(plan.preemptions[0].victim, JobId(2), "{plan}");
}

/// Nodes with random enforced sets, jobs with random asks.
fn arb_view() -> impl Strategy<Value = (String, String)> {
    let node = (1u32..5, 0u8..16, 0u32..3);
    let job = (1u32..4, any::<bool>(), any::<bool>());
    (prop::collection::vec(node, 1..5), prop::collection::vec(job, 1..8)).prop_map(|(nodes, jobs)| {
        let names = ["cpu", "devices", "memory", "pids"];
        let nodes: Vec<String> = nodes
            .iter()
            .enumerate()
            .map(|(i, (gpus, bits, used))| {
                let enforced: Vec<&str> = (0..4).filter(|b| bits & (1 << b) != 0).map(|b| names[b]).collect();
                let used = if *used > 0 && *used <= *gpus {
                    format!(" used=0-{}", used - 1)
                } else {
                    String::new()
                };
                format!("n{} {gpus}xh100{used} enforces={}", i + 1, enforced.join(","))
            })
            .collect();
        let jobs: Vec<String> = jobs
            .iter()
            .enumerate()
            .map(|(i, (gpus, mem, cpus))| {
                let mem = if *mem { " memgib=1" } else { "" };
                let cpus = if *cpus { " cpus=1" } else { "" };
                format!("j{} gpus={gpus}{mem}{cpus}", i + 1)
            })
            .collect();
        (nodes.join("\n"), jobs.join("\n"))
    })
}

proptest! {
    /// Under refuse, never a start on a node that does not enforce what
    /// the job asks for, and a job that waits only for such nodes says so;
    /// under warn, the same jobs start as they would on nodes enforcing all.
    #[test]
    fn refuse_never_places_a_job_where_its_limits_are_not_enforced((nodes, jobs) in arb_view()) {
        let view = cluster_view(&nodes, &jobs);
        let plan = schedule(&view, &policy(EnforceLimits::Refuse), Timestamp(0));
        for start in &plan.starts {
            let job = view.pending.iter().find(|job| job.id == start.job).expect("a started job waited");
            for part in &start.placement {
                let node = view.nodes.iter().find(|node| node.name == part.node).expect("its node");
                prop_assert!(job.shape.limits.is_subset(node.enforces), "{} on {}: {plan}", start.job, node.name);
            }
        }
        for (id, reasons) in plan.waiting() {
            let job = view.pending.iter().find(|job| job.id == id).expect("a pending job waited");
            let fits_elsewhere = view.nodes.iter().any(|node| {
                !job.shape.limits.is_subset(node.enforces) && node.gpus.len() >= job.shape.gpus_per_node as usize
            });
            if fits_elsewhere && reasons.iter().any(|r| r.code() == "resources") {
                prop_assert!(reasons.iter().any(|r| r.code() == "limits_not_enforced"), "j{id}: {plan}");
            }
        }
        let mut all = view.clone();
        for node in &mut all.nodes {
            node.enforces = LimitSet::ALL;
        }
        let warned = schedule(&view, &policy(EnforceLimits::Warn), Timestamp(0));
        let enforced = schedule(&all, &policy(EnforceLimits::Refuse), Timestamp(0));
        prop_assert_eq!(warned.starts, enforced.starts);
    }
}
