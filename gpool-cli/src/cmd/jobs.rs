//! `gpool jobs`, `gpool show`, and following a job until it ends.

use super::{Connection, Ctx};
use crate::cmd::submit::EXIT_INTERRUPTED;
use crate::output;
use crate::CliError;
use gpool_proto::convert::{state_from_name, state_name};
use gpool_proto::pb;

mod wait;

#[derive(clap::Args)]
pub struct JobsArgs {
    /// Only jobs in these states (comma-separated or repeated).
    #[arg(long, value_delimiter = ',')]
    state: Vec<String>,
    /// Only this team's jobs.
    #[arg(long)]
    team: Option<String>,
    /// Only this user's jobs (-u, as squeue's).
    #[arg(long, short = 'u')]
    user: Option<String>,
    /// Include finished jobs.
    #[arg(long)]
    all: bool,
    /// Only jobs of this name.
    #[arg(long, short = 'n')]
    name: Option<String>,
    /// Only these jobs (comma-separated ids; an array's id takes in its
    /// tasks), as squeue -j.
    #[arg(long = "jobs", short = 'j', value_delimiter = ',', value_name = "ID,...")]
    ids: Vec<u64>,
    /// Only your own jobs (as gpoold knows you).
    #[arg(long, conflicts_with = "user")]
    me: bool,
    /// Show at most this many (the table's default: 200; 0: all); a line
    /// says how many more there are.
    #[arg(long)]
    limit: Option<usize>,
    /// One line per waiting array task instead of one per array (as
    /// squeue -r).
    #[arg(long = "array", short = 'r')]
    expand_arrays: bool,
    /// Only jobs submitted or ended since: a duration ago (1h) or a time
    /// (2026-11-23T10:00:00Z); takes in ended jobs.
    #[arg(long, value_parser = super::history::parse_moment)]
    since: Option<i64>,
    /// Order by these columns (comma-separated; a leading - for
    /// descending): id, name, user, team, state, gpus, submitted, start,
    /// priority, position.
    #[arg(long, value_name = "KEYS", allow_hyphen_values = true)]
    sort: Option<String>,
    /// The table's columns, comma-separated: id, name, user, team,
    /// project, state, gpus, nodes, submitted, start (or ~estimated),
    /// elapsed, limit, priority, position (in the queue), qos, pool, exit,
    /// reason.
    #[arg(long, value_name = "COLUMNS", default_value = crate::output::DEFAULT_JOB_COLUMNS, value_parser = crate::output::parse_job_columns)]
    format: crate::output::Columns,
    /// Waiting jobs with when each should start (as squeue --start): the
    /// scheduler plays running jobs' time limits forward; `-` where no
    /// start can be foreseen.
    #[arg(long, conflicts_with_all = ["state", "format", "all", "since"])]
    start: bool,
}

