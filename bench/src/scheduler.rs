//! The scheduler alone and through gpoold: cycles over large views
//! (whole and starts-only), cycles that change nothing, a shared pool with
//! teams and QoS reserves, and a long queue behind real agents.

use super::*;

/// `schedule` on 1,000 nodes x 8 GPUs with 10,000 pending jobs of mixed
/// shapes: once with every GPU free, once with the pool full.
/// `schedule` or `schedule_starts`.
pub(crate) type Planner = fn(&ClusterView, &Policy, Timestamp) -> Plan;

pub(crate) fn schedule_cycles() {
    let models = ["h100", "a100-80gb", "l4"];
    for busy in [false, true] {
        let nodes: Vec<String> = (0..1000)
            .map(|i| format!("n{i} 8x{}{}", models[i % 3], if busy { " used=0-7" } else { "" }))
            .collect();
        let jobs: Vec<String> = (0..10_000)
            .map(|i| {
                let shape = match i % 10 {
                    0 => "gpus=8 nodes=2".to_string(),
                    1 | 2 => "gpus=8".to_string(),
                    3 | 4 => "gpus=4".to_string(),
                    5 => format!("gpus=2 type={}", models[i % 3]),
                    _ => "gpus=1".to_string(),
                };
                format!("j{} {shape} prio={}", i + 1, i % 4)
            })
            .collect();
        let mut view = cluster_view(&nodes.join("\n"), &jobs.join("\n"));
        if busy {
            // One node's GPUs freed: what a cycle after a job's end sees.
            view.nodes[0].gpus.iter_mut().for_each(|gpu| gpu.busy = false);
        }
        let policy = Policy::default();
        let plans: [(&str, Planner); 2] = [("whole plan", schedule), ("starts alone", schedule_starts)];
        for (kind, plan_with) in plans {
            let mut n_starts = 0;
            let samples: Vec<Duration> = (0..21)
                .map(|_| {
                    let started = Instant::now();
                    let plan = plan_with(&view, &policy, Timestamp(0));
                    let elapsed = started.elapsed();
                    n_starts = plan.starts.len();
                    elapsed
                })
                .collect();
            report(
                &format!(
                    "schedule, 1,000 nodes x 8 GPUs, 10,000 pending, {}, {kind} ({n_starts} start)",
                    if busy { "one node free" } else { "pool empty" }
                ),
                format!("{:.2} ms (median of 21)", median(samples).as_secs_f64() * 1e3),
            );
        }
    }
}

/// A scheduling cycle with `n_pending` jobs waiting and no free GPU (no
/// node at all), against a wake-up that finds nothing changed since the
/// last cycle: gpoold's own histograms, after three periodic wake-ups.
pub(crate) fn unchanged_cycles(n_pending: usize) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let controller = Controller::start_with(dir.path(), &["--metrics-listen", "127.0.0.1:0"])?;
    let batch = dir.path().join("batch.toml");
    write_true_batch(&batch, n_pending)?;
    gpool(&controller.addr, &["submit", "-f", &batch.display().to_string()])?;
    std::thread::sleep(Duration::from_secs(16));
    for (metric, what) in [
        ("gpool_scheduling_cycle_seconds", "a full cycle"),
        ("gpool_scheduling_unchanged_seconds", "a wake-up with nothing changed"),
    ] {
        let (sum, count) = histogram(dir.path(), metric)?;
        report(
            &format!("scheduling, {n_pending} pending, no free GPU: {what}"),
            format!("{:.3} ms (mean of {count})", sum / count.max(1.0) * 1e3),
        );
    }
    controller.stop();
    Ok(())
}

/// A full scheduling cycle with 50 teams: priorities (fair share from
/// decayed usage), guaranteed-first ordering, and preemption planning. The
/// pool is 90% busy, half of it with burst work; teams' guarantees add up to
/// half the pool; pending jobs of every shape and QoS class.
pub(crate) fn sharing_cycle(n_nodes: usize, n_pending: usize) {
    let n_teams = 50;
    let now = Timestamp(1_000_000_000);
    let policy = sharing_policy(n_nodes, n_teams);
    let nodes = sharing_nodes(n_nodes);
    let running = sharing_running(n_nodes, n_teams, now);
    let pending = sharing_pending(n_pending, n_teams, now);
    let usage = sharing_usage(n_teams, now);
    let view = ClusterView {
        nodes,
        pending,
        running,
        usage,
        promised: Vec::new(),
        waste_budget_gpu_secs: 1e9,
        windowed: false,
    };
    let (mut n_starts, mut n_preempted) = (0, 0);
    let samples: Vec<Duration> = (0..5)
        .map(|_| {
            let started = Instant::now();
            let plan = schedule(&view, &policy, now);
            let elapsed = started.elapsed();
            (n_starts, n_preempted) = (plan.starts.len(), plan.preemptions.len());
            elapsed
        })
        .collect();
    report(
        &format!(
            "full cycle, 50 teams, {n_nodes} nodes x 8 GPUs, {n_pending} pending ({n_starts} start, {n_preempted} preempted)"
        ),
        format!("{:.1} ms (median of 5)", median(samples).as_secs_f64() * 1e3),
    );
}

