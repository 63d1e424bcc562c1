//! Prometheus metrics: `GET /metrics` on `metrics_listen`, in the text
//! exposition format (prometheus-client). Gauges are read from the state
//! at each scrape; counters and histograms are kept as things happen (the
//! scheduling loop and the state task record into `Metrics`).

use crate::state::{SharedState, State};
use gpool_core::model::NodeState;
use gpool_core::JobState;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;

mod shares;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

type Labels = Vec<(&'static str, String)>;

/// What is counted as it happens.
#[derive(Clone)]
pub struct Metrics {
    /// Each scheduling cycle's computing time.
    pub cycle_seconds: Histogram,
    /// Each wake-up of the scheduler that found nothing changed since its
    /// last cycle (`gpool_core::sched::cycle_needed`): the time to find it.
    pub unchanged_cycle_seconds: Histogram,
    /// Each flush that made a batch of changes durable (sled's log written
    /// and synced): every acknowledged change waits for one, as etcd's
    /// writes wait for its WAL's fsync.
    pub store_flush_seconds: Histogram,
    /// From submit to start, for each start, by team.
    pub queue_wait_seconds: Family<Labels, Histogram>,
    pub preemptions: Counter,
    /// Preemptions withdrawn in their grace: the GPUs were no longer needed.
    pub rescinded_preemptions: Counter,
    /// Work since the last checkpoint that preemptions threw away.
    pub preempted_gpu_seconds: Counter<f64, AtomicU64>,
    /// Job notifications dropped: the queue to send them was full.
    pub notifications_dropped: Counter,
    /// Plans that broke a scheduling invariant (`sched::invariants`): 0 on
    /// a sound scheduler.
    pub sched_invariant_violations: Counter,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            // 100 us to about 6.5 s.
            cycle_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 17)),
            // 1 us to about 65 ms.
            unchanged_cycle_seconds: Histogram::new(exponential_buckets(0.000_001, 2.0, 17)),
            // 20 us to about 1.3 s.
            store_flush_seconds: Histogram::new(exponential_buckets(0.000_02, 2.0, 17)),
            // 10 ms to about 2 days.
            queue_wait_seconds: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.01, 4.0, 14))),
            preemptions: Counter::default(),
            rescinded_preemptions: Counter::default(),
            preempted_gpu_seconds: Counter::default(),
            notifications_dropped: Counter::default(),
            sched_invariant_violations: Counter::default(),
        }
    }
}

/// The exposition text of everything: the state as it is now, and the
/// counters and histograms so far.
pub fn render(state: &State, metrics: &Metrics) -> String {
    let mut registry = Registry::with_prefix("gpool");
    render_capacity(&mut registry, state);
    render_gpu_samples(&mut registry, state);
    shares::render(&mut registry, state);
    render_jobs_and_teams(&mut registry, state);
    render_usage(&mut registry, state);
    render_power(&mut registry, state);
    register_recorded(&mut registry, metrics);
    let mut text = String::new();
    // Writing to a String cannot fail.
    let _ = encode(&mut text, &registry);
    text
}

/// Registers a family of gauges under `name` and hands it back to be filled.
fn gauge(registry: &mut Registry, name: &str, help: &str) -> Family<Labels, Gauge<f64, AtomicU64>> {
    let family = Family::<Labels, Gauge<f64, AtomicU64>>::default();
    registry.register(name, help, family.clone());
    family
}

