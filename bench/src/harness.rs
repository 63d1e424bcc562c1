//! What every benchmark stands on: release binaries started in temp
//! dirs (gpoold, agents), calls to them, and figures printed with the
//! load average beside them.

use super::*;

pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| text.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

pub(crate) fn report(what: &str, figure: String) {
    println!("{what:<72} {figure:<26} load {}", load_average());
}

pub(crate) fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe.parent().context("bench binary dir")?.join(name);
    if !path.exists() {
        bail!("{} is missing: run bench/run.sh", path.display());
    }
    Ok(path)
}

/// A release gpoold in dev mode on its own state dir.
pub(crate) struct Controller {
    pub(crate) child: Child,
    pub(crate) addr: String,
    pub(crate) state_dir: PathBuf,
}

impl Controller {
    pub(crate) fn start(state_dir: &Path) -> anyhow::Result<Controller> {
        Controller::start_with(state_dir, &[])
    }

    /// With more gpoold flags.
    pub(crate) fn start_with(state_dir: &Path, flags: &[&str]) -> anyhow::Result<Controller> {
        let mut args: Vec<std::ffi::OsString> = ["--dev", "--dev-nodes", "0", "--listen", "127.0.0.1:0", "--state-dir"]
            .map(Into::into)
            .to_vec();
        args.push(state_dir.into());
        args.extend(flags.iter().map(Into::into));
        Controller::spawn(state_dir, &args)
    }

    /// Not in dev mode: from a gpoold.toml with `policy` (teams, QoS
    /// classes) added, on loopback.
    pub(crate) fn start_with_policy(state_dir: &Path, policy: &str) -> anyhow::Result<Controller> {
        let config = state_dir.join("gpoold.toml");
        std::fs::write(
            &config,
            format!(
                "listen = \"127.0.0.1:0\"\nstate_dir = {}\n{policy}",
                toml::Value::String(state_dir.display().to_string())
            ),
        )?;
        Controller::spawn(state_dir, &["--config".into(), config.into()])
    }

