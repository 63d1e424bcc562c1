//! The node's launcher, and attempt supervisors where a job needs one.
//!
//! The agent starts one `gpool-supervise` process, the keeper, which forks
//! the launcher (`launcher.rs`): a small, single-threaded subreaper that
//! reads launch requests (one JSON line each) on its stdin and answers each
//! on its stdout. It forks each job itself, straight into its cgroup, as
//! the leader of a session of its own (so a kill of the group reaches
//! everything the job starts), watches it through a pidfd and writes how
//! it ended to its exit file as one line tagged with the job and epoch.
//! Interactive and container jobs get a supervisor of their own instead, a
//! fork of the launcher (`spawner.rs`, `run.rs`) that does the same for its
//! one job. Exit files are slots the agent reuses (overwriting a file costs
//! less than creating one); the tag tells a record from what an earlier
//! attempt left there. Because the launcher, not the agent, is the jobs'
//! parent, an agent that restarts finds each attempt again and still
//! learns its exit; the launcher, its keeper and supervisors outlive the
//! agent, and the keeper records the ends of a launcher's jobs should the
//! launcher die.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

mod birth;
mod group;
mod launcher;
mod notices;
mod prepare;
mod run;
mod spawner;
pub use group::kill_all_but_supervisor;
pub use notices::EndNotices;
pub use run::TIME_LIMIT_GRACE_MS;
pub use spawner::{main, Launched, Spawner};

/// The supervisor's binary, installed next to gpool-agent (and gpoold).
pub const SUPERVISOR_BIN: &str = "gpool-supervise";

/// A pidfd on `pid` (Linux 5.3+): readable once that process, a child of
/// ours or not, has exited.
pub fn pidfd_open(pid: i32) -> std::io::Result<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd.
    let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new fd nothing else owns.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) })
}

/// The fields after the command of a `/proc/PID/stat` line (state, ppid,
/// pgrp, session, ...) where it is a live `gpool-supervise` (a keeper, a
/// launcher or a supervisor; not a zombie); `None` for any other process.
pub fn live_supervisor(stat: &str) -> Option<Vec<&str>> {
    let (comm, rest) = stat.split_once(") ")?;
    // The kernel cuts a command at 15 bytes.
    let ours = comm.ends_with(&format!("({}", &SUPERVISOR_BIN[..SUPERVISOR_BIN.len().min(15)]));
    let fields: Vec<&str> = rest.split(' ').collect();
    (ours && fields.first().is_some_and(|state| *state != "Z")).then_some(fields)
}

/// How an attempt ended, as the exit file records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    Code(i32),
    Signal(i32),
    FailedToStart(String),
    /// Its supervisor ended it when its time limit ran out.
    TimedOut,
    /// Its supervisor stopped it when the node's lease ran out (gpoold
    /// could not be reached for long enough that it requeues the job).
    Fenced,
    /// Its supervisor is gone without a record (killed, or the node
    /// rebooted).
    Vanished,
    /// Exited with this code after the agent killed it.
    Killed(i32),
    /// Ended by this signal after the agent killed it.
    KilledBy(i32),
    /// The OOM killer of its memory limit ended it.
    OutOfMemory,
    /// Its supervisor ended it when its output passed `max_output`.
    OutputLimit,
}

impl Ended {
    pub fn to_line(&self) -> String {
        match self {
            Ended::Code(code) => format!("code {code}"),
            Ended::Signal(signal) => format!("signal {signal}"),
            Ended::FailedToStart(reason) => format!("failed {reason}"),
            Ended::TimedOut => "timeout -".into(),
            Ended::Fenced => "fenced -".into(),
            Ended::Vanished => "vanished -".into(),
            Ended::Killed(code) => format!("killed {code}"),
            Ended::KilledBy(signal) => format!("killedby {signal}"),
            Ended::OutOfMemory => "oom -".into(),
            Ended::OutputLimit => "output -".into(),
        }
    }

    pub fn parse(line: &str) -> Option<Ended> {
        let (kind, rest) = line.trim().split_once(' ')?;
        match kind {
            "code" => rest.parse().ok().map(Ended::Code),
            "signal" => rest.parse().ok().map(Ended::Signal),
            "failed" => Some(Ended::FailedToStart(rest.to_string())),
            "timeout" => Some(Ended::TimedOut),
            "fenced" => Some(Ended::Fenced),
            "vanished" => Some(Ended::Vanished),
            "killed" => rest.parse().ok().map(Ended::Killed),
            "killedby" => rest.parse().ok().map(Ended::KilledBy),
            "oom" => Some(Ended::OutOfMemory),
            "output" => Some(Ended::OutputLimit),
            _ => None,
        }
    }

