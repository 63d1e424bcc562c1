//! History: ended jobs leave gpoold's memory once written, and are read
//! back from disk; they are listed, shown, cancelled (refused), logged and
//! depended on as before, and the same after a restart.

use crate::harness::cluster::Cluster;
use crate::harness::process::wait_until;
use std::time::Duration;

/// gpoold's `gpool_jobs_in_memory`, from its /metrics.
fn jobs_in_memory(cluster: &Cluster) -> Option<f64> {
    let addr = std::fs::read_to_string(cluster.state_dir().join("metrics.addr")).ok()?;
    let (_, _, body) = crate::harness::http_get(addr.trim(), "/metrics");
    body.lines()
        .find_map(|line| line.strip_prefix("gpool_jobs_in_memory ")?.parse().ok())
}

/// Restarts gpoold (its metrics address file goes first: the new one
/// writes its own).
fn restart(cluster: &mut Cluster) {
    cluster.controller().stop();
    std::fs::remove_file(cluster.state_dir().join("metrics.addr")).expect("metrics.addr");
    cluster.start_controller();
}

fn wait_for_none_in_memory(cluster: &Cluster) {
    wait_until("the ended jobs to leave memory", Duration::from_secs(20), || {
        (jobs_in_memory(cluster) == Some(0.0)).then_some(())
    });
}

/// The ids `gpool jobs --all` lists, in its order.
fn listed_ids(cluster: &Cluster) -> Vec<u64> {
    let listed = cluster.gpool(&["jobs", "--all", "--output", "json"]).json();
    listed
        .as_array()
        .unwrap_or_else(|| panic!("a list: {listed}"))
        .iter()
        .filter_map(|job| job["id"].as_u64())
        .collect()
}

