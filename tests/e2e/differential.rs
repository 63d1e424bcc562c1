//! One workload, two schedulers: gpoold with real agents under the shipped
//! config, then `gpool sim` replaying gpoold's own history export on the
//! same fleet under the same config. Both call `cycle::plan`; this shows
//! that what each builds around it (the view, the carrying out of starts
//! and preemptions) leads to the same decisions for every job: how many
//! attempts, which ended preempted, on which GPU model and how many GPUs.

use crate::harness::cluster::Cluster;
use crate::harness::process::wait_until;
use crate::preemption::{agent_config, shipped_config, NODES};
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::Duration;

/// What one job went through: its team, size, the model of its GPUs
/// where it asked for one (`any` where it did not: which of several free
/// models such a job lands on depends on the order in which GPUs came
/// free within a few ms, which a replay of one trace cannot reproduce),
/// and how each attempt ended (`preempted`, `completed`).
type Story = (String, u64, String, Vec<String>);

/// Each job's story as gpoold's history tells it, from `jobs --all`
/// (tasks, not their arrays).
fn stories_of_gpoold(cluster: &Cluster) -> Vec<Story> {
    let jobs = cluster.gpool(&["jobs", "-r", "--all", "--output", "json"]).json();
    let mut stories: Vec<Story> = jobs
        .as_array()
        .expect("a list")
        .iter()
        .filter(|job| job["array"].is_null())
        .map(|job| {
            let preempted = job["n_preemptions"].as_u64().unwrap_or(0) as usize;
            let mut ends = vec!["preempted".to_string(); preempted];
            ends.push(job["state"].as_str().unwrap_or("?").to_string());
            let gpus = job["gpus_total"].as_u64().unwrap_or(0);
            let asked = job["gpu_types"].as_array().is_some_and(|types| !types.is_empty());
            let model = if asked { model_of(job) } else { "any".to_string() };
            (text(&job["team"]), gpus, model, ends)
        })
        .collect();
    stories.sort();
    stories
}

/// One line a story.
fn render(stories: &[Story]) -> String {
    let lines: Vec<String> = stories
        .iter()
        .map(|(team, gpus, model, ends)| format!("{team} {gpus}x{model} {}", ends.join(" ")))
        .collect();
    lines.join("\n")
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or_default().to_string()
}

/// The model of the GPUs a job last ran on: its first node's, from the
/// fleet.
fn model_of(job: &Value) -> String {
    let node = job["node_list"][0].as_str().unwrap_or_default();
    NODES
        .iter()
        .find(|(name, ..)| *name == node)
        .map_or(format!("? (node {node:?})"), |(_, model, ..)| model.to_string())
}

/// Each job's story in `gpool sim --jobs-out` (one row per attempt) of
/// `trace` (job N is its Nth row).
fn stories_of_sim(jobs_csv: &str, trace: &str) -> Vec<Story> {
    let mut rows = csv::Reader::from_reader(trace.as_bytes());
    let types = rows.headers().expect("a header").iter().position(|c| c == "gpu_types");
    let asked: Vec<bool> = rows
        .records()
        .map(|row| types.is_some_and(|at| !row.expect("a row")[at].is_empty()))
        .collect();
    let mut by_job: BTreeMap<u64, Story> = BTreeMap::new();
    let mut reader = csv::Reader::from_reader(jobs_csv.as_bytes());
    let header = reader.headers().expect("a header").clone();
    let column = |name: &str| header.iter().position(|c| c == name).expect(name);
    let (job, team, model, gpus, end) = (
        column("job"),
        column("team"),
        column("gpu_model"),
        column("gpus"),
        column("end_state"),
    );
    for row in reader.records() {
        let row = row.expect("a row");
        let id: usize = row[job].parse().expect("job");
        let story = by_job.entry(id as u64).or_default();
        story.0 = row[team].to_string();
        story.1 = row[gpus].parse().expect("gpus");
        story.2 = if asked[id - 1] {
            row[model].to_string()
        } else {
            "any".to_string()
        };
        story.3.push(row[end].to_string());
    }
    let mut stories: Vec<Story> = by_job.into_values().collect();
    stories.sort();
    stories
}

