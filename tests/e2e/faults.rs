//! Faults a real fleet sees every week: partitions (real link-downs between
//! network namespaces), slow log readers, poison specs, agents that die,
//! nodes that leave. A job must never run twice at once, and one bad job or
//! reader must never take a node down.

use crate::harness::cluster::{gpool_command, Cluster};
use crate::harness::netns::Net;
use crate::harness::process::wait_until;
use std::time::{Duration, Instant};

/// A controller on a bridge and `n_hosts` agents (one GPU each) on hosts
/// of their own, or the reason there can be none here.
fn partitioned_cluster(node_timeout: &str, n_hosts: usize) -> Option<(Cluster, Net, Vec<String>)> {
    let mut net = match Net::create() {
        Ok(net) => net,
        Err(reason) => {
            crate::harness::skip("root", &format!("partitions need network namespaces: {reason}"));
            return None;
        }
    };
    let extra = format!("insecure_plaintext = true\nplaintext_from = [\"{}\"]\n", net.range());
    let mut cluster = Cluster::with_config_in_and_timeout(Cluster::temp_dir(), &net.gateway(), node_timeout, &extra);
    let mut hosts = Vec::new();
    for host_idx in 0..n_hosts {
        let (namespace, _) = net.add_host().expect("a network namespace");
        let node = format!("n{}", host_idx + 1);
        let top = format!("controller = \"http://{}\"\n", cluster.addr);
        cluster.spawn_agent(&node, 1, &top, "", Some(&namespace));
        cluster.wait_for_registered(&node);
        hosts.push(namespace);
    }
    Some((cluster, net, hosts))
}

/// A job that appends "<attempt> <ns since epoch>" to `marker` every 50 ms.
fn marking_job(cluster: &Cluster, marker: &std::path::Path) -> u64 {
    let script = format!(
        "while true; do echo \"$GPOOL_ATTEMPT $(date +%s%N)\" >> {}; sleep 0.05; done",
        marker.display()
    );
    cluster.submit(&["--gpus", "1", "--", "sh", "-c", &script])
}

/// A marking job, once it runs and has marked: its id and marks file.
fn a_marking_job_that_marks(cluster: &Cluster) -> (u64, std::path::PathBuf) {
    let marker = cluster.dir.path().join("marks");
    let id = marking_job(cluster, &marker);
    cluster.wait_for_state(id, "running");
    wait_until("the first marks", Duration::from_secs(10), || {
        marks(&marker).contains_key(&1).then_some(())
    });
    (id, marker)
}

/// Each attempt's first and last mark, by attempt.
fn marks(marker: &std::path::Path) -> std::collections::BTreeMap<u32, (u128, u128)> {
    let mut spans = std::collections::BTreeMap::new();
    for line in std::fs::read_to_string(marker).unwrap_or_default().lines() {
        let Some((attempt, at)) = line.split_once(' ') else {
            continue;
        };
        let (Ok(attempt), Ok(at)) = (attempt.parse::<u32>(), at.parse::<u128>()) else {
            continue;
        };
        let span = spans.entry(attempt).or_insert((at, at));
        span.0 = span.0.min(at);
        span.1 = span.1.max(at);
    }
    spans
}

fn node_of(cluster: &Cluster, id: u64) -> String {
    cluster.job(id)["placement"][0]["node"]
        .as_str()
        .expect("a running job's node")
        .to_string()
}

