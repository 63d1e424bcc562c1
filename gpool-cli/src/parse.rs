//! The command line as gpool takes it: clap's parse, then, for `gpool
//! submit SCRIPT`, a second one with the script's `#GPOOL` lines first.

use crate::{cmd, Cli, CliError, Command};
use clap::Parser;

/// Parses `argv`; for a batch script, with its `#GPOOL` flags before the
/// command line's, so that the command line's win. A first word that looks
/// like a flag is one gpool does not know, never a script: it is refused
/// as such when the job is built. Exits as clap does on bad usage (2) and
/// --help (0).
pub fn command_line(argv: Vec<String>) -> Result<Cli, CliError> {
    let cli = parse_or_exit(&argv);
    let script = match &cli.command {
        Command::Submit(args) if !argv.iter().any(|arg| arg == "--") => args
            .command
            .first()
            .filter(|word| !looks_like_a_flag(word))
            .map(|script| (script.clone(), args.command.clone())),
        _ => None,
    };
    let Some((script, words)) = script else {
        return Ok(cli);
    };
    cmd::submit::check_script(&argv, &words)?;
    let with = cmd::submit::with_script_directives(argv, &script)?;
    let mut cli = parse_or_exit(&with);
    if let Command::Submit(args) = &mut cli.command {
        // A flag gpool does not know, from a #GPOOL line: named with its
        // line.
        if let Some(flag) = args.command.first().filter(|word| looks_like_a_flag(word)) {
            let line = std::fs::read_to_string(&script).ok().and_then(|text| {
                text.lines()
                    .position(|line| {
                        line.trim_start().starts_with("#GPOOL") && line.split_whitespace().any(|word| word == flag)
                    })
                    .map(|index| index + 1)
            });
            let at = line.map_or_else(|| script.clone(), |line| format!("{script}:{line}"));
            return Err(CliError::Usage(cmd::submit::unknown_script_flag(&at, flag)));
        }
        // The directives must leave the script where it was: a word or a
        // flag without its value there would run something else.
        if args.command.first() != Some(&script) {
            return Err(CliError::Usage(format!(
                "{script}: its #GPOOL lines must be whole flags (a flag without its value, or a bare word, takes the script's place)"
            )));
        }
        args.script = true;
    }
    Ok(cli)
}

fn looks_like_a_flag(word: &str) -> bool {
    word.len() > 1 && word.starts_with('-')
}

/// Parses the command line, or exits as clap does (2 for bad usage, 0 for
/// --help): a Slurm user's `--output FILE` is told gpool's flag for it.
fn parse_or_exit(argv: &[String]) -> Cli {
    Cli::try_parse_from(argv).unwrap_or_else(|err| {
        if let Some(said) = cmd::submit::output_file_hint(&err) {
            eprintln!("gpool: {said}");
            std::process::exit(2);
        }
        err.exit()
    })
}