    /// The record of attempt `epoch` of `job_id` in `exit_file`, if its
    /// supervisor wrote one. Only a line with its newline counts: a
    /// half-written "code 12" is not code 1.
    pub fn read(exit_file: &Path, job_id: u64, epoch: u64) -> Option<Ended> {
        let text = std::fs::read_to_string(exit_file).ok()?;
        let record = text.strip_suffix('\n')?.strip_prefix(&format!("{job_id} {epoch} "))?;
        Ended::parse(record)
    }
}

/// The node's launcher that forked a job itself, and the keeper it was
/// forked from (which records the ends of its jobs should it die).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Launcher {
    pub pid: i32,
    pub keeper: i32,
}

/// Who runs attempt `epoch` of `job_id`, from the mark left in its exit
/// slot before anything of it ran (its end record replaces the mark): the
/// pid of its supervisor, or of the job itself with the launcher that
/// forked it. A restarted agent that journaled only its intent to launch
/// learns from it whether the launch happened.
pub fn launched(exit_file: &Path, job_id: u64, epoch: u64) -> Option<(i32, Option<Launcher>)> {
    let text = std::fs::read_to_string(exit_file).ok()?;
    let mark = text
        .strip_suffix('\n')?
        .trim_end()
        .strip_prefix(&format!("{job_id} {epoch} launched "))?;
    let numbers: Vec<i32> = mark.split(' ').map(str::parse).collect::<Result<_, _>>().ok()?;
    match numbers[..] {
        [pid] if pid > 0 => Some((pid, None)),
        [pid, launcher, keeper] if pid > 0 => Some((pid, Some(Launcher { pid: launcher, keeper }))),
        _ => None,
    }
}

/// The end record `Ended::read` reads (padded: a truncation costs the
/// filesystem a walk of the file's blocks; readers trim the padding).
pub(crate) fn end_record(job_id: u64, epoch: u64, ended: &Ended) -> String {
    padded(format!("{job_id} {epoch} {}", ended.to_line()))
}

/// A slot's line, padded with spaces before its newline to at least
/// `RECORD_WIDTH` bytes, so that a mark and a record of usual ids replace
/// each other in place without cutting the file.
fn padded(line: String) -> String {
    format!("{line:<width$}\n", width = RECORD_WIDTH - 1)
}

const RECORD_WIDTH: usize = 64;

/// The mark `launched` reads.
fn launched_mark(job_id: u64, epoch: u64, pid: i32, launcher: Option<Launcher>) -> String {
    padded(match launcher {
        None => format!("{job_id} {epoch} launched {pid}"),
        Some(Launcher { pid: by, keeper }) => format!("{job_id} {epoch} launched {pid} {by} {keeper}"),
    })
}

/// What the agent asks the spawner to run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LaunchRequest {
    pub exit_file: PathBuf,
    pub job_id: u64,
    pub epoch: u64,
    pub program: String,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub workdir: Option<PathBuf>,
    /// Created (truncated) by the supervisor; `None` is /dev/null.
    pub stdout: Option<PathBuf>,
    pub stderr: Option<PathBuf>,
    /// Files the job named for its stdout and stderr (`-o/-e`, absolute):
    /// opened by the job's own user, in place of `stdout`/`stderr`;
    /// truncated on the first attempt, appended to on later ones.
    #[serde(default)]
    pub user_stdout: Option<PathBuf>,
    #[serde(default)]
    pub user_stderr: Option<PathBuf>,
    #[serde(default)]
    pub append_output: bool,
    /// Created by the supervisor if missing.
    pub checkpoint_dir: PathBuf,
    /// Run the job as this user; `None` runs it as the spawner's user.
    pub run_as: Option<RunAs>,
    /// The attempt's own cgroup, where the host offers one: the job runs
    /// in it, and whatever is left in it when the job ends is killed.
    #[serde(default)]
    pub cgroup: Option<crate::cgroup::AttemptCgroup>,
    /// A container job: `program` is its runtime, which runs as this
    /// process's user (the job's user is set inside); this command line
    /// removes what is left of the container when the runtime ends.
    #[serde(default)]
    pub container_cleanup: Option<Vec<String>>,
    /// A container job: `env` goes into this file (0600, removed at the
    /// end) for the runtime's --env-file, not into the runtime's own
    /// environment.
    #[serde(default)]
    pub container_env_file: Option<PathBuf>,
    /// The supervisor ends the attempt when this much time has passed
    /// since it started (it outlives the agent, so limits hold while the
    /// agent is down).
    #[serde(default)]
    pub time_limit_ms: Option<u64>,
    /// The most its stdout or its stderr file may hold: past it the job
    /// is ended, its file cut there with a line that says so.
    #[serde(default)]
    pub max_output: Option<u64>,
    /// A requeueable attempt: the supervisor stops it when the node's
    /// lease runs out.
    #[serde(default)]
    pub fence: Option<Fence>,
    /// An interactive attempt: it runs on a terminal of its own, whose
    /// output goes to `stdout` (`stderr` is not used).
    #[serde(default)]
    pub pty: Option<crate::terminal::Pty>,
}

