//! What `gpool submit` says about words it cannot take: a flag it does
//! not know (with gpool's flag for Slurm's, or the nearest one), a batch
//! script it cannot read (with the command after `--` and in --wrap), and
//! a file name given to the global `--output`.

use super::SubmitArgs;
use crate::CliError;

/// Why a word where the command goes, which looks like a flag, is refused:
/// a flag gpool does not know (clap leaves it in the command), named with
/// gpool's word for what a Slurm user meant.
pub fn unknown_flag(flag: &str) -> String {
    let hint = flag_hint(flag).unwrap_or_else(|| " (gpool submit --help lists the flags)".to_string());
    format!("unknown flag {flag}{hint}; to run a command, put it after `--`")
}

/// Why a `#GPOOL` line's word is refused: it is no flag of gpool submit
/// (`at` is the script and the line).
pub fn unknown_script_flag(at: &str, flag: &str) -> String {
    let name = flag.split_once('=').map_or(flag, |(name, _)| name);
    let hint = flag_hint(flag).unwrap_or_default();
    format!(
        "{at}: #GPOOL unknown flag {flag}{hint} ({name} is not a gpool submit flag: fix or remove it on that line; gpool submit --help lists them)"
    )
}

/// gpool's flag for what `flag` means: Slurm's spelling of it, else the
/// submit flag closest to it (a typo); `None` when nothing is close.
fn flag_hint(flag: &str) -> Option<String> {
    let name = flag.split_once('=').map_or(flag, |(name, _)| name);
    let slurm = match name {
        "--gpus-per-task" | "--tres-per-node" | "--tres-per-task" => {
            ": gpool asks for GPUs with --gpus (the job's total), --gpus-per-node or --gres gpu:MODEL:N"
        }
        "--gpu" | "--ngpus" | "--num-gpus" => ": did you mean --gpus?",
        "--partition" => ": gpool's partitions are pools (--pool, -p)",
        "--account" | "-A" => ": gpool charges teams (--team) and projects (--project)",
        "--job-name" => ": gpool's flag for the job's name is --name (-J)",
        "--error" => ": gpool's flag for the job's stderr file is --stderr (-e)",
        "--chdir" | "-D" => ": gpool's flag for the working directory is --workdir",
        "--mail-user" => ": gpool says when a job starts or ends with --notify mail:ADDR",
        "--mail-type" => ": gpool's flag for which events to say is --notify-on",
        "--container-image" => ": gpool's flag for a container's image is --image",
        "--signal" => ": gpool's flag for the signal before a preemption is --checkpoint-signal",
        "--requeue" => ": gpool requeues by default (--no-requeue to fail instead)",
        "--time-limit" | "--walltime" => ": did you mean --time?",
        "--mem-per-cpu" => ": gpool limits memory per node (--mem) or per GPU (--mem-per-gpu)",
        _ => "",
    };
    if !slurm.is_empty() {
        return Some(slurm.to_string());
    }
    closest_flag(name).map(|known| format!(": did you mean {known}?"))
}

/// The submit flag (`--long`) nearest to `name` by edit distance, if one
/// is near enough to be a typo of it.
fn closest_flag(name: &str) -> Option<String> {
    let word = name.strip_prefix("--")?;
    let command = <SubmitArgs as clap::Args>::augment_args(clap::Command::new("submit"));
    let longs: Vec<&str> = command.get_arguments().filter_map(clap::Arg::get_long).collect();
    let limit = (word.chars().count() / 3).clamp(1, 3);
    longs
        .into_iter()
        .map(|long| (edit_distance(word, long), long))
        .filter(|(distance, _)| *distance <= limit)
        .min()
        .map(|(_, long)| format!("--{long}"))
}

/// Levenshtein distance between `a` and `b`, by characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (a_idx, a_char) in a.chars().enumerate() {
        let mut current = vec![a_idx + 1];
        for (b_idx, b_char) in b.iter().enumerate() {
            let substitute = previous[b_idx] + usize::from(a_char != *b_char);
            current.push(substitute.min(previous[b_idx + 1] + 1).min(current[b_idx] + 1));
        }
        previous = current;
    }
    previous[b.len()]
}