/// The shipped config on H100, A100 and L4 nodes. Team nlp's low-QoS array
/// of 21 tasks fills the fleet but for 7 GPUs; team vision's array of 10
/// guaranteed tasks then takes one of them back (its task that waits on
/// it starts on its GPU); a separate nlp job on an L4 waits for one, and
/// a 2-node H100 gang of vision's comes once all have ended. gpoold runs it with real agents; `gpool sim`
/// replays gpoold's history export of it. Every job has the same story in
/// both, and neither scheduler broke an invariant.
#[test]
fn gpoold_and_the_simulator_decide_alike_on_one_workload() {
    let mut cluster = Cluster::with_config(&shipped_config());
    for (node, model, count, memory_mib, labels) in NODES {
        cluster.start_agent_with(node, 0, &agent_config(model, count, memory_mib, labels));
    }
    cluster.submit(&["--team", "nlp", "--qos", "low", "-a", "0-20", "--", "sleep", "8"]);
    wait_until("nlp's 21 tasks to run", Duration::from_secs(60), || {
        let jobs = cluster.gpool(&["jobs", "-r", "--output", "json"]).json();
        let running = jobs.as_array()?.iter().filter(|j| j["state"] == "running").count();
        (running == 21).then_some(())
    });
    cluster.submit(&["--team", "vision", "-a", "0-9", "--", "sleep", "3"]);
    std::thread::sleep(Duration::from_secs(1));
    cluster.submit(&["--team", "nlp", "--gpu-type", "l4", "--", "sleep", "1"]);
    let all_ended = |n: usize| {
        move |cluster: &Cluster| {
            let stories = stories_of_gpoold(cluster);
            (stories.len() == n && stories.iter().all(|s| s.3.last().is_some_and(|e| e == "completed"))).then_some(())
        }
    };
    wait_until("the arrays and the job to end", Duration::from_secs(120), || {
        all_ended(32)(&cluster)
    });
    // The gang comes to an idle fleet: where its start met ends of others
    // within milliseconds, which GPUs it found free (and so how many
    // victims it took) turned on their order, which no trace carries.
    let gang = [
        "--team",
        "vision",
        "--nodes",
        "2",
        "--gpus",
        "4",
        "--gpu-type",
        "h100",
        "--",
        "sleep",
        "2",
    ];
    cluster.submit(&gang);
    wait_until("the gang to end", Duration::from_secs(60), || all_ended(33)(&cluster));
    let real = stories_of_gpoold(&cluster);
    cluster.assert_plans_sound();
    let victims = real.iter().filter(|s| s.3.len() > 1).count();
    assert_eq!(victims, 1, "one nlp task taken back:\n{}", render(&real));

    let dir = &cluster.dir;
    let csv = cluster
        .gpool(&["history", "--all-users", "--export-trace"])
        .ok()
        .to_string();
    let (trace, jobs_out) = (dir.path().join("history.csv"), dir.path().join("sim-jobs.csv"));
    std::fs::write(&trace, &csv).expect("trace");
    let config = dir.path().join("sim-gpoold.toml");
    std::fs::write(&config, crate::preemption::shipped_policy()).expect("config");
    let jobs_out_arg = jobs_out.to_str().expect("a path");
    crate::preemption::replay_on_the_fleet(
        dir.path(),
        &trace,
        &config,
        &["--tick", "1s", "--jobs-out", jobs_out_arg],
    );
    let jobs_csv = std::fs::read_to_string(&jobs_out).expect("the sim's jobs");
    let simulated = stories_of_sim(&jobs_csv, &csv);
    assert_eq!(
        render(&real),
        render(&simulated),
        "gpoold (left) against gpool sim (right), per job\ntrace:\n{csv}\nsim:\n{jobs_csv}"
    );
}
