//! `gpool sim`: replays a trace of jobs through gpool's scheduler on a
//! virtual clock, under several policies on the same cluster, and prints
//! what each does to waits, allocation and every team's share.

use crate::output;
use crate::CliError;
use gpool_core::sched::Plan;
use gpool_core::sim::{self, Cluster, Observer, Outcome, Savings, TraceJob};
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
    /// with backfill), gpool, and further gpoold.toml files.
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
}

/// Times every cycle and moves a progress bar.
struct Watch {
    cycle_secs: Vec<f64>,
    bar: Option<indicatif::ProgressBar>,
}

impl Observer for Watch {
    fn cycle(&mut self, run: &mut dyn FnMut() -> Plan) -> Plan {
        let started = Instant::now();
        let plan = run();
        self.cycle_secs.push(started.elapsed().as_secs_f64());
        plan
    }

    fn progress(&mut self, done_ms: i64, total_ms: i64) {
        if let Some(bar) = &self.bar {
            bar.set_length(total_ms.max(1) as u64);
            bar.set_position(done_ms.clamp(0, total_ms) as u64);
        }
    }
}

impl Watch {
    fn new(label: &str, bars: &indicatif::MultiProgress) -> Watch {
        use std::io::IsTerminal;
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = bars.add(indicatif::ProgressBar::new(1));
            if let Ok(style) =
                indicatif::ProgressStyle::with_template("{prefix:>12} [{bar:40}] {percent:>3}% {elapsed}")
            {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix(label.to_string());
            bar
        });
        Watch {
            cycle_secs: Vec::new(),
            bar,
        }
    }

    fn finish(self, replay: Duration) -> Timing {
        if let Some(bar) = self.bar {
            bar.finish_and_clear();
        }
        let dist = sim::Dist::of(self.cycle_secs);
        Timing {
            replay_secs: replay.as_secs_f64(),
            cycles: dist.n,
            cycle_mean_ms: dist.mean * 1e3,
            cycle_p99_ms: dist.p99 * 1e3,
            cycle_max_ms: dist.max * 1e3,
        }
    }
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

