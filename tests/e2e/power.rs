//! `[[power]]` groups as an operator runs them: the shipped policy, an A100
//! and an L4 node awake, and a group of H100 nodes that sleep. The group's
//! `resume` program starts a real gpool-agent for each node it is given
//! (as a process on loopback), and `suspend` stops it, as a cloud's
//! scripts would create and delete instances.

use crate::harness::cluster::Cluster;
use crate::harness::netns::Net;
use crate::harness::process::{binary, wait_until};
use crate::preemption::{agent_config, shipped_policy};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

/// Ends the agents (and hung programs) the group's programs started, by
/// the pids they wrote, when the test ends.
struct StartedByPrograms(std::path::PathBuf);

impl Drop for StartedByPrograms {
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir(&self.0) else {
            return;
        };
        for entry in entries.filter_map(Result::ok) {
            if entry.path().extension().is_some_and(|ext| ext == "pid") {
                if let Some(pid) = std::fs::read_to_string(entry.path())
                    .ok()
                    .and_then(|text| text.trim().parse::<i32>().ok())
                {
                    // Each leads a process group: a resume program (gpoold
                    // starts each in a group of its own) with what it runs,
                    // an agent started with setsid.
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(-pid), nix::sys::signal::SIGKILL);
                }
            }
        }
    }
}

/// Writes the group's programs into `dir`: `resume` (after `delay`
/// seconds; starting nothing where `starts` is false) starts an agent for
/// each node named, once; `suspend` stops it. Each notes what it did in a
/// file there.
fn write_programs(dir: &Path, starts: bool, delay: &str) {
    let agent = binary("gpool-agent").display().to_string();
    let d = dir.display();
    let start = if starts {
        // In the node's own network namespace where the test made one.
        format!(
            "if [ -f {d}/$node.pid ] && kill -0 $(cat {d}/$node.pid) 2>/dev/null; then continue; fi\n  \
             ns=$(cat {d}/$node.ns 2>/dev/null)\n  \
             if [ -n \"$ns\" ]; then in_ns=\"ip netns exec $ns\"; else in_ns=; fi\n  \
             setsid $in_ns {agent} --config {d}/$node.toml > {d}/$node.log 2>&1 < /dev/null &\n  \
             echo $! > {d}/$node.pid"
        )
    } else {
        "echo \"not starting $node\"".to_string()
    };
    let resume = format!(
        "#!/bin/sh\necho $$ > {d}/resume-running-$$.pid\nsleep {delay}\necho \"$1\" >> {d}/resumed\n\
         [ -n \"$2\" ] && cp \"$2\" {d}/last-resume.json\n\
         for node in $(echo \"$1\" | tr , ' '); do\n  {start}\ndone\nrm -f {d}/resume-running-$$.pid\n"
    );
    let suspend = format!(
        "#!/bin/sh\necho \"$1\" >> {d}/suspended\nfor node in $(echo \"$1\" | tr , ' '); do\n  \
         [ -f {d}/$node.pid ] && kill $(cat {d}/$node.pid) && rm {d}/$node.pid\ndone\nexit 0\n"
    );
    let failed = format!("#!/bin/sh\necho \"$1\" >> {d}/failed-resumes\n");
    for (name, text) in [("resume", resume), ("suspend", suspend), ("on-resume-failed", failed)] {
        let path = dir.join(name);
        std::fs::write(&path, text).expect("program");
        let mut permissions = std::fs::metadata(&path).expect("program").permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
        std::fs::set_permissions(&path, permissions).expect("chmod");
    }
}

/// The agent.toml each cloud node's agent would have on its image.
fn node_configs(cluster: &Cluster, dir: &Path, nodes: &[&str]) {
    for node in nodes {
        let spool = cluster.spool_dir(node);
        let text = format!(
            "controller = \"http://{}\"\nnode_name = \"{node}\"\nspool_dir = \"{}\"\nheartbeat_interval = \"200ms\"\n\
             min_spool_free = \"1M\"\n{}",
            cluster.addr,
            spool.display(),
            agent_config("h100", 8, 81_559, "")
        );
        std::fs::write(dir.join(format!("{node}.toml")), text).expect("node config");
    }
}

