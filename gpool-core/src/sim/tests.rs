use super::*;
use crate::ids::Timestamp;
use proptest::prelude::*;

/// A job of team `team` submitted at `at` seconds, running `secs`.
fn job(at: i64, secs: i64, gpus_per_node: u32, nodes: u32, team: &str) -> TraceJob {
    TraceJob {
        submit: Timestamp(at * 1000),
        duration_ms: secs * 1000,
        gpus_per_node,
        nodes,
        team: team.into(),
        project: team.into(),
        user: team.into(),
        gpu_types: Vec::new(),
        time_limit_secs: None,
        checkpoint_every_secs: None,
        qos: String::new(),
        // The grace's own mechanics are what most tests here look at.
        on_signal: Some(OnSignal::WorkOn),
        host: None,
        gpu_milli: None,
    }
}

fn limited(mut job: TraceJob, limit: u64) -> TraceJob {
    job.time_limit_secs = Some(limit);
    job
}

fn run_options() -> Options {
    Options {
        tick_secs: 60,
        bucket_secs: 60,
        pause_secs: 0,
        ..Options::default()
    }
}

fn run(setup: &Setup, jobs: &[TraceJob]) -> Outcome {
    simulate(setup, jobs, &run_options(), &mut Quiet)
}

/// `run` with a cycle at every tick: no quiet stretch or event passed over.
fn run_every_tick(setup: &Setup, jobs: &[TraceJob]) -> Outcome {
    let options = Options {
        every_tick: true,
        ..run_options()
    };
    simulate(setup, jobs, &options, &mut Quiet)
}

/// Each job's wait in seconds, in trace order, from the per-team figures of
/// a one-team trace (or the overall ones).
fn delays(outcome: &Outcome) -> (f64, f64, usize) {
    (outcome.queue_delay.mean, outcome.queue_delay.max, outcome.queue_delay.n)
}

#[test]
fn fifo_runs_jobs_in_submit_order() {
    // 2 GPUs. a1, a2 take both until 100; b (2 GPUs, at 10) goes before
    // a3 (1 GPU, at 20) at 100, and a3 runs at 200.
    let jobs = [
        job(0, 100, 1, 1, "a"),
        job(0, 100, 1, 1, "a"),
        job(10, 100, 2, 1, "b"),
        job(20, 50, 1, 1, "a"),
    ];
    let cluster = Cluster::uniform(1, 2, "l4");
    let guarantees = guarantees_by_demand(&jobs, cluster.gpus());
    let outcome = run(&fifo(&cluster, &guarantees), &jobs);
    // Waits 0, 0, 90, 180.
    assert_eq!(delays(&outcome), (67.5, 180.0, 4));
    assert_eq!(outcome.completed, 4);
    // Busy 2 GPUs for 200 s, 1 for 50 s, out of 2 x 250.
    assert!((outcome.allocation - 0.9).abs() < 1e-9, "{}", outcome.allocation);
    assert_eq!(outcome.overcommits, 0);
}

#[test]
fn gpool_lets_the_team_under_its_guarantee_go_first() {
    // Same trace: a and b are guaranteed 1 GPU each (by demand). At 100, b's
    // 2-GPU job is beyond its guarantee, a3 is within a's: a3 runs
    // 100..150, b 150..250. Waits 0, 0, 140, 80.
    let jobs = [
        job(0, 100, 1, 1, "a"),
        job(0, 100, 1, 1, "a"),
        job(10, 100, 2, 1, "b"),
        job(20, 50, 1, 1, "a"),
    ];
    let cluster = Cluster::uniform(1, 2, "l4");
    let guarantees = guarantees_by_demand(&jobs, cluster.gpus());
    assert_eq!(guarantees, BTreeMap::from([("a".into(), 1), ("b".into(), 1)]));
    let outcome = run(
        &pooled("gpool", &cluster, sharing_policy(&cluster, &guarantees), &guarantees),
        &jobs,
    );
    assert_eq!(delays(&outcome), (55.0, 140.0, 4));
    // b's job ran as burst work: 200 GPU-seconds.
    let b = outcome.teams.iter().find(|t| t.team == "b").unwrap();
    assert!((b.burst_gpu_hours * 3600.0 - 200.0).abs() < 1e-6);
}

#[test]
fn dedicated_partitions_never_lend() {
    // a and b get 1 GPU each; b's 2-GPU job never fits its partition, and
    // a's three jobs run one after another: waits 0, 100, 180.
    let jobs = [
        job(0, 100, 1, 1, "a"),
        job(0, 100, 1, 1, "a"),
        job(10, 100, 2, 1, "b"),
        job(20, 50, 1, 1, "a"),
    ];
    let cluster = Cluster::uniform(1, 2, "l4");
    let guarantees = guarantees_by_demand(&jobs, cluster.gpus());
    let setup = dedicated(&cluster, &guarantees, 1.0);
    assert_eq!(setup.nodes.len(), 2, "one node split in two partitions");
    let outcome = run(&setup, &jobs);
    assert_eq!(outcome.never_started, 1);
    assert_eq!(outcome.queue_delay.n, 3);
    assert!((outcome.queue_delay.mean - 280.0 / 3.0).abs() < 1e-9);
    assert!((outcome.allocation - 0.5).abs() < 1e-9);
}

#[test]
fn backfill_runs_a_short_job_ahead_but_not_a_long_one() {
    // 2 GPUs. A holds one until 100 (limit 100); B wants both and gets the
    // reservation at 100; C (50 s, limit 50) ends before it and starts at
    // once; D (limit 200) would delay B and starts after it, at 200.
    let jobs = [
        limited(job(0, 100, 1, 1, "a"), 100),
        limited(job(1, 100, 2, 1, "a"), 100),
        limited(job(2, 50, 1, 1, "a"), 50),
        limited(job(3, 200, 1, 1, "a"), 200),
    ];
    let cluster = Cluster::uniform(1, 2, "l4");
    let guarantees = guarantees_by_demand(&jobs, cluster.gpus());
    let outcome = run(&fifo(&cluster, &guarantees), &jobs);
    // Waits 0, 99, 0, 197.
    assert_eq!(delays(&outcome), (74.0, 197.0, 4));
    assert_eq!(outcome.timed_out, 0);
}

/// 2 L4 GPUs; a is guaranteed both, b nothing. b's two 1000 s jobs
/// (checkpoint every 100 s; `on_signal`, where given, says what they do
/// when preempted) run as burst work from 0; a's 100 s job comes at 705.
/// Grace 10 s, no minimum runtime, no cap on waste.
fn one_reclaim(on_signal: Option<Option<OnSignal>>) -> Outcome {
    let mut b = job(0, 1000, 1, 1, "b");
    b.checkpoint_every_secs = Some(100);
    if let Some(on_signal) = on_signal {
        b.on_signal = on_signal;
    }
    let jobs = [b.clone(), b, job(705, 100, 1, 1, "a")];
    let cluster = Cluster::uniform(1, 2, "l4");
    let guarantees = BTreeMap::from([("a".to_string(), 2), ("b".to_string(), 0)]);
    let mut policy = sharing_policy(&cluster, &guarantees);
    policy.sharing.qos = vec![crate::policy::Qos {
        grace_secs: 10,
        min_runtime_secs: 0,
        ..crate::policy::Qos::normal()
    }];
    policy.sharing.waste_cap_gpu_hours_per_hour = f64::INFINITY;
    run(&pooled("gpool", &cluster, policy, &guarantees), &jobs)
}

