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
