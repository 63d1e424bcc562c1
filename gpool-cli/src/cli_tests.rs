//! The command line as clap reads it.

use super::Cli;
use clap::{CommandFactory, Parser};

/// Every command, flag and argument says what it is for, in `--help`
/// and in the man pages alike.
#[test]
fn everything_has_a_help_line() {
    fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
        let path = format!("{path} {}", command.get_name());
        if command.get_about().is_none() && path != " gpool" {
            missing.push(path.clone());
        }
        for arg in command.get_arguments() {
            let builtin = matches!(arg.get_id().as_str(), "help" | "version");
            if !builtin && arg.get_help().is_none() {
                missing.push(format!("{path} {}", arg.get_id()));
            }
        }
        for sub in command.get_subcommands() {
            walk(sub, &path, missing);
        }
    }
    let mut missing = Vec::new();
    walk(&Cli::command(), "", &mut missing);
    assert!(missing.is_empty(), "without a help line: {missing:#?}");
}

#[test]
fn a_script_takes_its_arguments_and_later_flags_win() {
    let cli = Cli::try_parse_from(["gpool", "submit", "-G", "2", "job.sh", "--lr", "1", "-G"]).unwrap();
    let super::Command::Submit(args) = cli.command else {
        panic!()
    };
    assert_eq!(args.command, ["job.sh", "--lr", "1", "-G"]);
    let cli = Cli::try_parse_from(["gpool", "submit", "--gpus", "1", "--gpus", "2", "--", "true"]);
    assert!(cli.is_ok(), "{:?}", cli.err());
    assert!(Cli::try_parse_from(["gpool", "submit", "-f", "x.toml", "job.sh"]).is_err());
}

#[test]
fn slurm_short_flags() {
    let cli = Cli::try_parse_from([
        "gpool",
        "submit",
        "-J",
        "train",
        "-t",
        "2h",
        "-N",
        "2",
        "-G",
        "4",
        "-p",
        "big",
        "-q",
        "high",
        "-a",
        "0-9%2",
        "-o",
        "out/%A_%a.log",
        "-e",
        "err/%j.log",
        "--",
        "true",
    ]);
    assert!(cli.is_ok(), "{:?}", cli.err());
}

fn submit_args(argv: &[&str]) -> super::cmd::submit::SubmitArgs {
    match Cli::try_parse_from(argv).map(|cli| cli.command) {
        Ok(super::Command::Submit(args)) => *args,
        Ok(_) => panic!("{argv:?} is not a submit"),
        Err(err) => panic!("{argv:?}: {err}"),
    }
}

/// Flags gpool knows are flags, wherever they stand before the script;
/// none of them is taken as the script.
#[test]
fn hold_and_wrap_are_submit_flags() {
    let args = submit_args(&["gpool", "submit", "--hold", "t.sh"]);
    assert!(args.hold);
    assert_eq!(args.command, ["t.sh"]);
    let args = submit_args(&["gpool", "submit", "-H", "-G", "1", "t.sh", "--hold"]);
    assert_eq!(args.command, ["t.sh", "--hold"], "after the script, its own");
    let args = submit_args(&["gpool", "submit", "--wrap", "echo hi"]);
    assert_eq!(args.wrap.as_deref(), Some("echo hi"));
    assert!(args.command.is_empty());
    assert!(Cli::try_parse_from(["gpool", "submit", "--wrap", "true", "--", "false"]).is_err());
    assert!(Cli::try_parse_from(["gpool", "submit", "--hold", "--pty", "--", "sh"]).is_err());
}

/// As squeue -u.
#[test]
fn jobs_takes_a_user_as_squeue_does() {
    for flag in ["-u", "--user"] {
        let cli = Cli::try_parse_from(["gpool", "jobs", flag, "alice"]);
        assert!(cli.is_ok(), "{flag}: {:?}", cli.err());
    }
}

/// `--output` stays the table/json switch; a file name given to it is
/// answered with gpool's flag for the job's output file.
#[test]
fn output_given_a_file_names_stdout() {
    let err = Cli::try_parse_from(["gpool", "submit", "--output=slurm-%j.out", "--", "true"])
        .err()
        .expect("refused");
    let said = super::cmd::submit::output_file_hint(&err).expect("a hint");
    assert!(
        said.contains("gpool's flag for the job's output file is --stdout (-o)"),
        "{said}"
    );
    let err = Cli::try_parse_from(["gpool", "jobs", "--output", "yaml"])
        .err()
        .expect("refused");
    assert_eq!(super::cmd::submit::output_file_hint(&err), None, "clap says it");
    assert!(Cli::try_parse_from(["gpool", "submit", "--output", "json", "--", "true"]).is_ok());
}
