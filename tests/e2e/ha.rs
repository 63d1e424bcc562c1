//! Two controllers, one leader: the shipped policy run by two gpoolds that
//! share one state dir and are elected through a real etcd (three members
//! on loopback), with H100, A100 and L4 agents that name both controllers.

use crate::harness::cluster::{current_user, Cluster};
use crate::harness::process::{binary, wait_until, Process};
use crate::harness::{free_port, outside_tool};
use crate::preemption::{agent_config, shipped_policy, NODES};
use std::process::Command;
use std::time::{Duration, Instant};

/// Three etcd members on loopback ports, each with its data in the test's
/// dir, and what it takes to start one again.
struct Etcd {
    program: std::path::PathBuf,
    dir: std::path::PathBuf,
    args: Vec<Vec<String>>,
    members: Vec<Option<Process>>,
    starts: usize,
    /// The client endpoints, as TOML strings.
    endpoints: String,
}

impl Etcd {
    fn start(dir: &std::path::Path) -> Option<Etcd> {
        let program = outside_tool("etcd", "etcd-server")?;
        let ports: Vec<(u16, u16)> = (0..3).map(|_| (free_port(), free_port())).collect();
        let cluster: Vec<String> = ports
            .iter()
            .enumerate()
            .map(|(member, (_, peer))| format!("e{member}=http://127.0.0.1:{peer}"))
            .collect();
        let args = ports
            .iter()
            .enumerate()
            .map(|(member, (client, peer))| {
                vec![
                    format!("--name=e{member}"),
                    format!("--data-dir={}", dir.join(format!("etcd-{member}")).display()),
                    format!("--listen-client-urls=http://127.0.0.1:{client}"),
                    format!("--advertise-client-urls=http://127.0.0.1:{client}"),
                    format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
                    format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
                    format!("--initial-cluster={}", cluster.join(",")),
                    "--initial-cluster-state=new".to_string(),
                ]
            })
            .collect();
        let endpoints: Vec<String> = ports
            .iter()
            .map(|(client, _)| format!("\"http://127.0.0.1:{client}\""))
            .collect();
        let mut etcd = Etcd {
            program,
            dir: dir.to_path_buf(),
            args,
            members: vec![None, None, None],
            starts: 0,
            endpoints: endpoints.join(", "),
        };
        for member in 0..3 {
            etcd.start_member(member);
        }
        Some(etcd)
    }

    /// Starts member `member` (again: with its data, it rejoins).
    fn start_member(&mut self, member: usize) {
        let mut command = Command::new(&self.program);
        command.args(&self.args[member]);
        self.starts += 1;
        let log = self.dir.join(format!("etcd-{member}-{}.log", self.starts));
        self.members[member] = Some(Process::spawn(&format!("etcd-{member}"), command, log));
    }

    fn kill_member(&mut self, member: usize) {
        if let Some(mut process) = self.members[member].take() {
            process.kill9();
        }
    }
}

/// The `[ha]` table of controller `name`, which others dial at its
/// `listen` address (advertise left out), on the tests' plaintext etcd.
fn ha_table(endpoints: &str, name: &str) -> String {
    format!("[ha]\netcd = [{endpoints}]\nname = \"{name}\"\nlease_ttl = \"3s\"\ninsecure_etcd = true\n\n")
}

/// Another gpoold on the cluster's state dir, listening at `listen`, with
/// the `[ha]` table `table` makes of the tests' own: a standby until
/// elected. Its node timeout is the leader's (gpoold's default where the
/// leader's config leaves it out).
fn start_standby(cluster: &Cluster, endpoints: &str, name: &str, listen: &str) -> Process {
    start_standby_with(cluster, (endpoints, name, listen), |table| table)
}

fn start_standby_with(
    cluster: &Cluster,
    (endpoints, name, listen): (&str, &str, &str),
    table: impl Fn(String) -> String,
) -> Process {
    let dir = cluster.dir.path();
    let leaders = std::fs::read_to_string(dir.join("gpoold.toml")).expect("the leader's gpoold.toml");
    let node_timeout = leaders
        .lines()
        .find(|line| line.starts_with("node_timeout"))
        .unwrap_or("");
    let text = format!(
        "listen = \"{listen}\"\nstate_dir = \"{}\"\nsocket = \"{}\"\n{node_timeout}\nadmins = [\"{}\"]\n\n{}{}",
        dir.join("state").display(),
        dir.join(format!("gpoold-{name}.sock")).display(),
        current_user(),
        table(ha_table(endpoints, name)),
        shipped_policy()
    );
    let file = dir.join(format!("gpoold-{name}.toml"));
    std::fs::write(&file, text).expect("write the standby's gpoold.toml");
    let mut command = Command::new(binary("gpoold"));
    command.arg("--config").arg(&file);
    let log = dir.join(format!("gpoold-{name}.log"));
    let process = Process::spawn(&format!("gpoold-{name}"), command, log.clone());
    wait_until("the standby to campaign", Duration::from_secs(30), || {
        let text = std::fs::read_to_string(&log).ok()?;
        text.contains("standby until elected").then_some(())
    });
    process
}

/// The pool of these tests: controller "a" (the harness's, on a port it
/// picks) reaching etcd at
/// `a_etcd`, a standby "b" reaching it at `b_etcd`, both named to the CLI,
/// and agents for `nodes` that name both. The standby and its address.
fn start_pair(
    dir: tempfile::TempDir,
    (a_etcd, b_etcd): (&str, &str),
    table: impl Fn(String) -> String,
    nodes: &[(&str, &str, u32, u64, &str)],
) -> (Cluster, Process, String) {
    let extra = format!("{}{}", table(ha_table(a_etcd, "a")), shipped_policy());
    // The tests' 3 s lease runs with a 30 s node timeout; any other lease
    // with gpoold's default.
    let node_timeout = if extra.contains("lease_ttl = \"3s\"") {
        "30s"
    } else {
        ""
    };
    let mut cluster = Cluster::with_config_in_and_timeout(dir, "127.0.0.1", node_timeout, &extra);
    let listen_b = format!("127.0.0.1:{}", free_port());
    let standby = start_standby_with(&cluster, (b_etcd, "b", &listen_b), &table);
    let controllers = format!("{},{listen_b}", cluster.addr);
    cluster.cli_server = controllers.clone();
    for (node, model, count, memory_mib, labels) in nodes {
        let top = format!("controller = \"{controllers}\"\n");
        cluster.spawn_agent(node, 0, &top, &agent_config(model, *count, *memory_mib, labels), None);
        cluster.wait_for_registered(node);
    }
    (cluster, standby, listen_b)
}

