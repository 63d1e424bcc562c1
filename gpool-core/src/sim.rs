//! A discrete-event simulator that replays a trace of jobs through the
//! scheduler gpoold runs (`sched::schedule`), on a virtual clock, under
//! several policies on the same cluster: each team on its own dedicated
//! GPUs, one first-come-first-served pool with backfill, and gpool's
//! sharing (guarantees, burst work, preemption with checkpoints).
//!
//! Pure and deterministic: the same trace, cluster and policy give the
//! same outcome, byte for byte. Wall-clock time (the scheduler's own cost
//! per cycle) is the caller's to measure, through `Observer`.

mod cluster;
mod engine;
mod outcome;
pub mod trace;

pub use cluster::Cluster;
pub use engine::{simulate, Observer, Options, PowerOutcome, Quiet};
pub use outcome::{
    AttemptRecord, Dist, EndState, EventKind, EventRecord, Outcome, Series, ShapeCount, TeamOutcome, MAX_SERIES_POINTS,
};
pub use trace::{Format, OnSignal, TraceJob};

use crate::model::{GpuModel, PoolDef};
use crate::policy::{Qos, Sharing, Team, Weights};
use crate::sched::{NodeView, Policy};
use std::collections::BTreeMap;

/// One policy on one cluster, ready to replay a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Setup {
    pub name: String,
    pub nodes: Vec<NodeView>,
    pub policy: Policy,
    /// The pool a team's jobs go to (its dedicated partition); a team not
    /// listed uses the default pool.
    pub team_pools: BTreeMap<String, String>,
    /// Each team's guaranteed GPUs, against which its share is measured
    /// (the same under every policy compared).
    pub guarantees: BTreeMap<String, u32>,
    /// Groups of nodes that sleep until jobs need them (`with_power`).
    pub power: Vec<crate::power::Group>,
    /// Fractions of a GPU in the trace run on whole GPUs, rounded up (as
    /// where GPUs are not shared).
    pub whole_fractions: bool,
}

/// `setup` with the nodes of `group` too, asleep at the start: they wake
/// when jobs wait for them, and sleep again when idle.
pub fn with_power(mut setup: Setup, mut group: crate::power::Group, resume_delay_secs: u64) -> Setup {
    // A node takes `resume_delay_secs` to come up here: never a failure.
    group.resume_timeout_secs = group.resume_timeout_secs.max(resume_delay_secs + 60);
    for name in &group.nodes {
        let mut node = NodeView::from_node(&group.node_as_registered(name), &[]);
        node.availability = crate::sched::Availability::Down;
        // The simulator's nodes have no agent: they enforce every limit.
        node.enforces = crate::enforce::LimitSet::ALL;
        setup.nodes.push(node);
    }
    setup.power.push(group);
    setup
}

/// GPU-milliseconds each team asks for in the trace.
fn demand(jobs: &[TraceJob]) -> BTreeMap<String, f64> {
    let mut demand: BTreeMap<String, f64> = BTreeMap::new();
    for job in jobs {
        *demand.entry(job.team.clone()).or_default() += job.duration_ms as f64 * job.total_gpus() as f64;
    }
    demand
}

/// `total` split in proportion to `weights` (largest remainder, ties by
/// name), each entry at least `floor` where `total` allows.
fn apportion(weights: &BTreeMap<String, f64>, total: u64, floor: u64) -> BTreeMap<String, u64> {
    let sum: f64 = weights.values().sum();
    if sum <= 0.0 || weights.is_empty() {
        return weights.keys().map(|k| (k.clone(), 0)).collect();
    }
    let exact: Vec<(&String, f64)> = weights.iter().map(|(k, w)| (k, w / sum * total as f64)).collect();
    let mut shares: BTreeMap<String, u64> = exact.iter().map(|(k, x)| ((*k).clone(), x.floor() as u64)).collect();
    let mut left = total.saturating_sub(shares.values().sum());
    let mut by_remainder: Vec<&(&String, f64)> = exact.iter().collect();
    by_remainder.sort_by(|a, b| (b.1 - b.1.floor()).total_cmp(&(a.1 - a.1.floor())).then(a.0.cmp(b.0)));
    for (name, _) in by_remainder {
        if left == 0 {
            break;
        }
        *shares.get_mut(*name).unwrap_or(&mut 0) += 1;
        left -= 1;
    }
    // Raise entries under the floor, taking from the largest.
    let names: Vec<String> = shares.keys().cloned().collect();
    for name in names {
        while shares[&name] < floor {
            let Some((largest, _)) = shares
                .iter()
                .filter(|(_, n)| **n > floor)
                .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
                .map(|(k, n)| (k.clone(), *n))
            else {
                break;
            };
            *shares.entry(largest).or_default() -= 1;
            *shares.entry(name.clone()).or_default() += 1;
        }
    }
    shares
}

