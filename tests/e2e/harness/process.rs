//! One child process of a test: its log file, and SIGTERM-then-SIGKILL on drop.

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A built binary of this workspace (target/<profile>/<name>). Missing
/// binaries fail the test loudly.
pub fn binary(name: &str) -> PathBuf {
    let test_exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/e2e-<hash> -> target/<profile>/<name>
    let profile_dir = test_exe.parent().and_then(Path::parent).expect("target profile dir");
    let path = profile_dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace first (cargo build --workspace)",
        path.display()
    );
    path
}

/// The stand-in NVML library this workspace builds
/// (target/<profile>/libgpool_nvml_standin.so).
pub fn nvml_standin() -> PathBuf {
    binary("libgpool_nvml_standin.so")
}

/// The top of an agent.toml whose NVML is the stand-in library (its GPUs
/// come from `GPOOL_NVML_STANDIN` in the agents' environment).
pub fn nvml_agent_top(controller: &str) -> String {
    format!(
        "controller = \"{controller}\"\nnvml_library = \"{}\"\n",
        nvml_standin().display()
    )
}

/// A fixture of the stand-in NVML library: a node's GPUs as a file.
pub fn nvml_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../nvml-standin/fixtures")
        .join(format!("{name}.toml"))
}

pub struct Process {
    pub name: String,
    child: Option<Child>,
    pub log: PathBuf,
}

impl Process {
    pub fn spawn(name: &str, mut command: Command, log: PathBuf) -> Process {
        let log_file = std::fs::File::create(&log).expect("create log file");
        command
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("clone log handle"))
            .stderr(log_file);
        let child = command
            .spawn()
            .unwrap_or_else(|err| panic!("cannot start {name}: {err}"));
        Process {
            name: name.into(),
            child: Some(child),
            log,
        }
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().map_or(0, |child| child.id() as i32))
    }

    /// How it exited, once it has (reaped then, and forgotten: its pid may
    /// be another process's); `None` while it runs.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        let status = self.child.as_mut()?.try_wait().ok().flatten()?;
        self.child = None;
        Some(status)
    }

    /// `kill -9` and reap.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGKILL);
            let _ = child.wait();
        }
    }

    /// SIGTERM, then SIGKILL after a grace period; returns whether it exited
    /// by itself within the grace.
    pub fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    pub fn log_tail(&self, n_lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n_lines)..].join("\n")
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Polls `ready` until it returns `Some`, or fails loudly with `what`.
pub fn wait_until<T>(what: &str, timeout: Duration, mut ready: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = ready() {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits for a spawned child (with piped output) to exit, killing it and
/// failing loudly if it takes longer than `timeout`.
pub fn output_within(mut child: std::process::Child, what: &str, timeout: Duration) -> std::process::Output {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return child.wait_with_output().expect("collect output"),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{what} did not exit within {timeout:?}");
            }
        }
    }
}

/// A shell fragment for test jobs that waits for `file` to appear: a minute
/// at most, so a failed test leaves no process behind.
pub fn wait_for_file(file: &str) -> String {
    format!("i=0; while [ ! -e {file} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done")
}

/// The children of `parent` running `gpool-supervise`, from /proc.
fn supervise_children(parent: i32) -> Vec<nix::unistd::Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            let (comm, rest) = stat.split_once(") ")?;
            let mut fields = rest.split(' ');
            let state = fields.next()?;
            let ppid: i32 = fields.next()?.parse().ok()?;
            (ppid == parent && state != "Z" && comm.ends_with("(gpool-supervise"))
                .then(|| nix::unistd::Pid::from_raw(pid))
        })
        .collect()
}

/// An agent's keeper (its child) and the node's launcher (the keeper's
/// child), once both run.
pub fn launcher_of(agent: nix::unistd::Pid) -> (nix::unistd::Pid, nix::unistd::Pid) {
    wait_until("the agent's launcher", Duration::from_secs(30), || {
        supervise_children(agent.as_raw()).into_iter().find_map(|keeper| {
            let launcher = supervise_children(keeper.as_raw()).into_iter().next()?;
            Some((keeper, launcher))
        })
    })
}
