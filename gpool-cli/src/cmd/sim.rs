//! `gpool sim`: replays a trace of jobs through gpool's scheduler on a
//! virtual clock, under several policies on the same cluster, and prints
//! what each does to waits, allocation and every team's share.

use crate::output;
use crate::CliError;
use gpool_core::sim::{self, Cluster, Outcome, Savings, TraceJob};
use progress::Watch;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
pub struct SimArgs {
    /// The trace to replay.
    #[arg(long)]
    trace: PathBuf,
    /// `philly` (timestamp,duration,num_gpus,gpu_time,cluster; the virtual
    /// cluster is the team) or `gpool` (gpool's CSV, or JSON Lines for a
    /// .jsonl file, as `gpool history --export-trace` writes).
    #[arg(long, default_value = "gpool")]
    format: String,
    /// The cluster: [[nodes]] groups with count, gpus, model, links, labels.
    #[arg(long, conflicts_with = "nodes")]
    cluster: Option<PathBuf>,
    /// Instead of --cluster: this many nodes of --gpus-per-node GPUs.
    #[arg(long)]
    nodes: Option<usize>,
    /// With --nodes: GPUs on each node.
    #[arg(long, default_value_t = 8)]
    gpus_per_node: u32,
    /// With --nodes: the GPUs' model.
    #[arg(long, default_value = "sim")]
    model: String,
    /// The gpoold.toml whose teams, QoS and weights the `gpool` policy
    /// uses (and whose prices cost the savings). Without it, each team of
    /// the trace is guaranteed GPUs in proportion to the GPU-hours it asks
    /// for, all together the cluster.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Policies to compare: dedicated (each team on GPUs of its own, as
    /// many as its guarantee), fifo (one pool, first come first served,
    /// with backfill), gpool, gpool-priority (gpool's policy without its
    /// least-attained-service order within teams), gpool-whole (gpool with
    /// a trace's fractions of a GPU rounded up to whole GPUs), and further
    /// gpoold.toml files.
    #[arg(long, value_delimiter = ',', default_value = "dedicated,fifo,gpool")]
    compare: Vec<String>,
    /// Jobs with no checkpoint period of their own write one this often (a
    /// preemption loses the work since); default: they write none.
    #[arg(long, value_parser = humantime::parse_duration)]
    checkpoint_every: Option<Duration>,
    /// What jobs whose trace does not say do when preempted: `exit` (as a
    /// process with no handler for its checkpoint signal does; the work
    /// since its last checkpoint is lost and its GPUs are free at once),
    /// `checkpoint` (it saves and exits) or `work_on` (it works on until
    /// its grace is over).
    #[arg(long, default_value = "exit", value_parser = parse_on_signal)]
    on_signal: gpool_core::sim::OnSignal,
    /// While jobs wait, a cycle also runs this often on the virtual clock
    /// (besides one at every arrival and end), so that time-based decisions
    /// (age, budgets, minimum runtime before preemption) are taken at most
    /// this late. gpoold's own timer is 5s; a finer tick replays slower.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    tick: Duration,
    /// After each cycle the next waits at least this long on the virtual
    /// clock; arrivals and ends meanwhile share it (gpoold pauses after
    /// each cycle too, for milliseconds; a longer pause replays faster and
    /// delays starts by at most this much). 0: a cycle at every event.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    pause: Duration,
    /// Only the first N jobs of the trace (by submit time).
    #[arg(long)]
    limit: Option<usize>,
    /// Skip the search for how many dedicated GPUs would match the pooled
    /// waits.
    #[arg(long)]
    no_savings: bool,
    /// Write charts (SVG) to this directory.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Write every job attempt under each policy to this CSV file: policy,
    /// job, attempt, team, submit, start, end, nodes, gpu_model, gpus,
    /// end_state, preempted_for, placement (a job that never started has
    /// one row, attempt 0).
    #[arg(long)]
    jobs_out: Option<PathBuf>,
    /// Write every preemption and rescind under each policy to this CSV
    /// file: policy, at, event, job, attempt, for_job, reason.
    #[arg(long)]
    events_out: Option<PathBuf>,
    /// A group of cloud nodes beside the cluster, MODEL:GPUS (GPUs per
    /// node, e.g. h100:8), asleep until jobs wait that they could take and
    /// asleep again when idle: the gpool policy is replayed without it and
    /// with it at each --suspend-after and --cloud-budget, and a table
    /// prices each against its waits.
    #[arg(long)]
    cloud: Option<String>,
    /// With --cloud: the group's nodes.
    #[arg(long, default_value_t = 16)]
    cloud_nodes: usize,
    /// With --cloud: its price per GPU-hour (default: --policy's price of
    /// its model, else 0).
    #[arg(long)]
    cloud_price: Option<f64>,
    /// With --cloud: how long a resumed node takes to take work.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    resume_delay: Duration,
    /// With --cloud: idle times after which a node sleeps ("never" keeps
    /// it), one replay each.
    #[arg(long, value_delimiter = ',', default_value = "10m,2h")]
    suspend_after: Vec<String>,
    /// With --cloud: the most nodes up at once, one replay each.
    #[arg(long, value_delimiter = ',', default_value = "4,16")]
    cloud_budget: Vec<u32>,
}

