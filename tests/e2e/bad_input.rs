//! Every bad input gets a clear error naming what is wrong, and a non-zero
//! exit; never a panic.

use crate::harness::cluster::{gpool_command, Cluster, Run};
use crate::harness::process::{binary, output_within, wait_until};
use std::time::Duration;

fn assert_refused(run: &Run, code: i32, needle: &str) {
    assert_eq!(run.code, code, "stdout: {}\nstderr: {}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains(needle),
        "expected {needle:?} in stderr:\n{}",
        run.stderr
    );
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
}

#[test]
fn bad_flags_name_the_field() {
    let cluster = Cluster::start();
    assert_refused(
        &cluster.gpool(&["submit", "--gpus", "0", "--", "true"]),
        2,
        "gpus: must be at least 1, got 0",
    );
    assert_refused(
        &cluster.gpool(&["submit", "--gpus", "-3", "--", "true"]),
        2,
        "gpus: must be at least 1, got -3",
    );
    assert_refused(
        &cluster.gpool(&["submit", "--time", "-5", "--", "true"]),
        2,
        "time: \"-5\" is negative",
    );
    assert_refused(
        &cluster.gpool(&["submit", "--time", "soon", "--", "true"]),
        2,
        "time: \"soon\" is not a duration",
    );
    assert_refused(
        &cluster.gpool(&["submit", "--env", "NOVALUE", "--", "true"]),
        2,
        "env: \"NOVALUE\" is not of the form NAME=VALUE",
    );
    assert_refused(
        &cluster.gpool(&["submit", "--gpus", "1"]),
        2,
        "command: give the command after `--`",
    );
    assert_refused(
        &cluster.gpool(&["jobs", "--output", "yaml"]),
        2,
        "invalid value 'yaml' for '--output <OUTPUT>'",
    );
    assert_refused(
        &cluster.gpool(&["jobs", "--state", "done"]),
        2,
        "--state: unknown state \"done\"",
    );
    // Not a job id: a node's name, and there is no such node.
    assert_refused(&cluster.gpool(&["show", "abc"]), 2, "\"abc\" is neither a job id");
    // A flag gpool does not know is refused, never run as the command;
    // Slurm's words get gpool's.
    assert_refused(
        &cluster.gpool(&["submit", "--gpus-per-task", "2", "--", "true"]),
        2,
        "unknown flag --gpus-per-task: gpool asks for GPUs with --gpus (the job's total)",
    );
    assert_refused(
        &cluster.gpool(&["submit", "--gres", "nvme:1", "--", "true"]),
        2,
        "gpool schedules GPUs only: give gpu:N, gpu:MODEL:N or mps:PERCENT",
    );
    // -G is the job's total, as Slurm's: spread evenly, or refused.
    assert_refused(
        &cluster.gpool(&["submit", "-G", "6", "-N", "4", "--", "true"]),
        2,
        "--gpus 6 over 4 nodes: each node of a gang gets the same number; give a multiple of 4",
    );
    assert_refused(
        &cluster.gpool(&["submit", "-G", "h100:2", "--gpu-type", "l4", "--", "true"]),
        2,
        "--gpu-type l4 and the GPU model h100 of --gpus: give the model once",
    );
    assert_refused(
        &cluster.gpool(&["submit", "--gpu", "2", "--", "true"]),
        2,
        "unknown flag --gpu: did you mean --gpus?",
    );
    assert_refused(
        &cluster.gpool(&["submit", "--partition=big", "--", "true"]),
        2,
        "unknown flag --partition=big: gpool's partitions are pools (--pool, -p)",
    );
    assert_refused(
        &cluster.gpool(&["submit", "-o", "%x-%q.out", "--", "true"]),
        2,
        "stdout: %q in \"%x-%q.out\" is not a pattern field",
    );
    assert_refused(
        &cluster.gpool(&["submit", "--frobnicate", "--", "true"]),
        2,
        "unknown flag --frobnicate (gpool submit --help lists the flags)",
    );
    let file = cluster.dir.path().join("one.toml");
    std::fs::write(&file, "[[job]]\ncommand = [\"true\"]\n").unwrap();
    assert_refused(
        &cluster.gpool(&["submit", "-f", file.to_str().unwrap(), "--gpus", "4"]),
        2,
        "'--file <FILE>' cannot be used with '--gpus <[MODEL:]N>'",
    );
    // Nothing of the above reached the queue.
    let all = cluster.gpool(&["jobs", "--all", "--output", "json"]).json();
    assert_eq!(all, serde_json::json!([]));
}