#[test]
fn a_partition_longer_than_the_node_timeout_never_runs_an_attempt_twice_at_once() {
    let Some((cluster, net, hosts)) = partitioned_cluster("6s", 2) else {
        return;
    };
    for round in 0..2 {
        let marker = cluster.dir.path().join(format!("marks-{round}"));
        let id = marking_job(&cluster, &marker);
        cluster.wait_for_state(id, "running");
        let node = node_of(&cluster, id);
        let host = &hosts[if node == "n1" { 0 } else { 1 }];
        wait_until("the first marks", Duration::from_secs(10), || {
            marks(&marker).contains_key(&1).then_some(())
        });
        net.set_connected(host, false).unwrap();
        // gpoold gives the node up after 6 s and starts attempt 2 on the
        // other node; the link comes back well after.
        let job = wait_until("attempt 2 to run", Duration::from_secs(30), || {
            let job = cluster.job(id);
            (job["attempt"] == 2 && job["state"] == "running").then_some(job)
        });
        assert_ne!(job["placement"][0]["node"].as_str(), Some(node.as_str()));
        wait_until("attempt 2 to mark", Duration::from_secs(10), || {
            marks(&marker).contains_key(&2).then_some(())
        });
        std::thread::sleep(Duration::from_secs(4));
        net.set_connected(host, true).unwrap();
        cluster.wait_for_registered(&node);
        std::thread::sleep(Duration::from_secs(2));
        cluster.gpool(&["cancel", &id.to_string()]).ok();
        cluster.wait_for_state(id, "cancelled");
        let spans = marks(&marker);
        let (first, second) = (spans[&1], spans[&2]);
        assert!(
            first.1 < second.0,
            "round {round}: attempt 1 marked until {} ns, after attempt 2 began at {} ns",
            first.1,
            second.0
        );
        assert_eq!(spans.len(), 2, "round {round}: only two attempts ran: {spans:?}");
    }
}

#[test]
fn a_partition_shorter_than_the_lease_requeues_nothing() {
    let Some((cluster, net, hosts)) = partitioned_cluster("12s", 1) else {
        return;
    };
    let (id, marker) = a_marking_job_that_marks(&cluster);
    net.set_connected(&hosts[0], false).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    net.set_connected(&hosts[0], true).unwrap();
    // Longer than the node timeout after the cut.
    std::thread::sleep(Duration::from_secs(12));
    let job = cluster.job(id);
    assert_eq!(
        (job["state"].as_str(), job["attempt"].as_u64()),
        (Some("running"), Some(1)),
        "{job}"
    );
    assert_eq!(marks(&marker).len(), 1);
}

/// A partition longer than the lease but shorter than the node timeout:
/// the node stops its attempt itself, and once back it reports that; the
/// job is requeued and says why, naming the node.
#[test]
fn a_job_its_node_fenced_says_why_it_ran_again() {
    let Some((cluster, net, hosts)) = partitioned_cluster("16s", 1) else {
        return;
    };
    let (id, _) = a_marking_job_that_marks(&cluster);
    net.set_connected(&hosts[0], false).unwrap();
    // The lease (8 s) and its grace (4 s at most) pass; the node timeout
    // does not.
    std::thread::sleep(Duration::from_secs(10));
    net.set_connected(&hosts[0], true).unwrap();
    let job = wait_until("attempt 2 to run", Duration::from_secs(30), || {
        let job = cluster.job(id);
        (job["attempt"] == 2).then_some(job)
    });
    assert_eq!(job["requeue_cause"], "node_lost", "{job}");
    let events = job["events"].to_string();
    assert!(
        events.contains("on n1: the node heard from no controller for longer than its lease"),
        "{job}"
    );
}

#[test]
fn an_attempt_that_finished_during_a_partition_is_not_run_again() {
    let Some((cluster, net, hosts)) = partitioned_cluster("6s", 2) else {
        return;
    };
    let marker = cluster.dir.path().join("done");
    let started = cluster.dir.path().join("started");
    // Attempt 1 ends in a second; any later attempt would take 30 s.
    let script = format!(
        "touch {}; if [ \"$GPOOL_ATTEMPT\" = 1 ]; then sleep 1; else sleep 30; fi; echo \"done $GPOOL_ATTEMPT\" >> {}",
        started.display(),
        marker.display()
    );
    let id = cluster.submit(&["--gpus", "1", "--", "sh", "-c", &script]);
    cluster.wait_for_state(id, "running");
    wait_until("attempt 1 to start", Duration::from_secs(10), || {
        started.exists().then_some(())
    });
    let node = node_of(&cluster, id);
    let host = &hosts[if node == "n1" { 0 } else { 1 }];
    net.set_connected(host, false).unwrap();
    wait_until(
        "the job to be requeued and started again",
        Duration::from_secs(30),
        || (cluster.job(id)["attempt"] == 2).then_some(()),
    );
    net.set_connected(host, true).unwrap();
    let job = cluster.wait_for_state(id, "completed");
    assert_eq!(job["exit_code"].as_i64(), Some(0), "{job}");
    // The newer attempt was stopped, not run to its end.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "done 1\n");
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    for node in nodes.as_array().unwrap() {
        assert_eq!(node["gpus_free"], node["gpus_total"], "{node}");
    }
}