/// Each team's guarantee in proportion to the GPU-hours it asks for in the
/// trace, all together the cluster's GPUs.
pub fn guarantees_by_demand(jobs: &[TraceJob], gpus: u64) -> BTreeMap<String, u32> {
    apportion(&demand(jobs), gpus, 0)
        .into_iter()
        .map(|(team, n)| (team, n.min(u64::from(u32::MAX)) as u32))
        .collect()
}

/// Priority by submit time only (first come, first served).
fn fifo_weights() -> Weights {
    Weights {
        qos: 0.0,
        fair_share: 0.0,
        age: 1_000_000.0,
        size: 0.0,
        max_age_secs: 10 * 365 * 24 * 3600,
    }
}

/// One pool, first come first served with backfill: no teams, nothing
/// preempted.
pub fn fifo(cluster: &Cluster, guarantees: &BTreeMap<String, u32>) -> Setup {
    let mut policy = Policy::default();
    policy.sharing.weights = fifo_weights();
    policy.sharing.las = None;
    Setup {
        whole_fractions: false,
        power: Vec::new(),
        name: "fifo".into(),
        nodes: cluster.nodes.clone(),
        policy,
        team_pools: BTreeMap::new(),
        guarantees: guarantees.clone(),
    }
}

/// gpool's sharing with the given teams' guarantees, as a site would start
/// with: shares in proportion to the guarantees, least-attained-service
/// order within each team (`Las::default`), burst work preemptible after
/// 10 minutes with a 2-minute grace, and at most 2% of the GPUs' time per
/// hour thrown away by preemption.
pub fn sharing_policy(cluster: &Cluster, guarantees: &BTreeMap<String, u32>) -> Policy {
    Policy {
        sharing: Sharing {
            teams: guarantees
                .iter()
                .map(|(name, gpus)| Team {
                    shares: (*gpus).max(1),
                    guaranteed_gpus: *gpus,
                    ..Team::unlisted(name)
                })
                .collect(),
            qos: vec![Qos {
                min_runtime_secs: 600,
                grace_secs: 120,
                ..Qos::normal()
            }],
            waste_cap_gpu_hours_per_hour: 0.02 * cluster.gpus() as f64,
            ..Sharing::default()
        },
        ..Policy::default()
    }
}

/// gpool's sharing under `policy` (a gpoold.toml's, or `sharing_policy`).
pub fn pooled(name: &str, cluster: &Cluster, policy: Policy, guarantees: &BTreeMap<String, u32>) -> Setup {
    Setup {
        whole_fractions: false,
        power: Vec::new(),
        name: name.into(),
        nodes: cluster.nodes.clone(),
        policy,
        team_pools: BTreeMap::new(),
        guarantees: guarantees.clone(),
    }
}

