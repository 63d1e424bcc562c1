//! gpoold: the gpool controller. `run` takes a config and a shutdown future;
//! `main` only parses flags.

pub mod api;
pub use gpool_config as config;
pub mod error;
pub mod ha;
pub mod metrics;
pub mod notify;
pub mod power;
pub mod reports;
pub mod sched_loop;
pub mod security;
mod standby;
mod startup;
pub mod state;
pub mod status_page;

use anyhow::Context;
use config::Config;
use gpool_core::Timestamp;
use gpool_proto::pb::agent_link_server::AgentLinkServer;
use gpool_proto::pb::pool_server::PoolServer;
use state::{State, StateHandle};
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, RwLock};
use tokio::sync::{broadcast, mpsc, Notify};
use tonic::service::interceptor::InterceptedService;

/// How long open connections may delay a shutdown.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// The file in the state dir that holds the bound `host:port`.
pub const ADDR_FILE: &str = "gpoold.addr";
/// ...and the one of `metrics_listen`.
pub const METRICS_ADDR_FILE: &str = "metrics.addr";

/// Wall-clock now, the one clock gpoold hands to gpool-core.
pub fn wall_clock() -> Timestamp {
    let since_epoch = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    Timestamp(since_epoch.as_millis() as i64)
}

/// Runs the controller until `shutdown` resolves or a fatal error occurs.
/// `hangups` are the SIGHUPs that reload the config file, if there is one.
pub async fn run(
    config: Config,
    shutdown: impl Future<Output = ()> + Send + 'static,
    hangups: tokio::sync::mpsc::UnboundedReceiver<()>,
) -> anyhow::Result<()> {
    prepare_state_dir(&config.state_dir)?;
    let mut shutdown = Box::pin(shutdown);
    let tls = config.tls.as_ref().map(security::tls::server_config).transpose()?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("listen: cannot bind {}", config.listen))?;
    let listener = Arc::new(listener);
    let addr = listener.local_addr()?;
    let Some((leadership, standby)) = elected(&config, (&listener, &tls), &mut shutdown).await? else {
        return Ok(());
    };
    let leadership = leadership.map(Arc::new);
    let outcome = lead(
        config,
        (leadership.clone(), standby),
        (listener, addr, tls),
        shutdown,
        hangups,
    )
    .await;
    if let (Err(_), Some(leadership)) = (&outcome, leadership) {
        // Failed as leader: a standby is elected now, not a lease from now.
        leadership.resign().await;
    }
    outcome
}