/// Refuses a batch script gpool cannot read, naming it; such a word is
/// most often a command meant to run (`gpool submit -G 1 sleep 10`), so the
/// refusal shows that command after `--` and in --wrap. `command` is the
/// script and its arguments, the end of `argv`.
pub fn check_script(argv: &[String], command: &[String]) -> Result<(), CliError> {
    let Some(script) = command.first() else {
        return Ok(());
    };
    let path = std::path::Path::new(script);
    let why = match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => "it is a directory".to_string(),
        Ok(_) => match std::fs::File::open(path) {
            Ok(_) => return Ok(()),
            Err(err) => err.to_string(),
        },
        Err(err) => err.to_string(),
    };
    let flags = argv
        .len()
        .checked_sub(command.len())
        .filter(|at| argv[*at..] == *command)
        .map_or(&[][..], |at| &argv[1.min(at)..at]);
    let before: Vec<String> = std::iter::once("gpool".to_string())
        .chain(flags.iter().map(|word| shell_quote(word)))
        .collect();
    let before = before.join(" ");
    let after: Vec<String> = command.iter().map(|word| shell_quote(word)).collect();
    Err(CliError::Usage(format!(
        "{script}: cannot read: {why}; it is taken as a batch script (no `--` before it). To run a command, put it after `--` ({before} -- {}) or give it to --wrap ({before} --wrap {})",
        after.join(" "),
        shell_quote(&command.join(" "))
    )))
}

/// `word` as a POSIX shell reads it back: as it is when it holds nothing
/// the shell treats specially, else in single quotes.
fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_-./:=%@+,".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// What to say when the global `--output` (table or json) is given a file
/// name, as Slurm's `--output=slurm-%j.out`: gpool's flag for the job's
/// output file. `None` for any other error, which clap says as it does.
pub fn output_file_hint(err: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if err.kind() != ErrorKind::InvalidValue {
        return None;
    }
    let Some(ContextValue::String(arg)) = err.get(ContextKind::InvalidArg) else {
        return None;
    };
    let Some(ContextValue::String(value)) = err.get(ContextKind::InvalidValue) else {
        return None;
    };
    let path_like = value.contains(['/', '.', '%', '~']);
    (arg.starts_with("--output") && path_like).then(|| {
        format!(
            "--output {value}: gpool's --output is the output format (table or json); gpool's flag for the job's output file is --stdout (-o), as Slurm's --output, and --stderr (-e) for its stderr"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_flag_in_a_script_names_file_line_and_the_nearest_flag() {
        let said = unknown_script_flag("train.sh:2", "--gpu-typ");
        assert_eq!(
            said,
            "train.sh:2: #GPOOL unknown flag --gpu-typ: did you mean --gpu-type? (--gpu-typ is not a gpool submit flag: fix or remove it on that line; gpool submit --help lists them)"
        );
        // `--` means nothing in a script.
        assert!(!said.contains("`--`"), "{said}");
        let said = unknown_script_flag("train.sh:3", "--frobnicate=1");
        assert!(said.contains("--frobnicate is not a gpool submit flag"), "{said}");
        assert!(!said.contains("did you mean"), "{said}");
    }

    #[test]
    fn slurm_spellings_name_gpools_flag() {
        assert!(unknown_flag("--job-name=train").contains("gpool's flag for the job's name is --name (-J)"));
        assert!(unknown_flag("--error=e.log").contains("--stderr (-e)"));
        assert!(unknown_flag("--chdir=/x").contains("--workdir"));
        assert_eq!(closest_flag("--nodelst").as_deref(), Some("--nodelist"));
        assert_eq!(closest_flag("--zzz"), None);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }

    #[test]
    fn a_word_that_is_no_readable_script_shows_the_command_after_dashes_and_in_wrap() {
        let argv: Vec<String> = ["/usr/bin/gpool", "submit", "-G", "1", "no-such-command-x", "10", "it's"]
            .map(String::from)
            .to_vec();
        let err = check_script(&argv, &argv[4..]).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let said = err.to_string();
        assert!(said.starts_with("no-such-command-x: cannot read: "), "{said}");
        assert!(
            said.contains("put it after `--` (gpool submit -G 1 -- no-such-command-x 10 'it'\\''s')"),
            "{said}"
        );
        assert!(
            said.contains("--wrap (gpool submit -G 1 --wrap 'no-such-command-x 10 it'\\''s')"),
            "{said}"
        );
        let dir = std::env::temp_dir();
        let argv = vec!["gpool".to_string(), "submit".to_string(), dir.display().to_string()];
        let said = check_script(&argv, &argv[2..]).unwrap_err().to_string();
        assert!(said.contains("it is a directory"), "{said}");
    }
}
