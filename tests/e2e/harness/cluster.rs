//! A controller (and later agents) in one temp dir, and the CLI pointed at it.

use super::process::{binary, wait_until, Process};
use serde_json::Value;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub controller: Option<Process>,
    pub addr: String,
    n_starts: usize,
}

/// The result of one `gpool` run.
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|err| panic!("stdout is not JSON ({err}):\n{}\nstderr:\n{}", self.stdout, self.stderr))
    }

    /// Asserts success and returns stdout.
    pub fn ok(&self) -> &str {
        assert_eq!(
            self.code, 0,
            "gpool failed:\nstdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        &self.stdout
    }
}

impl From<Output> for Run {
    fn from(output: Output) -> Run {
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }
}

impl Cluster {
    /// A dev controller on a free loopback port with its own state dir.
    pub fn start() -> Cluster {
        let dir = tempfile::Builder::new()
            .prefix("gpool-e2e-")
            .tempdir()
            .expect("temp dir");
        let mut cluster = Cluster {
            dir,
            controller: None,
            addr: String::new(),
            n_starts: 0,
        };
        cluster.start_controller();
        cluster
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// The runtime dir the dev controller records its address in.
    pub fn runtime_dir(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    /// Starts gpoold on the state dir (again, after a stop or kill).
    pub fn start_controller(&mut self) {
        let addr_file = self.state_dir().join("gpoold.addr");
        let _ = std::fs::remove_file(&addr_file);
        self.n_starts += 1;
        let mut command = Command::new(binary("gpoold"));
        command
            .args(["--dev", "--listen", "127.0.0.1:0", "--state-dir"])
            .arg(self.state_dir())
            .env("XDG_RUNTIME_DIR", self.runtime_dir());
        let log = self.dir.path().join(format!("gpoold-{}.log", self.n_starts));
        let process = Process::spawn("gpoold", command, log);
        self.controller = Some(process);
        self.addr = wait_until("gpoold to write its address", Duration::from_secs(30), || {
            let addr = std::fs::read_to_string(&addr_file).ok()?.trim().to_string();
            TcpStream::connect(&addr).ok().map(|_| addr)
        });
    }

    pub fn controller(&mut self) -> &mut Process {
        self.controller.as_mut().expect("controller started")
    }

    /// Runs `gpool` with `args` against this cluster.
    pub fn gpool(&self, args: &[&str]) -> Run {
        self.gpool_in(args, self.dir.path())
    }

    pub fn gpool_in(&self, args: &[&str], cwd: &Path) -> Run {
        gpool_command(args)
            .current_dir(cwd)
            .env("GPOOL_SERVER", &self.addr)
            .output()
            .expect("run gpool")
            .into()
    }

    /// Submits and returns the job id.
    pub fn submit(&self, args: &[&str]) -> u64 {
        let mut all = vec!["submit", "--output", "json"];
        all.extend_from_slice(args);
        let run = self.gpool(&all);
        run.ok();
        run.json()["ids"][0].as_u64().expect("an id")
    }

    pub fn job(&self, id: u64) -> Value {
        let run = self.gpool(&["show", &id.to_string(), "--output", "json"]);
        run.ok();
        run.json()
    }
}

/// `gpool` with a clean environment for server discovery.
pub fn gpool_command(args: &[&str]) -> Command {
    let mut command = Command::new(binary("gpool"));
    command.args(args).env_remove("GPOOL_SERVER");
    command
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(controller) = &self.controller {
                eprintln!(
                    "---- {} log ({}) ----\n{}",
                    controller.name,
                    controller.log.display(),
                    controller.log_tail(40)
                );
            }
        }
    }
}