#[test]
fn a_guaranteed_job_reclaims_gpus_by_preemption_and_the_victim_resumes_from_its_checkpoint() {
    // 2 GPUs; a is guaranteed both, b nothing. b's two jobs (1000 s,
    // checkpoint every 100 s) run as burst work from 0. a's job at 705
    // preempts one: signalled at 705, killed at 715 (grace 10 s), it keeps
    // the 700 s it checkpointed and loses 15 GPU-seconds. a runs 715..815;
    // the victim resumes at 815 for its last 300 s and ends at 1115.
    let outcome = one_reclaim(None);
    assert_eq!(outcome.preemptions, 1);
    assert!(
        (outcome.lost_gpu_hours * 3600.0 - 15.0).abs() < 1e-6,
        "{}",
        outcome.lost_gpu_hours
    );
    let a = outcome.teams.iter().find(|t| t.team == "a").unwrap();
    assert_eq!(a.queue_delay.mean, 10.0);
    let b = outcome.teams.iter().find(|t| t.team == "b").unwrap();
    // The victim's completion: 1115 s after its submit.
    assert_eq!(b.completion_time.max, 1115.0);
    // b held 715 + 1000 + 300 GPU-seconds, all burst.
    assert!((b.burst_gpu_hours * 3600.0 - 2015.0).abs() < 1e-6);
    assert_eq!(outcome.overcommits, 0);
}

/// The reclaim above, recorded: the victim's first attempt ends preempted
/// for a's job, its second completes, and the preemption says why.
#[test]
fn attempts_and_preemptions_are_recorded_with_their_claimant_and_reason() {
    let mut b = job(0, 1000, 1, 1, "b");
    b.checkpoint_every_secs = Some(100);
    let jobs = [b.clone(), b, job(705, 100, 1, 1, "a")];
    let cluster = Cluster::uniform(1, 2, "l4");
    let guarantees = BTreeMap::from([("a".to_string(), 2), ("b".to_string(), 0)]);
    let mut policy = sharing_policy(&cluster, &guarantees);
    policy.sharing.qos[0].min_runtime_secs = 0;
    policy.sharing.qos[0].grace_secs = 10;
    policy.sharing.waste_cap_gpu_hours_per_hour = f64::INFINITY;
    let setup = pooled("gpool", &cluster, policy, &guarantees);
    let options = Options {
        record: true,
        ..run_options()
    };
    let outcome = simulate(&setup, &jobs, &options, &mut Quiet);
    let rows: Vec<(u64, u32, EndState, Option<u64>, i64, i64)> = outcome
        .attempts
        .iter()
        .map(|r| {
            let secs = |at: Option<Timestamp>| at.map_or(-1, |at| at.0 / 1000);
            (
                r.job,
                r.attempt,
                r.end_state,
                r.preempted_for,
                secs(r.start),
                secs(r.end),
            )
        })
        .collect();
    let victim = rows
        .iter()
        .find(|r| r.2 == EndState::Preempted)
        .expect("a preempted attempt");
    assert_eq!(
        (victim.1, victim.3, victim.4, victim.5),
        (1, Some(3), 0, 715),
        "{rows:?}"
    );
    assert!(
        rows.contains(&(victim.0, 2, EndState::Completed, None, 815, 1115)),
        "{rows:?}"
    );
    assert!(rows.contains(&(3, 1, EndState::Completed, None, 715, 815)), "{rows:?}");
    assert_eq!(rows.len(), 4, "{rows:?}");
    assert!(outcome.attempts.iter().all(|r| r.gpu_models == ["l4"]));
    let [event] = &outcome.events[..] else {
        panic!("one preemption, no rescind: {:?}", outcome.events)
    };
    assert_eq!(
        (event.kind, event.job, event.for_job, event.at.0),
        (EventKind::Preempted, victim.0, 3, 705_000)
    );
    assert!(event.reason.contains("burst work of team b"), "{}", event.reason);
    // Without `record`, nothing is kept.
    let quiet = run(&setup, &jobs);
    assert!(quiet.attempts.is_empty() && quiet.events.is_empty());
}

/// A start moved onto a GPU another attempt holds, or onto a model its
/// job does not allow, is counted by the checks every build makes.
#[test]
fn a_corrupted_placement_is_counted_as_a_broken_invariant() {
    let jobs = [job(0, 100, 1, 1, "a"), job(10, 100, 1, 1, "a")];
    let cluster = Cluster::uniform(1, 2, "h100");
    let guarantees = BTreeMap::from([("a".to_string(), 2)]);
    let setup = fifo(&cluster, &guarantees);
    assert_eq!(run(&setup, &jobs).invariant_violations, 0);
    let corrupted = |nth: u64, setup: &Setup, jobs: &[TraceJob]| {
        let options = Options {
            corrupt_start: Some(nth),
            ..run_options()
        };
        simulate(setup, jobs, &options, &mut Quiet)
    };
    let twice = corrupted(2, &setup, &jobs);
    assert!(twice.invariant_violations >= 1);
    let first = twice.first_violation.unwrap_or_default();
    assert!(first.contains("is held by j1 and j2"), "{first}");

    // An A100-only job put on an H100.
    let fleet = Cluster::parse(
        "fleet.toml",
        "[[nodes]]\ncount = 1\ngpus = 2\nmodel = \"a100\"\nprefix = \"a\"\n\n[[nodes]]\ncount = 1\ngpus = 2\nmodel = \"h100\"\nprefix = \"h\"\n",
    )
    .expect("fleet");
    let mut picky = job(0, 100, 1, 1, "a");
    picky.gpu_types = vec![GpuModel::new("a100")];
    let setup = fifo(&fleet, &guarantees);
    assert_eq!(run(&setup, std::slice::from_ref(&picky)).invariant_violations, 0);
    let wrong = corrupted(1, &setup, &[picky]);
    let first = wrong.first_violation.unwrap_or_default();
    assert!(
        wrong.invariant_violations >= 1 && first.contains("a h100, which it does not allow"),
        "{first}"
    );
}

/// A cluster full from the start, a queue behind it and a week before the
/// first job ends: the replay jumps to the end instead of ticking through
/// the week, and says what the cluster held when it first said no.
#[test]
fn a_full_cluster_waits_for_its_next_end_without_ticking() {
    // H100-only jobs; the L4s stay free, and no job could use them.
    let mut jobs: Vec<TraceJob> = (0..4).map(|i| job(i, 7 * 86_400, 2, 1, "a")).collect();
    jobs.extend((4..8).map(|i| job(i, 100, 2, 1, "b")));
    for job in &mut jobs {
        job.gpu_types = vec![GpuModel::new("h100")];
    }
    let cluster = Cluster::parse(
        "fleet.toml",
        "[[nodes]]\ncount = 2\ngpus = 4\nmodel = \"h100\"\nprefix = \"h\"\n\n[[nodes]]\ncount = 1\ngpus = 4\nmodel = \"l4\"\nprefix = \"l\"\n",
    )
    .expect("fleet");
    let guarantees = BTreeMap::from([("a".to_string(), 4), ("b".to_string(), 4)]);
    for setup in [fifo(&cluster, &guarantees), dedicated(&cluster, &guarantees, 1.0)] {
        let outcome = run(&setup, &jobs);
        let mut ticking = run_every_tick(&setup, &jobs);
        if setup.name == "fifo" {
            assert!(outcome.cycles < 40, "{} cycles", outcome.cycles);
            assert!(ticking.cycles > 1000, "{} cycles", ticking.cycles);
        }
        ticking.cycles = outcome.cycles;
        assert_eq!(ticking, outcome, "{}", setup.name);
        assert_eq!(outcome.invariant_violations, 0);
    }
    let outcome = run(&fifo(&cluster, &guarantees), &jobs);
    assert_eq!((outcome.held_at_first_rejection, outcome.peak_held), (Some(8), 8));
    assert!(outcome.series.allocation.len() <= MAX_SERIES_POINTS);
    assert!(outcome.series.bucket_secs > 60, "{}", outcome.series.bucket_secs);
}

