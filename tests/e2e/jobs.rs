//! Submitting, listing, showing and cancelling jobs through the CLI.

use crate::harness::cluster::{gpool_command, Cluster};
use crate::harness::process::wait_until;
use std::process::Stdio;
use std::time::Duration;

#[test]
fn submit_list_show_cancel() {
    let cluster = Cluster::start();
    let first = cluster.submit(&[
        "--gpus", "2", "--name", "train", "--team", "ml", "--time", "2h", "--env", "EPOCHS=3", "--", "python3",
        "train.py",
    ]);
    let second = cluster.submit(&["--gpus", "1", "--team", "infra", "--", "true"]);
    assert_eq!(second, first + 1);

    let jobs = cluster.gpool(&["jobs", "--output", "json"]).json();
    let jobs = jobs.as_array().expect("array");
    assert_eq!(jobs.len(), 2);
    // -j: only the jobs named, as squeue -j.
    let picked = cluster
        .gpool(&["jobs", "-j", &second.to_string(), "--output", "json"])
        .json();
    assert_eq!(picked.as_array().map(|jobs| jobs.len()), Some(1), "{picked}");
    assert_eq!(picked[0]["id"], second);
    let job = &jobs[0];
    assert_eq!(job["id"], first);
    assert_eq!(job["name"], "train");
    assert_eq!(job["state"], "pending");
    assert_eq!(job["team"], "ml");
    assert_eq!(job["gpus"], 2);
    assert_eq!(job["nodes"], 1);
    assert_eq!(job["time_limit_secs"], 7200);
    assert_eq!(job["exit_code"], serde_json::Value::Null);
    assert!(job["user"].as_str().is_some_and(|u| !u.is_empty()));
    assert!(job["submitted_at"].as_str().is_some_and(|t| t.ends_with('Z')));
    assert_eq!(jobs[1]["team"], "infra");

    // Filters.
    let ml = cluster.gpool(&["jobs", "--team", "ml", "--output", "json"]).json();
    assert_eq!(ml.as_array().map(Vec::len), Some(1));

    // Pending with the reason the scheduler gives.
    let shown = crate::harness::process::wait_until("a pending reason", Duration::from_secs(10), || {
        let job = cluster.job(first);
        (job["reasons"][0] != serde_json::Value::Null).then_some(job)
    });
    assert!(
        shown["reasons"][0].as_str().unwrap_or_default().starts_with("no nodes"),
        "{shown}"
    );
    let text = cluster.gpool(&["show", &first.to_string()]);
    assert!(text.ok().contains("why pending:     no nodes"), "{}", text.stdout);
    // The environment is counted, and listed on asking.
    assert!(text.stdout.contains("variables (gpool show --env"), "{}", text.stdout);
    assert!(!text.stdout.contains("EPOCHS=3"), "{}", text.stdout);
    let text = cluster.gpool(&["show", "--env", &first.to_string()]);
    assert!(text.ok().contains("env:             EPOCHS=3"), "{}", text.stdout);

    // Cancel: the first time ends it, the second says it had ended.
    let cancelled = cluster
        .gpool(&["cancel", &first.to_string(), "--output", "json"])
        .json();
    assert_eq!(cancelled["outcomes"][0]["cancelled"], true);
    let again = cluster.gpool(&["cancel", &first.to_string()]);
    assert!(again.ok().contains("had already ended (cancelled)"), "{}", again.stdout);
    assert_eq!(cluster.job(first)["state"], "cancelled");

    let queue = cluster.gpool(&["jobs", "--output", "json"]).json();
    assert_eq!(queue.as_array().map(Vec::len), Some(1), "finished jobs leave the queue");
    let all = cluster.gpool(&["jobs", "--all", "--output", "json"]).json();
    assert_eq!(all.as_array().map(Vec::len), Some(2));
    let only_cancelled = cluster
        .gpool(&["jobs", "--state", "cancelled", "--output", "json"])
        .json();
    assert_eq!(only_cancelled[0]["id"], first);
}

#[test]
fn batch_file_is_one_request() {
    let cluster = Cluster::start();
    let file = cluster.dir.path().join("jobs.toml");
    std::fs::write(
        &file,
        "[[job]]\nname = \"a\"\ncommand = \"echo a\"\n\n[[job]]\nname = \"b\"\ncommand = [\"echo\", \"b\"]\ngpus = 4\nnodes = 2\n\n[[job]]\nname = \"c\"\ncommand = [\"true\"]\ngpu_type = [\"h100\", \"a100\"]\n",
    )
    .unwrap();
    let run = cluster.gpool(&["submit", "-f", file.to_str().unwrap(), "--output", "json"]);
    let ids: Vec<u64> = run.json()["ids"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_u64())
        .collect();
    assert_eq!(ids.len(), 3);
    assert_eq!(ids, vec![ids[0], ids[0] + 1, ids[0] + 2]);
    let b = cluster.job(ids[1]);
    assert_eq!(
        (b["name"].as_str(), b["gpus"].as_u64(), b["nodes"].as_u64()),
        (Some("b"), Some(4), Some(2))
    );
    assert_eq!(cluster.job(ids[2])["gpu_types"], serde_json::json!(["h100", "a100"]));
    // Plain output: one id a line, for shell scripts.
    let plain = cluster.gpool(&["submit", "-f", file.to_str().unwrap()]);
    assert_eq!(plain.ok().lines().count(), 3);
}

#[test]
fn wait_exits_with_the_cancelled_code() {
    let cluster = Cluster::start();
    let waiter = gpool_command(&["submit", "--wait", "--", "sleep", "1000"])
        .env("GPOOL_SERVER", &cluster.addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start gpool submit --wait");
    let id = crate::harness::process::wait_until("the waiting job", Duration::from_secs(10), || {
        let jobs = cluster.gpool(&["jobs", "--output", "json"]).json();
        jobs[0]["id"].as_u64()
    });
    cluster.gpool(&["cancel", &id.to_string()]).ok();
    let output = crate::harness::process::output_within(waiter, "gpool submit --wait", Duration::from_secs(30));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(125), "stderr: {stderr}");
    assert!(stderr.contains(&format!("job {id} cancelled")), "{stderr}");
}

