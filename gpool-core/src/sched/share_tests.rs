//! Fractions of a GPU through the whole cycle: they pack onto shared GPUs
//! before opening free ones, never overcommit a GPU, keep whole-GPU jobs
//! off shared GPUs, and are never preemption's victims.

use super::*;
use crate::share::{Share, ShareAsk};
use crate::testing::{cluster_view, cluster_view_with, pending_job};
use proptest::prelude::*;
use std::collections::BTreeMap;

const NOW: Timestamp = Timestamp(10_000_000);

/// `line` (the job fixture) asking for `gib` of one GPU's memory and
/// `pct`% of its compute.
fn fraction(line: &str, gib: u64, pct: u8) -> Arc<PendingJob> {
    let mut job = pending_job(line);
    let mut shape = (*job.shape).clone();
    shape.share = Some(ShareAsk {
        memory_mib: gib * 1024,
        compute_pct: pct,
        ..ShareAsk::default()
    });
    job.shape = Arc::new(shape);
    Arc::new(job)
}

/// A running fraction `id` of `user`'s, `gib` on `node`'s GPU `gpu`,
/// marked in the view's nodes as the daemon does.
fn run_fraction(view: &mut ClusterView, (id, user): (u64, &str), (node, gpu): (&str, u32), gib: u64) {
    let ask = ShareAsk {
        memory_mib: gib * 1024,
        ..ShareAsk::default()
    };
    let node_view = view.nodes.iter_mut().find(|n| n.name == node).expect("the node");
    let share = node_view.take_share(gpu, (&ask, user), &Policy::default().sharing.shares);
    let mut running = crate::testing::running_job(&format!("r{id} on={node}:{gpu} user={user} burst"));
    running.share = share;
    view.running.push(running);
}

fn starts(plan: &Plan) -> Vec<(u64, String, Option<u64>)> {
    plan.starts
        .iter()
        .map(|s| {
            (
                s.job.0,
                s.placement[0].to_string(),
                s.share.map(|share| share.memory_mib),
            )
        })
        .collect()
}

#[test]
fn a_fraction_joins_the_fullest_shared_gpu_that_takes_it_before_opening_a_free_one() {
    let mut view = cluster_view("n1 4xh100", "");
    run_fraction(&mut view, (1, "user"), ("n1", 0), 10);
    run_fraction(&mut view, (2, "user"), ("n1", 1), 50);
    view.pending = vec![fraction("j3", 20, 0), fraction("j4", 40, 0)];
    let plan = schedule(&view, &Policy::default(), NOW);
    // j3 fits best beside the 50G; j4 (40G) only beside the 10G.
    assert_eq!(
        starts(&plan),
        [
            (3, "n1[1]".into(), Some(20 * 1024)),
            (4, "n1[0]".into(), Some(40 * 1024))
        ]
    );
    assert_eq!(invariants::check(&view, &Policy::default(), NOW, &plan), Ok(()));
}

#[test]
fn a_whole_gpu_job_never_lands_on_a_shared_gpu_and_a_fraction_waits_with_the_free_gpus_reasons() {
    let mut view = cluster_view("n1 2xh100", "");
    run_fraction(&mut view, (1, "user"), ("n1", 0), 70);
    view.pending = vec![
        Arc::new(pending_job("j2 gpus=2")),
        Arc::new(pending_job("j3")),
        fraction("j4", 20, 0),
    ];
    let plan = schedule(&view, &Policy::default(), NOW);
    assert_eq!(starts(&plan), [(3, "n1[1]".into(), None)]);
    let waits: Vec<u64> = plan.pending.iter().map(|(id, _)| id.0).collect();
    assert_eq!(waits, [2, 4]);
    let words: Vec<String> = plan.lists[plan.pending[1].1 as usize]
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        words.iter().any(|w| w == "a fraction of 20480 MiB: none of the 1 GPU fractions share has that much left (the most is 10240 MiB), and it waits for a whole free GPU"),
        "{words:?}"
    );
}

#[test]
fn users_do_not_share_a_gpu_unless_the_rules_let_them() {
    let mut view = cluster_view("n1 2xh100", "");
    run_fraction(&mut view, (1, "ann"), ("n1", 0), 10);
    view.pending = vec![fraction("j2 user=bob", 10, 0)];
    let plan = schedule(&view, &Policy::default(), NOW);
    assert_eq!(starts(&plan), [(2, "n1[1]".into(), Some(10 * 1024))]);
    let mut mixed = Policy::default();
    mixed.sharing.shares.mixed_users = true;
    let plan = schedule(&view, &mixed, NOW);
    assert_eq!(starts(&plan), [(2, "n1[0]".into(), Some(10 * 1024))]);
}

#[test]
fn a_fraction_is_never_a_victim_and_is_charged_its_part() {
    let team = |name: &str, guaranteed_gpus| crate::policy::Team {
        guaranteed_gpus,
        ..crate::policy::Team::unlisted(name)
    };
    let mut policy = Policy::default();
    policy.sharing.teams = vec![team("a", 1), team("b", 0)];
    // Team b's burst fraction holds the only GPU; team a is owed it.
    let mut view = cluster_view_with("n1 1xh100", "", "j2 team=a");
    run_fraction(&mut view, (1, "user"), ("n1", 0), 20);
    view.running[0].team = "b".into();
    let plan = schedule(&view, &policy, NOW);
    assert!(plan.preemptions.is_empty() && plan.starts.is_empty(), "{plan:?}");
    let share = view.running[0].share.expect("resolved on its GPU");
    assert_eq!(share.milli, 250, "20 GiB of 81,920 MiB, rounded up");
    assert_eq!(view.running[0].charged_gpus(), 0.25);
}