/// A sort key: a column and whether it goes down.
type SortKey = (&'static str, bool);

fn parse_sort(text: &str) -> Result<Vec<SortKey>, CliError> {
    const KEYS: &[&str] = &[
        "id",
        "name",
        "user",
        "team",
        "state",
        "gpus",
        "submitted",
        "start",
        "priority",
        "position",
    ];
    text.split(',')
        .map(str::trim)
        .filter(|key| !key.is_empty())
        .map(|key| {
            let (name, down) = match key.strip_prefix('-') {
                Some(name) => (name, true),
                None => (key, false),
            };
            KEYS.iter()
                .find(|known| known.eq_ignore_ascii_case(name))
                .map(|known| (*known, down))
                .ok_or_else(|| CliError::Usage(format!("--sort: {name:?} is not a key ({})", KEYS.join(", "))))
        })
        .collect()
}

fn sort_jobs(jobs: &mut [pb::Job], keys: &[SortKey]) {
    use std::cmp::Ordering;
    let compare = |a: &pb::Job, b: &pb::Job, key: &str| -> Ordering {
        let spec = |job: &pb::Job| job.spec.clone().unwrap_or_default();
        match key {
            "name" => spec(a).name.cmp(&spec(b).name),
            "user" => a.user.cmp(&b.user),
            "team" => spec(a).team.cmp(&spec(b).team),
            "state" => state_name(a.state()).cmp(state_name(b.state())),
            "gpus" => (spec(a).gpus * spec(a).nodes).cmp(&(spec(b).gpus * spec(b).nodes)),
            "submitted" => a.submitted_at_ms.cmp(&b.submitted_at_ms),
            "start" => a
                .started_at_ms
                .or(a.estimated_start_ms)
                .cmp(&b.started_at_ms.or(b.estimated_start_ms)),
            "priority" => {
                let total = |job: &pb::Job| job.priority.as_ref().map_or(f64::from(spec(job).priority), |p| p.total);
                total(a).total_cmp(&total(b))
            }
            // Jobs the scheduler did not place come last.
            "position" => a
                .queue_position
                .unwrap_or(u32::MAX)
                .cmp(&b.queue_position.unwrap_or(u32::MAX)),
            _ => a.id.cmp(&b.id),
        }
    };
    jobs.sort_by(|a, b| {
        keys.iter()
            .map(|(key, down)| {
                let order = compare(a, b, key);
                if *down {
                    order.reverse()
                } else {
                    order
                }
            })
            .find(|order| order.is_ne())
            .unwrap_or_else(|| a.id.cmp(&b.id))
    });
}

/// An array's waiting tasks, one row each (`-r`).
fn waiting_tasks(array: &pb::Job, info: &pb::ArrayInfo) -> Vec<pb::Job> {
    let Ok(indices) = gpool_core::array::ArraySpec::parse(&info.waiting_indices) else {
        return vec![array.clone()];
    };
    (0..indices.len())
        .filter_map(|position| indices.index_at(position))
        .map(|index| pb::Job {
            array: None,
            array_job_id: array.id,
            array_task_index: Some(index),
            ..array.clone()
        })
        .collect()
}

/// Rows the table shows unless --limit says otherwise.
const TABLE_LIMIT: usize = 200;

pub async fn run(ctx: &Ctx, mut args: JobsArgs) -> Result<(), CliError> {
    if args.start {
        start_view(&mut args);
    }
    let states = parse_states(&args.state)?;
    let mut conn = ctx.connect().await?;
    let user = if args.me {
        conn.my_name().await?
    } else {
        args.user.clone().unwrap_or_default()
    };
    let request = pb::ListJobsRequest {
        states,
        team: args.team.clone().unwrap_or_default(),
        user,
        all: args.all || args.since.is_some(),
    };
    let sort = match args.sort.as_deref() {
        Some(text) => Some(parse_sort(text)?),
        None => None,
    };
    let limit = match args.limit {
        Some(0) => usize::MAX,
        Some(limit) => limit,
        None if ctx.json() => usize::MAX,
        None => TABLE_LIMIT,
    };
    let mut chunks = conn
        .client
        .list_jobs(request)
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner();
    match sort {
        Some(keys) if ctx.json() => print_sorted_json(&mut chunks, &conn, &args, &keys, limit).await,
        None if ctx.json() => print_streamed_json(&mut chunks, &conn, &args, limit).await,
        sort => print_table(&mut chunks, &conn, &args, sort.as_deref(), limit).await,
    }
}

/// The chunks of jobs `gpool jobs` lists, as they arrive.
type JobChunks = tonic::codec::Streaming<pb::ListJobsResponse>;

/// `--start`: waiting jobs by queue position, with the columns that say when each should start.
fn start_view(args: &mut JobsArgs) {
    args.state = vec!["pending".into()];
    args.format = crate::output::Columns(vec![
        "id", "name", "user", "team", "gpus", "start", "position", "reason",
    ]);
    args.sort.get_or_insert_with(|| "position".into());
}

/// The states --state names, as the wire has them.
fn parse_states(names: &[String]) -> Result<Vec<i32>, CliError> {
    names
        .iter()
        .map(|name| {
            state_from_name(name).map(i32::from).ok_or_else(|| {
                CliError::Usage(format!(
                    "--state: unknown state {name:?} (pending, running, completed, failed, cancelled, timeout, node_fail, out_of_memory)"
                ))
            })
        })
        .collect()
}

/// Whether a listed job is one of --jobs, of --name and since --since.
fn wanted(args: &JobsArgs, job: &pb::Job) -> bool {
    let (ids, since) = (&args.ids, args.since);
    (ids.is_empty() || ids.contains(&job.id) || (job.array_job_id != 0 && ids.contains(&job.array_job_id)))
        && args
            .name
            .as_ref()
            .is_none_or(|name| job.spec.as_ref().is_some_and(|spec| &spec.name == name))
        && since.is_none_or(|since| job.submitted_at_ms >= since || job.ended_at_ms.is_some_and(|at| at >= since))
}

/// `--output json --sort`: all the wanted jobs, sorted, then cut to the limit.
async fn print_sorted_json(
    chunks: &mut JobChunks,
    conn: &Connection,
    args: &JobsArgs,
    keys: &[SortKey],
    limit: usize,
) -> Result<(), CliError> {
    let mut jobs = Vec::new();
    while let Some(chunk) = chunks.message().await.map_err(|s| conn.refused(s))? {
        jobs.extend(chunk.jobs.into_iter().filter(|job| wanted(args, job)));
    }
    sort_jobs(&mut jobs, keys);
    let mut printer = output::JsonArrayPrinter::new();
    for job in jobs.iter().take(limit) {
        printer.push(&output::job_json(job));
    }
    printer.finish();
    Ok(())
}

/// `--output json`: the wanted jobs up to the limit.
async fn print_streamed_json(
    chunks: &mut JobChunks,
    conn: &Connection,
    args: &JobsArgs,
    limit: usize,
) -> Result<(), CliError> {
    // Printed as the chunks arrive (the array never sits whole in memory),
    // on a thread of its own: the next chunk is decoded meanwhile.
    let (sender, received) = std::sync::mpsc::sync_channel::<Option<Vec<pb::Job>>>(2);
    let printer = std::thread::spawn(move || {
        let mut printer = output::JsonArrayPrinter::new();
        loop {
            match received.recv() {
                Ok(Some(jobs)) => jobs.iter().for_each(|job| printer.push(&output::job_json(job))),
                // The end of the list; a listing that failed ends unclosed.
                Ok(None) => break printer.finish(),
                Err(_) => break,
            }
        }
    });
    let mut n_left = limit;
    let listed = async {
        while let Some(chunk) = chunks.message().await.map_err(|s| conn.refused(s))? {
            let jobs: Vec<pb::Job> = chunk
                .jobs
                .into_iter()
                .filter(|job| wanted(args, job))
                .take(n_left)
                .collect();
            n_left -= jobs.len();
            if !jobs.is_empty() && sender.send(Some(jobs)).is_err() {
                break;
            }
        }
        Ok(())
    }
    .await;
    if listed.is_ok() {
        let _ = sender.send(None);
    }
    drop(sender);
    // A panic in the printer is the command's, as it was on one thread.
    if let Err(panic) = printer.join() {
        std::panic::resume_unwind(panic);
    }
    listed
}

/// The table of the wanted jobs (sorted, up to the limit), then a line counting them by state.
async fn print_table(
    chunks: &mut JobChunks,
    conn: &Connection,
    args: &JobsArgs,
    sort: Option<&[SortKey]>,
    limit: usize,
) -> Result<(), CliError> {
    let mut jobs = Vec::new();
    let mut by_state: std::collections::BTreeMap<&'static str, usize> = std::collections::BTreeMap::new();
    let mut n_matching = 0;
    while let Some(chunk) = chunks.message().await.map_err(|s| conn.refused(s))? {
        for job in chunk.jobs.into_iter().filter(|job| wanted(args, job)) {
            for job in table_rows(job, args.expand_arrays) {
                n_matching += 1;
                *by_state.entry(state_name(job.state())).or_default() += 1;
                // Sorted: all are kept, then cut to the limit.
                if jobs.len() < limit || sort.is_some() {
                    jobs.push(job);
                }
            }
        }
    }
    if let Some(keys) = sort {
        sort_jobs(&mut jobs, keys);
        jobs.truncate(limit);
    }
    output::print_jobs_table(&jobs, &args.format.0);
    // A summary, so that a long queue stays readable.
    if n_matching > 1 {
        let counts: Vec<String> = by_state.iter().map(|(state, n)| format!("{n} {state}")).collect();
        let more = n_matching - jobs.len();
        let more = if more > 0 {
            format!("; {more} more not shown (--limit 0 shows all)")
        } else {
            String::new()
        };
        outln!("{n_matching} jobs: {}{more}", counts.join(", "));
    }
    Ok(())
}

/// The table's rows for one listed job: none, itself, or (`-r`) an array's waiting tasks.
fn table_rows(job: pb::Job, expand_arrays: bool) -> Vec<pb::Job> {
    // An array's record stands for its tasks that are not jobs
    // yet; once all are, the tasks speak for themselves.
    match &job.array {
        Some(info) if job.state() == pb::JobState::Pending && info.waiting == 0 => Vec::new(),
        Some(info) if expand_arrays && info.waiting > 0 => waiting_tasks(&job, info),
        _ => vec![job],
    }
}

/// One job, as the controller shows it now.
pub async fn fetch(ctx: &Ctx, id: super::JobRef) -> Result<pb::Job, CliError> {
    let mut conn = ctx.connect().await?;
    let id = conn.resolve(&[id]).await?[0];
    Ok(conn
        .client
        .get_job(pb::GetJobRequest { id })
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner())
}

pub async fn show(ctx: &Ctx, id: super::JobRef, with_env: bool) -> Result<(), CliError> {
    let job = fetch(ctx, id).await?;
    if ctx.json() {
        output::print_json(&output::job_json(&job));
    } else {
        output::print_job_details(&job, with_env);
    }
    Ok(())
}

/// How `--wait` (and `gpool wait`) waits, and what it prints and exits with.
pub struct Waiting {
    /// The first job that does not complete cancels the rest.
    pub fail_fast: bool,
    /// Exit with the job's own code (`--attach`, as srun), not gpool's.
    pub own_code: bool,
    /// Print a JSON summary of every job on stdout at the end.
    pub json: bool,
    /// Say nothing while waiting (no spinner, no line per change): the
    /// terminal was the job's until now.
    pub quiet: bool,
}

/// Follows the jobs until all have ended; returns the exit code `--wait`
/// exits with: that of the first job (in `ids` order) that did not
/// complete, else 0. On a terminal, one job shows a spinner with its state,
/// several a bar of how many have ended; elsewhere each change of a job's
/// state is a line on stderr.
pub async fn wait_for(conn: &mut Connection, ids: &[u64], how: Waiting) -> Result<u8, CliError> {
    // Taken from here on, so an early Ctrl-C is answered too.
    let mut interrupted = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .map_err(|err| CliError::Refused(format!("cannot watch for Ctrl-C: {err}")))?;
    let progress = wait::progress_bar(ids, how.quiet);
    let mut stream = conn
        .client
        .watch_jobs(pb::WatchJobsRequest { ids: ids.to_vec() })
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner();
    let mut seen = wait::Seen::default();
    loop {
        let job = tokio::select! {
            job = stream.message() => match job.map_err(|s| conn.refused(s))? {
                Some(job) => job,
                None => break,
            },
            _ = interrupted.recv() => {
                wait::stop_waiting(ids, &seen.last, progress.as_ref(), how.json);
                return Ok(EXIT_INTERRUPTED);
            }
        };
        if ended(&job) {
            seen.n_ended += 1;
            seen.n_not_completed += u64::from(job.state() != pb::JobState::Completed);
        }
        // --fail-fast: the first job that did not complete cancels the rest
        // (the wait goes on until they have ended).
        if how.fail_fast && seen.failed_first.is_none() && ended(&job) && job.state() != pb::JobState::Completed {
            seen.failed_first = Some(job.id);
            wait::cancel_the_rest(conn, ids, &job, &seen.last).await?;
        }
        wait::show_progress(progress.as_ref(), ids, &job, &seen, how.quiet);
        seen.last.insert(job.id, job);
    }
    if let Some(bar) = progress {
        bar.finish_and_clear();
    }
    let first_code = wait::exit_code(ids, &seen, how.own_code)?;
    if how.json {
        print_summary(ids, &seen.last, first_code);
    }
    Ok(first_code)
}

/// `--wait --output json`: each job's outcome, in submit order, and the
/// exit code gpool exits with.
fn print_summary(ids: &[u64], last: &std::collections::BTreeMap<u64, pb::Job>, exit_code: u8) {
    let jobs: Vec<serde_json::Value> = ids
        .iter()
        .map(|id| match last.get(id) {
            Some(job) => {
                let spec = job.spec.as_ref();
                let elapsed_secs = job
                    .started_at_ms
                    .map(|started| (job.ended_at_ms.unwrap_or(started) - started).max(0) as f64 / 1000.0);
                serde_json::json!({
                    "id": id,
                    "name": spec.map_or("", |spec| spec.name.as_str()),
                    "state": state_name(job.state()),
                    "exit_code": job.exit_code,
                    "reason": job.end_reason,
                    "nodes": job.last_nodes,
                    "elapsed_secs": elapsed_secs,
                })
            }
            None => serde_json::json!({ "id": id, "state": "unknown" }),
        })
        .collect();
    let failed: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|id| {
            last.get(id)
                .is_some_and(|job| ended(job) && job.state() != pb::JobState::Completed)
        })
        .collect();
    output::print_json(&serde_json::json!({
        "ids": ids,
        "exit_code": exit_code,
        "not_completed": failed,
        "jobs": jobs,
    }));
}