/// The shipped policy with a `[[power]]` group of three 8-GPU H100 nodes
/// whose programs live in `dir` (written before the controller starts).
fn policy_with_group(dir: &Path, top: &str, extra: &str) -> String {
    let d = dir.display();
    format!(
        "metrics_listen = \"127.0.0.1:0\"\n{top}{}\n[[power]]\nname = \"cloud\"\nnodes = \"cloud-h100-[1-3]\"\nmodel = \"h100\"\ngpus = 8\n\
         gpu_memory = \"80G\"\nprice_per_gpu_hour = 4.10\nresume = \"{d}/resume\"\nsuspend = \"{d}/suspend\"\n\
         resume_failed = \"{d}/on-resume-failed\"\n{extra}",
        shipped_policy()
    )
}

/// A controller with the shipped policy and the group (`extra` ends its
/// table), an A100 and an L4 node awake, and the group's programs in a
/// temp dir of their own (`starts`, `delay`: see `write_programs`). With
/// `in_namespaces`, where the test may make network namespaces (root),
/// each cloud node's agent runs in one of its own and dials gpoold on a
/// bridge; else on loopback.
fn start(
    starts: bool,
    delay: &str,
    extra: &str,
    in_namespaces: bool,
) -> (Cluster, tempfile::TempDir, Option<Net>, StartedByPrograms) {
    let programs = Cluster::temp_dir();
    write_programs(programs.path(), starts, delay);
    let guard = StartedByPrograms(programs.path().to_path_buf());
    let mut net = match in_namespaces.then(Net::create) {
        Some(Ok(net)) => Some(net),
        Some(Err(reason)) => {
            eprintln!("the cloud nodes run on loopback: {reason}");
            None
        }
        None => None,
    };
    let top = net.as_ref().map_or_else(String::new, |net| {
        format!("insecure_plaintext = true\nplaintext_from = [\"{}\"]\n", net.range())
    });
    let text = policy_with_group(programs.path(), &top, extra);
    let mut cluster = match &net {
        Some(net) => Cluster::with_config_in(Cluster::temp_dir(), &net.gateway(), &text),
        None => Cluster::with_config(&text),
    };
    let cloud = ["cloud-h100-1", "cloud-h100-2", "cloud-h100-3"];
    node_configs(&cluster, programs.path(), &cloud);
    if let Some(net) = net.as_mut() {
        for node in cloud {
            let (namespace, _) = net.add_host().expect("a network namespace");
            std::fs::write(programs.path().join(format!("{node}.ns")), namespace).expect("namespace file");
        }
    }
    for (node, model, count, memory_mib, labels) in [
        ("a100-a", "a100-80gb", 8, 81_920, "[labels]\ntier = \"inference\"\n"),
        ("l4-a", "l4", 4, 23_034, ""),
    ] {
        cluster.start_agent_with(node, 0, &agent_config(model, count, memory_mib, labels));
    }
    (cluster, programs, net, guard)
}

fn node<'a>(nodes: &'a Value, name: &str) -> &'a Value {
    nodes
        .as_array()
        .expect("nodes")
        .iter()
        .find(|node| node["name"] == name)
        .unwrap_or_else(|| panic!("{name} is not listed: {nodes}"))
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn nodes(cluster: &Cluster) -> Value {
    cluster.gpool(&["nodes", "--output", "json"]).json()
}

