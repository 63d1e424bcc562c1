//! gpool-agent: discovers the node's GPUs, keeps the link to gpoold, and runs
//! the attempts gpoold launches here.

pub mod cgroup;
pub mod config;
pub mod container;
pub mod device_filter;
pub mod gpu;
pub mod host;
pub mod journal;
pub mod launch;
pub mod link;
pub mod memory;
pub mod mps;
pub mod spool;
pub mod supervise;
pub mod terminal;

use config::AgentConfig;
use std::future::Future;

/// Runs the agent until `shutdown` resolves. Running attempts are left
/// alone when the agent stops (they keep running; a restarted agent reports
/// what it finds).
pub async fn run(config: AgentConfig, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.spool_dir)
        .map_err(|err| anyhow::anyhow!("spool_dir {}: cannot create: {err}", config.spool_dir.display()))?;
    link::remember_terms_in(config.spool_dir.join("controller-term"));
    let gpu::Discovered {
        gpus,
        topology,
        source,
        labels: gpu_labels,
    } = gpu::discover(&config).map_err(|reason| anyhow::anyhow!("{reason}"))?;
    tracing::info!("node {}: {} GPUs ({source:?})", config.node_name, gpus.len());
    let isolation = detect_isolation(&config);
    log_isolation(&isolation);
    let mut labels = gpu_labels;
    labels.extend(config.labels.clone());
    labels.insert("isolation".into(), isolation.label().into());
    labels.insert("gpool.enforces".into(), isolation.enforced().join(","));
    let node_gpus = gpu::GpuDevices::of(&gpus);
    let (events, event_receiver) = tokio::sync::mpsc::unbounded_channel();
    let tls = config.client_tls()?;
    let simulated = source != gpu::Source::Nvml;
    let attempts = start_attempts(&config, (isolation, simulated), node_gpus, events)?;
    attempts.recover();
    let pruning = tokio::spawn(prune_job_files(attempts.clone(), config.keep_job_files));
    let health = std::sync::Arc::new(gpu::health::Health::default());
    if source == gpu::Source::Nvml {
        gpu::nvml::watch_xids(config.nvml_library.clone(), health.clone());
    }
    let health_program = config
        .health_program
        .clone()
        .map(|program| tokio::spawn(gpu::health::run_health_program(program, health.clone())));
    let info = link::NodeInfo {
        health,
        name: config.node_name.clone(),
        sampler: gpu::Sampler::start(
            gpu::Reader::new(source, &config.simulated_gpus, &config.nvml_library),
            config.heartbeat_interval,
        ),
        gpus,
        labels,
        topology,
        heartbeat_interval: config.heartbeat_interval,
        cpus: config.cpus,
        memory_bytes: config.memory_bytes,
    };
    let controller =
        gpool_proto::dial::parse_list(&config.controller).map_err(|reason| anyhow::anyhow!("controller: {reason}"))?;
    link::run(controller, tls, info, attempts, event_receiver, shutdown)
        .await
        .map_err(|err| anyhow::anyhow!("cannot start the thread that carries out gpoold's orders: {err}"))?;
    if let Some(task) = health_program {
        task.abort();
    }
    pruning.abort();
    Ok(())
}

/// The node's cgroup isolation, unless agent.toml turns cgroups off.
fn detect_isolation(config: &AgentConfig) -> cgroup::Isolation {
    protect_from_oom();
    if config.cgroups {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        cgroup::Isolation::detect(std::path::Path::new("/sys/fs/cgroup"), &own, config.allow_swap)
    } else {
        cgroup::Isolation::None("cgroups = false in agent.toml".into())
    }
}

/// How far below a job the agent (with the launcher's keeper and the
/// supervisors) stands in the kernel's OOM order: a job that runs a node
/// out of memory is killed before them. The launcher itself stands at 0,
/// where its plain jobs are born (they share its memory until their exec,
/// so a job's own write would set the launcher's too); a launcher the OOM
/// killer takes is started again by the agent, and its keeper records its
/// jobs' ends.
pub(crate) const AGENT_OOM_SCORE_ADJ: &str = "-900";

/// Lowers the agent's OOM score (as root; a job never takes the agent).
fn protect_from_oom() {
    if nix::unistd::geteuid().is_root() {
        if let Err(err) = std::fs::write("/proc/self/oom_score_adj", AGENT_OOM_SCORE_ADJ) {
            tracing::warn!("cannot lower the agent's OOM score: {err}");
        }
    }
}

