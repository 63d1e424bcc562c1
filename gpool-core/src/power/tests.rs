use super::*;
use crate::testing::cluster_view;
use proptest::prelude::*;

fn group(name: &str, prefix: &str, n: usize, model: &str, gpus: u32, price: f64) -> Group {
    let nodes = (1..=n).map(|i| format!("{prefix}{i}")).collect();
    Group {
        gpu_memory_mib: Some(81_920),
        resume_timeout_secs: 60,
        suspend_timeout_secs: 60,
        pause_secs: 600,
        ..Group::new(name, nodes, GpuModel::new(model), gpus, price)
    }
}

fn jobs(text: &str) -> Vec<PendingJob> {
    cluster_view("", text)
        .pending
        .iter()
        .map(|job| (**job).clone())
        .collect()
}

fn at(secs: i64) -> Timestamp {
    Timestamp(1_000_000_000 + secs * 1000)
}

fn tick(book: &mut Book, secs: i64, waiting: &[PendingJob], busy: &[&str], linked: &[&str]) -> Vec<Action> {
    tick_closed(book, secs, waiting, busy, linked, &[])
}

fn tick_closed(
    book: &mut Book,
    secs: i64,
    waiting: &[PendingJob],
    busy: &[&str],
    linked: &[&str],
    closed: &[&str],
) -> Vec<Action> {
    let closed: BTreeSet<String> = closed.iter().map(|s| s.to_string()).collect();
    let busy: BTreeSet<String> = busy.iter().map(|s| s.to_string()).collect();
    let linked: BTreeSet<String> = linked.iter().map(|s| s.to_string()).collect();
    let policy = Policy::default();
    book.tick(&Tick {
        now: at(secs),
        waiting,
        policy: &policy,
        busy: &busy,
        linked: &linked,
        closed: &closed,
    })
}

fn resumed(actions: &[Action]) -> Vec<String> {
    actions
        .iter()
        .flat_map(|action| match action {
            Action::Resume { nodes, .. } => nodes.clone(),
            _ => Vec::new(),
        })
        .collect()
}

#[test]
fn a_budget_of_two_nodes_wakes_two_for_five_jobs_that_each_want_a_node() {
    let mut cloud = group("cloud", "c", 16, "h100", 8, 4.0);
    cloud.max_nodes = Some(2);
    let mut book = Book::new(vec![cloud], at(0));
    let waiting = jobs("j1 gpus=8\nj2 gpus=8\nj3 gpus=8\nj4 gpus=8\nj5 gpus=8");
    let actions = tick(&mut book, 0, &waiting, &[], &[]);
    assert_eq!(resumed(&actions), vec!["c1", "c2"]);
    // Later ticks wake no more while those two are on their way or up.
    assert!(resumed(&tick(&mut book, 5, &waiting, &[], &[])).is_empty());
    book.registered("c1", at(10));
    assert!(resumed(&tick(&mut book, 11, &waiting[1..], &["c1"], &["c1"])).is_empty());
    assert_eq!(
        book.waiting_for(JobId(2), at(11)).as_deref(),
        Some("waiting for c2 to power up (since 11 s)")
    );
}

#[test]
fn gpu_hours_of_the_period_and_a_teams_nodes_are_budgets_too() {
    // One node of 8 GPUs up for an hour spends a budget of 8 GPU-hours:
    // no more resumes until the next period (a day, under this policy).
    let mut cloud = group("cloud", "c", 4, "h100", 8, 4.0);
    cloud.max_gpu_hours = Some(8.0);
    cloud.resume_timeout_secs = 7200;
    let mut book = Book::new(vec![cloud], Timestamp(0));
    let mut policy = Policy::default();
    policy.sharing.period = crate::policy::Period::Day;
    let waiting = jobs("j1 gpus=8\nj2 gpus=8");
    let none = BTreeSet::new();
    let tick_at = |book: &mut Book, secs: i64, waiting: &[PendingJob]| {
        book.tick(&Tick {
            now: Timestamp(secs * 1000),
            waiting,
            policy: &policy,
            busy: &none,
            linked: &none,
            closed: &none,
        })
    };
    assert_eq!(resumed(&tick_at(&mut book, 0, &waiting[..1])), vec!["c1"]);
    assert!(resumed(&tick_at(&mut book, 3600, &waiting[1..])).is_empty());
    assert_eq!(book.states[0].gpu_ms, 8.0 * 3_600_000.0);
    // A new day: the budget starts over.
    assert_eq!(resumed(&tick_at(&mut book, 86_400, &waiting[1..])), vec!["c2"]);

    // Two nodes at most for one team; another team still gets one.
    let mut cloud = group("cloud", "c", 4, "h100", 8, 4.0);
    cloud.max_nodes_per_team = Some(2);
    let mut book = Book::new(vec![cloud], at(0));
    let waiting = jobs("j1 gpus=8 team=a\nj2 gpus=8 team=a\nj3 gpus=8 team=a\nj4 gpus=8 team=b");
    assert_eq!(resumed(&tick(&mut book, 0, &waiting, &[], &[])), vec!["c1", "c2", "c3"]);
    assert_eq!(book.nodes["c3"].woken_for.as_deref(), Some("b"));
}