/// Serves as the leader (or the only controller) until `shutdown`.
async fn lead(
    config: Config,
    (leadership, standby): (Option<Arc<ha::Leadership>>, Option<standby::Standby>),
    (listener, addr, tls): (
        Arc<tokio::net::TcpListener>,
        std::net::SocketAddr,
        Option<Arc<rustls::ServerConfig>>,
    ),
    shutdown: impl Future<Output = ()> + Send + 'static,
    hangups: tokio::sync::mpsc::UnboundedReceiver<()>,
) -> anyhow::Result<()> {
    let (mut core, security, mut tasks) = load_and_start(&config, leadership.clone(), addr, hangups).await?;
    // On shutdown the server stops accepting and lets open requests finish;
    // clients that keep connections open get SHUTDOWN_GRACE, no more.
    let (stopping_sender, stopping) = tokio::sync::watch::channel(false);
    let stopping_sender_for_agents = stopping_sender.clone();
    // The server stops taking connections first, so a resigned leader
    // answers no new caller; the resignation runs beside it, and is waited
    // for before this returns.
    let resigning = tokio::spawn(stop_then_resign(shutdown, leadership.clone(), stopping_sender));
    let mut stopped = stopping.clone();
    let shutdown = async move {
        let _ = stopped.wait_for(|stopping| *stopping).await;
    };
    // Callers were told "starting" until now; from here the leader answers.
    if let Some(standby) = standby {
        standby.stop().await;
    }
    let served = startup::serve(
        &config,
        &core,
        &security,
        (listener, addr, tls),
        (&stopping, shutdown),
        (&mut tasks.accept, &mut tasks.dev_agents, &mut tasks.background),
    )
    .await?;
    let mut stopping_for_grace = stopping.clone();
    let grace_over = async move {
        let _ = stopping_for_grace.wait_for(|stopping| *stopping).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    let (outcome, state_task_ended) =
        startup::until_end(&mut core.state_task, served, grace_over, &mut core.flusher).await;
    // Told to stop: the resignation (if any) ends before the process does.
    // Ended by an error instead: nothing waits for `shutdown` any more.
    let told_to_stop = *stopping.borrow();
    startup::shut_down(core, state_task_ended, tasks, stopping_sender_for_agents, &config, addr).await;
    if told_to_stop {
        let _ = resigning.await;
    } else {
        resigning.abort();
    }
    outcome
}

/// The state dir loaded, the address file written, and the state task and
/// the loops around it started: everything but the API.
async fn load_and_start(
    config: &Config,
    leadership: Option<Arc<ha::Leadership>>,
    addr: std::net::SocketAddr,
    hangups: tokio::sync::mpsc::UnboundedReceiver<()>,
) -> anyhow::Result<(startup::Core, Arc<security::Security>, startup::Tasks)> {
    let (store, loaded) = open_store(config).await?;
    let n_jobs = loaded.jobs.len();
    let security = Arc::new(security::Security::open(config)?);
    // The dev pointer first: whoever waits for the address file then finds
    // the pointer written too.
    if config.dev {
        startup::point_dev_address(addr);
    }
    write_addr_file(&config.state_dir.join(ADDR_FILE), &addr.to_string())?;

    let accounting = store.accounting();
    // Tasks that run as long as gpoold does, ended with it.
    let mut background = tokio::task::JoinSet::new();
    background.spawn(seal_periodically(store.sealer()));
    let mut core = startup::start_core(store, loaded, config, &security, accounting, &mut background);
    core.leadership = leadership;

    tracing::info!(
        "gpoold listening on {addr} with {n_jobs} jobs in memory (those not ended, and what they need) from {}",
        config.state_dir.display()
    );
    let reload_task = config
        .path
        .clone()
        .map(|path| tokio::spawn(reload_on_sighup(core.handle.clone(), security.clone(), path, hangups)));
    let tasks = startup::Tasks {
        accept: tokio::task::JoinSet::new(),
        dev_agents: tokio::task::JoinSet::new(),
        background,
        reload: reload_task,
    };
    Ok((core, security, tasks))
}

/// With `[ha]`, campaigns until this controller is elected, sending
/// callers on `listener` to the leader meanwhile: `None` when it is told
/// to stop first (a standby just stops). Elected, the standby's listener
/// goes on answering "starting" until the leader serves. `(None, None)`
/// without `[ha]`.
async fn elected(
    config: &Config,
    (listener, tls): (&Arc<tokio::net::TcpListener>, &Option<Arc<rustls::ServerConfig>>),
    shutdown: &mut std::pin::Pin<Box<impl Future<Output = ()>>>,
) -> anyhow::Result<Option<(Option<ha::Leadership>, Option<standby::Standby>)>> {
    let Some(ha) = &config.ha else {
        return Ok(Some((None, None)));
    };
    let standby = standby::serve(config, listener.clone(), tls.clone(), ha::watch_leader(ha)?);
    tokio::select! {
        leadership = ha::campaign(ha) => Ok(Some((Some(leadership?), Some(standby)))),
        () = shutdown => {
            tracing::info!("ha: standby stopping");
            standby.stop().await;
            Ok(None)
        }
    }
}

/// Once `shutdown` resolves, everything is told to stop (the server takes
/// no new connection, agents' links end), then a leader resigns: a
/// planned switch, the standby is elected now and takes the state dir's
/// lock once this shutdown lets go of it.
async fn stop_then_resign(
    shutdown: impl Future<Output = ()>,
    leadership: Option<Arc<ha::Leadership>>,
    stopping: tokio::sync::watch::Sender<bool>,
) {
    shutdown.await;
    let _ = stopping.send(true);
    if let Some(leadership) = leadership {
        leadership.resign().await;
    }
}

/// Opens the state dir's store. An elected controller waits for the
/// previous leader's lock to go: one that lost its lease exits within two
/// thirds of the TTL, one that resigned once its shutdown is over.
async fn open_store(config: &Config) -> anyhow::Result<(state::store::Store, state::store::Loaded)> {
    let patience = config.ha.as_ref().map_or(std::time::Duration::ZERO, |ha| {
        ha.lease_ttl + SHUTDOWN_GRACE + std::time::Duration::from_secs(10)
    });
    let since = std::time::Instant::now();
    loop {
        let opened = state::store::Store::open_sealing(&config.state_dir, config.history_file_records)
            .with_context(|| format!("state dir {}", config.state_dir.display()));
        match opened {
            Err(err) if since.elapsed() < patience => {
                tracing::warn!("ha: {err:#}; trying again");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
            opened => return opened,
        }
    }
}

/// The configs of `gpoold --dev`'s in-process agents: simulated GPUs, or one
/// agent with the machine's real GPUs where NVML finds some.
fn dev_agent_configs(
    dev: &config::DevAgents,
    state_dir: &Path,
    controller: &str,
) -> Vec<gpool_agent::config::AgentConfig> {
    let real_gpus = gpool_agent::gpu::nvml::open(&gpool_agent::config::nvml_library_from_env())
        .and_then(|nvml| gpool_agent::gpu::nvml::devices(&nvml))
        .is_ok_and(|devices| !devices.is_empty());
    let n_nodes = if real_gpus { 1 } else { dev.n_nodes };
    (1..=n_nodes)
        .map(|node_idx| {
            let node_name = format!("dev-{node_idx}");
            let simulated_gpus = if real_gpus {
                Vec::new()
            } else {
                vec![gpool_agent::config::SimulatedGpu {
                    model: dev.gpu_model.clone(),
                    memory_mib: dev.gpu_memory_mib,
                    reserved_mib: 0,
                    count: dev.gpus_per_node,
                    utilization_pct: 0,
                    memory_used_mib: 0,
                    ecc_corrected: 0,
                    ecc_uncorrected: 0,
                    mig: Vec::new(),
                    numa_node: None,
                    compute_capability: None,
                }]
            };
            gpool_agent::config::AgentConfig {
                controller: controller.to_string(),
                spool_dir: state_dir.join("spool").join(&node_name),
                labels: Default::default(),
                heartbeat_interval: std::time::Duration::from_secs(1),
                simulated_gpus,
                simulate: false,
                // As in an SXM server: every GPU joined to all others
                // through NVSwitch.
                simulated_topology: gpool_core::topology::Topology::new(gpool_core::topology::group_links(
                    &[(0..dev.gpus_per_node).collect()],
                    gpool_core::topology::Link::Nvlink,
                )),
                ca: None,
                cert: None,
                container_runtime: "podman".into(),
                cgroups: true,
                allow_swap: false,
                health_program: None,
                state_dir: state_dir.join("spool").join(&node_name),
                // A laptop's disk is smaller than a GPU server's.
                min_spool_free: 64 << 20,
                max_output: gpool_agent::config::DEFAULT_MAX_OUTPUT,
                keep_job_files: gpool_agent::config::DEFAULT_KEEP_JOB_FILES,
                max_pids: gpool_agent::config::DEFAULT_MAX_PIDS,
                cpus: gpool_agent::host::cpus(),
                memory_bytes: gpool_agent::host::memory_bytes(),
                nvml_library: gpool_agent::config::nvml_library_from_env(),
                node_name,
            }
        })
        .collect()
}

/// Re-reads gpoold.toml and the certificate revocation list and hands both
/// to the state task; `caller` is `None` for SIGHUP.
pub async fn reload_policy(
    handle: &StateHandle,
    security: &security::Security,
    path: &Path,
    caller: Option<gpool_core::auth::Caller>,
) -> anyhow::Result<String> {
    // Revocations first: a bad gpoold.toml must not hold one back.
    let revoked = security.reload_revoked()?;
    let config = config::Config::load(path)?;
    let summary = handle
        .call(|reply| state::Command::Reload {
            caller,
            config: Box::new(config),
            revoked,
            reply,
        })
        .await?;
    Ok(summary)
}

/// Starts listening for SIGHUP at once: the receiver gets one message per
/// signal. Call it first thing in `main`, as `gpool_agent::terminate_signal`:
/// a SIGHUP before it would end the process.
pub fn hangup_signal() -> tokio::sync::mpsc::UnboundedReceiver<()> {
    let (sender, hangups) = tokio::sync::mpsc::unbounded_channel();
    let listening = signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP]).and_then(|mut signals| {
        std::thread::Builder::new().name("sighup".into()).spawn(move || {
            for _ in signals.forever() {
                if sender.send(()).is_err() {
                    return;
                }
            }
        })
    });
    if let Err(err) = listening {
        eprintln!("cannot listen for SIGHUP: {err}; reload the policy with `gpool admin reload`");
    }
    hangups
}

