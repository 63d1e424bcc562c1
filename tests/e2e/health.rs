//! GPU health end to end: faults injected into simulated GPUs take that GPU
//! (or, with a failing health program, the node) out of service, requeue
//! what ran there, and come back by themselves after the quiet period; an
//! operator's pin stays.

use crate::harness::cluster::Cluster;
use crate::harness::process::wait_until;
use serde_json::Value;
use std::time::Duration;

/// The GPU `index` of `node` as `gpool nodes --output json` shows it.
fn gpu(cluster: &Cluster, node: &str, index: u64) -> Value {
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    let found = nodes
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["name"] == node)
        .expect("the node")
        .clone();
    found["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .find(|g| g["index"] == index)
        .expect("the GPU")
        .clone()
}

fn node_state(cluster: &Cluster, node: &str) -> Value {
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    nodes
        .as_array()
        .expect("nodes")
        .iter()
        .find(|n| n["name"] == node)
        .expect("the node")
        .clone()
}

/// The node and GPUs of a running job's (only) attempt.
fn placement(cluster: &Cluster, id: u64) -> (String, Vec<u64>) {
    let job = cluster.wait_for_state(id, "running");
    let part = &job["placement"][0];
    let gpus = part["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|g| g.as_u64().expect("index"))
        .collect();
    (part["node"].as_str().expect("node").to_string(), gpus)
}

#[test]
fn an_xid_79_takes_out_only_its_gpu_requeues_the_job_elsewhere_and_the_gpu_waits_for_a_reset() {
    let mut cluster = Cluster::with_config("[health]\nquiet_period = \"4s\"\n");
    cluster.start_agent("n1", 2);
    cluster.start_agent("n2", 2);
    let id = cluster.submit(&["--gpus", "2", "--", "sleep", "300"]);
    let (first, gpus) = placement(&cluster, id);
    let other = if first == "n1" { "n2" } else { "n1" };

    // The job's own fault (Xid 13) is kept against the job; the GPU stays.
    cluster
        .gpool(&["admin", "inject", &first, "--gpu", &gpus[0].to_string(), "--xid", "13"])
        .ok();
    wait_until("the job to carry Xid 13", Duration::from_secs(20), || {
        let job = cluster.job(id);
        job["events"]
            .as_array()?
            .iter()
            .any(|e| e["text"].as_str().unwrap_or("").contains("Xid 13"))
            .then_some(())
    });
    assert!(gpu(&cluster, &first, gpus[0])["out_of_service"].is_null());

    // A GPU fallen off the bus leaves service; the job goes to the other node.
    cluster
        .gpool(&["admin", "inject", &first, "--gpu", &gpus[0].to_string(), "--xid", "79"])
        .ok();
    let out = wait_until("the GPU to leave service", Duration::from_secs(20), || {
        let gpu = gpu(&cluster, &first, gpus[0]);
        (!gpu["out_of_service"].is_null()).then_some(gpu)
    });
    assert_eq!(
        out["out_of_service"]["reason"],
        "Xid 79 (GPU has fallen off the bus); out until an operator resets it and runs `gpool resume`"
    );
    assert_eq!(out["out_of_service"]["by_operator"], false);
    assert!(gpu(&cluster, &first, gpus[1])["out_of_service"].is_null());
    assert_ne!(node_state(&cluster, &first)["state"], "drained", "only the GPU is out");
    let moved = wait_until("the job to run on the other node", Duration::from_secs(30), || {
        let job = cluster.job(id);
        (job["state"] == "running" && job["attempt"] == 2).then_some(job)
    });
    assert_eq!(moved["placement"][0]["node"], other);
    // Requeued for the GPU's fault, not preempted: its events say why.
    assert_eq!(moved["requeue_cause"], "gpu_fault", "{moved}");
    assert_eq!(moved["n_preemptions"], 0, "{moved}");
    let events = moved["events"].to_string();
    assert!(
        events.contains(&format!("of {first} left service: Xid 79")) && events.contains("requeued"),
        "{events}"
    );
    let health = cluster.gpool(&["health", &first]);
    let text = health.ok();
    assert!(text.contains("Xid 79 (GPU has fallen off the bus)"), "{text}");
    assert!(text.contains("failed") && text.contains("job_fault"), "{text}");

    // Quiet for longer than the quiet period, it stays out: a GPU fallen
    // off the bus needs a reset. The operator's resume brings it back.
    std::thread::sleep(Duration::from_secs(6));
    assert!(
        !gpu(&cluster, &first, gpus[0])["out_of_service"].is_null(),
        "it waits for a reset"
    );
    cluster.gpool(&["resume", &first, "--gpu", &gpus[0].to_string()]).ok();
    wait_until("the GPU to return", Duration::from_secs(30), || {
        gpu(&cluster, &first, gpus[0])["out_of_service"].is_null().then_some(())
    });
    let log = cluster.gpool(&["health", &first, "--output", "json"]).json();
    let events: Vec<&str> = log[0]["log"]
        .as_array()
        .expect("log")
        .iter()
        .map(|e| e["event"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(events, ["job_fault", "failed", "returned"]);
    cluster.gpool(&["cancel", &id.to_string()]).ok();
}

#[test]
fn an_operators_gpu_drain_stays_until_resumed_and_names_a_missing_gpu() {
    let mut cluster = Cluster::with_config("[health]\nquiet_period = \"1s\"\n");
    cluster.start_agent("n1", 2);
    let drained = cluster.gpool(&["drain", "n1", "--gpu", "1", "--reason", "fan noise"]);
    assert_eq!(drained.ok().trim(), "n1 GPU 1 out of service");
    let missing = cluster.gpool(&["drain", "n1", "--gpu", "7", "--reason", "x"]);
    assert_ne!(missing.code, 0);
    assert!(missing.stderr.contains("node n1 has no GPU 7"), "{}", missing.stderr);
    // Two 1-GPU jobs: one runs on GPU 0, the other waits.
    let a = cluster.submit(&["--gpus", "1", "--", "sleep", "300"]);
    let b = cluster.submit(&["--gpus", "1", "--", "sleep", "300"]);
    assert_eq!(placement(&cluster, a).1, [0]);
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        cluster.job(b)["state"],
        "pending",
        "GPU 1 stays out past the quiet period"
    );
    let out = gpu(&cluster, "n1", 1);
    assert_eq!(out["out_of_service"]["by_operator"], true);
    let table = cluster.gpool(&["nodes"]).ok().to_string();
    assert!(table.contains("GPU 1, drained: fan noise"), "{table}");
    cluster.gpool(&["resume", "n1", "--gpu", "1"]).ok();
    assert_eq!(placement(&cluster, b).1, [1]);
    cluster.gpool(&["cancel", &a.to_string(), &b.to_string()]).ok();
}

#[test]
fn a_failing_health_program_drains_the_node_until_it_passes_again() {
    let mut cluster = Cluster::with_config("[health]\nquiet_period = \"2s\"\n");
    let flag = cluster.dir.path().join("fan-broken");
    std::fs::write(&flag, "").unwrap();
    let program = cluster.dir.path().join("check.sh");
    std::fs::write(
        &program,
        format!(
            "#!/bin/sh\nif [ -e {} ]; then echo 'fan 3 failed'; exit 1; fi\necho ok\n",
            flag.display()
        ),
    )
    .unwrap();
    let mut permissions = std::fs::metadata(&program).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
    std::fs::set_permissions(&program, permissions).unwrap();
    let check = format!(
        "\n[health_check]\nprogram = \"{}\"\ninterval = \"200ms\"\n",
        program.display()
    );
    cluster.start_agent_with("n1", 2, &check);
    let node = wait_until("the node to drain", Duration::from_secs(20), || {
        let node = node_state(&cluster, "n1");
        (node["state"] == "drained").then_some(node)
    });
    assert_eq!(
        node["drain_reason"],
        "health program failed: exited with 1: fan 3 failed"
    );
    assert_eq!(node["drained_by_health"], true);
    let id = cluster.submit(&["--gpus", "1", "--", "true"]);
    std::fs::remove_file(&flag).unwrap();
    wait_until("the node to return", Duration::from_secs(30), || {
        (node_state(&cluster, "n1")["state"] != "drained").then_some(())
    });
    cluster.wait_for_state(id, "completed");
    let text = cluster.gpool(&["health"]).ok().to_string();
    assert!(
        text.contains("health program failed") && text.contains("returned"),
        "{text}"
    );
}

#[test]
fn a_vanished_gpu_and_a_hot_one_leave_service_and_come_back_when_quiet() {
    let mut cluster = Cluster::with_config("[health]\nquiet_period = \"2s\"\nhot_for = \"1s\"\nmissing_for = \"1s\"\n");
    cluster.start_agent("n1", 2);
    cluster.gpool(&["admin", "inject", "n1", "--gpu", "0", "--vanish"]).ok();
    cluster
        .gpool(&["admin", "inject", "n1", "--gpu", "1", "--temp", "97"])
        .ok();
    let reasons = wait_until("both GPUs to leave service", Duration::from_secs(20), || {
        let (vanished, hot) = (gpu(&cluster, "n1", 0), gpu(&cluster, "n1", 1));
        let reasons = (
            vanished["out_of_service"]["reason"].as_str()?.to_string(),
            hot["out_of_service"]["reason"].as_str()?.to_string(),
        );
        Some(reasons)
    });
    assert!(
        reasons.0.starts_with("missing from its node's readings"),
        "{}",
        reasons.0
    );
    assert!(reasons.1.starts_with("97 °C, at or above 90 °C for"), "{}", reasons.1);
    // The node itself stays up: capacity shrinks, with the reason shown.
    let table = cluster.gpool(&["nodes"]).ok().to_string();
    assert!(table.contains("GPU 0: missing from its node's readings"), "{table}");
    let summary = cluster.gpool(&["nodes", "--summary", "--output", "json"]).json();
    assert_eq!(summary[0]["gpus_unavailable"], 2);
    assert_eq!(summary[0]["startable"]["jobs"][0], 0);
    // Back in the readings and cool: both return after the quiet period.
    cluster.gpool(&["admin", "inject", "n1", "--gpu", "0", "--back"]).ok();
    cluster
        .gpool(&["admin", "inject", "n1", "--gpu", "1", "--temp", "40"])
        .ok();
    wait_until("both GPUs to return", Duration::from_secs(30), || {
        (gpu(&cluster, "n1", 0)["out_of_service"].is_null() && gpu(&cluster, "n1", 1)["out_of_service"].is_null())
            .then_some(())
    });
    // Only admins inject faults; the refusal says so.
    let nobody = nix::unistd::User::from_name("nobody").unwrap().expect("user nobody");
    let refused = cluster.gpool_as(
        &nobody,
        &cluster.cli_server,
        &["admin", "inject", "n1", "--gpu", "0", "--xid", "79"],
    );
    assert_ne!(refused.code, 0);
    assert!(refused.stderr.contains("only admins may"), "{}", refused.stderr);
}