#[test]
fn cli_finds_a_running_dev_controller() {
    let cluster = Cluster::start();
    let id = cluster.submit(&["--", "true"]);
    let found = gpool_command(&["show", &id.to_string(), "--output", "json"])
        .env("XDG_RUNTIME_DIR", cluster.runtime_dir())
        .output()
        .expect("run gpool");
    assert_eq!(
        found.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&found.stderr)
    );

    let elsewhere = cluster.dir.path().join("no-runtime");
    let lost = gpool_command(&["jobs"])
        .env("XDG_RUNTIME_DIR", &elsewhere)
        .output()
        .expect("run gpool");
    let stderr = String::from_utf8_lossy(&lost.stderr);
    assert_eq!(lost.status.code(), Some(2));
    assert!(
        stderr.contains("give --server HOST:PORT or set GPOOL_SERVER"),
        "{stderr}"
    );
    assert!(stderr.contains(&elsewhere.display().to_string()), "{stderr}");
}

#[test]
fn drain_of_an_unknown_node_names_it() {
    let cluster = Cluster::start();
    let run = cluster.gpool(&["drain", "gpu-17", "--reason", "bad fan"]);
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("node \"gpu-17\" not found"), "{}", run.stderr);
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    assert_eq!(nodes, serde_json::json!([]));
}

#[test]
fn dev_mode_runs_jobs_on_in_process_agents() {
    let cluster = Cluster::dev_default();
    for node in ["dev-1", "dev-2"] {
        cluster.wait_for_node(node, "idle");
    }
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    assert_eq!(nodes[0]["gpus_total"], 8);
    assert_eq!(nodes[0]["gpu_model"], "h100");
    let run = cluster.gpool(&[
        "submit",
        "--gpus",
        "2",
        "--wait",
        "--",
        "sh",
        "-c",
        "test -n \"$CUDA_VISIBLE_DEVICES\"",
    ]);
    assert_eq!(run.code, 0, "stderr: {}", run.stderr);
}

/// `-G` as Slurm means it: the job's total, spread over its nodes;
/// `--gres gpu:MODEL:N` and `--gpus-per-node` per node.
#[test]
fn slurm_gpu_flags_mean_what_they_mean_in_slurm() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 2);
    cluster.start_agent("n2", 2);
    let gang = cluster.gpool(&["submit", "-G", "h100:4", "-N", "2", "--wait", "--", "true"]);
    assert_eq!(gang.code, 0, "{}", gang.stderr);
    let job = cluster.job(gang.stdout.trim().parse().unwrap());
    assert_eq!((job["gpus"].as_u64(), job["gpus_total"].as_u64()), (Some(2), Some(4)));
    assert_eq!(job["gpu_types"], serde_json::json!(["h100"]));
    assert_eq!(job["node_list"].as_array().map(Vec::len), Some(2), "{job}");
    for flags in [["--gres", "gpu:h100:2"], ["--gpus-per-node", "2"]] {
        let mut args = vec!["-N", "2"];
        args.extend(flags);
        args.extend(["--", "true"]);
        let job = cluster.job(cluster.submit(&args));
        assert_eq!(
            (job["gpus"].as_u64(), job["gpus_total"].as_u64()),
            (Some(2), Some(4)),
            "{flags:?}"
        );
    }
}

#[test]
fn a_second_dev_controller_leaves_the_first_ones_address_alone() {
    let first = Cluster::start();
    let pointer = first.runtime_dir().join("gpool").join("dev.addr");
    assert_eq!(std::fs::read_to_string(&pointer).unwrap().trim(), first.addr);
    let state_dir = first.dir.path().join("second-state");
    let mut second = crate::harness::process::Process::spawn(
        "second gpoold",
        {
            let mut command = std::process::Command::new(crate::harness::process::binary("gpoold"));
            command
                .args(["--dev", "--dev-nodes", "0", "--listen", "127.0.0.1:0", "--state-dir"])
                .arg(&state_dir)
                .env("XDG_RUNTIME_DIR", first.runtime_dir());
            command
        },
        first.dir.path().join("second.log"),
    );
    // It looks at the pointer before it writes its address file: wait for
    // both, and for what it concluded.
    crate::harness::process::wait_until("the second controller to start", Duration::from_secs(30), || {
        std::fs::read_to_string(state_dir.join("gpoold.addr")).ok()?;
        let log = std::fs::read_to_string(first.dir.path().join("second.log")).ok()?;
        log.contains("another dev controller answers at").then_some(())
    });
    assert_eq!(
        std::fs::read_to_string(&pointer).unwrap().trim(),
        first.addr,
        "overwritten"
    );
    assert!(
        second.stop(),
        "the second controller stops on SIGTERM: {}",
        second.log_tail(20)
    );
    assert_eq!(
        std::fs::read_to_string(&pointer).unwrap().trim(),
        first.addr,
        "removed by the second's stop"
    );
    let log = std::fs::read_to_string(first.dir.path().join("second.log")).unwrap();
    assert!(log.contains("another dev controller answers at"), "{log}");
}

#[test]
fn ctrl_c_on_submit_wait_says_the_job_runs_on() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 1);
    let waiting = gpool_command(&["submit", "--wait", "--", "sleep", "100"])
        .env("GPOOL_SERVER", &cluster.addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let id = crate::harness::process::wait_until("the job to run", Duration::from_secs(20), || {
        let jobs = cluster.gpool(&["jobs", "--output", "json"]).json();
        let job = jobs.as_array()?.first()?.clone();
        (job["state"] == "running").then(|| job["id"].as_u64().unwrap())
    });
    // The CLI is surely watching by now.
    std::thread::sleep(Duration::from_millis(300));
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(waiting.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let output = waiting.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains(&format!("job {id} still in the pool: `gpool cancel {id}` ends it")),
        "{stderr}"
    );
    assert_eq!(cluster.job(id)["state"], "running");
}