#[test]
fn a_no_requeue_job_keeps_running_through_a_partition_and_is_reconciled() {
    let Some((cluster, net, hosts)) = partitioned_cluster("4s", 1) else {
        return;
    };
    let marker = cluster.dir.path().join("marks");
    let script = format!(
        "for i in $(seq 150); do echo \"$GPOOL_ATTEMPT $(date +%s%N)\" >> {}; sleep 0.1; done",
        marker.display()
    );
    let id = cluster.submit(&["--gpus", "1", "--no-requeue", "--", "sh", "-c", &script]);
    cluster.wait_for_state(id, "running");
    // "running" is gpoold's word once it sent the start; cut the link only
    // once the process itself runs.
    wait_until("the first marks", Duration::from_secs(10), || {
        marks(&marker).contains_key(&1).then_some(())
    });
    net.set_connected(&hosts[0], false).unwrap();
    cluster.wait_for_node("n1", "down");
    // Never fenced, never failed for the outage: it still holds its GPU.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(cluster.job(id)["state"], "running");
    let marked_during = marks(&marker)[&1].1;
    net.set_connected(&hosts[0], true).unwrap();
    cluster.wait_for_registered("n1");
    let job = cluster.wait_for_state(id, "completed");
    assert_eq!(job["attempt"], 1, "{job}");
    assert!(marks(&marker)[&1].1 > marked_during, "it ran on through the partition");
}

#[test]
fn a_stalled_log_reader_never_takes_its_node_down() {
    let mut cluster = Cluster::with_node_timeout("4s");
    cluster.start_agent("n1", 2);
    let id = cluster.submit(&[
        "--gpus",
        "1",
        "--",
        "sh",
        "-c",
        "head -c 30000000 /dev/zero | tr '\\0' x; sleep 120",
    ]);
    let beside = cluster.submit(&["--gpus", "1", "--", "sleep", "120"]);
    cluster.wait_for_state(id, "running");
    cluster.wait_for_state(beside, "running");
    // Like `gpool logs --follow J | less` with nobody scrolling: stdout is
    // a pipe nobody reads.
    let mut reader = gpool_command(&["logs", "--follow", &id.to_string()])
        .env("GPOOL_SERVER", &cluster.addr)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_secs(10));
    for job_id in [id, beside] {
        let job = cluster.job(job_id);
        assert_eq!(
            (job["state"].as_str(), job["attempt"].as_u64()),
            (Some("running"), Some(1)),
            "{job}"
        );
    }
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    assert_ne!(nodes[0]["state"], "down", "{nodes}");
    // The reader was dropped with a message saying so.
    let mut stdout = reader.stdout.take().unwrap();
    let drained = std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()).unwrap());
    let output = reader.wait_with_output().unwrap();
    let n_read = drained.join().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("fell more than"), "{n_read} bytes, then: {stderr}");
    assert!(n_read < 30_000_000);
    // And the agent stopped reading for it.
    let agent_log = cluster.agents[0].log.clone();
    wait_until("the agent to stop the read", Duration::from_secs(10), || {
        std::fs::read_to_string(&agent_log)
            .ok()?
            .contains("stopped: its reader is gone")
            .then_some(())
    });
}

