//! `sacct`: jobs, ended ones included, in Slurm's accounting format:
//! `--format` fields, `-P`/`-p` parsable output, Slurm's state names.

use super::format;
use crate::CliError;
use gpool_proto::pb;

/// sacct's default fields, with their default widths.
const DEFAULT_FIELDS: &str = "JobID,JobName,Partition,Account,AllocCPUS,State,ExitCode";

#[derive(clap::Parser, Debug)]
#[command(name = "sacct")]
pub struct Args {
    /// Fields separated by `|`, no trailing one.
    #[arg(short = 'P', long = "parsable2")]
    parsable2: bool,
    /// Fields separated by `|`, with a trailing one.
    #[arg(short = 'p', long = "parsable")]
    parsable: bool,
    #[arg(short = 'n', long = "noheader")]
    noheader: bool,
    /// Allocations only (gpool has no job steps: always so).
    #[arg(short = 'X', long = "allocations")]
    allocations: bool,
    #[arg(short = 'o', long = "format")]
    format: Option<String>,
    #[arg(short = 'j', long = "jobs", action = clap::ArgAction::Append)]
    jobs: Vec<String>,
    #[arg(short = 'u', long = "user", action = clap::ArgAction::Append)]
    users: Vec<String>,
    #[arg(short = 'a', long = "allusers")]
    all_users: bool,
    #[arg(short = 's', long = "state", action = clap::ArgAction::Append)]
    states: Vec<String>,
    #[arg(long = "name", action = clap::ArgAction::Append)]
    names: Vec<String>,
    #[arg(short = 'r', long = "partition", action = clap::ArgAction::Append)]
    partitions: Vec<String>,
    #[arg(short = 'A', long = "accounts", action = clap::ArgAction::Append)]
    accounts: Vec<String>,
    /// Jobs that ran (or waited) at or after this moment (UTC:
    /// `2026-11-29`, `2026-11-29T08:00[:00]`); default: midnight today,
    /// unless -j names jobs.
    #[arg(short = 'S', long = "starttime")]
    start: Option<String>,
    #[arg(short = 'E', long = "endtime")]
    end: Option<String>,
}

pub async fn run(ctx: &crate::cmd::Ctx, args: Args) -> Result<u8, CliError> {
    let fields = fields(args.format.as_deref().unwrap_or(DEFAULT_FIELDS))?;
    let since = match (&args.start, args.jobs.is_empty()) {
        (Some(text), _) => Some(moment(text, "-S")?),
        (None, true) => Some(super::now_ms() / 86_400_000 * 86_400_000),
        (None, false) => None,
    };
    let until = args.end.as_deref().map(|text| moment(text, "-E")).transpose()?;
    let mut conn = ctx.connect().await?;
    let user = match (args.users.as_slice(), args.all_users || !args.jobs.is_empty()) {
        ([user], _) if !user.contains(',') => user.clone(),
        (_, true) => String::new(),
        (_, false) => conn.my_name().await?,
    };
    let jobs = super::list(&mut conn, user, true).await?;
    let wanted = super::Filter::of(
        &args.jobs,
        &args.users,
        &args.states,
        (&args.partitions, &args.accounts, &args.names),
    );
    let now_ms = super::now_ms();
    let in_window = |job: &pb::Job| {
        let ran_until = job.ended_at_ms.unwrap_or(now_ms);
        since.is_none_or(|since| ran_until >= since) && until.is_none_or(|until| job.submitted_at_ms <= until)
    };
    let rows: Vec<Vec<String>> = jobs
        .iter()
        .filter(|job| wanted.keeps(job) && in_window(job) && !format::is_array_record(job))
        .map(|job| fields.iter().map(|(name, _)| value(job, name, now_ms)).collect())
        .collect();
    let text = if args.parsable2 || args.parsable {
        parsable(&fields, &rows, !args.noheader, args.parsable)
    } else {
        columns(&fields, &rows, !args.noheader)
    };
    let text = text.trim_end_matches('\n');
    if !text.is_empty() {
        outln!("{text}");
    }
    Ok(0)
}

