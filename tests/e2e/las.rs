//! Least-attained-service order within a team, as a pool runs it: the
//! shipped gpoold.toml (LAS on by default) with its first threshold brought
//! down to 7.2 GPU-seconds so that a test can cross it; H100, A100
//! (tier=inference) and L4 nodes. Team vision's long job holds the L4s and
//! checkpoints when told; vision's fresh job takes them back, nlp's array
//! on the H100s is left alone, and the served job runs again afterwards.

use crate::harness::cluster::Cluster;
use crate::harness::process::{binary, wait_until};
use crate::preemption::{agent_config, shipped_config, NODES};
use std::time::Duration;

/// The shipped config with LAS queues a test can reach: one threshold at
/// 0.002 GPU-hours (the shipped 1 GPU-hour takes an hour on one GPU); its
/// promotion (32 times the run: a minute or more here) and `max_lost` (2
/// minutes) as shipped.
fn config() -> String {
    format!("{}\n[sharing.las]\nthresholds_gpu_hours = [0.002]\n", shipped_config())
}

/// Submits a job of team vision on every L4 (`--qos low`: no minimum
/// runtime) that runs `script`.
fn vision_on_the_l4s(cluster: &Cluster, script: &str) -> u64 {
    cluster.submit(&[
        "--team",
        "vision",
        "--qos",
        "low",
        "--gpu-type",
        "l4",
        "--gpus",
        "4",
        "--",
        "sh",
        "-c",
        script,
    ])
}

fn why(cluster: &Cluster, id: u64) -> serde_json::Value {
    let run = cluster.gpool(&["why", &id.to_string(), "--output", "json"]);
    run.ok();
    run.json()
}

#[test]
fn a_teams_fresh_job_takes_the_gpus_of_its_more_served_job_and_nobody_elses() {
    let mut cluster = Cluster::with_config(&config());
    for (node, model, count, memory_mib, labels) in NODES {
        cluster.start_agent_with(node, 0, &agent_config(model, count, memory_mib, labels));
    }
    let gpool = binary("gpool").display().to_string();
    // nlp's array on the H100s, at its guarantee of 4: served as long as
    // vision's job, and another team's.
    let hold = "touch $GPOOL_JOB_ID-$GPOOL_RESTART_COUNT; while [ ! -e release ]; do sleep 0.2; done";
    cluster.submit(&[
        "--team",
        "nlp",
        "--qos",
        "low",
        "--gpu-type",
        "h100",
        "-a",
        "0-3",
        "--",
        "sh",
        "-c",
        hold,
    ]);
    // vision's long job on every L4, which checkpoints when told.
    let long = format!(
        "trap 'echo step > \"$GPOOL_CHECKPOINT_DIR/state\"; {gpool} checkpoint; exit 0' USR1; \
         touch long-$GPOOL_RESTART_COUNT; while [ ! -e release ]; do sleep 0.2; done"
    );
    let served = vision_on_the_l4s(&cluster, &long);
    cluster.wait_for_state(served, "running");
    let dir = cluster.dir.path().to_path_buf();
    wait_until("the long job to set its trap", Duration::from_secs(30), || {
        dir.join("long-0").exists().then_some(())
    });
    // 4 GPUs for 2 s: past the threshold, in queue 1.
    wait_until(
        "the long job to pass its queue's threshold",
        Duration::from_secs(30),
        || (why(&cluster, served)["las_queue"] == 1).then_some(()),
    );
    let fresh = vision_on_the_l4s(&cluster, hold);
    cluster.wait_for_state(fresh, "running");
    let victim = cluster.wait_for_state(served, "pending");
    assert_eq!(victim["n_preemptions"], 1, "{victim}");
    assert_eq!(victim["requeue_cause"], "preempted", "{victim}");
    assert!(
        victim["events"]
            .to_string()
            .contains(&format!("preempted for job {fresh}")),
        "{victim}"
    );
    // It waits in queue 1 with the service it had; the fresh job does not
    // trade places with it, and nlp's tasks all run their first attempt.
    let standing = why(&cluster, served);
    assert_eq!(standing["las_queue"], 1, "{standing}");
    assert!(standing["service_gpu_secs"].as_u64().unwrap_or(0) >= 8, "{standing}");
    let text = cluster.gpool(&["why", &served.to_string()]);
    assert!(text.ok().contains("LAS queue 1 of its team"), "{}", text.ok());
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(cluster.job(fresh)["state"], "running");
    assert_eq!(cluster.job(fresh)["n_preemptions"], 0);
    let jobs = cluster.gpool(&["jobs", "-r", "--all", "--output", "json"]).json();
    let nlp: Vec<&serde_json::Value> = jobs
        .as_array()
        .expect("a list")
        .iter()
        .filter(|job| job["team"] == "nlp" && job["array"].is_null())
        .collect();
    assert_eq!(nlp.len(), 4, "{jobs}");
    assert!(
        nlp.iter()
            .all(|job| job["state"] == "running" && job["n_preemptions"] == 0),
        "{jobs}"
    );
    // Once the fresh job ends, the served one runs again, from its
    // checkpoint, and ends.
    std::fs::write(dir.join("release"), "").expect("release");
    cluster.wait_for_state(fresh, "completed");
    wait_until("the served job to end", Duration::from_secs(60), || {
        (cluster.job(served)["state"] == "completed").then_some(())
    });
    assert!(dir.join("long-1").exists(), "it ran a second attempt");
    cluster.assert_plans_sound();
}