/// GPUs by model, pool and state; nodes by state; startable jobs by pool.
fn render_capacity(registry: &mut Registry, state: &State) {
    // GPUs by model, pool and state; nodes by state.
    let gpus = gauge(
        registry,
        "gpus",
        "GPUs by model, pool and state (allocated, idle, unavailable: on nodes down, drained or draining)",
    );
    let nodes = gauge(registry, "nodes", "Nodes by state");
    let startable = gauge(
        registry,
        "startable_jobs",
        "Jobs of 1, 2, 4 or 8 GPUs (gpus=node: whole-node gangs) that could start now on each pool's free GPUs",
    );
    let mut startable_by_pool: std::collections::BTreeMap<String, gpool_core::fragmentation::Startable> = state
        .policy
        .pools
        .iter()
        .map(|pool| (pool.name.clone(), Default::default()))
        .collect();
    let holders = state.gpu_holders();
    for node in state.nodes.values() {
        let n_busy = node
            .gpus
            .iter()
            .filter(|gpu| holders.contains_key(&(node.name.as_str(), gpu.index)))
            .count();
        let node_state = node.state(n_busy);
        let available = node_state == NodeState::Up;
        nodes
            .get_or_create(&vec![("state", node_state_name(node_state).to_string())])
            .inc();
        let pools: Vec<String> = state
            .policy
            .pools
            .iter()
            .filter(|pool| pool.selects(&node.labels))
            .map(|pool| pool.name.clone())
            .collect();
        if available {
            let free = node
                .gpus_in_service()
                .filter(|gpu| !holders.contains_key(&(node.name.as_str(), gpu.index)))
                .count() as u32;
            for pool in &pools {
                if let Some(counts) = startable_by_pool.get_mut(pool) {
                    counts.add_node(free, node.gpus.len() as u32);
                }
            }
        }
        for gpu in &node.gpus {
            let in_service = available && !node.gpus_out.contains_key(&gpu.index);
            let gpu_state = match (holders.contains_key(&(node.name.as_str(), gpu.index)), in_service) {
                (true, _) => "allocated",
                (false, true) => "idle",
                (false, false) => "unavailable",
            };
            for pool in &pools {
                gpus.get_or_create(&vec![
                    ("model", gpu.model.to_string()),
                    ("pool", pool.clone()),
                    ("state", gpu_state.to_string()),
                ])
                .inc();
            }
        }
    }

    set_startable(&startable, &startable_by_pool);
}

/// `[[power]]` groups: nodes by power state, resumes and their failures,
/// whether each group is paused, and what its up nodes cost an hour.
fn render_power(registry: &mut Registry, state: &State) {
    if state.power.groups.is_empty() {
        return;
    }
    let nodes = gauge(
        registry,
        "power_nodes",
        "Nodes of [[power]] groups by group and power state",
    );
    let resumes = gauge(
        registry,
        "power_resumes",
        "Nodes resumed by each [[power]] group since gpoold started",
    );
    let failed = gauge(
        registry,
        "power_resume_failures",
        "Resumes of each [[power]] group that failed (program or timeout) since gpoold started",
    );
    let paused = gauge(
        registry,
        "power_group_paused",
        "1 while a [[power]] group is paused after failed resumes",
    );
    let cost = gauge(
        registry,
        "power_cost_per_hour",
        "What the GPUs of each [[power]] group's up nodes cost an hour, at its price_per_gpu_hour",
    );
    let hours = gauge(
        registry,
        "power_gpu_hours",
        "GPU-hours each [[power]] group's nodes were awake this [sharing] period (since gpoold started, if later)",
    );
    let now = crate::wall_clock();
    for (index, group) in state.power.groups.iter().enumerate() {
        let labels = |extra: Option<(&'static str, String)>| {
            let mut labels = vec![("group", group.name.clone())];
            labels.extend(extra);
            labels
        };
        let mut up = 0u32;
        for power_state in gpool_core::power::PowerState::ALL {
            let count = state
                .power
                .nodes
                .values()
                .filter(|node| node.group == index && node.state == power_state)
                .count();
            if power_state != gpool_core::power::PowerState::PoweredDown {
                up += count as u32;
            }
            nodes
                .get_or_create(&labels(Some(("state", power_state.as_str().to_string()))))
                .set(count as f64);
        }
        let standing = &state.power.states[index];
        resumes.get_or_create(&labels(None)).set(standing.n_resumes as f64);
        hours.get_or_create(&labels(None)).set(standing.gpu_ms / 3_600_000.0);
        failed.get_or_create(&labels(None)).set(standing.n_failed as f64);
        let is_paused = state.power.paused(index, now).is_some();
        paused.get_or_create(&labels(None)).set(f64::from(u8::from(is_paused)));
        cost.get_or_create(&labels(None))
            .set(f64::from(up) * f64::from(group.gpus) * group.price_per_gpu_hour);
    }
}