/// Jobs that arrive while every GPU is taken run no cycle each: the
/// replay passes over those arrivals as over quiet ticks, and its every
/// figure but the count of cycles is that of a replay that cycles at each.
#[test]
fn arrivals_into_a_full_cluster_run_no_cycle() {
    let mut jobs = vec![job(0, 86_400, 2, 1, "a"), job(0, 86_400, 2, 1, "b")];
    jobs.extend((1..200).map(|i| job(i * 60, 600, 1, 1, ["a", "b"][i as usize % 2])));
    let cluster = Cluster::uniform(1, 4, "h100");
    let guarantees = BTreeMap::from([("a".to_string(), 2), ("b".to_string(), 2)]);
    for setup in [fifo(&cluster, &guarantees), dedicated(&cluster, &guarantees, 1.0)] {
        let outcome = run(&setup, &jobs);
        // A cycle at the first arrivals and one as each four small jobs
        // end together (51); one at each of the 199 arrivals besides
        // would be 250.
        assert!(outcome.cycles <= 60, "{}: {} cycles", setup.name, outcome.cycles);
        let mut ticking = run_every_tick(&setup, &jobs);
        assert!(ticking.cycles > 1_400, "{}: {} cycles", setup.name, ticking.cycles);
        ticking.cycles = outcome.cycles;
        assert_eq!(ticking, outcome, "{}", setup.name);
    }
}

/// Under LAS order a fresh 4-GPU job takes its team's served 2-GPU job
/// back at that one's next checkpoint, with the 2 free GPUs: the replay
/// sleeps from the arrival to that checkpoint, and wakes there.
#[test]
fn a_fresh_job_takes_back_its_teams_served_job_with_the_free_gpus_at_its_checkpoint() {
    // A crosses 1 GPU-hour (queue 1) at 1,800 s, and checkpoints every
    // 1,800 s; J arrives at 2,000 s, past that checkpoint's 120 s, and
    // may take A back from its checkpoint at 3,600 s. a's guarantee
    // covers both at once (a take-back is guaranteed work).
    let mut served = job(0, 100_000, 2, 1, "a");
    served.checkpoint_every_secs = Some(1800);
    let jobs = [served, job(2000, 100, 4, 1, "a")];
    let cluster = Cluster::uniform(1, 4, "l4");
    let guarantees = BTreeMap::from([("a".to_string(), 8)]);
    let mut policy = sharing_policy(&cluster, &guarantees);
    policy.sharing.qos[0].min_runtime_secs = 0;
    policy.sharing.las = Some(crate::sched::Las {
        max_lost_secs: 120,
        ..crate::sched::Las::default()
    });
    let setup = pooled("gpool", &cluster, policy, &guarantees);
    let outcome = run(&setup, &jobs);
    let (_, longest, n) = delays(&outcome);
    assert_eq!(n, 2);
    assert!((1600.0..1800.0).contains(&longest), "J waited {longest} s");
    assert!(outcome.cycles < 20, "{} cycles", outcome.cycles);
    let mut ticking = run_every_tick(&setup, &jobs);
    ticking.cycles = outcome.cycles;
    assert_eq!(ticking, outcome);
}

/// Under LAS order a job taken back, once promoted by its wait, takes
/// back in turn the job that took it, where that one is within its
/// chance: the replay wakes at the promotion, as one that ticks sees it.
#[test]
fn a_promoted_job_takes_back_the_one_that_took_it_at_its_promotion() {
    // J runs from 0, crosses 1 GPU-hour at 900 s; F (fresh) takes it
    // back near its checkpoint at 1,200 s. F crosses 1 GPU-hour in turn
    // some 900 s after its start, and is within its chance from then on
    // (checkpoints every 600 s, 600 s allowed). J, promoted once it has
    // waited 1.5 times as long as it ran (1,800 s), takes F back then:
    // no chance opens, and no threshold is crossed, at that moment.
    let mut taken = job(0, 10_000, 4, 1, "a");
    taken.checkpoint_every_secs = Some(600);
    let mut fresh = job(1000, 5000, 4, 1, "a");
    fresh.checkpoint_every_secs = Some(600);
    let jobs = [taken, fresh];
    let cluster = Cluster::uniform(1, 4, "l4");
    let guarantees = BTreeMap::from([("a".to_string(), 8)]);
    let mut policy = sharing_policy(&cluster, &guarantees);
    policy.sharing.qos[0].min_runtime_secs = 0;
    // No cap on the work thrown away: the take-back is at the promotion.
    policy.sharing.waste_cap_gpu_hours_per_hour = f64::INFINITY;
    policy.sharing.las = Some(crate::sched::Las {
        thresholds_gpu_secs: vec![3600, 360_000],
        promote_factor: 1.5,
        max_lost_secs: 600,
    });
    let setup = pooled("gpool", &cluster, policy, &guarantees);
    let outcome = run(&setup, &jobs);
    let mut ticking = run_every_tick(&setup, &jobs);
    assert!(
        outcome.cycles * 4 < ticking.cycles,
        "{} cycles against {}",
        outcome.cycles,
        ticking.cycles
    );
    ticking.cycles = outcome.cycles;
    assert_eq!(ticking, outcome);
    assert!(outcome.preemptions >= 2, "{} preemptions", outcome.preemptions);
}

/// Jobs that can never start are counted by their shape.
#[test]
fn jobs_that_never_fit_are_counted_by_shape() {
    let mut big = job(0, 100, 4, 1, "a");
    big.gpu_types = vec![GpuModel::new("h100")];
    let jobs = [big.clone(), big, job(1, 100, 1, 3, "a"), job(2, 100, 1, 1, "a")];
    let cluster = Cluster::uniform(2, 2, "h100");
    let outcome = run(&fifo(&cluster, &BTreeMap::new()), &jobs);
    let shapes: Vec<(&str, usize)> = outcome
        .never_started_by_shape
        .iter()
        .map(|s| (s.shape.as_str(), s.jobs))
        .collect();
    assert_eq!(
        shapes,
        [
            ("4 GPU(s) x 1 node(s) of h100", 2),
            ("1 GPU(s) x 3 node(s) of any model", 1)
        ]
    );
    assert_eq!(outcome.never_started, 3);
}