/// Ids as a person reads them: runs of consecutive ids as `first-last`.
pub fn id_list(ids: &[u64]) -> String {
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for &id in ids {
        match runs.last_mut() {
            Some((_, last)) if *last + 1 == id => *last = id,
            _ => runs.push((id, id)),
        }
    }
    let runs: Vec<String> = runs
        .iter()
        .map(|&(first, last)| {
            if first == last {
                first.to_string()
            } else {
                format!("{first}-{last}")
            }
        })
        .collect();
    format!("job{} {}", if ids.len() == 1 { "" } else { "s" }, runs.join(" "))
}

fn ended(job: &pb::Job) -> bool {
    gpool_proto::convert::is_ended(job.state())
}

/// A failed job's own code as a process exit code: its low byte, never 0.
fn own_exit_code(code: i32) -> u8 {
    match (code & 0xff) as u8 {
        0 => 1,
        low => low,
    }
}

fn describe(job: &pb::Job) -> String {
    match job.state() {
        pb::JobState::Pending => match job.reasons.first() {
            Some(reason) => format!("pending: {}", reason.words),
            None => "pending".into(),
        },
        pb::JobState::Failed
        | pb::JobState::Cancelled
        | pb::JobState::Timeout
        | pb::JobState::NodeFail
        | pb::JobState::OutOfMemory => {
            format!("{}: {}", state_name(job.state()), job.end_reason)
        }
        other => state_name(other).to_string(),
    }
}