#[test]
fn a_poison_spec_is_refused_at_the_door_and_jobs_beside_it_finish() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 2);
    let ids: Vec<u64> = (0..3).map(|_| cluster.submit(&["--", "true"])).collect();
    // Too long for any exec: from a job file.
    let file = cluster.dir.path().join("arg.toml");
    let huge = "x".repeat(5 * 1024 * 1024);
    std::fs::write(&file, format!("[[job]]\ncommand = [\"echo\", \"{huge}\"]\n")).unwrap();
    let run = cluster.gpool(&["submit", "-f", &file.display().to_string()]);
    assert_ne!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("command: argument 1 is 5242880 bytes, more than the limit of 131072"),
        "{}",
        run.stderr
    );
    let file = cluster.dir.path().join("env.toml");
    let env: String = (0..200_000).map(|i| format!("V{i} = \"\"\n")).collect();
    std::fs::write(&file, format!("[[job]]\ncommand = [\"true\"]\n[job.env]\n{env}")).unwrap();
    let run = cluster.gpool(&["submit", "-f", &file.display().to_string()]);
    assert_ne!(run.code, 0);
    assert!(
        run.stderr
            .contains("env: 200000 variables, more than the limit of 1024"),
        "{}",
        run.stderr
    );
    for id in ids {
        let job = cluster.wait_for_state(id, "completed");
        assert_eq!(job["attempt"], 1, "{job}");
    }
}

#[test]
fn the_supervisor_enforces_time_limits_while_the_agent_is_down() {
    let mut cluster = Cluster::start();
    let agent = cluster.start_agent("n1", 1);
    let pid_file = cluster.dir.path().join("pid");
    let script = format!("echo $$ > {}; exec sleep 120", pid_file.display());
    let id = cluster.submit(&["--time", "3s", "--", "sh", "-c", &script]);
    cluster.wait_for_state(id, "running");
    let pid: i32 = wait_until("the job's pid", Duration::from_secs(10), || {
        std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok()
    });
    cluster.agents[agent].kill9();
    let started = Instant::now();
    wait_until("the job to end at its limit", Duration::from_secs(20), || {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None)
            .is_err()
            .then_some(())
    });
    assert!(started.elapsed() < Duration::from_secs(15));
    cluster.start_agent("n1", 1);
    let job = cluster.wait_for_state(id, "timeout");
    assert!(
        job["end_reason"].as_str().unwrap_or_default().contains("time limit"),
        "{job}"
    );
}

#[test]
fn nodes_can_be_removed_and_are_forgotten_when_down_too_long() {
    let mut cluster =
        Cluster::with_config_in_and_timeout(Cluster::temp_dir(), "127.0.0.1", "4s", "forget_nodes_after = \"5s\"\n");
    let top = format!("controller = \"{}\"\n", cluster.addr);
    let n1 = cluster.spawn_agent("n1", 1, &top, "", None);
    cluster.wait_for_registered("n1");
    let n2 = cluster.spawn_agent("n2", 1, &top, "", None);
    cluster.wait_for_registered("n2");
    let id = cluster.submit(&["--gpus", "1", "--no-requeue", "--", "sleep", "120"]);
    cluster.wait_for_state(id, "running");
    let node = node_of(&cluster, id);
    let run = cluster.gpool(&["admin", "node", "remove", &node]);
    assert_ne!(run.code, 0);
    assert!(run.stderr.contains(&format!("still runs job {id}")), "{}", run.stderr);
    let other = if node == "n1" { "n2" } else { "n1" };
    cluster.gpool(&["admin", "node", "remove", other]).ok();
    let names = |cluster: &Cluster| -> Vec<String> {
        let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
        nodes
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&cluster), std::slice::from_ref(&node));
    // Its agent registers again: the node is back.
    wait_until("the removed node to come back", Duration::from_secs(15), || {
        (names(&cluster).len() == 2).then_some(())
    });
    // Agents gone for good: down after 4 s, forgotten 5 s later, except the
    // one whose no-requeue job still holds its GPU until it is cancelled.
    cluster.agents[n1].kill9();
    cluster.agents[n2].kill9();
    wait_until("the idle node to be forgotten", Duration::from_secs(30), || {
        (names(&cluster) == [node.clone()]).then_some(())
    });
    assert_eq!(cluster.job(id)["state"], "running");
    cluster.gpool(&["cancel", &id.to_string()]).ok();
    cluster.gpool(&["admin", "node", "remove", &node]).ok();
    assert!(names(&cluster).is_empty());
}

