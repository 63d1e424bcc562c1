//! Slurm's ways of writing jobs, for the tools that parse `squeue` and
//! `sacct`: state names, durations, job ids, exit codes, `-o` formats.

use gpool_proto::pb;

/// Slurm's long state name (`%T`, sacct's State).
pub fn state_long(job: &pb::Job) -> String {
    match job.state() {
        pb::JobState::Pending => "PENDING".into(),
        pb::JobState::Running => "RUNNING".into(),
        pb::JobState::Completed => "COMPLETED".into(),
        pb::JobState::Failed => "FAILED".into(),
        pb::JobState::Cancelled => "CANCELLED".into(),
        pb::JobState::Timeout => "TIMEOUT".into(),
        pb::JobState::NodeFail => "NODE_FAIL".into(),
        pb::JobState::OutOfMemory => "OUT_OF_MEMORY".into(),
        pb::JobState::Unspecified => "UNKNOWN".into(),
    }
}

/// Slurm's compact state (`%t`).
pub fn state_short(job: &pb::Job) -> &'static str {
    match job.state() {
        pb::JobState::Pending => "PD",
        pb::JobState::Running => "R",
        pb::JobState::Completed => "CD",
        pb::JobState::Failed => "F",
        pb::JobState::Cancelled => "CA",
        pb::JobState::Timeout => "TO",
        pb::JobState::NodeFail => "NF",
        pb::JobState::OutOfMemory => "OOM",
        pb::JobState::Unspecified => "?",
    }
}

/// Which Slurm state names (long or compact, any case) `word` means.
pub fn state_matches(word: &str, job: &pb::Job) -> bool {
    let word = word.to_ascii_uppercase();
    word == state_long(job) || word == state_short(job) || (word == "ALL")
}

/// squeue's `%M`/`%l`: `M:SS`, `H:MM:SS`, or `D-HH:MM:SS`.
pub fn squeue_duration(secs: u64) -> String {
    let (days, hours, minutes, seconds) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match (days, hours) {
        (0, 0) => format!("{minutes}:{seconds:02}"),
        (0, _) => format!("{hours}:{minutes:02}:{seconds:02}"),
        _ => format!("{days}-{hours:02}:{minutes:02}:{seconds:02}"),
    }
}

/// sacct's Elapsed and Timelimit: `HH:MM:SS`, or `D-HH:MM:SS`.
pub fn sacct_duration(secs: u64) -> String {
    let (days, hours, minutes, seconds) = (secs / 86_400, secs / 3600 % 24, secs / 60 % 60, secs % 60);
    match days {
        0 => format!("{hours:02}:{minutes:02}:{seconds:02}"),
        _ => format!("{days}-{hours:02}:{minutes:02}:{seconds:02}"),
    }
}

/// A moment as sacct writes it: `2026-11-29T04:40:58` (UTC).
pub fn sacct_time(unix_ms: Option<i64>) -> String {
    unix_ms.map_or_else(
        || "Unknown".to_string(),
        |ms| crate::output::rfc3339(ms).trim_end_matches('Z').to_string(),
    )
}

/// The job's id as Slurm writes it: `123`, `120_3` for an array's task,
/// or `120_[4-999]` for an array's tasks still waiting.
pub fn job_id(job: &pb::Job) -> String {
    match (job.array_task_index, &job.array) {
        (Some(index), _) => format!("{}_{index}", job.array_job_id),
        (None, Some(array)) if !array.waiting_indices.is_empty() => {
            format!("{}_[{}]", job.id, array.waiting_indices)
        }
        _ => job.id.to_string(),
    }
}

/// An array's own record, not one of its tasks: Slurm lists the tasks
/// (and, while some wait, one line for those).
pub fn is_array_record(job: &pb::Job) -> bool {
    job.array.is_some() && job.array_task_index.is_none()
}

/// Seconds it ran (so far, for a running one) at `now_ms`.
pub fn elapsed_secs(job: &pb::Job, now_ms: i64) -> u64 {
    match job.started_at_ms {
        Some(started) => (job.ended_at_ms.unwrap_or(now_ms) - started).max(0) as u64 / 1000,
        None => 0,
    }
}

/// sacct's ExitCode: `code:signal`.
pub fn exit_code(job: &pb::Job) -> String {
    let signal = job
        .end_reason
        .strip_prefix("killed by signal ")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse::<i32>().ok());
    match (signal, job.exit_code) {
        (Some(signal), _) => format!("0:{signal}"),
        (None, Some(code)) => format!("{code}:0"),
        (None, None) => "0:0".into(),
    }
}