/// An arrival (GiB, compute %, user, whole GPU or not) or the end of the
/// n-th running job.
#[derive(Debug, Clone)]
enum Event {
    Arrive(u64, u8, u8, bool),
    End(usize),
}

fn events() -> impl Strategy<Value = Vec<Event>> {
    let arrive = (
        1u64..50,
        prop_oneof![Just(0u8), 10u8..70],
        0u8..3,
        prop::bool::weighted(0.15),
    )
        .prop_map(|(gib, pct, user, whole)| Event::Arrive(gib, pct, user, whole));
    let event = prop_oneof![3 => arrive, 2 => any::<usize>().prop_map(Event::End)];
    proptest::collection::vec(event, 1..60)
}

/// The view of `running` (id, user, placement, fraction asked) on two
/// H100 nodes and an L4 node, the driver keeping 500 MiB of each GPU.
fn view_of(running: &[(u64, String, NodePlacement, Option<ShareAsk>)], pending: &[Arc<PendingJob>]) -> ClusterView {
    let mut view = cluster_view("n1 2xh100\nn2 2xh100\nn3 1xl4 gpumem=23034", "");
    for gpu in view.nodes.iter_mut().flat_map(|node| node.gpus.iter_mut()) {
        gpu.reserved_mib = 500;
    }
    let rules = Policy::default().sharing.shares;
    for (id, user, placement, ask) in running {
        let node = view.nodes.iter_mut().find(|n| n.name == placement.node).unwrap();
        let mut job = crate::testing::running_job(&format!("r{id} user={user}"));
        job.placement = vec![placement.clone()];
        match ask {
            Some(ask) => job.share = node.take_share(placement.gpu_indices[0], (ask, user), &rules),
            None => node.occupy(&placement.gpu_indices, None),
        }
        view.running.push(job);
    }
    view.pending = pending.to_vec();
    view
}

proptest! {
    /// Random arrivals of fractions (and some whole-GPU jobs) of three
    /// users, and random ends, each followed by a cycle: no GPU ever holds
    /// more fractions' memory than it leaves usable or more than 100% of
    /// compute, fractions and whole jobs never share a GPU, users never
    /// mix, every plan keeps the scheduler's invariants, and a fraction
    /// opens a free GPU only where no shared GPU would take it.
    #[test]
    fn fractions_pack_without_overcommitting_over_arrivals_and_ends(events in events()) {
        let policy = Policy::default();
        let mut running: Vec<(u64, String, NodePlacement, Option<ShareAsk>)> = Vec::new();
        let mut pending: Vec<Arc<PendingJob>> = Vec::new();
        for (n, event) in events.into_iter().enumerate() {
            let id = n as u64 + 1;
            match event {
                Event::Arrive(_, _, user, true) => pending.push(Arc::new(pending_job(&format!("j{id} user=u{user}")))),
                Event::Arrive(gib, pct, user, false) => pending.push(fraction(&format!("j{id} user=u{user}"), gib, pct)),
                Event::End(k) if !running.is_empty() => {
                    running.remove(k % running.len());
                }
                Event::End(_) => {}
            }
            let view = view_of(&running, &pending);
            let plan = schedule(&view, &policy, NOW);
            prop_assert_eq!(invariants::check(&view, &policy, NOW, &plan), Ok(()));
            let mut book: BTreeMap<(String, u32), crate::share::SharedGpu> = view
                .nodes
                .iter()
                .flat_map(|node| node.gpus.iter().filter_map(move |gpu| Some(((node.name.clone(), gpu.index), gpu.shared.clone()?))))
                .collect();
            for start in &plan.starts {
                let job = pending.iter().find(|job| job.id == start.job).unwrap().clone();
                let part = start.placement[0].clone();
                let key = (part.node.clone(), part.gpu_indices[0]);
                if let (Some(ask), Some(share)) = (job.shape.share, start.share) {
                    if !book.contains_key(&key) {
                        for (other, gpu) in &book {
                            let fits = ask.on(gpu.usable_mib, &policy.sharing.shares).is_some_and(|s: Share| gpu.takes(&s, &job.user, &policy.sharing.shares));
                            prop_assert!(!fits, "{:?} opened {:?} though {:?} ({:?}) takes it", start.job, key, other, gpu);
                        }
                        let usable = 81_920 - 500;
                        let usable = if part.node == "n3" { 23_034 - 500 } else { usable };
                        book.insert(key.clone(), crate::share::SharedGpu::new(usable));
                    }
                    book.get_mut(&key).unwrap().add(&share, &job.user);
                }
                running.push((job.id.0, job.user.to_string(), part, job.shape.share));
                pending.retain(|waiting| waiting.id != start.job);
            }
            for gpu in book.values() {
                prop_assert!(gpu.used_mib <= gpu.usable_mib && gpu.used_pct <= 100, "{:?}", gpu);
                prop_assert!(gpu.users.len() <= 1, "{:?}", gpu);
            }
        }
    }
}