/// Sets the startable-jobs gauges from each pool's counts.
fn set_startable(
    startable: &Family<Labels, Gauge<f64, AtomicU64>>,
    startable_by_pool: &BTreeMap<String, gpool_core::fragmentation::Startable>,
) {
    for (pool, counts) in startable_by_pool {
        let sizes = gpool_core::fragmentation::SIZES.iter().map(u32::to_string);
        for (size, count) in sizes
            .chain(["node".to_string()])
            .zip(counts.jobs.iter().chain([&counts.whole_nodes]))
        {
            startable
                .get_or_create(&vec![("pool", pool.clone()), ("gpus", size)])
                .set(*count as f64);
        }
    }
}

/// Each GPU's latest heartbeat sample.
fn render_gpu_samples(registry: &mut Registry, state: &State) {
    // Each GPU's latest heartbeat sample.
    let utilization = gauge(
        registry,
        "gpu_utilization_ratio",
        "GPU utilisation (0 to 1), latest sample",
    );
    let memory = gauge(registry, "gpu_memory_used_bytes", "GPU memory in use, latest sample");
    let temperature = gauge(registry, "gpu_temperature_celsius", "GPU temperature, latest sample");
    let power = gauge(registry, "gpu_power_watts", "GPU power draw, latest sample");
    let ecc = gauge(
        registry,
        "gpu_ecc_errors",
        "Volatile ECC errors of a GPU since its driver loaded (kind: corrected, uncorrected), latest sample",
    );
    for (node_name, samples) in &state.gpu_samples {
        let Some(node) = state.nodes.get(node_name) else {
            continue;
        };
        for sample in samples {
            let model = node
                .gpus
                .iter()
                .find(|gpu| gpu.index == sample.index)
                .map_or_else(String::new, |gpu| gpu.model.to_string());
            let labels = vec![
                ("node", node_name.clone()),
                ("index", sample.index.to_string()),
                ("model", model),
            ];
            utilization
                .get_or_create(&labels)
                .set(f64::from(sample.utilization_pct) / 100.0);
            memory
                .get_or_create(&labels)
                .set(sample.memory_used_mib as f64 * 1024.0 * 1024.0);
            temperature.get_or_create(&labels).set(f64::from(sample.temperature_c));
            power.get_or_create(&labels).set(f64::from(sample.power_w));
            for (kind, count) in [
                ("corrected", sample.ecc_corrected),
                ("uncorrected", sample.ecc_uncorrected),
            ] {
                let mut labels = labels.clone();
                labels.push(("kind", kind.to_string()));
                ecc.get_or_create(&labels).set(count as f64);
            }
        }
    }
}

