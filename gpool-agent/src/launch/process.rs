//! Small helpers of an attempt's life: the event of its end, signals to
//! its process group, and whether (and when) its supervisor is gone.

use super::*;
use crate::supervise::Ended;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;

/// An ended attempt's event.
pub(super) fn end_event(job_id: u64, epoch: u64, ended: Ended) -> pb::JobEvent {
    use pb::job_event::Outcome;
    let (outcome, cause) = match ended {
        Ended::Code(code) => (Outcome::ExitCode(code), pb::EndCause::Own),
        Ended::Signal(signal) => (Outcome::Signal(signal), pb::EndCause::Own),
        Ended::FailedToStart(reason) => (Outcome::FailedToStart(reason), pb::EndCause::Own),
        Ended::TimedOut => (Outcome::Signal(Signal::SIGTERM as i32), pb::EndCause::TimeLimit),
        Ended::Fenced => (Outcome::Signal(Signal::SIGKILL as i32), pb::EndCause::Fenced),
        Ended::Vanished => (Outcome::Signal(Signal::SIGKILL as i32), pb::EndCause::Vanished),
        Ended::Killed(code) => (Outcome::ExitCode(code), pb::EndCause::Killed),
        Ended::KilledBy(signal) => (Outcome::Signal(signal), pb::EndCause::Killed),
        Ended::OutOfMemory => (Outcome::Signal(Signal::SIGKILL as i32), pb::EndCause::OutOfMemory),
        Ended::OutputLimit => (Outcome::Signal(Signal::SIGKILL as i32), pb::EndCause::OutputLimit),
    };
    pb::JobEvent {
        job_id,
        epoch,
        outcome: Some(outcome),
        cause: cause as i32,
    }
}

pub(super) fn signal_group(pgid: i32, signal: Signal) {
    if pgid > 0 {
        let _ = killpg(Pid::from_raw(pgid), signal);
        let _ = kill(Pid::from_raw(pgid), signal);
    }
}

/// Whether `pid` is still one of our supervisors (and not a reused pid):
/// a live session leader running the supervisor's program.
pub(super) fn supervisor_alive(pid: i32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let program = cmdline.split(|b| *b == 0).next().unwrap_or_default();
    program.ends_with(SUPERVISOR_BIN.as_bytes()) && leads_session(pid)
}

/// Whether `pid` is a live session leader (as supervisors and the jobs
/// the launcher forks are, and a reused pid most likely is not).
pub(super) fn leads_session(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // After "(comm) ": state, ppid, pgrp, session.
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .map_or(vec![], |(_, rest)| rest.split(' ').collect());
    fields.get(3).is_some_and(|session| *session == pid.to_string()) && fields.first() != Some(&"Z")
}

/// Waits, once a job the node's launcher forked has ended, for its exit
/// record: the launcher writes it once it has reaped the job (or, should
/// the launcher have died, its keeper does). Returns without one once
/// neither is left to write it.
pub(super) async fn await_record(attempt: &crate::journal::AttemptRecord, launcher: crate::supervise::Launcher) {
    let mut pause = Duration::from_micros(500);
    while Ended::read(&attempt.exit_file, attempt.job_id, attempt.epoch).is_none()
        && (launcher_alive(launcher.pid) || launcher_alive(launcher.keeper))
    {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Whether `pid` is a live launcher or keeper (`gpool-supervise`, not a
/// zombie).
fn launcher_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| crate::supervise::live_supervisor(&stat).is_some())
}

/// A process's exit: through a pidfd (which works for any process, our
/// child or not), or by polling /proc where no pidfd could be had.
pub(super) enum ProcessExit {
    Gone,
    Pidfd(tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>),
    Polled(i32),
}

impl ProcessExit {
    pub(super) fn open(pid: i32) -> std::io::Result<ProcessExit> {
        let fd = match crate::supervise::pidfd_open(pid) {
            Ok(fd) => fd,
            // Already gone (and reaped).
            Err(err) if err.raw_os_error() == Some(nix::libc::ESRCH) => return Ok(ProcessExit::Gone),
            Err(err) => return Err(err),
        };
        // SAFETY: the fd was just opened and nothing else owns it; the
        // AsyncFd owns it from here on and never replaces it.
        let registered = unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) };
        Ok(ProcessExit::Pidfd(registered?))
    }

    /// Resolves once the process has exited.
    pub(super) async fn wait(&self) {
        match self {
            ProcessExit::Gone => {}
            // A pidfd stays readable once its process has exited.
            ProcessExit::Pidfd(fd) => {
                if let Err(err) = fd.readable().await {
                    tracing::error!("waiting on a pidfd: {err}");
                }
            }
            ProcessExit::Polled(pid) => {
                while process_alive(*pid) {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
}

/// Whether `pid` exists and is not a zombie.
fn process_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

#[cfg(test)]
mod pidfd_tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn waits_for_a_process_to_exit() {
        // A process that is not our child, as supervisors are not.
        let mut parent = std::process::Command::new("sh")
            .args(["-c", "sleep 0.3 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(parent.stdout.take().unwrap()), &mut line).unwrap();
        let started = std::time::Instant::now();
        let exited = ProcessExit::open(line.trim().parse().unwrap()).unwrap();
        exited.wait().await;
        assert!(
            started.elapsed() > Duration::from_millis(200),
            "{:?}",
            started.elapsed()
        );
        let _ = parent.wait();
    }
}
