//! The agent's NVML path, run as on a GPU node: the agent loads the
//! stand-in NVML library this workspace builds (a real shared library with
//! NVML's C ABI), whose GPUs come from a fixture file. Everything after the
//! library is the code a GPU node runs.

use crate::harness::cluster::Cluster;
use crate::harness::process::{binary, nvml_fixture, nvml_standin, output_within, wait_until};
use serde_json::Value;
use std::time::Duration;

/// `gpool-agent --discover` on a fixture: what the node would register.
fn discover(fixture: &std::path::Path) -> Value {
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("agent.toml");
    let text = format!(
        "controller = \"127.0.0.1:1\"\nnode_name = \"gpu-01\"\nspool_dir = \"{}\"\nnvml_library = \"{}\"\n",
        dir.path().join("spool").display(),
        nvml_standin().display()
    );
    std::fs::write(&config, text).expect("write agent.toml");
    let child = std::process::Command::new(binary("gpool-agent"))
        .arg("--config")
        .arg(&config)
        .arg("--discover")
        .env("GPOOL_NVML_STANDIN", fixture)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run gpool-agent --discover");
    let output = output_within(child, "gpool-agent --discover", Duration::from_secs(30));
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|err| {
        panic!("{err}: {}", String::from_utf8_lossy(&output.stdout));
    })
}