/// The GPU models of `sharing_cycle`'s nodes, in turn.
const SHARING_MODELS: [&str; 3] = ["h100", "a100-80gb", "l4"];

/// `n_teams` teams whose guarantees add up to half the pool, and three
/// QoS classes (one that preempts, one with a minimum runtime).
fn sharing_policy(n_nodes: usize, n_teams: u32) -> Policy {
    use gpool_core::policy::{Qos, Team};
    let mut policy = Policy::default();
    policy.sharing.teams = (0..n_teams)
        .map(|t| Team {
            shares: 1 + t % 4,
            guaranteed_gpus: (n_nodes * 8 / 2 / n_teams as usize) as u32,
            gpu_hours: (t % 5 == 0).then_some(10_000),
            ..Team::unlisted(&format!("team-{t}"))
        })
        .collect();
    policy.sharing.qos = vec![
        Qos::normal(),
        Qos {
            name: "high".into(),
            priority: 100,
            preempt_lower: true,
            ..Qos::normal()
        },
        Qos {
            name: "low".into(),
            min_runtime_secs: 600,
            ..Qos::normal()
        },
    ];
    policy
}

/// `n_nodes` nodes of 8 GPUs, every one busy but each tenth node's.
fn sharing_nodes(n_nodes: usize) -> Vec<gpool_core::sched::NodeView> {
    use gpool_core::model::GpuModel;
    use gpool_core::sched::{Availability, GpuView, NodeView};
    let models = SHARING_MODELS;
    (0..n_nodes)
        .map(|i| NodeView {
            name: format!("n{i}"),
            labels: Default::default(),
            availability: Availability::Up,
            gpus: (0..8)
                .map(|g| GpuView {
                    index: g,
                    model: GpuModel::new(models[i % 3]),
                    busy: i % 10 != 0,
                    memory_mib: 81_559,
                    reserved_mib: 0,
                    shared: None,
                })
                .collect(),
            topology: Default::default(),
            host: None,
            enforces: gpool_core::enforce::LimitSet::ALL,
        })
        .collect()
}

/// The running jobs on `sharing_nodes`.
fn sharing_running(n_nodes: usize, n_teams: u32, now: Timestamp) -> Vec<gpool_core::sched::RunningJob> {
    use gpool_core::model::NodePlacement;
    use gpool_core::sched::RunningJob;
    use gpool_core::JobId;
    // Every node but each tenth runs two 4-GPU jobs, odd ones burst work.
    (0..n_nodes)
        .filter(|i| i % 10 != 0)
        .flat_map(|i| {
            (0..2).map(move |half| RunningJob {
                id: JobId((10_000_000 + i * 2 + half) as u64),
                epoch: gpool_core::Epoch(1),
                user: format!("user-{}", (i * 2 + half) % 50),
                team: format!("team-{}", (i * 2 + half) % n_teams as usize),
                qos: if half == 0 { "normal".into() } else { "low".into() },
                pool: String::new(),
                gpu_types: Vec::new(),
                burst: half == 1,
                placement: vec![NodePlacement {
                    node: format!("n{i}"),
                    gpu_indices: (half as u32 * 4..half as u32 * 4 + 4).collect(),
                }],
                started_at: Timestamp(now.0 - 3_600_000 - (i as i64 % 7) * 60_000),
                last_checkpoint_at: (i % 3 == 0).then_some(Timestamp(now.0 - 300_000)),
                preempting: false,
                preempted_for: None,
                ends_at: Some(Timestamp(now.0 + (i as i64 % 24) * 3_600_000)),
                service_before_gpu_secs: 0,
                share: None,
            })
        })
        .collect()
}

