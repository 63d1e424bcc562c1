//! Scheduler tests: fixtures in, plan snapshots out, plus safety properties.

use super::teams::order_key;
use super::*;
use crate::testing::cluster_view;
use expect_test::{expect, Expect};
use proptest::prelude::*;
use std::collections::HashSet;

fn check(nodes: &str, jobs: &str, expected: Expect) {
    let plan = schedule(&cluster_view(nodes, jobs), &Policy::default(), Timestamp(0));
    expected.assert_eq(&plan.to_string());
}

#[test]
fn best_fit_keeps_whole_nodes_free() {
    check(
        "n1 8xh100\nn2 8xh100 used=0-5",
        "j1 gpus=2\nj2 gpus=8",
        expect![[r#"
            start j1 n2[6-7]
            start j2 n1[0-7]
        "#]],
    );
}

#[test]
fn gpus_within_a_node_are_the_best_connected() {
    // Islands 0-3 and 4-7; 1 and 2 are taken from the first, 4 from the
    // second, so a 3-GPU job fits only in the second island, a 2-GPU job
    // in what is left of the first.
    check(
        "n1 8xh100 nvlink=0-3/4-7 used=1,2,4",
        "j1 gpus=3\nj2 gpus=2",
        expect![[r#"
            start j1 n1[5-7]
            start j2 n1[0,3]
        "#]],
    );
}

#[test]
fn priority_then_submit_order() {
    check(
        "n1 4xh100",
        "j1 gpus=4\nj2 gpus=4 prio=10\nj3 gpus=4",
        expect![[r#"
            start j2 n1[0-3]
            pending j1: wants 4 GPUs on one node; none is free; no start time can be foreseen: not every running job in its way has a time limit
            pending j3: wants 4 GPUs on one node; none is free
        "#]],
    );
}

#[test]
fn gang_is_all_or_nothing() {
    check(
        "n1 8xh100\nn2 8xh100 used=0-4\nn3 8xh100",
        "j1 gpus=8 nodes=3\nj2 gpus=4 nodes=2",
        expect![[r#"
            start j2 n1[0-3] n3[0-3]
            pending j1: wants 8 GPUs on each of 3 nodes; 2 nodes have that many free (19 free in total); no start time can be foreseen: not every running job in its way has a time limit
        "#]],
    );
}

#[test]
fn gang_stays_on_one_model() {
    check(
        "n1 8xh100\nn2 8xa100\nn3 8xa100",
        "j1 gpus=8 nodes=2",
        expect![[r#"
            start j1 n2[0-7] n3[0-7]
        "#]],
    );
}

#[test]
fn gpu_model_list_and_missing_models() {
    check(
        "n1 4xl4\nn2 8xa100-80gb",
        "j1 gpus=2 type=h100,l4\nj2 type=h100\nj3 gpus=8",
        expect![[r#"
            start j1 n1[0-1]
            start j3 n2[0-7]
            pending j2: no GPU of model h100 on an available node of pool "default" (it has: a100-80gb, l4)
        "#]],
    );
}

#[test]
fn fragmentation_is_named() {
    check(
        "n1 8xh100 used=0-4\nn2 8xh100 used=0-4\nn3 8xh100 used=0-4\nn4 8xh100 used=0-4",
        "j1 gpus=4",
        expect![[r#"
            pending j1: wants 4 GPUs on one node; 12 free in total but at most 3 on one node; no start time can be foreseen: not every running job in its way has a time limit
        "#]],
    );
}

#[test]
fn no_nodes_and_unavailable_nodes() {
    check(
        "",
        "j1 gpus=1",
        expect![[r#"
            pending j1: no nodes: pool "default" has no known node yet
        "#]],
    );
    check(
        "n1 8xh100 drain\nn2 8xh100 down",
        "j1 gpus=1",
        expect![[r#"
            pending j1: no node of pool "default" takes new work (1 down, 1 draining or drained)
        "#]],
    );
    check(
        "n1 8xh100 used=0-7\nn2 8xh100 drain",
        "j1 gpus=1",
        expect![[r#"
            pending j1: wants 1 GPU on one node; none is free; pool "default" has 0 down and 1 draining or drained; no start time can be foreseen: not every running job in its way has a time limit
        "#]],
    );
}

#[test]
fn pools_select_nodes_by_label() {
    let policy = Policy {
        pools: vec![
            PoolDef {
                name: "default".into(),
                selector: BTreeMap::new(),
                defaults: Default::default(),
            },
            PoolDef {
                name: "infer".into(),
                selector: [("tier".to_string(), "infer".to_string())].into(),
                defaults: Default::default(),
            },
        ],
        default_pool: "default".into(),
        sharing: Default::default(),
        reservations: Vec::new(),
        enforce_limits: Default::default(),
    };
    let view = cluster_view(
        "n1 8xh100\nn2 4xl4 tier=infer",
        "j1 gpus=1 pool=infer\nj2 gpus=1 pool=nope",
    );
    let plan = schedule(&view, &policy, Timestamp(0));
    expect![[r#"
        start j1 n2[0]
        pending j2: unknown pool "nope"
    "#]]
    .assert_eq(&plan.to_string());
}

// ---- properties ------------------------------------------------------------

fn arb_view() -> impl Strategy<Value = ClusterView> {
    let node = (
        1u32..=8,
        0usize..3,
        proptest::collection::vec(any::<bool>(), 8),
        0u8..10,
    );
    let job = (1u32..=9, 1u32..=3, -2i32..=2, 0usize..4);
    (
        proptest::collection::vec(node, 0..8),
        proptest::collection::vec(job, 0..30),
    )
        .prop_map(|(nodes, jobs)| {
            let models = ["h100", "a100", "l4"];
            let nodes_text: Vec<String> = nodes
                .iter()
                .enumerate()
                .map(|(i, (n_gpus, model_idx, busy, avail))| {
                    let used: Vec<String> = (0..*n_gpus)
                        .filter(|g| busy[*g as usize])
                        .map(|g| g.to_string())
                        .collect();
                    let mut line = format!("n{i} {n_gpus}x{}", models[*model_idx]);
                    if !used.is_empty() {
                        line += &format!(" used={}", used.join(","));
                    }
                    // Half the nodes report CPUs and memory; their busy
                    // GPUs' attempts hold some.
                    if i % 2 == 0 {
                        line += " cpus=16 memgib=64";
                        if !used.is_empty() {
                            line += &format!(" hold={}:4:8", used.join(","));
                        }
                    }
                    line += match avail {
                        0 => " drain",
                        1 => " down",
                        _ => "",
                    };
                    // Some nodes carry a second model, some are in pool x.
                    if *avail >= 7 {
                        line += " 2xl4";
                    }
                    if i % 2 == 1 {
                        line += " tier=x";
                    }
                    // Some nodes have NVLink pairs, which steer GPU choice.
                    if *n_gpus >= 4 && i % 3 == 0 {
                        line += " nvlink=0,3/1-2";
                    }
                    line
                })
                .collect();
            let jobs_text: Vec<String> = jobs
                .iter()
                .enumerate()
                .map(|(i, (gpus, n_nodes, prio, model_idx))| {
                    let mut line = format!("j{} gpus={gpus} nodes={n_nodes} prio={prio}", i + 1);
                    if *prio == 2 {
                        line += " pool=x";
                    }
                    if *model_idx < 3 {
                        line += &format!(" type={}", models[*model_idx]);
                    }
                    if i % 2 == 0 {
                        line += &format!(" cpus={}", gpus * 4);
                    }
                    if i % 3 == 0 {
                        line += " memgib=20";
                    }
                    if i % 7 == 3 {
                        line += " exclusive=yes";
                    }
                    line
                })
                .collect();
            cluster_view(&nodes_text.join("\n"), &jobs_text.join("\n"))
        })
}

proptest! {
    #[test]
    fn plans_are_safe_and_deterministic(view in arb_view()) {
        let policy = Policy {
            pools: vec![
                PoolDef { name: "default".into(), selector: BTreeMap::new(), defaults: Default::default() },
                PoolDef { name: "x".into(), selector: [("tier".to_string(), "x".to_string())].into(), defaults: Default::default() },
            ],
            default_pool: "default".into(),
            sharing: Default::default(),
            reservations: Vec::new(),
            enforce_limits: Default::default(),
        };
        let plan = schedule(&view, &policy, Timestamp(0));
        prop_assert_eq!(&plan, &schedule(&view, &policy, Timestamp(0)));

        let jobs: BTreeMap<JobId, &PendingJob> = view.pending.iter().map(|j| (j.id, &**j)).collect();
        let nodes: BTreeMap<&str, &NodeView> = view.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        let mut held: HashSet<(String, u32)> = HashSet::new();
        let mut exclusive_nodes: HashSet<String> = HashSet::new();
        for start in &plan.starts {
            let job = jobs[&start.job];
            // Whole gang, distinct nodes, exact GPU count, one acceptable model.
            prop_assert_eq!(start.placement.len(), job.shape.nodes as usize);
            let distinct: HashSet<&str> = start.placement.iter().map(|p| p.node.as_str()).collect();
            prop_assert_eq!(distinct.len(), start.placement.len());
            let mut models = HashSet::new();
            for part in &start.placement {
                let node = nodes[part.node.as_str()];
                prop_assert_eq!(node.availability, Availability::Up);
                if job.shape.pool == "x" {
                    prop_assert_eq!(node.labels.get("tier").map(String::as_str), Some("x"));
                }
                if job.shape.exclusive {
                    // A node with nothing running, all of whose GPUs of the model it takes.
                    prop_assert!(node.gpus.iter().all(|gpu| !gpu.busy), "an exclusive job on a busy node");
                    prop_assert!(part.gpu_indices.len() >= job.shape.gpus_per_node as usize);
                    prop_assert!(exclusive_nodes.insert(part.node.clone()));
                } else {
                    prop_assert_eq!(part.gpu_indices.len(), job.shape.gpus_per_node as usize);
                }
                for gpu_idx in &part.gpu_indices {
                    let gpu = &node.gpus[*gpu_idx as usize];
                    prop_assert!(!gpu.busy, "GPU already busy");
                    prop_assert!(held.insert((part.node.clone(), *gpu_idx)), "GPU given twice");
                    models.insert(gpu.model.clone());
                }
            }
            prop_assert_eq!(models.len(), 1);
            prop_assert!(job.shape.gpu_types.is_empty() || job.shape.gpu_types.iter().any(|m| models.contains(m)));
        }
        // Nothing else starts on a node an exclusive job took.
        for start in &plan.starts {
            let exclusive = jobs[&start.job].shape.exclusive;
            for part in start.placement.iter().filter(|_| !exclusive) {
                prop_assert!(!exclusive_nodes.contains(&part.node), "a job joined an exclusive one");
            }
        }
        // No node gives out more CPUs or memory than it has free.
        let mut asked: BTreeMap<&str, HostAsk> = BTreeMap::new();
        for start in &plan.starts {
            for part in &start.placement {
                let ask = jobs[&start.job].shape.host.unwrap_or_default();
                let sum = asked.entry(part.node.as_str()).or_default();
                sum.cpus += ask.cpus;
                sum.memory_bytes += ask.memory_bytes;
            }
        }
        for (node, sum) in asked {
            if let Some(free) = nodes[node].host_free(&[]) {
                prop_assert!(sum.fits_in(free), "{node}: {sum:?} given out, {free:?} free");
            }
        }
        // Every other job is pending with a reason.
        prop_assert_eq!(plan.starts.len() + plan.pending.len(), view.pending.len());
        prop_assert!(plan.waiting().all(|(_, reasons)| !reasons.is_empty()));
    }
}

#[test]
fn gang_reason_counts_nodes_of_one_model() {
    check(
        "n1 8xh100\nn2 8xh100\nn3 8xa100",
        "j1 gpus=8 nodes=3",
        expect![[r#"
            pending j1: wants 8 GPUs on each of 3 nodes; 2 nodes have that many free (24 free in total); no start time can be foreseen: not every running job in its way has a time limit
        "#]],
    );
}

proptest! {
    #[test]
    fn the_order_key_sorts_as_guaranteed_first_then_priority_then_age_then_id(
        a in (any::<bool>(), -1e6f64..1e6, any::<i64>(), 0u64..1 << 40),
        b in (any::<bool>(), prop_oneof![-1e6f64..1e6, Just(0.0), Just(-0.0)], prop_oneof![any::<i64>(), Just(0), Just(-1)], 0u64..1 << 40),
    ) {
        let job = |(_, _, at, id): (bool, f64, i64, u64)| {
            let mut job = (*cluster_view("", "j1").pending[0]).clone();
            job.submitted_at = Timestamp(at);
            job.id = JobId(id);
            job
        };
        let by_fields = b.0.cmp(&a.0).then(b.1.total_cmp(&a.1)).then(a.2.cmp(&b.2)).then(a.3.cmp(&b.3));
        let by_key = order_key(a.0, a.1, &job(a)).cmp(&order_key(b.0, b.1, &job(b)));
        prop_assert_eq!(by_key, by_fields);
    }
}

#[test]
fn requirements_steer_jobs_to_the_nodes_and_gpus_they_allow() {
    // n1 has 40 GB GPUs, n2 80 GB ones and rack r2.
    check(
        "n1 4xa100 gpumem=40960 rack=r1\nn2 4xh100 gpumem=81559 rack=r2\nn3 4xh100 gpumem=81559 rack=r1",
        "j1 mingpumem=70000 label=rack:r1\nj2 only=n1\nj3 not=n1,n3 gpus=4\nj4 mingpumem=90000",
        expect![[r#"
            start j1 n3[0]
            start j2 n1[0]
            start j3 n2[0-3]
            pending j4: wants 1 GPU on one node; none is free; counting only what its requirements allow: GPUs of at least 90000 MiB; no start time can be foreseen: not every running job in its way has a time limit
        "#]],
    );
}

#[test]
fn nvlink_required_waits_for_a_joined_set_and_preferred_takes_one_first() {
    // Pairs 0-1 and 2-3; GPUs 1 and 2 are taken, so the free 0 and 3 are
    // not joined. n2 has a free pair.
    check(
        "n1 4xh100 nvlink=0-1/2-3 used=1,2\nn2 4xh100 nvlink=0-1/2-3 used=0,1,2",
        "j1 gpus=2 nvlink=required",
        expect![[r#"
            pending j1: wants 2 GPUs on one node; 3 free in total but at most 1 on one node; counting only what its requirements allow: NVLink required; no start time can be foreseen: not every running job in its way has a time limit
        "#]],
    );
    check(
        "n1 4xh100 nvlink=0-1/2-3 used=1,2\nn2 8xh100 nvlink=0-3/4-7 used=0-1,4-7",
        "j1 gpus=2 nvlink=preferred\nj2 gpus=2 nvlink=required",
        expect![[r#"
            start j1 n2[2-3]
            pending j2: wants 2 GPUs on one node; 2 free in total but at most 1 on one node; counting only what its requirements allow: NVLink required; no start time can be foreseen: not every running job in its way has a time limit
        "#]],
    );
}

#[test]
fn gangs_go_under_one_switch_then_one_rack() {
    // n1 and n3 share switch s1; n2 is the best fit by free GPUs but alone
    // under s2.
    check(
        "n1 8xh100 switch=s1 rack=r1\nn2 8xh100 used=0-3 switch=s2 rack=r1\nn3 8xh100 switch=s1 rack=r1",
        "j1 gpus=4 nodes=2",
        expect![[r#"
            start j1 n1[0-3] n3[0-3]
        "#]],
    );
    // No switch has two nodes free enough: one rack, then anywhere.
    check(
        "n1 8xh100 switch=s1 rack=r1\nn2 8xh100 switch=s2 rack=r2\nn3 8xh100 switch=s3 rack=r2",
        "j1 gpus=8 nodes=2",
        expect![[r#"
            start j1 n2[0-7] n3[0-7]
        "#]],
    );
}

/// The node shapes of a real fleet: an 8-GPU NVSwitch node, one of four
/// NVLink pairs, a PCIe-only L4 node and an A100 carved into MIG slices.
const FLEET: &str = "nvswitch 8xh100 nvlink=0-7\n\
                     pairs 8xh100 nvlink=0-1/2-3/4-5/6-7 used=0\n\
                     pcie 4xl4\n\
                     mig 2xa100-3g.20gb";

#[test]
fn on_a_mixed_fleet_small_jobs_fill_broken_cliques_and_whole_domains_stay_free() {
    check(
        FLEET,
        "j1 type=h100\nj2 gpus=2 type=h100 nvlink=required\nj3 type=l4 gpus=3\nj4 type=a100-3g.20gb\nj5 gpus=8 type=h100",
        expect![[r#"
            start j1 pairs[1]
            start j2 pairs[2-3]
            start j3 pcie[0-2]
            start j4 mig[0]
            start j5 nvswitch[0-7]
        "#]],
    );
}

#[test]
fn fragmentation_counts_what_could_start_on_the_fleet() {
    let view = cluster_view(FLEET, "");
    let mut startable = crate::fragmentation::Startable::default();
    for node in &view.nodes {
        let free = node.gpus.iter().filter(|gpu| !gpu.busy).count() as u32;
        startable.add_node(free, node.gpus.len() as u32);
    }
    // 8 + 7 + 4 + 2 free: 21 single-GPU jobs, but one 8-GPU job.
    assert_eq!(startable.jobs, [21, 10, 4, 1]);
    assert_eq!(startable.whole_nodes, 3);
}

#[test]
fn mig_slices_go_only_to_jobs_that_name_them_one_per_node() {
    check(
        "mig 3xa100-1g.5gb\nwhole 1xa100-40gb",
        "j1\nj2\nj3 type=a100-1g.5gb\nj4 type=a100-1g.5gb gpus=2",
        expect![[r#"
            start j1 whole[0]
            start j3 mig[0]
            pending j2: wants 1 GPU on one node; none is free; no start time can be foreseen: not every running job in its way has a time limit
            pending j4: no GPU of model a100-1g.5gb on an available node of pool "default" (it has: a100-1g.5gb, a100-40gb)
        "#]],
    );
}

#[test]
fn a_cycle_is_skipped_only_when_nothing_changed_and_time_cannot_matter() {
    use std::time::Duration;
    let idle = LastCycle {
        generation: 7,
        could_act: false,
    };
    let acting = LastCycle {
        generation: 7,
        could_act: true,
    };
    let fresh = Some(Duration::from_secs(1));
    let stale = Some(RESTATE_IDLE_AFTER);
    // No cycle yet, or a change since: always a cycle.
    assert!(cycle_needed(None, 7, false, fresh));
    assert!(cycle_needed(Some(&idle), 8, false, fresh));
    assert!(cycle_needed(Some(&acting), 8, false, fresh));
    // Nothing changed and nothing could start: only stale words run one.
    assert!(!cycle_needed(Some(&idle), 7, false, fresh));
    assert!(!cycle_needed(Some(&idle), 7, true, fresh));
    assert!(cycle_needed(Some(&idle), 7, true, stale));
    assert!(cycle_needed(Some(&idle), 7, false, None));
    // Nothing changed but something could act: the periodic cycle runs
    // (time-based policy), a wake-up with nothing new does not.
    assert!(cycle_needed(Some(&acting), 7, true, fresh));
    assert!(!cycle_needed(Some(&acting), 7, false, fresh));
}

#[test]
fn words_are_restated_at_most_every_half_second_and_at_most_a_fiftieth_of_the_time() {
    use std::time::Duration;
    assert_eq!(words_interval(Duration::ZERO), WORDS_EVERY);
    assert_eq!(words_interval(Duration::from_millis(4)), Duration::from_millis(500));
    assert_eq!(words_interval(Duration::from_millis(40)), Duration::from_secs(2));
    assert_eq!(words_interval(Duration::MAX), Duration::MAX);
}

#[test]
fn jobs_that_take_any_model_leave_the_models_others_need() {
    // The 4 A10s are the tightest fit for j1, but j2 can run only there:
    // j1 takes a V100 instead, and both start.
    check(
        "a1 4xa10\nv1 8xv100 used=0-2",
        "j1 gpus=1\nj2 gpus=4 type=a10",
        expect![[r#"
            start j1 v1[3]
            start j2 a1[0-3]
        "#]],
    );
    // With nobody naming A10s, the best fit wins again.
    check(
        "a1 4xa10\nv1 8xv100 used=0-2",
        "j1 gpus=1\nj2 gpus=4 type=v100",
        expect![[r#"
            start j1 a1[0]
            start j2 v1[3-6]
        "#]],
    );
    // A job that names two models goes to the one fewer jobs need.
    check(
        "a1 4xa10\nh1 4xh100\nv1 8xv100 used=0-6",
        "j1 gpus=1 type=a10,h100\nj2 gpus=2 type=h100\nj3 gpus=1 type=v100",
        expect![[r#"
            start j1 a1[0]
            start j2 h1[0-1]
            start j3 v1[7]
        "#]],
    );
}

/// A gang that no node has room for is told to wait, not to "use at most
/// 0 nodes"; one that some nodes fit is told how many.
#[test]
fn a_gang_with_no_room_anywhere_is_told_to_wait() {
    let resources = |n_nodes_with_enough| Reject::Resources {
        gpus_per_node: 8,
        nodes: 4,
        total_free: 12,
        max_free_on_one_node: 4,
        n_nodes_with_enough,
        kept: 0,
    };
    assert_eq!(resources(0).hint().as_deref(), Some("wait for running jobs to end"));
    assert_eq!(
        resources(2).hint().as_deref(),
        Some("use at most 2 nodes (that many have the GPUs free now), or wait for running jobs to end")
    );
}

#[test]
fn cpus_and_memory_of_a_node_are_shared_out_as_its_gpus_are() {
    // n1 has 8 of its 16 CPUs and 48 of its 64 GiB free (a running attempt
    // on GPUs 0-1 holds the rest); n3 reports neither, so is not held to
    // them. j1 takes n1's last CPUs, so j2 goes to n2.
    check(
        "n1 8xh100 cpus=16 memgib=64 used=0-1 hold=0-1:8:16\nn2 8xh100 cpus=32 memgib=256\nn3 4xl4",
        "j1 gpus=2 cpus=8 type=h100\nj2 gpus=2 cpus=12 type=h100\nj3 gpus=1 memgib=200 type=h100\nj4 gpus=1 memgib=100 type=h100\nj5 gpus=1 cpus=64",
        expect![[r#"
            start j1 n1[2-3]
            start j2 n2[0-1]
            start j3 n2[2]
            start j5 n3[0]
            pending j4: wants 1 GPU on one node; none is free; counting only what its requirements allow: 100.0 GiB of free memory on each node; no start time can be foreseen: not every running job in its way has a time limit
        "#]],
    );
}

#[test]
fn a_job_is_not_judged_by_an_alike_job_that_asked_for_more_cpus() {
    // j1 and j2 differ only in CPUs: j1's failure says nothing of j2.
    check(
        "n1 4xh100 cpus=8 memgib=64 used=0-1 hold=0-1:6:0",
        "j1 gpus=2 cpus=6\nj2 gpus=2 cpus=2",
        expect![[r#"
            start j2 n1[2-3]
            pending j1: wants 2 GPUs on one node; none is free; counting only what its requirements allow: 6 free CPUs on each node; no start time can be foreseen: not every running job in its way has a time limit
        "#]],
    );
}

#[test]
fn an_exclusive_job_takes_a_whole_idle_node_and_nothing_joins_it() {
    // n1 runs something; j1 takes the smallest idle node whole, then j2
    // finds no idle node left; j3 may not join j1 on n2.
    check(
        "n1 8xh100 used=0\nn2 4xh100\nn3 8xh100 used=0-3",
        "j1 gpus=1 exclusive=yes\nj2 gpus=2 exclusive=yes\nj3 gpus=4 only=n2,n3",
        expect![[r#"
            start j1 n2[0-3]
            start j3 n3[4-7]
            pending j2: wants 2 GPUs on one node; none is free; counting only what its requirements allow: nodes with nothing else running (--exclusive); no start time can be foreseen: not every running job in its way has a time limit
        "#]],
    );
}