/// `start_pair` on a fresh three-member etcd that both controllers reach
/// directly: the etcd, the pool, the standby and its address. `None` where
/// etcd is not installed (and not required).
fn pair_on_etcd(nodes: &[(&str, &str, u32, u64, &str)]) -> Option<(Etcd, Cluster, Process, String)> {
    let dir = Cluster::temp_dir();
    let etcd = Etcd::start(dir.path())?;
    let endpoints = etcd.endpoints.clone();
    let (cluster, standby, listen_b) = start_pair(dir, (&endpoints, &endpoints), |table| table, nodes);
    Some((etcd, cluster, standby, listen_b))
}

/// kill -9 of the leader while jobs run and others wait: the standby is
/// elected once the leader's lease runs out, loads the shared state, and
/// the agents find it by themselves. Nothing acknowledged is lost, the job
/// that was running finishes on its first attempt, and none runs twice.
/// Then a planned switch: SIGTERM resigns at once.
#[test]
fn a_standby_takes_over_when_the_leader_dies_and_nothing_runs_twice() {
    let Some((etcd, mut cluster, mut standby, listen_b)) = pair_on_etcd(&NODES) else {
        return;
    };
    let before = listed_controllers(&cluster);
    assert_eq!(before["ha"], true, "{before}");
    assert_eq!(
        roles(&before),
        vec![("a".to_string(), true), ("b".to_string(), false)],
        "{before}"
    );
    assert!(
        before["controllers"][1]["lease_left_secs"]
            .as_i64()
            .is_some_and(|secs| secs <= 3),
        "{before}"
    );
    // Naming only the standby reaches the leader, for a user and an agent:
    // the standby answers with the leader's address.
    let via_b = gpool_at(&listen_b, &["controllers", "--output", "json"]);
    assert_eq!(via_b.code, 0, "{}", via_b.stderr);
    assert_eq!(roles(&via_b.json()), roles(&before), "{}", via_b.stdout);
    let only_b = format!("controller = \"{listen_b}\"\n");
    let spare = cluster.spawn_agent("spare", 0, &only_b, &agent_config("t4", 1, 16_384, ""), None);
    cluster.wait_for_registered("spare");
    let said = std::fs::read_to_string(&cluster.agents[spare].log).unwrap_or_default();
    assert!(
        said.contains(&format!("registered with gpoold at {} as spare", cluster.addr)),
        "the agent names the leader it reached: {said}"
    );
    // A job that runs until told, an array and separate jobs: some end
    // before the kill, some are still waiting.
    let hold = "while [ ! -e release ]; do sleep 0.2; done";
    let running = cluster.submit(&["--team", "vision", "--gpus", "h100:2", "--", "sh", "-c", hold]);
    let array = cluster.submit(&["--team", "nlp", "-a", "0-5", "--", "true"]);
    let separate: Vec<u64> = (0..6)
        .map(|_| cluster.submit(&["--team", "nlp", "--gpus", "l4:1", "--", "sleep", "0.5"]))
        .collect();
    cluster.wait_for_state(running, "running");

    let killed = Instant::now();
    cluster.controller().kill9();
    let listed = wait_until("the standby to answer", Duration::from_secs(30), || {
        let run = gpool_at(&listen_b, &["jobs", "--all", "--output", "json"]);
        (run.code == 0).then(|| run.json())
    });
    let takeover = killed.elapsed();
    println!("kill -9 of the leader to the standby's first answer: {takeover:?} (lease ttl 3 s)");
    assert!(takeover < Duration::from_secs(15), "{takeover:?}");
    assert!(listed.as_array().is_some_and(|jobs| !jobs.is_empty()), "{listed}");
    let after = listed_controllers(&cluster);
    assert_eq!(
        roles(&after),
        vec![("b".to_string(), true)],
        "the dead leader's candidacy is gone: {after}"
    );
    assert!(
        after["term"].as_u64() > before["term"].as_u64(),
        "terms only grow: {before} then {after}"
    );

    std::fs::write(cluster.dir.path().join("release"), "").unwrap();
    let job = cluster.wait_for_state(running, "completed");
    assert_eq!(
        job["attempt"], 1,
        "the running job finished on its first attempt: {job}"
    );
    for id in separate.iter().copied().chain([array]) {
        let job = cluster.wait_for_state(id, "completed");
        assert!(job["attempt"].as_u64().unwrap_or(0) <= 1, "ran once: {job}");
    }
    let tasks = cluster.gpool(&["jobs", "-r", "--all", "--output", "json"]).json();
    for task in tasks
        .as_array()
        .unwrap()
        .iter()
        .filter(|task| task["array_job_id"] == array)
    {
        assert_eq!(task["state"], "completed", "{task}");
        assert_eq!(task["attempt"], 1, "ran once: {task}");
    }

    // The old leader comes back as a standby; a planned switch back to it
    // (SIGTERM on the leader, which resigns) takes seconds, not a lease.
    let listen_a = cluster.addr.clone();
    let _back = start_standby(&cluster, &etcd.endpoints, "a", &listen_a);
    let stopped = Instant::now();
    nix::sys::signal::kill(standby.pid(), nix::sys::signal::Signal::SIGTERM).unwrap();
    // Until "a" leads, it sends callers to "b", which may still answer
    // in its shutdown: what counts is "a" answering as the leader.
    wait_until("the standby to answer", Duration::from_secs(15), || {
        let run = gpool_at(&listen_a, &["controllers", "--output", "json"]);
        (run.code == 0 && roles(&run.json()).first() == Some(&("a".to_string(), true))).then_some(())
    });
    let switch = stopped.elapsed();
    assert!(standby.stop(), "the old leader ended by itself on SIGTERM");
    println!("SIGTERM on the leader to the standby's first answer: {switch:?}");
    assert!(switch < Duration::from_secs(2), "{switch:?}");
    let switched = listed_controllers(&cluster);
    assert_eq!(roles(&switched), vec![("a".to_string(), true)], "{switched}");
    assert!(
        switched["term"].as_u64() > after["term"].as_u64(),
        "{after} then {switched}"
    );
    let last = cluster.submit(&["--team", "vision", "--", "true"]);
    cluster.wait_for_state(last, "completed");
}