#[test]
fn completions_load_in_bash_and_man_pages_are_written() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("gpool.bash");
    let output = gpool_command(&["completions", "bash"]).output().unwrap();
    assert!(output.status.success());
    std::fs::write(&script, &output.stdout).unwrap();
    let loaded = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("source {} && complete -p gpool", script.display()))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&loaded.stdout);
    assert!(
        loaded.status.success() && said.contains("gpool"),
        "{said} {}",
        String::from_utf8_lossy(&loaded.stderr)
    );
    // A flag with a few words offers those words, not file names.
    let offered = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {} && COMP_WORDS=(gpool submit --nvlink '') && COMP_CWORD=3 && _gpool gpool '' --nvlink && echo \"${{COMPREPLY[*]}}\"",
            script.display()
        ))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&offered.stdout).trim(),
        "required preferred any"
    );

    let man = dir.path().join("man1");
    let output = gpool_command(&["man", "--out", &man.display().to_string()])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    for page in ["gpool.1", "gpool-submit.1", "gpool-admin-node-remove.1"] {
        let text = std::fs::read_to_string(man.join(page)).unwrap_or_default();
        assert!(text.contains(".TH"), "{page}: {text:.200}");
        assert!(
            text.contains(".SH \"EXIT STATUS\"") && text.contains(".SH ENVIRONMENT") && text.contains("GPOOL_SERVER"),
            "{page}"
        );
    }
}

#[test]
fn jobs_get_the_submitting_shells_environment_and_gpool_on_their_path() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 1);
    let script = "echo \"FOO=$FOO SSH=${SSH_AUTH_SOCK:-unset}\"; command -v gpool";
    let submit = |export: Option<&str>| -> u64 {
        let mut args = vec!["submit", "--output", "json"];
        if let Some(export) = export {
            args.extend(["--export", export]);
        }
        args.extend(["--", "sh", "-c", script]);
        let output = gpool_command(&args)
            .env("GPOOL_SERVER", &cluster.addr)
            .env("FOO", "from-the-shell")
            .env("SSH_AUTH_SOCK", "/tmp/agent.sock")
            .output()
            .unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let reply: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
        reply["ids"][0].as_u64().unwrap()
    };
    let all = submit(None);
    let none = submit(Some("NONE"));
    let named = submit(Some("FOO=set-here"));
    let output_of = |id: u64| {
        cluster.wait_for_state(id, "completed");
        cluster.gpool(&["logs", &id.to_string()]).ok().to_string()
    };
    let text = output_of(all);
    assert!(text.starts_with("FOO=from-the-shell SSH=unset\n"), "{text}");
    assert!(
        text.trim_end().ends_with("/gpool"),
        "gpool is on the job's PATH: {text}"
    );
    assert!(output_of(none).starts_with("FOO= SSH=unset\n"));
    assert!(output_of(named).starts_with("FOO=set-here SSH=unset\n"));
}

/// A batch script is copied at submit, as Slurm does: edited or deleted
/// while its job waits, the job still runs what was submitted.
#[test]
fn a_batch_script_runs_as_it_was_at_submit() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 1);
    cluster.gpool(&["drain", "n1", "--reason", "hold the job back"]).ok();
    let script = cluster.dir.path().join("step.sh");
    std::fs::write(&script, "#!/bin/sh\n#GPOOL --gpus 1\necho \"submitted version $1\"\n").unwrap();
    let path = script.display().to_string();
    let run = cluster.gpool(&["submit", "--output", "json", &path, "one"]);
    let id = run.json()["ids"][0]
        .as_u64()
        .unwrap_or_else(|| panic!("{}", run.stderr));
    std::fs::write(&script, "#!/bin/sh\necho 'edited version\n").unwrap();
    std::fs::remove_file(&script).unwrap();
    cluster.gpool(&["resume", "n1"]).ok();
    let job = cluster.wait_for_state(id, "completed");
    assert_eq!(job["command"][1], path, "the command still names the script: {job}");
    let output = cluster.gpool(&["logs", &id.to_string()]).ok().to_string();
    assert_eq!(output, "submitted version one\n");
    // The daemons' logs, off a terminal (journald, a file), carry no
    // colour codes.
    let agent_log = cluster.agents[0].log_tail(10_000);
    assert!(
        agent_log.contains("registered") && !agent_log.contains('\u{1b}'),
        "{agent_log}"
    );
    assert!(!cluster.controller().log_tail(10_000).contains('\u{1b}'));
}

#[test]
fn a_batch_script_runs_with_its_gpool_lines_as_flags() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 2);
    let script = cluster.dir.path().join("train.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n#GPOOL --gpus 2\n#GPOOL -t 10m --name from-script\necho \"gpus=$GPOOL_GPUS args=$*\"\n",
    )
    .unwrap();
    let script = script.display().to_string();
    // The command line's --name wins over the script's.
    let run = cluster.gpool(&[
        "submit", "--output", "json", "--name", "cli-name", &script, "--lr", "0.1",
    ]);
    let id = run.json()["ids"][0]
        .as_u64()
        .unwrap_or_else(|| panic!("{}", run.stderr));
    let job = cluster.wait_for_state(id, "completed");
    assert_eq!(
        (
            job["name"].as_str(),
            job["gpus"].as_u64(),
            job["time_limit_secs"].as_u64()
        ),
        (Some("cli-name"), Some(2), Some(600))
    );
    let output = cluster.gpool(&["logs", &id.to_string()]).ok().to_string();
    assert_eq!(output, "gpus=2 args=--lr 0.1\n");
    // Not a readable script: said so.
    let run = cluster.gpool(&["submit", "no-such-script.sh"]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("no-such-script.sh: cannot read"), "{}", run.stderr);
    // A script may not send the job (and the caller's token) elsewhere,
    // and a flag that lacks its value is refused, not run as something.
    for (line, said) in [
        (
            "#GPOOL --server 10.9.9.9:7070",
            "hold submit flags only; --server is not one",
        ),
        ("#GPOOL -t", "must be whole flags"),
        ("#GPOOL sleep", "must be whole flags"),
        // A flag gpool does not know is named, with its line.
        (
            "#GPOOL --gpus-per-task 2",
            "bad.sh:2: #GPOOL unknown flag --gpus-per-task: gpool asks for GPUs with --gpus",
        ),
    ] {
        let bad = cluster.dir.path().join("bad.sh");
        std::fs::write(&bad, format!("#!/bin/sh\n{line}\ntrue\n")).unwrap();
        let run = cluster.gpool(&["submit", &bad.display().to_string()]);
        assert_eq!(run.code, 2, "{line}: {}", run.stderr);
        assert!(run.stderr.contains(said), "{line}: {}", run.stderr);
        assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    }
}