/// Wall-clock figures of one replay (not part of the deterministic outcome).
#[derive(serde::Serialize)]
struct Timing {
    replay_secs: f64,
    cycles: usize,
    cycle_mean_ms: f64,
    cycle_p99_ms: f64,
    cycle_max_ms: f64,
}

fn read(path: &Path, what: &str) -> Result<String, CliError> {
    std::fs::read_to_string(path).map_err(|err| CliError::Usage(format!("{what} {}: {err}", path.display())))
}

/// A gpoold.toml's policy and per-model prices.
fn load_policy(path: &Path) -> Result<(gpool_core::sched::Policy, gpool_core::accounting::Pricing), CliError> {
    let text = read(path, "--policy")?;
    let config = gpool_config::Config::parse_policy(&path.display().to_string(), &text)
        .map_err(|err| CliError::Usage(err.to_string()))?;
    Ok((config.policy, config.accounting.pricing))
}

/// Exit code of a replay whose checks found a broken invariant.
pub const EXIT_INVARIANT_BROKEN: u8 = 3;

/// Runs `gpool sim`; `Ok` carries the exit code: 3 where a replay broke
/// an invariant (`EXIT_INVARIANT_BROKEN`).
pub fn run(args: SimArgs, json: bool) -> Result<u8, CliError> {
    run_with(args, json, &|_| {})
}