pub fn run(args: SimArgs, json: bool) -> Result<(), CliError> {
    let cluster = match (&args.cluster, args.nodes) {
        (Some(path), _) => Cluster::parse(&path.display().to_string(), &read(path, "--cluster")?)
            .map_err(|err| CliError::Usage(err.to_string()))?,
        (None, Some(n)) if n > 0 && args.gpus_per_node > 0 => Cluster::uniform(n, args.gpus_per_node, &args.model),
        (None, _) => {
            return Err(CliError::Usage(
                "give --cluster FILE, or --nodes N (at least 1) with --gpus-per-node".into(),
            ))
        }
    };
    let trace_name = args.trace.display().to_string();
    let format = sim::Format::parse(&args.format, &trace_name).map_err(CliError::Usage)?;
    let mut jobs = sim::trace::parse(
        format,
        &trace_name,
        &read(&args.trace, "--trace")?,
        cluster.max_gpus_per_node(),
    )
    .map_err(|err| CliError::Usage(err.to_string()))?;
    if let Some(limit) = args.limit {
        jobs.truncate(limit.max(1));
    }
    // Jobs no policy could start here: said at once, and left out of the
    // savings search (each would fail every scale).
    let impossible = sim::impossible(&cluster, &jobs);
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
    let (gpool_policy, guarantees, cluster) = match &args.policy {
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
            let guarantees = sim::guarantees_by_demand(&jobs, cluster.gpus());
            (sim::sharing_policy(&cluster, &guarantees), guarantees, cluster)
        }
    };
    let span_secs = (jobs.last().map_or(0, |j| j.submit.0) - jobs.first().map_or(0, |j| j.submit.0)) / 1000;
    let options = sim::Options {
        tick_secs: args.tick.as_secs().max(1),
        // About 600 points over the trace, at least a minute each.
        bucket_secs: (span_secs as u64 / 600).max(60),
        pause_secs: args.pause.as_secs(),
    };
    let mut setups = Vec::new();
    for name in &args.compare {
        setups.push(match name.as_str() {
            "dedicated" => sim::dedicated(&cluster, &guarantees, 1.0),
            "fifo" => sim::fifo(&cluster, &guarantees),
            "gpool" => sim::pooled("gpool", &cluster, gpool_policy.clone(), &guarantees),
            file if file.ends_with(".toml") => {
                let (policy, _) = load_policy(Path::new(file))?;
                let label = Path::new(file)
                    .file_stem()
                    .map_or_else(|| file.to_string(), |stem| stem.to_string_lossy().into_owned());
                sim::pooled(&label, &cluster, policy, &guarantees)
            }
            other => {
                return Err(CliError::Usage(format!(
                    "--compare: {other:?} is not dedicated, fifo, gpool or a gpoold.toml file"
                )))
            }
        });
    }
    // Each policy replays on a thread of its own (the outcomes do not
    // depend on it), as many at once as there are cores.
    let bars = indicatif::MultiProgress::new();
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut results: Vec<(Outcome, Timing)> = Vec::new();
    for batch in setups.chunks(threads) {
        std::thread::scope(|scope| {
            let handles: Vec<_> = batch
                .iter()
                .map(|setup| {
                    let mut watch = Watch::new(&setup.name, &bars);
                    let (jobs, options) = (&jobs, &options);
                    scope.spawn(move || {
                        let started = Instant::now();
                        let outcome = sim::simulate(setup, jobs, options, &mut watch);
                        (outcome, watch.finish(started.elapsed()))
                    })
                })
                .collect();
            for handle in handles {
                match handle.join() {
                    Ok(result) => results.push(result),
                    Err(panic) => std::panic::resume_unwind(panic),
                }
            }
        });
    }
    let pooled = results.iter().find(|(o, _)| o.policy == "gpool").or_else(|| {
        results
            .iter()
            .find(|(o, _)| o.policy != "dedicated" && o.policy != "fifo")
    });
    let savings = match pooled {
        Some((pooled, _)) if !args.no_savings && args.compare.iter().any(|c| c == "dedicated") => {
            let mut watch = Watch::new("savings", &bars);
            let possible: Vec<TraceJob> = jobs
                .iter()
                .enumerate()
                .filter(|(idx, _)| impossible.binary_search_by_key(idx, |(i, _)| *i).is_err())
                .map(|(_, job)| job.clone())
                .collect();
            Some(sim::savings(
                &cluster,
                &guarantees,
                &possible,
                pooled.queue_delay.mean,
                &options,
                &mut watch,
            ))
            .inspect(|_| {
                watch.finish(Duration::ZERO);
            })
        }
        _ => None,
    };
    if let Some(dir) = &args.plot {
        plot::write_all(dir, &results.iter().map(|(o, _)| o).collect::<Vec<_>>(), &guarantees)
            .map_err(|err| CliError::Usage(format!("--plot {}: {err}", dir.display())))?;
    }
    let currency = args
        .policy
        .as_deref()
        .and_then(|path| load_policy(path).ok())
        .map_or_else(|| "USD".to_string(), |(_, pricing)| pricing.currency);
    if json {
        let value = serde_json::json!({
            "trace": { "file": trace_name, "jobs": jobs.len(), "span_hours": span_secs as f64 / 3600.0 },
            "cluster": { "nodes": cluster.nodes.len(), "gpus": cluster.gpus() },
            "policies": results.iter().map(|(o, _)| o).collect::<Vec<_>>(),
            "savings": savings,
            "currency": currency,
            "timing": results.iter().map(|(o, t)| (o.policy.clone(), t)).collect::<BTreeMap<_, _>>(),
            "impossible_jobs": impossible
                .iter()
                .map(|(idx, reason)| serde_json::json!({"job": idx + 1, "reason": reason}))
                .collect::<Vec<_>>(),
        });
        outln!("{}", serde_json::to_string_pretty(&value).unwrap_or_default());
        return Ok(());
    }
    print_tables(&jobs, &cluster, &results, savings.as_ref(), &currency);
    if let Some(dir) = &args.plot {
        outln!("\ncharts written to {}", dir.display());
    }
    Ok(())
}