/// Jobs that have not ended, GPUs in use, stragglers and guarantees, by team.
fn render_jobs_and_teams(registry: &mut Registry, state: &State) {
    // Jobs that have not ended, by state and team, and GPUs in use by team.
    let jobs = gauge(registry, "jobs", "Pending and running jobs by state and team");
    let team_gpus = gauge(
        registry,
        "team_gpus_in_use",
        "GPUs running attempts hold, by team and ledger (guaranteed or burst)",
    );
    let mut by_team: BTreeMap<(String, &'static str), f64> = BTreeMap::new();
    for job in state.active_jobs() {
        jobs.get_or_create(&vec![
            ("state", job.state.name().to_string()),
            ("team", job.spec.team.to_string()),
        ])
        .inc();
        if let JobState::Running { placement, burst, .. } = &job.state {
            let n: usize = placement.iter().map(|part| part.gpu_indices.len()).sum();
            let ledger = if *burst { "burst" } else { "guaranteed" };
            *by_team.entry((job.spec.team.to_string(), ledger)).or_default() += n as f64;
        }
    }
    for ((team, ledger), n) in by_team {
        team_gpus
            .get_or_create(&vec![("team", team), ("ledger", ledger.to_string())])
            .set(n);
    }
    let in_memory = Gauge::<f64, AtomicU64>::default();
    registry.register(
        "jobs_in_memory",
        "Job records gpoold holds in memory: those not ended, and ended ones they still need (the rest are read from disk)",
        in_memory.clone(),
    );
    in_memory.set(state.jobs.len() as f64);
    let stragglers = gauge(
        registry,
        "straggler_gpus",
        "GPUs of running jobs that have lagged far behind their job's other GPUs for straggler_after, by team",
    );
    // Every team with running work or a configuration has a value (0
    // without stragglers), so that the series exists before the first.
    let teams = state
        .policy
        .sharing
        .teams
        .iter()
        .map(|team| team.name.clone())
        .chain(state.running_jobs().into_iter().map(|job| job.team));
    for team in teams {
        stragglers.get_or_create(&vec![("team", team)]).set(0.0);
    }
    for (id, attempt) in state.attempts() {
        if let Some(job) = state.jobs.get(&id) {
            stragglers
                .get_or_create(&vec![("team", job.spec.team.to_string())])
                .inc_by(attempt.stragglers.len() as f64);
        }
    }
    let guaranteed = gauge(
        registry,
        "team_guaranteed_gpus",
        "Each configured team's guaranteed GPUs",
    );
    for team in &state.policy.sharing.teams {
        guaranteed
            .get_or_create(&vec![("team", team.name.clone())])
            .set(f64::from(team.guaranteed_gpus));
    }
}

/// Each team's GPU-hours this period against its budget, and its fair share.
fn render_usage(registry: &mut Registry, state: &State) {
    // Each team's GPU-hours this period against its budget, and its fair
    // share, as `gpool usage` reports them.
    let report = state.usage_report(crate::wall_clock());
    let gpu_hours = gauge(
        registry,
        "team_gpu_hours",
        "GPU-hours this budget period, by team and ledger (guaranteed or burst), running attempts included",
    );
    let budget = gauge(
        registry,
        "team_gpu_hours_budget",
        "Each team's GPU-hours budget per period",
    );
    let budget_left = gauge(
        registry,
        "team_gpu_hours_budget_left",
        "GPU-hours left of each team's budget",
    );
    let fair_share = gauge(registry, "team_fair_share", "Each team's fair-share factor (0 to 1)");
    for team in report {
        let labels = |ledger: &str| vec![("team", team.team.clone()), ("ledger", ledger.to_string())];
        gpu_hours
            .get_or_create(&labels("guaranteed"))
            .set(team.guaranteed_gpu_hours);
        gpu_hours.get_or_create(&labels("burst")).set(team.burst_gpu_hours);
        let labels = vec![("team", team.team.clone())];
        if let Some(hours) = team.gpu_hours_budget {
            budget.get_or_create(&labels).set(hours as f64);
        }
        if let Some(hours) = team.budget_left_gpu_hours {
            budget_left.get_or_create(&labels).set(hours);
        }
        fair_share.get_or_create(&labels).set(team.fair_share);
    }
}

/// The counters and histograms recorded as things happened.
fn register_recorded(registry: &mut Registry, metrics: &Metrics) {
    registry.register(
        "scheduling_cycle_seconds",
        "Time each scheduling cycle took to compute",
        metrics.cycle_seconds.clone(),
    );
    registry.register(
        "scheduling_unchanged_seconds",
        "Time each scheduler wake-up that found nothing changed since its last cycle took (no cycle ran)",
        metrics.unchanged_cycle_seconds.clone(),
    );
    registry.register(
        "store_flush_seconds",
        "Time each flush took to make a batch of changes durable; every acknowledged change waits for one",
        metrics.store_flush_seconds.clone(),
    );
    registry.register(
        "queue_wait_seconds",
        "Time from submit to start, at each start, by team",
        metrics.queue_wait_seconds.clone(),
    );
    registry.register("preemptions", "Attempts preempted", metrics.preemptions.clone());
    registry.register(
        "notifications_dropped",
        "Job notifications dropped because the queue to send them was full",
        metrics.notifications_dropped.clone(),
    );
    registry.register(
        "sched_invariant_violations",
        "Scheduling plans that broke an invariant (a GPU given twice or out of service, a victim that may not be taken, a job waiting on more victims than it has GPUs); 0 on a sound scheduler",
        metrics.sched_invariant_violations.clone(),
    );
    registry.register(
        "rescinded_preemptions",
        "Preemptions withdrawn in their grace, their GPUs no longer needed: the attempt ran on",
        metrics.rescinded_preemptions.clone(),
    );
    registry.register(
        "preempted_gpu_seconds",
        "GPU-seconds of work since the last checkpoint that preemptions threw away",
        metrics.preempted_gpu_seconds.clone(),
    );
}

fn node_state_name(state: NodeState) -> &'static str {
    match state {
        NodeState::Up => "up",
        NodeState::Draining => "draining",
        NodeState::Drained => "drained",
        NodeState::Down => "down",
    }
}

