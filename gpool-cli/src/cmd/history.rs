//! `gpool history`: ended jobs over a time window, as sacct lists them.

use super::Ctx;
use crate::output;
use crate::{write_stdout, CliError};
use gpool_proto::pb;

#[derive(clap::Args)]
pub struct HistoryArgs {
    /// Jobs that ended since: a duration ago (1h, 7d) or a time
    /// (2026-11-23T10:00:00Z).
    #[arg(long, short = 'S', default_value = "1d", value_parser = parse_moment)]
    since: i64,
    /// ...and until (default: now).
    #[arg(long, short = 'E', value_parser = parse_moment)]
    until: Option<i64>,
    /// This user's jobs (default: yours).
    #[arg(long, short = 'u', conflicts_with = "all_users")]
    user: Option<String>,
    /// Everyone's jobs.
    #[arg(long, short = 'a')]
    all_users: bool,
    /// Only this team's jobs.
    #[arg(long)]
    team: Option<String>,
    /// Only jobs that ended in these states (comma-separated), as sacct
    /// --state.
    #[arg(long, short = 's', value_delimiter = ',')]
    state: Vec<String>,
    /// Only these jobs (comma-separated ids; an array's id takes in its
    /// tasks), as sacct -j.
    #[arg(long = "jobs", short = 'j', value_delimiter = ',', value_name = "ID,...")]
    ids: Vec<u64>,
    /// Columns, comma-separated: those of `gpool jobs --format`, and
    /// gpu_hours, ended, node_list, max_gpu_mem (peak GPU memory used),
    /// gpu_util (mean); sacct's names (JobID, JobName, ExitCode, NodeList,
    /// Elapsed...) work too.
    #[arg(long, value_name = "COLUMNS", default_value = output::DEFAULT_HISTORY_COLUMNS, value_parser = output::parse_history_columns)]
    format: output::Columns,
    /// Print the jobs as a trace in gpool's CSV format (submit time, run
    /// time, GPUs, team, ...), which `gpool sim --trace` replays under
    /// another policy.
    #[arg(long)]
    export_trace: bool,
}

/// A moment as unix ms: `1h` (that long ago), a date (`2026-11-01`, its
/// midnight) or a time (`2026-11-23T10:00`, `2026-11-23 10:00:00`), in UTC.
pub fn parse_moment(text: &str) -> Result<i64, String> {
    let now = std::time::SystemTime::now();
    let trimmed = text.trim();
    // A plain date means its midnight; a time without seconds, :00.
    let written = match trimmed.len() {
        10 => format!("{trimmed}T00:00:00Z"),
        16 => format!("{trimmed}:00"),
        _ => trimmed.to_string(),
    };
    let at = match humantime::parse_duration(trimmed) {
        Ok(ago) => now.checked_sub(ago).ok_or_else(|| format!("{text:?} is before 1970"))?,
        Err(_) => humantime::parse_rfc3339_weak(&written).map_err(|_| {
            format!("{text:?} is neither a duration (1h, 7d), a date (2026-11-01) nor a time (2026-11-23T10:00, UTC)")
        })?,
    };
    Ok(at
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64))
}

pub async fn run(ctx: &Ctx, args: HistoryArgs) -> Result<(), CliError> {
    let mut conn = ctx.connect().await?;
    let user = match (args.user, args.all_users) {
        (Some(user), _) => user,
        (None, true) => String::new(),
        (None, false) => conn.my_name().await?,
    };
    let until = args.until.unwrap_or(i64::MAX);
    let mut chunks = conn
        .client
        .list_jobs(pb::ListJobsRequest {
            states: Vec::new(),
            team: args.team.unwrap_or_default(),
            user,
            all: true,
        })
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner();
    let states = args
        .state
        .iter()
        .map(|name| {
            gpool_proto::convert::state_from_name(name).ok_or_else(|| {
                CliError::Usage(format!(
                    "--state: unknown state {name:?} (completed, failed, cancelled, timeout, node_fail, out_of_memory)"
                ))
            })
        })
        .collect::<Result<Vec<pb::JobState>, _>>()?;
    let ids = args.ids.clone();
    let wanted = |job: &pb::Job| {
        job.ended_at_ms.is_some_and(|at| at >= args.since && at <= until)
            && (states.is_empty() || states.contains(&job.state()))
            && (ids.is_empty() || ids.contains(&job.id) || (job.array_job_id != 0 && ids.contains(&job.array_job_id)))
    };
    let mut ended = Vec::new();
    while let Some(chunk) = chunks.message().await.map_err(|s| conn.refused(s))? {
        ended.extend(chunk.jobs.into_iter().filter(|job| wanted(job)));
    }
    ended.sort_by_key(|job| (job.ended_at_ms, job.id));
    if args.export_trace {
        write_stdout(format_args!("{}", gpool_core::sim::trace::to_csv(&as_trace(&ended))));
        return Ok(());
    }
    if ctx.json() {
        let mut printer = output::JsonArrayPrinter::new();
        for job in &ended {
            let mut record = serde_json::to_value(output::job_json(job)).unwrap_or_default();
            record["gpu_hours"] = serde_json::json!((output::gpu_hours(job) * 100.0).round() / 100.0);
            printer.push(&record);
        }
        printer.finish();
        return Ok(());
    }
    output::print_jobs_table(&ended, &args.format.0);
    Ok(())
}

/// Ended jobs that ran, as a trace: each arrives when it was submitted and
/// runs as long as its last attempt ran.
fn as_trace(ended: &[pb::Job]) -> Vec<gpool_core::sim::TraceJob> {
    let mut jobs: Vec<gpool_core::sim::TraceJob> = ended
        .iter()
        .filter(|job| job.array.is_none())
        .filter_map(|job| {
            let spec = job.spec.as_ref()?;
            let (started, ended) = (job.started_at_ms?, job.ended_at_ms?);
            Some(gpool_core::sim::TraceJob {
                submit: gpool_core::Timestamp(job.submitted_at_ms),
                duration_ms: (ended - started).max(0),
                gpus_per_node: spec.gpus.max(1),
                nodes: spec.nodes.max(1),
                team: spec.team.clone(),
                project: spec.project.clone(),
                user: job.user.clone(),
                gpu_types: spec.gpu_types.iter().map(|m| gpool_core::GpuModel::new(m)).collect(),
                time_limit_secs: spec.time_limit.as_ref().map(|limit| limit.seconds),
                checkpoint_every_secs: None,
                qos: spec.qos.clone(),
                on_signal: None,
                host: gpool_core::sched::HostAsk::of(&gpool_proto::convert::spec_from_wire(spec.clone())),
                // A fraction by memory is a part of a GPU not known here.
                gpu_milli: (spec.gpu_fraction_milli > 0).then_some(spec.gpu_fraction_milli),
            })
        })
        .collect();
    jobs.sort_by_key(|job| job.submit);
    jobs
}
