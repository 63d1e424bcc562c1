//! Agents run the jobs: real gpool-agent processes with simulated GPUs.

use crate::harness::cluster::Cluster;
use crate::harness::process::{wait_for_file, wait_until};
use std::collections::BTreeSet;
use std::time::Duration;

/// A shell line that records its GPUs, then waits for `release`.
fn hold() -> String {
    format!(
        "echo $CUDA_VISIBLE_DEVICES $CUDA_DEVICE_ORDER $GPOOL_NODE > gpus-$GPOOL_JOB_ID; {}",
        wait_for_file("release")
    )
}

/// Submits a job that touches `started-NAME`, waits for `release-NAME`,
/// then exits with `code`.
fn submit_held(cluster: &Cluster, name: &str, code: u32) -> u64 {
    let script = format!(
        "touch started-{name}; {}; exit {code}",
        wait_for_file(&format!("release-{name}"))
    );
    cluster.submit(&["--", "sh", "-c", &script])
}

/// Waits until every named held job runs on its node (not only recorded as
/// running by gpoold).
fn wait_started(cluster: &Cluster, names: &[&str]) {
    wait_until("the held jobs to start", Duration::from_secs(20), || {
        names
            .iter()
            .all(|name| cluster.dir.path().join(format!("started-{name}")).exists())
            .then_some(())
    });
}

fn read(cluster: &Cluster, name: &str) -> String {
    std::fs::read_to_string(cluster.dir.path().join(name)).unwrap_or_default()
}

#[test]
fn wait_exits_3_for_a_failed_job_and_output_lands_in_the_spool() {
    let mut cluster = Cluster::start();
    cluster.start_agent("node-a", 2);
    let run = cluster.gpool(&[
        "submit",
        "--wait",
        "--",
        "sh",
        "-c",
        "echo hello from $GPOOL_NODE; exit 7",
    ]);
    // gpool's code for a failed job, never the job's own (7 here).
    assert_eq!(run.code, 3, "stderr: {}", run.stderr);
    let id: u64 = run.stdout.trim().parse().expect("job id on stdout");
    let job = cluster.job(id);
    assert_eq!(
        (job["state"].as_str(), job["exit_code"].as_i64()),
        (Some("failed"), Some(7))
    );
    let output = cluster.spool_dir("node-a").join(format!("jobs/{id}.1.out"));
    assert_eq!(
        std::fs::read_to_string(output).unwrap_or_default(),
        "hello from node-a\n"
    );

    let ok = cluster.gpool(&["submit", "--wait", "--", "true"]);
    assert_eq!(ok.code, 0, "stderr: {}", ok.stderr);
}

