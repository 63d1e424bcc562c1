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
    /// Where the CLI dials: the TCP address in dev mode, the local socket
    /// (identity by Unix credentials) with a config.
    pub cli_server: String,
    n_starts: usize,
    /// gpoold's `--node-timeout`.
    node_timeout: String,
    /// gpoold's in-process agents (`--dev-nodes`); tests start real agent
    /// processes instead.
    dev_nodes: u32,
    /// Not in dev mode: gpoold runs with a gpoold.toml that ends with this.
    config: Option<String>,
    /// The host gpoold listens on (port 0 picks one).
    listen_host: String,
    pub agents: Vec<Process>,
    /// Extra environment of the agents started from now on.
    pub agent_env: Vec<(String, String)>,
    /// A file the agents started from now on hold open across their exec,
    /// at this descriptor (as a shell's redirection leaves one).
    pub agent_inherits: Option<(std::fs::File, i32)>,
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
        Cluster::with_node_timeout("30s")
    }

    /// A dev controller that marks silent nodes down after `node_timeout`.
    pub fn with_node_timeout(node_timeout: &str) -> Cluster {
        Cluster::new(node_timeout, 0)
    }

    /// The plain `gpoold --dev` a person runs: in-process agents included.
    pub fn dev_default() -> Cluster {
        Cluster::new("30s", 2)
    }

    /// gpoold's count of scheduling plans that broke an invariant
    /// (`gpool_sched_invariant_violations_total` on its /metrics; the
    /// config sets `metrics_listen`, as `shipped_policy` does).
    /// Asserts that gpoold counted no plan that broke an invariant; where
    /// one did, says which (its log's lines).
    pub fn assert_plans_sound(&self) {
        let broken = self.invariant_violations();
        if broken != 0.0 {
            let mut lines = String::new();
            for n in 1..=self.n_starts {
                let log = std::fs::read_to_string(self.dir.path().join(format!("gpoold-{n}.log"))).unwrap_or_default();
                for line in log.lines().filter(|line| line.contains("broke an invariant")) {
                    lines += line;
                    lines.push('\n');
                }
            }
            panic!("{broken} scheduling plans broke an invariant:\n{lines}");
        }
    }

    fn invariant_violations(&self) -> f64 {
        let addr = std::fs::read_to_string(self.state_dir().join("metrics.addr")).expect("metrics.addr");
        let (_, _, body) = super::http_get(addr.trim(), "/metrics");
        body.lines()
            .find_map(|line| {
                line.strip_prefix("gpool_sched_invariant_violations_total ")?
                    .parse()
                    .ok()
            })
            .unwrap_or_else(|| panic!("no gpool_sched_invariant_violations_total on /metrics:\n{body}"))
    }

    /// A controller run from a gpoold.toml (not dev mode) whose policy ends
    /// with `extra` (teams, QoS...), listening on a free loopback port.
    pub fn with_config(extra: &str) -> Cluster {
        Cluster::create("30s", 0, Some(extra.to_string()))
    }

    fn new(node_timeout: &str, dev_nodes: u32) -> Cluster {
        Cluster::create(node_timeout, dev_nodes, None)
    }

    /// A controller run from a gpoold.toml ending with `extra`, in `dir`
    /// (prepared by the test, e.g. with a CA in `dir/state/ca`), listening
    /// on `listen_host`.
    pub fn with_config_in(dir: tempfile::TempDir, listen_host: &str, extra: &str) -> Cluster {
        Cluster::create_in(dir, listen_host, "30s", 0, Some(extra.to_string()))
    }

    /// As `with_config_in`, with agents declared down after `node_timeout`
    /// (gpoold's default where it is empty).
    pub fn with_config_in_and_timeout(
        dir: tempfile::TempDir,
        listen_host: &str,
        node_timeout: &str,
        extra: &str,
    ) -> Cluster {
        Cluster::create_in(dir, listen_host, node_timeout, 0, Some(extra.to_string()))
    }

    /// A fresh temp dir for a cluster.
    pub fn temp_dir() -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix("gpool-e2e-")
            .tempdir()
            .expect("temp dir")
    }

    fn create(node_timeout: &str, dev_nodes: u32, config: Option<String>) -> Cluster {
        Cluster::create_in(Cluster::temp_dir(), "127.0.0.1", node_timeout, dev_nodes, config)
    }

    fn create_in(
        dir: tempfile::TempDir,
        listen_host: &str,
        node_timeout: &str,
        dev_nodes: u32,
        config: Option<String>,
    ) -> Cluster {
        let mut cluster = Cluster {
            dir,
            controller: None,
            addr: String::new(),
            cli_server: String::new(),
            n_starts: 0,
            node_timeout: node_timeout.to_string(),
            dev_nodes,
            config,
            listen_host: listen_host.to_string(),
            agents: Vec::new(),
            agent_env: Vec::new(),
            agent_inherits: None,
        };
        cluster.start_controller();
        cluster
    }

    /// Starts a gpool-agent process with `n_gpus` simulated H100s and waits
    /// until gpoold lists its node. Returns its index in `agents`.
    pub fn start_agent(&mut self, node: &str, n_gpus: u32) -> usize {
        self.start_agent_with(node, n_gpus, "")
    }

    /// Starts an agent whose agent.toml ends with `extra` (e.g. a
    /// `[simulated_topology]` table, or with `n_gpus` 0 its own
    /// `[[simulated_gpu]]`).
    pub fn start_agent_with(&mut self, node: &str, n_gpus: u32, extra: &str) -> usize {
        let agent_idx = self.spawn_agent(node, n_gpus, &format!("controller = \"{}\"\n", self.addr), extra, None);
        self.wait_for_registered(node);
        agent_idx
    }

    /// Starts an agent without waiting for it: its agent.toml begins with
    /// `top` (the controller line, TLS files), ends with `extra`; inside
    /// network namespace `netns` if given. Returns its index in `agents`.
    pub fn spawn_agent(&mut self, node: &str, n_gpus: u32, top: &str, extra: &str, netns: Option<&str>) -> usize {
        let spool = self.spool_dir(node);
        let config = self.dir.path().join(format!("agent-{node}-{}.toml", self.agents.len()));
        // No H100s: `extra` declares the node's GPUs.
        let h100s = if n_gpus > 0 {
            format!("[[simulated_gpu]]\nmodel = \"h100\"\nmemory_mib = 81559\ncount = {n_gpus}\n")
        } else {
            String::new()
        };
        // A test's node drains for a full spool only when the test means it
        // to, not for the free space of the machine it runs on.
        let min_free = if top.contains("min_spool_free") || extra.contains("min_spool_free") {
            ""
        } else {
            "min_spool_free = \"1M\"\n"
        };
        let text = format!(
            "{top}node_name = \"{node}\"\nspool_dir = \"{}\"\nheartbeat_interval = \"200ms\"\n{min_free}\n{h100s}{extra}",
            spool.display()
        );
        std::fs::write(&config, text).expect("write agent config");
        let mut command = match netns {
            Some(namespace) => super::netns::Net::command_in(namespace, &binary("gpool-agent")),
            None => Command::new(binary("gpool-agent")),
        };
        command
            .arg("--config")
            .arg(&config)
            .envs(self.agent_env.iter().cloned());
        if let Some((file, target)) = &self.agent_inherits {
            use std::os::fd::AsRawFd;
            use std::os::unix::process::CommandExt;
            let (from, to) = (file.as_raw_fd(), *target);
            // SAFETY: dup2(2) between fork and exec; its copy is open across the exec.
            unsafe {
                command.pre_exec(move || nix::unistd::dup2(from, to).map(drop).map_err(std::io::Error::from));
            }
        }
        let log = self.dir.path().join(format!("agent-{node}-{}.log", self.agents.len()));
        self.agents
            .push(Process::spawn(&format!("gpool-agent {node}"), command, log));
        self.agents.len() - 1
    }

    /// An agent for `node` whose GPUs are the stand-in NVML library's, as
    /// the `fixture` file gives them (later agents see them too), with
    /// `extra` for its agent.toml; waits until it is up.
    pub fn spawn_nvml_agent(&mut self, node: &str, fixture: &Path, extra: &str) {
        self.agent_env
            .push(("GPOOL_NVML_STANDIN".into(), fixture.display().to_string()));
        let top = super::process::nvml_agent_top(&self.addr);
        self.spawn_agent(node, 0, &top, extra, None);
        self.wait_for_registered(node);
    }

    /// Waits until gpoold lists `node` as up.
    pub fn wait_for_registered(&self, node: &str) {
        wait_until(&format!("node {node} to register"), Duration::from_secs(30), || {
            let nodes = self.gpool(&["nodes", "--output", "json"]).json();
            let found = nodes.as_array()?.iter().find(|n| n["name"] == node)?.clone();
            (found["state"] != "down").then_some(())
        });
    }

    pub fn spool_dir(&self, node: &str) -> PathBuf {
        self.dir.path().join(format!("spool-{node}"))
    }

    /// Waits until `gpool nodes` shows `node` in `state`.
    pub fn wait_for_node(&self, node: &str, state: &str) {
        wait_until(&format!("node {node} to be {state}"), Duration::from_secs(30), || {
            let nodes = self.gpool(&["nodes", "--output", "json"]).json();
            let found = nodes.as_array()?.iter().find(|n| n["name"] == node)?.clone();
            (found["state"] == state).then_some(())
        });
    }

    /// Waits until job `id` is in `state` and returns it.
    pub fn wait_for_state(&self, id: u64, state: &str) -> Value {
        wait_until(&format!("job {id} to be {state}"), Duration::from_secs(60), || {
            let job = self.job(id);
            (job["state"] == state).then_some(job)
        })
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
        // A restart listens where the agents already dial, so even the
        // first start takes a fixed port, one outside the ephemeral range
        // that no outgoing connection can take while gpoold is down.
        let listen = match self.addr.is_empty() {
            false => self.addr.clone(),
            true => format!("{}:{}", self.listen_host, super::free_port_on(&self.listen_host)),
        };
        let mut command = Command::new(binary("gpoold"));
        match &self.config {
            None => {
                command
                    .args(["--dev", "--dev-nodes", &self.dev_nodes.to_string(), "--listen", &listen])
                    .args(["--node-timeout", &self.node_timeout, "--state-dir"])
                    .arg(self.state_dir());
            }
            Some(extra) => {
                let user = current_user();
                let file = self.dir.path().join("gpoold.toml");
                // On loopback gpoold needs no TLS: callers are known by uid.
                // An empty node timeout leaves gpoold's default.
                let node_timeout = match self.node_timeout.as_str() {
                    "" => String::new(),
                    timeout => format!("node_timeout = \"{timeout}\"\n"),
                };
                let text = format!(
                    "listen = \"{listen}\"\nstate_dir = \"{}\"\n{node_timeout}admins = [\"{user}\"]\n\n{extra}",
                    self.state_dir().display(),
                );
                std::fs::write(&file, text).expect("write gpoold.toml");
                command.arg("--config").arg(file);
            }
        }
        command.env("XDG_RUNTIME_DIR", self.runtime_dir());
        let log = self.dir.path().join(format!("gpoold-{}.log", self.n_starts));
        let process = Process::spawn("gpoold", command, log);
        self.controller = Some(process);
        self.addr = wait_until("gpoold to write its address", Duration::from_secs(30), || {
            let addr = std::fs::read_to_string(&addr_file).ok()?.trim().to_string();
            TcpStream::connect(&addr).ok().map(|_| addr)
        });
        self.cli_server = match &self.config {
            None => self.addr.clone(),
            Some(_) => {
                let socket = self.state_dir().join("gpoold.sock");
                wait_until("gpoold's socket", Duration::from_secs(30), || {
                    std::os::unix::net::UnixStream::connect(&socket).ok()
                });
                format!("unix:{}", socket.display())
            }
        };
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
            .env("GPOOL_SERVER", &self.cli_server)
            .output()
            .expect("run gpool")
            .into()
    }

    /// Runs `gpool` as `user` (a copy of it in the cluster dir, which is
    /// made readable: the checkout may not be) against `server`, from `/`.
    pub fn gpool_as(&self, user: &nix::unistd::User, server: &str, args: &[&str]) -> Run {
        use std::os::unix::fs::PermissionsExt;
        use std::os::unix::process::CommandExt;
        std::fs::set_permissions(self.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let cli = self.dir.path().join("gpool");
        if !cli.exists() {
            std::fs::copy(binary("gpool"), &cli).expect("copy gpool");
        }
        // Another test's process, forked while the copy was open for
        // writing, may hold it open until it execs: exec then fails with
        // "text file busy" for a moment.
        let mut tries = 0;
        loop {
            let run = Command::new(&cli)
                .args(args)
                .current_dir("/")
                .env("GPOOL_SERVER", server)
                .env_remove("GPOOL_TOKEN")
                .uid(user.uid.as_raw())
                .gid(user.gid.as_raw())
                .output();
            match run {
                Err(err) if err.kind() == std::io::ErrorKind::ExecutableFileBusy && tries < 50 => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                run => return run.expect("run gpool").into(),
            }
        }
    }

    /// Submits and returns the job id.
    pub fn submit(&self, args: &[&str]) -> u64 {
        let mut all = vec!["submit", "--output", "json"];
        all.extend_from_slice(args);
        let run = self.gpool(&all);
        run.ok();
        run.json()["ids"][0].as_u64().expect("an id")
    }

    /// Submits every [[job]] of `file` (`submit -f`) and returns their ids.
    pub fn submit_file(&self, file: &Path) -> Vec<u64> {
        let run = self.gpool(&["submit", "--output", "json", "-f", &file.display().to_string()]);
        run.ok();
        run.json()["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|id| id.as_u64().expect("an id"))
            .collect()
    }

    pub fn job(&self, id: u64) -> Value {
        let run = self.gpool(&["show", &id.to_string(), "--output", "json"]);
        run.ok();
        run.json()
    }
}

/// The name of the user running the tests.
pub fn current_user() -> String {
    nix::unistd::User::from_uid(nix::unistd::geteuid())
        .ok()
        .flatten()
        .map_or_else(|| "root".to_string(), |user| user.name)
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
            for process in self.controller.iter().chain(self.agents.iter()) {
                eprintln!(
                    "---- {} log ({}) ----\n{}",
                    process.name,
                    process.log.display(),
                    process.log_tail(40)
                );
            }
        }
        // Agents first, so they do not spin reconnecting; then the controller;
        // the temp dir goes last.
        for agent in &mut self.agents {
            agent.stop();
        }
        if let Some(controller) = &mut self.controller {
            controller.stop();
        }
    }
}