/// The shipped `[ha]` defaults (a 15 s lease, the node timeout gpoold
/// derives from it): kill -9 of the leader while requeueable jobs run on
/// H100, A100 and L4 nodes (one that checkpoints, an array, separate jobs)
/// and a `--no-requeue` one. The agents keep their jobs' lease through the
/// failover: every running job ends on its first attempt, none was fenced.
#[test]
fn with_the_shipped_ha_defaults_a_leader_killed_under_running_jobs_restarts_none() {
    let dir = Cluster::temp_dir();
    let Some(etcd) = Etcd::start(dir.path()) else {
        return;
    };
    let endpoints = etcd.endpoints.clone();
    let shipped = |table: String| table.replace("lease_ttl = \"3s\"\n", "");
    let (mut cluster, _standby, listen_b) = start_pair(dir, (&endpoints, &endpoints), shipped, &NODES);
    let toml = std::fs::read_to_string(cluster.dir.path().join("gpoold.toml")).unwrap();
    assert!(!toml.contains("lease_ttl") && !toml.contains("node_timeout"), "{toml}");
    // Every job runs until released, and notes each run of it.
    let runs = cluster.dir.path().join("runs");
    std::fs::create_dir_all(&runs).unwrap();
    let hold = format!(
        "trap 'touch {runs}/checkpointed-$GPOOL_JOB_ID' USR1; echo run >> {runs}/$GPOOL_JOB_ID; \
         while [ ! -e release ]; do sleep 0.2; done",
        runs = runs.display()
    );
    let mut ids = vec![
        cluster.submit(&[
            "--team",
            "vision",
            "--gpus",
            "h100:4",
            "--checkpoint-signal",
            "USR1",
            "--",
            "sh",
            "-c",
            &hold,
        ]),
        cluster.submit(&["--team", "vision", "--gpus", "h100:8", "--", "sh", "-c", &hold]),
        cluster.submit(&["--team", "nlp", "--gpus", "l4:2", "--", "sh", "-c", &hold]),
        cluster.submit(&[
            "--team",
            "nlp",
            "--gpus",
            "a100-80gb:1",
            "--no-requeue",
            "--",
            "sh",
            "-c",
            &hold,
        ]),
    ];
    let array = cluster.submit(&["--team", "nlp", "-a", "0-1", "--gpus", "l4:1", "--", "sh", "-c", &hold]);
    for id in &ids {
        cluster.wait_for_state(*id, "running");
    }
    let tasks = |cluster: &Cluster| -> Vec<serde_json::Value> {
        let listed = cluster.gpool(&["jobs", "-r", "--all", "--output", "json"]).json();
        let all = listed.as_array().cloned().unwrap_or_default();
        all.into_iter().filter(|task| task["array_job_id"] == array).collect()
    };
    wait_until("the array's tasks to run", Duration::from_secs(60), || {
        let tasks = tasks(&cluster);
        (tasks.len() == 2 && tasks.iter().all(|task| task["state"] == "running")).then_some(())
    });
    ids.extend(tasks(&cluster).iter().filter_map(|task| task["id"].as_u64()));

    let killed = Instant::now();
    cluster.controller().kill9();
    wait_until("the standby to answer", Duration::from_secs(40), || {
        (gpool_at(&listen_b, &["jobs"]).code == 0).then_some(())
    });
    println!(
        "kill -9 to the standby's first answer: {:?} (lease ttl 15 s)",
        killed.elapsed()
    );
    for agent in &cluster.agents {
        wait_until(
            "each agent to register with the new leader",
            Duration::from_secs(30),
            || {
                let said = std::fs::read_to_string(&agent.log).unwrap_or_default();
                said.contains(&format!("registered with gpoold at {listen_b}"))
                    .then_some(())
            },
        );
    }
    println!("kill -9 to every agent registered again: {:?}", killed.elapsed());
    // Had the lease run out, the agents would have fenced their jobs by
    // now: half the old 30 s default after their last heartbeat.
    let past_the_old_fence = Duration::from_secs(20);
    std::thread::sleep(past_the_old_fence.saturating_sub(killed.elapsed()));
    std::fs::write(cluster.dir.path().join("release"), "").unwrap();
    for id in &ids {
        let job = cluster.wait_for_state(*id, "completed");
        assert_eq!(
            job["attempt"], 1,
            "job {id} ran through the failover on its first attempt: {job}"
        );
        let noted = std::fs::read_to_string(runs.join(id.to_string())).unwrap_or_default();
        assert_eq!(noted.lines().count(), 1, "job {id} ran once: {job}");
        assert!(
            !runs.join(format!("checkpointed-{id}")).exists(),
            "job {id} was never signalled"
        );
    }
    for agent in &cluster.agents {
        let said = std::fs::read_to_string(&agent.log).unwrap_or_default();
        assert!(
            !said.contains("Fenced") && !said.contains("longer than the lease"),
            "{said}"
        );
    }
}

/// `gpool` against one controller only.
fn gpool_at(server: &str, args: &[&str]) -> crate::harness::cluster::Run {
    crate::harness::cluster::gpool_command(args)
        .env("GPOOL_SERVER", server)
        .output()
        .expect("run gpool")
        .into()
}

/// `gpool controllers`, once the controller's etcd client reaches a
/// member (right after the pair starts, it may still be dialing one that
/// was not listening yet).
fn listed_controllers(cluster: &Cluster) -> serde_json::Value {
    crate::harness::process::wait_until("gpool controllers to answer", Duration::from_secs(15), || {
        let run = cluster.gpool(&["controllers", "--output", "json"]);
        (run.code == 0 || !run.stderr.contains("etcd did not answer")).then(|| run.json())
    })
}