    pub(crate) fn spawn(state_dir: &Path, args: &[std::ffi::OsString]) -> anyhow::Result<Controller> {
        let addr_file = state_dir.join("gpoold.addr");
        let _ = std::fs::remove_file(&addr_file);
        let child = Command::new(binary("gpoold")?)
            .args(args)
            .env("GPOOL_LOG", "warn")
            .env("XDG_RUNTIME_DIR", state_dir.join("run"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(addr) = std::fs::read_to_string(&addr_file) {
                if std::net::TcpStream::connect(addr.trim()).is_ok() {
                    return Ok(Controller {
                        child,
                        addr: addr.trim().to_string(),
                        state_dir: state_dir.into(),
                    });
                }
            }
            if Instant::now() > deadline {
                bail!("gpoold did not start within 30 s");
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    pub(crate) fn rss_kib(&self) -> u64 {
        self.status_kib("VmRSS:")
    }

    /// A `/proc/PID/status` figure in KiB (`VmRSS:`, `VmHWM:`...).
    pub(crate) fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    }

    pub(crate) fn stop(mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Controller {
    /// A phase that fails leaves no gpoold behind.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Agent processes, stopped when dropped.
pub(crate) struct Agents(pub(crate) Vec<Child>);

impl Drop for Agents {
    fn drop(&mut self) {
        for agent in &mut self.0 {
            let _ = Command::new("kill").arg("-TERM").arg(agent.id().to_string()).status();
            let _ = agent.wait();
        }
    }
}

pub(crate) fn gpool(addr: &str, args: &[&str]) -> anyhow::Result<std::process::Output> {
    let output = Command::new(binary("gpool")?)
        .args(args)
        .env("GPOOL_SERVER", addr)
        .output()?;
    if !output.status.success() {
        bail!("gpool {args:?} failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(output)
}

pub(crate) async fn client(addr: &str) -> anyhow::Result<PoolClient<Channel>> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .tcp_nodelay(true)
        .connect()
        .await?;
    Ok(PoolClient::new(channel).max_decoding_message_size(1 << 30))
}

pub(crate) fn with_user<T>(message: T) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(
        gpool_proto::USER_METADATA_KEY,
        tonic::metadata::MetadataValue::from_static("bench"),
    );
    request
}

pub(crate) fn one_spec() -> pb::JobSpec {
    pb::JobSpec {
        name: "bench".into(),
        command: vec!["true".into()],
        gpus: 1,
        nodes: 1,
        ..Default::default()
    }
}

pub(crate) fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// The body of an HTTP/1.1 GET.
pub(crate) fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (_, body) = response.split_once("\r\n\r\n").context("an HTTP response")?;
    Ok(body.to_string())
}

/// The sum and count of the histogram `metric` on the /metrics page of
/// the controller started with `--metrics-listen` in `state_dir`.
pub(crate) fn histogram(state_dir: &Path, metric: &str) -> anyhow::Result<(f64, f64)> {
    let addr = std::fs::read_to_string(state_dir.join("metrics.addr")).context("gpoold's metrics.addr")?;
    let text = http_get(addr.trim(), "/metrics")?;
    let value = |suffix: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(&format!("{metric}_{suffix} ")))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    Ok((value("sum"), value("count")))
}

/// Starts `n_agents` gpool-agent processes with `n_gpus` simulated GPUs each.
pub(crate) fn start_agents(controller: &Controller, n_agents: usize, n_gpus: u32) -> anyhow::Result<Agents> {
    let mut agents = Agents(Vec::new());
    for agent_idx in 0..n_agents {
        let config = controller.state_dir.join(format!("agent-{agent_idx}.toml"));
        std::fs::write(
            &config,
            format!(
                "controller = \"{}\"\nnode_name = \"bench-{agent_idx}\"\nspool_dir = \"{}\"\n\n[[simulated_gpu]]\nmodel = \"h100\"\nmemory_mib = 81559\ncount = {n_gpus}\n",
                controller.addr,
                controller.state_dir.join(format!("spool-{agent_idx}")).display()
            ),
        )?;
        agents.0.push(
            Command::new(binary("gpool-agent")?)
                .arg("--config")
                .arg(&config)
                .env("GPOOL_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()?,
        );
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while count_lines(&gpool(&controller.addr, &["nodes"])?.stdout) < n_agents + 1 {
        if Instant::now() > deadline {
            bail!("agents did not register within 30 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(agents)
}

pub(crate) fn count_lines(bytes: &[u8]) -> usize {
    bytes.iter().filter(|b| **b == b'\n').count()
}

/// Resident memory of process `pid` in MiB (`VmRSS`).
pub(crate) fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib: f64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0);
    kib / 1024.0
}

/// A job file of `n` one-GPU `true` jobs with their output discarded.
pub(crate) fn write_true_batch(path: &Path, n: usize) -> std::io::Result<()> {
    std::fs::write(path, "[[job]]\ncommand = [\"true\"]\ndiscard_output = true\n".repeat(n))
}

/// How many jobs completed, from the summary line of `gpool jobs`.
pub(crate) fn n_completed(addr: &str) -> anyhow::Result<usize> {
    let output = gpool(addr, &["jobs", "--state", "completed", "--limit", "1"])?;
    let text = String::from_utf8_lossy(&output.stdout);
    Ok(text
        .lines()
        .find_map(|line| line.split_once(" jobs: ")?.0.parse().ok())
        .unwrap_or(0))
}

/// Waits until no job is pending or running; returns when that happened.
pub(crate) fn wait_all_finished(addr: &str, deadline: Duration) -> anyhow::Result<Instant> {
    let started = Instant::now();
    loop {
        let output = gpool(addr, &["jobs", "--state", "pending,running", "--output", "json"])?;
        if output.stdout.starts_with(b"[]") {
            return Ok(Instant::now());
        }
        if started.elapsed() > deadline {
            bail!("jobs still unfinished after {deadline:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
