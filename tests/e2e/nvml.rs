//! The agent's NVML path, run as on a GPU node: the agent loads the
//! stand-in NVML library this workspace builds (a real shared library with
//! NVML's C ABI), whose GPUs come from a fixture file. Everything after the
//! library is the code a GPU node runs.

use crate::harness::cluster::Cluster;
use crate::harness::process::{binary, nvml_agent_top, nvml_fixture, nvml_standin, output_within, wait_until};
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

/// Starts a controller and one agent whose GPUs come from `fixture`
/// (written to a file of the test's dir, which the test may rewrite while
/// the agent runs: the stand-in reads it again). Returns the file too.
fn nvml_cluster(node_timeout: &str, fixture: &str) -> (Cluster, std::path::PathBuf) {
    let mut cluster = Cluster::with_node_timeout(node_timeout);
    let path = cluster.dir.path().join("gpus.toml");
    std::fs::write(&path, fixture).expect("write the fixture");
    cluster.spawn_nvml_agent("gpu-01", &path, "");
    (cluster, path)
}

fn shipped(name: &str) -> String {
    std::fs::read_to_string(nvml_fixture(name)).expect("a shipped fixture")
}

/// `n` H100s, the uncorrectable ECC count of each from `ecc`, then `more`.
fn h100s(n: usize, ecc: &[u64], more: &str) -> String {
    let mut text = String::new();
    for index in 0..n {
        text.push_str(&format!(
            "[[gpu]]\nname = \"NVIDIA H100 80GB HBM3\"\nuuid = \"GPU-h-{index}\"\npci_bus_id = \"00000000:{:02X}:00.0\"\n\
             memory_mib = 81559\ncompute_capability = \"9.0\"\nremapped_rows = {{}}\necc_uncorrected = {}\n\n",
            0x10 + index,
            ecc.get(index).copied().unwrap_or(0)
        ));
    }
    text.push_str(more);
    text
}