#[test]
fn bad_job_files_name_file_line_and_field() {
    let cluster = Cluster::start();
    let dir = cluster.dir.path();
    let syntax = dir.join("syntax.toml");
    std::fs::write(&syntax, "[[job]]\ncommand = [\"true\"]\ngpus = = 2\n").unwrap();
    assert_refused(
        &cluster.gpool(&["submit", "-f", syntax.to_str().unwrap()]),
        2,
        &format!("{}:3:", syntax.display()),
    );

    let unknown = dir.join("unknown.toml");
    std::fs::write(&unknown, "[[job]]\ncommand = [\"true\"]\ngpuz = 2\n").unwrap();
    let run = cluster.gpool(&["submit", "-f", unknown.to_str().unwrap()]);
    assert_refused(&run, 2, "unknown field `gpuz`");
    assert!(
        run.stderr.contains(&format!("{}:3:", unknown.display())),
        "{}",
        run.stderr
    );

    let twice = dir.join("twice.toml");
    std::fs::write(&twice, "[[job]]\ncommand = [\"true\"]\ngpus = 1\ngpus = 2\n").unwrap();
    assert_refused(
        &cluster.gpool(&["submit", "-f", twice.to_str().unwrap()]),
        2,
        "twice.toml:4: duplicate key `gpus`",
    );

    let invalid = dir.join("invalid.toml");
    std::fs::write(
        &invalid,
        "[[job]]\ncommand = [\"true\"]\n[[job]]\ncommand = [\"true\"]\nnodes = 0\n",
    )
    .unwrap();
    assert_refused(
        &cluster.gpool(&["submit", "-f", invalid.to_str().unwrap()]),
        2,
        "invalid.toml:3: job 2: nodes: must be at least 1, got 0",
    );

    let missing = dir.join("missing.toml");
    assert_refused(
        &cluster.gpool(&["submit", "-f", missing.to_str().unwrap()]),
        2,
        "missing.toml: cannot read",
    );
    let all = cluster.gpool(&["jobs", "--all", "--output", "json"]).json();
    assert_eq!(all, serde_json::json!([]), "a bad file submits nothing");
}

#[test]
fn unknown_job_ids_are_named() {
    let cluster = Cluster::start();
    assert_refused(&cluster.gpool(&["show", "4242"]), 1, "job 4242 not found");
    // Like scancel: what can be cancelled is, and each other id is named.
    let id = cluster.submit(&["--", "true"]);
    let run = cluster.gpool(&["cancel", &id.to_string(), "4243"]);
    assert_refused(&run, 1, "job 4243 left alone: job 4243 not found");
    assert!(run.stdout.contains(&format!("cancelled job {id}")), "{}", run.stdout);
    assert_eq!(cluster.job(id)["state"], "cancelled");
    let run = cluster.gpool(&["cancel", "--output", "json", &id.to_string(), "4244"]);
    assert_eq!(run.code, 1);
    let outcomes = run.json()["outcomes"].clone();
    assert_eq!(outcomes[0]["error"], serde_json::Value::Null, "{outcomes}");
    assert_eq!(outcomes[1]["error"], "job 4244 not found", "{outcomes}");
}

#[test]
fn a_closed_stdout_ends_gpool_quietly() {
    let cluster = Cluster::start();
    let id = cluster.submit(&["--", "true"]).to_string();
    // As `gpool show ID | head -1` does: the reader is gone before gpool
    // writes (`show` prints line by line).
    let mut child = gpool_command(&["show", &id])
        .env("GPOOL_SERVER", &cluster.addr)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert_eq!(
        output.status.code(),
        Some(141),
        "128 + SIGPIPE, as Unix tools end: {stderr}"
    );
}