#[test]
fn a_victim_that_does_not_handle_its_signal_frees_its_gpus_at_once() {
    // The scenario above, but b's jobs do what a process with no handler
    // for SIGUSR1 does (the trace's default): the victim ends at 705 and
    // loses the 5 GPU-seconds since its checkpoint at 700; a starts at 705
    // without waiting the grace; the victim resumes at 805 for its last
    // 300 s and ends at 1105. Each job says what it does when preempted.
    for (on_signal, a_wait, lost, b_done) in [
        (None, 0.0, 5.0, 1105.0),
        (Some(OnSignal::Exit), 0.0, 5.0, 1105.0),
        (Some(OnSignal::Checkpoint), 0.0, 0.0, 1100.0),
        (Some(OnSignal::WorkOn), 10.0, 15.0, 1115.0),
    ] {
        let outcome = one_reclaim(Some(on_signal));
        assert_eq!(outcome.preemptions, 1, "{on_signal:?}");
        assert!(
            (outcome.lost_gpu_hours * 3600.0 - lost).abs() < 1e-6,
            "{on_signal:?}: {}",
            outcome.lost_gpu_hours * 3600.0
        );
        let a = outcome.teams.iter().find(|t| t.team == "a").unwrap();
        assert_eq!(a.queue_delay.mean, a_wait, "{on_signal:?}");
        let b = outcome.teams.iter().find(|t| t.team == "b").unwrap();
        assert_eq!(b.completion_time.max, b_done, "{on_signal:?}");
    }
}

#[test]
fn a_gang_waits_for_whole_nodes_while_a_small_job_starts() {
    // 2 nodes x 4 GPUs. One GPU is taken until 100; the 2x4 gang (at 1)
    // waits for it; a 1-GPU job (at 2, 10 s) starts at once.
    let jobs = [job(0, 100, 1, 1, "a"), job(1, 50, 4, 2, "a"), job(2, 10, 1, 1, "a")];
    let cluster = Cluster::uniform(2, 4, "a100");
    let guarantees = guarantees_by_demand(&jobs, cluster.gpus());
    let outcome = run(&fifo(&cluster, &guarantees), &jobs);
    assert_eq!(delays(&outcome), (33.0, 99.0, 3));
}

#[test]
fn a_job_blocked_by_fragmentation_is_counted() {
    // 2 nodes x 2 GPUs. Three 1-GPU jobs: best fit puts two on one node,
    // one on the other; the 10 s one ends and leaves one free GPU on each
    // node. A 2-GPU job at 20 finds 2 free GPUs but not on one node, and
    // waits until 100.
    let jobs = [
        job(0, 100, 1, 1, "a"),
        job(0, 10, 1, 1, "a"),
        job(0, 100, 1, 1, "a"),
        job(20, 10, 2, 1, "a"),
    ];
    let cluster = Cluster::uniform(2, 2, "a100");
    let guarantees = guarantees_by_demand(&jobs, cluster.gpus());
    let outcome = run(&fifo(&cluster, &guarantees), &jobs);
    assert_eq!(outcome.fragmentation_blocked_jobs, 1);
    assert_eq!(outcome.queue_delay.max, 80.0);
}

#[test]
fn time_limits_end_jobs() {
    let jobs = [limited(job(0, 100, 1, 1, "a"), 30)];
    let cluster = Cluster::uniform(1, 1, "l4");
    let outcome = run(&fifo(&cluster, &BTreeMap::new()), &jobs);
    assert_eq!((outcome.completed, outcome.timed_out), (0, 1));
    assert_eq!(outcome.completion_time.max, 30.0);
}

#[test]
fn same_inputs_give_the_same_outcome_byte_for_byte() {
    let jobs: Vec<TraceJob> = (0..300)
        .map(|i| {
            let team = ["a", "b", "c"][i % 3];
            let mut j = job(i as i64 * 7, 50 + (i as i64 * 37) % 400, 1 << (i % 3), 1, team);
            j.checkpoint_every_secs = Some(60);
            j
        })
        .collect();
    let cluster = Cluster::uniform(3, 4, "h100");
    let guarantees = guarantees_by_demand(&jobs, cluster.gpus());
    for setup in [
        dedicated(&cluster, &guarantees, 1.0),
        fifo(&cluster, &guarantees),
        pooled("gpool", &cluster, sharing_policy(&cluster, &guarantees), &guarantees),
    ] {
        let first = serde_json::to_string(&run(&setup, &jobs)).unwrap();
        let second = serde_json::to_string(&run(&setup, &jobs)).unwrap();
        assert_eq!(first, second, "{}", setup.name);
    }
}

#[test]
fn guarantees_follow_demand_and_add_up_to_the_cluster() {
    let jobs = [job(0, 300, 1, 1, "a"), job(0, 100, 1, 1, "b"), job(0, 1, 1, 1, "c")];
    let guarantees = guarantees_by_demand(&jobs, 10);
    assert_eq!(guarantees.values().sum::<u32>(), 10);
    assert_eq!(guarantees["a"], 7);
    // Dedicated: every team gets at least one GPU.
    let setup = dedicated(&Cluster::uniform(2, 5, "l4"), &guarantees, 1.0);
    let sizes: BTreeMap<String, usize> = setup.nodes.iter().fold(BTreeMap::new(), |mut sizes, node| {
        *sizes.entry(node.labels["team"].clone()).or_default() += node.gpus.len();
        sizes
    });
    assert_eq!(sizes.values().sum::<usize>(), 10);
    assert!(sizes.values().all(|n| *n >= 1), "{sizes:?}");
}

#[test]
fn philly_rows_become_jobs_and_large_ones_gangs() {
    let text = "timestamp,duration,num_gpus,gpu_time,cluster\n\
                2017-10-09 07:01:55,66.0,1,66.0,11cb48\n\
                2017-10-09 06:13:03,2951.5,12,35418.0,6214e9\n";
    let jobs = trace::parse(Format::Philly, "philly.csv", text, 8).unwrap();
    // Sorted by submit time.
    assert_eq!(jobs[0].team, "6214e9");
    assert_eq!((jobs[0].gpus_per_node, jobs[0].nodes), (6, 2));
    assert_eq!(jobs[0].duration_ms, 2_951_500);
    assert_eq!(jobs[1].submit.0 - jobs[0].submit.0, (48 * 60 + 52) * 1000);
    assert_eq!(trace::gang_shape(128, 8), (8, 16));
    assert_eq!(trace::gang_shape(7, 8), (7, 1));
    let bad = "timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-09 07:01:55,66.0,zero,66.0,11cb48\n";
    let err = trace::parse(Format::Philly, "philly.csv", bad, 8).unwrap_err();
    assert_eq!(
        err.to_string(),
        "philly.csv:2: num_gpus: \"zero\" is not a whole number ≥ 1"
    );
}

