//! `gpool sim`'s report as tables: the policies side by side, the teams
//! under each policy, and the savings.

use super::{span_ms, Report, Timing};
use crate::output;
use gpool_core::sim::{self, Outcome, Savings};

/// `3.2h`, `41m`, `12s`.
pub(super) fn human(secs: f64) -> String {
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

/// The human report: the trace, the policy table, the team table and the savings.
pub(super) fn print_tables(report: &Report) {
    let (jobs, cluster, results) = (report.jobs, report.cluster, report.results);
    let span = span_ms(jobs) as f64 / 1000.0;
    outln!(
        "{} jobs over {} on {} nodes, {} GPUs",
        jobs.len(),
        human(span),
        cluster.nodes.len(),
        cluster.gpus()
    );
    print_policy_table(results);
    for (outcome, _) in results {
        if let Some(line) = super::notes::note(outcome, span / 3600.0) {
            outln!("{line}");
        }
    }
    print_never_started(results);
    print_team_table(results);
    if let Some(savings) = report.savings {
        print_savings(savings, report.currency, span);
        print_tried(savings);
    }
}

/// The jobs each policy never started, by requirement shape (the first 10).
fn print_never_started(results: &[(Outcome, Timing)]) {
    for (outcome, _) in results.iter().filter(|(o, _)| !o.never_started_by_shape.is_empty()) {
        let shapes = &outcome.never_started_by_shape;
        let mut words: Vec<String> = shapes
            .iter()
            .take(10)
            .map(|s| format!("{} x {}", s.jobs, s.shape))
            .collect();
        if shapes.len() > 10 {
            words.push(format!("and {} more shapes", shapes.len() - 10));
        }
        outln!(
            "jobs that never fit under {}, by requirement shape: {}",
            outcome.policy,
            words.join("; ")
        );
    }
}

/// Each scale the savings search tried, and why it was not enough.
fn print_tried(savings: &Savings) {
    let tried: Vec<String> = savings
        .tried
        .iter()
        .map(|t| {
            let verdict = t.rejected.clone().unwrap_or_else(|| "matches".into());
            format!("x{:.2} ({} GPUs): {verdict}", t.scale, t.gpus)
        })
        .collect();
    outln!("  tried {}", tried.join("; "));
}

/// Whether arrivals ended long before the replay did (a tenth of it or
/// more went to the jobs left when the last one arrived).
fn long_drain(outcome: &Outcome) -> bool {
    outcome.span_hours - outcome.arrival_hours >= 0.1 * outcome.span_hours && outcome.arrival_hours > 0.0
}

/// A row of the policy table: its label, and its cell for a policy.
type Row = (&'static str, fn(&Outcome, &Timing) -> String);

/// The policy table: one column per policy, one row per figure.
fn print_policy_table(results: &[(Outcome, Timing)]) {
    let mut header = vec!["".to_string()];
    header.extend(results.iter().map(|(o, _)| o.policy.clone()));
    let drains = results.iter().any(|(o, _)| long_drain(o));
    let fractions = results.iter().any(|(o, _)| o.fractions.is_some());
    let table: Vec<Vec<String>> = policy_rows()
        .iter()
        .filter(|(label, _)| drains || *label != UNTIL_LAST_ARRIVAL)
        .filter(|(label, _)| fractions || !FRACTION_ROWS.contains(label))
        .map(|(label, value)| {
            let mut row = vec![label.to_string()];
            row.extend(results.iter().map(|(o, t)| value(o, t)));
            row
        })
        .collect();
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    output::print_table(&header_refs, table);
}

/// The row shown only where arrivals ended long before the replay did.
const UNTIL_LAST_ARRIVAL: &str = "  until the last arrival";

/// The rows shown only where the trace asks for fractions of a GPU.
const FRACTION_ROWS: [&str; 2] = ["fractions of a GPU, GPU-hours", "  GPU-hours of GPUs they held"];

/// The policy table's rows, in order.
fn policy_rows() -> Vec<Row> {
    vec![
        ("GPUs", |o, _| o.gpus.to_string()),
        ("GPU allocation", |o, _| pct(o.allocation)),
        (UNTIL_LAST_ARRIVAL, |o, _| {
            o.allocation_during_arrivals
                .filter(|_| long_drain(o))
                .map_or("-".into(), |a| {
                    format!("{} over {}", pct(a), human(o.arrival_hours * 3600.0))
                })
        }),
        ("GPUs held at the first rejection", |o, _| {
            o.held_at_first_rejection.map_or("-".into(), |held| {
                format!("{held} ({})", pct(held as f64 / o.gpus.max(1) as f64))
            })
        }),
        ("GPUs held at the peak", |o, _| {
            format!("{} ({})", o.peak_held, pct(o.peak_held as f64 / o.gpus.max(1) as f64))
        }),
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
        (FRACTION_ROWS[0], |o, _| {
            o.fractions
                .as_ref()
                .map_or("-".into(), |f| format!("{:.0} ({} jobs)", f.asked_gpu_hours, f.jobs))
        }),
        (FRACTION_ROWS[1], |o, _| {
            o.fractions.as_ref().map_or("-".into(), |f| {
                format!(
                    "{:.0} ({:.1} per GPU)",
                    f.held_gpu_hours,
                    f.asked_gpu_hours / f.held_gpu_hours.max(1e-9)
                )
            })
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
        ("invariant violations", |o, _| o.invariant_violations.to_string()),
        ("scheduling cycles", |_, t| t.cycles.to_string()),
        ("cycle time, mean", |_, t| format!("{:.2} ms", t.cycle_mean_ms)),
        ("cycle time, p99", |_, t| format!("{:.2} ms", t.cycle_p99_ms)),
        ("cycle time, max", |_, t| format!("{:.1} ms", t.cycle_max_ms)),
        ("replay time", |_, t| format!("{:.1} s", t.replay_secs)),
    ]
}

/// The team table: each team's guarantee, and its wait and share under each policy.
fn print_team_table(results: &[(Outcome, Timing)]) {
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
}

/// The savings line: the GPUs dedicated partitions need to match the pooled wait, and their cost.
fn print_savings(savings: &Savings, currency: &str, span: f64) {
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
                savings.tried.first().map_or(1.0, |tried| tried.scale),
                savings.tried.last().map_or(1.0, |tried| tried.scale),
            );
            outln!(
                "Savings: dedicated partitions of x{low:.2} to x{high:.2} the GPUs (up to {}) do not match the pooled mean wait of {}.",
                (savings.pooled_gpus as f64 * high).round(),
                human(savings.target_mean_delay_secs)
            )
        }
    }
}