/// The ended jobs the test made, as `show`, `jobs --all`, `cancel` and
/// `logs` give them.
fn check_history(cluster: &Cluster, done: u64, failed: u64, array: u64, cancelled: u64) {
    let shown = cluster.job(done);
    assert_eq!(shown["state"], "completed", "{shown}");
    assert_eq!(shown["command"][2], "echo from-done", "{shown}");
    let shown = cluster.job(failed);
    assert_eq!(shown["state"], "failed", "{shown}");
    assert_eq!(shown["exit_code"], 3, "{shown}");
    let shown = cluster.job(array);
    assert_eq!(shown["state"], "completed", "{shown}");
    assert_eq!(shown["array"]["ended"], 4, "{shown}");
    assert_eq!(cluster.job(array + 2)["state"], "completed");
    // A task that never became a job ended with its array.
    let task = cluster.job(cancelled + 2);
    assert_eq!(task["state"], "cancelled", "{task}");
    assert_eq!(task["array_job_id"], cancelled, "{task}");
    assert_eq!(task["array_task_id"], 1, "{task}");
    assert_eq!(cluster.job(cancelled)["state"], "cancelled");

    let ids = listed_ids(cluster);
    let mut expected = vec![done, failed, array, cancelled];
    expected.extend((1..=4).map(|position| array + position));
    for id in &expected {
        assert!(ids.contains(id), "job {id} not listed in {ids:?}");
    }
    let completed = cluster
        .gpool(&["jobs", "--state", "completed", "--output", "json"])
        .json();
    assert!(
        completed
            .as_array()
            .is_some_and(|jobs| jobs.iter().any(|job| job["id"] == done)),
        "{completed}"
    );

    // gpool history as sacct: by state and id, from a plain date, with
    // GPU-hours in the JSON.
    let today = &chrono_free_today();
    let failed_only = cluster
        .gpool(&["history", "--since", today, "--state", "failed", "--output", "json"])
        .json();
    let listed: Vec<u64> = failed_only
        .as_array()
        .map(|jobs| jobs.iter().filter_map(|job| job["id"].as_u64()).collect())
        .unwrap_or_default();
    assert!(listed.contains(&failed), "{failed_only}");
    let jobs = failed_only.as_array().expect("jobs");
    assert!(
        jobs.iter()
            .all(|job| job["state"] == "failed" && job["gpu_hours"].is_number()),
        "{failed_only}"
    );
    let picked = cluster
        .gpool(&["history", "--since", today, "-j", &done.to_string(), "--output", "json"])
        .json();
    assert_eq!(picked.as_array().map(Vec::len), Some(1), "{picked}");
    assert_eq!(picked[0]["id"], done);
    // --format, in gpool's words or sacct's.
    let table = cluster
        .gpool(&[
            "history",
            "--since",
            today,
            "-j",
            &done.to_string(),
            "--format",
            "JobID,State,ExitCode,elapsed,gpu_hours,NodeList,max_gpu_mem",
        ])
        .ok()
        .to_string();
    let lines: Vec<Vec<&str>> = table.lines().map(|line| line.split_whitespace().collect()).collect();
    assert_eq!(
        lines[0],
        ["ID", "STATE", "EXIT", "ELAPSED", "GPU-HOURS", "NODELIST", "MAXGPUMEM"],
        "{table}"
    );
    assert_eq!(lines[1][..3], [done.to_string().as_str(), "completed", "0"], "{table}");
    let refused = cluster.gpool(&["history", "--format", "id,maxrss"]);
    assert_eq!(refused.code, 2);
    assert!(
        refused.stderr.contains("\"maxrss\" is not a column"),
        "{}",
        refused.stderr
    );

    let cancel = cluster.gpool(&["cancel", &done.to_string()]);
    assert!(
        cancel
            .stdout
            .contains(&format!("job {done} had already ended (completed)")),
        "{}{}",
        cancel.stdout,
        cancel.stderr
    );
    // Its environment is kept apart from its record, and shown with it.
    let text = cluster.gpool(&["show", "--env", &done.to_string()]);
    assert!(text.ok().contains("KEPT_VAR=done-env"), "{}", text.stdout);
    // The output is on the node: after a restart, once its agent is back.
    let logs = wait_until("the job's output from its node", Duration::from_secs(30), || {
        let logs = cluster.gpool(&["logs", &done.to_string()]);
        (logs.code == 0).then_some(logs.stdout)
    });
    assert_eq!(logs.trim(), "from-done");
    let missing = cluster.gpool(&["show", "987654"]);
    assert_ne!(missing.code, 0);
    assert!(missing.stderr.contains("987654"), "{}", missing.stderr);
}

/// Ends the jobs `check_history` looks at: one done, one failed, an array
/// of 4, and an array cancelled before any task ran (its blocker is
/// cancelled while it runs). Returns the ids `check_history` takes.
fn make_history(cluster: &Cluster) -> (u64, u64, u64, u64) {
    let done = cluster.submit(&["--env", "KEPT_VAR=done-env", "--", "sh", "-c", "echo from-done"]);
    let failed = cluster.submit(&["--", "sh", "-c", "exit 3"]);
    let array = cluster.submit(&["-a", "0-3", "--", "true"]);
    cluster.wait_for_state(done, "completed");
    cluster.wait_for_state(failed, "failed");
    cluster.wait_for_state(array, "completed");
    // Cancelled while it waits for a running job, before any of its tasks
    // became a job.
    let blocker = cluster.submit(&["--", "sleep", "60"]);
    cluster.wait_for_state(blocker, "running");
    let cancelled = cluster.submit(&["-a", "0-2", "-d", &format!("afterany:{blocker}"), "--", "true"]);
    cluster
        .gpool(&["cancel", &cancelled.to_string(), &blocker.to_string()])
        .ok();
    cluster.wait_for_state(cancelled, "cancelled");
    cluster.wait_for_state(blocker, "cancelled");
    (done, failed, array, cancelled)
}