#[test]
fn gpool_traces_round_trip_and_name_bad_fields() {
    let mut original = job(1_500_000_000, 90, 4, 2, "vision");
    original.gpu_types = vec![GpuModel::new("h100"), GpuModel::new("a100")];
    original.time_limit_secs = Some(3600);
    original.checkpoint_every_secs = Some(600);
    let csv = trace::to_csv(std::slice::from_ref(&original));
    assert_eq!(
        trace::parse(Format::GpoolCsv, "t.csv", &csv, 8).unwrap(),
        vec![original.clone()]
    );
    let line = serde_json::to_string(&trace::GpoolRow::from_job(&original)).unwrap();
    assert_eq!(
        trace::parse(Format::GpoolJsonl, "t.jsonl", &line, 8).unwrap(),
        vec![original]
    );
    let said = "submit,duration,team,on_signal,checkpoint_on_signal\n0,1,a,,\n0,1,a,exit,\n0,1,a,work_on,0\n0,1,a,,true\n0,1,a,checkpoint,1\n";
    let on: Vec<Option<OnSignal>> = trace::parse(Format::GpoolCsv, "t.csv", said, 8)
        .unwrap()
        .iter()
        .map(|j| j.on_signal)
        .collect();
    use OnSignal::*;
    assert_eq!(on, [None, Some(Exit), Some(WorkOn), Some(Checkpoint), Some(Checkpoint)]);
    let err = trace::parse(
        Format::GpoolCsv,
        "t.csv",
        "submit,duration,team,on_signal\n0,1,a,ignore\n",
        8,
    )
    .unwrap_err()
    .to_string();
    assert_eq!(err, "t.csv:2: on_signal: \"ignore\" is not exit, checkpoint or work_on");
    let err = trace::parse(
        Format::GpoolCsv,
        "t.csv",
        "submit,duration,team,on_signal,checkpoint_on_signal\n0,1,a,exit,true\n",
        8,
    )
    .unwrap_err()
    .to_string();
    assert_eq!(
        err,
        "t.csv:2: on_signal: \"exit\" contradicts checkpoint_on_signal = true"
    );
    let bad = "submit,duration,team\nyesterday,10,a\n";
    let err = trace::parse(Format::GpoolCsv, "t.csv", bad, 8).unwrap_err().to_string();
    assert!(err.starts_with("t.csv:2: submit: \"yesterday\""), "{err}");
    let err = trace::parse(Format::GpoolCsv, "t.csv", "submit,duration,team\n", 8)
        .unwrap_err()
        .to_string();
    assert_eq!(err, "t.csv:1: no jobs in the trace");
}

#[test]
fn cluster_files_name_the_bad_field() {
    let cluster = Cluster::parse(
        "c.toml",
        "[[nodes]]\ncount = 2\ngpus = 8\nmodel = \"H100\"\nlinks = \"pairs\"\nprice_per_gpu_hour = 2.5\n\n[[nodes]]\ncount = 1\ngpus = 4\nmodel = \"l4\"\nprefix = \"inf\"\n",
    )
    .unwrap();
    assert_eq!(cluster.gpus(), 20);
    let names: Vec<&str> = cluster.nodes.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["n001", "n002", "inf001"]);
    assert_eq!(cluster.nodes[0].topology.link(0, 1), crate::topology::Link::Nvlink);
    assert_eq!(cluster.nodes[0].topology.link(1, 2), crate::topology::Link::PcieSwitch);
    let err = Cluster::parse(
        "c.toml",
        "[[nodes]]\ncount = 1\ngpus = 8\nmodel = \"x\"\nlinks = \"ring\"\n",
    )
    .unwrap_err();
    assert_eq!(
        err.to_string(),
        "c.toml:1: nodes.links: \"ring\" is not nvswitch, pairs or pcie"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Under every policy, on random traces and clusters, no start is ever
    /// placed on a GPU that is taken, every job that fits somewhere runs,
    /// and GPU-time adds up.
    #[test]
    fn no_cycle_over_commits_a_gpu(
        shapes in prop::collection::vec((0i64..2000, 1i64..900, 0u32..4, 1u32..3, 0usize..3, prop::option::of(30u64..300)), 1..60),
        nodes in 1usize..4,
        per_node in prop::sample::select(vec![2u32, 4, 8]),
    ) {
        let jobs: Vec<TraceJob> = {
            let mut jobs: Vec<TraceJob> = shapes
                .iter()
                .map(|(at, secs, gpus_log, gang, team, checkpoint)| {
                    let gpus = (1u32 << gpus_log).min(per_node);
                    let mut j = job(*at, *secs, gpus, (*gang).min(nodes as u32), ["a", "b", "c"][*team]);
                    j.checkpoint_every_secs = *checkpoint;
                    j
                })
                .collect();
            jobs.sort_by_key(|j| j.submit);
            jobs
        };
        let cluster = Cluster::uniform(nodes, per_node, "h100");
        let guarantees = guarantees_by_demand(&jobs, cluster.gpus());
        let mut policy = sharing_policy(&cluster, &guarantees);
        policy.sharing.qos[0].min_runtime_secs = 0;
        for setup in [
            fifo(&cluster, &guarantees),
            pooled("gpool", &cluster, policy, &guarantees),
            dedicated(&cluster, &guarantees, 1.0),
        ] {
            let outcome = run(&setup, &jobs);
            prop_assert_eq!(outcome.overcommits, 0);
            prop_assert_eq!(outcome.invariant_violations, 0, "{:?}", outcome.first_violation);
            // Jumping over quiet stretches changes nothing but the cycles.
            let mut ticking = run_every_tick(&setup, &jobs);
            prop_assert!(ticking.cycles >= outcome.cycles);
            ticking.cycles = outcome.cycles;
            prop_assert_eq!(&ticking, &outcome);
            // Without the words (the savings search's replays): every
            // attempt, preemption and rescind the same; only the figure
            // read from the words is not kept, and the cycles that would
            // have stated it not run.
            let recorded = |words| simulate(&setup, &jobs, &Options { record: true, words, ..run_options() }, &mut Quiet);
            let (with_words, mut without) = (recorded(true), recorded(false));
            prop_assert_eq!(without.fragmentation_blocked_jobs, 0);
            prop_assert!(without.cycles <= with_words.cycles);
            without.fragmentation_blocked_jobs = with_words.fragmentation_blocked_jobs;
            without.cycles = with_words.cycles;
            prop_assert_eq!(&without.attempts, &with_words.attempts);
            prop_assert_eq!(&without.events, &with_words.events);
            prop_assert_eq!(&without, &with_words);
            if setup.name != "dedicated" {
                prop_assert_eq!(outcome.never_started, 0);
                prop_assert_eq!(outcome.completed, jobs.len());
            }
            prop_assert!(outcome.allocation <= 1.0 + 1e-9);
            let asked: f64 = jobs.iter().filter(|_| setup.name != "dedicated").map(|j| j.duration_ms as f64 / 3.6e6 * j.total_gpus() as f64).sum();
            if setup.name != "dedicated" {
                // Delivered = asked + work redone after preemptions.
                prop_assert!((outcome.delivered_gpu_hours - asked - outcome.lost_gpu_hours).abs() < 1e-6,
                    "{} delivered {} asked {} lost {}", setup.name, outcome.delivered_gpu_hours, asked, outcome.lost_gpu_hours);
            }
        }
    }
}

/// A shared pool of three kinds of node: H100s, A100s of pool `inference`
/// (tier=inference) and L4s.
fn mixed_fleet(n_h100: u32, n_a100: u32, n_l4: u32) -> Cluster {
    let mut text = String::new();
    for (count, gpus, model, prefix, labels) in [
        (n_h100, 8, "h100", "h", ""),
        (n_a100, 4, "a100", "a", "labels = { tier = \"inference\" }\n"),
        (n_l4, 4, "l4", "l", ""),
    ] {
        if count > 0 {
            text += &format!(
                "[[nodes]]\ncount = {count}\ngpus = {gpus}\nmodel = \"{model}\"\nprefix = \"{prefix}\"\nlinks = \"nvswitch\"\n{labels}\n"
            );
        }
    }
    Cluster::parse("fleet.toml", &text).expect("a valid fleet")
}