/// Re-reads gpoold.toml on every SIGHUP; a bad file is logged with its
/// line and field, and the old policy stays.
async fn reload_on_sighup(
    handle: StateHandle,
    security: Arc<security::Security>,
    path: std::path::PathBuf,
    mut hangups: tokio::sync::mpsc::UnboundedReceiver<()>,
) {
    while hangups.recv().await.is_some() {
        if let Err(err) = reload_policy(&handle, &security, &path, None).await {
            tracing::error!("SIGHUP: policy not reloaded, the old one stays: {err:#}");
        }
    }
}

/// Creates the state dir, traversable but not listable by others (0711:
/// local users reach the socket in it), with the database only for gpoold.
fn prepare_state_dir(dir: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir.join("db")).with_context(|| format!("state dir {}: cannot create", dir.display()))?;
    for (path, mode) in [(dir.to_path_buf(), 0o711), (dir.join("db"), 0o700)] {
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("{}: cannot chmod {mode:o}", path.display()))?;
    }
    Ok(())
}

/// Moves old ended jobs and accounting records to history files, when
/// due, every `SEAL_EVERY`, until gpoold stops.
async fn seal_periodically(sealer: state::store::Sealer) {
    let mut ticks = tokio::time::interval(SEAL_EVERY);
    loop {
        ticks.tick().await;
        let sealer = sealer.clone();
        match tokio::task::spawn_blocking(move || sealer.seal_due()).await {
            Ok(Ok((0, 0))) => {}
            Ok(Ok((jobs, attempts))) => {
                tracing::debug!("{jobs} ended jobs and {attempts} accounting records moved to history files")
            }
            Ok(Err(err)) => tracing::warn!("moving old records to history files: {err}"),
            Err(err) => tracing::warn!("moving old records to history files: {err}"),
        }
    }
}

const SEAL_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Epoch flushes every 5 s: enough to free a burst's garbage.
const SLED_EPOCH_FLUSHES: usize = 4096;

/// Asks the state task to look for silent nodes a few times per timeout
/// (and at least every second, for preemption grace periods).
async fn liveness_ticker(handle: StateHandle, node_timeout: std::time::Duration) {
    let period = (node_timeout / 4).clamp(std::time::Duration::from_millis(100), std::time::Duration::from_secs(1));
    let mut ticks = tokio::time::interval(period);
    loop {
        ticks.tick().await;
        if handle.commands.send(state::Command::Tick).await.is_err() {
            return;
        }
    }
}

/// Writes `addr` atomically (temp file, then rename), so readers never see
/// half a line.
fn write_addr_file(path: &Path, addr: &str) -> anyhow::Result<()> {
    let dir = path.parent().context("address file has no parent dir")?;
    std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
    let temp = path.with_extension("tmp");
    std::fs::write(&temp, format!("{addr}\n")).with_context(|| format!("{}: cannot write", temp.display()))?;
    std::fs::rename(&temp, path).with_context(|| format!("{}: cannot write", path.display()))?;
    Ok(())
}