#[test]
fn ended_jobs_leave_memory_and_are_listed_and_shown_from_disk() {
    let mut cluster = Cluster::with_config("metrics_listen = \"127.0.0.1:0\"\n");
    cluster.start_agent("n1", 2);
    let (done, failed, array, cancelled) = make_history(&cluster);
    wait_for_none_in_memory(&cluster);
    check_history(&cluster, done, failed, array, cancelled);

    // A new dependency on a job that left memory is met, or never met, by
    // its record on disk.
    let after_done = cluster.submit(&["-d", &format!("afterok:{done}"), "--", "true"]);
    let after_failed = cluster.submit(&["-d", &format!("afterok:{failed}"), "--", "true"]);
    cluster.wait_for_state(after_done, "completed");
    let never = cluster.wait_for_state(after_failed, "failed");
    assert!(
        never["end_reason"]
            .as_str()
            .is_some_and(|reason| reason.contains(&format!("job {failed} ended failed"))),
        "{never}"
    );
    wait_for_none_in_memory(&cluster);

    restart(&mut cluster);
    assert_eq!(
        wait_until("gpoold's metrics after the restart", Duration::from_secs(10), || {
            jobs_in_memory(&cluster)
        }),
        0.0
    );
    check_history(&cluster, done, failed, array, cancelled);
    let next = cluster.submit(&["--", "true"]);
    assert_eq!(next, after_failed + 1);
}

/// The history files of `kind` in the state dir.
fn history_files(cluster: &Cluster, kind: &str) -> usize {
    std::fs::read_dir(cluster.state_dir().join("history"))
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter(|entry| {
                    let name = entry.file_name().to_string_lossy().into_owned();
                    name.starts_with(&format!("{kind}-")) && name.ends_with(".seg")
                })
                .count()
        })
        .unwrap_or(0)
}

fn attempts_on_record(cluster: &Cluster) -> u64 {
    let report = cluster.gpool(&["report", "--output", "json"]).json();
    report["total"]["attempts"]
        .as_u64()
        .unwrap_or_else(|| panic!("{report}"))
}

#[test]
fn ended_jobs_in_history_files_are_listed_shown_and_depended_on_as_before() {
    // sled keeps ended jobs and accounting records until it holds 32 of a
    // kind; the 16 oldest then move to a history file.
    let mut cluster = Cluster::with_config("metrics_listen = \"127.0.0.1:0\"\nhistory_file_records = 16\n");
    cluster.start_agent("n1", 2);
    let (done, failed, array, cancelled) = make_history(&cluster);
    // Enough later jobs that the first ones move to history files.
    let later = cluster.submit(&["-a", "0-49", "--", "true"]);
    cluster.wait_for_state(later, "completed");
    wait_until(
        "two history files of jobs and two of attempts",
        Duration::from_secs(20),
        || (history_files(&cluster, "jobs") == 2 && history_files(&cluster, "attempts") == 2).then_some(()),
    );
    wait_for_none_in_memory(&cluster);
    check_history(&cluster, done, failed, array, cancelled);
    // Every attempt is charged: done, failed, the 4 tasks, the blocker and
    // the 50 later tasks.
    assert_eq!(attempts_on_record(&cluster), 57);
    // A new dependency on a job in a history file is met, or never met.
    let after_done = cluster.submit(&["-d", &format!("afterok:{done}"), "--", "true"]);
    let after_failed = cluster.submit(&["-d", &format!("afterok:{failed}"), "--", "true"]);
    cluster.wait_for_state(after_done, "completed");
    cluster.wait_for_state(after_failed, "failed");
    wait_for_none_in_memory(&cluster);
    restart(&mut cluster);
    check_history(&cluster, done, failed, array, cancelled);
    assert_eq!(attempts_on_record(&cluster), 58);
    let ids = listed_ids(&cluster);
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(ids, sorted, "listed once each, in id order");
    assert!((later..=later + 50).all(|id| ids.contains(&id)), "{ids:?}");
    let next = cluster.submit(&["--", "true"]);
    assert_eq!(next, after_failed + 1);
}