/// `run`, with `adjust` applied to the replays' options (tests).
fn run_with(args: SimArgs, json: bool, adjust: &dyn Fn(&mut sim::Options)) -> Result<u8, CliError> {
    for (flag, path) in [("--jobs-out", &args.jobs_out), ("--events-out", &args.events_out)] {
        if let Some(path) = path {
            std::fs::File::create(path).map_err(|err| CliError::Usage(format!("{flag} {}: {err}", path.display())))?;
        }
    }
    let cluster = load_cluster(&args)?;
    let trace_name = args.trace.display().to_string();
    let mut jobs = load_trace(&args, &trace_name, &cluster)?;
    // Jobs no policy could start here: said at once, and left out of the
    // savings search (each would fail every scale).
    let impossible = sim::impossible(&cluster, &jobs);
    warn_impossible(&trace_name, &jobs, &impossible);
    apply_job_defaults(&args, &mut jobs)?;
    let (gpool_policy, guarantees, cluster) = policy_and_guarantees(&args, cluster, &jobs)?;
    let span_secs = span_ms(&jobs) / 1000;
    let mut options = sim::Options {
        tick_secs: args.tick.as_secs().max(1),
        // About 600 points over the arrivals, at least a minute each (a
        // long replay widens them: at most `MAX_SERIES_POINTS`).
        bucket_secs: (span_secs as u64 / 600).max(60),
        pause_secs: args.pause.as_secs(),
        resume_delay_secs: args.resume_delay.as_secs(),
        record: args.jobs_out.is_some() || args.events_out.is_some(),
        ..sim::Options::default()
    };
    adjust(&mut options);
    let setups = match &args.cloud {
        Some(spec) => {
            let gpool = sim::pooled("gpool", &cluster, gpool_policy.clone(), &guarantees);
            cloud::setups(&args, spec, gpool, &cluster.prices)?
        }
        None => setups(&args.compare, &cluster, &gpool_policy, &guarantees)?,
    };
    let bars = indicatif::MultiProgress::new();
    let pooled = pooled_for_savings(&args, &setups);
    let (results, savings) = replay_all(
        (&setups, pooled),
        (&jobs, &impossible),
        (&cluster, &guarantees),
        &options,
        &bars,
    );
    let outcomes: Vec<&Outcome> = results.iter().map(|(o, _)| o).collect();
    write_files(&args, &outcomes, &guarantees)?;
    let currency = currency(&args);
    let report = Report {
        trace_name: &trace_name,
        jobs: &jobs,
        cluster: &cluster,
        results: &results,
        savings: savings.as_ref(),
        currency: &currency,
        impossible: &impossible,
    };
    if json {
        print_json_report(&report);
    } else {
        tables::print_tables(&report);
        if args.cloud.is_some() {
            cloud::print_table(&results, &currency);
        }
        if let Some(dir) = &args.plot {
            outln!("\ncharts written to {}", dir.display());
        }
    }
    Ok(exit_code(&outcomes))
}

/// The charts of --plot, and the CSV files of --jobs-out and --events-out.
fn write_files(args: &SimArgs, outcomes: &[&Outcome], guarantees: &BTreeMap<String, u32>) -> Result<(), CliError> {
    if let Some(dir) = &args.plot {
        plot::write_all(dir, outcomes, guarantees)
            .map_err(|err| CliError::Usage(format!("--plot {}: {err}", dir.display())))?;
    }
    if let Some(path) = &args.jobs_out {
        records::write_jobs(path, outcomes).map_err(CliError::Usage)?;
    }
    if let Some(path) = &args.events_out {
        records::write_events(path, outcomes).map_err(CliError::Usage)?;
    }
    Ok(())
}

/// 0, or `EXIT_INVARIANT_BROKEN` where a replay broke an invariant (each
/// such replay named on stderr, with its first broken invariant).
fn exit_code(outcomes: &[&Outcome]) -> u8 {
    let mut code = 0;
    for outcome in outcomes.iter().filter(|o| o.invariant_violations > 0) {
        eprintln!(
            "gpool sim: {}: {} invariant violation(s), the first {}",
            outcome.policy,
            outcome.invariant_violations,
            outcome.first_violation.as_deref().unwrap_or("-")
        );
        code = EXIT_INVARIANT_BROKEN;
    }
    code
}

/// The cluster of --cluster, or of --nodes and --gpus-per-node.
fn load_cluster(args: &SimArgs) -> Result<Cluster, CliError> {
    Ok(match (&args.cluster, args.nodes) {
        (Some(path), _) => Cluster::parse(&path.display().to_string(), &read(path, "--cluster")?)
            .map_err(|err| CliError::Usage(err.to_string()))?,
        (None, Some(n)) if n > 0 && args.gpus_per_node > 0 => Cluster::uniform(n, args.gpus_per_node, &args.model),
        (None, _) => {
            return Err(CliError::Usage(
                "give --cluster FILE, or --nodes N (at least 1) with --gpus-per-node".into(),
            ))
        }
    })
}

