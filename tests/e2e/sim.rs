//! `gpool sim`: a trace replayed through the real scheduler under several
//! policies, from the real CLI; and a pool's own history exported as a
//! trace and replayed.

use crate::harness::cluster::{gpool_command, Cluster, Run};
use serde_json::Value;

/// Four jobs worked out by hand (see gpool-core's sim tests): on one node
/// of 2 GPUs, fifo waits 0, 0, 90 and 180 s; gpool lets team a (within its
/// guarantee) go before b's 2-GPU burst job.
const TRACE: &str = "submit,duration,gpus_per_node,nodes,team\n\
                     2026-11-23T10:00:00Z,100,1,1,a\n\
                     2026-11-23T10:00:00Z,100,1,1,a\n\
                     2026-11-23T10:00:10Z,100,2,1,b\n\
                     2026-11-23T10:00:20Z,50,1,1,a\n";

fn sim(dir: &std::path::Path, extra: &[&str]) -> Run {
    sim_of(dir, TRACE, extra)
}

/// `gpool sim` of the trace `text` on one node of 2 GPUs.
fn sim_of(dir: &std::path::Path, text: &str, extra: &[&str]) -> Run {
    let trace = dir.join("trace.csv");
    std::fs::write(&trace, text).unwrap();
    let mut args = vec![
        "sim",
        "--trace",
        trace.to_str().unwrap(),
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
    ];
    args.extend_from_slice(extra);
    gpool_command(&args).output().expect("run gpool sim").into()
}

fn policy<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["policies"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["policy"] == name)
        .unwrap_or_else(|| panic!("no {name} in {report}"))
}

#[test]
fn sim_compares_policies_deterministically_and_plots_them() {
    let dir = Cluster::temp_dir();
    let first = sim(dir.path(), &["--output", "json"]);
    first.ok();
    let mut report = first.json();
    assert_eq!(policy(&report, "fifo")["queue_delay"]["mean"], 67.5);
    assert_eq!(policy(&report, "gpool")["queue_delay"]["mean"], 55.0);
    assert_eq!(policy(&report, "dedicated")["never_started"], 1);
    assert_eq!(policy(&report, "fifo")["overcommits"], 0);
    // The same run again gives the same report, except wall-clock timing.
    let mut again = sim(dir.path(), &["--output", "json"]).json();
    report.as_object_mut().unwrap().remove("timing");
    again.as_object_mut().unwrap().remove("timing");
    assert_eq!(report, again);

    let plots = dir.path().join("plots");
    let table = sim(dir.path(), &["--plot", plots.to_str().unwrap()]);
    let text = table.ok();
    assert!(text.contains("queueing delay, mean"), "{text}");
    assert!(text.contains("Savings:"), "{text}");
    for chart in ["allocation.svg", "queue.svg", "teams.svg"] {
        let svg = std::fs::read_to_string(plots.join(chart)).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("<polyline"),
            "{chart}: {svg:.200}"
        );
    }
}

