//! The per-attempt supervisor: `gpool-supervise EXIT_FILE CMD...`.
//!
//! The agent starts each attempt through this small process. It makes itself
//! the leader of a new session (so a kill of the group reaches everything the
//! job starts), runs the command as its child, and writes how the command
//! ended to EXIT_FILE. Because it, not the agent, is the command's parent, an
//! agent that restarts finds the attempt again and still learns its exit.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, ExitCode};

/// The supervisor's binary, installed next to gpool-agent (and gpoold).
pub const SUPERVISOR_BIN: &str = "gpool-supervise";

/// How an attempt ended, as the exit file records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    Code(i32),
    Signal(i32),
    FailedToStart(String),
}

impl Ended {
    pub fn to_line(&self) -> String {
        match self {
            Ended::Code(code) => format!("code {code}"),
            Ended::Signal(signal) => format!("signal {signal}"),
            Ended::FailedToStart(reason) => format!("failed {reason}"),
        }
    }

    pub fn parse(line: &str) -> Option<Ended> {
        let (kind, rest) = line.trim().split_once(' ')?;
        match kind {
            "code" => rest.parse().ok().map(Ended::Code),
            "signal" => rest.parse().ok().map(Ended::Signal),
            "failed" => Some(Ended::FailedToStart(rest.to_string())),
            _ => None,
        }
    }

    /// The exit file of a finished supervisor, if it wrote one. Only a
    /// line with its newline counts: a half-written "code 12" is not code 1.
    pub fn read(exit_file: &Path) -> Option<Ended> {
        let text = std::fs::read_to_string(exit_file).ok()?;
        Ended::parse(text.strip_suffix('\n')?)
    }
}

extern "C" fn ignore(_: nix::libc::c_int) {}

/// Runs the supervisor; `args` are its arguments.
pub fn main(args: &[String]) -> ExitCode {
    let [exit_file, program, rest @ ..] = args else {
        eprintln!("usage: {SUPERVISOR_BIN} EXIT_FILE PROGRAM [ARGS...]");
        return ExitCode::from(2);
    };
    let _ = nix::unistd::setsid();
    // Outlive the SIGTERM sent to the whole group so the exit is recorded.
    // A handler (unlike SIG_IGN) is reset by exec, so the job gets defaults.
    let handler = nix::sys::signal::SigAction::new(
        nix::sys::signal::SigHandler::Handler(ignore),
        nix::sys::signal::SaFlags::SA_RESTART,
        nix::sys::signal::SigSet::empty(),
    );
    for signal in [
        nix::sys::signal::SIGTERM,
        nix::sys::signal::SIGINT,
        nix::sys::signal::SIGHUP,
    ] {
        // SAFETY: the handler does nothing, so it is async-signal-safe.
        let _ = unsafe { nix::sys::signal::sigaction(signal, &handler) };
    }
    let ended = match Command::new(program).args(rest).status() {
        Ok(status) => match (status.code(), status.signal()) {
            (Some(code), _) => Ended::Code(code),
            (None, Some(signal)) => Ended::Signal(signal),
            (None, None) => Ended::FailedToStart("no exit status".into()),
        },
        Err(err) => Ended::FailedToStart(format!("cannot run {program:?}: {err}")),
    };
    // One short write: a reader that catches it half written (only the
    // agent's recovery can, while this process still runs) finds no valid
    // line and looks again once this process is gone.
    match std::fs::write(exit_file, format!("{}\n", ended.to_line())) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("{SUPERVISOR_BIN}: {exit_file}: {err}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_lines_round_trip() {
        for ended in [
            Ended::Code(0),
            Ended::Code(-3),
            Ended::Signal(9),
            Ended::FailedToStart("no such file".into()),
        ] {
            assert_eq!(Ended::parse(&ended.to_line()), Some(ended));
        }
        assert_eq!(Ended::parse("garbage"), None);
    }
}