/// `n_pending` jobs of every shape, team and QoS class.
fn sharing_pending(
    n_pending: usize,
    n_teams: u32,
    now: Timestamp,
) -> Vec<std::sync::Arc<gpool_core::sched::PendingJob>> {
    use gpool_core::model::GpuModel;
    use gpool_core::sched::{JobShape, PendingJob};
    use gpool_core::JobId;
    let models = SHARING_MODELS;
    (0..n_pending)
        .map(|i| PendingJob {
            id: JobId(i as u64 + 1),
            submitted_at: Timestamp(now.0 - (i as i64 % 1000) * 1000),
            shape: std::sync::Arc::new(JobShape {
                team: format!("team-{}", i % n_teams as usize).into(),
                reservation: Default::default(),
                qos: ["normal", "high", "low"][i % 3].into(),
                pool: Default::default(),
                gpu_types: (i % 7 == 0).then(|| GpuModel::new(models[i % 3])).into_iter().collect(),
                gpus_per_node: [1, 2, 4, 8][i % 4],
                nodes: if i % 20 == 0 { 2 } else { 1 },
                priority: 0,
                time_limit_secs: Some(600 * (1 + i as u64 % 12)),
                requires: None,
                host: None,
                exclusive: false,
                limits: Default::default(),
                share: None,
            }),
            user: format!("user-{}", i % 50).into(),
            service_gpu_secs: 0,
            waiting_since: Timestamp(now.0 - (i as i64 % 1000) * 1000),
        })
        .map(std::sync::Arc::new)
        .collect()
}

/// Each team's decayed usage: the higher its number, the more.
fn sharing_usage(n_teams: u32, now: Timestamp) -> std::collections::BTreeMap<String, gpool_core::policy::Ledger> {
    use gpool_core::policy::Ledger;
    (0..n_teams)
        .map(|t| {
            let ledger = Ledger {
                decayed: f64::from(t) * 36_000.0,
                decayed_at: now,
                ..Ledger::default()
            };
            (format!("team-{t}"), ledger)
        })
        .collect()
}

/// Four GPUs kept free for a QoS class above the one the queue's jobs are
/// in (`reserve_gpus`).
pub(crate) const KEPT_FOR_HIGH: &str =
    "\n[[qos]]\nname = \"normal\"\n\n[[qos]]\nname = \"high\"\npriority = 10\nreserve_gpus = 4\n";

/// A long queue: one batch file of `n_queued` jobs (time to submit it,
/// gpoold's peak and settled memory), then how fast agents start the
/// first `n_measured` of them, against a queue of 2,000. `policy`: teams
/// and QoS classes for gpoold.toml (empty: dev mode's defaults).
pub(crate) fn long_queue(
    n_agents: usize,
    n_gpus: u32,
    n_queued: usize,
    n_measured: usize,
    policy: &str,
) -> anyhow::Result<()> {
    let shape = format!("{n_agents} agents x {n_gpus} GPUs");
    let shape = if policy.is_empty() {
        shape
    } else {
        format!("{shape}, 4 GPUs kept for a higher class")
    };
    for n in [2_000, n_queued] {
        let dir = tempfile::tempdir()?;
        let controller = if policy.is_empty() {
            Controller::start(dir.path())?
        } else {
            Controller::start_with_policy(dir.path(), policy)?
        };
        let batch = dir.path().join("batch.toml");
        write_true_batch(&batch, n)?;
        let started = Instant::now();
        let submitted = gpool(&controller.addr, &["submit", "-f", &batch.display().to_string()])?;
        let submit_secs = started.elapsed().as_secs_f64();
        if count_lines(&submitted.stdout) != n {
            bail!("submit -f printed {} ids", count_lines(&submitted.stdout));
        }
        // Settled: past gpoold's first collection of sled's garbage (every
        // 5 s) and the words of its first whole cycle.
        std::thread::sleep(Duration::from_secs(6));
        report(
            &format!("{n} jobs in one batch file: submit; gpoold peak, then settled RSS"),
            format!(
                "{submit_secs:.2} s; {:.0}, {:.0} MiB",
                controller.status_kib("VmHWM:") as f64 / 1024.0,
                controller.rss_kib() as f64 / 1024.0
            ),
        );
        let measured = n_measured.min(n);
        let started = Instant::now();
        let agents = start_agents(&controller, n_agents, n_gpus)?;
        let deadline = started + Duration::from_secs(600);
        while n_completed(&controller.addr)? < measured {
            if Instant::now() > deadline {
                bail!("{measured} jobs did not complete within 600 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        report(
            &format!("first {measured} of {n} queued `true` jobs through {shape} (from agents' start)"),
            format!("{:.0} jobs/s", measured as f64 / started.elapsed().as_secs_f64()),
        );
        drop(agents);
        controller.stop();
    }
    Ok(())
}
