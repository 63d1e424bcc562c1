//! `squeue`: waiting and running jobs in Slurm's format, `-o` fields
//! included, for the tools that parse it.

use super::format;
use crate::CliError;
use gpool_proto::pb;

/// squeue's default `-o`.
const DEFAULT_FORMAT: &str = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R";

#[derive(clap::Parser, Debug)]
#[command(name = "squeue", disable_help_flag = true)]
pub struct Args {
    /// Print help (`-h` is --noheader, as in Slurm).
    #[arg(long = "help", action = clap::ArgAction::Help)]
    help: Option<bool>,
    /// No header line.
    #[arg(short = 'h', long = "noheader")]
    noheader: bool,
    #[arg(short = 'o', long = "format")]
    format: Option<String>,
    /// Long field names with optional widths (`JobID:20,State`).
    #[arg(short = 'O', long = "Format")]
    long_format: Option<String>,
    /// Users (comma-separated).
    #[arg(short = 'u', long = "user", action = clap::ArgAction::Append)]
    users: Vec<String>,
    #[arg(long)]
    me: bool,
    /// Job ids (comma-separated; `120_3` for a task).
    #[arg(short = 'j', long = "jobs", action = clap::ArgAction::Append)]
    jobs: Vec<String>,
    /// States (comma-separated: PD,R or PENDING,RUNNING).
    #[arg(short = 't', long = "states", action = clap::ArgAction::Append)]
    states: Vec<String>,
    /// Partitions (gpool's pools).
    #[arg(short = 'p', long = "partition", action = clap::ArgAction::Append)]
    partitions: Vec<String>,
    /// Accounts (gpool's teams).
    #[arg(short = 'A', long = "account", action = clap::ArgAction::Append)]
    accounts: Vec<String>,
    #[arg(short = 'n', long = "name", action = clap::ArgAction::Append)]
    names: Vec<String>,
    /// One line per array task (gpool lists tasks as they start anyway).
    #[arg(short = 'r', long = "array")]
    array: bool,
}

pub async fn run(ctx: &crate::cmd::Ctx, args: Args) -> Result<u8, CliError> {
    let mut conn = ctx.connect().await?;
    let user = match (args.me, args.users.as_slice()) {
        (true, _) => conn.my_name().await?,
        (false, [user]) if !user.contains(',') => user.clone(),
        _ => String::new(),
    };
    let jobs = super::list(&mut conn, user, false).await?;
    let wanted = super::Filter::of(
        &args.jobs,
        &args.users,
        &args.states,
        (&args.partitions, &args.accounts, &args.names),
    );
    let pieces = match &args.long_format {
        Some(fields) => long_format(fields)?,
        None => format::parse_format(args.format.as_deref().unwrap_or(DEFAULT_FORMAT)),
    };
    let now_ms = super::now_ms();
    let mut out = String::new();
    if !args.noheader {
        out.push_str(&format::line(&pieces, |letter| header(letter).to_string()));
        out.push('\n');
    }
    // An array's record stands for its tasks still waiting, if any.
    let waiting_tasks = |job: &pb::Job| job.array.as_ref().is_some_and(|array| array.waiting > 0);
    for job in jobs
        .iter()
        .filter(|job| wanted.keeps(job) && (!format::is_array_record(job) || waiting_tasks(job)))
    {
        out.push_str(&format::line(&pieces, |letter| field(job, letter, now_ms)));
        out.push('\n');
    }
    let text = out.trim_end_matches('\n');
    if !text.is_empty() {
        outln!("{text}");
    }
    Ok(0)
}

/// `-O`'s long names, as the `-o` letters they mean.
const LONG_NAMES: [(&str, char); 20] = [
    ("JobID", 'i'),
    ("Name", 'j'),
    ("State", 'T'),
    ("StateCompact", 't'),
    ("TimeUsed", 'M'),
    ("TimeLimit", 'l'),
    ("TimeLeft", 'L'),
    ("NumNodes", 'D'),
    ("ReasonList", 'R'),
    ("Reason", 'r'),
    ("NodeList", 'N'),
    ("UserName", 'u'),
    ("Partition", 'P'),
    ("Account", 'a'),
    ("ArrayJobID", 'F'),
    ("ArrayTaskID", 'K'),
    ("StartTime", 'S'),
    ("SubmitTime", 'V'),
    ("EndTime", 'e'),
    ("Priority", 'Q'),
];

