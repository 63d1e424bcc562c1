//! `gpool report`: GPU-hours and their cost over a window, grouped; and
//! `gpool report savings`: the pool against dedicated GPUs per team.

use super::Ctx;
use crate::output;
use crate::CliError;
use gpool_proto::pb;

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ReportKind {
    /// What each team would have needed on GPUs of its own, against the
    /// pool (admins).
    Savings,
}

#[derive(clap::Args)]
pub struct ReportArgs {
    /// `savings`; without it, GPU-hours and cost grouped by --by.
    kind: Option<ReportKind>,
    /// From: a duration ago (7d) or a time (2026-11-01T00:00:00Z);
    /// default: the start of the sharing period.
    #[arg(long, short = 'S', value_parser = super::history::parse_moment)]
    since: Option<i64>,
    /// Until (default: now).
    #[arg(long, short = 'E', value_parser = super::history::parse_moment)]
    until: Option<i64>,
    /// Group by any of team, project, workload-type, user, gpu-model,
    /// pool, cost-center, qos, ledger, source (owned, or the [[power]]
    /// group whose nodes it ran on) (comma-separated).
    #[arg(long, default_value = "team", value_delimiter = ',')]
    by: Vec<String>,
    /// Comma-separated values instead of a table.
    #[arg(long, conflicts_with = "kind")]
    csv: bool,
    /// savings: size each team's dedicated GPUs to cover its concurrent
    /// use this share of the time (percent; default gpoold.toml's, 100:
    /// its peak).
    #[arg(long)]
    percentile: Option<f64>,
}

pub async fn run(ctx: &Ctx, args: ReportArgs) -> Result<(), CliError> {
    for name in &args.by {
        gpool_core::accounting::Dimension::parse(name).map_err(|reason| CliError::Usage(format!("--by: {reason}")))?;
    }
    let mut conn = ctx.connect().await?;
    let request = pb::ReportRequest {
        since_ms: args.since.unwrap_or(0),
        until_ms: args.until.unwrap_or(0),
        by: args.by.clone(),
        percentile: args.percentile.unwrap_or(0.0),
    };
    if args.kind == Some(ReportKind::Savings) {
        let savings = conn
            .client
            .get_savings(request)
            .await
            .map_err(|s| conn.refused(s))?
            .into_inner();
        print_savings(ctx, &savings);
        return Ok(());
    }
    let report = conn
        .client
        .get_report(request)
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner();
    if ctx.json() {
        output::print_json(&report_json(&report));
    } else if args.csv {
        print_csv(&report).map_err(|err| CliError::Refused(format!("writing CSV: {err}")))?;
    } else {
        print_report(&report);
    }
    Ok(())
}

fn hours(seconds: f64) -> f64 {
    seconds / 3600.0
}

fn money(cost: Option<f64>) -> String {
    cost.map_or_else(|| "-".to_string(), |cost| format!("{cost:.2}"))
}

fn row_json(by: &[String], row: &pb::ReportRow) -> serde_json::Value {
    let mut value = serde_json::json!({
        "attempts": row.attempts,
        "gpu_hours": hours(row.gpu_seconds),
        "guaranteed_gpu_hours": hours(row.guaranteed_gpu_seconds),
        "burst_gpu_hours": hours(row.burst_gpu_seconds),
        "lost_gpu_hours": hours(row.lost_gpu_seconds),
        "idle_gpu_hours": hours(row.idle_gpu_seconds),
        "mean_utilization_pct": row.mean_utilization_pct,
        "peak_memory_used_mib": row.peak_memory_used_mib,
        "cost": row.cost,
        "unpriced_gpu_hours": hours(row.unpriced_gpu_seconds),
    });
    for (dimension, key) in by.iter().zip(&row.key) {
        value[dimension.replace('-', "_")] = serde_json::Value::String(key.clone());
    }
    value
}

fn report_json(report: &pb::ReportResponse) -> serde_json::Value {
    serde_json::json!({
        "since": output::rfc3339(report.since_ms),
        "until": output::rfc3339(report.until_ms),
        "by": report.by,
        "currency": report.currency,
        "rows": report.rows.iter().map(|row| row_json(&report.by, row)).collect::<Vec<_>>(),
        "total": report.total.as_ref().map(|row| row_json(&[], row)),
    })
}

/// The numbers of a row, as the table and the CSV show them.
fn row_cells(row: &pb::ReportRow) -> Vec<String> {
    vec![
        row.attempts.to_string(),
        format!("{:.3}", hours(row.gpu_seconds)),
        format!("{:.3}", hours(row.guaranteed_gpu_seconds)),
        format!("{:.3}", hours(row.burst_gpu_seconds)),
        format!("{:.3}", hours(row.lost_gpu_seconds)),
        format!("{:.3}", hours(row.idle_gpu_seconds)),
        row.mean_utilization_pct
            .map_or_else(|| "-".to_string(), |pct| format!("{pct:.0}")),
        money(row.cost),
    ]
}

const NUMBER_COLUMNS: [&str; 8] = [
    "ATTEMPTS",
    "GPU-HOURS",
    "GUARANTEED",
    "BURST",
    "LOST",
    "IDLE",
    "UTIL%",
    "COST",
];

