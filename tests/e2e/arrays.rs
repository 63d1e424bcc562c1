//! Job arrays: one submission of many tasks, listed as one line while they
//! wait, run within their %N, and addressed as a whole or one task at a
//! time; with -o/-e output files.

use crate::harness::cluster::Cluster;
use crate::harness::process::wait_until;
use std::time::Duration;

/// The highest number of tasks a marks file shows running at once (each
/// task appends `+` when it starts and `-` before it ends).
pub(crate) fn most_at_once(marks: &str) -> usize {
    let (mut now, mut most) = (0usize, 0usize);
    for line in marks.lines() {
        match line {
            "+" => now += 1,
            "-" => now = now.saturating_sub(1),
            _ => {}
        }
        most = most.max(now);
    }
    most
}

#[test]
fn a_thousand_task_array_runs_at_most_fifty_at_once_and_lists_as_one_line() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 40);
    cluster.start_agent("n2", 40);
    let marks = cluster.dir.path().join("marks");
    let script = format!(
        "echo + >> {m}; sleep 0.3; test $GPOOL_ARRAY_JOB_ID -gt 0 && echo $GPOOL_ARRAY_TASK_ID >> {m}.ids; echo - >> {m}",
        m = marks.display()
    );
    let array = cluster.submit(&["-a", "0-999%50", "-J", "sweep", "--", "sh", "-c", &script]);

    // Waiting tasks are one line (the table) and one record (JSON).
    let table = cluster.gpool(&["jobs"]).ok().to_string();
    let array_lines: Vec<&str> = table
        .lines()
        .filter(|line| line.starts_with(&format!("{array}_[")))
        .collect();
    assert_eq!(array_lines.len(), 1, "{table}");
    assert!(array_lines[0].contains("pending"), "{table}");
    let pending = cluster
        .gpool(&["jobs", "--state", "pending", "--output", "json"])
        .json();
    assert_eq!(pending.as_array().map(Vec::len), Some(1), "{pending}");
    assert_eq!(pending[0]["array"]["tasks"], 1000);
    assert_eq!(pending[0]["array"]["indices"], "0-999%50");

    // gpoold never has more than 50 running, by its own listing either.
    let mut most_listed = 0;
    let done = wait_until("the array to end", Duration::from_secs(240), || {
        let running = cluster
            .gpool(&["jobs", "--state", "running", "--output", "json"])
            .json();
        most_listed = most_listed.max(running.as_array().map_or(0, Vec::len));
        let record = cluster.job(array);
        (record["state"] != "pending").then_some(record)
    });
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["array"]["ended"], 1000, "{done}");
    assert!(most_listed <= 50, "{most_listed} running at once");
    let marks_text = std::fs::read_to_string(&marks).unwrap();
    let most = most_at_once(&marks_text);
    assert!(most <= 50, "{most} ran at once");
    // 80 GPUs: the %50 is what held it back.
    assert!(most >= 25, "only {most} ran at once");
    let mut ids: Vec<u32> = std::fs::read_to_string(marks.with_extension("ids"))
        .unwrap()
        .lines()
        .map(|line| line.parse().unwrap())
        .collect();
    ids.sort_unstable();
    assert_eq!(ids, (0..1000).collect::<Vec<u32>>(), "every task ran once");
}

#[test]
fn a_pipeline_with_an_array_stage_runs_in_order_and_a_failed_task_ends_the_rest() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 8);
    let marks = cluster.dir.path().join("marks");
    let pipeline = |failing_task: i32| {
        format!(
            r#"[[job]]
name = "prep"
command = "echo prep >> {m}"

[[job]]
name = "train"
array = "0-3"
command = "sleep 0.2; echo train $GPOOL_ARRAY_TASK_ID >> {m}; test $GPOOL_ARRAY_TASK_ID -ne {failing_task}"
dependency = "afterok:prep"

[[job]]
name = "eval"
command = "echo eval >> {m}"
dependency = "afterok:train"
"#,
            m = marks.display()
        )
    };
    let file = cluster.dir.path().join("pipeline.toml");
    std::fs::write(&file, pipeline(-1)).unwrap();
    let ids = cluster.submit_file(&file);
    // The array's tasks take the ids after its own.
    assert_eq!(ids[2], ids[1] + 5, "{ids:?}");
    cluster.wait_for_state(ids[2], "completed");
    let lines: Vec<String> = std::fs::read_to_string(&marks)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    assert_eq!(lines.first().map(String::as_str), Some("prep"), "{lines:?}");
    assert_eq!(lines.last().map(String::as_str), Some("eval"), "{lines:?}");
    let mut trained: Vec<&str> = lines[1..lines.len() - 1].iter().map(String::as_str).collect();
    trained.sort_unstable();
    assert_eq!(trained, ["train 0", "train 1", "train 2", "train 3"]);
    let train = cluster.job(ids[1]);
    assert_eq!(train["state"], "completed", "{train}");

    // Task 2 fails: the array fails, and eval ends with the reason.
    std::fs::remove_file(&marks).unwrap();
    std::fs::write(&file, pipeline(2)).unwrap();
    let ids = cluster.submit_file(&file);
    let eval = cluster.wait_for_state(ids[2], "failed");
    assert_eq!(
        eval["end_reason"].as_str(),
        Some(
            format!(
                "its dependency can never be met: job {} ended failed, and it was to complete (afterok)",
                ids[1]
            )
            .as_str()
        ),
        "{eval}"
    );
    let train = cluster.job(ids[1]);
    assert_eq!(train["end_reason"], "1 of its 4 tasks did not complete", "{train}");
    let task = cluster
        .gpool(&["show", &format!("{}_2", ids[1]), "--output", "json"])
        .json();
    assert_eq!(task["state"], "failed", "{task}");
    assert_eq!(task["array_job_id"], ids[1]);
    assert_eq!(task["array_task_id"], 2);
    assert!(!std::fs::read_to_string(&marks).unwrap().contains("eval"));
}

