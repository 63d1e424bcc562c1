//! The phases of `run`: starting the state task and the loops around it,
//! serving the API, waiting for the end, and stopping.

use super::*;

/// The state task, the tasks that feed it, and what the services share.
pub(crate) struct Core {
    pub(crate) handle: StateHandle,
    pub(crate) flusher: tokio::task::JoinHandle<Result<(), error::Error>>,
    pub(crate) stop_state_task: tokio::sync::watch::Sender<bool>,
    pub(crate) state_task: tokio::task::JoinHandle<Result<(), error::Error>>,
    pub(crate) sched_task: tokio::task::JoinHandle<()>,
    pub(crate) liveness_task: tokio::task::JoinHandle<()>,
    pub(crate) metrics: Arc<metrics::Metrics>,
    pub(crate) reports: reports::Reports,
    /// With `[ha]`: this controller's leadership, which `Controllers` asks
    /// etcd about.
    pub(crate) leadership: Option<Arc<crate::ha::Leadership>>,
    /// When each interactive job last heard from its client.
    pub(crate) attached: Arc<api::sessions::Attached>,
}

/// Points the CLI at this dev controller, unless another one already
/// answers.
pub(crate) fn point_dev_address(addr: std::net::SocketAddr) {
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

/// Starts the state task and its flusher, then the scheduling loop, the
/// liveness ticker, notifications and pruning (those last in `background`).
pub(crate) fn start_core(
    store: state::store::Store,
    loaded: state::store::Loaded,
    config: &Config,
    security: &security::Security,
    accounting: state::store::Accounting,
    background: &mut tokio::task::JoinSet<()>,
) -> Core {
    let (commands, inbox) = mpsc::channel(65_536);
    let (agent_commands, agent_inbox) = mpsc::channel(65_536);
    let handle = StateHandle {
        shared: Arc::new(RwLock::new(State::new(loaded, config, security.token_key))),
        commands,
        agent_commands,
        job_changes: broadcast::channel(1024).0,
        sched_wakeup: Arc::new(Notify::new()),
    };
    let (stop_state_task, stop) = tokio::sync::watch::channel(false);
    let notifiers = state::Notifiers {
        job_changes: handle.job_changes.clone(),
        sched_wakeup: handle.sched_wakeup.clone(),
        stop,
    };
    let metrics = handle
        .shared
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .metrics
        .clone();
    let (flush_sender, flush_receiver) = std::sync::mpsc::channel();
    let (db, flush_took) = (store.db(), metrics.store_flush_seconds.clone());
    let flusher = tokio::task::spawn_blocking(move || state::run_flusher(db, flush_receiver, flush_took));
    let state_task = tokio::spawn(state::run_state_task(
        handle.shared.clone(),
        notifiers,
        store,
        (agent_inbox, inbox),
        flush_sender,
        wall_clock,
    ));
    let sched_task = tokio::spawn(sched_loop::run(handle.clone(), wall_clock, metrics.clone()));
    let liveness_task = tokio::spawn(liveness_ticker(handle.clone(), config.node_timeout));
    background.spawn(notify::run(handle.clone(), metrics.clone()));
    let attached = Arc::new(api::sessions::Attached::default());
    background.spawn(api::sessions::reap(
        handle.clone(),
        attached.clone(),
        config.detach_grace,
    ));
    background.spawn(power::run(handle.clone(), config.state_dir.join("power")));
    let reports = reports::Reports {
        state: handle.shared.clone(),
        records: accounting,
    };
    background.spawn(reports.clone().prune_periodically());
    return_sled_memory_periodically();
    handle.sched_wakeup.notify_one();
    Core {
        handle,
        flusher,
        stop_state_task,
        state_task,
        sched_task,
        liveness_task,
        metrics,
        reports,
        leadership: None,
        attached,
    }
}

/// Frees the memory sled no longer needs, now and then.
fn return_sled_memory_periodically() {
    // sled frees the tree nodes its writes replaced only once an epoch of
    // its collector has passed, which takes further sled calls (none come
    // while the pool is quiet): each flush advances the epoch where no
    // thread is inside sled and frees a few expired bags of garbage.
    gpool_agent::memory::return_free_memory_periodically("gpoold-trim", || {
        for _ in 0..SLED_EPOCH_FLUSHES {
            crossbeam_epoch::pin().flush();
        }
    });
}

/// Builds the API services and serves them on `listener` (and the local
/// socket) until `shutdown`; starts the dev agents and the metrics
/// listener on the way. The future that serves.
pub(crate) async fn serve(
    config: &Config,
    core: &Core,
    security: &Arc<security::Security>,
    (listener, addr, tls): (
        Arc<tokio::net::TcpListener>,
        std::net::SocketAddr,
        Option<Arc<rustls::ServerConfig>>,
    ),
    (stopping, shutdown): (
        &tokio::sync::watch::Receiver<bool>,
        impl Future<Output = ()> + Send + 'static,
    ),
    (accept_tasks, dev_agent_tasks, background): (
        &mut tokio::task::JoinSet<()>,
        &mut tokio::task::JoinSet<()>,
        &mut tokio::task::JoinSet<()>,
    ),
) -> anyhow::Result<impl Future<Output = Result<(), tonic::transport::Error>>> {
    let (pool, agent_link) = api_services(config, core, security, (addr, stopping));
    let unix_listener = config.socket.as_deref().map(security::listen::bind_unix).transpose()?;
    log_tcp_security(config, tls.is_some());
    if let Some(dev_agents) = &config.dev_agents {
        spawn_dev_agents(dev_agents, &config.state_dir, addr, stopping, dev_agent_tasks);
    }
    if let Some(metrics_addr) = config.metrics_listen {
        serve_metrics(metrics_addr, config, core, security, stopping, background).await?;
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
    let served = security::listen::serve_tcp(
        router,
        config,
        (listener, tls, Some(security.clone())),
        shutdown,
        accept_tasks,
    );
    Ok(async move {
        match unix_served {
            Some(unix_served) => {
                let (tcp, unix) = tokio::join!(served, unix_served);
                tcp.and(unix)
            }
            None => served.await,
        }
    })
}

/// What checks a request's credentials before a service sees it.
trait Authenticate: Fn(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Clone {}

impl<F: Fn(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Clone> Authenticate for F {}

/// The API's services: the pool's, for callers, and the agents' links.
fn api_services(
    config: &Config,
    core: &Core,
    security: &Arc<security::Security>,
    (addr, stopping): (std::net::SocketAddr, &tokio::sync::watch::Receiver<bool>),
) -> (
    api::open_leader::OpenLeader<InterceptedService<PoolServer<api::pool::PoolService>, impl Authenticate>>,
    InterceptedService<AgentLinkServer<api::agent_link::AgentLinkService>, impl Authenticate>,
) {
    let (handle, reports) = (&core.handle, &core.reports);
    let logs = api::LogRelay::default();
    let pool = PoolServer::new(api::pool::PoolService {
        state: handle.clone(),
        logs: logs.clone(),
        config_path: config.path.clone(),
        security: security.clone(),
        reports: reports.clone(),
        leadership: core.leadership.clone(),
        listen: addr.to_string(),
        watches: Default::default(),
        attached: core.attached.clone(),
    })
    .max_decoding_message_size(config.max_message_size)
    // Replies (a page of job listings) may be larger than any request.
    .max_encoding_message_size(gpool_proto::MAX_REPLY_BYTES);
    let pool = api::open_leader::OpenLeader {
        authenticated: InterceptedService::new(
            pool.clone(),
            api::authenticate(security.clone(), handle.shared.clone()),
        ),
        open: pool,
    };
    let agent_link = AgentLinkServer::new(api::agent_link::AgentLinkService {
        state: handle.clone(),
        next_conn_id: std::sync::atomic::AtomicU64::new(1),
        logs,
        security: security.clone(),
        stopping: stopping.clone(),
    })
    .max_decoding_message_size(config.max_message_size);
    let agent_link = InterceptedService::new(agent_link, api::authenticate_agent(security.clone()));
    (pool, agent_link)
}

/// Logs how the TCP listener is secured.
fn log_tcp_security(config: &Config, tls: bool) {
    match (tls, config.dev) {
        (true, _) => tracing::info!("TCP listener: TLS; agents need client certificates of the cluster CA"),
        (false, _) if !config.insecure_plaintext => {
            tracing::warn!("TCP listener: plaintext on loopback only; callers are known by their socket's uid")
        }
        (false, _) => tracing::warn!(
            "TCP listener: PLAINTEXT (insecure_plaintext) from {:?}: nothing is encrypted and agents are not authenticated",
            config.plaintext_from
        ),
    }
}

/// Starts `gpoold --dev`'s in-process agents, each until `stopping`.
fn spawn_dev_agents(
    dev_agents: &config::DevAgents,
    state_dir: &Path,
    addr: std::net::SocketAddr,
    stopping: &tokio::sync::watch::Receiver<bool>,
    dev_agent_tasks: &mut tokio::task::JoinSet<()>,
) {
    for agent_config in dev_agent_configs(dev_agents, state_dir, &addr.to_string()) {
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

/// Binds `metrics_listen`, records its address, and serves the metrics and
/// status page there (in `background`).
async fn serve_metrics(
    metrics_addr: std::net::SocketAddr,
    config: &Config,
    core: &Core,
    security: &Arc<security::Security>,
    stopping: &tokio::sync::watch::Receiver<bool>,
    background: &mut tokio::task::JoinSet<()>,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind(metrics_addr)
        .await
        .with_context(|| format!("metrics_listen: cannot bind {metrics_addr}"))?;
    let bound = listener.local_addr()?;
    write_addr_file(&config.state_dir.join(METRICS_ADDR_FILE), &bound.to_string())?;
    tracing::info!("metrics on http://{bound}/metrics");
    background.spawn(metrics::serve(
        listener,
        core.handle.shared.clone(),
        core.metrics.clone(),
        status_page::StatusPage {
            security: security.clone(),
            reports: core.reports.clone(),
        },
        stopping.clone(),
    ));
    Ok(())
}

/// Waits for the end: the state task or flusher failing, the server
/// stopping, or the grace after shutdown running out. Also says whether the
/// state task ended.
pub(crate) async fn until_end(
    state_task: &mut tokio::task::JoinHandle<Result<(), error::Error>>,
    served: impl Future<Output = Result<(), tonic::transport::Error>>,
    grace_over: impl Future<Output = ()>,
    flusher: &mut tokio::task::JoinHandle<Result<(), error::Error>>,
) -> (anyhow::Result<()>, bool) {
    // A store or flusher failure is fatal: memory would run ahead of disk.
    let mut state_task_ended = false;
    let outcome = tokio::select! {
        ended = state_task => {
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
    (outcome, state_task_ended)
}

/// The tasks `run` holds besides the core's, ended on shutdown.
pub(crate) struct Tasks {
    pub(crate) accept: tokio::task::JoinSet<()>,
    pub(crate) dev_agents: tokio::task::JoinSet<()>,
    pub(crate) background: tokio::task::JoinSet<()>,
    pub(crate) reload: Option<tokio::task::JoinHandle<()>>,
}

/// Stops everything in order once the server has stopped: the dev agents,
/// the listeners, the background tasks and loops, then the state task.
pub(crate) async fn shut_down(
    core: Core,
    state_task_ended: bool,
    mut tasks: Tasks,
    stopping_sender_for_agents: tokio::sync::watch::Sender<bool>,
    config: &Config,
    addr: std::net::SocketAddr,
) {
    // The state task finishes what was queued and ends, and with it the
    // flusher (runtime shutdown waits for that blocking thread).
    let _ = stopping_sender_for_agents.send(true);
    while tasks.dev_agents.join_next().await.is_some() {}
    tasks.accept.shutdown().await;
    if let Some(socket) = &config.socket {
        let _ = std::fs::remove_file(socket);
    }
    tasks.background.shutdown().await;
    let Core {
        handle,
        stop_state_task,
        state_task,
        sched_task,
        liveness_task,
        ..
    } = core;
    sched_task.abort();
    liveness_task.abort();
    let _ = sched_task.await;
    let _ = liveness_task.await;
    if let Some(reload_task) = tasks.reload {
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
        forget_dev_address(addr);
    }
}

/// Removes the dev address pointer if it is still this controller's.
fn forget_dev_address(addr: std::net::SocketAddr) {
    // Another dev controller may have written it since.
    let pointer = gpool_proto::dev_address_file();
    if std::fs::read_to_string(&pointer).is_ok_and(|text| text.trim() == addr.to_string()) {
        let _ = std::fs::remove_file(pointer);
    }
}
