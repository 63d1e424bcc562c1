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
    let trace = dir.join("trace.csv");
    std::fs::write(&trace, TRACE).unwrap();
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