#[test]
fn tasks_are_acted_on_alone_or_with_their_array() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 2);
    let out = cluster.dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let array = cluster.submit(&[
        "-a",
        "0-9:3%1",
        "-o",
        &format!("{}/%A_%a.%n.out", out.display()),
        "-e",
        "%x-%j.err",
        "--workdir",
        &out.display().to_string(),
        "-J",
        "tasks",
        "--",
        "sh",
        "-c",
        "echo out $GPOOL_ARRAY_TASK_ID; echo err >&2; sleep 30",
    ]);
    // Indices 0, 3, 6, 9; one at a time.
    let first = cluster.wait_for_state(array + 1, "running");
    assert_eq!(first["array_task_id"], 0);
    let why = cluster.gpool(&["why", "--output", "json", &array.to_string()]).json();
    assert_eq!(why["reason_codes"], serde_json::json!(["array_limit"]), "{why}");

    // A task that is not a job yet: shown, then cancelled alone.
    let waiting = cluster
        .gpool(&["show", &format!("{array}_6"), "--output", "json"])
        .json();
    assert_eq!(waiting["state"], "pending", "{waiting}");
    assert_eq!(waiting["id"], array + 3);
    let cancelled = cluster
        .gpool(&["cancel", &format!("{array}_6"), "--output", "json"])
        .json();
    assert_eq!(cancelled["outcomes"][0]["cancelled"], true, "{cancelled}");
    let bad = cluster.gpool(&["show", &format!("{array}_7")]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(
        bad.stderr
            .contains(&format!("array {array} has no task 7 (its indices are 0-9:3%1)")),
        "{}",
        bad.stderr
    );

    // Its output went to the files named; `logs` says so.
    wait_until("task 0's output file", Duration::from_secs(10), || {
        let text = std::fs::read_to_string(out.join(format!("{array}_0.n1.out"))).ok()?;
        (text == "out 0\n").then_some(())
    });
    let err_file = out.join(format!("tasks-{}.err", array + 1));
    wait_until("task 0's stderr file", Duration::from_secs(10), || {
        let text = std::fs::read_to_string(&err_file).ok()?;
        (text == "err\n").then_some(())
    });
    let logs = cluster.gpool(&["logs", &format!("{array}_0")]);
    // Named as its node wrote it, not as the pattern.
    let written = out.join(format!("{array}_0.n1.out"));
    assert!(
        logs.stderr
            .contains(&format!("writes its stdout to {} on n1", written.display())),
        "{}",
        logs.stderr
    );

    // Requeue the running task: it goes back and runs again.
    let requeued = cluster
        .gpool(&["requeue", &format!("{array}_0"), "--output", "json"])
        .json();
    assert_eq!(requeued["outcomes"][0]["requeued"], true, "{requeued}");
    wait_until("task 0 to run a second attempt", Duration::from_secs(30), || {
        let task = cluster.job(array + 1);
        (task["state"] == "running" && task["attempt"] == 2).then_some(())
    });

    // %N changes while it waits; users may shorten, not lengthen, limits.
    let updated = cluster
        .gpool(&["update", &array.to_string(), "--max-parallel", "2", "--output", "json"])
        .json();
    assert_eq!(updated["outcomes"][0]["updated"], true, "{updated}");
    cluster.wait_for_state(array + 2, "running");

    // Hold the array: its waiting task stays; cancel it whole.
    let held = cluster.gpool(&["hold", &array.to_string()]).ok().to_string();
    assert!(held.contains("held"), "{held}");
    let listing = cluster.gpool(&["jobs"]).ok().to_string();
    assert!(listing.contains(&format!("{array}_[9]")), "{listing}");
    let ended = cluster.gpool(&["cancel", "--name", "tasks", "--output", "json"]).json();
    assert!(ended["outcomes"].as_array().is_some_and(|o| !o.is_empty()), "{ended}");
    let record = cluster.wait_for_state(array, "cancelled");
    assert_eq!(record["array"]["waiting"], 0, "{record}");
    for task in [array + 1, array + 2] {
        cluster.wait_for_state(task, "cancelled");
    }
    let after = cluster
        .gpool(&["show", &format!("{array}_9"), "--output", "json"])
        .json();
    assert_eq!(after["state"], "cancelled", "{after}");
}