/// Each controller's name and whether it leads, leader first.
fn roles(controllers: &serde_json::Value) -> Vec<(String, bool)> {
    let list = controllers["controllers"].as_array().cloned().unwrap_or_default();
    list.iter()
        .map(|c| (c["name"].as_str().unwrap_or_default().to_string(), c["leader"] == true))
        .collect()
}

/// etcd loses quorum: the leader can no longer renew its lease and stops
/// itself (exit 75) within two thirds of the TTL, and no standby can be
/// elected meanwhile. Quorum back: a standby is elected and serves every
/// acknowledged job, and the job that ran through it all finishes on its
/// first attempt.
#[test]
fn a_leader_that_loses_etcd_quorum_stops_and_a_leader_serves_again_with_quorum() {
    let Some((mut etcd, mut cluster, _standby, _)) = pair_on_etcd(&NODES[..1]) else {
        return;
    };
    let hold = "while [ ! -e release ]; do sleep 0.2; done";
    let running = cluster.submit(&["--team", "vision", "--gpus", "2", "--", "sh", "-c", hold]);
    let acknowledged: Vec<u64> = (0..5)
        .map(|_| cluster.submit(&["--team", "nlp", "--", "true"]))
        .collect();
    cluster.wait_for_state(running, "running");

    let lost = Instant::now();
    etcd.kill_member(1);
    etcd.kill_member(2);
    let status = wait_until("the leader to stop itself", Duration::from_secs(15), || {
        cluster.controller().exited()
    });
    println!("quorum lost to the leader's exit: {:?}", lost.elapsed());
    assert_eq!(status.code(), Some(75), "{status:?}");
    assert!(
        lost.elapsed() < Duration::from_secs(5),
        "within the 3 s lease: {:?}",
        lost.elapsed()
    );
    // No quorum, no leader: nobody answers.
    assert_eq!(cluster.gpool(&["jobs"]).code, 69);

    etcd.start_member(1);
    etcd.start_member(2);
    let back = Instant::now();
    wait_until("a leader to serve again", Duration::from_secs(30), || {
        (cluster.gpool(&["jobs", "--output", "json"]).code == 0).then_some(())
    });
    println!("quorum back to the first answer: {:?}", back.elapsed());
    for id in &acknowledged {
        cluster.wait_for_state(*id, "completed");
    }
    std::fs::write(cluster.dir.path().join("release"), "").unwrap();
    let job = cluster.wait_for_state(running, "completed");
    assert_eq!(job["attempt"], 1, "it ran through on its first attempt: {job}");
}

/// kill -9 of the leader while 4 clients submit and cancel and 4 agents
/// (H100, A100, L4) run about 200 jobs, each of which notes every run of
/// it in a file of its own: every acknowledged job is there afterwards,
/// none ran twice, and nothing finished was run again.
#[test]
fn a_failover_under_load_loses_nothing_acknowledged_and_runs_nothing_twice() {
    let Some((_etcd, mut cluster, _standby, listen_b)) = pair_on_etcd(&NODES) else {
        return;
    };
    let controllers = cluster.cli_server.clone();
    let runs = cluster.dir.path().join("runs");
    std::fs::create_dir_all(&runs).unwrap();
    let note_run = format!("echo run >> {}/$GPOOL_JOB_ID; sleep 0.3", runs.display());

    // Each client submits 50 jobs, 100 ms apart, and cancels every fifth;
    // it keeps the ids gpool acknowledged, and the acknowledged cancels. A
    // refused or unanswered call (during the failover) is tried again.
    let (acknowledged, cancels) = std::thread::scope(|scope| {
        let clients: Vec<_> = (0..4)
            .map(|client| {
                let (controllers, note_run) = (&controllers, &note_run);
                scope.spawn(move || {
                    let team = if client % 2 == 0 { "nlp" } else { "vision" };
                    let (mut acknowledged, mut cancels) = (Vec::new(), Vec::new());
                    while acknowledged.len() < 50 {
                        std::thread::sleep(Duration::from_millis(100));
                        let run = gpool_at(controllers, &["submit", "--team", team, "--", "sh", "-c", note_run]);
                        let Ok(id) = run.stdout.trim().parse::<u64>() else {
                            continue;
                        };
                        acknowledged.push(id);
                        if acknowledged.len() % 5 == 0 {
                            let cancelled = gpool_at(controllers, &["cancel", &id.to_string()]).code == 0;
                            cancels.push((id, cancelled));
                        }
                    }
                    (acknowledged, cancels)
                })
            })
            .collect();
        // The leader dies while the clients are under way.
        std::thread::sleep(Duration::from_secs(2));
        let killed = Instant::now();
        cluster.controller().kill9();
        wait_until("the standby to answer", Duration::from_secs(30), || {
            (gpool_at(&listen_b, &["jobs"]).code == 0).then_some(())
        });
        println!(
            "kill -9 under load to the standby's first answer: {:?}",
            killed.elapsed()
        );
        let mut all = (Vec::new(), Vec::new());
        for client in clients {
            let (acknowledged, cancels) = client.join().expect("a client");
            all.0.extend(acknowledged);
            all.1.extend(cancels);
        }
        all
    });
    assert_eq!(acknowledged.len(), 200);
    for id in &acknowledged {
        let job = wait_until("each acknowledged job to end", Duration::from_secs(120), || {
            let job = cluster.job(*id);
            ["completed", "cancelled"]
                .contains(&job["state"].as_str().unwrap_or_default())
                .then_some(job)
        });
        let noted = std::fs::read_to_string(runs.join(id.to_string())).unwrap_or_default();
        assert!(
            noted.lines().count() <= 1,
            "job {id} ran {} times: {job}",
            noted.lines().count()
        );
        if job["state"] == "completed" {
            assert_eq!(noted.lines().count(), 1, "job {id} completed without running: {job}");
        }
        // Cancelled: only those a client asked to cancel (a cancel applied
        // as the leader died may have gone unanswered), and every cancel
        // that was answered took.
        let asked = cancels.iter().find(|(cancelled, _)| cancelled == id);
        if job["state"] == "cancelled" {
            assert!(asked.is_some(), "job {id} was cancelled unasked: {job}");
        }
        if asked.is_some_and(|(_, answered)| *answered) {
            assert_eq!(job["state"], "cancelled", "{job}");
        }
    }
}