/// The jobs of --trace, in its --format, cut to --limit.
fn load_trace(args: &SimArgs, trace_name: &str, cluster: &Cluster) -> Result<Vec<TraceJob>, CliError> {
    let format = sim::Format::parse(&args.format, trace_name).map_err(CliError::Usage)?;
    let mut jobs = sim::trace::parse(
        format,
        trace_name,
        &read(&args.trace, "--trace")?,
        cluster.max_gpus_per_node(),
    )
    .map_err(|err| CliError::Usage(err.to_string()))?;
    if let Some(limit) = args.limit {
        jobs.truncate(limit.max(1));
    }
    Ok(jobs)
}

/// Names on stderr (the first five of) the jobs that can never start.
fn warn_impossible(trace_name: &str, jobs: &[TraceJob], impossible: &[(usize, String)]) {
    if !impossible.is_empty() {
        eprintln!(
            "gpool sim: {} job(s) of {trace_name} can never start on this cluster, under any policy:",
            impossible.len()
        );
        for (idx, reason) in impossible.iter().take(5) {
            eprintln!(
                "  job {} (submitted {}): {reason}",
                idx + 1,
                output::rfc3339(jobs[*idx].submit.0)
            );
        }
        if impossible.len() > 5 {
            eprintln!("  and {} more", impossible.len() - 5);
        }
    }
}

/// Gives jobs whose trace does not say --checkpoint-every and --on-signal.
fn apply_job_defaults(args: &SimArgs, jobs: &mut [TraceJob]) -> Result<(), CliError> {
    if let Some(every) = args.checkpoint_every {
        if every.as_secs() == 0 {
            return Err(CliError::Usage("--checkpoint-every: at least 1s".into()));
        }
        for job in jobs.iter_mut().filter(|job| job.checkpoint_every_secs.is_none()) {
            job.checkpoint_every_secs = Some(every.as_secs());
        }
    }
    for job in jobs.iter_mut().filter(|job| job.on_signal.is_none()) {
        job.on_signal = Some(args.on_signal);
    }
    Ok(())
}

/// The `gpool` policy, teams' guarantees and (priced) cluster: from --policy, else by the trace's demand.
fn policy_and_guarantees(
    args: &SimArgs,
    cluster: Cluster,
    jobs: &[TraceJob],
) -> Result<(gpool_core::sched::Policy, BTreeMap<String, u32>, Cluster), CliError> {
    Ok(match &args.policy {
        Some(path) => {
            let (policy, pricing) = load_policy(path)?;
            let guarantees: BTreeMap<String, u32> = policy
                .sharing
                .teams
                .iter()
                .map(|team| (team.name.clone(), team.guaranteed_gpus))
                .collect();
            (policy, guarantees, sim::with_prices(cluster, &pricing.per_gpu_hour))
        }
        None => {
            let guarantees = sim::guarantees_by_demand(jobs, cluster.gpus());
            (sim::sharing_policy(&cluster, &guarantees), guarantees, cluster)
        }
    })
}

/// Milliseconds from the trace's first submission to its last.
fn span_ms(jobs: &[TraceJob]) -> i64 {
    jobs.last().map_or(0, |j| j.submit.0) - jobs.first().map_or(0, |j| j.submit.0)
}

