//! Fractions of a GPU as a shared pool runs them: the shipped gpoold.toml,
//! an H100 node (its driver keeping 463 MiB, as NVML reports), an A100 in
//! MIG mode and an L4; a notebook of team vision and an inference replica
//! of team nlp share one H100 under its MPS daemon (a stand-in
//! `nvidia-cuda-mps-control` on the agents' PATH), each capped and charged
//! its part; a whole-GPU job never lands on the shared GPU; a wedged MPS
//! daemon takes its GPU out of service and its fractions run again
//! elsewhere.

use crate::harness::cluster::Cluster;
use crate::harness::process::{nvml_fixture, nvml_standin, wait_until};
use crate::preemption::shipped_config;
use std::time::Duration;

/// The stand-in MPS control daemon: in `-f` mode it records the GPU it
/// serves and runs until its pipe directory goes (with the test's dir).
/// As a client (the agent's probe), it fails where no daemon runs, and
/// answers unless the test put a `wedge` file in its pipe directory: then
/// it hangs, as a wedged server.
const MPS_CONTROL: &str = r#"#!/bin/sh
if [ "$1" = "-f" ]; then
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY"
    echo "$$ $CUDA_VISIBLE_DEVICES" >> "$CUDA_MPS_PIPE_DIRECTORY/started"
    echo $$ > "$CUDA_MPS_PIPE_DIRECTORY/control.pid"
    while [ -d "$CUDA_MPS_PIPE_DIRECTORY" ]; do sleep 0.2; done
    exit 0
fi
cat > /dev/null
pid=$(cat "$CUDA_MPS_PIPE_DIRECTORY/control.pid" 2>/dev/null) && kill -0 "$pid" 2>/dev/null || exit 1
while [ -e "$CUDA_MPS_PIPE_DIRECTORY/wedge" ]; do sleep 0.2; done
"#;

const H100: &str = "[[simulated_gpu]]\nmodel = \"h100\"\nmemory_mib = 81559\nreserved_mib = 463\ncount = 2\n";
const A100_MIG: &str =
    "[[simulated_gpu]]\nmodel = \"a100-80gb\"\nmemory_mib = 81920\nmig = [\"3g.40gb\", \"3g.40gb\"]\n";
const L4: &str = "[[simulated_gpu]]\nmodel = \"l4\"\nmemory_mib = 23034\ncount = 1\n";