/// Its nodes, compressed (`gpu-[01-02]`); `None assigned` before a start.
pub fn node_list(job: &pb::Job) -> String {
    let nodes: Vec<String> = if job.placement.is_empty() {
        job.last_nodes.clone()
    } else {
        job.placement.iter().map(|part| part.node.clone()).collect()
    };
    if nodes.is_empty() {
        "None assigned".into()
    } else {
        gpool_core::slurm::hostlist(&nodes)
    }
}

/// One piece of an `-o` format: text as it is, or a field with its width
/// (`%.8j`: right-aligned in 8, `%8j` left-aligned, both cut to 8).
#[derive(Debug, PartialEq, Eq)]
pub enum Piece {
    Text(String),
    Field {
        letter: char,
        width: Option<usize>,
        right: bool,
    },
}

/// Parses an `-o` format such as `%.18i %.9P %.8j %R`.
pub fn parse_format(format: &str) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            text.push(c);
            continue;
        }
        if chars.peek() == Some(&'%') {
            chars.next();
            text.push('%');
            continue;
        }
        let right = chars.peek() == Some(&'.');
        if right {
            chars.next();
        }
        let mut digits = String::new();
        while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            digits.push(*d);
            chars.next();
        }
        let Some(letter) = chars.next() else { break };
        if !text.is_empty() {
            pieces.push(Piece::Text(std::mem::take(&mut text)));
        }
        pieces.push(Piece::Field {
            letter,
            width: digits.parse().ok(),
            right,
        });
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    pieces
}

/// One line of `pieces`, each field's value from `value`.
pub fn line(pieces: &[Piece], value: impl Fn(char) -> String) -> String {
    pieces
        .iter()
        .map(|piece| match piece {
            Piece::Text(text) => text.clone(),
            Piece::Field { letter, width, right } => fit(&value(*letter), *width, *right),
        })
        .collect()
}

/// `value` in a field of `width` (cut to it), right- or left-aligned.
pub fn fit(value: &str, width: Option<usize>, right: bool) -> String {
    let Some(width) = width else { return value.to_string() };
    let cut: String = value.chars().take(width).collect();
    if right {
        format!("{cut:>width$}")
    } else {
        format!("{cut:<width$}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_and_formats_are_slurms() {
        assert_eq!(squeue_duration(5), "0:05");
        assert_eq!(squeue_duration(754), "12:34");
        assert_eq!(squeue_duration(7200), "2:00:00");
        assert_eq!(squeue_duration(90_061), "1-01:01:01");
        assert_eq!(sacct_duration(5), "00:00:05");
        assert_eq!(sacct_duration(90_061), "1-01:01:01");
        assert_eq!(
            parse_format("%.18i %j%%"),
            vec![
                Piece::Field {
                    letter: 'i',
                    width: Some(18),
                    right: true
                },
                Piece::Text(" ".into()),
                Piece::Field {
                    letter: 'j',
                    width: None,
                    right: false
                },
                Piece::Text("%".into()),
            ]
        );
        assert_eq!(fit("PENDING", Some(2), true), "PE");
        assert_eq!(fit("7", Some(4), true), "   7");
        assert_eq!(fit("7", Some(4), false), "7   ");
    }

    #[test]
    fn ids_exit_codes_and_states_are_slurms() {
        let mut job = pb::Job {
            id: 125,
            array_job_id: 120,
            array_task_index: Some(3),
            exit_code: Some(129),
            end_reason: "killed by signal 1".into(),
            ..Default::default()
        };
        job.set_state(pb::JobState::Failed);
        assert_eq!(job_id(&job), "120_3");
        assert_eq!(exit_code(&job), "0:1");
        assert_eq!((state_long(&job).as_str(), state_short(&job)), ("FAILED", "F"));
        assert!(state_matches("f", &job) && state_matches("failed", &job) && !state_matches("R", &job));
        job.end_reason.clear();
        job.exit_code = Some(2);
        assert_eq!(exit_code(&job), "2:0");
        assert_eq!(node_list(&job), "None assigned");
        job.last_nodes = vec!["gpu-01".into(), "gpu-02".into()];
        assert_eq!(node_list(&job), "gpu-[01-02]");
    }
}