/// Serves `GET /metrics` (anything else: 404) on `listener` until
/// `shutdown`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    shared: SharedState,
    metrics: Arc<Metrics>,
    status_page: crate::status_page::StatusPage,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) {
    // Connections are owned: they end with the listener.
    let mut connections = tokio::task::JoinSet::new();
    loop {
        while connections.try_join_next().is_some() {}
        if *shutdown.borrow() {
            return;
        }
        let (stream, remote) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    tracing::warn!("metrics listener: {err}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
            changed = shutdown.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        connections.spawn(serve_connection(
            stream,
            remote,
            shared.clone(),
            metrics.clone(),
            status_page.clone(),
        ));
    }
}

/// Serves one connection's requests until it closes.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    remote: std::net::SocketAddr,
    shared: SharedState,
    metrics: Arc<Metrics>,
    status_page: crate::status_page::StatusPage,
) {
    // The owner of a loopback peer's socket is who the status page
    // shows itself to, as the API does.
    let connection = crate::security::loopback::PlainTcp::new(stream, remote);
    let local_uid = connection.info.local_uid;
    let service = hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
        let (shared, metrics, status_page) = (shared.clone(), metrics.clone(), status_page.clone());
        answer_request(request, shared, metrics, status_page, local_uid, remote)
    });
    let io = hyper_util::rt::TokioIo::new(connection.stream);
    if let Err(err) = hyper::server::conn::http1::Builder::new()
        .serve_connection(io, service)
        .await
    {
        tracing::debug!("metrics connection: {err}");
    }
}

/// The answer to one request: the status page, the metrics, or 404.
async fn answer_request(
    request: hyper::Request<hyper::body::Incoming>,
    shared: SharedState,
    metrics: Arc<Metrics>,
    status_page: crate::status_page::StatusPage,
    local_uid: Option<u32>,
    remote: std::net::SocketAddr,
) -> Result<hyper::Response<http_body_util::Full<hyper::body::Bytes>>, hyper::http::Error> {
    use http_body_util::Full;
    use hyper::body::Bytes;
    let path = request.uri().path();
    if request.method() == hyper::Method::GET && (path == "/status" || path == "/") {
        let header = |name: &str| request.headers().get(name).and_then(|value| value.to_str().ok());
        let answer = status_page
            .answer(
                request.uri().query(),
                local_uid,
                header("authorization"),
                header("cookie"),
                &remote.to_string(),
            )
            .await;
        let mut response = hyper::Response::builder().status(answer.status);
        for (name, value) in answer.headers {
            response = response.header(name, value);
        }
        return response.body(Full::new(Bytes::from(answer.body)));
    }
    let response = if request.method() == hyper::Method::GET && path == "/metrics" {
        let text = {
            let state = shared.read().unwrap_or_else(|poisoned| poisoned.into_inner());
            render(&state, &metrics)
        };
        hyper::Response::builder()
            .header(
                "content-type",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )
            .body(Full::new(Bytes::from(text)))
    } else {
        hyper::Response::builder()
            .status(hyper::StatusCode::NOT_FOUND)
            .body(Full::new(Bytes::from_static(
                b"gpoold serves /metrics and /status here\n",
            )))
    };
    response
}