/// A 4-GPU H100 job finds no H100 awake: gpoold resumes one node of the
/// group (whose agent starts in a network namespace of its own, as on
/// another host, where the test runs as root) (the `resume` program gets the node and a JSON file naming the
/// job), `gpool why` says the job waits for it, the node's agent
/// registers and the job runs there. Idle for `suspend_after`, the node is
/// suspended: `suspend` stops its agent and it shows as powered down.
#[test]
fn a_waiting_job_wakes_a_sleeping_node_runs_there_and_the_idle_node_sleeps_again() {
    let (cluster, programs, _net, _guard) =
        start(true, "2", "suspend_after = \"3s\"\nresume_timeout = \"30s\"\n", true);
    let listed = nodes(&cluster);
    for name in ["cloud-h100-1", "cloud-h100-2", "cloud-h100-3"] {
        assert_eq!(node(&listed, name)["state"], "powered_down", "{listed}");
        assert_eq!(node(&listed, name)["gpus_total"], 8);
    }
    // The L4 node takes its job at once; nothing wakes for it.
    let l4 = cluster.submit(&["--team", "vision", "--gpus", "l4:1", "--", "true"]);
    let h100 = cluster.submit(&["--team", "vision", "--gpus", "h100:4", "--", "sh", "-c", "sleep 1"]);
    let why = wait_until("the job to say it waits for a node", Duration::from_secs(20), || {
        let why = cluster.gpool(&["why", &h100.to_string()]);
        why.stdout.contains("to power up").then_some(why.stdout)
    });
    assert!(why.contains("waiting for cloud-h100-1 to power up"), "{why}");
    assert_eq!(node(&nodes(&cluster), "cloud-h100-1")["state"], "powering_up");
    let ran = cluster.wait_for_state(h100, "completed");
    assert_eq!(ran["node_list"][0], "cloud-h100-1", "{ran}");
    assert_eq!(cluster.job(l4)["state"], "completed");
    assert_eq!(lines(&programs.path().join("resumed")), ["cloud-h100-1"]);
    let request: Value =
        serde_json::from_str(&std::fs::read_to_string(programs.path().join("last-resume.json")).expect("jobs file"))
            .expect("JSON");
    assert_eq!(request["jobs"], serde_json::json!([h100]));
    assert_eq!(request["group"], "cloud");
    // Idle for 3 s: suspended, its agent stopped, powered down.
    wait_until("the idle node to be powered down", Duration::from_secs(30), || {
        (node(&nodes(&cluster), "cloud-h100-1")["state"] == "powered_down").then_some(())
    });
    assert_eq!(lines(&programs.path().join("suspended")), ["cloud-h100-1"]);
    assert!(!programs.path().join("cloud-h100-1.pid").exists());
    let listed = nodes(&cluster);
    assert_eq!(
        node(&listed, "cloud-h100-1")["power"]["reason"],
        Value::Null,
        "{listed}"
    );
    assert_eq!(node(&listed, "cloud-h100-2")["state"], "powered_down");
    // The cloud's GPU-hours apart from the owned ones, at its own price.
    let report = cluster.gpool(&["report", "--by", "source"]).ok().to_string();
    let rows: Vec<&str> = report.lines().collect();
    assert!(
        rows.iter().any(|row| row.starts_with("cloud ")) && rows.iter().any(|row| row.starts_with("owned ")),
        "{report}"
    );
    // The status page shows the group.
    let addr = std::fs::read_to_string(cluster.state_dir().join("metrics.addr")).expect("metrics.addr");
    let page = crate::harness::http_get(addr.trim(), "/status").2;
    assert!(page.contains("Sleeping and cloud nodes"), "{page}");
    assert!(page.contains("3 powered_down"), "{page}");
}

/// A `resume` that never starts the agent: each node misses its 2 s
/// timeout, goes back to powered down with the reason (`resume_failed`
/// runs), is tried again after a backoff, and after 2 failures in a row the
/// group pauses and says so. The job is not lost: it waits, and no node is
/// left marked up.
#[test]
fn a_resume_that_never_comes_back_times_out_retries_and_pauses_the_group() {
    let (cluster, programs, _net, _guard) = start(
        false,
        "0",
        "resume_timeout = \"2s\"\npause_after_failures = 2\npause = \"1h\"\nmax_nodes = 1\n",
        false,
    );
    let job = cluster.submit(&["--team", "nlp", "--gpus", "h100:8", "--", "true"]);
    let listed = wait_until("the group to pause", Duration::from_secs(40), || {
        let listed = nodes(&cluster);
        let paused = listed.as_array()?.iter().any(|node| {
            node["power"]["group_paused"]
                .as_str()
                .is_some_and(|p| p.contains("paused after 2"))
        });
        paused.then_some(listed)
    });
    let resumed = lines(&programs.path().join("resumed"));
    assert_eq!(resumed.len(), 2, "two resumes, each of which failed: {resumed:?}");
    let failed = lines(&programs.path().join("failed-resumes"));
    assert_eq!(failed.len(), 2, "resume_failed ran for each: {failed:?}");
    for name in ["cloud-h100-1", "cloud-h100-2", "cloud-h100-3"] {
        assert_eq!(node(&listed, name)["state"], "powered_down", "{listed}");
    }
    let reasons: Vec<&str> = listed
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|node| node["power"]["reason"].as_str())
        .collect();
    assert!(
        reasons.contains(&"resume_failed: no agent registered within 2 s"),
        "{reasons:?}"
    );
    let table = cluster.gpool(&["nodes"]).ok().to_string();
    assert!(
        table.contains("power group cloud paused after 2 failed resumes"),
        "{table}"
    );
    // Paused: no more resumes while it lasts; the job waits, not lost.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(lines(&programs.path().join("resumed")).len(), 2);
    assert_eq!(cluster.job(job)["state"], "pending");
    let addr = std::fs::read_to_string(cluster.state_dir().join("metrics.addr")).expect("metrics.addr");
    let metrics = crate::harness::http_get(addr.trim(), "/metrics").2;
    let value = |series: &str| {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse::<f64>().ok())
    };
    assert_eq!(
        value("gpool_power_group_paused{group=\"cloud\"}"),
        Some(1.0),
        "{metrics}"
    );
    assert_eq!(
        value("gpool_power_resume_failures{group=\"cloud\"}"),
        Some(2.0),
        "{metrics}"
    );
    assert_eq!(
        value("gpool_power_nodes{group=\"cloud\",state=\"powered_down\"}"),
        Some(3.0),
        "{metrics}"
    );
}