/// How a supervisor stops its attempt when the node's lease runs out.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fence {
    /// The lease the agent renews with each answer from gpoold.
    pub lease_file: PathBuf,
    /// Sent to the attempt first (its checkpoint signal, or SIGTERM).
    pub signal: i32,
    /// The most the attempt may take after the signal (the lease's grace
    /// caps it).
    pub grace_ms: u64,
}

/// The node's lease, as `<spool>/lease` records it: until when (ms of
/// CLOCK_BOOTTIME, which every process of the host shares and which counts
/// suspended time too) requeueable attempts may run, and the grace they get
/// after that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub until_ms: u64,
    pub grace_ms: u64,
}

impl Lease {
    /// One fixed-width line, so each renewal overwrites the last in place
    /// (and supervisors of an earlier release read it as before).
    pub fn to_line(self) -> String {
        format!("{:020} {:020}\n", self.until_ms, self.grace_ms)
    }

    pub fn parse(text: &str) -> Option<Lease> {
        let (until, grace) = text.strip_suffix('\n')?.split_once(' ')?;
        Some(Lease {
            until_ms: until.parse().ok()?,
            grace_ms: grace.parse().ok()?,
        })
    }

    /// The lease, once two reads in a row agree: a read that caught a
    /// renewal half written is not taken for a lease.
    pub fn read(path: &Path) -> Option<Lease> {
        let mut last = std::fs::read_to_string(path).ok()?;
        for _ in 0..3 {
            let now = std::fs::read_to_string(path).ok()?;
            if now == last {
                return Lease::parse(&now);
            }
            last = now;
        }
        None
    }

    /// Overwrites the lease file in place: a renewal needs no new block,
    /// so a spool a job has filled never stops the lease.
    pub fn write(self, path: &Path) -> std::io::Result<()> {
        crate::spool::write_in_place(path, self.to_line().as_bytes())
    }
}

/// Milliseconds of CLOCK_BOOTTIME: the same in every process of the host.
pub fn boot_ms() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map_or(0, |t| t.tv_sec() as u64 * 1000 + t.tv_nsec() as u64 / 1_000_000)
}

/// A user to run a job as, looked up by the agent (so a supervisor makes
/// no user-database lookups of its own).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunAs {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub home: PathBuf,
    /// Its login shell (the job's `SHELL`).
    #[serde(default)]
    pub shell: PathBuf,
}

/// The variables a job gets from the account it runs as, as a login sets
/// them: `USER`, `LOGNAME`, `HOME`, `SHELL`.
pub fn account_env(name: &str, home: &std::path::Path, shell: &std::path::Path) -> Vec<(String, String)> {
    let mut env = vec![
        ("USER".to_string(), name.to_string()),
        ("LOGNAME".to_string(), name.to_string()),
        ("HOME".to_string(), home.display().to_string()),
    ];
    if !shell.as_os_str().is_empty() {
        env.push(("SHELL".to_string(), shell.display().to_string()));
    }
    env
}

/// This process's own account, for jobs it runs as itself.
pub fn own_account() -> Vec<(String, String)> {
    match nix::unistd::User::from_uid(nix::unistd::geteuid()) {
        Ok(Some(user)) => account_env(&user.name, &user.dir, &user.shell),
        _ => Vec::new(),
    }
}