#[test]
fn gpool_wait_exits_as_submit_wait_does() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 2);
    let ok = cluster.submit(&["--", "true"]);
    let bad = cluster.submit(&["--", "sh", "-c", "exit 9"]);
    let run = cluster.gpool(&["wait", &ok.to_string(), &bad.to_string()]);
    assert_eq!(run.code, 3, "gpool's code for a failed job: {}", run.stderr);
    assert!(run.stderr.contains(&format!("job {bad} failed")), "{}", run.stderr);
    assert_eq!(cluster.gpool(&["wait", &ok.to_string()]).code, 0);
    let run = cluster.gpool(&["wait", "9999"]);
    assert_eq!(run.code, 1);
    assert!(run.stderr.contains("job 9999 not found"), "{}", run.stderr);
}

#[test]
fn following_the_logs_of_a_pending_job_waits_for_it_to_start() {
    let mut cluster = Cluster::start();
    let id = cluster.submit(&["--", "sh", "-c", "echo hello; sleep 1; echo bye"]);
    let follower = gpool_command(&["logs", "--follow", &id.to_string()])
        .env("GPOOL_SERVER", &cluster.addr)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    cluster.start_agent("n1", 1);
    let output = crate::harness::process::output_within(follower, "gpool logs --follow", Duration::from_secs(30));
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "hello\nbye\n");
}

#[test]
fn a_pipeline_in_one_job_file_runs_in_order_and_a_failed_stage_ends_the_rest() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 4);
    let marks = cluster.dir.path().join("marks");
    let stage = |name: &str, dependency: &str, exit: u8| {
        format!(
            "[[job]]\nname = \"{name}\"\ncommand = [\"sh\", \"-c\", \"echo start {name} >> {m}; sleep 0.3; echo end {name} >> {m}; exit {exit}\"]\n{dependency}\n",
            m = marks.display()
        )
    };
    let pipeline = |train_b_exit: u8| {
        [
            stage("prep", "", 0),
            stage("train-a", "dependency = \"afterok:prep\"", 0),
            stage("train-b", "dependency = \"afterok:prep\"", train_b_exit),
            stage("eval", "dependency = \"afterok:train-a:train-b\"", 0),
        ]
        .concat()
    };
    let file = cluster.dir.path().join("pipeline.toml");
    std::fs::write(&file, pipeline(0)).unwrap();
    let ids = cluster.submit_file(&file);
    let eval = cluster.wait_for_state(ids[3], "completed");
    assert_eq!(eval["state"], "completed");
    let lines: Vec<String> = std::fs::read_to_string(&marks)
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let at = |line: &str| {
        lines
            .iter()
            .position(|l| l == line)
            .unwrap_or_else(|| panic!("{line}: {lines:?}"))
    };
    assert!(
        at("end prep") < at("start train-a") && at("end prep") < at("start train-b"),
        "{lines:?}"
    );
    assert!(
        at("end train-a") < at("start eval") && at("end train-b") < at("start eval"),
        "{lines:?}"
    );

    // train-b fails: eval never runs, and says why.
    std::fs::remove_file(&marks).unwrap();
    std::fs::write(&file, pipeline(3)).unwrap();
    let ids = cluster.submit_file(&file);
    let eval = cluster.wait_for_state(ids[3], "failed");
    assert_eq!(
        eval["end_reason"].as_str(),
        Some(
            format!(
                "its dependency can never be met: job {} ended failed, and it was to complete (afterok)",
                ids[2]
            )
            .as_str()
        ),
        "{eval}"
    );
    assert!(!std::fs::read_to_string(&marks).unwrap().contains("start eval"));
    // While it waits, a dependent job says for what; an unknown id is refused.
    let blocker = cluster.submit(&["--", "sleep", "30"]);
    let waiting = cluster.submit(&["-d", &format!("afterany:{blocker}"), "--", "true"]);
    let codes = cluster.gpool(&["why", "--output", "json", &waiting.to_string()]).json()["reason_codes"].clone();
    assert_eq!(codes, serde_json::json!(["dependency"]));
    let why = cluster.gpool(&["why", &waiting.to_string()]).ok().to_string();
    assert!(
        why.contains(&format!("because waits for job {blocker} to end (afterany)")),
        "{why}"
    );
    let run = cluster.gpool(&["submit", "-d", "afterok:999999", "--", "true"]);
    assert_ne!(run.code, 0);
    assert!(
        run.stderr.contains("dependency: job 999999 does not exist"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_held_job_waits_until_released() {
    let mut cluster = Cluster::start();
    let id = cluster.submit(&["--", "true"]);
    let run = cluster.gpool(&["hold", &id.to_string(), "424242"]);
    assert_eq!(run.code, 1, "one id was left alone: {}", run.stderr);
    assert!(run.stdout.contains(&format!("job {id} held")), "{}", run.stdout);
    // Each answer says what changed, and names a task as it was named.
    let again = cluster.gpool(&["hold", &id.to_string()]).ok().to_string();
    assert_eq!(again.trim(), format!("job {id} was held already"));
    let array = cluster.submit(&["-a", "0-1", "--", "true"]);
    let task = cluster.gpool(&["hold", &format!("{array}_1")]).ok().to_string();
    assert_eq!(task.trim(), format!("job {array}_1 held"));
    let released = cluster.gpool(&["release", &format!("{array}_1")]).ok().to_string();
    assert_eq!(released.trim(), format!("job {array}_1 released"));
    let not_held = cluster.gpool(&["release", &format!("{array}_1")]).ok().to_string();
    assert_eq!(not_held.trim(), format!("job {array}_1 was not held"));
    cluster.start_agent("n1", 1);
    std::thread::sleep(Duration::from_secs(1));
    let job = cluster.job(id);
    assert_eq!(job["state"], "pending", "{job}");
    assert_eq!(
        job["reasons"][0],
        format!("held: `gpool release {id}` lets it be scheduled")
    );
    cluster.gpool(&["release", &id.to_string()]).ok();
    cluster.wait_for_state(id, "completed");
    let run = cluster.gpool(&["hold", &id.to_string()]);
    assert!(
        run.stdout.contains("is completed: only pending jobs are held"),
        "{}",
        run.stdout
    );
}

#[test]
fn a_long_queue_lists_readably_and_filters_by_name_and_owner() {
    let cluster = Cluster::start();
    let file = cluster.dir.path().join("many.toml");
    std::fs::write(&file, "[[job]]\nname = \"sweep\"\ncommand = [\"true\"]\n".repeat(250)).unwrap();
    cluster.gpool(&["submit", "-f", &file.display().to_string()]).ok();
    cluster.submit(&["--name", "other", "--", "true"]);
    let table = cluster.gpool(&["jobs"]).ok().to_string();
    assert_eq!(table.lines().count(), 1 + 200 + 1, "header, 200 rows, a summary");
    assert!(
        table
            .trim_end()
            .ends_with("251 jobs: 251 pending; 51 more not shown (--limit 0 shows all)"),
        "{}",
        table.lines().last().unwrap_or_default()
    );
    let named = cluster
        .gpool(&["jobs", "--name", "other", "--me", "--output", "json"])
        .json();
    assert_eq!(named.as_array().unwrap().len(), 1, "{named}");
    let limited = cluster.gpool(&["jobs", "--limit", "5", "--output", "json"]).json();
    assert_eq!(limited.as_array().unwrap().len(), 5);
}

#[test]
fn history_lists_ended_jobs_across_a_restart() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 1);
    let ok = cluster.submit(&["--name", "good", "--", "true"]);
    let bad = cluster.submit(&["--name", "bad", "--", "sh", "-c", "exit 4"]);
    let pending = cluster.submit(&["--gpus", "1", "-d", &format!("afterok:{bad}"), "--", "true"]);
    cluster.wait_for_state(ok, "completed");
    cluster.wait_for_state(bad, "failed");
    cluster.controller().stop();
    cluster.start_controller();
    let history = cluster.gpool(&["history", "--since", "1h", "--output", "json"]).json();
    let ids: Vec<u64> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|job| job["id"].as_u64().unwrap())
        .collect();
    // The dependent job ended too (its dependency can never be met).
    cluster.wait_for_state(pending, "failed");
    assert!(ids.contains(&ok) && ids.contains(&bad), "{ids:?}");
    let bad_json = history
        .as_array()
        .unwrap()
        .iter()
        .find(|job| job["id"] == bad)
        .unwrap()
        .clone();
    assert_eq!(
        (bad_json["exit_code"].as_i64(), &bad_json["node_list"]),
        (Some(4), &serde_json::json!(["n1"]))
    );
    let table = cluster.gpool(&["history", "--since", "1h"]).ok().to_string();
    assert!(table.starts_with("ID"), "{table}");
    assert!(table.contains("good") && table.contains("bad"), "{table}");
    let none = cluster.gpool(&["history", "--until", "2h"]).ok().to_string();
    assert_eq!(none.lines().count(), 1, "only the header: {none}");
}