fn models(found: &Value) -> Vec<String> {
    found["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|gpu| gpu["model"].as_str().unwrap().to_string())
        .collect()
}

fn link(found: &Value, a: u64, b: u64) -> String {
    found["links"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l[0] == a && l[1] == b)
        .map(|l| l[2].as_str().unwrap().to_string())
        .unwrap_or_default()
}

/// Each fixture reads as its kind of node: a DGX H100's GPUs all joined
/// through NVSwitch, A100s with two in MIG mode offered as their slices,
/// a PCIe box of L4s placed by PCIe switch and NUMA node, and a driver too
/// old for some calls read without them.
#[test]
fn each_kind_of_node_is_discovered_through_nvml() {
    let dgx = discover(&nvml_fixture("dgx-h100"));
    assert_eq!(dgx["source"], "nvml", "{dgx}");
    assert_eq!(models(&dgx), vec!["h100"; 8]);
    assert_eq!(dgx["gpus"][0]["memory_mib"], 81559);
    assert_eq!(dgx["gpus"][0]["compute_capability"], "9.0");
    assert_eq!(dgx["gpus"][5]["numa_node"], 1);
    assert_eq!(dgx["gpus"][3]["pci_bus_id"], "00000000:5D:00.0");
    for (a, b) in [(0, 1), (0, 7), (3, 4), (6, 7)] {
        assert_eq!(link(&dgx, a, b), "Nvlink", "GPUs {a} and {b} share the NVSwitch fabric");
    }
    assert_eq!(dgx["labels"]["nvidia.driver"], "550.54.15");
    assert_eq!(dgx["labels"]["nvidia.cuda"], "12.4");
    assert_eq!(dgx["samples"].as_array().unwrap().len(), 8);
    assert_eq!(dgx["samples"][2]["power_w"], 72);

    let a100 = discover(&nvml_fixture("a100-mig"));
    let mut expected = vec!["a100-80gb".to_string(); 6];
    expected.extend(vec!["a100-3g.40gb".to_string(); 2]);
    expected.extend(vec!["a100-1g.10gb".to_string(); 7]);
    assert_eq!(models(&a100), expected);
    assert_eq!(a100["labels"]["nvidia.mig"], "enabled");
    assert_eq!(a100["gpus"][6]["mig_parent"], 6, "{}", a100["gpus"][6]);
    assert_eq!(a100["gpus"][6]["memory_mib"], 40 * 1024);
    assert_eq!(link(&a100, 0, 5), "Nvlink");
    assert_eq!(a100["labels"]["nvidia.cuda"], "12.2");

    let l4 = discover(&nvml_fixture("l4-pcie"));
    assert_eq!(models(&l4), vec!["l4"; 4]);
    assert_eq!(link(&l4, 0, 1), "PcieSwitch");
    assert_eq!(link(&l4, 2, 3), "PcieSwitch");
    assert_eq!(link(&l4, 0, 2), "System", "different NUMA nodes");

    let old = discover(&nvml_fixture("old-driver"));
    assert_eq!(models(&old), vec!["v100"; 2]);
    assert_eq!(link(&old, 0, 1), "Nvlink", "found by the remote bus id alone");
    assert!(old["labels"].get("nvidia.cuda").is_none(), "{}", old["labels"]);
    assert!(old["gpus"][0]["numa_node"].is_null());
    assert_eq!(old["samples"][0]["remap_pending"], true, "retired pages stand in");
}

/// Starts a controller and one agent whose GPUs come from `fixture` (a
/// file written into the test's dir).
fn nvml_cluster(node_timeout: &str, fixture: &str) -> Cluster {
    let mut cluster = Cluster::with_node_timeout(node_timeout);
    let path = cluster.dir.path().join("gpus.toml");
    std::fs::write(&path, fixture).expect("write the fixture");
    cluster
        .agent_env
        .push(("GPOOL_NVML_STANDIN".into(), path.display().to_string()));
    let top = format!(
        "controller = \"{}\"\nnvml_library = \"{}\"\n",
        cluster.addr,
        nvml_standin().display()
    );
    cluster.spawn_agent("gpu-01", 0, &top, "", None);
    cluster.wait_for_registered("gpu-01");
    cluster
}

/// The DGX fixture with `more` appended (Xids, faults).
fn dgx_with(more: &str) -> String {
    let base = std::fs::read_to_string(nvml_fixture("dgx-h100")).expect("the DGX fixture");
    format!("{base}\n{more}")
}

/// An Xid 79 (fallen off the bus) that NVML delivers through the event
/// set takes that GPU out of service and requeues the job that ran on it.
#[test]
fn an_xid_from_nvml_takes_its_gpu_out_and_requeues_its_job() {
    let cluster = nvml_cluster("30s", &dgx_with("[[xid]]\ngpu = 3\nxid = 79\nafter_ms = 4000\n"));
    let id = cluster.submit(&["--gpus", "8", "--", "sleep", "300"]);
    cluster.wait_for_state(id, "running");
    let node = wait_until("GPU 3 to leave service", Duration::from_secs(30), || {
        let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
        let gpu = nodes[0]["gpus"]
            .as_array()?
            .iter()
            .find(|gpu| gpu["index"] == 3)?
            .clone();
        gpu["out_of_service"].is_object().then_some(gpu)
    });
    assert!(node.to_string().contains("79"), "{node}");
    let job = wait_until("the job to be requeued", Duration::from_secs(30), || {
        let job = cluster.job(id);
        (job["requeue_cause"] == "gpu_fault").then_some(job)
    });
    assert_ne!(job["state"], "failed", "{job}");
    cluster.gpool(&["cancel", &id.to_string()]).ok();
}

/// An NVML call that hangs (a GPU fallen off the bus) holds up only the
/// readings: heartbeats go on, so the node's lease holds and its job runs
/// on; the node drains itself with the reason, and returns once readings
/// come back.
#[test]
fn a_hung_nvml_call_never_fences_the_nodes_jobs() {
    let fault =
        "[[fault]]\ncall = \"nvmlDeviceGetTemperature\"\ngpu = 0\nhang_ms = 25000\nafter_ms = 3000\nuntil_ms = 3500\n";
    let cluster = nvml_cluster("4s", &dgx_with(fault));
    let id = cluster.submit(&["--gpus", "1", "--", "sleep", "300"]);
    cluster.wait_for_state(id, "running");
    let reason = wait_until("the node to drain for stuck readings", Duration::from_secs(40), || {
        let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
        nodes[0]["drain_reason"].as_str().map(str::to_string)
    });
    assert!(reason.starts_with("GPU readings stuck: "), "{reason}");
    let job = cluster.job(id);
    assert_eq!(
        (job["state"].as_str(), job["attempt"].as_u64()),
        (Some("running"), Some(1)),
        "the node's lease held through the hang: {job}"
    );
    // The hang ends (25 s): readings come back and the drain is lifted.
    wait_until("the drain to be lifted", Duration::from_secs(60), || {
        let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
        nodes[0]["drain_reason"].is_null().then_some(())
    });
    assert_eq!(cluster.job(id)["attempt"], 1);
    cluster.gpool(&["cancel", &id.to_string()]).ok();
}