/// The setups --compare names, in its order.
fn setups(
    compare: &[String],
    cluster: &Cluster,
    gpool_policy: &gpool_core::sched::Policy,
    guarantees: &BTreeMap<String, u32>,
) -> Result<Vec<sim::Setup>, CliError> {
    let mut setups = Vec::new();
    for name in compare {
        setups.push(match name.as_str() {
            "dedicated" => sim::dedicated(cluster, guarantees, 1.0),
            "fifo" => sim::fifo(cluster, guarantees),
            "gpool" => sim::pooled("gpool", cluster, gpool_policy.clone(), guarantees),
            // Fractions of a GPU rounded up to whole ones: what sharing gains.
            "gpool-whole" => sim::Setup {
                whole_fractions: true,
                ..sim::pooled("gpool-whole", cluster, gpool_policy.clone(), guarantees)
            },
            "gpool-priority" => {
                let mut policy = gpool_policy.clone();
                policy.sharing.las = None;
                sim::pooled("gpool-priority", cluster, policy, guarantees)
            }
            file if file.ends_with(".toml") => {
                let (policy, _) = load_policy(Path::new(file))?;
                let label = Path::new(file)
                    .file_stem()
                    .map_or_else(|| file.to_string(), |stem| stem.to_string_lossy().into_owned());
                sim::pooled(&label, cluster, policy, guarantees)
            }
            other => {
                return Err(CliError::Usage(format!(
                "--compare: {other:?} is not dedicated, fifo, gpool, gpool-priority, gpool-whole or a gpoold.toml file"
            )))
            }
        });
    }
    Ok(setups)
}

/// A replay of `replay_all`'s work queue: a policy's (its index in the
/// setups), or one of the savings search's first scales.
enum Replayed {
    Policy(usize, Outcome, Timing),
    Scale(Outcome, u64),
}

/// Replays every setup, and where `pooled` names the one whose mean wait
/// dedicated partitions must match, the savings search over the jobs that
/// can start. One work queue on as many threads as there are cores, each
/// taking the next replay as soon as it is done: the pooled policy first,
/// the others, then the savings search's first scales, so that a core the
/// policies leave idle replays those (the search needs only the pooled
/// mean wait, known by then or judged at the end: `first_enough` keeps
/// what trying the scales one at a time keeps). Its narrowing replays
/// follow. The outcomes do not depend on the order.
fn replay_all(
    (setups, pooled): (&[sim::Setup], Option<usize>),
    (jobs, impossible): (&[TraceJob], &[(usize, String)]),
    (cluster, guarantees): (&Cluster, &BTreeMap<String, u32>),
    options: &sim::Options,
    bars: &indicatif::MultiProgress,
) -> (Vec<(Outcome, Timing)>, Option<Savings>) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut order: Vec<usize> = pooled.into_iter().collect();
    order.extend((0..setups.len()).filter(|index| Some(*index) != pooled));
    // Only the savings search replays the trace without its impossible jobs.
    let possible: Vec<TraceJob> = match pooled {
        Some(_) => jobs
            .iter()
            .enumerate()
            .filter(|(idx, _)| impossible.binary_search_by_key(idx, |(i, _)| *i).is_err())
            .map(|(_, job)| job.clone())
            .collect(),
        None => Vec::new(),
    };
    // The savings search keeps no records: only its waits count.
    let search_options = sim::Options {
        record: false,
        ..options.clone()
    };
    let observe = |scale: f64| -> Box<dyn sim::Observer + Send + '_> {
        Box::new(progress::Scaled::new(Watch::new(&format!("savings x{scale:.2}"), bars)))
    };
    let target = std::sync::OnceLock::new();
    let n_scales = if pooled.is_some() { sim::SAVINGS_SCALES.len() } else { 0 };
    let replay = |task: usize| match order.get(task) {
        Some(&index) => {
            let setup = &setups[index];
            let mut watch = Watch::new(&setup.name, bars);
            let started = Instant::now();
            let outcome = sim::simulate(setup, jobs, options, &mut watch);
            if Some(index) == pooled {
                let _ = target.set(outcome.queue_delay.mean);
            }
            Replayed::Policy(index, outcome, watch.finish(started.elapsed()))
        }
        None => {
            let scale = sim::SAVINGS_SCALES[task - order.len()];
            let (outcome, gpus) =
                sim::savings_replay((cluster, guarantees), &possible, scale, &search_options, &observe);
            Replayed::Scale(outcome, gpus)
        }
    };
    let enough = |replayed: &Replayed| match replayed {
        Replayed::Scale(outcome, _) => target
            .get()
            .is_some_and(|target| sim::SavingsTry::meets(outcome, *target)),
        Replayed::Policy(..) => false,
    };
    let replayed = sim::first_enough(order.len() + n_scales, threads, replay, enough);
    let mut results: Vec<Option<(Outcome, Timing)>> = (0..setups.len()).map(|_| None).collect();
    let mut coarse = Vec::new();
    for replayed in replayed {
        match replayed {
            Replayed::Policy(index, outcome, timing) => results[index] = Some((outcome, timing)),
            Replayed::Scale(outcome, gpus) => coarse.push((outcome, gpus)),
        }
    }
    let savings = target.get().map(|target| {
        sim::savings_from(
            (cluster, guarantees),
            &possible,
            *target,
            coarse,
            (&search_options, &observe),
        )
    });
    // No policy's result is enough: `first_enough` keeps them all.
    (results.into_iter().flatten().collect(), savings)
}