#[test]
fn logs_of_each_rank_of_a_gang() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 1);
    cluster.start_agent("n2", 1);
    // -G is the job's total, as in Slurm: 1 on each of 2 nodes.
    let id = cluster.submit(&[
        "--nodes",
        "2",
        "--gpus",
        "2",
        "--",
        "sh",
        "-c",
        "echo rank=$GPOOL_NODE_RANK",
    ]);
    cluster.wait_for_state(id, "completed");
    let id = id.to_string();
    assert_eq!(cluster.gpool(&["logs", &id]).ok(), "rank=0\n");
    assert_eq!(cluster.gpool(&["logs", "--rank", "1", &id]).ok(), "rank=1\n");
    let run = cluster.gpool(&["logs", "--rank", "2", &id]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("rank: attempt 1 of job"), "{}", run.stderr);
    assert!(run.stderr.contains("ran on 2 node(s): ranks 0 to 1"), "{}", run.stderr);
}

#[test]
fn listing_columns_sort_since_and_the_pool_summary() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 2);
    let a = cluster.submit(&["-J", "bbb", "-t", "1h", "--", "sleep", "30"]);
    let b = cluster.submit(&["-J", "aaa", "--", "true"]);
    cluster.wait_for_state(b, "completed");
    cluster.wait_for_state(a, "running");

    let table = cluster.gpool(&["jobs", "--all", "--format", "id,name,state,limit", "--sort", "name"]);
    let lines: Vec<&str> = table.ok().lines().collect();
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        ["ID", "NAME", "STATE", "LIMIT"]
    );
    assert!(
        lines[1].starts_with(&format!("{b} ")) && lines[1].contains("aaa"),
        "{lines:?}"
    );
    assert!(
        lines[2].starts_with(&format!("{a} ")) && lines[2].contains("1h"),
        "{lines:?}"
    );
    let down = cluster
        .gpool(&["jobs", "--since", "1h", "--sort=-id", "--output", "json"])
        .json();
    let ids: Vec<u64> = down
        .as_array()
        .unwrap()
        .iter()
        .map(|job| job["id"].as_u64().unwrap())
        .collect();
    assert_eq!(ids, [b, a], "--since takes in ended jobs, newest first");
    let bad = cluster.gpool(&["jobs", "--format", "id,colour"]);
    assert_eq!(bad.code, 2);
    assert!(bad.stderr.contains("\"colour\" is not a column"), "{}", bad.stderr);

    let summary = cluster.gpool(&["nodes", "--summary", "--output", "json"]).json();
    assert_eq!(summary[0]["pool"], "default", "{summary}");
    assert_eq!(summary[0]["gpus_total"], 2);
    assert_eq!(summary[0]["gpus_allocated"], 1);
    assert_eq!(summary[0]["gpus_idle"], 1);
    assert_eq!(summary[0]["node_states"]["mixed"], 1);
    let text = cluster.gpool(&["nodes", "-s"]).ok().to_string();
    assert!(text.contains("1/1/0/2"), "{text}");
}

#[test]
fn submit_attach_prints_the_output_and_exits_with_the_code() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 1);
    let run = cluster.gpool(&[
        "submit",
        "--attach",
        "--",
        "sh",
        "-c",
        "echo hello; sleep 0.5; echo bye; exit 3",
    ]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert_eq!(run.stdout, "hello\nbye\n", "{}", run.stderr);
    assert!(run.stderr.contains("submitted; its output follows"), "{}", run.stderr);
}