/// A `resume` that hangs (for 10 minutes, as a cloud API that never
/// answers): while it hangs, submits are answered and jobs on awake nodes
/// start as fast as before it began.
#[test]
fn a_hung_resume_program_leaves_submits_and_scheduling_as_they_were() {
    let (cluster, programs, _net, _guard) = start(true, "600", "resume_timeout = \"15m\"\n", false);
    let measure = |label: &str| {
        let mut submits = Vec::new();
        let mut starts = Vec::new();
        for _ in 0..5 {
            let at = Instant::now();
            let id = cluster.submit(&["--team", "vision", "--gpus", "l4:1", "--", "true"]);
            submits.push(at.elapsed());
            cluster.wait_for_state(id, "completed");
            starts.push(at.elapsed());
        }
        submits.sort();
        starts.sort();
        eprintln!(
            "{label}: submit median {:?}, submit to completed median {:?}",
            submits[2], starts[2]
        );
        (submits[2], starts[2])
    };
    let (submit_before, done_before) = measure("before");
    let h100 = cluster.submit(&["--team", "vision", "--gpus", "h100:8", "--", "true"]);
    wait_until("the resume program to hang", Duration::from_secs(20), || {
        std::fs::read_dir(programs.path())
            .ok()?
            .filter_map(Result::ok)
            .any(|entry| entry.file_name().to_string_lossy().starts_with("resume-running-"))
            .then_some(())
    });
    let (submit_during, done_during) = measure("while resume hangs");
    assert_eq!(node(&nodes(&cluster), "cloud-h100-1")["state"], "powering_up");
    assert_eq!(cluster.job(h100)["state"], "pending");
    // Loose bounds: a loaded CI machine varies, a blocked loop would not
    // answer within seconds at all.
    assert!(
        submit_during < submit_before * 4 + Duration::from_millis(500),
        "{submit_during:?} against {submit_before:?}"
    );
    assert!(
        done_during < done_before * 4 + Duration::from_secs(1),
        "{done_during:?} against {done_before:?}"
    );
}

/// A budget of 2 nodes: 5 waiting 8-GPU jobs wake 2 nodes, never more, and
/// all 5 run on them in turn.
#[test]
fn a_budget_of_two_nodes_holds_for_five_waiting_whole_node_jobs() {
    let (cluster, programs, _net, _guard) = start(true, "0", "max_nodes = 2\nsuspend_after = \"10m\"\n", false);
    let ids: Vec<u64> = (0..5)
        .map(|_| cluster.submit(&["--team", "nlp", "--gpus", "h100:8", "--", "sleep", "1"]))
        .collect();
    for id in &ids {
        cluster.wait_for_state(*id, "completed");
    }
    let resumed = lines(&programs.path().join("resumed"));
    let mut woken: Vec<String> = resumed
        .iter()
        .flat_map(|line| line.split(',').map(str::to_string))
        .collect();
    woken.sort();
    woken.dedup();
    assert_eq!(woken, ["cloud-h100-1", "cloud-h100-2"], "{resumed:?}");
    let listed = nodes(&cluster);
    assert_eq!(node(&listed, "cloud-h100-3")["state"], "powered_down");
    let ran_on: std::collections::BTreeSet<String> = ids
        .iter()
        .map(|id| {
            cluster.job(*id)["node_list"][0]
                .as_str()
                .unwrap_or_default()
                .to_string()
        })
        .collect();
    assert_eq!(ran_on.len(), 2, "{ran_on:?}");
}