/// Which setup's mean wait dedicated partitions must match, if the savings
/// search is to run: `gpool`, else the first that is not `dedicated` or
/// `fifo`, where `dedicated` is compared and `--no-savings` not given.
fn pooled_for_savings(args: &SimArgs, setups: &[sim::Setup]) -> Option<usize> {
    if args.cloud.is_some() || args.no_savings || !args.compare.iter().any(|c| c == "dedicated") {
        return None;
    }
    setups.iter().position(|setup| setup.name == "gpool").or_else(|| {
        setups
            .iter()
            .position(|setup| setup.name != "dedicated" && setup.name != "fifo")
    })
}

/// The currency of --policy's prices (USD without one).
fn currency(args: &SimArgs) -> String {
    args.policy
        .as_deref()
        .and_then(|path| load_policy(path).ok())
        .map_or_else(|| "USD".to_string(), |(_, pricing)| pricing.currency)
}

/// What `gpool sim` found, for the tables or the JSON report.
struct Report<'a> {
    trace_name: &'a str,
    jobs: &'a [TraceJob],
    cluster: &'a Cluster,
    results: &'a [(Outcome, Timing)],
    savings: Option<&'a Savings>,
    currency: &'a str,
    impossible: &'a [(usize, String)],
}

/// `--output json`: the whole report as one JSON object.
fn print_json_report(report: &Report) {
    let Report {
        trace_name,
        jobs,
        cluster,
        results,
        savings,
        currency,
        impossible,
    } = report;
    let span_secs = span_ms(jobs) / 1000;
    let value = serde_json::json!({
        "trace": { "file": trace_name, "jobs": jobs.len(), "span_hours": span_secs as f64 / 3600.0 },
        "cluster": { "nodes": cluster.nodes.len(), "gpus": cluster.gpus() },
        "policies": results.iter().map(|(o, _)| o).collect::<Vec<_>>(),
        "savings": savings,
        "currency": currency,
        "timing": results.iter().map(|(o, t)| (o.policy.clone(), t)).collect::<BTreeMap<_, _>>(),
        "notes": results
            .iter()
            .filter_map(|(o, _)| notes::note(o, span_ms(jobs) as f64 / 3_600_000.0).map(|line| (o.policy.clone(), line)))
            .collect::<BTreeMap<_, _>>(),
        "impossible_jobs": impossible
            .iter()
            .map(|(idx, reason)| serde_json::json!({"job": idx + 1, "reason": reason}))
            .collect::<Vec<_>>(),
    });
    outln!("{}", serde_json::to_string_pretty(&value).unwrap_or_default());
}

mod cloud;
mod notes;
mod plot;
mod progress;
mod records;
mod tables;
#[cfg(test)]
mod tests;

fn parse_on_signal(text: &str) -> Result<gpool_core::sim::OnSignal, String> {
    gpool_core::sim::OnSignal::parse(text)
        .ok_or_else(|| format!("{text:?} is not {}", gpool_core::sim::OnSignal::WORDS))
}