#[test]
fn a_requeued_job_says_an_operator_requeued_it_and_keeps_each_attempts_output() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 1);
    let job = cluster.submit(&["--", "sh", "-c", "echo attempt $GPOOL_ATTEMPT; sleep 30"]);
    cluster.wait_for_state(job, "running");
    wait_until("the first attempt's output", Duration::from_secs(10), || {
        (cluster.gpool(&["logs", &job.to_string()]).stdout == "attempt 1\n").then_some(())
    });
    // Drained, the node lets the requeued job wait in the queue.
    cluster.gpool(&["drain", "n1", "--reason", "test"]).ok();
    let requeued = cluster.gpool(&["requeue", &job.to_string()]).ok().to_string();
    assert!(requeued.contains("is being requeued"), "{requeued}");
    let pending = wait_until("the job back in the queue", Duration::from_secs(20), || {
        let shown = cluster.job(job);
        (shown["state"] == "pending" && shown["reason_codes"][0] == "requeued").then_some(shown)
    });
    // An operator's requeue is not a preemption: it says so, and for whom.
    assert_eq!(pending["n_preemptions"], 0, "{pending}");
    assert_eq!(pending["requeue_cause"], "requeued", "{pending}");
    assert!(pending["events"].to_string().contains("requeued by"), "{pending}");
    cluster.gpool(&["resume", "n1"]).ok();
    wait_until("a second attempt", Duration::from_secs(20), || {
        let shown = cluster.job(job);
        (shown["state"] == "running" && shown["attempt"] == 2).then_some(())
    });
    wait_until("the second attempt's output", Duration::from_secs(10), || {
        (cluster.gpool(&["logs", &job.to_string()]).stdout == "attempt 2\n").then_some(())
    });
    let first = cluster.gpool(&["logs", &job.to_string(), "--attempt", "1"]);
    assert_eq!(first.ok(), "attempt 1\n");
    let none = cluster.gpool(&["logs", &job.to_string(), "--attempt", "7"]);
    assert!(
        none.stderr
            .contains("has no attempt 7 on record (attempts with output: 1, 2)"),
        "{}",
        none.stderr
    );
}

#[test]
fn ended_jobs_are_removed_after_their_retention_and_stay_removed() {
    let mut cluster = Cluster::with_config("keep_ended_jobs = \"2s\"\n");
    cluster.start_agent("n1", 1);
    let old = cluster.submit(&["--", "true"]);
    cluster.wait_for_state(old, "completed");
    let needed = cluster.submit(&["--", "true"]);
    cluster.wait_for_state(needed, "completed");
    let running = cluster.submit(&["--", "sleep", "30"]);
    cluster.wait_for_state(running, "running");
    // Waits for the GPU, its dependency met: the job it names is kept.
    let dependent = cluster.submit(&["-d", &format!("afterok:{needed}"), "--", "true"]);
    wait_until("the ended job to be removed", Duration::from_secs(20), || {
        let shown = cluster.gpool(&["show", &old.to_string()]);
        shown.stderr.contains("not found").then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(cluster.job(needed)["state"], "completed");
    assert_eq!(cluster.job(dependent)["state"], "pending");
    assert_eq!(cluster.job(running)["state"], "running");
    cluster.controller().stop();
    cluster.start_controller();
    let shown = cluster.gpool(&["show", &old.to_string()]);
    assert!(
        shown.stderr.contains(&format!("job {old} not found")),
        "{}",
        shown.stderr
    );
    // A new job never takes a removed job's id.
    let next = cluster.submit(&["--", "true"]);
    assert!(next > running, "{next}");
    // A range cancels the jobs it names and passes over the missing ones.
    let cancelled = cluster.gpool(&[
        "cancel",
        &format!("{old}-{old}"),
        &running.to_string(),
        "--output",
        "json",
    ]);
    assert_eq!(cancelled.code, 0, "{}", cancelled.stderr);
    let outcomes = cancelled.json()["outcomes"].clone();
    assert_eq!(outcomes.as_array().map(Vec::len), Some(1), "{outcomes}");
    assert_eq!(outcomes[0]["id"], running);
}

/// A job starts from its own variables (the submitter's, as `--export`
/// says), gpool's and CUDA's, and the account's USER, LOGNAME, HOME, SHELL
/// and a PATH: never the agent's own environment, whose credentials stay
/// the agent's, with `--export NONE` and without.
#[test]
fn a_job_never_gets_the_agents_environment() {
    let mut cluster = Cluster::start();
    cluster.agent_env = vec![
        ("GPOOL_E2E_AGENT_MARKER".into(), "agent-only".into()),
        ("AWS_SECRET_ACCESS_KEY".into(), "agent-aws-secret".into()),
    ];
    cluster.start_agent("node-a", 1);
    for export in ["NONE", "ALL"] {
        let file = format!("env-{export}");
        let id = cluster.submit(&["--export", export, "--", "sh", "-c", &format!("env > {file}")]);
        cluster.wait_for_state(id, "completed");
        let env = std::fs::read_to_string(cluster.dir.path().join(&file)).expect("the job's env");
        assert!(
            !env.contains("agent-only") && !env.contains("agent-aws-secret"),
            "--export {export}:\n{env}"
        );
        for name in [
            "USER=",
            "LOGNAME=",
            "HOME=",
            "PATH=",
            "GPOOL_JOB_ID=",
            "CUDA_VISIBLE_DEVICES=",
        ] {
            assert!(
                env.lines().any(|line| line.starts_with(name)),
                "--export {export}: no {name}\n{env}"
            );
        }
    }
}

/// An output file in a directory that does not exist fails the job with
/// that reason, not as a command that cannot run.
#[test]
fn a_missing_output_directory_is_named_as_such() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 1);
    let missing = cluster.dir.path().join("no-such-dir");
    let pattern = format!("{}/%j.out", missing.display());
    let id = cluster.submit(&["-o", &pattern, "--", "echo", "hi"]);
    let job = cluster.wait_for_state(id, "failed");
    let reason = job["end_reason"].as_str().unwrap_or_default().to_string();
    assert!(
        reason.contains(&format!("does not exist: {}", missing.display())) && !reason.contains("cannot run"),
        "{reason}"
    );
}