/// An Alibaba-style trace: one lab's notebooks and inference replicas
/// asking for parts of one GPU (`gpu_milli`) beside a whole-GPU training
/// job, on one node of 2 H100s. Packed, the six fractions fill one GPU
/// exactly and none waits; rounded up to whole GPUs, they queue behind
/// each other.
#[test]
fn sim_shows_what_packing_fractions_gains_over_whole_gpus() {
    let dir = Cluster::temp_dir();
    let mut text = String::from("submit,duration,gpus_per_node,nodes,team,user,gpu_milli\n");
    for (at, milli, team) in [
        (0, 250, "vision"),
        (0, 250, "vision"),
        (0, 100, "nlp"),
        (10, 200, "nlp"),
        (10, 100, "vision"),
        (20, 100, "nlp"),
    ] {
        text.push_str(&format!("2026-11-23T10:00:{at:02}Z,600,1,1,{team},lab,{milli}\n"));
    }
    text.push_str("2026-11-23T10:00:00Z,600,1,1,vision,trainer,1000\n");
    let compare = ["--compare", "gpool,gpool-whole"];
    let report = sim_of(dir.path(), &text, &[&compare[..], &["--output", "json"]].concat()).json();
    let (packed, whole) = (policy(&report, "gpool"), policy(&report, "gpool-whole"));
    assert_eq!(packed["queue_delay"]["mean"], 0.0, "{packed:#}");
    assert!(whole["queue_delay"]["mean"].as_f64().unwrap() > 300.0, "{whole:#}");
    assert_eq!(packed["fractions"]["jobs"], 6);
    let held = |p: &Value| p["fractions"]["held_gpu_hours"].as_f64().unwrap();
    // One GPU, from the first fraction's start to the last one's end.
    assert!((held(packed) - 620.0 / 3600.0).abs() < 1e-6, "{packed:#}");
    assert!((held(whole) - 6.0 * 600.0 / 3600.0).abs() < 1e-6, "{whole:#}");
    for p in [packed, whole] {
        assert_eq!(
            (p["overcommits"].as_u64(), p["invariant_violations"].as_u64()),
            (Some(0), Some(0))
        );
    }
    let table = sim_of(dir.path(), &text, &compare);
    assert!(table.ok().contains("fractions of a GPU, GPU-hours"), "{}", table.stdout);
    // A fraction of a gang is refused, naming the line and the field.
    let gang = "submit,duration,gpus_per_node,nodes,team,gpu_milli\n2026-11-23T10:00:00Z,60,2,1,a,500\n";
    let bad = sim_of(dir.path(), gang, &compare);
    assert_ne!(bad.code, 0);
    assert!(bad.stderr.contains("gpu_milli"), "{}", bad.stderr);
}

#[test]
fn sim_names_bad_input() {
    let dir = Cluster::temp_dir();
    let bad = sim(dir.path(), &["--format", "slurm"]);
    assert_eq!(bad.code, 2);
    assert!(
        bad.stderr.contains("--format: \"slurm\" is not philly or gpool"),
        "{}",
        bad.stderr
    );
    let bad = sim(dir.path(), &["--compare", "fifo,lottery"]);
    assert_eq!(bad.code, 2);
    assert!(bad.stderr.contains("--compare: \"lottery\""), "{}", bad.stderr);
    let cluster = dir.path().join("cluster.toml");
    std::fs::write(
        &cluster,
        "[[nodes]]\ncount = 1\ngpus = 2\nmodel = \"l4\"\nlinks = \"ring\"\n",
    )
    .unwrap();
    let trace = dir.path().join("trace.csv");
    let bad: Run = gpool_command(&[
        "sim",
        "--trace",
        trace.to_str().unwrap(),
        "--cluster",
        cluster.to_str().unwrap(),
    ])
    .output()
    .unwrap()
    .into();
    assert_eq!(bad.code, 2);
    assert!(
        bad.stderr.contains("cluster.toml:1: nodes.links: \"ring\""),
        "{}",
        bad.stderr
    );
    // The example cluster file is a valid one.
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/cluster-philly.toml");
    let good: Run = gpool_command(&[
        "sim",
        "--trace",
        trace.to_str().unwrap(),
        "--cluster",
        example,
        "--output",
        "json",
    ])
    .output()
    .unwrap()
    .into();
    good.ok();
    assert_eq!(good.json()["cluster"]["gpus"], 376);
}

#[test]
fn a_pools_history_exports_as_a_trace_that_sim_replays() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 2);
    let a = cluster.submit(&["--gpus", "1", "--team", "ml", "--", "sleep", "0.3"]);
    let b = cluster.submit(&["--gpus", "2", "--", "true"]);
    cluster.wait_for_state(a, "completed");
    cluster.wait_for_state(b, "completed");
    let csv = cluster
        .gpool(&["history", "--all-users", "--export-trace"])
        .ok()
        .to_string();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 3, "{csv}");
    assert!(
        lines[0].starts_with("submit,duration,gpus_per_node,nodes,team"),
        "{csv}"
    );
    assert!(lines.iter().any(|l| l.contains(",1,1,ml,")), "{csv}");
    let trace = cluster.dir.path().join("history.csv");
    std::fs::write(&trace, &csv).unwrap();
    let report: Run = gpool_command(&[
        "sim",
        "--trace",
        trace.to_str().unwrap(),
        "--nodes",
        "1",
        "--output",
        "json",
    ])
    .output()
    .unwrap()
    .into();
    report.ok();
    let report = report.json();
    assert_eq!(report["trace"]["jobs"], 2);
    assert_eq!(policy(&report, "fifo")["completed"], 2);
}