/// `--format`'s fields, each with its width (`JobName%30`), or why not.
fn fields(text: &str) -> Result<Vec<(String, usize)>, CliError> {
    text.split(',')
        .filter(|field| !field.trim().is_empty())
        .map(|field| {
            let (name, width) = match field.trim().split_once('%') {
                Some((name, width)) => (name, width.parse().ok()),
                None => (field.trim(), None),
            };
            let canonical = FIELDS
                .iter()
                .find(|(known, _)| known.eq_ignore_ascii_case(name))
                .ok_or_else(|| CliError::Usage(format!("sacct: error: Invalid field requested: \"{name}\"")))?;
            Ok((canonical.0.to_string(), width.unwrap_or(canonical.1)))
        })
        .collect()
}

/// The fields gpool knows, with Slurm's default widths.
const FIELDS: [(&str, usize); 20] = [
    ("JobID", 12),
    ("JobIDRaw", 12),
    ("JobName", 10),
    ("Partition", 10),
    ("Account", 10),
    ("User", 9),
    ("State", 10),
    ("ExitCode", 8),
    ("Elapsed", 10),
    ("ElapsedRaw", 10),
    ("Start", 19),
    ("End", 19),
    ("Submit", 19),
    ("NodeList", 15),
    ("NNodes", 8),
    ("AllocTRES", 10),
    ("AllocCPUS", 10),
    ("Timelimit", 10),
    ("Reason", 10),
    ("Comment", 15),
];

/// Field `name` of `job`.
fn value(job: &pb::Job, name: &str, now_ms: i64) -> String {
    let spec = job.spec.clone().unwrap_or_default();
    let nodes = u64::from(spec.nodes.max(1));
    let started = job.started_at_ms.is_some();
    match name {
        "JobID" => format::job_id(job),
        "JobIDRaw" => job.id.to_string(),
        "JobName" => spec.name.clone(),
        "Partition" => super::partition(&spec),
        "Account" => spec.team.clone(),
        "User" => job.user.clone(),
        "State" if job.state() == pb::JobState::Cancelled && !job.cancelled_by.is_empty() => {
            format!("CANCELLED by {}", uid_of(&job.cancelled_by))
        }
        "State" => format::state_long(job),
        "ExitCode" => format::exit_code(job),
        "Elapsed" => format::sacct_duration(format::elapsed_secs(job, now_ms)),
        "ElapsedRaw" => format::elapsed_secs(job, now_ms).to_string(),
        "Start" => format::sacct_time(job.started_at_ms),
        "End" => format::sacct_time(job.ended_at_ms),
        "Submit" => format::sacct_time(Some(job.submitted_at_ms)),
        "NodeList" => format::node_list(job),
        "NNodes" => nodes.to_string(),
        "AllocTRES" if !started => String::new(),
        "AllocTRES" => alloc_tres(&spec, nodes),
        "AllocCPUS" => (u64::from(spec.cpus_per_gpu) * u64::from(spec.gpus) * nodes).to_string(),
        "Timelimit" => spec
            .time_limit
            .map_or_else(|| "UNLIMITED".into(), |limit| format::sacct_duration(limit.seconds)),
        "Reason" => super::squeue::reason(job).to_string(),
        _ => String::new(),
    }
}

/// Slurm's AllocTRES, its keys in Slurm's order.
fn alloc_tres(spec: &pb::JobSpec, nodes: u64) -> String {
    let gpus = u64::from(spec.gpus) * nodes;
    let mut parts = Vec::new();
    if spec.cpus_per_gpu > 0 {
        parts.push(format!("cpu={}", u64::from(spec.cpus_per_gpu) * gpus));
    }
    parts.push(format!("gres/gpu={gpus}"));
    if spec.mem_bytes > 0 {
        parts.push(format!("mem={}M", (spec.mem_bytes >> 20) * nodes));
    }
    parts.push(format!("node={nodes}"));
    parts.join(",")
}

