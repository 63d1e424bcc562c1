//! gpoold: the gpool controller. `run` takes a config and a shutdown future;
//! `main` only parses flags.

pub mod api;
pub use gpool_config as config;
pub mod error;
pub mod metrics;
pub mod notify;
pub mod reports;
pub mod sched_loop;
pub mod security;
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
    let (store, loaded) = state::store::Store::open_sealing(&config.state_dir, config.history_file_records)
        .with_context(|| format!("state dir {}", config.state_dir.display()))?;
    let n_jobs = loaded.jobs.len();
    let security = Arc::new(security::Security::open(&config)?);
    let tls = config.tls.as_ref().map(security::tls::server_config).transpose()?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("listen: cannot bind {}", config.listen))?;
    let addr = listener.local_addr()?;
    // The dev pointer first: whoever waits for the address file then finds
    // the pointer written too.
    if config.dev {
        let pointer = gpool_proto::dev_address_file();
        // A dev controller that already answers keeps the pointer: the CLI
        // goes on finding it, and this one is reached with --server.
        let running = std::fs::read_to_string(&pointer)
            .ok()
            .map(|text| text.trim().to_string())
            .filter(|other| other != &addr.to_string())
            .filter(|other| std::net::TcpStream::connect(other).is_ok());
        if let Some(other) = running {
            tracing::warn!(
                "another dev controller answers at {other} ({}); gpool finds that one: reach this one with --server {addr}",
                pointer.display()
            );
        } else if let Err(err) = write_addr_file(&pointer, &addr.to_string()) {
            tracing::warn!("cannot record the dev address in {}: {err:#}", pointer.display());
        }
    }
    write_addr_file(&config.state_dir.join(ADDR_FILE), &addr.to_string())?;

    let accounting = store.accounting();
    // Tasks that run as long as gpoold does, ended with it.
    let mut background = tokio::task::JoinSet::new();
    background.spawn(seal_periodically(store.sealer()));
    let (commands, inbox) = mpsc::channel(65_536);
    let (agent_commands, agent_inbox) = mpsc::channel(65_536);
    let handle = StateHandle {
        shared: Arc::new(RwLock::new(State::new(loaded, &config, security.token_key))),
        commands,
        agent_commands,
        job_changes: broadcast::channel(1024).0,
        sched_wakeup: Arc::new(Notify::new()),
    };
    let (flush_sender, flush_receiver) = std::sync::mpsc::channel();
    let db = store.db();
    let flusher = tokio::task::spawn_blocking(move || state::run_flusher(db, flush_receiver));
    let (stop_state_task, stop) = tokio::sync::watch::channel(false);
    let notifiers = state::Notifiers {
        job_changes: handle.job_changes.clone(),
        sched_wakeup: handle.sched_wakeup.clone(),
        stop,
    };
    let mut state_task = tokio::spawn(state::run_state_task(
        handle.shared.clone(),
        notifiers,
        store,
        (agent_inbox, inbox),
        flush_sender,
        wall_clock,
    ));
    let metrics = handle
        .shared
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .metrics
        .clone();
    let sched_task = tokio::spawn(sched_loop::run(handle.clone(), wall_clock, metrics.clone()));
    let liveness_task = tokio::spawn(liveness_ticker(handle.clone(), config.node_timeout));
    background.spawn(notify::run(handle.clone()));
    let reports = reports::Reports {
        state: handle.shared.clone(),
        records: accounting,
    };
    background.spawn(reports.clone().prune_periodically());
    // sled frees the tree nodes its writes replaced only once an epoch of
    // its collector has passed, which takes further sled calls (none come
    // while the pool is quiet): each flush advances the epoch where no
    // thread is inside sled and frees a few expired bags of garbage.
    gpool_agent::memory::return_free_memory_periodically("gpoold-trim", || {
        for _ in 0..SLED_EPOCH_FLUSHES {
            crossbeam_epoch::pin().flush();
        }
    });
    handle.sched_wakeup.notify_one();

    tracing::info!(
        "gpoold listening on {addr} with {n_jobs} jobs in memory (those not ended, and what they need) from {}",
        config.state_dir.display()
    );
    let logs = api::LogRelay::default();
    let reload_task = config
        .path
        .clone()
        .map(|path| tokio::spawn(reload_on_sighup(handle.clone(), security.clone(), path, hangups)));
    let pool = PoolServer::new(api::pool::PoolService {
        state: handle.clone(),
        logs: logs.clone(),
        config_path: config.path.clone(),
        security: security.clone(),
        reports: reports.clone(),
    })
    .max_decoding_message_size(config.max_message_size)
    // Replies (a page of job listings) may be larger than any request.
    .max_encoding_message_size(gpool_proto::MAX_REPLY_BYTES);
    let pool = InterceptedService::new(pool, api::authenticate(security.clone(), handle.shared.clone()));
    let agent_link = AgentLinkServer::new(api::agent_link::AgentLinkService {
        state: handle.clone(),
        next_conn_id: std::sync::atomic::AtomicU64::new(1),
        logs,
        security: security.clone(),
    })
    .max_decoding_message_size(config.max_message_size);
    let agent_link = InterceptedService::new(agent_link, api::authenticate_agent(security.clone()));
    let mut accept_tasks = tokio::task::JoinSet::new();
    let unix_listener = config.socket.as_deref().map(security::listen::bind_unix).transpose()?;
    match (&tls, config.dev) {
        (Some(_), _) => tracing::info!("TCP listener: TLS; agents need client certificates of the cluster CA"),
        (None, _) if !config.insecure_plaintext => {
            tracing::warn!("TCP listener: plaintext on loopback only; callers are known by their socket's uid")
        }
        (None, _) => tracing::warn!(
            "TCP listener: PLAINTEXT (insecure_plaintext) from {:?}: nothing is encrypted and agents are not authenticated",
            config.plaintext_from
        ),
    }
    let mut dev_agent_tasks = tokio::task::JoinSet::new();
    // On shutdown the server stops accepting and lets open requests finish;
    // clients that keep connections open get SHUTDOWN_GRACE, no more.
    let (stopping_sender, stopping) = tokio::sync::watch::channel(false);
    let stopping_sender_for_agents = stopping_sender.clone();
    let shutdown = async move {
        shutdown.await;
        let _ = stopping_sender.send(true);
    };
    if let Some(dev_agents) = &config.dev_agents {
        for agent_config in dev_agent_configs(dev_agents, &config.state_dir, &addr.to_string()) {
            let mut stopping = stopping.clone();
            let shutdown = async move {
                let _ = stopping.wait_for(|stopping| *stopping).await;
            };
            dev_agent_tasks.spawn(async move {
                if let Err(err) = gpool_agent::run(agent_config, shutdown).await {
                    tracing::error!("dev agent: {err:#}");
                }
            });
        }
    }
    if let Some(metrics_addr) = config.metrics_listen {
        let listener = tokio::net::TcpListener::bind(metrics_addr)
            .await
            .with_context(|| format!("metrics_listen: cannot bind {metrics_addr}"))?;
        let bound = listener.local_addr()?;
        write_addr_file(&config.state_dir.join(METRICS_ADDR_FILE), &bound.to_string())?;
        tracing::info!("metrics on http://{bound}/metrics");
        background.spawn(metrics::serve(
            listener,
            handle.shared.clone(),
            metrics,
            status_page::StatusPage {
                security: security.clone(),
                reports: reports.clone(),
            },
            stopping.clone(),
        ));
    }
    let mut stopping_for_unix = stopping.clone();
    let unix_served = unix_listener.map(|listener| {
        tracing::info!(
            "local users connect through {}",
            config.socket.as_deref().unwrap_or(Path::new("")).display()
        );
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let shutdown = async move {
            let _ = stopping_for_unix.wait_for(|stopping| *stopping).await;
        };
        tonic::transport::Server::builder()
            .layer(tower::util::MapResponseLayer::new(api::undecodable_is_invalid))
            .add_service(pool.clone())
            .serve_with_incoming_shutdown(incoming, shutdown)
    });
    let router = tonic::transport::Server::builder()
        .layer(tower::util::MapResponseLayer::new(api::undecodable_is_invalid))
        .add_service(pool)
        .add_service(agent_link);
    let served: std::pin::Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>> = match tls {
        Some(tls) => {
            let incoming = security::listen::accept_tls(listener, tls, security.clone(), &mut accept_tasks);
            Box::pin(
                router.serve_with_incoming_shutdown(tokio_stream::wrappers::ReceiverStream::new(incoming), shutdown),
            )
        }
        None => {
            let incoming = security::listen::accept_plain(
                listener,
                config.plaintext_from.clone(),
                config.insecure_plaintext,
                &mut accept_tasks,
            );
            Box::pin(
                router.serve_with_incoming_shutdown(tokio_stream::wrappers::ReceiverStream::new(incoming), shutdown),
            )
        }
    };
    let served = async move {
        match unix_served {
            Some(unix_served) => {
                let (tcp, unix) = tokio::join!(served, unix_served);
                tcp.and(unix)
            }
            None => served.await,
        }
    };
    let mut stopping_for_grace = stopping.clone();
    let grace_over = async move {
        let _ = stopping_for_grace.wait_for(|stopping| *stopping).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    // A store or flusher failure is fatal: memory would run ahead of disk.
    let mut state_task_ended = false;
    let outcome = tokio::select! {
        ended = &mut state_task => {
            state_task_ended = true;
            match ended {
                Ok(Ok(())) => Err(anyhow::anyhow!("the state task stopped")),
                Ok(Err(err)) => Err(anyhow::Error::new(err).context("state store")),
                Err(err) => Err(anyhow::Error::new(err).context("state task")),
            }
        }
        served = served => served.context("gRPC server"),
        () = grace_over => {
            tracing::warn!("clients kept connections open for {SHUTDOWN_GRACE:?} after shutdown; closing them");
            Ok(())
        }
        flushed = flusher => match flushed {
            Ok(Ok(())) => Err(anyhow::anyhow!("the flusher stopped")),
            Ok(Err(err)) => Err(anyhow::Error::new(err).context("state store")),
            Err(err) => Err(anyhow::Error::new(err).context("flusher thread")),
        },
    };
    // The state task finishes what was queued and ends, and with it the
    // flusher (runtime shutdown waits for that blocking thread).
    let _ = stopping_sender_for_agents.send(true);
    while dev_agent_tasks.join_next().await.is_some() {}
    accept_tasks.shutdown().await;
    if let Some(socket) = &config.socket {
        let _ = std::fs::remove_file(socket);
    }
    background.shutdown().await;
    sched_task.abort();
    liveness_task.abort();
    let _ = sched_task.await;
    let _ = liveness_task.await;
    if let Some(reload_task) = reload_task {
        reload_task.abort();
        let _ = reload_task.await;
    }
    drop(handle);
    let _ = stop_state_task.send(true);
    if !state_task_ended {
        if let Ok(Err(err)) = state_task.await {
            tracing::error!("state task: {err}");
        }
    }
    if config.dev {
        // Another dev controller may have written it since.
        let pointer = gpool_proto::dev_address_file();
        if std::fs::read_to_string(&pointer).is_ok_and(|text| text.trim() == addr.to_string()) {
            let _ = std::fs::remove_file(pointer);
        }
    }
    outcome
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