/// `--begin` as Slurm's: the job waits with `begin_time` until then, and
/// starts then though nothing else in the pool changes.
#[test]
fn a_job_with_begin_waits_until_then_and_starts_on_its_own() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 2);
    let later = cluster.submit(&["--begin", "now+3s", "--", "true"]);
    let far = cluster.submit(&["-b", "2099-01-01", "--", "true"]);
    let past = cluster.submit(&["--begin", "2020-01-01T10:00", "--", "true"]);
    cluster.wait_for_state(past, "completed");
    let why = cluster.gpool(&["why", "--output", "json", &later.to_string()]).json();
    assert_eq!(why["reason_codes"], serde_json::json!(["begin_time"]), "{why}");
    let said = cluster.gpool(&["why", &far.to_string()]).ok().to_string();
    assert!(said.contains("not before 2099-01-01T00:00:00Z (--begin)"), "{said}");
    assert_eq!(cluster.job(far)["begin"], "2099-01-01T00:00:00Z");
    let shown = cluster.gpool(&["show", &far.to_string()]).ok().to_string();
    assert!(
        shown.contains("not before") && shown.contains("2099-01-01T00:00:00"),
        "{shown}"
    );
    let job = cluster.wait_for_state(later, "completed");
    let (submitted, started) = (
        humantime::parse_rfc3339_weak(job["submitted_at"].as_str().unwrap()).unwrap(),
        humantime::parse_rfc3339_weak(job["started_at"].as_str().unwrap()).unwrap(),
    );
    let after = started.duration_since(submitted).unwrap();
    assert!(after >= Duration::from_millis(2_900), "started {after:?} after submit");
    assert_eq!(cluster.job(far)["state"], "pending");
    let bad = cluster.gpool(&["submit", "--begin", "tomorrow", "--", "true"]);
    assert_eq!(bad.code, 2);
    assert!(bad.stderr.contains("begin: \"tomorrow\" is neither"), "{}", bad.stderr);
}

/// `gpool jobs --start`, as squeue --start: every waiting job that can get
/// an estimate gets one, played forward over running jobs' time limits,
/// not only the one the backfill reservation is for.
#[test]
fn every_waiting_job_gets_an_estimated_start() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 2);
    let hold = "while [ ! -e release ]; do sleep 0.2; done";
    let running = cluster.submit(&["-G", "2", "-t", "1h", "--", "sh", "-c", hold]);
    cluster.wait_for_state(running, "running");
    let second = cluster.submit(&["-G", "1", "-t", "30m", "--", "true"]);
    let third = cluster.submit(&["-G", "2", "-t", "10m", "--", "true"]);
    let estimate = |id: u64| -> Option<std::time::SystemTime> {
        let job = cluster.job(id);
        humantime::parse_rfc3339_weak(job["estimated_start"].as_str()?).ok()
    };
    let (second_at, third_at) = wait_until("both estimates", Duration::from_secs(30), || {
        Some((estimate(second)?, estimate(third)?))
    });
    // The second at the first's end (an hour on), the third 30 min later.
    let gap = third_at.duration_since(second_at).expect("the third after the second");
    assert!(gap.as_secs().abs_diff(1800) <= 2, "{gap:?}");
    let from_now = second_at.duration_since(std::time::SystemTime::now()).expect("ahead");
    assert!(from_now.as_secs() > 3500 && from_now.as_secs() <= 3600, "{from_now:?}");
    let table = cluster.gpool(&["jobs", "--start"]).ok().to_string();
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("ID") && lines[0].contains("START"), "{table}");
    assert!(
        lines[1].starts_with(&second.to_string()) && lines[1].contains('~'),
        "{table}"
    );
    assert!(
        lines[2].starts_with(&third.to_string()) && lines[2].contains('~'),
        "{table}"
    );
    std::fs::write(cluster.dir.path().join("release"), "").unwrap();
    cluster.wait_for_state(third, "completed");
}

/// Every rank of a gang and every array task sees Slurm's variables, in
/// Slurm's formats, beside gpool's own: what launchers and site scripts
/// read to find their rank, peers and output paths.
#[test]
fn jobs_see_slurms_variables() {
    let mut cluster = Cluster::start();
    cluster.start_agent("gpu-01", 2);
    cluster.start_agent("gpu-02", 2);
    let dir = cluster.dir.path().to_path_buf();
    let dump = "env | grep -E '^(SLURM|GPOOL)_' | sort > vars-$GPOOL_JOB_ID-$SLURM_PROCID";
    let gang = cluster.submit(&[
        "-N",
        "2",
        "--gpus-per-node",
        "2",
        "-J",
        "train",
        "--mem",
        "1G",
        "--",
        "sh",
        "-c",
        dump,
    ]);
    cluster.wait_for_state(gang, "completed");
    let vars = |id: u64, rank: u32| -> std::collections::BTreeMap<String, String> {
        let text = std::fs::read_to_string(dir.join(format!("vars-{id}-{rank}"))).unwrap_or_default();
        text.lines()
            .filter_map(|line| line.split_once('='))
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect()
    };
    for rank in 0..2 {
        let env = vars(gang, rank);
        let get = |name: &str| env.get(name).cloned().unwrap_or_default();
        assert_eq!(get("SLURM_JOB_ID"), gang.to_string(), "{env:?}");
        assert_eq!(get("SLURM_JOB_NAME"), "train");
        assert_eq!(get("SLURM_JOB_NODELIST"), "gpu-[01-02]");
        assert_eq!(get("SLURM_NNODES"), "2");
        assert_eq!(get("SLURM_NTASKS"), "2");
        assert_eq!(get("SLURM_TASKS_PER_NODE"), "1(x2)");
        assert_eq!(get("SLURM_PROCID"), rank.to_string());
        assert_eq!(get("SLURM_NODEID"), get("GPOOL_NODE_RANK"));
        assert_eq!(get("SLURM_GPUS_ON_NODE"), "2");
        assert_eq!(get("SLURM_MEM_PER_NODE"), "1024");
        assert_eq!(get("SLURM_SUBMIT_DIR"), dir.display().to_string());
        assert_eq!(get("SLURM_RESTART_COUNT"), "0");
        assert_eq!(get("SLURM_JOB_PARTITION"), "default");
    }
    let array = cluster.submit(&["-a", "3-5", "--", "sh", "-c", dump]);
    let tasks = wait_until("the array's tasks to end", Duration::from_secs(60), || {
        let listed = cluster.gpool(&["jobs", "-r", "--all", "--output", "json"]).json();
        let tasks: Vec<u64> = listed
            .as_array()?
            .iter()
            .filter(|task| task["array_job_id"] == array && task["state"] == "completed")
            .filter_map(|task| task["id"].as_u64())
            .collect();
        (tasks.len() == 3).then_some(tasks)
    });
    let mut indices: Vec<String> = tasks
        .iter()
        .map(|task| {
            let env = vars(*task, 0);
            assert_eq!(env.get("SLURM_ARRAY_JOB_ID"), Some(&array.to_string()), "{env:?}");
            assert_eq!(env.get("SLURM_JOB_ID"), Some(&task.to_string()), "a task's own id");
            assert_eq!(env.get("SLURM_ARRAY_TASK_COUNT").map(String::as_str), Some("3"));
            assert_eq!(env.get("SLURM_ARRAY_TASK_MIN").map(String::as_str), Some("3"));
            assert_eq!(env.get("SLURM_ARRAY_TASK_MAX").map(String::as_str), Some("5"));
            env.get("SLURM_ARRAY_TASK_ID").cloned().unwrap_or_default()
        })
        .collect();
    indices.sort();
    assert_eq!(indices, ["3", "4", "5"]);
}