/// Says how attempts are isolated (a warning where they are not wholly).
fn log_isolation(isolation: &cgroup::Isolation) {
    match isolation {
        cgroup::Isolation::V1 { .. } => {
            tracing::info!("each attempt runs in its own cgroup, with only its own GPUs' device nodes")
        }
        cgroup::Isolation::V2 {
            device_filter: Ok(()),
            delegated: Ok(()),
            ..
        } => tracing::info!(
            "each attempt runs in its own cgroup (cgroup v2), with only its own GPUs' device nodes (a BPF device filter); enforced: {}",
            isolation.enforced().join(", ")
        ),
        cgroup::Isolation::V2 {
            device_filter: Ok(()),
            delegated: Err(reason),
            ..
        } => tracing::warn!(
            "each attempt runs in its own cgroup (cgroup v2), with only its own GPUs' device nodes, but no memory, CPU or pids limit is enforced: {reason}"
        ),
        cgroup::Isolation::V2 { device_filter: Err(reason), .. } => tracing::warn!(
            "each attempt runs in its own cgroup (cgroup v2), but GPU device nodes are not restricted: {reason}"
        ),
        cgroup::Isolation::None(reason) => tracing::warn!(
            "no cgroup isolation: {reason}; jobs can open any GPU's device node, and processes a job detaches may outlive it"
        ),
    }
}

/// The node's attempts: their spool, isolation, GPUs and container
/// runtime, with the controller's address (and CA) for jobs' environment.
fn start_attempts(
    config: &AgentConfig,
    (isolation, simulated): (cgroup::Isolation, bool),
    node_gpus: gpu::GpuDevices,
    events: tokio::sync::mpsc::UnboundedSender<gpool_proto::pb::JobEvent>,
) -> anyhow::Result<std::sync::Arc<launch::Attempts>> {
    let mut controller_env = vec![("GPOOL_SERVER".to_string(), config.controller.clone())];
    if let Some(ca) = &config.ca {
        controller_env.push(("GPOOL_CA".to_string(), ca.display().to_string()));
    }
    launch::Attempts::new(
        config.node_name.clone(),
        controller_env,
        launch::SpoolDirs {
            spool_dir: config.spool_dir.clone(),
            state_dir: config.state_dir.clone(),
            min_spool_free: config.min_spool_free,
            max_output: config.max_output,
            max_pids: config.max_pids,
        },
        (
            isolation,
            node_gpus,
            container::resolve_program(&config.container_runtime),
        ),
        mps::Mps::new(&config.state_dir, simulated),
        events,
    )
    .map_err(|err| anyhow::anyhow!("attempt supervisor: {err}"))
}

/// How often old job output is looked for.
const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(600);

/// Removes job output last written longer than `keep` ago (jobs with an
/// attempt here keep theirs), and the cgroups a killed launcher left, now
/// and every ten minutes, off the link's thread.
async fn prune_job_files(attempts: std::sync::Arc<launch::Attempts>, keep: std::time::Duration) {
    let mut every = tokio::time::interval(PRUNE_EVERY);
    loop {
        every.tick().await;
        let (dir, live) = (attempts.jobs_dir(), attempts.live_jobs());
        let removed = tokio::task::spawn_blocking(move || spool::prune(&dir, keep, &live)).await;
        if let Ok(removed @ 1..) = removed {
            tracing::info!(
                "removed {removed} job output files older than {}",
                humantime::format_duration(keep)
            );
        }
        let of = attempts.clone();
        if let Ok(removed @ 1..) = tokio::task::spawn_blocking(move || of.remove_left_behind_cgroups()).await {
            tracing::info!("removed {removed} empty cgroups of attempts that ended while their launcher was gone");
        }
    }
}

/// Starts listening for SIGTERM and SIGINT at once and returns the future
/// that resolves on the first of them: the shutdown future of the binaries.
/// Call it first thing in `main`. A signal after that is never missed (tokio's
/// own listener drops one that lands while it subscribes, and the process
/// then runs on), and one before it ends the process as it would anyway.
pub fn terminate_signal() -> impl std::future::Future<Output = ()> + Send + 'static {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let (sender, received) = tokio::sync::oneshot::channel::<()>();
    let listening = signal_hook::iterator::Signals::new([SIGTERM, SIGINT]).and_then(|mut signals| {
        std::thread::Builder::new().name("signals".into()).spawn(move || {
            let mut sender = Some(sender);
            // Later signals are taken too, and change nothing: the shutdown
            // under way goes on.
            for _ in signals.forever() {
                if let Some(sender) = sender.take() {
                    let _ = sender.send(());
                }
            }
        })
    });
    if let Err(err) = listening {
        eprintln!("cannot listen for SIGTERM and SIGINT: {err}; stop this process with SIGKILL");
    }
    async move {
        if received.await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}