/// Teams a (with a guarantee in pool `inference` too), b and c (none);
/// QoS normal, high (preempts lower classes, keeps `reserve` GPUs) and low.
fn shared_policy(guaranteed: [u32; 2], reserve: u32, min_runtime_secs: u64) -> crate::sched::Policy {
    use crate::policy::{Qos, Team};
    let mut policy = crate::sched::Policy::default();
    policy.pools.push(PoolDef {
        name: "inference".into(),
        selector: [("tier".to_string(), "inference".to_string())].into(),
        defaults: Default::default(),
    });
    policy.sharing.teams = vec![
        Team {
            guaranteed_gpus: guaranteed[0],
            guaranteed_in: [("inference".to_string(), 2)].into(),
            shares: 2,
            ..Team::unlisted("a")
        },
        Team {
            guaranteed_gpus: guaranteed[1],
            ..Team::unlisted("b")
        },
        Team::unlisted("c"),
    ];
    policy.sharing.qos = vec![
        Qos {
            priority: 10,
            min_runtime_secs,
            grace_secs: 120,
            ..Qos::normal()
        },
        Qos {
            name: "high".into(),
            priority: 100,
            preempt_lower: true,
            reserve_gpus: reserve,
            ..Qos::normal()
        },
        Qos {
            name: "low".into(),
            grace_secs: 300,
            ..Qos::normal()
        },
    ];
    policy.sharing.default_qos = "normal".into();
    policy.sharing.waste_cap_gpu_hours_per_hour = 1000.0;
    policy
}

/// Arrays of alike jobs: (at, duration, size, team, QoS, GPUs, models,
/// pool, checkpoints when signalled).
type ArraySpec = (i64, i64, usize, usize, usize, u32, usize, bool, usize);

fn arrays_of(specs: &[ArraySpec]) -> Vec<TraceJob> {
    let mut jobs = Vec::new();
    for (at, secs, size, team, qos, gpus, models, inference, on_signal) in specs {
        for _ in 0..*size {
            let team = ["a", "b", "c"][*team];
            let mut j = job(*at, *secs, *gpus, 1, team);
            j.qos = ["", "high", "low"][*qos].into();
            j.gpu_types = match models {
                1 => vec![GpuModel::new("h100")],
                2 => vec![GpuModel::new("l4")],
                3 => vec![GpuModel::new("h100"), GpuModel::new("a100")],
                _ => Vec::new(),
            };
            j.on_signal = Some([OnSignal::Exit, OnSignal::Checkpoint, OnSignal::WorkOn][*on_signal]);
            if *inference && team == "a" {
                j.gpu_types.clear();
            }
            jobs.push(j);
        }
    }
    jobs.sort_by_key(|j| j.submit);
    jobs
}

