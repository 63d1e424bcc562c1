//! A job file (`[[job]]` tables, `gpool submit -f`) parsed into specs:
//! large files in runs of jobs, each error named with its line.

use super::*;
use crate::toml_text::line_of;
use std::collections::HashMap;

/// A job file: its `[[job]]` tables.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JobFile {
    job: Vec<toml::Spanned<JobSpecInput>>,
}

/// Parses a job file's text (`[[job]]` tables). `file` is only used to name
/// the file in errors. Each job is validated; the first bad one is reported
/// with its line.
pub fn parse_job_file(file: &str, text: &str) -> Result<Vec<JobSpec>, JobFileError> {
    parse_in_runs(file, text, JOBS_PER_PARSE)
}

/// As `parse_job_file`, `per_run` tables at a time.
pub(super) fn parse_in_runs(file: &str, text: &str, per_run: usize) -> Result<Vec<JobSpec>, JobFileError> {
    let runs = run_starts(text, per_run);
    match specs_of_runs(file, text, &runs) {
        Ok(specs) => Ok(specs),
        // Cut where no header was (in a multi-line string), or a syntax
        // error: parsed whole, it says which.
        Err(RunsError::Toml { .. }) if runs.len() > 1 => match specs_of_runs(file, text, &[0]) {
            Ok(specs) => Ok(specs),
            Err(err) => Err(err.into_file_error(file, text)),
        },
        Err(err) => Err(err.into_file_error(file, text)),
    }
}

/// Jobs parsed at a time from a large file: a parsed TOML document costs
/// about 2 KB a table, so a file of 100,000 jobs is parsed a run of
/// tables at a time rather than whole.
pub(super) const JOBS_PER_PARSE: usize = 1024;

/// Where the runs of `per_run` `[[job]]` tables begin: at 0, then
/// at the start of a line that holds only a `[[job]]` header. Such a line
/// inside a multi-line string is no header, but then the run before it
/// ends inside the string and does not parse, and the file is parsed
/// whole: runs that all parse are the file's own tables.
pub(super) fn run_starts(text: &str, per_run: usize) -> Vec<usize> {
    let mut starts = vec![0];
    let mut n_headers = 0;
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        let header = line
            .trim()
            .strip_prefix("[[job]]")
            .is_some_and(|rest| rest.trim_start().is_empty() || rest.trim_start().starts_with('#'));
        if header {
            if n_headers > 0 && n_headers % per_run == 0 {
                starts.push(at);
            }
            n_headers += 1;
        }
        at += line.len();
    }
    starts
}

enum RunsError {
    /// A run that starts at this byte is no TOML.
    Toml {
        at: usize,
        err: toml::de::Error,
    },
    File(JobFileError),
}

impl RunsError {
    fn into_file_error(self, file: &str, text: &str) -> JobFileError {
        match self {
            RunsError::Toml { at, err } => JobFileError {
                file: file.to_string(),
                line: err.span().map(|span| line_of(text, at + span.start)),
                message: crate::toml_text::message_of(&err, text.get(at..).unwrap_or_default()),
            },
            RunsError::File(err) => err,
        }
    }
}

/// The specs of the runs of `text` that begin at `starts`, in order. As
/// parsing the text whole: a syntax error anywhere wins over a bad job.
fn specs_of_runs(file: &str, text: &str, starts: &[usize]) -> Result<Vec<JobSpec>, RunsError> {
    let file_error = |line, message| JobFileError {
        file: file.to_string(),
        line,
        message,
    };
    // A dependency may name an earlier [[job]] of the file (never a later
    // one, so there is no cycle): the last one of that name before it.
    let mut earlier: HashMap<String, usize> = HashMap::new();
    let mut specs = Vec::new();
    let mut bad_job = None;
    let ends = starts.iter().skip(1).copied().chain([text.len()]);
    for (&at, end) in starts.iter().zip(ends) {
        let parsed: JobFile = toml::from_str(&text[at..end]).map_err(|err| RunsError::Toml { at, err })?;
        if bad_job.is_some() {
            continue;
        }
        for spanned in parsed.job {
            let job_idx = specs.len();
            let start = at + spanned.span().start;
            let input = spanned.into_inner();
            let name = input.name.clone();
            let name_of = |name: &str| {
                earlier
                    .get(name)
                    .map(|position| crate::deps::DepTarget::InRequest(position + 1))
            };
            // The line is counted only for an error (counting it for every
            // job made a large file quadratic).
            match input.into_spec_among(&name_of) {
                Ok(spec) => specs.push(spec),
                Err(err) => {
                    bad_job = Some(file_error(
                        Some(line_of(text, start)),
                        format!("job {}: {err}", job_idx + 1),
                    ));
                    break;
                }
            }
            if let Some(name) = name {
                earlier.insert(name, job_idx);
            }
        }
    }
    match bad_job {
        Some(err) => Err(RunsError::File(err)),
        None if specs.is_empty() => Err(RunsError::File(file_error(None, "has no [[job]] table".into()))),
        None => Ok(specs),
    }
}