/// Puts the stand-in MPS control program on the agents' PATH.
fn with_mps_control(cluster: &mut Cluster) {
    let bin = cluster.dir.path().join("mps-bin");
    std::fs::create_dir_all(&bin).unwrap();
    let control = bin.join("nvidia-cuda-mps-control");
    std::fs::write(&control, MPS_CONTROL).unwrap();
    std::fs::set_permissions(&control, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    cluster.agent_env.push(("PATH".into(), path));
}

fn cluster() -> Cluster {
    let mut cluster = Cluster::with_config(&shipped_config());
    with_mps_control(&mut cluster);
    for (node, gpus) in [("h100-a", H100), ("a100-mig", A100_MIG), ("l4-a", L4)] {
        cluster.start_agent_with(node, 0, gpus);
    }
    cluster
}

/// A job that writes its environment to `<id>.env` and runs until
/// `release` appears.
const HOLD: &str = "env > $GPOOL_JOB_ID.env; while [ ! -e release ]; do sleep 0.1; done";

/// A notebook of team vision: 20G of an H100, running `script`.
fn notebook(cluster: &Cluster, script: &str) -> u64 {
    cluster.submit(&[
        "--team",
        "vision",
        "--gpu-type",
        "h100",
        "--gpu-mem",
        "20G",
        "--",
        "sh",
        "-c",
        script,
    ])
}

/// The H100 node as `gpool nodes --output json` shows it.
fn h100_node(cluster: &Cluster) -> serde_json::Value {
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    let found = nodes.as_array().unwrap().iter().find(|n| n["name"] == "h100-a");
    found.expect("the h100-a node").clone()
}

/// The MPS pipe directory a job's environment names.
fn pipe_of(env: &str) -> String {
    env.lines()
        .find_map(|l| l.strip_prefix("CUDA_MPS_PIPE_DIRECTORY="))
        .expect("a pipe directory")
        .to_string()
}

fn env_of(cluster: &Cluster, id: u64) -> String {
    env_in(&cluster.dir.path().join(format!("{id}.env")))
}

fn env_in(file: &std::path::Path) -> String {
    wait_until(&format!("{}", file.display()), Duration::from_secs(30), || {
        std::fs::read_to_string(file).ok().filter(|text| text.ends_with('\n'))
    })
}

fn placement(cluster: &Cluster, id: u64) -> String {
    cluster.wait_for_state(id, "running")["placement"].to_string()
}

#[test]
fn a_notebook_and_an_inference_fraction_share_one_h100_each_capped_and_charged_its_part() {
    let cluster = cluster();
    let notebook = notebook(&cluster, HOLD);
    let inference = cluster.submit(&[
        "--team",
        "nlp",
        "--gpu-type",
        "h100",
        "--gpu-fraction",
        "0.25",
        "--gpu-share",
        "30%",
        "--",
        "sh",
        "-c",
        HOLD,
    ]);
    let (first, second) = (placement(&cluster, notebook), placement(&cluster, inference));
    let asked = &cluster.job(inference)["gpu_share"];
    assert_eq!(
        (asked["fraction"].as_f64(), asked["compute_pct"].as_u64()),
        (Some(0.25), Some(30)),
        "{asked}"
    );
    let shown = cluster.gpool(&["show", &notebook.to_string()]).ok().to_string();
    assert!(
        shown.contains("requires:        20480 MiB of one GPU's memory"),
        "{shown}"
    );
    assert_eq!(first, second, "both fractions on one GPU");
    assert!(first.contains("h100-a"), "{first}");

    let notebook_env = env_of(&cluster, notebook);
    let inference_env = env_of(&cluster, inference);
    for env in [&notebook_env, &inference_env] {
        assert!(
            env.lines().filter(|l| l.starts_with("CUDA_VISIBLE_DEVICES=")).count() == 1,
            "{env}"
        );
        assert!(env.contains("CUDA_MPS_PIPE_DIRECTORY="), "{env}");
    }
    assert!(
        notebook_env.contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M"),
        "{notebook_env}"
    );
    assert!(
        !notebook_env.contains("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"),
        "{notebook_env}"
    );
    // A quarter of the 81,096 MiB the driver leaves, down to whole GiB.
    assert!(
        inference_env.contains("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=19456M"),
        "{inference_env}"
    );
    assert!(
        inference_env.contains("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30"),
        "{inference_env}"
    );

    // One MPS daemon for the shared GPU, started once.
    let pipe = pipe_of(&notebook_env);
    let started = wait_until("the MPS daemon", Duration::from_secs(10), || {
        // Whole once a line is written (the shell makes the file first).
        std::fs::read_to_string(format!("{pipe}/started"))
            .ok()
            .filter(|text| text.ends_with('\n'))
    });
    assert_eq!(started.lines().count(), 1, "{started}");

    // gpool nodes: the GPU's shares and its free memory.
    let h100 = h100_node(&cluster);
    let shared: Vec<_> = h100["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| !g["shared"].is_null())
        .collect();
    assert_eq!(shared.len(), 1, "{h100:#}");
    assert_eq!(shared[0]["shared"]["jobs"], 2);
    assert_eq!(shared[0]["shared"]["used_mib"], 20_480 + 19_456);
    assert_eq!(shared[0]["shared"]["free_mib"], 81_096 - 20_480 - 19_456);
    let table = cluster.gpool(&["nodes"]).ok().to_string();
    assert!(table.contains("SHARED") && table.contains("x2"), "{table}");
    let addr = std::fs::read_to_string(cluster.state_dir().join("metrics.addr")).expect("metrics.addr");
    let (_, _, metrics) = crate::harness::http_get(addr.trim(), "/metrics");
    let shared_jobs = metrics
        .lines()
        .find(|line| line.starts_with("gpool_gpu_shared_jobs{") && line.contains("node=\"h100-a\""));
    assert!(shared_jobs.is_some_and(|line| line.ends_with(" 2.0")), "{metrics}");
    let (_, _, page) = crate::harness::http_get(addr.trim(), "/status");
    assert!(page.contains("2 fractions hold 39 of 79 GiB"), "{page}");

    // A whole H100 goes to the other GPU, and a second whole one waits:
    // the shared GPU is not free to it.
    let whole = cluster.submit(&["--team", "vision", "--gpu-type", "h100", "--", "sh", "-c", HOLD]);
    let whole_at = placement(&cluster, whole);
    assert!(
        whole_at.contains("h100-a") && whole_at != first,
        "{whole_at} vs {first}"
    );
    let waits = cluster.submit(&["--team", "vision", "--gpu-type", "h100", "--", "true"]);
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(cluster.job(waits)["state"], "pending");

    // Slurm's MPS share: a quarter of the L4, memory and compute.
    let mps = cluster.submit(&["--gres", "mps:25", "--gpu-type", "l4", "--", "true"]);
    let asked = &cluster.wait_for_state(mps, "completed")["gpu_share"];
    assert_eq!(
        (asked["fraction"].as_f64(), asked["compute_pct"].as_u64()),
        (Some(0.25), Some(25)),
        "{asked}"
    );
    // A fraction larger than the L4's memory is refused at submit.
    let too_big = cluster.gpool(&["submit", "--gpu-type", "l4", "--gpu-mem", "30G", "--", "true"]);
    assert_ne!(too_big.code, 0, "{}", too_big.stdout);

    std::fs::write(cluster.dir.path().join("release"), "").unwrap();
    for id in [notebook, inference, whole, waits] {
        cluster.wait_for_state(id, "completed");
    }
    // Each fraction is charged its part of the GPU-hours it ran.
    let ran = |id: u64| {
        let job = cluster.job(id);
        let millis = |field: &str| rfc3339_millis(job[field].as_str().expect("a time"));
        (millis("ended_at") - millis("started_at")) / 3_600_000.0
    };
    let notebook_part = 20_480.0 / 81_096.0;
    let inference_part = 0.3_f64.max(19_456.0 / 81_096.0);
    let vision = ran(notebook) * notebook_part + ran(whole) + ran(waits);
    let nlp = ran(inference) * inference_part;
    let report = cluster.gpool(&["report", "--by", "team", "--output", "json"]).json();
    let rows = report["rows"].as_array().expect("rows");
    for (team, want) in [("vision", vision), ("nlp", nlp)] {
        let got = rows
            .iter()
            .find(|row| row["team"] == team)
            .and_then(|row| row["gpu_hours"].as_f64())
            .unwrap_or_else(|| panic!("team {team} in {report:#}"));
        assert!(
            (got - want).abs() <= want * 0.02 + 1e-6,
            "{team}: {got} GPU-hours, want {want}"
        );
    }
    cluster.assert_plans_sound();
}

/// A daemon that stops answering (the stand-in hangs) is stopped, its GPU
/// taken out of service with the reason, and its fraction requeued as a
/// GPU fault: it runs again on the other H100, under a daemon of its own.
#[test]
fn a_wedged_mps_daemon_takes_its_gpu_out_and_its_fraction_runs_again_elsewhere() {
    let cluster = cluster();
    let script = "env > $GPOOL_JOB_ID-$GPOOL_RESTART_COUNT.env; while [ ! -e release ]; do sleep 0.1; done";
    let id = notebook(&cluster, script);
    let first = placement(&cluster, id);
    let env = env_in(&cluster.dir.path().join(format!("{id}-0.env")));
    let pipe = pipe_of(&env);
    std::fs::write(format!("{pipe}/wedge"), "").unwrap();

    let again = env_in(&cluster.dir.path().join(format!("{id}-1.env")));
    let job = cluster.job(id);
    assert_eq!(job["requeue_cause"], "gpu_fault", "{job:#}");
    let second = placement(&cluster, id);
    assert_ne!(first, second);
    let other_pipe = pipe_of(&again);
    assert_ne!(other_pipe, pipe, "its own GPU's daemon");
    assert!(std::path::Path::new(&format!("{other_pipe}/started")).exists());
    let h100 = h100_node(&cluster);
    let out: Vec<String> = (h100["gpus"].as_array().unwrap().iter())
        .filter_map(|gpu| gpu["out_of_service"]["reason"].as_str().map(String::from))
        .collect();
    assert_eq!(out.len(), 1, "{h100:#}");
    assert!(out[0].contains("MPS daemon") && out[0].contains("wedged"), "{}", out[0]);
    std::fs::write(cluster.dir.path().join("release"), "").unwrap();
    cluster.wait_for_state(id, "completed");
    cluster.assert_plans_sound();
}

/// The agent is killed and started again while a fraction runs: the new
/// agent adopts the GPU's running daemon (no second one, no fault), the
/// fraction runs on, and the next fraction joins it under that daemon.
#[test]
fn a_restarted_agent_adopts_the_mps_daemon_its_fractions_run_under() {
    let mut cluster = cluster();
    let first = notebook(&cluster, HOLD);
    let at = placement(&cluster, first);
    let env = env_of(&cluster, first);
    let pipe = pipe_of(&env);
    cluster.agents[0].kill9();
    cluster.start_agent_with("h100-a", 0, H100);
    let second = notebook(&cluster, HOLD);
    assert_eq!(placement(&cluster, second), at, "beside the first");
    env_of(&cluster, second);
    // Long enough for the new agent's probe to have asked the daemon.
    std::thread::sleep(Duration::from_secs(7));
    let started = std::fs::read_to_string(format!("{pipe}/started")).unwrap();
    assert_eq!(started.lines().count(), 1, "one daemon: {started}");
    let h100 = h100_node(&cluster);
    assert!(
        h100["gpus"]
            .as_array()
            .unwrap()
            .iter()
            .all(|gpu| gpu["out_of_service"].is_null()),
        "{h100:#}"
    );
    assert_eq!(cluster.job(first)["attempt"], 1, "re-adopted, not rerun");
    std::fs::write(cluster.dir.path().join("release"), "").unwrap();
    for id in [first, second] {
        cluster.wait_for_state(id, "completed");
    }
    cluster.assert_plans_sound();
}

/// Milliseconds since the epoch of an RFC 3339 time.
fn rfc3339_millis(text: &str) -> f64 {
    let at = humantime::parse_rfc3339(text).expect("an RFC 3339 time");
    at.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as f64
}

#[test]
fn a_fraction_of_a_gang_or_of_several_gpus_is_refused_with_the_field_named() {
    let cluster = Cluster::with_config(&shipped_config());
    for args in [
        &["--gpus", "2", "--gpu-mem", "10G", "--", "true"][..],
        &["--gpu-fraction", "1.5", "--", "true"],
        &["--gpu-share", "30%", "--", "true"],
        &["--gpu-mem", "10G", "--nvlink", "required", "--", "true"],
    ] {
        let mut all = vec!["submit"];
        all.extend_from_slice(args);
        let run = cluster.gpool(&all);
        assert_ne!(run.code, 0, "{args:?} was taken");
        let said = format!("{}{}", run.stdout, run.stderr);
        assert!(said.contains("gpu"), "{args:?}: {said}");
    }
}

/// What NVML says of each GPU to a process that loads it as `nvidia-smi`
/// and `pynvml` do (dlopen, then dlsym): "index total-MiB free-MiB" lines.
const NVML_QUERY: &str = r#"
import ctypes, sys
nvml = ctypes.CDLL(sys.argv[1])
class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]
assert nvml.nvmlInit_v2() == 0
count = ctypes.c_uint()
assert nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0
for index in range(count.value):
    device = ctypes.c_void_p()
    assert nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(device)) == 0
    memory = Memory()
    assert nvml.nvmlDeviceGetMemoryInfo(device, ctypes.byref(memory)) == 0
    print(index, memory.total >> 20, memory.free >> 20)