#[test]
fn waiting_on_a_batch_returns_when_all_ended_with_the_first_failure() {
    let mut cluster = Cluster::start();
    cluster.start_agent("node-a", 2);
    let file = cluster.dir.path().join("batch.toml");
    let jobs = ["sleep 0.3", "exit 5", "true", "sleep 0.6; exit 9", "sleep 0.2"];
    let text: String = jobs.iter().map(|job| format!("[[job]]\ncommand = {job:?}\n")).collect();
    std::fs::write(&file, text).unwrap();
    let run = cluster.gpool(&["submit", "-f", file.to_str().unwrap(), "--wait"]);
    assert_eq!(run.code, 3, "stderr: {}", run.stderr);
    let ids: Vec<u64> = run.stdout.lines().map(|line| line.parse().unwrap()).collect();
    assert_eq!(ids.len(), jobs.len(), "stdout: {}", run.stdout);
    let states: Vec<String> = ids
        .iter()
        .map(|id| cluster.job(*id)["state"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(states, ["completed", "failed", "completed", "failed", "completed"]);
    assert!(
        run.stderr.contains(&format!("job {} failed", ids[3])),
        "stderr: {}",
        run.stderr
    );
    // Off a terminal, each change of state is a line with the job's name,
    // so a failure is named when it happens.
    assert!(
        run.stderr
            .contains(&format!("gpool: job {} (exit) failed: exited with code 5", ids[1]))
            && run.stderr.contains("ended]"),
        "stderr: {}",
        run.stderr
    );
}

/// `--wait --fail-fast`: the first job that fails cancels the others, and
/// gpool exits as for a failed job (3), not as for a cancelled one (125).
#[test]
fn fail_fast_cancels_the_rest_at_the_first_failure() {
    let mut cluster = Cluster::start();
    cluster.start_agent("node-a", 2);
    let file = cluster.dir.path().join("batch.toml");
    let jobs = ["sleep 300", "sleep 0.3; exit 7", "sleep 300", "true"];
    let text: String = jobs.iter().map(|job| format!("[[job]]\ncommand = {job:?}\n")).collect();
    std::fs::write(&file, text).unwrap();
    let started = std::time::Instant::now();
    let run = cluster.gpool(&["submit", "-f", file.to_str().unwrap(), "--wait", "--fail-fast"]);
    assert_eq!(run.code, 3, "stderr: {}", run.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "the sleepers were cancelled"
    );
    let ids: Vec<u64> = run.stdout.lines().map(|line| line.parse().unwrap()).collect();
    assert!(run.stderr.contains("cancelling the"), "{}", run.stderr);
    let states: Vec<String> = ids
        .iter()
        .map(|id| cluster.job(*id)["state"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(states[0], "cancelled", "{states:?}");
    assert_eq!(states[1], "failed", "{states:?}");
    assert_eq!(states[2], "cancelled", "{states:?}");
}

/// The README's CI step, run as written: a 200-job batch with one failing
/// job prints progress into the log, names the failed job and fails with
/// gpool's code for a failed job.
#[test]
fn the_readmes_ci_step_names_the_failed_job_of_a_200_job_batch() {
    let mut cluster = Cluster::start();
    cluster.start_agent("node-a", 4);
    cluster.start_agent("node-b", 4);
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let after = &readme[readme
        .find("A CI step that submits a batch")
        .expect("the CI step in the README")..];
    let script = after
        .split("```sh\n")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("its sh block");
    assert!(script.lines().count() <= 10, "{script}");
    let text: String = (0..200)
        .map(|i| match i {
            137 => "[[job]]\nname = \"shard-137\"\ncommand = \"exit 2\"\n".to_string(),
            _ => format!("[[job]]\nname = \"shard-{i}\"\ncommand = \"true\"\n"),
        })
        .collect();
    std::fs::write(cluster.dir.path().join("batch.toml"), text).unwrap();
    let bin_dir = crate::harness::process::binary("gpool").parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap_or_default());
    let run: crate::harness::cluster::Run = std::process::Command::new("sh")
        .args(["-c", script])
        .current_dir(cluster.dir.path())
        .env("PATH", path)
        .env("GPOOL_SERVER", &cluster.cli_server)
        .output()
        .expect("run sh")
        .into();
    assert_eq!(run.code, 3, "stdout: {}\nstderr: {}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("shard-137: failed exited with code 2"),
        "{}",
        run.stdout
    );
    assert_eq!(
        run.stdout.lines().count(),
        1,
        "only the failed job is named: {}",
        run.stdout
    );
    // Progress went to the log as it happened, a line per change of state.
    assert!(
        run.stderr.contains("(shard-137) failed: exited with code 2 ["),
        "{}",
        run.stderr
    );
    let summary: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(cluster.dir.path().join("result.json")).unwrap()).unwrap();
    assert_eq!(summary["jobs"].as_array().map(Vec::len), Some(200));
    assert_eq!(summary["exit_code"], 3);
    assert_eq!(summary["jobs"][5]["state"], "completed");
    assert!(
        summary["jobs"][5]["elapsed_secs"].as_f64().is_some(),
        "{}",
        summary["jobs"][5]
    );
    assert_eq!(summary["jobs"][5]["nodes"].as_array().map(Vec::len), Some(1));
}

#[test]
fn concurrent_jobs_on_one_node_get_disjoint_gpus() {
    let mut cluster = Cluster::start();
    cluster.start_agent("node-a", 4);
    let ids: Vec<u64> = (0..2)
        .map(|_| cluster.submit(&["--gpus", "2", "--", "sh", "-c", &hold()]))
        .collect();
    let mut seen = BTreeSet::new();
    for id in &ids {
        cluster.wait_for_state(*id, "running");
        let line = wait_until("the job's GPU file", Duration::from_secs(20), || {
            Some(read(&cluster, &format!("gpus-{id}"))).filter(|text| !text.is_empty())
        });
        let fields: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(&fields[1..], ["PCI_BUS_ID", "node-a"], "{line}");
        let gpus: Vec<&str> = fields[0].split(',').collect();
        assert_eq!(gpus.len(), 2, "{line}");
        for gpu in gpus {
            assert!(seen.insert(gpu.to_string()), "GPU {gpu} given to two jobs");
        }
    }
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    assert_eq!(
        (nodes[0]["state"].as_str(), nodes[0]["gpus_free"].as_u64()),
        (Some("allocated"), Some(0))
    );
    // Heartbeats carry per-GPU samples (fixed idle values when simulated).
    let sampled = wait_until("a heartbeat sample", Duration::from_secs(10), || {
        let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
        let gpu = nodes[0]["gpus"][0].clone();
        gpu["temperature_c"].as_u64().map(|_| gpu)
    });
    assert_eq!(
        (sampled["temperature_c"].as_u64(), sampled["power_w"].as_u64()),
        (Some(35), Some(70))
    );
    std::fs::write(cluster.dir.path().join("release"), "").unwrap();
    for id in ids {
        cluster.wait_for_state(id, "completed");
    }
}

#[test]
fn gang_starts_on_both_nodes_or_neither() {
    let mut cluster = Cluster::start();
    cluster.start_agent("node-a", 2);
    cluster.start_agent("node-b", 2);
    // One node busy: the gang must wait whole.
    let blocker = cluster.submit(&["--gpus", "1", "--", "sh", "-c", &hold()]);
    cluster.wait_for_state(blocker, "running");
    let script = "echo $GPOOL_NODE_RANK $GPOOL_NUM_NODES $MASTER_ADDR $MASTER_PORT $GPOOL_NODE > rank-$GPOOL_NODE_RANK";
    let gang = cluster.submit(&["--gpus-per-node", "2", "--nodes", "2", "--", "sh", "-c", script]);
    let pending = wait_until("the gang's pending reason", Duration::from_secs(10), || {
        let job = cluster.job(gang);
        job["reasons"][0]
            .as_str()
            .filter(|r| r.starts_with("wants 2 GPUs on each of 2 nodes"))
            .map(String::from)
    });
    assert!(pending.contains("1 node has that many free"), "{pending}");
    assert_eq!(cluster.job(gang)["state"], "pending");
    assert!(
        read(&cluster, "rank-0").is_empty() && read(&cluster, "rank-1").is_empty(),
        "no rank may start alone"
    );

    std::fs::write(cluster.dir.path().join("release"), "").unwrap();
    cluster.wait_for_state(gang, "completed");
    let rank0: Vec<String> = read(&cluster, "rank-0").split_whitespace().map(String::from).collect();
    let rank1: Vec<String> = read(&cluster, "rank-1").split_whitespace().map(String::from).collect();
    assert_eq!(rank0[..2], ["0", "2"]);
    assert_eq!(rank1[..2], ["1", "2"]);
    assert_eq!(rank0[2..4], rank1[2..4], "both ranks dial the same master");
    assert_eq!(rank0[2], "127.0.0.1");
    assert_ne!(rank0[4], rank1[4], "ranks run on different nodes");
}

#[test]
fn cancel_kills_the_whole_process_tree() {
    let mut cluster = Cluster::start();
    cluster.start_agent("node-a", 1);
    let id = cluster.submit(&["--", "sh", "-c", "sleep 300 & echo $! > child-pid; wait"]);
    cluster.wait_for_state(id, "running");
    let child: i32 = wait_until("the child's pid", Duration::from_secs(20), || {
        read(&cluster, "child-pid").trim().parse().ok()
    });
    cluster.gpool(&["cancel", &id.to_string()]).ok();
    wait_until("the job's child to be gone", Duration::from_secs(20), || {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(child), None)
            .is_err()
            .then_some(())
    });
    assert_eq!(cluster.job(id)["state"], "cancelled");
}

#[test]
fn time_limit_ends_a_job() {
    let mut cluster = Cluster::start();
    cluster.start_agent("node-a", 1);
    // Ended at its limit, and recorded as soon as its processes are gone
    // (not after the SIGKILL grace).
    let started = std::time::Instant::now();
    let run = cluster.gpool(&["submit", "--wait", "--time", "2s", "--", "sleep", "300"]);
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_eq!(run.code, 124, "timeout, as timeout(1) exits; stderr: {}", run.stderr);
    let id: u64 = run.stdout.trim().parse().expect("job id");
    let job = cluster.job(id);
    assert_eq!(
        (job["state"].as_str(), job["end_reason"].as_str()),
        (Some("timeout"), Some("its time limit ran out"))
    );
    // A job that catches SIGTERM and exits 0 still ran out of time.
    let run = cluster.gpool(&[
        "submit",
        "--wait",
        "--time",
        "2s",
        "--",
        "sh",
        "-c",
        "trap 'exit 0' TERM; sleep 300 & wait",
    ]);
    assert_eq!(run.code, 124, "{}", run.stderr);
    let id: u64 = run.stdout.trim().parse().expect("job id");
    assert_eq!(cluster.job(id)["state"], "timeout");
}

#[test]
fn drained_node_takes_no_new_jobs() {
    let mut cluster = Cluster::start();
    cluster.start_agent("node-a", 1);
    cluster.start_agent("node-b", 1);
    cluster.gpool(&["drain", "node-a", "--reason", "fan failure"]).ok();
    cluster.wait_for_node("node-a", "drained");
    let first = cluster.submit(&["--", "sh", "-c", &hold()]);
    let second = cluster.submit(&["--", "sh", "-c", &hold()]);
    cluster.wait_for_state(first, "running");
    assert_eq!(cluster.job(first)["placement"][0]["node"], "node-b");
    let reason = wait_until("the second job's reason", Duration::from_secs(10), || {
        cluster.job(second)["reasons"][0].as_str().map(String::from)
    });
    assert_eq!(cluster.job(second)["state"], "pending", "{reason}");
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    assert_eq!(nodes[0]["drain_reason"], "fan failure");
    // A drain records who and when.
    assert_eq!(
        nodes[0]["drained_by"],
        crate::harness::cluster::current_user(),
        "{nodes}"
    );
    assert!(
        nodes[0]["drained_at"].as_str().is_some_and(|at| at.starts_with("20")),
        "{nodes}"
    );
    let table = cluster.gpool(&["nodes"]).ok().to_string();
    assert!(
        table.contains(&format!("fan failure (by {}", crate::harness::cluster::current_user())),
        "{table}"
    );

    cluster.gpool(&["resume", "node-a"]).ok();
    let job = cluster.wait_for_state(second, "running");
    assert_eq!(job["placement"][0]["node"], "node-a");
    std::fs::write(cluster.dir.path().join("release"), "").unwrap();
    cluster.wait_for_state(second, "completed");
}

#[test]
fn running_jobs_survive_a_controller_kill_9() {
    let mut cluster = Cluster::start();
    cluster.start_agent("node-a", 2);
    let (ends_while_away, keeps_running) = (submit_held(&cluster, "a", 4), submit_held(&cluster, "b", 0));
    wait_started(&cluster, &["a", "b"]);
    let agent_log = cluster.agents[0].log.clone();
    cluster.controller().kill9();
    std::fs::write(cluster.dir.path().join("release-a"), "").unwrap();
    wait_until("job a to end while gpoold is down", Duration::from_secs(20), || {
        std::fs::read_to_string(&agent_log)
            .ok()?
            .contains("attempt ended")
            .then_some(())
    });
    cluster.start_controller();
    // Its exit code arrives with the agent's Register; the other job is kept.
    let ended = cluster.wait_for_state(ends_while_away, "failed");
    assert_eq!(
        (ended["exit_code"].as_i64(), ended["attempt"].as_u64()),
        (Some(4), Some(1))
    );
    assert_eq!(cluster.job(keeps_running)["state"], "running");
    std::fs::write(cluster.dir.path().join("release-b"), "").unwrap();
    let finished = cluster.wait_for_state(keeps_running, "completed");
    assert_eq!(finished["attempt"], 1, "never relaunched");
}

/// A frozen node: its agent and its job stopped with SIGSTOP.
fn freeze(agent: nix::unistd::Pid, job: nix::unistd::Pid, signal: nix::sys::signal::Signal) {
    // The whole node: its agent, the launcher and its keeper, and the job.
    let (keeper, launcher) = crate::harness::process::launcher_of(agent);
    for (pid, what) in [(agent, "the agent"), (keeper, "the keeper"), (launcher, "the launcher")] {
        nix::sys::signal::kill(pid, signal).unwrap_or_else(|err| panic!("signal {what}: {err}"));
    }
    let group = nix::unistd::getpgid(Some(job)).expect("the job's process group");
    nix::sys::signal::killpg(group, signal).expect("signal the job's group");
}

/// Two one-GPU nodes under a 4 s node timeout, node-b drained so that a
/// job's first attempt lands on node-a; returns node-a's agent index.
fn first_attempt_on_node_a() -> (Cluster, usize) {
    let mut cluster = Cluster::with_node_timeout("4s");
    let agent_a = cluster.start_agent("node-a", 1);
    cluster.start_agent("node-b", 1);
    cluster
        .gpool(&["drain", "node-b", "--reason", "keep the first attempt on node-a"])
        .ok();
    (cluster, agent_a)
}

#[test]
fn silent_node_goes_down_and_its_job_never_runs_twice() {
    use nix::sys::signal::Signal;
    let (cluster, agent_a) = first_attempt_on_node_a();
    let script = format!(
        "echo start $GPOOL_ATTEMPT $GPOOL_NODE $$ >> marker; {}; echo end $GPOOL_ATTEMPT >> marker",
        wait_for_file("release")
    );
    let id = cluster.submit(&["--", "sh", "-c", &script]);
    let first_pid: i32 = wait_until("attempt 1 to start", Duration::from_secs(20), || {
        read(&cluster, "marker").split_whitespace().nth(3)?.parse().ok()
    });
    cluster.gpool(&["resume", "node-b"]).ok();

    let (agent_pid, job_pid) = (cluster.agents[agent_a].pid(), nix::unistd::Pid::from_raw(first_pid));
    freeze(agent_pid, job_pid, Signal::SIGSTOP);
    cluster.wait_for_node("node-a", "down");
    let job = cluster.wait_for_state(id, "running");
    assert_eq!(
        (job["attempt"].as_u64(), job["placement"][0]["node"].as_str()),
        (Some(2), Some("node-b"))
    );
    wait_until("attempt 2 to start", Duration::from_secs(20), || {
        read(&cluster, "marker").contains("start 2 node-b").then_some(())
    });

    // The node comes back: its stale attempt is told to die.
    freeze(agent_pid, job_pid, Signal::SIGCONT);
    wait_until("the stale attempt to be killed", Duration::from_secs(30), || {
        nix::sys::signal::kill(job_pid, None).is_err().then_some(())
    });
    cluster.wait_for_node("node-a", "idle");
    std::fs::write(cluster.dir.path().join("release"), "").unwrap();
    let done = cluster.wait_for_state(id, "completed");
    assert_eq!(done["attempt"], 2);
    let lines: Vec<String> = read(&cluster, "marker")
        .lines()
        .map(|line| line.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(
        lines,
        ["start 1 node-a", "start 2 node-b", "end 2"],
        "attempt 1 must never run on"
    );
}

#[test]
fn drain_now_requeues_and_no_requeue_jobs_fail() {
    let mut cluster = Cluster::start();
    cluster.start_agent("node-a", 2);
    cluster.start_agent("node-b", 2);
    cluster
        .gpool(&["drain", "node-b", "--reason", "first place both jobs on node-a"])
        .ok();
    let hold = format!(
        "touch started-$GPOOL_JOB_ID-$GPOOL_ATTEMPT; {}",
        wait_for_file("release")
    );
    let requeued = cluster.submit(&["--", "sh", "-c", &hold]);
    let failing = cluster.submit(&["--no-requeue", "--", "sh", "-c", &hold]);
    for id in [requeued, failing] {
        wait_until("the job to start", Duration::from_secs(20), || {
            cluster
                .dir
                .path()
                .join(format!("started-{id}-1"))
                .exists()
                .then_some(())
        });
    }
    cluster.gpool(&["resume", "node-b"]).ok();
    cluster
        .gpool(&["drain", "node-a", "--reason", "replace a GPU", "--now"])
        .ok();
    let moved = cluster.wait_for_state(requeued, "running");
    let moved = if moved["attempt"] == 2 {
        moved
    } else {
        wait_until("the requeued job's second attempt", Duration::from_secs(20), || {
            let job = cluster.job(requeued);
            (job["attempt"] == 2 && job["state"] == "running").then_some(job)
        })
    };
    assert_eq!(moved["placement"][0]["node"], "node-b");
    let failed = cluster.wait_for_state(failing, "node_fail");
    assert!(
        failed["end_reason"]
            .as_str()
            .unwrap_or_default()
            .contains("not to be requeued"),
        "{failed}"
    );
    cluster.wait_for_node("node-a", "drained");
    std::fs::write(cluster.dir.path().join("release"), "").unwrap();
    cluster.wait_for_state(requeued, "completed");
}

#[test]
fn restarted_agent_readopts_its_running_job() {
    let mut cluster = Cluster::start();
    let agent = cluster.start_agent("node-a", 2);
    let (keeps_running, ends_while_away) = (submit_held(&cluster, "a", 5), submit_held(&cluster, "b", 6));
    wait_started(&cluster, &["a", "b"]);
    cluster.agents[agent].kill9();
    std::fs::write(cluster.dir.path().join("release-b"), "").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    cluster.start_agent("node-a", 2);
    let ended = cluster.wait_for_state(ends_while_away, "failed");
    assert_eq!(
        (ended["exit_code"].as_i64(), ended["attempt"].as_u64()),
        (Some(6), Some(1))
    );
    assert_eq!(cluster.job(keeps_running)["state"], "running");
    std::fs::write(cluster.dir.path().join("release-a"), "").unwrap();
    let finished = cluster.wait_for_state(keeps_running, "failed");
    assert_eq!(
        (finished["exit_code"].as_i64(), finished["attempt"].as_u64()),
        (Some(5), Some(1)),
        "re-adopted, not rerun"
    );
}

#[test]
fn logs_stream_a_jobs_output() {
    let mut cluster = Cluster::start();
    cluster.start_agent("node-a", 1);
    let run = cluster.gpool(&["submit", "--wait", "--", "sh", "-c", "echo out-line; echo err-line >&2"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let id = run.stdout.trim().to_string();
    assert_eq!(cluster.gpool(&["logs", &id]).ok(), "out-line\n");
    assert_eq!(cluster.gpool(&["logs", &id, "--stderr"]).ok(), "err-line\n");

    // --follow prints what comes while the job runs and ends with it.
    let script = format!("echo first; {}; echo last", wait_for_file("release"));
    let running = cluster.submit(&["--", "sh", "-c", &script]).to_string();
    cluster.wait_for_state(running.parse().unwrap(), "running");
    let follower = crate::harness::cluster::gpool_command(&["logs", "--follow", &running])
        .env("GPOOL_SERVER", &cluster.addr)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("gpool logs --follow");
    std::thread::sleep(Duration::from_millis(500));
    std::fs::write(cluster.dir.path().join("release"), "").unwrap();
    let output = crate::harness::process::output_within(follower, "gpool logs --follow", Duration::from_secs(30));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "first\nlast\n");

    let pending = cluster.gpool(&["logs", "999"]);
    assert_eq!(pending.code, 1);
    assert!(pending.stderr.contains("job 999 not found"), "{}", pending.stderr);
}

#[test]
fn discarded_output_leaves_no_files_and_logs_says_why() {
    let mut cluster = Cluster::start();
    cluster.start_agent("node-a", 1);
    let run = cluster.gpool(&[
        "submit",
        "--discard-output",
        "--wait",
        "--",
        "sh",
        "-c",
        "echo gone; echo gone >&2",
    ]);
    assert_eq!(run.code, 0, "stderr: {}", run.stderr);
    let id = run.stdout.trim();
    let jobs_dir = cluster.spool_dir("node-a").join("jobs");
    for suffix in ["out", "err"] {
        assert!(
            !jobs_dir.join(format!("{id}.1.{suffix}")).exists(),
            "{suffix} file written"
        );
    }
    let logs = cluster.gpool(&["logs", id]);
    assert_eq!(logs.code, 2, "stdout: {}", logs.stdout);
    assert!(logs.stderr.contains("--discard-output"), "stderr: {}", logs.stderr);
}

/// An agent running as root runs each job as the user who submitted it,
/// with that user's groups, owning its output and checkpoint directory.
#[test]
fn jobs_run_as_their_submitter_when_the_agent_is_root() {
    use std::os::unix::fs::MetadataExt;
    if !nix::unistd::geteuid().is_root() {
        crate::harness::skip("root", "the agent must run as root to switch users");
        return;
    }
    let nobody = nix::unistd::User::from_name("nobody").unwrap().expect("user nobody");
    let mut cluster = Cluster::start();
    cluster.start_agent("node-a", 1);
    let run = cluster.gpool_as(
        &nobody,
        &cluster.addr,
        &[
            "submit",
            "--wait",
            "--workdir",
            "/",
            "--",
            "sh",
            "-c",
            "id -u > \"$GPOOL_CHECKPOINT_DIR/uid\"; echo $USER",
        ],
    );
    let id = run.ok().trim().to_string();
    let spool = cluster.spool_dir("node-a");
    let uid = std::fs::read_to_string(spool.join(format!("checkpoints/{id}/uid"))).unwrap();
    assert_eq!(uid.trim(), nobody.uid.to_string());
    let out = spool.join(format!("jobs/{id}.1.out"));
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "nobody\n");
    assert_eq!(std::fs::metadata(&out).unwrap().uid(), nobody.uid.as_raw());
}

#[test]
fn a_checkpoint_dir_left_empty_is_removed_and_one_written_to_stays() {
    let mut cluster = Cluster::start();
    cluster.start_agent("node-a", 1);
    let empty = cluster.submit(&[
        "--wait",
        "--discard-output",
        "--",
        "sh",
        "-c",
        "test -d \"$GPOOL_CHECKPOINT_DIR\"",
    ]);
    let written = cluster.submit(&[
        "--wait",
        "--discard-output",
        "--",
        "sh",
        "-c",
        "echo step-7 > \"$GPOOL_CHECKPOINT_DIR/state\"",
    ]);
    for id in [empty, written] {
        assert_eq!(cluster.job(id)["state"], "completed", "job {id}");
    }
    let checkpoints = cluster.spool_dir("node-a").join("checkpoints");
    assert!(
        !checkpoints.join(empty.to_string()).exists(),
        "job {empty} left its checkpoint dir empty: it should be gone"
    );
    let state = std::fs::read_to_string(checkpoints.join(format!("{written}/state"))).unwrap();
    assert_eq!(state, "step-7\n");
}

#[test]
fn cancel_signal_reaches_the_job_without_cancelling_it() {
    let mut cluster = Cluster::start();
    cluster.start_agent("node-a", 1);
    let script = "trap 'echo $GPOOL_JOB_ID > got-usr1; exit 0' USR1; touch started-trap; \
                  i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; exit 3";
    let id = cluster.submit(&["--", "sh", "-c", script]);
    wait_started(&cluster, &["trap"]);
    let bad = cluster.gpool(&["cancel", "--signal", "USR9", &id.to_string()]);
    assert_eq!(bad.code, 2, "stdout: {}", bad.stdout);
    assert!(
        bad.stderr.contains("\"USR9\" is not a signal name"),
        "stderr: {}",
        bad.stderr
    );
    let run = cluster.gpool(&["cancel", "--signal", "usr1", &id.to_string()]);
    assert_eq!(run.code, 0, "stderr: {}", run.stderr);
    assert_eq!(run.stdout.trim(), format!("signalled job {id}"));
    cluster.wait_for_state(id, "completed");
    assert_eq!(read(&cluster, "got-usr1").trim(), id.to_string());
    let again = cluster.gpool(&["cancel", "--signal", "USR1", &id.to_string()]);
    assert_eq!(again.stdout.trim(), format!("job {id} is not running (completed)"));
}

#[test]
fn jobs_get_gpus_joined_by_nvlink() {
    let mut cluster = Cluster::start();
    cluster.start_agent_with("node-a", 4, "\n[simulated_topology]\nnvlink = [[0, 1], [2, 3]]\n");
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    let links: Vec<String> = nodes[0]["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| format!("{}-{} {}", l["a"], l["b"], l["link"].as_str().unwrap_or_default()))
        .collect();
    assert_eq!(links, ["0-1 nvlink", "2-3 nvlink"]);
    let held = submit_held(&cluster, "one", 0);
    wait_started(&cluster, &["one"]);
    // GPUs 1, 2 and 3 are free: the pair joined by NVLink is 2 and 3.
    let run = cluster.gpool(&[
        "submit",
        "--gpus",
        "2",
        "--wait",
        "--",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES",
    ]);
    assert_eq!(run.code, 0, "stderr: {}", run.stderr);
    let id = run.stdout.trim();
    let out = cluster.spool_dir("node-a").join(format!("jobs/{id}.1.out"));
    assert_eq!(std::fs::read_to_string(out).unwrap_or_default(), "2,3\n");
    std::fs::write(cluster.dir.path().join("release-one"), "").unwrap();
    cluster.wait_for_state(held, "completed");
}

/// Where the node offers cgroups, a job may open only its own GPUs' device
/// nodes (fake ones here, made with mknod; cgroup v1 devices rules, or a
/// BPF device filter on cgroup v2), gets its --mem and
/// --cpus-per-gpu (and the node's max_pids) as cgroup limits, and the processes it detaches (setsid)
/// die with it when it is cancelled. It is the node's second job, so its
/// supervisor was waiting in a cgroup made ahead: the job is born in that
/// one, renamed for its attempt, and nothing of it is left at the end.
/// An array's tasks after it get ended attempts' cgroups, with the same
/// rules.
#[test]
fn a_job_is_fenced_into_its_gpus_and_what_it_detaches_dies_with_it() {
    if !nix::unistd::geteuid().is_root() {
        crate::harness::skip("root", "cgroups and device nodes need root");
        return;
    }
    let mut cluster = Cluster::start();
    let top = format!("controller = \"{}\"\nmax_pids = 4096\n", cluster.addr);
    cluster.spawn_agent("node-a", 2, &top, "", None);
    cluster.wait_for_registered("node-a");
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    let isolation = nodes[0]["labels"]["isolation"].as_str().unwrap_or_default().to_string();
    if isolation == "none" {
        crate::harness::skip(
            "root",
            "this host offers the agent no cgroup (the agent's log says why)",
        );
        return;
    }
    let first = cluster.submit(&["--", "true"]);
    cluster.wait_for_state(first, "completed");
    let dir = cluster.dir.path();
    for gpu_idx in 0..2 {
        let path = dir.join(format!("nvidia{gpu_idx}"));
        nix::sys::stat::mknod(
            &path,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(195, gpu_idx),
        )
        .expect("mknod a fake GPU device node");
    }
    let script = "echo $CUDA_VISIBLE_DEVICES > visible; \
                  { grep -E '^[0-9]+:devices:' /proc/self/cgroup || grep '^0::' /proc/self/cgroup; } | cut -d: -f3 > devices-cgroup; \
                  for i in 0 1; do (exec 3< nvidia$i) 2> open$i.err; done; \
                  m=$(grep -E '^[0-9]+:memory:' /proc/self/cgroup | cut -d: -f3); \
                  cat /sys/fs/cgroup/memory$m/memory.limit_in_bytes > mem-limit; \
                  c=$(grep -E '^[0-9]+:(cpu|cpu,cpuacct):' /proc/self/cgroup | cut -d: -f3); \
                  cat /sys/fs/cgroup/cpu$c/cpu.cfs_quota_us > cpu-quota; \
                  p=$(grep -E '^[0-9]+:pids:' /proc/self/cgroup | cut -d: -f3); \
                  cat /sys/fs/cgroup/pids$p/pids.max > pids-max; \
                  setsid sh -c 'echo $$ > escaped.pid; exec sleep 300' & \
                  i=0; while [ ! -s escaped.pid ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; \
                  touch started-fence; sleep 300";
    let id = cluster.submit(&[
        "--gpus",
        "1",
        "--mem",
        "256M",
        "--cpus-per-gpu",
        "2",
        "--",
        "sh",
        "-c",
        script,
    ]);
    wait_started(&cluster, &["fence"]);
    // Its limits are its cgroup's, where the host mounts those hierarchies.
    if std::path::Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() {
        assert_eq!(read(&cluster, "mem-limit").trim(), (256u64 << 20).to_string());
    }
    if std::path::Path::new("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").exists() {
        assert_eq!(read(&cluster, "cpu-quota").trim(), "200000", "2 CPUs for its 1 GPU");
    }
    if std::path::Path::new("/sys/fs/cgroup/pids/pids.max").exists()
        || std::path::Path::new("/sys/fs/cgroup/pids/cgroup.procs").exists()
    {
        assert_eq!(read(&cluster, "pids-max").trim(), "4096", "the node's max_pids");
    }
    let escaped: i32 = read(&cluster, "escaped.pid").trim().parse().expect("the detached pid");
    let devices_cgroup = read(&cluster, "devices-cgroup").trim().to_string();
    if isolation == "cgroup-devices" {
        assert!(
            devices_cgroup
                .rsplit('/')
                .next()
                .is_some_and(|name| name.contains(&format!("-{id}."))),
            "born in its attempt's cgroup: {devices_cgroup}"
        );
        let own = read(&cluster, "visible").trim().to_string();
        let other = if own == "0" { "1" } else { "0" };
        // No driver behind the fake nodes: an allowed open finds no device,
        // a denied one is refused by the cgroup before that.
        assert!(read(&cluster, &format!("open{own}.err")).contains("No such device or address"));
        assert!(read(&cluster, &format!("open{other}.err")).contains("Operation not permitted"));
    }
    cluster.gpool(&["cancel", &id.to_string()]).ok();
    cluster.wait_for_state(id, "cancelled");
    wait_until(
        "the detached process to die with its job",
        Duration::from_secs(30),
        || {
            let stat = std::fs::read_to_string(format!("/proc/{escaped}/stat")).unwrap_or_default();
            // Gone, or a zombie waiting for its new parent to reap it.
            (stat.is_empty() || stat.split(") ").nth(1).is_some_and(|rest| rest.starts_with('Z'))).then_some(())
        },
    );
    if isolation == "cgroup-devices" {
        // cgroup v1's devices hierarchy, or v2's (with a BPF device filter).
        let attempt_dir = if std::path::Path::new("/sys/fs/cgroup/devices/devices.allow").exists() {
            format!("/sys/fs/cgroup/devices{devices_cgroup}")
        } else {
            format!("/sys/fs/cgroup{devices_cgroup}")
        };
        wait_until("the attempt's cgroup to be removed", Duration::from_secs(30), || {
            (!std::path::Path::new(&attempt_dir).exists()).then_some(())
        });
        // Attempts launched in a stream get ended ones' cgroups of the same
        // rules (renamed, not made again): each still opens only its own GPU.
        let check = "t=$GPOOL_ARRAY_TASK_ID; echo $CUDA_VISIBLE_DEVICES > visible.$t; \
                     { grep -E '^[0-9]+:devices:' /proc/self/cgroup || grep '^0::' /proc/self/cgroup; } | cut -d: -f3 > devices-cgroup.$t; \
                     for i in 0 1; do (exec 3< nvidia$i) 2> open$i.err.$t; done; true";
        let array = cluster.submit(&["--gpus", "1", "--array", "0-7", "--", "sh", "-c", check]);
        cluster.wait_for_state(array, "completed");
        for task in 0..8 {
            let name = read(&cluster, &format!("devices-cgroup.{task}"));
            assert!(
                name.trim()
                    .rsplit('/')
                    .next()
                    .is_some_and(|last| !last.starts_with("spare-")),
                "task {task} in its own attempt's cgroup: {name}"
            );
            let own = read(&cluster, &format!("visible.{task}")).trim().to_string();
            let other = if own == "0" { "1" } else { "0" };
            assert!(read(&cluster, &format!("open{own}.err.{task}")).contains("No such device or address"));
            assert!(
                read(&cluster, &format!("open{other}.err.{task}")).contains("Operation not permitted"),
                "task {task} on GPU {own} opened GPU {other}"
            );
        }
    }
}

/// A job with --image runs in a container of the node's runtime (podman),
/// as its submitter, with its GPUs numbered from 0 and its checkpoint dir
/// mounted; cancelled mid-run, it leaves no container and no process.
#[test]
fn a_container_job_runs_as_its_user_and_leaves_nothing_when_cancelled() {
    use std::os::unix::fs::PermissionsExt;
    let podman = std::process::Command::new("podman").arg("--version").output();
    if !nix::unistd::geteuid().is_root() || podman.is_err() {
        crate::harness::skip(
            "root",
            "containers need root and podman (.ci/run installs podman, runc and busybox-static)",
        );
        return;
    }
    let mut cluster = Cluster::start();
    let dir = cluster.dir.path().to_path_buf();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    // A tiny local image: busybox-static and a few of its applets.
    let rootfs = dir.join("rootfs");
    std::fs::create_dir_all(rootfs.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox")).expect("busybox-static installed");
    for applet in ["sh", "id", "sleep", "echo", "touch", "cat"] {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet)).unwrap();
    }
    let conf = dir.join("containers.conf");
    std::fs::write(
        &conf,
        "[containers]\ndefault_ulimits = []\n\n[engine]\nruntime = \"runc\"\n",
    )
    .unwrap();
    let image = format!("localhost/gpool-e2e-busybox-{}", std::process::id());
    let tar = dir.join("rootfs.tar");
    let tarred = std::process::Command::new("tar")
        .arg("-cf")
        .arg(&tar)
        .arg("-C")
        .arg(&rootfs)
        .arg(".")
        .status();
    assert!(tarred.is_ok_and(|status| status.success()), "tar the rootfs");
    let imported = std::process::Command::new("podman")
        .env("CONTAINERS_CONF", &conf)
        .arg("import")
        .arg(&tar)
        .arg(&image)
        .output()
        .unwrap();
    assert!(
        imported.status.success(),
        "{}",
        String::from_utf8_lossy(&imported.stderr)
    );
    let works = std::process::Command::new("podman")
        .env("CONTAINERS_CONF", &conf)
        .args(["run", "--rm", &image, "sh", "-c", "exit 0"])
        .output()
        .unwrap();
    if !works.status.success() {
        crate::harness::skip(
            "root",
            &format!(
                "podman cannot run a container on this host: {}",
                String::from_utf8_lossy(&works.stderr)
            ),
        );
        return;
    }
    cluster.agent_env = vec![("CONTAINERS_CONF".into(), conf.display().to_string())];
    cluster.start_agent("node-a", 4);
    // Submitted by nobody (known by its uid on loopback).
    let nobody = nix::unistd::User::from_name("nobody").unwrap().expect("user nobody");
    let script =
        "echo \"cvd=$CUDA_VISIBLE_DEVICES uid=$(id -u)\"; touch \"$GPOOL_CHECKPOINT_DIR/in-container\"; exec sleep 300";
    let submitted = cluster.gpool_as(
        &nobody,
        &cluster.addr,
        &[
            "submit", "--output", "json", "--gpus", "2", "--image", &image, "--", "sh", "-c", script,
        ],
    );
    submitted.ok();
    let id = submitted.json()["ids"][0].as_u64().unwrap();
    let spool = cluster.spool_dir("node-a");
    let marker = spool.join(format!("checkpoints/{id}/in-container"));
    wait_until("the container job to start", Duration::from_secs(60), || {
        marker.exists().then_some(())
    });
    // Output reaches the file through the runtime, a moment later.
    let out_file = spool.join(format!("jobs/{id}.1.out"));
    let out = wait_until("the container job's output", Duration::from_secs(30), || {
        std::fs::read_to_string(&out_file)
            .ok()
            .filter(|out| out.ends_with('\n'))
    });
    assert_eq!(out.trim(), format!("cvd=0,1 uid={}", nobody.uid));
    cluster.gpool(&["cancel", &id.to_string()]).ok();
    cluster.wait_for_state(id, "cancelled");
    let name_prefix = "gpool-";
    wait_until("the container to be gone", Duration::from_secs(30), || {
        let listed = std::process::Command::new("podman")
            .env("CONTAINERS_CONF", &conf)
            .args(["ps", "--all", "--format", "{{.Names}} {{.Image}}"])
            .output()
            .ok()?;
        let listed = String::from_utf8_lossy(&listed.stdout).to_string();
        (!listed
            .lines()
            .any(|line| line.starts_with(name_prefix) && line.contains(&image)))
        .then_some(())
    });
    // Nor its runtime process (which names this test's spool); conmon and
    // the job went with the container.
    let pattern = spool.join(format!("checkpoints/{id}")).display().to_string();
    wait_until("the container's processes to be gone", Duration::from_secs(30), || {
        let found = std::process::Command::new("pgrep")
            .args(["-f", &pattern])
            .output()
            .ok()?;
        found.stdout.is_empty().then_some(())
    });
    let _ = std::process::Command::new("podman")
        .env("CONTAINERS_CONF", &conf)
        .args(["rmi", "--force", &image])
        .output();
}

/// A job its --mem limit's OOM killer ends is out_of_memory, not a bare
/// "killed by signal 9"; the jobs after it are not.
#[test]
fn a_job_over_its_memory_limit_ends_out_of_memory() {
    if !nix::unistd::geteuid().is_root() {
        crate::harness::skip("root", "cgroups need root");
        return;
    }
    if !std::path::Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists()
        && !std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
    {
        crate::harness::skip("root", "no memory cgroup on this host");
        return;
    }
    let mut cluster = Cluster::start();
    cluster.start_agent("node-a", 1);
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    if nodes[0]["labels"]["isolation"].as_str().unwrap_or_default() == "none" {
        crate::harness::skip(
            "root",
            "this host offers the agent no cgroup (the agent's log says why)",
        );
        return;
    }
    // The shell holds 200 MB in a variable.
    let run = cluster.gpool(&[
        "submit",
        "--wait",
        "--mem",
        "32M",
        "--",
        "sh",
        "-c",
        "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo ${#x}",
    ]);
    let id: u64 = run.stdout.trim().parse().expect("job id");
    let job = cluster.job(id);
    // A node that placed it enforces memory (its `gpool.enforces`): a job
    // that completed past its limit is a failure, never a skip.
    assert_eq!(job["state"], "out_of_memory", "{job}");
    assert!(
        job["end_reason"]
            .as_str()
            .unwrap_or_default()
            .contains("ran out of memory"),
        "{job}"
    );
    // The next jobs of the same limit on the same GPU are not charged that
    // OOM kill (no cgroup that counts one is given to another attempt),
    // whether they ran out of memory themselves or not.
    for _ in 0..3 {
        let run = cluster.gpool(&["submit", "--wait", "--mem", "32M", "--", "sh", "-c", "exit 3"]);
        let next: u64 = run.stdout.trim().parse().expect("job id");
        let job = cluster.job(next);
        assert_eq!(job["state"], "failed", "{job}");
        assert_eq!(job["exit_code"], 3, "{job}");
    }
}

/// A job that ignores its time limit's SIGTERM works on through the limit's
/// grace; if its agent stops just then, the node's lease still ends it
/// before gpoold gives the node up. Its limit has run out, so gpoold ends
/// it as timed out instead of starting it elsewhere with a fresh limit:
/// two attempts never run at once, and the job never runs past its limit.
#[test]
fn the_lease_cuts_a_time_limits_grace_so_a_job_never_runs_twice() {
    use nix::sys::signal::Signal;
    let (cluster, agent_a) = first_attempt_on_node_a();
    let script = "trap 'echo term $GPOOL_ATTEMPT >> ticks' TERM; \
                  while true; do echo \"tick $GPOOL_ATTEMPT $(date +%s%3N)\" >> ticks; sleep 0.1; done";
    let id = cluster.submit(&["--time", "8s", "--", "sh", "-c", script]);
    cluster.wait_for_state(id, "running");
    cluster.gpool(&["resume", "node-b"]).ok();
    // Its time limit's SIGTERM: the job works on; its agent stops now.
    wait_until("the time limit's SIGTERM", Duration::from_secs(30), || {
        read(&cluster, "ticks").contains("term 1").then_some(())
    });
    let agent_pid = cluster.agents[agent_a].pid();
    nix::sys::signal::kill(agent_pid, Signal::SIGSTOP).expect("stop the agent");
    let ended = cluster.wait_for_state(id, "timeout");
    // The lease ended attempt 1 before gpoold gave its node up: with the
    // agent still stopped, it ticks no more.
    let ticks_then = read(&cluster, "ticks");
    std::thread::sleep(Duration::from_secs(2));
    let ticks = read(&cluster, "ticks");
    nix::sys::signal::kill(agent_pid, Signal::SIGCONT).expect("continue the agent");
    assert_eq!(ticks, ticks_then, "attempt 1 still ran after gpoold gave its node up");
    assert!(!ticks.contains("tick 2 "), "a second attempt ran: {ticks}");
    assert_eq!(ended["attempt"], 1, "{ended}");
}

/// Several controller addresses, as for the controllers of one pool where
/// one is down: the agent and the CLI try them in turn, pass over one that
/// does not answer, and reach the one that does.
#[test]
fn the_agent_and_the_cli_try_each_named_controller_in_turn() {
    let mut cluster = Cluster::start();
    let silent = format!("127.0.0.1:{}", crate::harness::free_port());
    let both = format!("{silent}, {}", cluster.addr);
    let top = format!("controller = \"{both}\"\n");
    cluster.spawn_agent("node-a", 2, &top, "", None);
    cluster.wait_for_registered("node-a");
    let run = crate::harness::cluster::gpool_command(&["submit", "--gpus", "1", "--wait", "--", "true"])
        .current_dir(cluster.dir.path())
        .env("GPOOL_SERVER", &both)
        .output()
        .expect("run gpool");
    let run = crate::harness::cluster::Run::from(run);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    // Without [ha] one controller answers for itself.
    let controllers = cluster.gpool(&["controllers", "--output", "json"]).json();
    assert_eq!(controllers["ha"], false, "{controllers}");
    assert_eq!(
        controllers["controllers"][0]["advertise"], cluster.addr,
        "{controllers}"
    );
    // None answering: each is named with why.
    let other = format!("127.0.0.1:{}", crate::harness::free_port());
    let run = crate::harness::cluster::gpool_command(&["jobs"])
        .env("GPOOL_SERVER", format!("{silent},{other}"))
        .output()
        .expect("run gpool");
    let run = crate::harness::cluster::Run::from(run);
    assert_eq!(run.code, 69, "{}", run.stderr);
    assert!(
        run.stderr.contains(&silent) && run.stderr.contains(&other),
        "{}",
        run.stderr
    );
}