#[test]
fn small_jobs_share_one_waking_node_and_the_cheapest_group_is_woken() {
    let dear = group("dear", "d", 4, "h100", 8, 9.0);
    let cheap = group("cheap", "c", 4, "h100", 8, 2.0);
    let mut book = Book::new(vec![dear, cheap], at(0));
    let waiting = jobs("j1 gpus=4\nj2 gpus=2\nj3 gpus=2\nj4 gpus=1");
    let actions = tick(&mut book, 0, &waiting, &[], &[]);
    assert_eq!(resumed(&actions), vec!["c1", "c2"]);
    assert_eq!(book.waits[&JobId(3)].0, vec!["c1"]);
    assert_eq!(book.waits[&JobId(4)].0, vec!["c2"]);
}

#[test]
fn a_gang_gets_its_nodes_from_one_group_or_waits() {
    let mut cloud = group("cloud", "c", 3, "h100", 8, 4.0);
    cloud.max_nodes = Some(3);
    let mut book = Book::new(vec![cloud], at(0));
    let actions = tick(&mut book, 0, &jobs("j1 gpus=8 nodes=4\nj2 gpus=8 nodes=3"), &[], &[]);
    assert_eq!(resumed(&actions), vec!["c1", "c2", "c3"]);
    assert_eq!(book.waits.keys().copied().collect::<Vec<_>>(), vec![JobId(2)]);
}

#[test]
fn a_gang_counts_on_idle_up_nodes_and_wakes_only_what_it_lacks() {
    let mut cloud = group("cloud", "c", 4, "h100", 8, 4.0);
    cloud.max_nodes = Some(3);
    let mut book = Book::new(vec![cloud], at(0));
    book.registered("c1", at(0));
    book.registered("c2", at(0));
    let actions = tick(&mut book, 1, &jobs("j1 gpus=8 nodes=3"), &[], &["c1", "c2"]);
    assert_eq!(resumed(&actions), vec!["c3"]);
    assert_eq!(book.waits[&JobId(1)].0, vec!["c3"]);
}

#[test]
fn a_drained_node_is_never_woken_nor_counted_on_and_sleeps_when_idle() {
    let mut book = Book::new(vec![group("cloud", "c", 2, "h100", 8, 4.0)], at(0));
    book.registered("c1", at(0));
    let waiting = jobs("j1 gpus=8");
    // c1 is up, idle and drained: the job wakes c2, and c1 sleeps at its time.
    let actions = tick_closed(&mut book, 1, &waiting, &[], &["c1"], &["c1"]);
    assert_eq!(resumed(&actions), vec!["c2"]);
    let actions = tick_closed(&mut book, 700, &waiting, &[], &["c1"], &["c1"]);
    assert!(actions.contains(&Action::Suspend {
        group: "cloud".into(),
        nodes: vec!["c1".into()]
    }));
    // Asleep and drained: not woken again.
    book.gone("c1", at(701));
    book.suspend_done("c1", at(701));
    let more = jobs("j1 gpus=8\nj2 gpus=8");
    assert!(resumed(&tick_closed(&mut book, 702, &more, &[], &[], &["c1"])).is_empty());
}

#[test]
fn a_gang_keeps_to_one_model() {
    // An idle L4 node is up; an 8-GPU-per-node gang of any model cannot
    // use it beside H100s, so both H100 nodes wake.
    let mut l4 = group("l4", "l", 1, "l4", 8, 0.5);
    l4.max_nodes = Some(1);
    let h100 = group("h100", "h", 2, "h100", 8, 4.0);
    let mut book = Book::new(vec![l4, h100], at(0));
    book.registered("l1", at(0));
    let actions = tick(&mut book, 1, &jobs("j1 gpus=8 nodes=2"), &[], &["l1"]);
    assert_eq!(resumed(&actions), vec!["h1", "h2"]);
}