/// `-O JobID:20,State:.10,...`: each field left-aligned in its width
/// (default 20), or right-aligned with `.`, one after another as Slurm
/// writes them; an unknown name refused.
fn long_format(fields: &str) -> Result<Vec<format::Piece>, CliError> {
    fields
        .split(',')
        .filter(|field| !field.trim().is_empty())
        .map(|field| {
            let (name, width) = field.trim().split_once(':').unwrap_or((field.trim(), ""));
            let (right, width) = match width.strip_prefix('.') {
                Some(width) => (true, width),
                None => (false, width),
            };
            let letter = LONG_NAMES
                .iter()
                .find(|(long, _)| long.eq_ignore_ascii_case(name))
                .map(|(_, letter)| *letter)
                .ok_or_else(|| CliError::Usage(format!("squeue: error: Invalid job format specification: {name}")))?;
            Ok(format::Piece::Field {
                letter,
                width: Some(width.parse().unwrap_or(20)),
                right,
            })
        })
        .collect()
}

fn header(letter: char) -> &'static str {
    match letter {
        'i' => "JOBID",
        'j' => "NAME",
        'T' => "STATE",
        't' => "ST",
        'M' => "TIME",
        'l' => "TIME_LIMIT",
        'L' => "TIME_LEFT",
        'D' => "NODES",
        'R' => "NODELIST(REASON)",
        'r' => "REASON",
        'N' => "NODELIST",
        'u' => "USER",
        'P' => "PARTITION",
        'a' => "ACCOUNT",
        'F' => "ARRAY_JOB_ID",
        'K' => "ARRAY_TASK_ID",
        'S' => "START_TIME",
        'V' => "SUBMIT_TIME",
        'e' => "END_TIME",
        'b' => "TRES_PER_NODE",
        'Q' => "PRIORITY",
        _ => "?",
    }
}

/// Field `letter` of `job` (squeue's `-o` letters).
fn field(job: &pb::Job, letter: char, now_ms: i64) -> String {
    let spec = job.spec.clone().unwrap_or_default();
    let limit = spec.time_limit.map(|limit| limit.seconds);
    let time = |ms: Option<i64>| format::sacct_time(ms).replace("Unknown", "N/A");
    match letter {
        'i' => format::job_id(job),
        'j' => spec.name.clone(),
        'T' => format::state_long(job),
        't' => format::state_short(job).into(),
        'M' => format::squeue_duration(format::elapsed_secs(job, now_ms)),
        'l' => limit.map_or_else(|| "UNLIMITED".into(), format::squeue_duration),
        'L' => limit.map_or_else(
            || "UNLIMITED".into(),
            |limit| format::squeue_duration(limit.saturating_sub(format::elapsed_secs(job, now_ms))),
        ),
        'D' => spec.nodes.max(1).to_string(),
        'R' if job.state() == pb::JobState::Running => format::node_list(job),
        'R' | 'r' => format!("({})", reason(job)),
        'N' if job.state() == pb::JobState::Pending => String::new(),
        'N' => format::node_list(job),
        'u' => job.user.clone(),
        'P' => super::partition(&spec),
        'a' => spec.team.clone(),
        'F' => job.array_task_index.map_or(job.id, |_| job.array_job_id).to_string(),
        'K' => job
            .array_task_index
            .map_or_else(|| "N/A".into(), |index| index.to_string()),
        'S' => time(job.started_at_ms.or(job.estimated_start_ms)),
        'V' => time(Some(job.submitted_at_ms)),
        'e' => time(job.ended_at_ms),
        'b' => format!("gres/gpu:{}", spec.gpus),
        'Q' => job.priority.map_or(0, |p| p.total as i64).to_string(),
        other => format!("%{other}"),
    }
}

/// A waiting job's reason in Slurm's words.
pub fn reason(job: &pb::Job) -> &'static str {
    if job.state() == pb::JobState::Running {
        return "None";
    }
    match job.reasons.first().map(|reason| reason.code.as_str()) {
        Some("held") => "JobHeldUser",
        Some("dependency") => "Dependency",
        Some("begin_time") | Some("begin") => "BeginTime",
        Some("team_cap") | Some("user_cap") => "QOSMaxGRESPerUser",
        Some("reservation") | Some("node_reservation") => "Reservation",
        Some("array_limit") => "JobArrayTaskLimit",
        Some("resources") | Some("reserved") | Some("preempting") => "Resources",
        Some(_) => "Priority",
        None if job.state() == pb::JobState::Pending => "Priority",
        None => "None",
    }
}