fn arb_arrays() -> impl Strategy<Value = Vec<ArraySpec>> {
    prop::collection::vec(
        (
            0i64..1200,
            60i64..3000,
            1usize..12,
            0usize..3,
            0usize..3,
            prop::sample::select(vec![1u32, 1, 2, 4]),
            0usize..4,
            any::<bool>(),
            0usize..3,
        ),
        1..8,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Over whole replays (victims in their grace, victims that end early
    /// when they checkpoint, promises, requeues, windowed cycles), on mixed
    /// fleets with teams, QoS classes and reserves: no plan breaks an
    /// invariant of `sched::invariants`, no GPU is given twice, and every
    /// job that fits the fleet ends.
    #[test]
    fn reclaims_take_only_what_is_owed_over_many_cycles(
        arrays in arb_arrays(),
        fleet in (1u32..3, 0u32..2, 0u32..2),
        guaranteed in (0u32..10, 0u32..6),
        reserve in 0u32..5,
        min_runtime in prop::sample::select(vec![0u64, 600]),
    ) {
        let jobs = arrays_of(&arrays);
        let cluster = mixed_fleet(fleet.0, fleet.1, fleet.2);
        let policy = shared_policy([guaranteed.0, guaranteed.1], reserve, min_runtime);
        let guarantees = [("a".to_string(), guaranteed.0), ("b".to_string(), guaranteed.1)].into();
        let setup = pooled("gpool", &cluster, policy, &guarantees);
        let options = Options { tick_secs: 5, bucket_secs: 600, pause_secs: 0, ..Options::default() };
        let outcome = simulate(&setup, &jobs, &options, &mut Quiet);
        prop_assert_eq!(outcome.invariant_violations, 0, "{:?}", outcome.first_violation);
        prop_assert_eq!(outcome.overcommits, 0);
    }
}

/// Counts the starts of the cycles before `until_ms` of virtual time.
struct StartsUntil {
    until_ms: i64,
    done_ms: i64,
    n_starts: usize,
}

impl Observer for StartsUntil {
    fn cycle(&mut self, run: &mut dyn FnMut() -> crate::sched::Plan) -> crate::sched::Plan {
        let plan = run();
        if self.done_ms < self.until_ms {
            self.n_starts += plan.starts.len();
        }
        plan
    }

    fn progress(&mut self, done_ms: i64, _total_ms: i64) {
        self.done_ms = done_ms;
    }
}

/// A fleet with a few A10s among many V100s fills one 1-GPU job a second,
/// a third of them A10-only, none ending: the GPUs filled reach the
/// max-flow bound (the most jobs that could run on those GPUs at once,
/// given which models each accepts) within 3%, and no A10-only job is left
/// waiting while any-model jobs hold A10s and V100s stand free.
#[test]
fn a_fleet_with_a_scarce_model_fills_to_the_max_flow_bound() {
    let cluster = Cluster::parse(
        "fleet.toml",
        "[[nodes]]\ncount = 10\ngpus = 4\nmodel = \"a10\"\nprefix = \"a\"\n\n[[nodes]]\ncount = 60\ngpus = 8\nmodel = \"v100\"\nprefix = \"v\"\n",
    )
    .expect("fleet");
    let (n_a10, n_gpus) = (40usize, cluster.gpus() as usize);
    let jobs: Vec<TraceJob> = (0..600)
        .map(|i| {
            let mut j = job(i, 900, 1, 1, "a");
            if i % 3 == 2 {
                j.gpu_types = vec![GpuModel::new("a10")];
            }
            j
        })
        .collect();
    let n_a10_only = jobs.iter().filter(|j| !j.gpu_types.is_empty()).count();
    let n_any = jobs.len() - n_a10_only;
    // Max flow from jobs to the models they accept: A10-only jobs on A10s,
    // any-model jobs on whatever is left.
    let a10_only_placed = n_a10_only.min(n_a10);
    let bound = a10_only_placed + n_any.min(n_gpus - a10_only_placed);
    let guarantees = [("a".to_string(), 0)].into();
    let setup = pooled("gpool", &cluster, crate::sched::Policy::default(), &guarantees);
    let mut watch = StartsUntil {
        until_ms: 600_000,
        done_ms: 0,
        n_starts: 0,
    };
    let options = Options {
        tick_secs: 1,
        bucket_secs: 600,
        pause_secs: 0,
        ..Options::default()
    };
    let outcome = simulate(&setup, &jobs[..], &options, &mut watch);
    assert_eq!(outcome.invariant_violations, 0);
    eprintln!("filled {} GPUs of {n_gpus}; max-flow bound {bound}", watch.n_starts);
    assert!(
        watch.n_starts as f64 >= bound as f64 * 0.97,
        "{} of {n_gpus} GPUs filled; the max-flow bound is {bound}",
        watch.n_starts
    );
}

/// Per-user caps hold in the simulator as in gpoold (the same cycle): one
/// user's six 100 s jobs run two at a time on 8 free GPUs, while another
/// user's job starts at once.
#[test]
fn a_users_max_jobs_holds_in_the_simulator() {
    let cluster = Cluster::uniform(1, 8, "h100");
    let mut jobs: Vec<TraceJob> = (0..6).map(|_| job(0, 100, 1, 1, "a")).collect();
    let mut other = job(0, 100, 1, 1, "a");
    other.user = "b".into();
    jobs.push(other);
    let guarantees = guarantees_by_demand(&jobs, cluster.gpus());
    let mut policy = sharing_policy(&cluster, &guarantees);
    policy.sharing.user_limits.max_jobs = Some(2);
    let outcome = run(&pooled("gpool", &cluster, policy, &guarantees), &jobs);
    // Waits 0, 0, 100, 100, 200, 200 for user a; 0 for b.
    assert_eq!(delays(&outcome), (600.0 / 7.0, 200.0, 7));
    assert_eq!(outcome.completed, 7);
}

/// A reservation holds in the simulator as in gpoold: a maintenance window
/// on the only node from 100 s to 3700 s keeps a 1000 s job (limit 1000 s)
/// submitted at 0 off it until the window closes, while a 50 s job (limit
/// 60 s) runs at once, before the window.
#[test]
fn a_maintenance_window_holds_in_the_simulator() {
    let cluster = Cluster::uniform(1, 8, "h100");
    let jobs = [
        limited(job(0, 1000, 8, 1, "a"), 1000),
        limited(job(0, 50, 8, 1, "a"), 60),
    ];
    let guarantees = guarantees_by_demand(&jobs, cluster.gpus());
    let mut policy = sharing_policy(&cluster, &guarantees);
    policy.reservations = vec![crate::sched::reservations::Reservation {
        name: "maint".into(),
        nodes: cluster.nodes.iter().map(|node| node.name.clone()).collect(),
        start: Timestamp(100_000),
        end: Timestamp(3_700_000),
        users: Vec::new(),
        teams: Vec::new(),
    }];
    let outcome = run(&pooled("gpool", &cluster, policy, &guarantees), &jobs);
    // Waits: 3700 s for the long job, 0 for the short one.
    assert_eq!(delays(&outcome), (1850.0, 3700.0, 2));
    assert_eq!(outcome.completed, 2);
}

/// CPUs and memory hold in the simulator as in gpoold: a cluster file's
/// `cpus` per node and a trace's `cpus_per_gpu` keep a second job off the
/// node's free GPUs until the first gives its CPUs back.
#[test]
fn cpus_a_node_gave_out_hold_in_the_simulator() {
    let cluster = Cluster::parse(
        "c.toml",
        "[[nodes]]\ncount = 1\ngpus = 8\nmodel = \"h100\"\ncpus = 16\n",
    )
    .unwrap();
    let trace = "submit,duration,gpus_per_node,team,cpus_per_gpu\n0,100,2,a,6\n0,100,2,a,4\n0,100,2,a,\n";
    let jobs = crate::sim::trace::parse(crate::sim::trace::Format::GpoolCsv, "t.csv", trace, 8).unwrap();
    assert_eq!(jobs[0].host.map(|ask| ask.cpus), Some(12), "6 for each of its 2 GPUs");
    let guarantees = guarantees_by_demand(&jobs, cluster.gpus());
    let policy = sharing_policy(&cluster, &guarantees);
    let outcome = run(&pooled("gpool", &cluster, policy, &guarantees), &jobs);
    // 12 of 16 CPUs go to the first job: the second (8) waits 100 s, the
    // third, which asks for none, starts at once.
    assert_eq!(delays(&outcome), (100.0 / 3.0, 100.0, 3));
    assert_eq!(outcome.completed, 3);
    assert_eq!(outcome.overcommits, 0);
    // A pool's default_cpus_per_gpu holds too: the third job, which asks
    // for none, takes 6 for each GPU (12), so it waits for the first and
    // then for the second (8 + 12 > 16): waits 0, 100 and 200 s.
    let mut policy = sharing_policy(&cluster, &guarantees);
    for pool in &mut policy.pools {
        pool.defaults.cpus_per_gpu = Some(6);
    }
    let outcome = run(&pooled("gpool", &cluster, policy, &guarantees), &jobs);
    assert_eq!(delays(&outcome), (100.0, 200.0, 3));
}

/// A cloud group of two 8-GPU nodes beside one: three 8-GPU jobs of an
/// hour arrive at once, and a short one hours later. The first runs at once; the other two wake both
/// cloud nodes, which take work 5 minutes later and sleep 10 minutes after
/// their jobs end. With a budget of 1 node, only one wakes and the third
/// job runs after it.
#[test]
fn a_cloud_group_wakes_for_waiting_jobs_and_sleeps_when_idle_within_its_budget() {
    let jobs = [
        job(0, 3600, 8, 1, "a"),
        job(0, 3600, 8, 1, "a"),
        job(0, 3600, 8, 1, "a"),
        // Long after: the cloud nodes sleep meanwhile.
        job(20_000, 60, 8, 1, "a"),
    ];
    let cluster = Cluster::uniform(1, 8, "h100");
    let guarantees = guarantees_by_demand(&jobs, cluster.gpus());
    let gpool = pooled("gpool", &cluster, sharing_policy(&cluster, &guarantees), &guarantees);
    let group = |max_nodes| crate::power::Group {
        max_nodes: Some(max_nodes),
        ..crate::power::Group::new("cloud", vec!["c1".into(), "c2".into()], GpuModel::new("h100"), 8, 2.0)
    };
    let without = run(&gpool, &jobs);
    assert_eq!(delays(&without), (2700.0, 7200.0, 4));
    let with = run(&with_power(gpool.clone(), group(2), 300), &jobs);
    // Waits 0, 300, 300, 0; each cloud node is powered from 0 to 3600 + 300 +
    // 600 (+ up to a minute for the power tick to see it idle).
    assert_eq!(delays(&with), (150.0, 300.0, 4));
    let power = with.power.clone().expect("a power outcome");
    assert_eq!(power.resumes, 2);
    assert!(
        (2.0 * 8.0 * 4500.0 / 3600.0..=2.0 * 8.0 * 4560.0 / 3600.0).contains(&power.powered_gpu_hours),
        "{power:?}"
    );
    assert!((power.cost - power.powered_gpu_hours * 2.0).abs() < 1e-6);
    assert!(power.saved_gpu_hours > 0.0, "{power:?}");
    assert_eq!(with.invariant_violations, 0);
    assert_eq!(with.overcommits, 0);
    // Nodes that never sleep: the replay still ends, and they are billed
    // to its end.
    let mut awake = group(2);
    awake.suspend_after_secs = None;
    let never = run(&with_power(gpool.clone(), awake, 300), &jobs);
    assert_eq!(delays(&never), (150.0, 300.0, 4));
    assert_eq!(never.power.clone().expect("power").saved_gpu_hours, 0.0);
    // A budget of one node: the third job waits for the first to end.
    let one = run(&with_power(gpool, group(1), 300), &jobs);
    assert_eq!(one.power.clone().expect("power").resumes, 1);
    assert_eq!(delays(&one), ((300.0 + 3600.0) / 4.0, 3600.0, 4));
}

/// A job that fits no node arrives 200 ms after a cycle that stated why
/// jobs wait (the words are not due again), where GPUs are free in all:
/// that arrival's cycle counts it as blocked by fragmentation, as a replay
/// that cycles at every tick does, before an end 200 ms later lets it
/// start.
#[test]
fn a_job_that_fits_no_node_between_words_is_counted_as_fragmented() {
    let at_ms = |at, duration_ms, gpus| TraceJob {
        submit: Timestamp(at),
        duration_ms,
        ..job(0, 1, gpus, 1, "a")
    };
    // Three of the four GPUs of each node busy, one for 400 ms.
    let jobs = vec![at_ms(0, 400, 3), at_ms(0, 3_600_000, 3), at_ms(200, 60_000, 2)];
    let cluster = Cluster::uniform(2, 4, "h100");
    let setup = fifo(&cluster, &BTreeMap::new());
    let outcome = run(&setup, &jobs);
    assert_eq!(outcome.fragmentation_blocked_jobs, 1);
    assert_eq!(outcome.completed, 3);
    let mut ticking = run_every_tick(&setup, &jobs);
    ticking.cycles = outcome.cycles;
    assert_eq!(ticking, outcome);
}

/// A quarter-GPU job that arrives while no GPU is free joins the GPU
/// another quarter opened: its arrival runs a cycle, as every tick would.
#[test]
fn a_fraction_arriving_at_a_full_cluster_joins_a_shared_gpu() {
    let quarter = |at| TraceJob {
        gpu_milli: Some(250),
        ..job(at, 3600, 1, 1, "a")
    };
    let jobs = vec![quarter(0), job(0, 3600, 1, 1, "a"), quarter(60)];
    let cluster = Cluster::uniform(1, 2, "h100");
    let guarantees = guarantees_by_demand(&jobs, cluster.gpus());
    let setup = pooled("gpool", &cluster, sharing_policy(&cluster, &guarantees), &guarantees);
    let outcome = run(&setup, &jobs);
    assert_eq!(delays(&outcome), (0.0, 0.0, 3));
    let mut ticking = run_every_tick(&setup, &jobs);
    ticking.cycles = outcome.cycles;
    assert_eq!(ticking, outcome);
}

/// Eight quarter-GPU jobs of an hour each on two H100s: packed four to a
/// GPU they all start at once and hold the two GPUs an hour; rounded up to
/// whole GPUs they run two at a time, and hold eight GPU-hours.
#[test]
fn fractions_pack_four_to_a_gpu_where_whole_gpus_run_them_two_at_a_time() {
    let jobs: Vec<TraceJob> = (0..8)
        .map(|_| TraceJob {
            gpu_milli: Some(250),
            ..job(0, 3600, 1, 1, "a")
        })
        .collect();
    let cluster = Cluster::uniform(1, 2, "h100");
    let guarantees = guarantees_by_demand(&jobs, cluster.gpus());
    let policy = sharing_policy(&cluster, &guarantees);
    let packed = run(&pooled("gpool", &cluster, policy.clone(), &guarantees), &jobs);
    let whole = run(
        &Setup {
            whole_fractions: true,
            ..pooled("gpool-whole", &cluster, policy, &guarantees)
        },
        &jobs,
    );
    assert_eq!(delays(&packed), (0.0, 0.0, 8));
    assert_eq!(delays(&whole), (5400.0, 10_800.0, 8));
    let (p, w) = (packed.fractions.clone().unwrap(), whole.fractions.clone().unwrap());
    assert_eq!((p.jobs, w.jobs), (8, 8));
    assert!(
        (p.asked_gpu_hours - 2.0).abs() < 1e-9 && (w.asked_gpu_hours - 2.0).abs() < 1e-9,
        "{p:?} {w:?}"
    );
    assert!((p.held_gpu_hours - 2.0).abs() < 1e-9, "{p:?}");
    assert!((w.held_gpu_hours - 8.0).abs() < 1e-9, "{w:?}");
    // The allocation counts a shared GPU once; fair share charges parts.
    assert!((packed.allocation - 1.0).abs() < 1e-9, "{}", packed.allocation);
    assert!((packed.delivered_gpu_hours - 2.0).abs() < 1e-9);
    for outcome in [&packed, &whole] {
        assert_eq!((outcome.overcommits, outcome.invariant_violations), (0, 0));
        assert_eq!(outcome.completed, 8);
    }
}

#[test]
fn the_savings_search_gives_the_same_result_whatever_the_scales_replayed_at_once() {
    // Two teams of 16 one-GPU jobs on 8 GPUs: dedicated halves (4 GPUs
    // each) wait 1,500 s on average, partitions 2.5 times as large a few
    // hundred. Replayed 4 at a time, the search's first batch holds scales
    // past the first that matches; they must not count.
    let jobs: Vec<TraceJob> = (0..32)
        .map(|i| job(0, 1000, 1, 1, if i % 2 == 0 { "a" } else { "b" }))
        .collect();
    let cluster = Cluster::uniform(2, 4, "l4");
    let guarantees = guarantees_by_demand(&jobs, cluster.gpus());
    let search = |threads: usize| {
        savings(
            (&cluster, &guarantees),
            &jobs,
            400.0,
            (&run_options(), threads),
            &|_| Box::new(Quiet),
        )
    };
    let one_at_a_time = search(1);
    let scale = one_at_a_time.scale.expect("some scale matches the target");
    let first_match = SAVINGS_SCALES.iter().position(|s| *s >= scale).unwrap();
    assert!(
        (1..3).contains(&first_match),
        "the case needs a first batch of 4 that goes past the match: {one_at_a_time:?}"
    );
    assert_eq!(one_at_a_time.tried.len(), first_match + 1 + 3, "{one_at_a_time:?}");
    for threads in [2, 4, 8] {
        assert_eq!(search(threads), one_at_a_time, "{threads} at once");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the threads and whichever finishes first (later indices
    /// sleep less here), `first_enough` keeps what running the indices one
    /// at a time and stopping at the first that is enough keeps.
    #[test]
    fn first_enough_keeps_what_one_at_a_time_keeps(
        n in 0usize..10,
        threads in 1usize..5,
        enough_at in proptest::collection::vec(any::<bool>(), 10),
    ) {
        let run = |index: usize| {
            std::thread::sleep(std::time::Duration::from_micros(((n - index) * 200) as u64));
            (index, enough_at[index])
        };
        let mut one_at_a_time = Vec::new();
        for (index, enough) in enough_at.iter().enumerate().take(n) {
            one_at_a_time.push((index, *enough));
            if *enough {
                break;
            }
        }
        prop_assert_eq!(first_enough(n, threads, run, |(_, enough)| *enough), one_at_a_time);
    }
}