#[test]
fn a_registration_of_a_node_that_is_up_changes_nothing() {
    let mut book = Book::new(vec![group("cloud", "c", 1, "h100", 8, 4.0)], at(0));
    book.registered("c1", at(0));
    tick(&mut book, 1, &[], &[], &["c1"]);
    book.registered("c1", at(500));
    assert_eq!(
        book.nodes["c1"].idle_since,
        Some(at(0)),
        "a reload or reconnect keeps the idle time"
    );
}

#[test]
fn models_and_pools_decide_which_group_serves() {
    let l4 = group("l4", "l", 2, "l4", 4, 0.8);
    let h100 = group("h100", "h", 2, "h100", 8, 4.0);
    let mut book = Book::new(vec![l4, h100], at(0));
    let actions = tick(
        &mut book,
        0,
        &jobs("j1 gpus=2 type=h100\nj2 gpus=8\nj3 gpus=1 type=a100"),
        &[],
        &[],
    );
    assert_eq!(resumed(&actions), vec!["h1", "h2"]);
    assert!(!book.waits.contains_key(&JobId(3)));
}

#[test]
fn a_missed_resume_goes_back_down_with_its_reason_is_retried_after_a_backoff_and_pauses_the_group() {
    let mut cloud = group("cloud", "c", 1, "h100", 8, 4.0);
    cloud.resume_timeout_secs = 10;
    cloud.pause_after_failures = 3;
    cloud.pause_secs = 300;
    let mut book = Book::new(vec![cloud], at(0));
    let waiting = jobs("j1 gpus=8");
    assert_eq!(resumed(&tick(&mut book, 0, &waiting, &[], &[])), vec!["c1"]);
    let actions = tick(&mut book, 10, &waiting, &[], &[]);
    assert!(matches!(&actions[0], Action::ResumeFailed { nodes, .. } if nodes == &["c1"]));
    let node = &book.nodes["c1"];
    assert_eq!(node.state, PowerState::PoweredDown);
    assert_eq!(
        node.reason.as_deref(),
        Some("resume_failed: no agent registered within 10 s")
    );
    // Backoff: 10 s after the first failure, 20 s after the second.
    assert!(resumed(&actions).is_empty());
    assert!(resumed(&tick(&mut book, 19, &waiting, &[], &[])).is_empty());
    assert_eq!(resumed(&tick(&mut book, 20, &waiting, &[], &[])), vec!["c1"]);
    tick(&mut book, 30, &waiting, &[], &[]);
    assert!(resumed(&tick(&mut book, 49, &waiting, &[], &[])).is_empty());
    assert_eq!(resumed(&tick(&mut book, 50, &waiting, &[], &[])), vec!["c1"]);
    tick(&mut book, 60, &waiting, &[], &[]);
    assert_eq!(book.states[0].failures_in_row, 3);
    assert!(book.paused(0, at(61)).is_some());
    assert!(resumed(&tick(&mut book, 200, &waiting, &[], &[])).is_empty());
    // After the pause the node is tried again; one that registers late is welcome.
    assert_eq!(resumed(&tick(&mut book, 360, &waiting, &[], &[])), vec!["c1"]);
    book.registered("c1", at(500));
    assert_eq!(book.nodes["c1"].state, PowerState::Up);
    assert_eq!(book.states[0].failures_in_row, 0);
}

#[test]
fn an_idle_node_sleeps_after_suspend_after_unless_a_waiting_job_could_take_it() {
    let mut book = Book::new(vec![group("cloud", "c", 2, "h100", 8, 4.0)], at(0));
    book.registered("c1", at(0));
    assert!(tick(&mut book, 100, &[], &["c1"], &["c1"]).is_empty());
    // Idle from 200 s: not yet at 700 s, and not while an H100 job waits.
    assert!(tick(&mut book, 200, &[], &[], &["c1"]).is_empty());
    assert!(tick(&mut book, 799, &[], &[], &["c1"]).is_empty());
    assert!(tick(&mut book, 800, &jobs("j1 gpus=2 type=h100 nodes=2"), &[], &["c1"])
        .iter()
        .all(|action| !matches!(action, Action::Suspend { .. })));
    let actions = tick(&mut book, 801, &jobs("j1 gpus=1 type=l4"), &[], &["c1"]);
    assert_eq!(
        actions,
        vec![Action::Suspend {
            group: "cloud".into(),
            nodes: vec!["c1".into()]
        }]
    );
    assert!(!book.takes_work("c1"));
    // Down once both its agent's link and its suspend program have ended.
    book.gone("c1", at(802));
    assert_eq!(book.nodes["c1"].state, PowerState::PoweringDown);
    book.suspend_done("c1", at(803));
    assert_eq!(book.nodes["c1"].state, PowerState::PoweredDown);
    assert_eq!(book.nodes["c1"].reason, None);
}