fn gpu_of(cluster: &Cluster, index: u64) -> Value {
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    nodes[0]["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .find(|gpu| gpu["index"] == index)
        .cloned()
        .expect("the GPU")
}

fn placed_on(cluster: &Cluster, id: u64) -> Vec<u64> {
    let job = cluster.wait_for_state(id, "running");
    job["placement"][0]["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .map(|gpu| gpu.as_u64().expect("an index"))
        .collect()
}

/// A DGX H100 registers 8 H100s with their memory, all one NVLink domain
/// through its NVSwitches, so an 8-GPU job that requires NVLink gets the
/// node whole.
#[test]
fn a_dgx_registers_one_nvlink_domain_and_an_nvlink_job_gets_it_whole() {
    let (cluster, _) = nvml_cluster("30s", &shipped("dgx-h100"));
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    let gpus = nodes[0]["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 8, "{nodes}");
    assert!(
        gpus.iter()
            .all(|gpu| gpu["model"] == "h100" && gpu["memory_mib"] == 81559),
        "{nodes}"
    );
    let id = cluster.submit(&["--gpus", "8", "--nvlink", "required", "--", "true"]);
    let done = cluster.wait_for_state(id, "completed");
    assert_eq!(done["gpus_total"], 8, "{done}");
}

/// A100s with MIG on two of them: a job that asks for a slice gets it by
/// its MIG UUID in CUDA_VISIBLE_DEVICES, never the parent GPU.
#[test]
fn a_mig_slice_reaches_its_job_by_uuid_and_never_as_its_parent() {
    let (cluster, _) = nvml_cluster("30s", &shipped("a100-mig"));
    let out = cluster.dir.path().join("visible");
    let script = format!("echo $CUDA_VISIBLE_DEVICES > {}", out.display());
    let id = cluster.submit(&["--gpus", "1", "--gpu-type", "a100-3g.40gb", "--", "sh", "-c", &script]);
    cluster.wait_for_state(id, "completed");
    let visible = std::fs::read_to_string(&out).expect("the job wrote its devices");
    assert!(
        visible.trim().starts_with("MIG-a1000000-0000-4000-8000-000000000006-"),
        "{visible}"
    );
    // The parents (6 and 7) are never offered whole: only their slices.
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    let gpus = nodes[0]["gpus"].as_array().expect("gpus");
    let count = |model: &str| gpus.iter().filter(|gpu| gpu["model"] == model).count();
    assert_eq!(
        (count("a100-80gb"), count("a100-3g.40gb"), count("a100-1g.10gb")),
        (6, 2, 7),
        "{nodes}"
    );
    assert!(gpus
        .iter()
        .filter(|gpu| gpu["model"] != "a100-80gb")
        .all(|gpu| gpu["uuid"].as_str().is_some_and(|uuid| uuid.starts_with("MIG-"))));
}

/// An Xid 79 (fallen off the bus) that NVML delivers through the event
/// set takes that GPU out of service and requeues its job onto another
/// GPU; then a rise in another GPU's uncorrectable ECC count takes that
/// one out too.
#[test]
fn an_xid_or_an_ecc_rise_from_nvml_takes_its_gpu_out() {
    let (cluster, fixture) = nvml_cluster("30s", &h100s(2, &[], ""));
    let id = cluster.submit(&["--gpus", "1", "--", "sleep", "300"]);
    let first = placed_on(&cluster, id)[0];
    let other = 1 - first;
    std::fs::write(&fixture, h100s(2, &[], &format!("[[xid]]\ngpu = {first}\nxid = 79\n"))).unwrap();
    let out = wait_until("the GPU to leave service", Duration::from_secs(30), || {
        let gpu = gpu_of(&cluster, first);
        gpu["out_of_service"].is_object().then_some(gpu)
    });
    assert!(
        out["out_of_service"]["reason"]
            .as_str()
            .unwrap_or("")
            .contains("Xid 79"),
        "{out}"
    );
    let moved = wait_until("the job to run on the other GPU", Duration::from_secs(30), || {
        let job = cluster.job(id);
        (job["state"] == "running" && job["attempt"] == 2).then_some(job)
    });
    assert_eq!(moved["placement"][0]["gpus"][0], other, "{moved}");
    assert_eq!(moved["requeue_cause"], "gpu_fault", "{moved}");
    let mut ecc = [0, 0];
    ecc[other as usize] = 2;
    std::fs::write(&fixture, h100s(2, &ecc, &format!("[[xid]]\ngpu = {first}\nxid = 79\n"))).unwrap();
    let out = wait_until("the ECC-faulty GPU to leave service", Duration::from_secs(30), || {
        let gpu = gpu_of(&cluster, other);
        gpu["out_of_service"].is_object().then_some(gpu)
    });
    assert!(out.to_string().to_lowercase().contains("ecc"), "{out}");
    cluster.gpool(&["cancel", &id.to_string()]).ok();
}

/// An NVML call that hangs on one GPU (fallen off the bus) holds up only
/// that GPU's readings: heartbeats go on, so the node stays up and its
/// lease holds; the GPU goes missing from the readings and leaves service,
/// its job is requeued, and every other job keeps its first attempt.
#[test]
fn a_hung_nvml_call_takes_its_gpu_out_and_no_other_job_moves() {
    let fault =
        "[[fault]]\ncall = \"nvmlDeviceGetTemperature\"\ngpu = 2\nhang_ms = 40000\nafter_ms = 4000\nuntil_ms = 4500\n";
    let (cluster, _) = nvml_cluster("4s", &h100s(4, &[], fault));
    let ids: Vec<u64> = (0..4)
        .map(|_| cluster.submit(&["--gpus", "1", "--", "sleep", "300"]))
        .collect();
    let on: Vec<u64> = ids.iter().map(|id| placed_on(&cluster, *id)[0]).collect();
    let out = wait_until("GPU 2 to leave service", Duration::from_secs(40), || {
        let gpu = gpu_of(&cluster, 2);
        gpu["out_of_service"].is_object().then_some(gpu)
    });
    assert!(out.to_string().contains("missing from its node's readings"), "{out}");
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    assert_ne!(nodes[0]["state"], "down", "{nodes}");
    assert!(nodes[0]["drain_reason"].is_null(), "only the GPU is out: {nodes}");
    for (id, gpu) in ids.iter().zip(&on) {
        let job = cluster.job(*id);
        if *gpu == 2 {
            assert_eq!(job["requeue_cause"], "gpu_fault", "{job}");
        } else {
            assert_eq!(
                (job["state"].as_str(), job["attempt"].as_u64()),
                (Some("running"), Some(1)),
                "{job}"
            );
        }
    }
    for id in ids {
        cluster.gpool(&["cancel", &id.to_string()]).ok();
    }
}

/// A driver too old for some calls (row remapping, the CUDA version, NVLink
/// device types, memory affinity) registers its GPUs, with what it cannot
/// tell left out: the NVLink between its two V100s is still found by the
/// remote bus id, and pages pending retirement stand in for row remapping
/// (the fixture's GPU 0 has some, so it stays out until reset).
#[test]
fn an_old_driver_registers_without_what_it_lacks() {
    let (cluster, _) = nvml_cluster("30s", &shipped("old-driver"));
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    let node = &nodes[0];
    assert_eq!(node["gpus"].as_array().map(Vec::len), Some(2), "{nodes}");
    assert_eq!(node["labels"]["nvidia.driver"], "418.87.01");
    assert!(node["labels"].get("nvidia.cuda").is_none(), "{nodes}");
    assert_eq!(node["links"][0]["link"], "nvlink", "{nodes}");
    let out = wait_until("GPU 0 to leave service", Duration::from_secs(20), || {
        let gpu = gpu_of(&cluster, 0);
        gpu["out_of_service"].is_object().then_some(gpu)
    });
    assert!(out.to_string().contains("pending"), "{out}");
    let id = cluster.submit(&["--gpus", "1", "--", "true"]);
    let done = cluster.wait_for_state(id, "completed");
    assert_eq!(done["node_list"][0], "gpu-01");
}

/// A launch that cannot finish (the node's launcher is stopped, as a hung
/// user lookup or a swapped-out host would stall it) holds up no heartbeat:
/// the node stays up through several node timeouts, the job already
/// running keeps its attempt, and the stalled launch goes through once the
/// launcher runs again.
#[test]
fn a_stalled_launch_holds_up_no_heartbeat() {
    use nix::sys::signal::{kill, Signal};
    let mut cluster = Cluster::with_node_timeout("4s");
    let agent = cluster.start_agent("node-a", 2);
    let running = cluster.submit(&["--gpus", "1", "--", "sleep", "300"]);
    cluster.wait_for_state(running, "running");
    let (_, launcher) = crate::harness::process::launcher_of(cluster.agents[agent].pid());
    kill(launcher, Signal::SIGSTOP).expect("stop the launcher");
    let stalled = cluster.submit(&["--gpus", "1", "--", "true"]);
    let until = std::time::Instant::now() + Duration::from_secs(8);
    while std::time::Instant::now() < until {
        let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
        if nodes[0]["state"] == "down" {
            let _ = kill(launcher, Signal::SIGCONT);
            panic!("the node went down while a launch stalled: {nodes}");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    kill(launcher, Signal::SIGCONT).expect("continue the launcher");
    cluster.wait_for_state(stalled, "completed");
    assert_eq!(cluster.job(running)["attempt"], 1);
    cluster.gpool(&["cancel", &running.to_string()]).ok();
}

/// The shipped agent.toml on a node whose NVML finds 4 L4s: it offers the
/// real GPUs. Its commented simulated tables, once uncommented there, make
/// the agent refuse to start, naming both; `simulate = true` lets it offer
/// them, and `gpool nodes` marks them as simulated.
#[test]
fn a_real_node_never_advertises_simulated_gpus_unless_told() {
    let mut cluster = Cluster::start();
    let shipped_agent = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/agent.toml")).unwrap();
    // The shipped file as a site writes it, but for where gpoold is and TLS.
    let body: String = shipped_agent
        .lines()
        .filter(|line| {
            ![
                "controller",
                "ca ",
                "cert",
                "key",
                "node_name",
                "spool_dir",
                "heartbeat_interval",
            ]
            .iter()
            .any(|f| line.starts_with(f))
        })
        .collect::<Vec<_>>()
        .join("\n");
    cluster.spawn_nvml_agent("real", &nvml_fixture("l4-pcie"), &body);
    let top = nvml_agent_top(&cluster.addr);
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    assert_eq!(nodes[0]["gpu_model"], "l4", "{nodes}");
    assert_eq!(nodes[0]["simulated"], false, "{nodes}");

    let simulated = "[[simulated_gpu]]\nmodel = \"h100\"\nmemory_mib = 81559\ncount = 8\n";
    let refused = cluster.spawn_agent("both", 0, &top, simulated, None);
    let status = wait_until("the agent to refuse", Duration::from_secs(30), || {
        cluster.agents[refused].exited()
    });
    assert!(!status.success(), "{status:?}");
    let said = std::fs::read_to_string(&cluster.agents[refused].log).unwrap_or_default();
    assert!(
        said.contains("finds 4 real GPUs") && said.contains("simulate = true"),
        "{said}"
    );

    cluster.spawn_agent("told", 0, &format!("{top}simulate = true\n"), simulated, None);
    cluster.wait_for_registered("told");
    let listed = cluster.gpool(&["nodes"]);
    let row = listed
        .stdout
        .lines()
        .find(|line| line.starts_with("told"))
        .unwrap_or_default();
    assert!(row.contains("h100 (simulated)"), "{}", listed.stdout);
    let real_row = listed
        .stdout
        .lines()
        .find(|line| line.starts_with("real"))
        .unwrap_or_default();
    assert!(!real_row.contains("simulated"), "{}", listed.stdout);
}