/// A listing sends each waiting job's reasons apart from the rest of it
/// (jobs alike share them, encoded once): every job listed, across the
/// listing's chunks, says what `gpool show` says of it.
#[test]
fn a_listing_gives_each_waiting_job_the_reasons_show_gives_it() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 1);
    cluster.start_agent("n2", 2);
    let busy = cluster.submit(&["--gpus", "2", "--", "sleep", "600"]);
    cluster.wait_for_state(busy, "running");
    let small = cluster.submit(&["--gpus", "1", "--", "sleep", "600"]);
    cluster.wait_for_state(small, "running");
    let file = cluster.dir.path().join("alike.toml");
    let alike = "[[job]]\ncommand = [\"true\"]\ngpus = 1\n\n[[job]]\ncommand = [\"true\"]\ngpus = 2\n\n";
    std::fs::write(&file, alike.repeat(150)).unwrap();
    let mut ids = cluster.submit_file(&file);
    ids.push(cluster.submit(&["--hold", "--", "true"]));
    ids.push(cluster.submit(&["-d", &format!("afterok:{busy}"), "--", "true"]));
    ids.push(cluster.submit(&["--begin", "now+1hour", "--", "true"]));
    // A cycle has said why the file's first and last jobs wait.
    let said = |id: u64| {
        let code = cluster.job(id)["reason_codes"][0].clone();
        code.is_string() && code != "not_yet_scheduled"
    };
    wait_until("the cycle's words on the file's jobs", Duration::from_secs(20), || {
        (said(ids[0]) && said(ids[299])).then_some(())
    });
    let listed = cluster.gpool(&["jobs", "--output", "json"]).json();
    let listed = listed.as_array().expect("array");
    assert_eq!(listed.len(), ids.len() + 2, "every job listed");
    let mut lists = std::collections::BTreeSet::new();
    for job in listed.iter().filter(|job| job["state"] == "pending") {
        let shown = cluster.job(job["id"].as_u64().expect("an id"));
        for field in ["reasons", "reason_codes", "reason_details"] {
            assert_eq!(job[field], shown[field], "{field} of job {}", job["id"]);
        }
        assert!(!job["reasons"].as_array().unwrap().is_empty(), "{job}");
        lists.insert(job["reason_details"].to_string());
    }
    assert!(
        lists.len() >= 5,
        "held, dependency, begin and the cycle's lists for each size: {lists:?}"
    );
}

/// The same, as a site runs it: the shipped policy (two teams, QoS classes
/// with reserves, `guaranteed_in`) on H100, A100 and L4 agents, the fleet
/// full of one team's array, and the other's array, separate jobs of each
/// team, class and model, and a job that checkpoints, waiting.
#[test]
fn a_listing_under_the_shipped_policy_says_what_show_says() {
    use crate::preemption::{agent_config, shipped_config, NODES};
    let mut cluster = Cluster::with_config(&shipped_config());
    for (node, model, count, memory_mib, labels) in NODES {
        cluster.start_agent_with(node, 0, &agent_config(model, count, memory_mib, labels));
    }
    cluster.submit(&["--team", "vision", "--qos", "low", "-a", "0-27", "--", "sleep", "600"]);
    wait_until("vision's array running", Duration::from_secs(60), || {
        let jobs = cluster.gpool(&["jobs", "-r", "--output", "json"]).json();
        let running = jobs.as_array()?.iter().filter(|job| job["state"] == "running").count();
        (running >= 8).then_some(())
    });
    let mut waiting = vec![cluster.submit(&["--team", "nlp", "-a", "0-199", "--", "true"])];
    for flags in [
        "--team nlp --gpus 2",
        "--team nlp --gpu-type l4",
        "--team vision --qos high --gpus 8",
        "--team vision --pool inference",
        "--team nlp --checkpoint-signal USR1 --gpus 4",
    ] {
        let args: Vec<&str> = flags.split(' ').chain(["--", "true"]).collect();
        waiting.push(cluster.submit(&args));
    }
    let said = |id: u64| {
        let code = cluster.job(id)["reason_codes"][0].clone();
        code.is_string() && code != "not_yet_scheduled"
    };
    wait_until("the cycle's words on the waiting jobs", Duration::from_secs(20), || {
        waiting.iter().all(|id| said(*id)).then_some(())
    });
    let listed = cluster.gpool(&["jobs", "--output", "json"]).json();
    let pending: Vec<&serde_json::Value> = listed
        .as_array()
        .expect("array")
        .iter()
        .filter(|job| job["state"] == "pending")
        .collect();
    assert!(pending.len() >= waiting.len(), "{listed}");
    for job in pending {
        let shown = cluster.job(job["id"].as_u64().expect("an id"));
        for field in ["reasons", "reason_codes", "reason_details"] {
            assert_eq!(job[field], shown[field], "{field} of job {}", job["id"]);
        }
    }
}