/// Each team on GPUs of its own, as many as its guarantee times `scale`
/// (at least one), first come first served with backfill within them. The
/// cluster's nodes are handed out in order, whole where a team's share
/// allows, else split between teams; beyond the cluster's size (`scale` >
/// 1), its nodes are repeated.
pub fn dedicated(cluster: &Cluster, guarantees: &BTreeMap<String, u32>, scale: f64) -> Setup {
    let weights: BTreeMap<String, f64> = guarantees.iter().map(|(t, g)| (t.clone(), f64::from(*g))).collect();
    let total = (cluster.gpus() as f64 * scale).round().max(guarantees.len() as f64) as u64;
    let sizes = apportion(&weights, total, 1);
    let mut order: Vec<(&String, &u64)> = sizes.iter().collect();
    order.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let mut nodes = Vec::new();
    let (mut cursor, mut used, mut round) = (0usize, 0usize, 0usize);
    for (team, size) in order {
        let mut need = *size as usize;
        let mut part = 0;
        while need > 0 && !cluster.nodes.is_empty() {
            let source = &cluster.nodes[cursor];
            let take = need.min(source.gpus.len() - used);
            let mut node = source.clone();
            node.gpus = source.gpus[used..used + take].to_vec();
            node.name = format!("{}.{round}.{team}.{part}", source.name);
            node.labels.insert("team".into(), team.clone());
            nodes.push(node);
            part += 1;
            need -= take;
            used += take;
            if used == source.gpus.len() {
                used = 0;
                cursor += 1;
                if cursor == cluster.nodes.len() {
                    cursor = 0;
                    round += 1;
                }
            }
        }
    }
    let mut policy = Policy {
        pools: sizes
            .keys()
            .map(|team| PoolDef {
                name: team.clone(),
                selector: BTreeMap::from([("team".to_string(), team.clone())]),
                defaults: Default::default(),
            })
            .collect(),
        default_pool: sizes.keys().next().cloned().unwrap_or_default(),
        ..Policy::default()
    };
    policy.sharing.weights = fifo_weights();
    policy.sharing.las = None;
    Setup {
        whole_fractions: false,
        power: Vec::new(),
        name: "dedicated".into(),
        nodes,
        policy,
        team_pools: sizes.keys().map(|team| (team.clone(), team.clone())).collect(),
        guarantees: guarantees.clone(),
    }
}

/// How many GPUs dedicated partitions need to match the pooled waits.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Savings {
    /// The pooled mean queueing delay to match, in seconds.
    pub target_mean_delay_secs: f64,
    /// The smallest scale tried whose dedicated mean delay is at most the
    /// target, and its GPUs; `None`: not even at `max_scale`.
    pub scale: Option<f64>,
    pub dedicated_gpus: Option<u64>,
    pub pooled_gpus: u64,
    /// Each scale tried, in the order tried, and why it was not enough.
    pub tried: Vec<SavingsTry>,
    /// What the extra GPUs cost per hour at the given prices (by the
    /// cluster's models, in proportion); `None` without prices.
    pub extra_cost_per_hour: Option<f64>,
}

/// One scale the savings search tried.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct SavingsTry {
    pub scale: f64,
    pub gpus: u64,
    pub mean_wait_secs: f64,
    pub never_started: usize,
    /// Why it does not match the target, in words (the mean wait over it,
    /// jobs that never started, or both); `None`: it matches.
    pub rejected: Option<String>,
}

impl SavingsTry {
    /// What dedicated partitions at `scale` (`gpus` in all) gave, against
    /// the target mean wait.
    pub fn judge(scale: f64, gpus: u64, outcome: &Outcome, target_mean_delay_secs: f64) -> SavingsTry {
        let mean = outcome.queue_delay.mean;
        let mut why = Vec::new();
        if mean > target_mean_delay_secs {
            why.push(format!(
                "mean wait {mean:.0} s over the target {target_mean_delay_secs:.0} s"
            ));
        }
        if outcome.never_started > 0 {
            why.push(format!("{} job(s) never started", outcome.never_started));
        }
        SavingsTry {
            scale,
            gpus,
            mean_wait_secs: mean,
            never_started: outcome.never_started,
            rejected: (!why.is_empty()).then(|| why.join("; ")),
        }
    }

    /// Whether dedicated partitions that gave `outcome` meet the target
    /// mean wait: `judge` rejects nothing.
    pub fn meets(outcome: &Outcome, target_mean_delay_secs: f64) -> bool {
        SavingsTry::judge(0.0, 0, outcome, target_mean_delay_secs)
            .rejected
            .is_none()
    }
}