#[test]
fn unreachable_controller_names_the_address() {
    // A port that was just free on 127.0.0.2, where no test server listens.
    let port = std::net::TcpListener::bind("127.0.0.2:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.2:{port}");
    let output = gpool_command(&["jobs"])
        .env("GPOOL_SERVER", &addr)
        .output()
        .expect("run gpool");
    let run = Run::from(output);
    assert_refused(&run, 69, &format!("cannot reach gpoold at {addr}"));
    let run = Run::from(
        gpool_command(&["--server", "not an address", "jobs"])
            .output()
            .expect("run gpool"),
    );
    assert_refused(&run, 2, "--server: \"not an address\" is not HOST:PORT");
}

/// A server that accepts connections and never says a word; and one that
/// answers HTTP/1.1. Each serves until the test ends.
fn fake_server(reply: &'static [u8]) -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        let mut open = Vec::new();
        for stream in listener.incoming().flatten() {
            let mut stream = stream;
            if !reply.is_empty() {
                let _ = std::io::Write::write_all(&mut stream, reply);
            }
            open.push(stream);
        }
    });
    addr
}

#[test]
fn a_server_that_never_answers_or_speaks_http1_is_named_not_waited_for() {
    let silent = fake_server(b"");
    let started = std::time::Instant::now();
    let output = output_within(
        gpool_command(&["--timeout", "1s", "jobs"])
            .env("GPOOL_SERVER", &silent)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
        "gpool against a silent server",
        std::time::Duration::from_secs(20),
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    let run = Run::from(output);
    assert_refused(&run, 69, &format!("cannot reach gpoold at {silent}"));

    let http1 = fake_server(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nhi");
    let run = Run::from(
        gpool_command(&["--timeout", "5s", "jobs"])
            .env("GPOOL_SERVER", &http1)
            .output()
            .unwrap(),
    );
    assert_refused(&run, 69, &format!("cannot reach gpoold at {http1}"));
    assert!(
        run.stderr.contains("is the address gpoold's (gRPC over HTTP/2)"),
        "{}",
        run.stderr
    );
}

#[test]
fn bad_controller_config_names_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gpoold.toml");
    std::fs::write(&config, "listen = \"127.0.0.1:0\"\nstate_dir = \"/tmp/x\"\nlisen = 3\n").unwrap();
    let output = std::process::Command::new(binary("gpoold"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let run = Run::from(output);
    assert_refused(&run, 1, &format!("{}:3: unknown field `lisen`", config.display()));
    let child = std::process::Command::new(binary("gpoold"))
        .args(["--dev", "--listen", "0.0.0.0:0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let output = output_within(
        child,
        "gpoold --dev --listen 0.0.0.0:0",
        std::time::Duration::from_secs(20),
    );
    assert_refused(&Run::from(output), 1, "--listen: dev mode listens on loopback only");
}

/// A cancel naming a million ids that never existed is answered (each
/// unknown), while the node's heartbeats go on: no node goes down and the
/// running job keeps its first attempt. Ids of jobs not in memory are
/// looked up off the state task, and ids past the last one given out
/// without a look.
#[test]
fn a_cancel_of_a_million_unknown_ids_holds_nothing_up() {
    let mut cluster = Cluster::with_node_timeout("4s");
    cluster.start_agent("node-a", 2);
    let id = cluster.submit(&["--", "sh", "-c", "sleep 120"]);
    cluster.wait_for_state(id, "running");
    // Ten ranges of 100,000 (the most one range may name): a million ids.
    let ranges: Vec<String> = (0..10u64)
        .map(|k| {
            format!(
                "{}-{}",
                1_000_000_000 + k * 100_000,
                1_000_000_000 + k * 100_000 + 99_999
            )
        })
        .collect();
    let mut args = vec!["cancel", "--output", "json"];
    args.extend(ranges.iter().map(String::as_str));
    let run = cluster.gpool(&args);
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    assert_eq!(run.code, 0, "stdout: {}\nstderr: {}", run.stdout, run.stderr);
    let job = cluster.job(id);
    assert_eq!(
        (job["state"].as_str(), job["attempt"].as_u64()),
        (Some("running"), Some(1)),
        "{job}"
    );
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    assert_eq!(nodes[0]["state"], "mixed", "up, one GPU busy: {nodes}");
    // A listed id that never was is still named.
    let unknown = cluster.gpool(&["cancel", "999999999"]);
    assert_refused(&unknown, 1, "999999999");
    cluster.gpool(&["cancel", &id.to_string()]).ok();
}

/// A job file (or script) past what one submission may carry is refused
/// at once, naming the file and the limit; `/dev/zero` is not read forever.
/// The agent's journal of attempts is readable by the agent alone.
#[test]
fn endless_job_files_are_refused_and_the_agents_journal_is_private() {
    use std::os::unix::fs::PermissionsExt;
    let mut cluster = Cluster::start();
    cluster.start_agent("node-a", 1);
    assert_refused(
        &cluster.gpool(&["submit", "-f", "/dev/zero"]),
        2,
        "/dev/zero: larger than 16 MiB, the most one submission may carry",
    );
    let id = cluster.submit(&["--", "true"]);
    cluster.wait_for_state(id, "completed");
    let journal = cluster.spool_dir("node-a").join("attempts.log");
    let mode = std::fs::metadata(&journal).expect("the journal").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{}", journal.display());
}

/// Flags before a batch script are flags: `--hold` holds the job, and
/// `--wrap CMD` runs CMD with `sh -c`, as sbatch's; neither is taken for
/// the script. A held job waits (reason `held`) until released.
#[test]
fn hold_and_wrap_are_flags_not_scripts() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 1);
    let script = cluster.dir.path().join("t.sh");
    std::fs::write(&script, "#!/bin/sh\necho from-script\n").unwrap();
    let script = script.display().to_string();
    let run = cluster.gpool(&["submit", "--output", "json", "--hold", &script]);
    assert_eq!(run.code, 0, "stderr: {}", run.stderr);
    let held = run.json()["ids"][0].as_u64().expect("an id");
    wait_until(&format!("job {held} to wait as held"), Duration::from_secs(30), || {
        let job = cluster.job(held);
        let codes = job["reason_codes"].as_array().cloned().unwrap_or_default();
        codes.iter().any(|code| code == "held").then_some(())
    });
    assert_eq!(cluster.job(held)["state"], "pending");
    // Held from its submission on: no start time was put off for it.
    assert!(cluster.job(held)["begin"].is_null(), "{}", cluster.job(held));

    let wrapped = cluster.submit(&["--wrap", "echo hi && echo there"]);
    let job = cluster.wait_for_state(wrapped, "completed");
    assert_eq!(job["name"], "wrap", "as sbatch names it: {job}");
    let output = cluster.gpool(&["logs", &wrapped.to_string()]).ok().to_string();
    assert_eq!(output, "hi\nthere\n");
    // Still held while another job ran; released, it runs.
    assert_eq!(cluster.job(held)["state"], "pending");
    cluster.gpool(&["release", &held.to_string()]).ok();
    cluster.wait_for_state(held, "completed");
    let output = cluster.gpool(&["logs", &held.to_string()]).ok().to_string();
    assert_eq!(output, "from-script\n");
}

/// A bare first word that is no readable file is named, with the command
/// after `--` and in --wrap; a flag gpool does not know before a script is
/// named as a flag, never read as the script.
#[test]
fn a_command_without_dashes_is_shown_after_them() {
    let cluster = Cluster::start();
    let run = cluster.gpool(&["submit", "-G", "1", "sleep", "10"]);
    assert_refused(&run, 2, "sleep: cannot read: No such file or directory");
    assert!(
        run.stderr.contains("put it after `--` (gpool submit -G 1 -- sleep 10)"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("--wrap (gpool submit -G 1 --wrap 'sleep 10')"),
        "{}",
        run.stderr
    );
    let script = cluster.dir.path().join("t.sh");
    std::fs::write(&script, "#!/bin/sh\ntrue\n").unwrap();
    let script = script.display().to_string();
    let run = cluster.gpool(&["submit", "--frobnicate", &script]);
    assert_refused(&run, 2, "unknown flag --frobnicate");
    assert!(!run.stderr.contains("cannot read"), "{}", run.stderr);
    let all = cluster.gpool(&["jobs", "--all", "--output", "json"]).json();
    assert_eq!(all, serde_json::json!([]));
}

/// In a batch script, an unknown `#GPOOL` flag is named with the file and
/// line, as no gpool submit flag, with the nearest one; `--` means nothing
/// there and is not offered.
#[test]
fn an_unknown_gpool_line_flag_names_script_line_and_nearest_flag() {
    let cluster = Cluster::start();
    let script = cluster.dir.path().join("train.sh");
    std::fs::write(&script, "#!/bin/sh\n#GPOOL -G 1\n#GPOOL --gpu-typ h100\ntrue\n").unwrap();
    let run = cluster.gpool(&["submit", &script.display().to_string()]);
    assert_refused(
        &run,
        2,
        &format!(
            "{}:3: #GPOOL unknown flag --gpu-typ: did you mean --gpu-type? (--gpu-typ is not a gpool submit flag",
            script.display()
        ),
    );
    assert!(!run.stderr.contains("`--`"), "{}", run.stderr);
}

/// Slurm's long flags that gpool spells otherwise are refused naming
/// gpool's; `--output FILE` (gpool's --output is table or json) names
/// --stdout, and `--output json` still works.
#[test]
fn slurm_long_flags_name_gpools() {
    let cluster = Cluster::start();
    let run = cluster.gpool(&["submit", "--output=slurm-%j.out", "--", "true"]);
    assert_refused(&run, 2, "gpool's flag for the job's output file is --stdout (-o)");
    let script = cluster.dir.path().join("t.sh");
    std::fs::write(&script, "#!/bin/sh\ntrue\n").unwrap();
    let script = script.display().to_string();
    let run = cluster.gpool(&["submit", "--job-name=train", &script]);
    assert_refused(&run, 2, "gpool's flag for the job's name is --name (-J)");
    let run = cluster.gpool(&["submit", "--error=e.log", "--", "true"]);
    assert_refused(&run, 2, "gpool's flag for the job's stderr file is --stderr (-e)");
    std::fs::write(&script, "#!/bin/sh\n#GPOOL --output=slurm-%j.out\ntrue\n").unwrap();
    let run = cluster.gpool(&["submit", &script]);
    assert_refused(&run, 2, "gpool's flag for the job's output file is --stdout (-o)");
    let all = cluster.gpool(&["jobs", "--all", "--output", "json"]).json();
    assert_eq!(all, serde_json::json!([]), "--output json still works");
}

/// `gpool jobs -u USER` (and --user) lists that user's jobs only, as
/// squeue -u.
#[test]
fn jobs_filters_by_user_as_squeue_does() {
    let cluster = Cluster::start();
    let id = cluster.submit(&["--", "true"]);
    let me = crate::harness::cluster::current_user();
    for flag in ["-u", "--user"] {
        let mine = cluster.gpool(&["jobs", flag, &me, "--output", "json"]).json();
        assert_eq!(mine[0]["id"], id, "{flag} {me}: {mine}");
        let theirs = cluster
            .gpool(&["jobs", flag, "no-such-user-here", "--output", "json"])
            .json();
        assert_eq!(theirs, serde_json::json!([]), "{flag}");
    }
}

/// A controller on TLS dialled without the cluster CA: the CLI says that
/// it speaks TLS and how to give the CA, not "h2 protocol error".
#[test]
fn a_tls_controller_dialled_without_its_ca_is_said_to_speak_tls() {
    let dir = Cluster::temp_dir();
    let state = dir.path().join("state").display().to_string();
    let certs = dir.path().join("certs").display().to_string();
    for args in [
        vec!["admin", "ca", "init", "--state-dir", &state],
        vec![
            "admin",
            "cert",
            "issue",
            "--controller",
            "127.0.0.1",
            "--out",
            &certs,
            "--state-dir",
            &state,
        ],
    ] {
        Run::from(gpool_command(&args).output().expect("run gpool")).ok();
    }
    let tls = format!("[tls]\ncert = \"{certs}/127.0.0.1.pem\"\nkey = \"{certs}/127.0.0.1.key\"\n");
    let cluster = Cluster::with_config_in(dir, "127.0.0.1", &tls);
    for server in [cluster.addr.clone(), format!("http://{}", cluster.addr)] {
        let run = Run::from(
            gpool_command(&["--timeout", "5s", "jobs"])
                .env("GPOOL_SERVER", &server)
                .env("HOME", cluster.dir.path())
                .env_remove("GPOOL_CA")
                .env_remove("GPOOL_TOKEN")
                .output()
                .expect("run gpool"),
        );
        assert_refused(&run, 69, &format!("{} speaks TLS", cluster.addr));
        assert!(run.stderr.contains("GPOOL_CA="), "{}", run.stderr);
        assert!(!run.stderr.contains("protocol error"), "{}", run.stderr);
    }
}