"#;

/// On a node whose NVML finds 8 H100s, a 20G fraction's processes see 20G
/// as its GPU's memory through NVML (the agent preloads the cap library);
/// the node's other GPUs are as the driver says.
#[test]
fn nvml_as_a_fraction_sees_it_reports_the_cap_on_its_gpu_alone() {
    let mut cluster = Cluster::start();
    with_mps_control(&mut cluster);
    let fixture = nvml_fixture("dgx-h100");
    cluster.spawn_nvml_agent("dgx-01", &fixture, "");
    let script = format!(
        "GPOOL_NVML_STANDIN={} python3 -c '{NVML_QUERY}' {} > $GPOOL_JOB_ID.nvml; env > $GPOOL_JOB_ID.env",
        fixture.display(),
        nvml_standin().display()
    );
    let id = cluster.submit(&["--gpu-mem", "20G", "--", "sh", "-c", &script]);
    cluster.wait_for_state(id, "completed");
    let env = env_of(&cluster, id);
    let shared = env
        .lines()
        .find_map(|line| line.strip_prefix("GPOOL_SHARED_GPU="))
        .unwrap_or_else(|| panic!("no GPOOL_SHARED_GPU: {env}"));
    assert!(
        env.contains("LD_PRELOAD=") && env.contains("libgpool_nvml_cap.so"),
        "{env}"
    );
    let seen = std::fs::read_to_string(cluster.dir.path().join(format!("{id}.nvml"))).unwrap();
    assert_eq!(seen.lines().count(), 8, "{seen}");
    for line in seen.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let expected = if fields[0] == shared { "20480" } else { "81559" };
        assert_eq!(&fields[1..], [expected, expected], "{seen}");
    }
}