/// The jobs of `jobs` that no policy could ever start on `cluster` (no
/// node, or not enough nodes, with enough GPUs of a model they accept), by
/// index, with the reason.
pub fn impossible(cluster: &Cluster, jobs: &[TraceJob]) -> Vec<(usize, String)> {
    jobs.iter()
        .enumerate()
        .filter_map(|(idx, job)| {
            let fitting = cluster
                .nodes
                .iter()
                .filter(|node| {
                    let mut by_model: BTreeMap<&GpuModel, u32> = BTreeMap::new();
                    for gpu in node.gpus.iter().filter(|gpu| gpu.model.accepted_by(&job.gpu_types)) {
                        *by_model.entry(&gpu.model).or_default() += 1;
                    }
                    by_model.values().any(|n| *n >= job.gpus_per_node)
                })
                .count();
            (fitting < job.nodes as usize).then(|| {
                let models = if job.gpu_types.is_empty() {
                    "any model".to_string()
                } else {
                    job.gpu_types.iter().map(GpuModel::as_str).collect::<Vec<_>>().join("|")
                };
                (
                    idx,
                    format!(
                        "wants {} GPU(s) of {models} on each of {} node(s); {fitting} node(s) of the cluster have that many",
                        job.gpus_per_node, job.nodes
                    ),
                )
            })
        })
        .collect()
}

/// The scales of the dedicated partitions the savings search tries before
/// it narrows down: from the pool's own size to 8 times it.
pub const SAVINGS_SCALES: [f64; 5] = [1.0, 1.25, 2.5, 5.0, 8.0];

/// A fresh observer for each replay of the savings search, given its
/// scale; the search runs several at once.
pub type ObserveScale<'o> = dyn Fn(f64) -> Box<dyn Observer + Send + 'o> + Sync + 'o;

/// Grows every team's dedicated partition by the same factor until the
/// mean queueing delay is no more than `target_mean_delay_secs`: the scales
/// of `SAVINGS_SCALES` in turn, then halving the gap to the first that
/// does 3 times. `jobs` should hold no job `impossible` on the cluster
/// (each would fail every scale). The scales of `SAVINGS_SCALES` replay
/// on `threads` threads (`first_enough`), so the result is the
/// one-at-a-time search's.
pub fn savings(
    (cluster, guarantees): (&Cluster, &BTreeMap<String, u32>),
    jobs: &[TraceJob],
    target_mean_delay_secs: f64,
    (options, threads): (&Options, usize),
    observe: &ObserveScale<'_>,
) -> Savings {
    let coarse = first_enough(
        SAVINGS_SCALES.len(),
        threads,
        |index| savings_replay((cluster, guarantees), jobs, SAVINGS_SCALES[index], options, observe),
        |(outcome, _)| SavingsTry::meets(outcome, target_mean_delay_secs),
    );
    savings_from(
        (cluster, guarantees),
        jobs,
        target_mean_delay_secs,
        coarse,
        (options, observe),
    )
}

/// One replay of the savings search: dedicated partitions of `scale` times
/// the pool's GPUs, without words (only the waits are read: the same
/// decisions); its outcome and the GPUs of its partitions.
pub fn savings_replay(
    (cluster, guarantees): (&Cluster, &BTreeMap<String, u32>),
    jobs: &[TraceJob],
    scale: f64,
    options: &Options,
    observe: &ObserveScale<'_>,
) -> (Outcome, u64) {
    let options = &Options {
        words: false,
        ..options.clone()
    };
    let setup = dedicated(cluster, guarantees, scale);
    let outcome = simulate(&setup, jobs, options, &mut *observe(scale));
    let gpus = setup.nodes.iter().map(|n| n.gpus.len() as u64).sum::<u64>();
    (outcome, gpus)
}