#[test]
fn a_suspend_that_leaves_the_agent_running_leaves_the_node_up() {
    let mut book = Book::new(vec![group("cloud", "c", 1, "h100", 8, 4.0)], at(0));
    book.registered("c1", at(0));
    tick(&mut book, 1, &[], &[], &["c1"]);
    assert!(!tick(&mut book, 700, &[], &[], &["c1"]).is_empty());
    tick(&mut book, 760, &[], &[], &["c1"]);
    assert_eq!(book.nodes["c1"].state, PowerState::Up);
    assert_eq!(
        book.nodes["c1"].reason.as_deref(),
        Some("its suspend left its agent running")
    );
}

#[test]
fn resumes_keep_to_the_rate() {
    let mut cloud = group("cloud", "c", 10, "h100", 8, 4.0);
    cloud.resume_rate = 3;
    cloud.resume_timeout_secs = 600;
    let mut book = Book::new(vec![cloud], at(0));
    let waiting = jobs("j1 gpus=8\nj2 gpus=8\nj3 gpus=8\nj4 gpus=8\nj5 gpus=8");
    assert_eq!(resumed(&tick(&mut book, 0, &waiting, &[], &[])).len(), 3);
    assert!(resumed(&tick(&mut book, 59, &waiting, &[], &[])).is_empty());
    assert_eq!(resumed(&tick(&mut book, 61, &waiting, &[], &[])).len(), 2);
}

#[test]
fn only_room_wanting_jobs_count_as_demand() {
    let room = crate::sched::Reject::Resources {
        gpus_per_node: 8,
        nodes: 1,
        total_free: 0,
        max_free_on_one_node: 0,
        n_nodes_with_enough: 0,
        kept: 0,
    };
    let cap = crate::sched::Reject::TeamCap {
        team: "a".into(),
        max_gpus: 8,
        in_use: 8,
    };
    assert!(wants_room([room.code()]));
    assert!(!wants_room([room.code(), cap.code()]));
    assert!(!wants_room(["no_estimate"]));
}

proptest! {
    /// Over any run of ticks, registrations and departures: no group ever
    /// has more nodes awake than its budget or more resumes in a minute
    /// than its rate (or one gang), only powered-down nodes are resumed, only up ones
    /// suspended, and a node waited for is powering up.
    #[test]
    fn budgets_and_rates_hold(
        steps in prop::collection::vec((0u8..4, 0usize..6, 1u32..9, 1u32..3, 1i64..40), 1..80),
        max_nodes in 1u32..5,
        rate in 0u32..4,
    ) {
        let mut cloud = group("cloud", "c", 6, "h100", 8, 4.0);
        cloud.max_nodes = Some(max_nodes);
        cloud.resume_rate = rate;
        cloud.resume_timeout_secs = 30;
        cloud.suspend_after_secs = Some(20);
        let mut book = Book::new(vec![cloud], at(0));
        let mut now = 0;
        let mut resumes: Vec<i64> = Vec::new();
        for (what, node, gpus, nodes, dt) in steps {
            now += dt;
            let name = format!("c{}", node + 1);
            match what {
                0 => book.registered(&name, at(now)),
                1 => book.gone(&name, at(now)),
                _ => {
                    let waiting = jobs(&format!("j1 gpus={gpus} nodes={nodes}\nj2 gpus={gpus}"));
                    let before = book.nodes.clone();
                    let linked: Vec<&str> = before.iter().filter(|(_, p)| p.state == PowerState::Up).map(|(n, _)| n.as_str()).collect();
                    for action in tick(&mut book, now, &waiting, &[], &linked) {
                        match action {
                            Action::Resume { nodes, .. } => for n in nodes {
                                prop_assert_eq!(before[&n].state, PowerState::PoweredDown);
                                resumes.push(now);
                            },
                            Action::Suspend { nodes, .. } => for n in nodes {
                                prop_assert_eq!(before[&n].state, PowerState::Up);
                            },
                            Action::ResumeFailed { .. } => {}
                        }
                    }
                    for (nodes, _) in book.waits.values() {
                        for n in nodes {
                            prop_assert_eq!(book.nodes[n].state, PowerState::PoweringUp);
                        }
                    }
                }
            }
            let waking = book.nodes.values().filter(|p| p.state == PowerState::PoweringUp).count();
            prop_assert!(waking <= max_nodes as usize);
            if rate > 0 {
                // A gang of more nodes than the rate (2 at most here) may
                // have a minute to itself.
                let in_minute = resumes.iter().filter(|t| **t > now - 60).count();
                prop_assert!(in_minute <= (rate as usize).max(2));
            }
        }
    }
}