/// A policy file written only for `gpool sim` needs no `listen` or
/// `state_dir`, and takes `min_runtime = "0s"`; jobs no policy could start
/// are named at load and left out of the savings search, which starts at
/// the pool's own size.
#[test]
fn sim_names_impossible_jobs_and_takes_a_policy_only_file() {
    let dir = Cluster::temp_dir();
    let policy = dir.path().join("policy.toml");
    std::fs::write(
        &policy,
        "[[team]]\nname = \"a\"\nguaranteed_gpus = 1\n\n[[team]]\nname = \"b\"\nguaranteed_gpus = 1\n\n[[qos]]\nname = \"normal\"\nmin_runtime = \"0s\"\n",
    )
    .unwrap();
    let trace = dir.path().join("trace.csv");
    std::fs::write(
        &trace,
        "submit,duration,gpus_per_node,nodes,team,gpu_types\n\
         2026-11-23T10:00:00Z,100,1,1,a,\n\
         2026-11-23T10:00:00Z,100,1,1,b,\n\
         2026-11-23T10:00:10Z,100,4,1,a,\n\
         2026-11-23T10:00:20Z,100,1,1,b,a10\n",
    )
    .unwrap();
    let run: Run = gpool_command(&[
        "sim",
        "--trace",
        trace.to_str().unwrap(),
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--policy",
        policy.to_str().unwrap(),
    ])
    .output()
    .expect("run gpool sim")
    .into();
    let text = run.ok();
    assert!(
        run.stderr.contains("2 job(s)") && run.stderr.contains("can never start on this cluster"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("wants 4 GPU(s) of any model"), "{}", run.stderr);
    assert!(run.stderr.contains("wants 1 GPU(s) of a10"), "{}", run.stderr);
    // Dedicated partitions of 1 GPU per team already wait as little as
    // the pool does on what can run: no saving is claimed.
    assert!(
        text.contains("x1.00") && text.contains("pooling saves no GPUs"),
        "{text}"
    );
}

/// Off a terminal (a CI log, a script), each replay says how far it is on
/// stderr in plain lines, with no escape codes, and that it is done.
#[test]
fn sim_prints_plain_progress_lines_off_a_terminal() {
    let dir = Cluster::temp_dir();
    let run = sim(dir.path(), &["--no-savings"]);
    run.ok();
    for policy in ["dedicated", "fifo", "gpool"] {
        assert!(
            run.stderr
                .contains(&format!("sim: {policy}: 0% of the trace (simulated hour 1 of 1), ")),
            "{}",
            run.stderr
        );
        assert!(run.stderr.contains(&format!("sim: {policy}: done, ")), "{}", run.stderr);
    }
    assert!(!run.stderr.contains('\u{1b}'), "{}", run.stderr);
}

/// A trace whose demand comes and goes: a 10-hour job fills the node, a
/// second waits for it, and the last arrives days later. Allocation is
/// low while jobs waited hours, and the report says why, from what it
/// measured: the idle GPU-hours fell while no job waited.
#[test]
fn sim_says_why_allocation_is_low_while_jobs_wait() {
    let dir = Cluster::temp_dir();
    let trace = dir.path().join("bursts.csv");
    std::fs::write(
        &trace,
        "submit,duration,gpus_per_node,nodes,team\n\
         2026-11-23T00:00:00Z,36000,2,1,a\n\
         2026-11-23T00:01:00Z,3600,2,1,a\n\
         2026-11-27T00:00:00Z,3600,1,1,a\n",
    )
    .unwrap();
    let args = [
        "sim",
        "--trace",
        trace.to_str().unwrap(),
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--compare",
        "fifo",
    ];
    let table: Run = gpool_command(&args).output().expect("run gpool sim").into();
    let text = table.ok();
    assert!(
        text.contains("note: fifo: ") && text.contains("demand came and went"),
        "{text}"
    );
    let mut json_args = args.to_vec();
    json_args.extend(["--output", "json"]);
    let report: Run = gpool_command(&json_args).output().expect("run gpool sim").into();
    report.ok();
    let report = report.json();
    let note = report["notes"]["fifo"].as_str().unwrap_or_else(|| panic!("{report}"));
    assert!(
        note.contains("of the idle GPU-hours fell in time slices in which no job waited"),
        "{note}"
    );
    assert!(text.contains(note), "{text}");
}

/// A heterogeneous fleet: 4 nodes of 8 H100s, 6 of 4 A100s, 8 of 4 L4s
/// and 4 of 8 V100s (120 GPUs).
const FLEET: &str = "[[nodes]]\ncount = 4\ngpus = 8\nmodel = \"h100\"\nprefix = \"h\"\nlinks = \"nvswitch\"\n\n\
                     [[nodes]]\ncount = 6\ngpus = 4\nmodel = \"a100\"\nprefix = \"a\"\n\n\
                     [[nodes]]\ncount = 8\ngpus = 4\nmodel = \"l4\"\nprefix = \"l\"\n\n\
                     [[nodes]]\ncount = 4\ngpus = 8\nmodel = \"v100\"\nprefix = \"v\"\n";

/// The fill's jobs by class: the models each allows (empty: any), its
/// GPUs, and how many. H100 and A100 jobs ask for more than those models
/// have; L4 and V100 jobs for less. None ends within the replay.
const FILL_CLASSES: [(&[&str], u32, usize); 6] = [
    (&["h100"], 8, 3),
    (&["h100"], 1, 12),
    (&["a100", "h100"], 4, 8),
    (&["l4"], 2, 10),
    (&["l4", "v100"], 1, 20),
    (&[], 4, 4),
];

/// The fill's trace: the classes interleaved, one job every 10 s, each
/// running 20 million seconds; and each job's allowed models, by job id.
fn fill_trace() -> (String, Vec<Vec<&'static str>>) {
    let mut text = String::from("submit,duration,gpus_per_node,nodes,team,gpu_types\n");
    let mut allowed = Vec::new();
    let rounds = FILL_CLASSES.iter().map(|(_, _, n)| *n).max().unwrap_or(0);
    for round in 0..rounds {
        for (models, gpus, n) in FILL_CLASSES {
            if round < n {
                let i = allowed.len();
                let team = ["a", "b"][i % 2];
                text += &format!(
                    "{},20000000,{gpus},1,{team},{}\n",
                    1_700_000_000 + i * 10,
                    models.join("|")
                );
                allowed.push(models.to_vec());
            }
        }
    }
    (text, allowed)
}

/// The most GPUs the fill's jobs could hold at once, were each divisible:
/// the max flow from the jobs (as much as each class asks) through the
/// models each class allows to the models' GPUs (Edmonds-Karp).
fn max_flow_bound(models: &[(&str, u64)]) -> u64 {
    // Vertices: 0 the source, 1..=classes, then the models, then the sink.
    let n_classes = FILL_CLASSES.len();
    let sink = 1 + n_classes + models.len();
    let mut capacity = vec![vec![0u64; sink + 1]; sink + 1];
    for (class_idx, (allowed, gpus, n)) in FILL_CLASSES.iter().enumerate() {
        capacity[0][1 + class_idx] = u64::from(*gpus) * *n as u64;
        for (model_idx, (model, _)) in models.iter().enumerate() {
            if allowed.is_empty() || allowed.contains(model) {
                capacity[1 + class_idx][1 + n_classes + model_idx] = u64::MAX / 4;
            }
        }
    }
    for (model_idx, (_, gpus)) in models.iter().enumerate() {
        capacity[1 + n_classes + model_idx][sink] = *gpus;
    }
    let mut flow = 0;
    loop {
        // The shortest augmenting path, by breadth-first search.
        let mut came_from = vec![None; sink + 1];
        came_from[0] = Some(0);
        let mut queue = std::collections::VecDeque::from([0usize]);
        while let Some(at) = queue.pop_front() {
            for next in 0..=sink {
                if came_from[next].is_none() && capacity[at][next] > 0 {
                    came_from[next] = Some(at);
                    queue.push_back(next);
                }
            }
        }
        if came_from[sink].is_none() {
            return flow;
        }
        let mut path = Vec::new();
        let mut at = sink;
        while at != 0 {
            let before = came_from[at].unwrap();
            path.push((before, at));
            at = before;
        }
        let pushed = path.iter().map(|(a, b)| capacity[*a][*b]).min().unwrap();
        for (a, b) in path {
            capacity[a][b] -= pushed;
            capacity[b][a] += pushed;
        }
        flow += pushed;
    }
}

/// A fill: type-constrained jobs on a heterogeneous fleet, none ending.
/// Under fifo and gpool the GPUs held at the peak reach the max-flow bound
/// the test computes, `--jobs-out` shows every attempt on GPUs of a model
/// its job allows, no invariant breaks, and the replay of 20 million
/// seconds jumps over its quiet stretches (a few cycles, charts of a few
/// hundred KB).
#[test]
fn a_fill_reaches_the_max_flow_bound_on_allowed_models_only() {
    let dir = Cluster::temp_dir();
    let (trace_text, allowed) = fill_trace();
    let (trace, fleet) = (dir.path().join("fill.csv"), dir.path().join("fleet.toml"));
    let (jobs_out, plots) = (dir.path().join("jobs.csv"), dir.path().join("plots"));
    std::fs::write(&trace, trace_text).unwrap();
    std::fs::write(&fleet, FLEET).unwrap();
    let bound = max_flow_bound(&[("h100", 32), ("a100", 24), ("l4", 32), ("v100", 32)]);
    let run: Run = gpool_command(&[
        "sim",
        "--trace",
        trace.to_str().unwrap(),
        "--cluster",
        fleet.to_str().unwrap(),
        "--compare",
        "fifo,gpool",
        "--no-savings",
        "--output",
        "json",
        "--jobs-out",
        jobs_out.to_str().unwrap(),
        "--plot",
        plots.to_str().unwrap(),
    ])
    .output()
    .expect("run gpool sim")
    .into();
    run.ok();
    let report = run.json();
    assert!(bound < 120, "the bound leaves GPUs no job may use: {bound}");
    for name in ["fifo", "gpool"] {
        let outcome = policy(&report, name);
        assert_eq!(outcome["peak_held"], bound, "{name}: {outcome}");
        assert_eq!(outcome["invariant_violations"], 0, "{name}");
        assert!(
            outcome["cycles"].as_u64().unwrap() < 1_000,
            "{name}: {}",
            outcome["cycles"]
        );
        assert!(outcome["held_at_first_rejection"].as_u64().unwrap() <= bound, "{name}");
    }
    let csv = std::fs::read_to_string(&jobs_out).unwrap();
    let mut rows = csv.lines();
    assert!(rows
        .next()
        .unwrap()
        .starts_with("policy,job,attempt,team,submit,start,end,nodes,gpu_model,gpus"));
    let mut n_started = 0;
    for row in rows {
        let cells: Vec<&str> = row.split(',').collect();
        let (job, models, state) = (cells[1].parse::<usize>().unwrap(), cells[8], cells[10]);
        let wanted = &allowed[job - 1];
        if state != "never_started" {
            n_started += 1;
            assert!(
                models
                    .split('|')
                    .all(|model| wanted.is_empty() || wanted.contains(&model)),
                "job {job} allows {wanted:?}, ran on {models}: {row}"
            );
        }
    }
    assert!(n_started > 0, "{csv}");
    for chart in ["allocation.svg", "queue.svg", "teams.svg"] {
        let bytes = std::fs::metadata(plots.join(chart)).unwrap().len();
        assert!(bytes < 1_000_000, "{chart}: {bytes} bytes");
    }
}