/// `3.2h`, `41m`, `12s`.
fn human(secs: f64) -> String {
    if secs >= 2.0 * 86400.0 {
        format!("{:.1}d", secs / 86400.0)
    } else if secs >= 3600.0 {
        format!("{:.1}h", secs / 3600.0)
    } else if secs >= 60.0 {
        format!("{:.0}m", secs / 60.0)
    } else {
        format!("{secs:.0}s")
    }
}

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn print_tables(
    jobs: &[TraceJob],
    cluster: &Cluster,
    results: &[(Outcome, Timing)],
    savings: Option<&Savings>,
    currency: &str,
) {
    let span = (jobs.last().map_or(0, |j| j.submit.0) - jobs.first().map_or(0, |j| j.submit.0)) as f64 / 1000.0;
    outln!(
        "{} jobs over {} on {} nodes, {} GPUs",
        jobs.len(),
        human(span),
        cluster.nodes.len(),
        cluster.gpus()
    );
    let mut header = vec!["".to_string()];
    header.extend(results.iter().map(|(o, _)| o.policy.clone()));
    type Row = (&'static str, fn(&Outcome, &Timing) -> String);
    let rows: Vec<Row> = vec![
        ("GPUs", |o, _| o.gpus.to_string()),
        ("GPU allocation", |o, _| pct(o.allocation)),
        ("allocation while a waiting job fits", |o, _| {
            o.allocation_while_startable.map_or("-".into(), pct)
        }),
        ("hours a waiting job fits", |o, _| format!("{:.0}", o.hours_startable)),
        ("queueing delay, mean", |o, _| human(o.queue_delay.mean)),
        ("queueing delay, median", |o, _| human(o.queue_delay.median)),
        ("queueing delay, p95", |o, _| human(o.queue_delay.p95)),
        ("queueing delay, p99", |o, _| human(o.queue_delay.p99)),
        ("completion time, mean", |o, _| human(o.completion_time.mean)),
        ("completion time, p99", |o, _| human(o.completion_time.p99)),
        ("jobs completed", |o, _| o.completed.to_string()),
        ("jobs timed out", |o, _| o.timed_out.to_string()),
        ("jobs never started", |o, _| o.never_started.to_string()),
        ("GPU-hours delivered", |o, _| format!("{:.0}", o.delivered_gpu_hours)),
        ("  of them burst", |o, _| format!("{:.0}", o.burst_gpu_hours)),
        ("preemptions", |o, _| o.preemptions.to_string()),
        ("GPU-hours lost to preemption", |o, _| {
            format!(
                "{:.0} ({:.2}%)",
                o.lost_gpu_hours,
                o.lost_gpu_hours / o.delivered_gpu_hours.max(1e-9) * 100.0
            )
        }),
        ("jobs blocked by fragmentation", |o, _| {
            o.fragmentation_blocked_jobs.to_string()
        }),
        ("teams with >= 95% of guarantee", |o, _| {
            let asking: Vec<&sim::TeamOutcome> = o.teams.iter().filter(|t| t.guarantee_met.is_some()).collect();
            let met = asking
                .iter()
                .filter(|t| t.guarantee_met.is_some_and(|m| m >= 0.95))
                .count();
            format!("{met} of {}", asking.len())
        }),
        ("scheduling cycles", |_, t| t.cycles.to_string()),
        ("cycle time, mean", |_, t| format!("{:.2} ms", t.cycle_mean_ms)),
        ("cycle time, p99", |_, t| format!("{:.2} ms", t.cycle_p99_ms)),
        ("cycle time, max", |_, t| format!("{:.1} ms", t.cycle_max_ms)),
        ("replay time", |_, t| format!("{:.1} s", t.replay_secs)),
    ];
    let table: Vec<Vec<String>> = rows
        .iter()
        .map(|(label, value)| {
            let mut row = vec![label.to_string()];
            row.extend(results.iter().map(|(o, t)| value(o, t)));
            row
        })
        .collect();
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    output::print_table(&header_refs, table);

    outln!("\nPer team: guarantee, mean queueing delay, and the share of its guarantee it got while asking");
    let mut team_header = vec!["TEAM".to_string(), "GUARANTEE".into(), "JOBS".into()];
    for (o, _) in results {
        team_header.push(format!("WAIT {}", o.policy));
        team_header.push(format!("GOT {}", o.policy));
    }
    let teams = results.first().map(|(o, _)| o.teams.clone()).unwrap_or_default();
    let team_rows: Vec<Vec<String>> = teams
        .iter()
        .enumerate()
        .map(|(i, team)| {
            let mut row = vec![
                team.team.clone(),
                team.guaranteed_gpus.to_string(),
                team.jobs.to_string(),
            ];
            for (o, _) in results {
                let t = &o.teams[i];
                row.push(if t.never_started > 0 {
                    format!("{} ({} never)", human(t.queue_delay.mean), t.never_started)
                } else {
                    human(t.queue_delay.mean)
                });
                row.push(t.guarantee_met.map_or("-".into(), pct));
            }
            row
        })
        .collect();
    let team_header_refs: Vec<&str> = team_header.iter().map(String::as_str).collect();
    output::print_table(&team_header_refs, team_rows);

    if let Some(savings) = savings {
        outln!("");
        match (savings.scale, savings.dedicated_gpus) {
            (Some(scale), Some(_)) if scale <= 1.0 => outln!(
                "Savings: dedicated partitions of the pool's own size (x1.00, {} GPUs) already match the pooled mean wait of {}: pooling saves no GPUs on this trace.",
                savings.pooled_gpus,
                human(savings.target_mean_delay_secs)
            ),
            (Some(scale), Some(gpus)) => {
                let cost = savings.extra_cost_per_hour.map_or_else(String::new, |cost| {
                    format!(
                        ", {cost:.0} {currency} more per hour ({:.0} {currency} over the trace)",
                        cost * span / 3600.0
                    )
                });
                outln!(
                    "Savings: dedicated partitions need {gpus} GPUs (x{scale:.2}) to match the pooled mean wait of {}; pooling does it with {}: {} GPUs fewer{cost}.",
                    human(savings.target_mean_delay_secs),
                    savings.pooled_gpus,
                    gpus.saturating_sub(savings.pooled_gpus)
                );
            }
            _ => {
                let (low, high) = (
                    savings.tried.first().map_or(1.0, |(scale, _)| *scale),
                    savings.tried.last().map_or(1.0, |(scale, _)| *scale),
                );
                outln!(
                    "Savings: dedicated partitions of x{low:.2} to x{high:.2} the GPUs (up to {}) do not match the pooled mean wait of {}.",
                    (savings.pooled_gpus as f64 * high).round(),
                    human(savings.target_mean_delay_secs)
                )
            }
        }
    }
}

mod plot;

fn parse_on_signal(text: &str) -> Result<gpool_core::sim::OnSignal, String> {
    gpool_core::sim::OnSignal::parse(text)
        .ok_or_else(|| format!("{text:?} is not {}", gpool_core::sim::OnSignal::WORDS))
}