/// `savings`, given the replays of the first scales of `SAVINGS_SCALES`
/// in order, up to the first that matches the target (or all of them),
/// as `first_enough` keeps them; a caller may have run them beside other
/// replays.
pub fn savings_from(
    (cluster, guarantees): (&Cluster, &BTreeMap<String, u32>),
    jobs: &[TraceJob],
    target_mean_delay_secs: f64,
    coarse: Vec<(Outcome, u64)>,
    (options, observe): (&Options, &ObserveScale<'_>),
) -> Savings {
    let refine = 3;
    let run = |scale: f64| {
        let (outcome, gpus) = savings_replay((cluster, guarantees), jobs, scale, options, observe);
        (SavingsTry::judge(scale, gpus, &outcome, target_mean_delay_secs), gpus)
    };
    let replayed = coarse
        .iter()
        .zip(SAVINGS_SCALES)
        .map(|((outcome, gpus), scale)| (SavingsTry::judge(scale, *gpus, outcome, target_mean_delay_secs), *gpus));
    let mut tried = Vec::new();
    let (mut low, mut high) = (SAVINGS_SCALES[0], None);
    for (judged, gpus) in replayed {
        let (scale, ok) = (judged.scale, judged.rejected.is_none());
        tried.push(judged);
        if ok {
            high = Some((scale, gpus));
            break;
        } else {
            low = scale;
        }
    }
    // Nothing to narrow where the first scale already does.
    if let Some((mut best, mut best_gpus)) = high.filter(|(scale, _)| *scale > SAVINGS_SCALES[0]) {
        for _ in 0..refine {
            let middle = (low + best) / 2.0;
            let (judged, gpus) = run(middle);
            let ok = judged.rejected.is_none();
            tried.push(judged);
            if ok {
                best = middle;
                best_gpus = gpus;
            } else {
                low = middle;
            }
        }
        high = Some((best, best_gpus));
    }
    let pooled_gpus = cluster.gpus();
    let mean_price = mean_price(cluster);
    Savings {
        target_mean_delay_secs,
        scale: high.map(|(scale, _)| scale),
        dedicated_gpus: high.map(|(_, gpus)| gpus),
        pooled_gpus,
        tried,
        extra_cost_per_hour: high
            .zip(mean_price)
            .map(|((_, gpus), price)| gpus.saturating_sub(pooled_gpus) as f64 * price),
    }
}

/// `run(0)`, `run(1)`... up to `run(n - 1)` on up to `threads` threads, each
/// taking the next index as it is done; no index starts past one whose
/// result is `enough`. The results in index order up to the first that is
/// enough (all of them if none is): what running them one at a time and
/// stopping there gives. Results past it that were already under way are
/// dropped.
pub fn first_enough<R: Send>(
    n: usize,
    threads: usize,
    run: impl Fn(usize) -> R + Sync,
    enough: impl Fn(&R) -> bool + Sync,
) -> Vec<R> {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Mutex;
    let (next, stop) = (AtomicUsize::new(0), AtomicUsize::new(n));
    let results: Mutex<Vec<Option<R>>> = Mutex::new((0..n).map(|_| None).collect());
    // A panic in one replay ends the scope with a panic once all are joined.
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, n.max(1)) {
            scope.spawn(|| loop {
                let index = next.fetch_add(1, SeqCst);
                if index >= stop.load(SeqCst) {
                    return;
                }
                let result = run(index);
                if enough(&result) {
                    stop.fetch_min(index + 1, SeqCst);
                }
                results.lock().unwrap_or_else(|poisoned| poisoned.into_inner())[index] = Some(result);
            });
        }
    });
    let mut kept = Vec::new();
    for result in results.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner()) {
        let Some(result) = result else { break };
        let done = enough(&result);
        kept.push(result);
        if done {
            break;
        }
    }
    kept
}

/// The price of a GPU-hour averaged over the cluster's GPUs, if every
/// model has one.
fn mean_price(cluster: &Cluster) -> Option<f64> {
    let mut sum = 0.0;
    for node in &cluster.nodes {
        for gpu in &node.gpus {
            sum += cluster.prices.get(&gpu.model)?;
        }
    }
    (cluster.gpus() > 0).then(|| sum / cluster.gpus() as f64)
}

/// Prices per model, for `Cluster::prices` from a gpoold.toml's accounting.
pub fn with_prices(mut cluster: Cluster, prices: &BTreeMap<GpuModel, f64>) -> Cluster {
    for (model, price) in prices {
        cluster.prices.entry(model.clone()).or_insert(*price);
    }
    cluster
}

#[cfg(test)]
mod tests;