#[test]
fn update_changes_a_pending_job_only() {
    let mut cluster = Cluster::start();
    let job = cluster.submit(&["-t", "2h", "--", "sleep", "30"]);
    let shorter = cluster.gpool(&["update", &job.to_string(), "-t", "1h", "--priority", "5"]);
    assert!(
        shorter.ok().contains(&format!("job {job} updated")),
        "{}",
        shorter.stdout
    );
    let shown = cluster.job(job);
    assert_eq!(shown["time_limit_secs"], 3600);
    assert_eq!(shown["priority"], 5);
    let nothing = cluster.gpool(&["update", &job.to_string()]);
    assert_eq!(nothing.code, 2, "{}", nothing.stderr);
    cluster.start_agent("n1", 1);
    cluster.wait_for_state(job, "running");
    let running = cluster.gpool(&["update", &job.to_string(), "-t", "30m"]);
    assert_eq!(running.code, 1, "{}", running.stderr);
    assert!(
        running.stderr.contains("is running: only a pending job can be changed"),
        "{}",
        running.stderr
    );
    let not_array = cluster.gpool(&["update", &job.to_string(), "--max-parallel", "2"]);
    assert!(not_array.stderr.contains("is not an array"), "{}", not_array.stderr);
}

#[test]
fn a_held_array_holds_the_tasks_acted_on_alone_and_cancel_pending_leaves_running_tasks() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 2);
    let array = cluster.submit(&["-a", "0-5%1", "-J", "held", "--", "sleep", "30"]);
    cluster.wait_for_state(array + 1, "running");
    cluster.gpool(&["hold", &array.to_string()]).ok();
    // Changing one waiting task makes it a job: held like its array.
    let updated = cluster
        .gpool(&["update", &format!("{array}_4"), "--priority", "1"])
        .ok()
        .to_string();
    assert!(updated.contains("updated"), "{updated}");
    cluster
        .gpool(&["update", &array.to_string(), "--max-parallel", "0"])
        .ok();
    std::thread::sleep(Duration::from_millis(1500));
    let task = cluster.job(array + 5);
    assert_eq!(task["state"], "pending", "{task}");
    assert_eq!(task["reason_codes"], serde_json::json!(["held"]), "{task}");

    // `cancel -t pending`: the array hands out no more, its running task
    // runs on.
    let cancelled = cluster
        .gpool(&["cancel", "-n", "held", "-t", "pending", "--output", "json"])
        .json();
    assert!(
        cancelled["outcomes"].as_array().is_some_and(|o| !o.is_empty()),
        "{cancelled}"
    );
    assert_eq!(cluster.job(array)["state"], "cancelled");
    assert_eq!(cluster.job(array + 5)["state"], "cancelled");
    assert_eq!(cluster.job(array + 1)["state"], "running");
    let container = cluster.gpool(&["submit", "--image", "alpine", "-o", "/tmp/x", "--", "true"]);
    assert_eq!(container.code, 2, "{}", container.stderr);
    assert!(
        container
            .stderr
            .contains("stdout: a container job's output stays in the spool"),
        "{}",
        container.stderr
    );
}

#[test]
fn an_array_half_done_goes_on_after_a_controller_restart() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 2);
    let marks = cluster.dir.path().join("marks");
    let script = format!("sleep 0.2; echo $GPOOL_ARRAY_TASK_ID >> {}", marks.display());
    let array = cluster.submit(&["-a", "0-19%2", "--", "sh", "-c", &script]);
    wait_until("a few tasks to end", Duration::from_secs(30), || {
        let record = cluster.job(array);
        (record["array"]["ended"].as_u64()? >= 4).then_some(())
    });
    cluster.controller().stop();
    cluster.start_controller();
    let record = cluster.wait_for_state(array, "completed");
    assert_eq!(record["array"]["ended"], 20, "{record}");
    assert_eq!(record["array"]["not_completed"], 0, "{record}");
    let mut ran: Vec<u32> = std::fs::read_to_string(&marks)
        .unwrap()
        .lines()
        .map(|line| line.parse().unwrap())
        .collect();
    ran.sort_unstable();
    assert_eq!(ran, (0..20).collect::<Vec<u32>>(), "each task ran once");
    // New jobs take ids after the array's reserved ones.
    let next = cluster.submit(&["--", "true"]);
    assert_eq!(next, array + 21);
}
