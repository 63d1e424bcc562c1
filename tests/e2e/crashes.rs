//! Nothing is lost across a crash on a node: `kill -9` of an agent, of the
//! node's launcher that forks its jobs, of the launcher's keeper, or of
//! the launcher and the agent together, in the middle of a 2,000-task
//! array. Every task runs exactly once and every end is reported, and the
//! cgroups of the jobs a killed launcher left are removed once their
//! agent starts again.

use crate::harness::cluster::Cluster;
use crate::harness::process::{launcher_of, wait_until};
use std::time::Duration;

/// What the agents' logs say of the tasks `ids` (task N is job N + 2).
fn agent_lines(cluster: &Cluster, ids: &[u32]) -> String {
    let wanted: Vec<String> = ids.iter().map(|id| format!("job={} ", id + 2)).collect();
    let mut out = String::new();
    for entry in std::fs::read_dir(cluster.dir.path()).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("agent-") && name.ends_with(".log") {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            for line in text
                .lines()
                .filter(|line| wanted.iter().any(|w| line.contains(w.as_str())))
            {
                out.push_str(&format!("{name}: {line}\n"));
            }
        }
    }
    out
}

fn lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |text| text.lines().count())
}

#[test]
fn kill_9_of_agents_and_launchers_mid_array_runs_every_task_exactly_once() {
    let mut cluster = Cluster::start();
    let mut agents: Vec<usize> = (1..=4).map(|n| cluster.start_agent(&format!("n{n}"), 8)).collect();
    let ran = cluster.dir.path().join("ran");
    // A task's id is written at its end, after its work: an attempt cut
    // short and run again would show twice or not at all.
    let script = format!("sleep 0.05; echo $GPOOL_ARRAY_TASK_ID >> {}", ran.display());
    let array = cluster.submit(&["-a", "0-1999", "--discard-output", "--", "sh", "-c", &script]);
    let kill_9 = |pid: nix::unistd::Pid, what: &str| {
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL)
            .unwrap_or_else(|err| panic!("kill -9 {what}: {err}"));
    };
    let mut crashes = Vec::new();
    let plan = [
        (250, "agent"),
        (500, "launcher"),
        (750, "launcher and agent"),
        (1000, "keeper"),
        (1250, "launcher"),
        (1500, "agent"),
    ];
    for (at, crash) in plan {
        wait_until(&format!("{at} tasks to end"), Duration::from_secs(120), || {
            (lines(&ran) >= at).then_some(())
        });
        let slot = crashes.len() % agents.len();
        let (agent, node) = (agents[slot], format!("n{}", slot + 1));
        let (keeper, launcher) = launcher_of(cluster.agents[agent].pid());
        match crash {
            "agent" => cluster.agents[agent].kill9(),
            "launcher" => kill_9(launcher, "the launcher"),
            "keeper" => kill_9(keeper, "the keeper"),
            _ => {
                kill_9(launcher, "the launcher");
                cluster.agents[agent].kill9();
            }
        }
        if crash.contains("agent") {
            agents[slot] = cluster.start_agent(&node, 8);
        }
        crashes.push(format!("{crash} of {node} after {} tasks", lines(&ran)));
    }
    eprintln!("crashes: {crashes:?}");
    let done = wait_until("the array to end", Duration::from_secs(300), || {
        let record = cluster.job(array);
        (record["state"] != "pending" && record["state"] != "running").then_some(record)
    });
    let all = cluster.gpool(&["jobs", "--all", "--output", "json"]).json();
    let not_completed: Vec<String> = all
        .as_array()
        .into_iter()
        .flatten()
        .filter(|job| job["state"] != "completed" && job["array"].is_null())
        .map(|job| format!("{} {} {}", job["id"], job["state"], job["end_reason"]))
        .collect();
    let tasks: Vec<u32> = not_completed
        .iter()
        .filter_map(|line| line.split(' ').next()?.parse::<u32>().ok()?.checked_sub(2))
        .collect();
    assert_eq!(
        done["state"],
        "completed",
        "{not_completed:?} ({crashes:?})\n{}",
        agent_lines(&cluster, &tasks)
    );
    assert_eq!(done["array"]["ended"], 2000, "every end is reported: {done}");
    let mut ids: Vec<u32> = std::fs::read_to_string(&ran)
        .unwrap()
        .lines()
        .map(|line| line.trim().parse().expect("a task id"))
        .collect();
    ids.sort_unstable();
    let twice: Vec<u32> = ids.windows(2).filter(|w| w[0] == w[1]).map(|w| w[0]).collect();
    assert!(
        twice.is_empty(),
        "tasks run twice: {twice:?} ({crashes:?})\n{}",
        agent_lines(&cluster, &twice)
    );
    assert_eq!(
        ids,
        (0..2000).collect::<Vec<u32>>(),
        "every task ran once ({crashes:?})"
    );
    // The cgroups of the jobs whose launcher was killed outlived them;
    // each agent removes those of its node when it starts again.
    for (slot, agent) in agents.iter_mut().enumerate() {
        let node = format!("n{}", slot + 1);
        cluster.agents[*agent].stop();
        *agent = cluster.start_agent(&node, 8);
    }
    let scopes: Vec<String> = (1..=4)
        .map(|n| gpool_agent::cgroup::scope_of(&cluster.spool_dir(&format!("n{n}"))))
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left = attempt_cgroups(&scopes);
        if left.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "cgroups left behind ({crashes:?}): {left:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The attempts' cgroups of the agents of `scopes` (named
/// `<scope>-<job>.<epoch>`) anywhere under /sys/fs/cgroup.
fn attempt_cgroups(scopes: &[String]) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut dirs = vec![(std::path::PathBuf::from("/sys/fs/cgroup"), 0)];
    while let Some((dir, depth)) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries
            .flatten()
            .filter(|entry| entry.file_type().is_ok_and(|kind| kind.is_dir()))
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            let attempt = scopes.iter().any(|scope| {
                name.strip_prefix(scope.as_str())
                    .and_then(|rest| rest.strip_prefix('-'))
                    .and_then(|rest| rest.split_once('.'))
                    .is_some_and(|(job, epoch)| job.parse::<u64>().is_ok() && epoch.parse::<u64>().is_ok())
            });
            if attempt {
                found.push(entry.path());
            } else if depth < 6 {
                dirs.push((entry.path(), depth + 1));
            }
        }
    }
    found
}