/// The chaos run: a few hundred jobs (12 to 30 s each; one in six outruns
/// its time limit, ignoring the SIGTERM) through four agents of 8 GPUs on
/// hosts of their own while gpoold is killed, agents are killed and
/// stopped, and links are cut, for 2.5 minutes. Prints its figures; fails on any lost or stuck job, any two
/// attempts of a job running at once, or a finished attempt run again.
/// `cargo test -p gpool-tests --test e2e chaos -- --ignored --nocapture`
#[test]
#[ignore = "a few minutes long; run by hand"]
fn chaos() {
    use nix::sys::signal::{kill, Signal};
    const N_JOBS: u64 = 300;
    let Some((mut cluster, net, hosts)) = partitioned_cluster("6s", 0) else {
        return;
    };
    let top = format!("controller = \"http://{}\"\n", cluster.addr);
    let mut hosts = hosts;
    let mut agent_of = Vec::new();
    let mut net = net;
    for node_idx in 0..4 {
        let (namespace, _) = net.add_host().expect("a network namespace");
        let node = format!("n{}", node_idx + 1);
        agent_of.push(cluster.spawn_agent(&node, 8, &top, "", Some(&namespace)));
        cluster.wait_for_registered(&node);
        hosts.push(namespace);
    }
    let marks = cluster.dir.path().join("marks");
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64 ^ std::process::id() as u64;
    let mut random = move |below: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % below
    };
    let mut ids = Vec::new();
    let mut overrunners = std::collections::BTreeSet::new();
    for job_idx in 0..N_JOBS {
        // 12 to 30 s: longer than any outage here, as real jobs are.
        let ticks = 120 + random(180);
        let script = format!(
            "for i in $(seq {ticks}); do echo \"$GPOOL_JOB_ID $GPOOL_ATTEMPT $(date +%s%N)\" >> {m}; sleep 0.1; done; echo \"$GPOOL_JOB_ID $GPOOL_ATTEMPT done\" >> {m}",
            m = marks.display()
        );
        // One job in six outruns an 8 s time limit and ignores its SIGTERM:
        // it works through the limit's grace, where the outages below
        // catch some (the lease must still end it before it runs elsewhere).
        let id = if job_idx % 6 == 0 {
            let script = format!("trap '' TERM; {script}");
            let id = cluster.submit(&["--gpus", "1", "--time", "8s", "--", "sh", "-c", &script]);
            overrunners.insert(id);
            id
        } else {
            cluster.submit(&["--gpus", "1", "--", "sh", "-c", &script])
        };
        ids.push(id);
    }
    let (mut n_gpoold_kills, mut n_agent_kills, mut n_stops, mut n_cuts) = (0, 0, 0, 0);
    let chaos_until = Instant::now() + Duration::from_secs(150);
    let wall_ns = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    };
    let mut events: Vec<(u128, String)> = Vec::new();
    while Instant::now() < chaos_until {
        let node_idx = random(4) as usize;
        let node = format!("n{}", node_idx + 1);
        let action = random(4);
        events.push((wall_ns(), format!("action {action} on {node}")));
        match action {
            0 => {
                cluster.controller().kill9();
                std::thread::sleep(Duration::from_millis(random(3000)));
                cluster.start_controller();
                n_gpoold_kills += 1;
            }
            1 => {
                cluster.agents[agent_of[node_idx]].kill9();
                std::thread::sleep(Duration::from_millis(1000 + random(9000)));
                agent_of[node_idx] = cluster.spawn_agent(&node, 8, &top, "", Some(&hosts[node_idx]));
                n_agent_kills += 1;
            }
            2 => {
                let pid = cluster.agents[agent_of[node_idx]].pid();
                let _ = kill(pid, Signal::SIGSTOP);
                std::thread::sleep(Duration::from_millis(2000 + random(8000)));
                let _ = kill(pid, Signal::SIGCONT);
                n_stops += 1;
            }
            _ => {
                net.set_connected(&hosts[node_idx], false).unwrap();
                std::thread::sleep(Duration::from_millis(2000 + random(10000)));
                net.set_connected(&hosts[node_idx], true).unwrap();
                n_cuts += 1;
            }
        }
        events.push((wall_ns(), format!("action {action} on {node} over")));
        std::thread::sleep(Duration::from_millis(1000 + random(3000)));
    }
    let settle = Instant::now();
    let states = wait_until("every job to end", Duration::from_secs(300), || {
        let jobs = cluster.gpool(&["jobs", "--all", "--output", "json"]).json();
        let jobs = jobs.as_array()?.clone();
        jobs.iter()
            .all(|job| {
                [
                    "completed",
                    "failed",
                    "cancelled",
                    "timeout",
                    "node_fail",
                    "out_of_memory",
                ]
                .contains(&job["state"].as_str().unwrap_or(""))
            })
            .then_some(jobs)
    });
    let listed: std::collections::BTreeMap<u64, serde_json::Value> = states
        .into_iter()
        .map(|job| (job["id"].as_u64().unwrap(), job))
        .collect();
    let lost = ids.iter().filter(|id| !listed.contains_key(id)).count();
    // Those that outrun their limit end timed out, and only those.
    let not_completed: Vec<String> = listed
        .values()
        .filter(|job| {
            let overran = job["id"].as_u64().is_some_and(|id| overrunners.contains(&id));
            job["state"] != if overran { "timeout" } else { "completed" }
        })
        .map(|job| format!("{} {} {}", job["id"], job["state"], job["end_reason"]))
        .collect();
    // Per job and attempt: first and last mark, and whether it finished.
    let mut spans: std::collections::BTreeMap<(u64, u32), (u128, u128, bool)> = Default::default();
    for line in std::fs::read_to_string(&marks).unwrap_or_default().lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let [job, attempt, what] = fields[..] else { continue };
        let (Ok(job), Ok(attempt)) = (job.parse::<u64>(), attempt.parse::<u32>()) else {
            continue;
        };
        let span = spans.entry((job, attempt)).or_insert((u128::MAX, 0, false));
        match what.parse::<u128>() {
            Ok(at) => {
                span.0 = span.0.min(at);
                span.1 = span.1.max(at);
            }
            Err(_) => span.2 = true,
        }
    }
    let mut overlaps = 0;
    let mut reruns = 0;
    for id in &ids {
        let attempts: Vec<&(u128, u128, bool)> = spans.range((*id, 0)..(*id + 1, 0)).map(|(_, span)| span).collect();
        for (i, a) in attempts.iter().enumerate() {
            for b in &attempts[i + 1..] {
                if a.0 <= b.1 && b.0 <= a.1 {
                    overlaps += 1;
                }
            }
        }
        let n_done = attempts.iter().filter(|span| span.2).count();
        if n_done > 1 {
            println!("job {id} finished {n_done} times: {attempts:?} {}", listed[id]);
            print_log_lines(cluster.dir.path(), &format!("job={id} "));
        }
        reruns += n_done.saturating_sub(1);
    }
    for (at, what) in &events {
        println!("{at} {what}");
    }
    let n_attempts: u64 = listed.values().filter_map(|job| job["attempt"].as_u64()).sum();
    println!(
        "chaos: {N_JOBS} jobs ({} outrun their time limit), {n_attempts} attempts; {n_gpoold_kills} gpoold kill -9, {n_agent_kills} agent kill -9, {n_stops} agent SIGSTOPs, {n_cuts} link cuts; \
         settled in {:.0} s; lost {lost}, stuck 0, not ended as expected {}, concurrent double runs {overlaps}, finished attempts run again {reruns}",
        overrunners.len(),
        settle.elapsed().as_secs_f64(),
        not_completed.len()
    );
    assert_eq!((lost, overlaps, reruns), (0, 0, 0), "not completed: {not_completed:?}");
    assert!(not_completed.is_empty(), "{not_completed:?}");
}

/// The lines of every log in `dir` that contain `needle` (ANSI colours off).
fn print_log_lines(dir: &std::path::Path, needle: &str) {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "log"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let plain: String = strip_ansi(&text);
        for line in plain
            .lines()
            .filter(|line| line.contains(needle) || line.contains("node is down") || line.contains("registered"))
        {
            println!("  {}: {line}", file.file_name().unwrap().to_string_lossy());
        }
    }
}

fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
