//! `sbatch [OPTIONS] SCRIPT [ARGS]` (or `--wrap CMD`): its options read
//! as the script's `#SBATCH` lines are, then `gpool submit` with them on
//! its command line, so they win over the script's own, as in Slurm.

use crate::CliError;
use std::sync::OnceLock;

/// How a submitted job's id is printed: `123` (gpool, and `sbatch
/// --parsable`), or `Submitted batch job 123` (sbatch).
static SAYS_SUBMITTED: OnceLock<bool> = OnceLock::new();

pub fn submitted_line(id: u64) -> String {
    if SAYS_SUBMITTED.get().copied().unwrap_or(false) {
        format!("Submitted batch job {id}")
    } else {
        id.to_string()
    }
}

/// sbatch's and srun's options that take no value (all others take one,
/// `=`-joined or as the next word).
const SWITCHES: [&str; 28] = [
    "-u",
    "--unbuffered",
    "-l",
    "--label",
    "-K",
    "--kill-on-bad-exit",
    "--pty",
    "--parsable",
    "--exclusive",
    "-H",
    "--hold",
    "--requeue",
    "--no-requeue",
    "-Q",
    "--quiet",
    "-v",
    "--verbose",
    "-W",
    "--wait",
    "--test-only",
    "--contiguous",
    "-O",
    "--overcommit",
    "-k",
    "--no-kill",
    "--spread-job",
    "--use-min-nodes",
    "--ignore-pbs",
];

pub async fn run(argv: Vec<String>) -> Result<u8, CliError> {
    let (mut options, rest) = split(&argv[1..]);
    let parsable = options.iter().any(|option| option == "--parsable");
    let _ = SAYS_SUBMITTED.set(!parsable);
    // What only the command line says: gpool's own flags.
    let mut own: Vec<String> = Vec::new();
    if let Some(at) = options
        .iter()
        .position(|option| option == "--wrap" || option.starts_with("--wrap="))
    {
        let option = options.remove(at);
        let command = match option.split_once('=') {
            Some((_, command)) => command.to_string(),
            None if at < options.len() => options.remove(at),
            None => String::new(),
        };
        own.extend(["--wrap".to_string(), command]);
    }
    if let Some(at) = options.iter().position(|option| option == "-W" || option == "--wait") {
        options.remove(at);
        own.push("--wait".into());
    }
    let mut gpool = vec!["gpool".to_string(), "submit".to_string()];
    gpool.extend(mapped(&options, "sbatch command line")?);
    gpool.extend(own);
    match rest.split_first() {
        Some((script, args)) => {
            gpool.push(script.clone());
            gpool.extend(args.iter().cloned());
        }
        None if gpool.iter().any(|word| word == "--wrap") => {}
        None => {
            return Err(CliError::Usage(
                "sbatch: error: no batch script named: give SCRIPT, or --wrap CMD".into(),
            ))
        }
    }
    let cli = crate::parse::command_line(gpool)?;
    crate::run(cli).await
}

/// Command-line `options`, read as `#SBATCH` lines are (`source` names
/// them in a refusal), as gpool flags.
pub(super) fn mapped(options: &[String], source: &str) -> Result<Vec<String>, CliError> {
    if options.is_empty() {
        return Ok(Vec::new());
    }
    let text = format!(
        "#!/bin/sh\n#SBATCH {}\n",
        options.iter().map(|word| quoted(word)).collect::<Vec<_>>().join(" ")
    );
    let read = crate::cmd::submit::read_sbatch_lines(source, &text)?;
    Ok(read.flags.into_iter().flat_map(|flags| flags.words).collect())
}

/// The options before the script, and the script with its arguments.
pub(super) fn split(words: &[String]) -> (Vec<String>, Vec<String>) {
    let mut options = Vec::new();
    let mut index = 0;
    while index < words.len() {
        let word = &words[index];
        if !word.starts_with('-') || word == "-" {
            break;
        }
        options.push(word.clone());
        let attached = word.contains('=') || (!word.starts_with("--") && word.len() > 2);
        if !attached && !SWITCHES.contains(&word.as_str()) && index + 1 < words.len() {
            index += 1;
            options.push(words[index].clone());
        }
        index += 1;
    }
    (options, words[index..].to_vec())
}

/// A word as an `#SBATCH` line holds it: quoted where it has spaces.
fn quoted(word: &str) -> String {
    if word.contains(char::is_whitespace) {
        format!("\"{}\"", word.replace('"', "\\\""))
    } else {
        word.to_string()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn options_end_at_the_script() {
        let words: Vec<String> = [
            "--parsable",
            "-J",
            "x",
            "--time=10",
            "-N2",
            "--exclusive",
            "job.sh",
            "-a",
            "1",
        ]
        .map(String::from)
        .to_vec();
        let (options, rest) = super::split(&words);
        assert_eq!(options, ["--parsable", "-J", "x", "--time=10", "-N2", "--exclusive"]);
        assert_eq!(rest, ["job.sh", "-a", "1"]);
        assert_eq!(super::quoted("echo hi"), "\"echo hi\"");
    }
}