#[test]
fn a_job_waiting_on_an_ended_job_keeps_it_in_memory_across_a_restart() {
    let mut cluster = Cluster::with_config("metrics_listen = \"127.0.0.1:0\"\n");
    cluster.start_agent("n1", 1);
    let first = cluster.submit(&["--", "true"]);
    cluster.wait_for_state(first, "completed");
    wait_for_none_in_memory(&cluster);
    // It waits for a running job too, so it needs `first` for a while.
    let blocker = cluster.submit(&["--", "sleep", "60"]);
    cluster.wait_for_state(blocker, "running");
    // It runs with its environment after the restart.
    let waiting = cluster.submit(&[
        "-d",
        &format!("afterok:{first},afterany:{blocker}"),
        "--env",
        "KEPT_VAR=across",
        "--",
        "sh",
        "-c",
        "test \"$KEPT_VAR\" = across",
    ]);
    restart(&mut cluster);
    assert_eq!(
        wait_until("gpoold's metrics after the restart", Duration::from_secs(10), || {
            jobs_in_memory(&cluster)
        }),
        3.0,
        "the waiting job, the running one, and the ended job it depends on"
    );
    cluster.gpool(&["cancel", &blocker.to_string()]).ok();
    cluster.wait_for_state(waiting, "completed");
    wait_for_none_in_memory(&cluster);
}

#[test]
fn an_ended_array_whose_tasks_run_is_kept_across_a_restart() {
    let mut cluster = Cluster::with_config("metrics_listen = \"127.0.0.1:0\"\n");
    cluster.start_agent("n1", 2);
    let array = cluster.submit(&["-a", "0-3%2", "--", "sleep", "60"]);
    cluster.wait_for_state(array + 1, "running");
    cluster.wait_for_state(array + 2, "running");
    // The array ends; its two running tasks run on.
    cluster.gpool(&["cancel", "-t", "pending", &array.to_string()]).ok();
    cluster.wait_for_state(array, "cancelled");
    restart(&mut cluster);
    assert_eq!(
        wait_until("gpoold's metrics after the restart", Duration::from_secs(10), || {
            jobs_in_memory(&cluster)
        }),
        3.0,
        "the two running tasks and their ended array"
    );
    // A cancel of the array still reaches its tasks, and it counts them.
    let cancelled = cluster
        .gpool(&["cancel", &array.to_string(), "--output", "json"])
        .json();
    assert_eq!(cancelled["outcomes"][0]["cancelled"], true, "{cancelled}");
    for task in [array + 1, array + 2] {
        cluster.wait_for_state(task, "cancelled");
    }
    let record = cluster.job(array);
    assert_eq!(record["array"]["ended"], 2, "{record}");
    wait_for_none_in_memory(&cluster);
}

#[test]
fn array_tasks_run_with_their_arrays_environment_after_a_restart() {
    let mut cluster = Cluster::with_config("metrics_listen = \"127.0.0.1:0\"\n");
    cluster.start_agent("n1", 1);
    let array = cluster.submit(&[
        "-a",
        "0-3%1",
        "--env",
        "KEPT_VAR=array-env",
        "--",
        "sh",
        "-c",
        "sleep 0.3; test \"$KEPT_VAR\" = array-env",
    ]);
    cluster.wait_for_state(array + 1, "running");
    // Tasks 1 to 3 become jobs after the restart, from the array as loaded.
    restart(&mut cluster);
    let record = cluster.wait_for_state(array, "completed");
    assert_eq!(record["array"]["not_completed"], 0, "{record}");
    // A task that ended and left memory is shown with its environment.
    wait_for_none_in_memory(&cluster);
    let text = cluster.gpool(&["show", "--env", &(array + 4).to_string()]);
    assert!(text.ok().contains("KEPT_VAR=array-env"), "{}", text.stdout);
}

/// Today's date in UTC (`2026-11-27`), from the system clock.
fn chrono_free_today() -> String {
    let output = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .expect("date(1)");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}
