//! Interactive sessions as a Slurm user opens them: `gpool alloc` (salloc)
//! gives a shell on a node on a terminal relayed to the user's own, with
//! the job's GPUs in CUDA_VISIBLE_DEVICES; keys (Ctrl-C too) reach it, and
//! the allocation ends with the shell. The CLI runs on a pseudo-terminal
//! this test holds, as in a person's shell.

use crate::harness::cluster::{gpool_command, Cluster};
use crate::harness::process::wait_until;
use crate::preemption::{agent_config, shipped_policy, NODES};
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

/// `gpool ARGS` on a terminal of its own, as typed at a shell.
struct OnTerminal {
    master: std::fs::File,
    child: std::process::Child,
    seen: String,
}

impl OnTerminal {
    fn start(cluster: &Cluster, args: &[&str]) -> OnTerminal {
        use std::os::unix::process::CommandExt;
        let size = nix::pty::Winsize {
            ws_row: 40,
            ws_col: 120,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pair = nix::pty::openpty(Some(&size), None).expect("a pseudo-terminal");
        let stdio = || std::process::Stdio::from(pair.slave.try_clone().expect("dup"));
        let mut command = gpool_command(args);
        command
            .current_dir(cluster.dir.path())
            .env("GPOOL_SERVER", &cluster.cli_server)
            .stdin(stdio())
            .stdout(stdio())
            .stderr(stdio());
        // SAFETY: setsid and ioctl in the forked child, before exec.
        unsafe {
            command.pre_exec(|| {
                nix::unistd::setsid()?;
                if nix::libc::ioctl(0, nix::libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().expect("run gpool");
        drop(pair.slave);
        OnTerminal {
            master: pair.master.into(),
            child,
            seen: String::new(),
        }
    }

    /// Resizes the terminal, as a person resizing the window does: the
    /// kernel tells gpool (SIGWINCH).
    fn resize(&mut self, rows: u16, cols: u16) {
        use std::os::fd::AsRawFd;
        let size = nix::libc::winsize {
            ws_row: rows,
            ws_col: cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads one winsize, on the terminal's master.
        let done = unsafe { nix::libc::ioctl(self.master.as_raw_fd(), nix::libc::TIOCSWINSZ, &size) };
        assert_eq!(done, 0, "resize: {}", std::io::Error::last_os_error());
    }

    fn type_keys(&mut self, keys: &str) {
        self.master.write_all(keys.as_bytes()).expect("type");
    }

    /// Reads the terminal until `text` shows; returns all it showed.
    fn wait_for(&mut self, text: &str, within: Duration) -> String {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let deadline = Instant::now() + within;
        let mut buffer = [0u8; 4096];
        while !self.seen.contains(text) {
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "{text:?} did not show within {within:?}; the terminal showed:\n{}",
                self.seen
            );
            let mut fds = [PollFd::new(self.master.as_fd(), PollFlags::POLLIN)];
            let _ = poll(&mut fds, PollTimeout::from(100u16));
            if fds[0].revents().is_some_and(|events| !events.is_empty()) {
                match self.master.read(&mut buffer) {
                    Ok(0) | Err(_) => {
                        panic!("the terminal closed before {text:?} showed; it showed:\n{}", self.seen)
                    }
                    Ok(n) => self.seen.push_str(&String::from_utf8_lossy(&buffer[..n])),
                }
            }
        }
        self.seen.clone()
    }

    /// gpool's exit code, once it has ended.
    fn exit_code(mut self) -> i32 {
        let status = wait_until("gpool to end", Duration::from_secs(30), || {
            self.child.try_wait().ok().flatten()
        });
        status.code().unwrap_or(-1)
    }
}

/// A client still running when its test ends is killed: it would wait
/// for its controller, long gone, for good.
impl Drop for OnTerminal {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The job id `gpool alloc` announced.
fn job_id(seen: &str) -> String {
    let after = seen.split("gpool: job ").nth(1).expect("an announced job");
    after.split_whitespace().next().expect("an id").to_string()
}

#[test]
fn gpool_alloc_gives_a_shell_on_a_node_with_its_gpus_that_ends_with_it() {
    let cluster = Cluster::dev_default();
    let mut session = OnTerminal::start(&cluster, &["alloc", "-G", "2", "--time", "10m"]);
    let seen = session.wait_for("this terminal is its", Duration::from_secs(30));
    let id = job_id(&seen);
    // The shell runs on the node with the job's two GPUs, on a terminal.
    session.type_keys("echo \"GPUS=[$CUDA_VISIBLE_DEVICES] ON=[$GPOOL_NODE] JOB=[$GPOOL_JOB_ID]\"; tty\r");
    let seen = session.wait_for(&format!("JOB=[{id}]"), Duration::from_secs(20));
    let line = seen
        .lines()
        .rfind(|line| line.starts_with("GPUS=["))
        .expect("the shell's answer");
    let gpus = line
        .split("GPUS=[")
        .nth(1)
        .and_then(|rest| rest.split(']').next())
        .unwrap_or("");
    assert_eq!(gpus.split(',').count(), 2, "{line}");
    assert!(line.contains("ON=[dev-"), "{line}");
    session.wait_for("/dev/pts/", Duration::from_secs(10));
    // The job's terminal has the size of the user's (40x120 here), and
    // follows it when the window is resized.
    session.type_keys("echo ROWS-COLS=$(stty size | tr ' ' x)\r");
    session.wait_for("ROWS-COLS=40x120", Duration::from_secs(10));
    session.resize(50, 132);
    std::thread::sleep(Duration::from_millis(500));
    session.type_keys("echo ROWS-COLS=$(stty size | tr ' ' x)\r");
    session.wait_for("ROWS-COLS=50x132", Duration::from_secs(10));
    // gpoold sees it running with its GPUs while the shell lives.
    let shown = cluster.gpool(&["show", &id, "--output", "json"]).json();
    assert_eq!(shown["state"], "running", "{shown}");
    assert_eq!(shown["name"], "interactive", "{shown}");
    // Ctrl-C reaches what the shell runs, not the session.
    let typed = Instant::now();
    session.type_keys("sleep 600\r");
    std::thread::sleep(Duration::from_millis(300));
    session.type_keys("\x03");
    session.type_keys("echo $((6 * 7))done\r");
    session.wait_for("42done", Duration::from_secs(20));
    assert!(typed.elapsed() < Duration::from_secs(20));
    // `exit 3` ends the shell, the job and the allocation, with its code.
    session.type_keys("exit 3\r");
    assert_eq!(session.exit_code(), 3);
    let shown = cluster.gpool(&["show", &id, "--output", "json"]).json();
    assert_eq!(shown["state"], "failed", "{shown}");
    assert_eq!(shown["exit_code"], 3, "{shown}");
}

/// The shipped config's pool: a member of vision asks for an L4 session
/// (`--gpu-type l4`) and lands on the L4 node; a cancel from another
/// shell ends the session with gpool's cancelled code; shapes a terminal
/// cannot have are refused at submit, naming why.
#[test]
fn an_interactive_session_in_a_team_lands_on_its_model_and_ends_when_cancelled() {
    let mut cluster = Cluster::with_config(&shipped_policy());
    for (node, model, count, memory_mib, labels) in NODES {
        cluster.start_agent_with(node, 0, &agent_config(model, count, memory_mib, labels));
    }
    let mut session = OnTerminal::start(
        &cluster,
        &[
            "alloc",
            "--team",
            "vision",
            "--gpu-type",
            "l4",
            "-G",
            "1",
            "--",
            "sh",
            "-i",
        ],
    );
    let seen = session.wait_for("this terminal is its", Duration::from_secs(30));
    let id = job_id(&seen);
    session.type_keys("echo \"ON=[$GPOOL_NODE]\"\r");
    session.wait_for("ON=[l4-a]", Duration::from_secs(20));
    // Cancelled from another shell: the session ends, with gpool's code.
    assert_eq!(cluster.gpool(&["cancel", &id]).code, 0);
    assert_eq!(session.exit_code(), 125);
    // Shapes a terminal cannot have.
    let refused = cluster.gpool(&["alloc", "--team", "vision", "-N", "2", "-G", "2"]);
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains("pty") && refused.stderr.contains("gang on several nodes"),
        "{}",
        refused.stderr
    );
    let refused = cluster.gpool(&["alloc", "--team", "vision", "-a", "0-3"]);
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains("pty: an interactive job cannot have an array"),
        "{}",
        refused.stderr
    );
}

/// The shipped config: nlp's four guaranteed GPUs run on H100s, and an nlp
/// session (QoS low) takes the node's four L4s as burst work. When vision
/// asks for an L4 within its guarantee, the session is taken back: it ends
/// (a shell has nobody to come back to) and is not run again, and
/// `gpool alloc` says so and exits with gpool's failed code.
#[test]
fn a_session_taken_back_ends_and_is_not_run_again() {
    let mut cluster = Cluster::with_config(&shipped_policy());
    for (node, model, count, memory_mib, labels) in NODES {
        cluster.start_agent_with(node, 0, &agent_config(model, count, memory_mib, labels));
    }
    let hold = "while [ ! -e release ]; do sleep 0.2; done";
    cluster.submit(&[
        "--team",
        "nlp",
        "--gpu-type",
        "h100",
        "-a",
        "0-3",
        "--",
        "sh",
        "-c",
        hold,
    ]);
    let mut session = OnTerminal::start(
        &cluster,
        &[
            "alloc",
            "--team",
            "nlp",
            "--qos",
            "low",
            "--gpu-type",
            "l4",
            "-G",
            "4",
            "--",
            "sh",
            "-i",
        ],
    );
    let seen = session.wait_for("this terminal is its", Duration::from_secs(30));
    let id = job_id(&seen);
    session.type_keys("echo \"ON=[$GPOOL_NODE]\"\r");
    session.wait_for("ON=[l4-a]", Duration::from_secs(20));
    let shown = cluster.gpool(&["show", &id, "--output", "json"]).json();
    assert_eq!(shown["burst"], true, "{shown}");
    let vision = cluster.submit(&["--team", "vision", "--gpu-type", "l4", "--", "sh", "-c", hold]);
    session.wait_for("is not run again", Duration::from_secs(30));
    assert_eq!(session.exit_code(), 3);
    cluster.wait_for_state(vision, "running");
    let shown = cluster.gpool(&["show", &id, "--output", "json"]).json();
    assert_eq!(shown["state"], "failed", "{shown}");
    assert_eq!(shown["n_preemptions"], 1, "{shown}");
    assert_eq!(shown["attempt"], 1, "{shown}");
    std::fs::write(cluster.dir.path().join("release"), "").expect("release");
}

/// gpoold's resident memory, from /proc.
fn rss_bytes(pid: nix::unistd::Pid) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse::<u64>().ok())
        .unwrap_or(0);
    kib * 1024
}

/// A user floods the terminal of their own interactive job, which never
/// reads it, from 6 connections at once: the node's lease renewals never
/// wait behind the input, so another user's job on that node keeps its
/// first attempt (with a 6 s node timeout, a 3 s lease); gpoold's memory
/// stays bounded, since a full input lane pushes back on the typist; and a
/// chunk over 64 KiB is refused, naming the field.
#[test]
fn flooding_a_terminal_never_costs_a_neighbour_its_job_or_gpoold_its_memory() {
    use gpool_proto::pb;
    let mut cluster = Cluster::with_node_timeout("6s");
    cluster.start_agent("n1", 2);
    // The neighbour is another user's job (nobody's, known by its uid).
    let release = cluster.dir.path().join("release");
    let hold = format!("while [ ! -e {} ]; do sleep 0.2; done", release.display());
    let nobody = nix::unistd::User::from_name("nobody").unwrap().expect("user nobody");
    let args = [
        "submit", "--output", "json", "-w", "n1", "--gpus", "1", "--", "sh", "-c", &hold,
    ];
    let submitted = cluster.gpool_as(&nobody, &cluster.addr, &args);
    submitted.ok();
    let neighbour = submitted.json()["ids"][0].as_u64().expect("the neighbour's id");
    cluster.wait_for_state(neighbour, "running");
    assert_eq!(cluster.job(neighbour)["user"], "nobody");
    let mut session = OnTerminal::start(&cluster, &["alloc", "-w", "n1", "-G", "1", "--", "sleep", "600"]);
    let seen = session.wait_for("has started", Duration::from_secs(30));
    let id: u64 = job_id(&seen).parse().expect("a job id");
    let gpoold = cluster.controller().pid();
    let runtime = tokio::runtime::Runtime::new().expect("a runtime");
    let addr = cluster.addr.clone();
    let (refused, max_rss, n_taken, n_pushed_back) = runtime.block_on(async move {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("an endpoint")
            .connect()
            .await
            .expect("gpoold answers");
        let user: tonic::metadata::MetadataValue<_> = crate::harness::cluster::current_user().parse().unwrap();
        let client = pb::pool_client::PoolClient::with_interceptor(channel, move |mut request: tonic::Request<()>| {
            request
                .metadata_mut()
                .insert(gpool_proto::USER_METADATA_KEY, user.clone());
            Ok(request)
        });
        let chunk = |bytes: usize| pb::WriteInputRequest {
            id,
            data: vec![b'x'; bytes],
            resize: None,
        };
        let refused = client
            .clone()
            .write_input(chunk(1 << 20))
            .await
            .expect_err("1 MiB refused");
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut typists = tokio::task::JoinSet::new();
        for _ in 0..6 {
            let mut client = client.clone();
            let chunk = chunk(64 << 10);
            typists.spawn(async move {
                let (mut taken, mut pushed_back) = (0u64, 0u64);
                while Instant::now() < deadline {
                    match client.write_input(chunk.clone()).await {
                        Ok(_) => taken += 1,
                        Err(status) if status.code() == tonic::Code::ResourceExhausted => pushed_back += 1,
                        Err(status) => panic!("{status}"),
                    }
                }
                (taken, pushed_back)
            });
        }
        let mut max_rss = 0;
        while Instant::now() < deadline {
            max_rss = max_rss.max(rss_bytes(gpoold));
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let (mut n_taken, mut n_pushed_back) = (0, 0);
        while let Some(counts) = typists.join_next().await {
            let (taken, pushed_back) = counts.expect("a typist");
            n_taken += taken;
            n_pushed_back += pushed_back;
        }
        (refused, max_rss, n_taken, n_pushed_back)
    });
    println!(
        "15 s of 64 KiB input from 6 connections: {n_taken} taken, {n_pushed_back} pushed back; gpoold's RSS at most {} MiB",
        max_rss >> 20
    );
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused}");
    assert!(refused.message().starts_with("data: 1048576 bytes"), "{refused}");
    assert!(n_taken > 0, "input still flows");
    assert!(max_rss < 256 << 20, "gpoold grew to {} MiB", max_rss >> 20);
    let job = cluster.job(neighbour);
    assert_eq!(
        (job["state"].as_str(), job["attempt"].as_u64()),
        (Some("running"), Some(1)),
        "{job}"
    );
    let said = std::fs::read_to_string(&cluster.agents[0].log).unwrap_or_default();
    assert!(!said.contains("longer than the lease"), "{said}");
    std::fs::write(&release, "").unwrap();
    cluster.wait_for_state(neighbour, "completed");
    // The session's job ends with the test, not ten minutes after it.
    cluster.gpool(&["cancel", &id.to_string()]).ok();
    cluster.wait_for_state(id, "cancelled");
}

/// A `gpool alloc` client that vanishes (kill -9, as a dropped ssh
/// session's client may): after `detach_grace` its job gets SIGHUP, and
/// one that ignores it is cancelled 10 s later; `gpool attach` within the
/// grace keeps a session, and its client exits soon after the job ends.
#[test]
fn a_session_whose_client_vanished_is_hung_up_on_unless_reattached() {
    let mut cluster = Cluster::with_config("detach_grace = \"5s\"\n");
    cluster.start_agent("n1", 4);
    let vanish = |cluster: &Cluster, args: &[&str]| {
        let mut session = OnTerminal::start(cluster, args);
        let seen = session.wait_for("has started", Duration::from_secs(30));
        session.child.kill().expect("kill -9 the client");
        let _ = session.child.wait();
        job_id(&seen)
    };
    // Hung up on: the shell's command ends with its terminal.
    let hung = vanish(&cluster, &["alloc", "-G", "1", "--", "sleep", "600"]);
    let gone = Instant::now();
    let ended = wait_until("the detached job to end", Duration::from_secs(30), || {
        let job = cluster.job(hung.parse().unwrap());
        (job["state"] != "running").then_some(job)
    });
    println!(
        "client killed to its job's end: {:?} ({})",
        gone.elapsed(),
        ended["end_reason"]
    );
    assert!(gone.elapsed() >= Duration::from_secs(4), "not before its grace");
    // A job that named no QoS class shows the default one it runs in.
    assert_eq!(ended["qos"], "normal", "{ended}");
    // One that ignores SIGHUP is cancelled after the hangup's grace.
    let stubborn = vanish(
        &cluster,
        &["alloc", "-G", "1", "--", "sh", "-c", "trap '' HUP; sleep 600"],
    );
    let job = cluster.wait_for_state(stubborn.parse().unwrap(), "cancelled");
    assert_eq!(job["end_reason"], "cancelled by gpoold", "{job}");
    // Attached again within the grace: it runs on, and the new client
    // exits once the job ends.
    let kept = vanish(&cluster, &["alloc", "-G", "1", "--", "sleep", "600"]);
    let mut again = OnTerminal::start(&cluster, &["attach", &kept]);
    again.wait_for("has started", Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(12));
    let job = cluster.job(kept.parse().unwrap());
    assert_eq!(job["state"], "running", "{job}");
    cluster.gpool(&["cancel", &kept]).ok();
    let code = again.exit_code();
    assert_ne!(code, 0, "the cancelled session's client says so");
}