/// A user's uid, as Slurm names who cancelled (the name where unknown here).
fn uid_of(user: &str) -> String {
    nix::unistd::User::from_name(user)
        .ok()
        .flatten()
        .map_or_else(|| user.to_string(), |found| found.uid.to_string())
}

/// `-S`/`-E`: a UTC day or moment, in ms.
fn moment(text: &str, flag: &str) -> Result<i64, CliError> {
    let full = match text.len() {
        10 => format!("{text}T00:00:00"),
        16 => format!("{text}:00"),
        _ => text.to_string(),
    };
    humantime::parse_rfc3339_weak(&full)
        .ok()
        .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|since| since.as_millis() as i64)
        .ok_or_else(|| {
            CliError::Usage(format!(
                "sacct: error: {flag} {text:?}: not a time such as 2026-11-29 or 2026-11-29T08:00:00"
            ))
        })
}

/// `-P` (and `-p`, with a trailing `|`) output.
fn parsable(fields: &[(String, usize)], rows: &[Vec<String>], header: bool, trailing: bool) -> String {
    let end = if trailing { "|" } else { "" };
    let mut text = String::new();
    if header {
        let names: Vec<&str> = fields.iter().map(|(name, _)| name.as_str()).collect();
        text.push_str(&format!("{}{end}\n", names.join("|")));
    }
    for row in rows {
        text.push_str(&format!("{}{end}\n", row.join("|")));
    }
    text
}

/// Fixed-width output: each column right-aligned in its width, cut to it
/// (a `+` marks a cut, as Slurm's does), under a header and a rule.
fn columns(fields: &[(String, usize)], rows: &[Vec<String>], header: bool) -> String {
    let cell = |value: &str, width: usize| {
        if value.chars().count() > width {
            let cut: String = value.chars().take(width.saturating_sub(1)).collect();
            format!("{cut}+")
        } else {
            format!("{value:>width$}")
        }
    };
    let line = |values: Vec<String>| values.join(" ") + "\n";
    let mut text = String::new();
    if header {
        text.push_str(&line(fields.iter().map(|(name, width)| cell(name, *width)).collect()));
        text.push_str(&line(fields.iter().map(|(_, width)| "-".repeat(*width)).collect()));
    }
    for row in rows {
        text.push_str(&line(
            row.iter()
                .zip(fields)
                .map(|(value, (_, width))| cell(value, *width))
                .collect(),
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_output_are_slurms() {
        let fields = fields("jobid,JobName%20,state").unwrap();
        assert_eq!(
            fields,
            [("JobID".to_string(), 12), ("JobName".into(), 20), ("State".into(), 10)]
        );
        let err = fields_err("JobID,Bogus");
        assert_eq!(err, "sacct: error: Invalid field requested: \"Bogus\"");
        let rows = vec![vec!["7".to_string(), "train".into(), "COMPLETED".into()]];
        assert_eq!(parsable(&fields, &rows, false, false), "7|train|COMPLETED\n");
        assert_eq!(
            parsable(&fields, &rows, true, true),
            "JobID|JobName|State|\n7|train|COMPLETED|\n"
        );
        let table = columns(&fields, &rows, true);
        assert_eq!(
            table.lines().collect::<Vec<_>>(),
            [
                "       JobID              JobName      State",
                "------------ -------------------- ----------",
                "           7                train  COMPLETED",
            ]
        );
        let spec = pb::JobSpec {
            gpus: 2,
            nodes: 2,
            mem_bytes: 4 << 30,
            ..Default::default()
        };
        assert_eq!(alloc_tres(&spec, 2), "gres/gpu=4,mem=8192M,node=2");
        assert_eq!(moment("2026-11-29", "-S").unwrap(), 1_795_910_400_000);
    }

    fn fields_err(text: &str) -> String {
        fields(text).unwrap_err().to_string()
    }
}