fn print_report(report: &pb::ReportResponse) {
    outln!(
        "GPU-hours from {} to {} ({})",
        output::rfc3339(report.since_ms),
        output::rfc3339(report.until_ms),
        report.currency
    );
    let by_upper: Vec<String> = report.by.iter().map(|d| d.to_ascii_uppercase()).collect();
    let mut header: Vec<&str> = by_upper.iter().map(String::as_str).collect();
    header.extend(NUMBER_COLUMNS);
    let mut rows: Vec<Vec<String>> = report
        .rows
        .iter()
        .map(|row| row.key.iter().cloned().chain(row_cells(row)).collect())
        .collect();
    if let Some(total) = &report.total {
        let mut cells = vec![String::new(); report.by.len()];
        if let Some(first) = cells.first_mut() {
            *first = "TOTAL".to_string();
        }
        cells.extend(row_cells(total));
        rows.push(cells);
        if total.unpriced_gpu_seconds > 0.0 {
            outln!(
                "{:.3} GPU-hours are on GPU models without a price in gpoold.toml ([accounting.prices])",
                hours(total.unpriced_gpu_seconds)
            );
        }
    }
    output::print_table(&header, rows);
}

fn print_csv(report: &pb::ReportResponse) -> Result<(), csv::Error> {
    let mut writer = csv::Writer::from_writer(std::io::stdout().lock());
    let mut header: Vec<String> = report.by.iter().map(|d| d.replace('-', "_")).collect();
    header.extend(
        [
            "attempts",
            "gpu_hours",
            "guaranteed_gpu_hours",
            "burst_gpu_hours",
            "lost_gpu_hours",
            "idle_gpu_hours",
            "mean_utilization_pct",
            "cost",
        ]
        .map(String::from),
    );
    writer.write_record(&header)?;
    for row in &report.rows {
        let cells: Vec<String> = row.key.iter().cloned().chain(row_cells(row)).collect();
        writer.write_record(cells.iter().map(|cell| if cell == "-" { "" } else { cell.as_str() }))?;
    }
    writer.flush()?;
    Ok(())
}

fn gpus_text(gpus: &[pb::GpuCount]) -> String {
    if gpus.is_empty() {
        return "0".to_string();
    }
    gpus.iter()
        .map(|gpu| format!("{} {}", gpu.count, gpu.model))
        .collect::<Vec<_>>()
        .join(", ")
}

fn gpus_json(gpus: &[pb::GpuCount]) -> serde_json::Value {
    gpus.iter()
        .map(|gpu| (gpu.model.clone(), serde_json::Value::from(gpu.count)))
        .collect::<serde_json::Map<_, _>>()
        .into()
}

fn print_savings(ctx: &Ctx, savings: &pb::SavingsResponse) {
    if ctx.json() {
        output::print_json(&serde_json::json!({
            "since": output::rfc3339(savings.since_ms),
            "until": output::rfc3339(savings.until_ms),
            "currency": savings.currency,
            "percentile": savings.percentile,
            "used_gpu_hours": hours(savings.used_gpu_seconds),
            "teams": savings.teams.iter().map(|team| serde_json::json!({
                "team": team.team,
                "dedicated_gpus": gpus_json(&team.gpus),
                "used_gpu_hours": hours(team.used_gpu_seconds),
                "dedicated_cost": team.dedicated_cost,
                "dedicated_utilization": team.dedicated_utilization,
            })).collect::<Vec<_>>(),
            "dedicated": {
                "gpus": gpus_json(&savings.dedicated_gpus),
                "cost": savings.dedicated_cost,
                "utilization": savings.dedicated_utilization,
            },
            "pool": {
                "gpus": gpus_json(&savings.pool_gpus),
                "cost": savings.pool_cost,
                "utilization": savings.pool_utilization,
            },
            "gpus_saved": savings.gpus_saved,
            "cost_saved": savings.cost_saved,
        }));
        return;
    }
    outln!(
        "From {} to {}: each team on GPUs of its own, sized to its concurrent use at the {}th percentile of the time ({})",
        output::rfc3339(savings.since_ms),
        output::rfc3339(savings.until_ms),
        savings.percentile,
        savings.currency
    );
    let pct = |share: f64| format!("{:.0}%", share * 100.0);
    let mut rows: Vec<Vec<String>> = savings
        .teams
        .iter()
        .map(|team| {
            vec![
                team.team.clone(),
                gpus_text(&team.gpus),
                format!("{:.3}", hours(team.used_gpu_seconds)),
                money(team.dedicated_cost),
                pct(team.dedicated_utilization),
            ]
        })
        .collect();
    rows.push(vec![
        "DEDICATED".into(),
        gpus_text(&savings.dedicated_gpus),
        format!("{:.3}", hours(savings.used_gpu_seconds)),
        money(savings.dedicated_cost),
        pct(savings.dedicated_utilization),
    ]);
    rows.push(vec![
        "POOL".into(),
        gpus_text(&savings.pool_gpus),
        format!("{:.3}", hours(savings.used_gpu_seconds)),
        money(savings.pool_cost),
        pct(savings.pool_utilization),
    ]);
    output::print_table(&["TEAM", "GPUS", "GPU-HOURS USED", "COST", "UTILIZATION"], rows);
    let gpus = savings.gpus_saved;
    let verdict = match gpus {
        n if n > 0 => format!("the pool runs the same work on {n} fewer GPUs"),
        0 => "the pool has as many GPUs as the teams would need on their own".to_string(),
        n => format!(
            "the pool has {} more GPUs than the teams would need on their own at their waits",
            -n
        ),
    };
    match savings.cost_saved {
        Some(saved) => outln!("{verdict}; saved: {saved:.2} {}", savings.currency),
        None => outln!("{verdict}; some GPU models have no price in gpoold.toml ([accounting.prices])"),
    }
}