/// A TCP forwarder from a loopback port to `upstream` that a test can cut:
/// once cut it forwards nothing more, in either direction, and the open
/// connections stay open and silent, as when a network drops packets.
struct Cuttable {
    addr: String,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Cuttable {
    fn to(upstream: String) -> Cuttable {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let addr = listener.local_addr().expect("its address").to_string();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cutting = cut.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                let Ok(server) = std::net::TcpStream::connect(&upstream) else {
                    continue;
                };
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    let cut = cutting.clone();
                    std::thread::spawn(move || {
                        use std::io::{Read, Write};
                        let mut buffer = [0u8; 16 * 1024];
                        while let Ok(n) = from.read(&mut buffer) {
                            if n == 0 {
                                break;
                            }
                            // Dropped, not refused: the peer hears nothing.
                            if !cut.load(Ordering::SeqCst) && to.write_all(&buffer[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Cuttable { addr, cut }
    }

    fn set_cut(&self, cut: bool) {
        self.cut.store(cut, std::sync::atomic::Ordering::SeqCst);
    }
}

/// The leader cut off from etcd while its agents still reach it (its etcd
/// traffic dropped): it stops itself within two thirds of its lease, before
/// the standby can be elected; the standby takes over and nothing runs
/// twice. With etcd reachable again, the old leader comes back as a
/// standby.
#[test]
fn a_leader_cut_off_from_etcd_stops_before_the_standby_takes_over() {
    let dir = Cluster::temp_dir();
    let Some(etcd) = Etcd::start(dir.path()) else {
        return;
    };
    // The first controller reaches etcd only through forwarders.
    let forwarders: Vec<Cuttable> = etcd
        .endpoints
        .split(", ")
        .map(|endpoint| Cuttable::to(endpoint.trim_matches('"').trim_start_matches("http://").to_string()))
        .collect();
    let forwarded: Vec<String> = forwarders.iter().map(|f| format!("\"http://{}\"", f.addr)).collect();
    let forwarded = forwarded.join(", ");
    let (mut cluster, _standby, listen_b) = start_pair(dir, (&forwarded, &etcd.endpoints), |table| table, &NODES);
    let hold = "while [ ! -e release ]; do sleep 0.2; done";
    let running = cluster.submit(&["--team", "vision", "--gpus", "a100-80gb:1", "--", "sh", "-c", hold]);
    let array = cluster.submit(&["--team", "nlp", "-a", "0-7", "--", "sleep", "0.5"]);
    cluster.wait_for_state(running, "running");
    let term = listed_controllers(&cluster)["term"].as_u64().unwrap_or(0);

    let cut = Instant::now();
    for forwarder in &forwarders {
        forwarder.set_cut(true);
    }
    let status = wait_until("the cut-off leader to stop itself", Duration::from_secs(15), || {
        cluster.controller().exited()
    });
    let stopped = cut.elapsed();
    println!("etcd cut off to the leader's exit: {stopped:?} (lease ttl 3 s)");
    assert_eq!(status.code(), Some(75), "{status:?}");
    assert!(
        stopped < Duration::from_secs(3),
        "silent before its lease can run out: {stopped:?}"
    );
    wait_until("the standby to answer", Duration::from_secs(30), || {
        (gpool_at(&listen_b, &["jobs"]).code == 0).then_some(())
    });
    println!("etcd cut off to the standby's first answer: {:?}", cut.elapsed());
    let after = listed_controllers(&cluster);
    assert_eq!(roles(&after), vec![("b".to_string(), true)], "{after}");
    assert!(after["term"].as_u64().unwrap_or(0) > term, "{after}");

    // etcd reachable again: the old leader (restarted, as systemd would)
    // waits as a standby.
    for forwarder in &forwarders {
        forwarder.set_cut(false);
    }
    let listen_a = cluster.addr.clone();
    let _back = start_standby(&cluster, &forwarded, "a", &listen_a);
    let expected = vec![("b".to_string(), true), ("a".to_string(), false)];
    wait_until("the old leader to stand by", Duration::from_secs(15), || {
        (roles(&listed_controllers(&cluster)) == expected).then_some(())
    });
    std::fs::write(cluster.dir.path().join("release"), "").unwrap();
    let job = cluster.wait_for_state(running, "completed");
    assert_eq!(job["attempt"], 1, "it ran through on its first attempt: {job}");
    cluster.wait_for_state(array, "completed");
    let tasks = cluster.gpool(&["jobs", "-r", "--all", "--output", "json"]).json();
    for task in tasks
        .as_array()
        .unwrap()
        .iter()
        .filter(|task| task["array_job_id"] == array)
    {
        assert_eq!(
            (task["state"].as_str(), task["attempt"].as_u64()),
            (Some("completed"), Some(1)),
            "{task}"
        );
    }
}

/// A controller that speaks the agent link and sends, after a Register,
/// a lease and a message of term 7, then a message of term 5: a deposed
/// leader's. Counts the Registers it takes.
struct TermsController {
    registers: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

type Outbound = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = Result<gpool_proto::pb::ControllerMessage, tonic::Status>> + Send>,
>;

#[tonic::async_trait]
impl gpool_proto::pb::agent_link_server::AgentLink for TermsController {
    type ConnectStream = Outbound;

    async fn connect(
        &self,
        request: tonic::Request<tonic::Streaming<gpool_proto::pb::AgentMessage>>,
    ) -> Result<tonic::Response<Outbound>, tonic::Status> {
        use gpool_proto::pb::{controller_message::Msg, ControllerMessage, Lease, StopLog};
        use tokio_stream::StreamExt;
        let mut inbound = request.into_inner();
        inbound.message().await?;
        let first = self.registers.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0;
        tokio::spawn(async move { while let Ok(Some(_)) = inbound.message().await {} });
        let message = |term, msg| ControllerMessage { term, msg: Some(msg) };
        let lease = Msg::Lease(Lease {
            heartbeat_seq: 0,
            fence_after_ms: 60_000,
            fence_grace_ms: 1_000,
        });
        // Later links hear only from the deposed leader.
        let deposed = message(5, Msg::StopLog(StopLog { request_id: 2 }));
        let messages = match first {
            true => vec![
                message(7, lease),
                message(7, Msg::StopLog(StopLog { request_id: 1 })),
                deposed,
            ],
            false => vec![deposed],
        };
        let stream = tokio_stream::iter(messages.into_iter().map(Ok)).chain(tokio_stream::pending());
        Ok(tonic::Response::new(Box::pin(stream)))
    }
}

/// Fencing on the agent's side: once it has heard from the leader of term
/// 7, a message of term 5 (a deposed leader that does not know it yet) is
/// refused and said in its log, and the agent ends that link and dials
/// again. The agent keeps the term in its spool: restarted, it still
/// refuses term 5 before hearing from anyone.
#[test]
fn an_agent_refuses_a_message_of_an_older_term() {
    let mut cluster = Cluster::start();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    listener.set_nonblocking(true).unwrap();
    let registers = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let controller = TermsController {
        registers: registers.clone(),
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.spawn(async move {
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let _ = tonic::transport::Server::builder()
            .add_service(gpool_proto::pb::agent_link_server::AgentLinkServer::new(controller))
            .serve_with_incoming(incoming)
            .await;
    });
    let agent = cluster.spawn_agent("node-t", 1, &format!("controller = \"{addr}\"\n"), "", None);
    let log = cluster.agents[agent].log.clone();
    let refused = wait_until("the agent to refuse term 5", Duration::from_secs(20), || {
        let text = std::fs::read_to_string(&log).ok()?;
        let line = text
            .lines()
            .find(|line| line.contains("refused a message of controller term 5"))?;
        Some(line.to_string())
    });
    assert!(refused.contains("the leader of term 7 took over from it"), "{refused}");
    wait_until("the agent to dial again", Duration::from_secs(20), || {
        (registers.load(std::sync::atomic::Ordering::SeqCst) >= 2).then_some(())
    });
    cluster.agents[agent].kill9();
    let again = cluster.spawn_agent("node-t", 1, &format!("controller = \"{addr}\"\n"), "", None);
    let log = cluster.agents[again].log.clone();
    wait_until("the restarted agent to refuse term 5", Duration::from_secs(20), || {
        let text = std::fs::read_to_string(&log).ok()?;
        text.contains("refused a message of controller term 5: the leader of term 7")
            .then_some(())
    });
}

/// TLS to etcd: an etcd member that asks every client for a certificate
/// of the cluster CA (`gpool admin ca init` and `cert issue` make both
/// sides'), and a controller with `ca`, `cert` and `key` in `[ha]`: it is
/// elected over TLS and runs jobs, and `gpool controllers` reads etcd.
#[test]
fn a_controller_is_elected_through_etcd_over_tls() {
    let dir = Cluster::temp_dir();
    let Some(program) = outside_tool("etcd", "etcd-server") else {
        return;
    };
    let pki = dir.path().join("pki");
    let issue = |args: &[&str]| {
        let mut all = vec!["admin"];
        all.extend_from_slice(args);
        let run: crate::harness::cluster::Run = crate::harness::cluster::gpool_command(&all)
            .output()
            .expect("run gpool")
            .into();
        assert_eq!(run.code, 0, "gpool {all:?}: {}", run.stderr);
    };
    let pki_dir = pki.to_str().unwrap();
    issue(&["ca", "init", "--state-dir", pki_dir]);
    issue(&[
        "cert",
        "issue",
        "--controller",
        "127.0.0.1",
        "--out",
        pki_dir,
        "--state-dir",
        pki_dir,
    ]);
    issue(&[
        "cert",
        "issue",
        "--node",
        "ctl-a",
        "--out",
        pki_dir,
        "--state-dir",
        pki_dir,
    ]);
    let (client, peer) = (free_port(), free_port());
    let mut command = Command::new(program);
    command
        .arg("--name=e0")
        .arg(format!("--data-dir={}", dir.path().join("etcd").display()))
        .arg(format!("--listen-client-urls=https://127.0.0.1:{client}"))
        .arg(format!("--advertise-client-urls=https://127.0.0.1:{client}"))
        .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
        .arg(format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"))
        .arg(format!("--initial-cluster=e0=http://127.0.0.1:{peer}"))
        .arg(format!("--cert-file={}", pki.join("127.0.0.1.pem").display()))
        .arg(format!("--key-file={}", pki.join("127.0.0.1.key").display()))
        .arg(format!("--trusted-ca-file={}", pki.join("ca").join("ca.pem").display()))
        .arg("--client-cert-auth");
    let _etcd = Process::spawn("etcd", command, dir.path().join("etcd.log"));
    let ha = format!(
        "[ha]\netcd = [\"https://127.0.0.1:{client}\"]\nname = \"ctl-a\"\nlease_ttl = \"3s\"\nca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n\n",
        pki.join("ca").join("ca.pem").display(),
        pki.join("ctl-a.pem").display(),
        pki.join("ctl-a.key").display()
    );
    let mut cluster = Cluster::with_config_in(dir, "127.0.0.1", &format!("{ha}{}", shipped_policy()));
    let listed = listed_controllers(&cluster);
    assert_eq!(roles(&listed), vec![("ctl-a".to_string(), true)], "{listed}");
    let (node, model, count, memory_mib, labels) = NODES[0];
    cluster.start_agent_with(node, 0, &agent_config(model, count, memory_mib, labels));
    let job = cluster.submit(&["--team", "vision", "--", "true"]);
    cluster.wait_for_state(job, "completed");
}

/// A rolling restart of etcd, one member at a time, keeps quorum: the
/// leader opens its lease's keepalive again on another member each time
/// and stays the leader, with the same term.
#[test]
fn a_rolling_restart_of_etcd_keeps_the_leader() {
    let dir = Cluster::temp_dir();
    let Some(mut etcd) = Etcd::start(dir.path()) else {
        return;
    };
    // The default lease: a member's restart takes the client a few seconds
    // to move off.
    let endpoints = etcd.endpoints.clone();
    let longer = |table: String| table.replace("lease_ttl = \"3s\"", "lease_ttl = \"15s\"");
    let (mut cluster, _standby, _) = start_pair(dir, (&endpoints, &endpoints), longer, &[]);
    let before = listed_controllers(&cluster);
    for member in 0..3 {
        etcd.kill_member(member);
        std::thread::sleep(Duration::from_secs(1));
        etcd.start_member(member);
        // Back in the cluster before the next one goes.
        wait_until("etcd to answer through the leader", Duration::from_secs(30), || {
            let run = cluster.gpool(&["controllers", "--output", "json"]);
            (run.code == 0 && roles(&run.json()).len() == 2).then_some(())
        });
        std::thread::sleep(Duration::from_secs(1));
    }
    assert_eq!(cluster.controller().exited(), None, "the leader ran through");
    // A standby whose campaign broke with its member campaigns again; its
    // old candidacy goes with its lease.
    let after = wait_until("the candidacies to settle", Duration::from_secs(20), || {
        let run = cluster.gpool(&["controllers", "--output", "json"]);
        let after = (run.code == 0).then(|| run.json())?;
        (roles(&after) == roles(&before)).then_some(after)
    });
    assert_eq!(after["term"], before["term"], "{before} then {after}");
}

/// `body` (JSON) posted to etcd's JSON gateway at `endpoint`
/// (`http://HOST:PORT`) under `path`: etcd's answer.
fn etcd_post(endpoint: &str, path: &str, body: &serde_json::Value) -> serde_json::Value {
    use std::io::{Read, Write};
    let host_port = endpoint.trim_start_matches("http://");
    let mut stream = std::net::TcpStream::connect(host_port).expect("connect to etcd");
    let body = body.to_string();
    // HTTP/1.0: the answer ends with the connection, in one piece.
    write!(
        stream,
        "POST {path} HTTP/1.0\r\nHost: {host_port}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, answer) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{response}"
    );
    serde_json::from_str(answer).unwrap_or_else(|err| panic!("etcd's answer {answer:?}: {err}"))
}

/// Base64 (standard, padded), as etcd's JSON gateway takes keys.
fn base64(bytes: &[u8]) -> String {
    const DIGITS: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut text = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | u32::from(*b) << (16 - 8 * i));
        for digit_idx in 0..4 {
            match digit_idx <= chunk.len() {
                true => text.push(DIGITS[(n >> (18 - 6 * digit_idx) & 63) as usize] as char),
                false => text.push('='),
            }
        }
    }
    text
}

/// The leader key of election `election` (the candidate key created
/// first), as etcd's JSON gateway writes it (base64).
fn etcd_leader_key(endpoint: &str, election: &str) -> String {
    let range = serde_json::json!({
        "key": base64(format!("{election}/").as_bytes()),
        "range_end": base64(format!("{election}0").as_bytes()),
    });
    let listed = etcd_post(endpoint, "/v3/kv/range", &range);
    let kvs = listed["kvs"].as_array().cloned().unwrap_or_default();
    let created = |kv: &serde_json::Value| kv["create_revision"].as_str().and_then(|rev| rev.parse::<i64>().ok());
    let first = kvs.iter().min_by_key(|kv| created(kv)).expect("a candidate key");
    first["key"].as_str().expect("its key").to_string()
}

/// The leader's election key deleted from etcd behind its back (as an
/// operator's `etcdctl del` would): the standby's candidacy is the oldest
/// now, so etcd names it. The old leader reads its own key, steps down
/// (exit 75, as when it loses its lease) well within the 3 s lease, and
/// the standby leads and runs jobs.
#[test]
fn a_leader_whose_election_key_is_deleted_steps_down_and_the_standby_leads() {
    let Some((etcd, mut cluster, _standby, listen_b)) = pair_on_etcd(&NODES[..1]) else {
        return;
    };
    let before = listed_controllers(&cluster);
    assert_eq!(
        roles(&before),
        vec![("a".to_string(), true), ("b".to_string(), false)],
        "{before}"
    );
    let endpoint = etcd.endpoints.split(", ").next().unwrap().trim_matches('"').to_string();
    let key = etcd_leader_key(&endpoint, "gpool/leader");
    let deleted = Instant::now();
    let answer = etcd_post(&endpoint, "/v3/kv/deleterange", &serde_json::json!({ "key": key }));
    assert_eq!(answer["deleted"], "1", "{answer}");
    let status = wait_until("the leader to step down", Duration::from_secs(15), || {
        cluster.controller().exited()
    });
    let stepped_down = deleted.elapsed();
    println!("leader key deleted to the leader's exit: {stepped_down:?} (lease ttl 3 s)");
    assert_eq!(status.code(), Some(75), "{status:?}");
    assert!(
        stepped_down < Duration::from_secs(3 + 2),
        "within the lease and a margin: {stepped_down:?}"
    );
    let said = cluster.controller().log_tail(20);
    assert!(said.contains("its leader key is gone from etcd"), "{said}");
    let after = wait_until("the standby to lead", Duration::from_secs(30), || {
        let run = gpool_at(&listen_b, &["controllers", "--output", "json"]);
        (run.code == 0).then(|| run.json())
    });
    assert_eq!(roles(&after), vec![("b".to_string(), true)], "{after}");
    assert!(
        after["term"].as_u64() > before["term"].as_u64(),
        "{before} then {after}"
    );
    let job = cluster.submit(&["--team", "vision", "--", "true"]);
    cluster.wait_for_state(job, "completed");
}

/// A TCP relay at `host` (a port of its own) to an upstream named once it
/// is known, that counts the connections it takes.
struct Relay {
    addr: String,
    upstream: std::sync::Arc<std::sync::OnceLock<String>>,
    n_connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Relay {
    fn at(host: &str) -> Relay {
        let listener = std::net::TcpListener::bind(format!("{host}:0")).expect("a port for the relay");
        let addr = listener.local_addr().expect("its address").to_string();
        let upstream = std::sync::Arc::new(std::sync::OnceLock::<String>::new());
        let n_connections = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (to, counted) = (upstream.clone(), n_connections.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Some(Ok(server)) = to.get().map(std::net::TcpStream::connect) else {
                    continue;
                };
                for (mut from, mut to) in [
                    (client.try_clone().unwrap(), server.try_clone().unwrap()),
                    (server, client),
                ] {
                    std::thread::spawn(move || {
                        let _ = std::io::copy(&mut from, &mut to);
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Relay {
            addr,
            upstream,
            n_connections,
        }
    }

    fn n_connections(&self) -> usize {
        self.n_connections.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A user names a standby on loopback (where clear text is allowed) and
/// has a token but no CA; the leader it names is at an address beyond
/// loopback (the gateway of a bridge the test makes, relayed to the
/// leader). gpool does not follow the standby there: it refuses, as it
/// does for that address named directly, and never connects to it. A
/// caller with no token follows, and one that names the leader with
/// http:// itself insists.
#[test]
fn a_redirect_to_a_leader_beyond_loopback_sends_no_token_in_clear_text() {
    let net = match crate::harness::netns::Net::create() {
        Ok(net) => net,
        Err(reason) => {
            crate::harness::skip(
                "root",
                &format!("an address beyond loopback needs a bridge of the test's own: {reason}"),
            );
            return;
        }
    };
    let dir = Cluster::temp_dir();
    let Some(etcd) = Etcd::start(dir.path()) else {
        return;
    };
    let relay = Relay::at(&net.gateway());
    let advertised = relay.addr.clone();
    let advertise_a = |table: String| match table.contains("name = \"a\"") {
        true => table.replace("[ha]\n", &format!("[ha]\nadvertise = \"{advertised}\"\n")),
        false => table,
    };
    let (cluster, _standby, listen_b) = start_pair(dir, (&etcd.endpoints, &etcd.endpoints), advertise_a, &[]);
    relay.upstream.set(cluster.addr.clone()).unwrap();
    let home = cluster.dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();
    let with_token = |server: &str| -> crate::harness::cluster::Run {
        crate::harness::cluster::gpool_command(&["controllers", "--output", "json"])
            .env("GPOOL_SERVER", server)
            .env("GPOOL_TOKEN", "gpool_1_not-a-real-secret")
            .env("HOME", &home)
            .env_remove("GPOOL_CA")
            .output()
            .expect("run gpool")
            .into()
    };

    // No token, nothing to give away: the standby is followed (once it
    // has read from etcd who leads).
    let mut said = String::new();
    let tokenless = wait_until(
        "a caller with no token to reach the leader",
        Duration::from_secs(30),
        || {
            let run = gpool_at(&listen_b, &["controllers", "--output", "json"]);
            said = format!("exit {}: {}", run.code, run.stderr);
            (run.code == 0).then(|| run.json())
        },
    );
    assert_eq!(roles(&tokenless)[0], ("a".to_string(), true), "{tokenless} ({said})");
    let before = relay.n_connections();
    assert!(before > 0, "the standby sent the caller to the leader's address");

    let named_directly = with_token(&advertised);
    assert_eq!(named_directly.code, 2, "{}", named_directly.stderr);
    assert!(
        named_directly
            .stderr
            .contains("refusing to send your token in clear text"),
        "{}",
        named_directly.stderr
    );
    let redirected = with_token(&listen_b);
    assert_eq!(redirected.code, 2, "{}", redirected.stderr);
    assert!(
        redirected.stderr.contains(&format!(
            "{listen_b} is a standby and names the leader at {advertised}: refusing to send your token in clear text to {advertised}"
        )),
        "{}",
        redirected.stderr
    );
    assert_eq!(
        relay.n_connections(),
        before,
        "nothing more went to the leader's address"
    );
    // Naming the leader with http:// says the user means it.
    let insisted = with_token(&format!("{listen_b},http://{advertised}"));
    assert!(!insisted.stderr.contains("refusing"), "{}", insisted.stderr);
    assert!(relay.n_connections() > before, "{}", insisted.stderr);
}

/// A user who names only the standby: the CLI sends its calls straight
/// there (no `Leader` question first), and the standby's refusal names the
/// leader, where each call is sent again. A submit is carried out once, by
/// the leader, a listing streams back through the same path, and a cancel
/// lands: the standby carried out nothing.
#[test]
fn calls_sent_to_a_standby_are_carried_out_once_by_the_leader() {
    let Some((_etcd, cluster, _standby, listen_b)) = pair_on_etcd(&NODES) else {
        return;
    };
    // Once the standby has read from etcd who leads, it names the leader.
    let submitted = wait_until("a submit through the standby", Duration::from_secs(30), || {
        let run = gpool_at(
            &listen_b,
            &[
                "submit",
                "--output",
                "json",
                "--hold",
                "--name",
                "via-standby",
                "--",
                "true",
            ],
        );
        (run.code == 0).then(|| run.json())
    });
    let id = submitted["ids"][0].as_u64().expect("an id");
    let named = |run: &crate::harness::cluster::Run| {
        let jobs = run.json();
        let all = jobs.as_array().cloned().unwrap_or_default();
        all.iter()
            .filter(|job| job["name"] == "via-standby")
            .map(|job| job["id"].as_u64().unwrap_or_default())
            .collect::<Vec<_>>()
    };
    let at_leader = cluster.gpool(&["--output", "json", "jobs", "--all"]);
    assert_eq!(
        named(&at_leader),
        vec![id],
        "one job, at the leader: {}",
        at_leader.stdout
    );
    let through_standby = gpool_at(&listen_b, &["--output", "json", "jobs", "--all"]);
    assert_eq!(through_standby.code, 0, "{}", through_standby.stderr);
    assert_eq!(named(&through_standby), vec![id], "{}", through_standby.stdout);
    let cancel = gpool_at(&listen_b, &["cancel", &id.to_string()]);
    assert_eq!(cancel.code, 0, "{}", cancel.stderr);
    assert_eq!(cluster.job(id)["state"], "cancelled");
}