impl RunAs {
    /// The user `name` of this node's user database; `None` when `name` is
    /// the user this process already runs as.
    pub fn lookup(name: &str) -> Result<Option<RunAs>, String> {
        let user = nix::unistd::User::from_name(name)
            .map_err(|err| format!("cannot look up user {name:?}: {err}"))?
            .ok_or_else(|| format!("user {name:?} does not exist on this node"))?;
        if user.uid == nix::unistd::geteuid() {
            return Ok(None);
        }
        let c_name = std::ffi::CString::new(name).map_err(|err| format!("user name {name:?}: {err}"))?;
        let groups = nix::unistd::getgrouplist(&c_name, user.gid)
            .map_err(|err| format!("cannot list the groups of {name:?}: {err}"))?;
        Ok(Some(RunAs {
            name: user.name,
            uid: user.uid.as_raw(),
            gid: user.gid.as_raw(),
            groups: groups.iter().map(|g| g.as_raw()).collect(),
            home: user.dir,
            shell: user.shell,
        }))
    }
}

/// The launcher's answer: the supervisor's pid (also its session and
/// group id), the job's own pid where the launcher forked it itself (also
/// its session and group id), or why there is none. Its first line, before
/// any request, says who it is.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LaunchReply {
    Started(i32),
    Direct(i32),
    Refused(String),
    Ready(Launcher),
    /// Not an answer: the end of this attempt (job, epoch) is recorded.
    Ended(u64, u64),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_renewed_in_place_and_reads_as_the_last_release_wrote_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lease");
        let first = Lease {
            until_ms: 5_000,
            grace_ms: 30_000,
        };
        first.write(&path).unwrap();
        let next = Lease {
            until_ms: 123_456_789,
            grace_ms: 10_000,
        };
        next.write(&path).unwrap();
        assert_eq!(Lease::read(&path), Some(next));
        assert_eq!(first.to_line().len(), next.to_line().len(), "fixed width");
        // The earlier release's line, and its way of reading ours.
        assert_eq!(Lease::parse("5000 30000\n"), Some(first));
        let (until, grace) = next
            .to_line()
            .trim_end()
            .split_once(' ')
            .map(|(u, g)| (u.parse::<u64>(), g.parse::<u64>()))
            .unwrap();
        assert_eq!((until, grace), (Ok(123_456_789), Ok(10_000)));
    }

    #[test]
    fn exit_lines_round_trip() {
        for ended in [
            Ended::Code(0),
            Ended::Code(-3),
            Ended::Signal(9),
            Ended::FailedToStart("no such file".into()),
            Ended::TimedOut,
            Ended::Fenced,
            Ended::Vanished,
            Ended::Killed(0),
            Ended::KilledBy(15),
            Ended::OutOfMemory,
            Ended::OutputLimit,
        ] {
            assert_eq!(Ended::parse(&ended.to_line()), Some(ended));
        }
        assert_eq!(Ended::parse("garbage"), None);
    }

    #[test]
    fn only_a_whole_record_of_the_same_attempt_counts() {
        let dir = tempfile::tempdir().unwrap();
        let slot = dir.path().join("0");
        std::fs::write(&slot, "12 3 code 17\n").unwrap();
        assert_eq!(Ended::read(&slot, 12, 3), Some(Ended::Code(17)));
        assert_eq!(Ended::read(&slot, 12, 4), None, "an earlier attempt's record");
        assert_eq!(Ended::read(&slot, 1, 3), None, "another job's record");
        std::fs::write(&slot, "12 3 code 1").unwrap();
        assert_eq!(Ended::read(&slot, 12, 3), None, "half written");
    }

    /// An end record replaces a launch mark in place, as wide or wider,
    /// and reads back whole through its padding.
    #[test]
    fn an_end_record_covers_the_mark_it_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let slot = dir.path().join("0");
        let launcher = Some(Launcher {
            pid: 3_999_999,
            keeper: 3_999_998,
        });
        let mark = launched_mark(4_000_000_123, 2, 4_194_303, launcher);
        crate::spool::write_in_place(&slot, mark.as_bytes()).unwrap();
        assert_eq!(launched(&slot, 4_000_000_123, 2), Some((4_194_303, launcher)));
        for ended in [
            Ended::Code(0),
            Ended::FailedToStart("cannot run \"x\": no such file".into()),
        ] {
            let record = end_record(4_000_000_123, 2, &ended);
            assert_eq!(record.len(), mark.len(), "{record:?} is not as wide as {mark:?}");
            crate::spool::write_in_place(&slot, record.as_bytes()).unwrap();
            assert_eq!(std::fs::read_to_string(&slot).unwrap(), record);
            assert_eq!(Ended::read(&slot, 4_000_000_123, 2), Some(ended));
        }
        crate::spool::write_in_place(&slot, b"1 1 code 3\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(&slot).unwrap(),
            "1 1 code 3\n",
            "a longer file is cut"
        );
    }
}
