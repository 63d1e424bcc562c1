//! The spawner's side of supervisors: the `gpool-supervise` process that
//! forks them (one kept forked and waiting in a cgroup of its own), and
//! the agent's end of it, `Spawner`.

use super::run::supervise;
use super::*;
use std::io::{BufRead, Write};
use std::process::{Command, ExitCode, Stdio};

/// What a supervisor does with a signal it outlives: an interactive job,
/// which leads a session of its own, is passed it (the rest of a job is in
/// the supervisor's group and got it already). SIGTERM, which ends an
/// attempt, comes with a hangup there: an interactive shell ignores
/// SIGTERM, and ends (with what it runs) when its terminal hangs up.
extern "C" fn outlive(signal: nix::libc::c_int) {
    let session = crate::terminal::JOB_SESSION.load(std::sync::atomic::Ordering::Relaxed);
    if session > 0 {
        // SAFETY: kill(2) is async-signal-safe.
        unsafe {
            nix::libc::kill(-session, signal);
            if signal == nix::libc::SIGTERM {
                nix::libc::kill(-session, nix::libc::SIGHUP);
            }
        }
    }
}

/// The spawner: serves launch requests until its stdin closes. Once it
/// knows where attempts' cgroups go (from the first request that has one),
/// it keeps the next supervisor forked and waiting in a cgroup of its own
/// (see `crate::cgroup::Warm`), so a launch costs neither a fork nor a
/// cgroup move on its way to the job.
pub fn main() -> ExitCode {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, SIGCHLD};
    // Supervisors are reaped by the kernel; none stays a zombie.
    let auto_reap = SigAction::new(SigHandler::SigIgn, SaFlags::SA_NOCLDWAIT, SigSet::empty());
    // SAFETY: setting SIG_IGN installs no handler code.
    let _ = unsafe { sigaction(SIGCHLD, &auto_reap) };
    let stdin = std::io::stdin().lock();
    let mut stdout = std::io::stdout().lock();
    let mut cgroup_parent: Option<PathBuf> = None;
    let mut waiting: Option<Waiting> = None;
    let mut cleaned_at: Option<std::time::Instant> = None;
    for line in stdin.lines() {
        let Ok(line) = line else { break };
        let reply = match serde_json::from_str::<LaunchRequest>(&line) {
            Ok(request) => {
                let parent = request.cgroup.as_ref().and_then(|cgroup| cgroup.dirs.first()?.parent());
                if let (None, Some(parent)) = (&cgroup_parent, parent) {
                    cgroup_parent = Some(parent.to_path_buf());
                }
                hand_over(&request, &line, waiting.take(), cgroup_parent.as_deref())
            }
            Err(err) => LaunchReply::Refused(format!("bad launch request: {err}")),
        };
        let mut text = serde_json::to_vec(&reply).unwrap_or_default();
        text.push(b'\n');
        if stdout.write_all(&text).and_then(|()| stdout.flush()).is_err() {
            break;
        }
        // The next one, now that this launch is answered.
        if waiting.is_none() {
            // What dead waiting supervisors left: looked for once a second
            // at most, not at every launch of a busy node.
            if let Some(parent) = cgroup_parent.as_deref() {
                if cleaned_at.is_none_or(|at| at.elapsed() >= CLEAN_UP_EVERY) {
                    crate::cgroup::Warm::clean_up_after_the_dead(parent);
                    cleaned_at = Some(std::time::Instant::now());
                }
            }
            waiting = Waiting::fork(cgroup_parent.as_deref());
        }
    }
    ExitCode::SUCCESS
}

/// Hands `request` (its JSON `line`) to a waiting supervisor (`waiting`,
/// else one forked for it), after marking the attempt's exit slot with
/// that supervisor's pid: an agent that dies before this answer reaches it
/// learns from the mark, once this spawner is gone, whether the attempt
/// was launched (`launched_pid`), and never launches it twice.
fn hand_over(
    request: &LaunchRequest,
    line: &str,
    waiting: Option<Waiting>,
    cgroup_parent: Option<&Path>,
) -> LaunchReply {
    let mut supervisor = waiting;
    // A waiting supervisor that died meanwhile is replaced, once.
    for _ in 0..2 {
        let Some(next) = supervisor.take().or_else(|| Waiting::fork(cgroup_parent)) else {
            return LaunchReply::Refused("cannot fork a supervisor".into());
        };
        let mark = super::launched_mark(request.job_id, request.epoch, next.pid);
        if let Err(err) = crate::spool::write_in_place(&request.exit_file, mark.as_bytes()) {
            eprintln!(
                "{SUPERVISOR_BIN}: {}: cannot mark the launch: {err}",
                request.exit_file.display()
            );
        }
        if let Some(pid) = next.hand(line) {
            return LaunchReply::Started(pid);
        }
    }
    LaunchReply::Refused("its supervisor exited before it could take the launch".into())
}

/// How often the spawner looks for cgroups of waiting supervisors that died.
const CLEAN_UP_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// A supervisor forked ahead of its launch request, which it reads whole
/// from a pipe.
struct Waiting {
    pid: i32,
    requests: std::fs::File,
}

impl Waiting {
    /// Forks a supervisor that waits (in a cgroup of its own under
    /// `cgroup_parent`, on cgroup v1) for the request it is handed.
    fn fork(cgroup_parent: Option<&Path>) -> Option<Waiting> {
        use nix::fcntl::OFlag;
        // Blocking: a request longer than the pipe holds waits for the
        // supervisor to read it, which it does as soon as it is ready.
        let (read_end, write_end) = nix::unistd::pipe2(OFlag::O_CLOEXEC).ok()?;
        // SAFETY: as for the spawner's other forks: single-threaded, and
        // the child never returns.
        match unsafe { nix::unistd::fork() }.ok()? {
            nix::unistd::ForkResult::Child => {
                drop(write_end);
                become_supervisor();
                supervise_when_asked(cgroup_parent, std::fs::File::from(read_end))
            }
            nix::unistd::ForkResult::Parent { child } => Some(Waiting {
                pid: child.as_raw(),
                requests: std::fs::File::from(write_end),
            }),
        }
    }

    /// Hands it `request` (one JSON line); its pid, or `None` when it is
    /// gone (a request cut short is no JSON: the waiting supervisor then
    /// removes its cgroup and exits).
    fn hand(mut self, request: &str) -> Option<i32> {
        self.requests.write_all(request.as_bytes()).ok().map(|()| self.pid)
    }
}

/// The waiting supervisor: waits in a cgroup of its own for its request
/// (until the spawner closes the pipe), then supervises it; the spawner
/// gone, it leaves and removes that cgroup.
fn supervise_when_asked(cgroup_parent: Option<&Path>, mut requests: std::fs::File) -> ! {
    // On cgroup v2 it waits where it is: its job is born in its cgroup.
    let warm = cgroup_parent
        .filter(|parent| crate::cgroup::Warm::works_under(parent))
        .and_then(|parent| crate::cgroup::Warm::enter(parent).ok());
    // Room for a whole request (its environment included), so that it
    // comes in one read instead of a run of growing ones.
    let mut text = String::with_capacity(16 * 1024);
    let request = std::io::Read::read_to_string(&mut requests, &mut text)
        .ok()
        .and_then(|_| serde_json::from_str::<LaunchRequest>(&text).ok());
    drop(requests);
    match request {
        Some(request) => supervise(&request, warm),
        None => {
            if let Some(warm) = warm {
                warm.discard();
            }
            // SAFETY: ends this forked child at once.
            unsafe { nix::libc::_exit(0) }
        }
    }
}

/// Signals a supervisor outlives (so it can record the job's end) while
/// they reach the job: everything the controller or a user may send to the
/// group. Faults, SIGKILL, SIGSTOP and SIGCHLD keep their defaults.
const OUTLIVED: [nix::sys::signal::Signal; 9] = {
    use nix::sys::signal::Signal::*;
    [
        SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, SIGPIPE, SIGXCPU,
    ]
};

/// What a forked child does to become a supervisor: the leader of a
/// session of its own, off the agent's pipes, outliving the signals that
/// reach its job.
fn become_supervisor() {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
    let _ = nix::unistd::setsid();
    // The spawner's pipes are the agent's; a supervisor lives on without them.
    if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        use std::os::fd::AsRawFd;
        let _ = nix::unistd::dup2(null.as_raw_fd(), 0);
        let _ = nix::unistd::dup2(null.as_raw_fd(), 1);
    }
    // Our own job must be waited for, not reaped by the kernel.
    let default = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    // A handler (unlike SIG_IGN) is reset by exec, so the job gets defaults.
    let outlive = SigAction::new(SigHandler::Handler(outlive), SaFlags::SA_RESTART, SigSet::empty());
    // SAFETY: SIG_DFL runs no code; `outlive` only calls kill(2), which is
    // async-signal-safe.
    unsafe {
        let _ = sigaction(Signal::SIGCHLD, &default);
        for signal in OUTLIVED {
            let _ = sigaction(signal, &outlive);
        }
    }
}

/// The agent's end of the spawner: one process, restarted if it dies.
pub struct Spawner {
    program: PathBuf,
    /// Where the running spawner's pid is kept, for a restarted agent to
    /// wait for the spawner its predecessor left (`Spawner::wait_for_old`).
    pid_file: PathBuf,
    running: Option<(std::process::Child, std::io::BufReader<std::process::ChildStdout>)>,
}

/// What became of a launch request.
#[derive(Debug)]
pub enum Launched {
    /// Its supervisor runs, with this pid.
    Running(i32),
    /// The spawner died before answering, and the attempt had already run
    /// to its end by the time the agent looked.
    Ended(Ended),
}

/// Why a request got no answer: the spawner could not be reached (nothing
/// was sent), or it died after the request was sent (it may have acted).
enum NoAnswer {
    Unsent(String),
    Sent(String),
}

impl Spawner {
    pub fn new(program: PathBuf, pid_file: PathBuf) -> Spawner {
        Spawner {
            program,
            pid_file,
            running: None,
        }
    }

    /// Starts a supervisor for `request`. A spawner that dies is started
    /// again; a request it may have acted on is looked up in the attempt's
    /// exit slot first, so an attempt is never launched twice.
    pub fn launch(&mut self, request: &LaunchRequest) -> Result<Launched, String> {
        let mut line = serde_json::to_vec(request).map_err(|err| err.to_string())?;
        line.push(b'\n');
        let mut last_err = String::new();
        for _ in 0..2 {
            match self.ask(&line) {
                Ok(LaunchReply::Started(pid)) => return Ok(Launched::Running(pid)),
                Ok(LaunchReply::Refused(reason)) => return Err(reason),
                Err(no_answer) => {
                    // Gone for good before the slot is read: it acts no more.
                    if let Some((mut child, _)) = self.running.take() {
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                    let (job_id, epoch) = (request.job_id, request.epoch);
                    match no_answer {
                        NoAnswer::Sent(err) => {
                            if let Some(pid) = super::launched_pid(&request.exit_file, job_id, epoch) {
                                return Ok(Launched::Running(pid));
                            }
                            if let Some(ended) = Ended::read(&request.exit_file, job_id, epoch) {
                                return Ok(Launched::Ended(ended));
                            }
                            last_err = err;
                        }
                        NoAnswer::Unsent(err) => last_err = err,
                    }
                }
            }
        }
        Err(format!("{}: {last_err}", self.program.display()))
    }

    fn ask(&mut self, line: &[u8]) -> Result<LaunchReply, NoAnswer> {
        if self.running.is_none() {
            let mut child = Command::new(&self.program)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|err| NoAnswer::Unsent(format!("cannot start: {err}")))?;
            // Kept before any request goes to it.
            if let Err(err) = crate::spool::write_in_place(&self.pid_file, format!("{}\n", child.id()).as_bytes()) {
                tracing::warn!("{}: {err}", self.pid_file.display());
            }
            let stdout = child.stdout.take().ok_or(NoAnswer::Unsent("no stdout".into()))?;
            self.running = Some((child, std::io::BufReader::new(stdout)));
        }
        let (child, replies) = self.running.as_mut().ok_or(NoAnswer::Unsent("not running".into()))?;
        let stdin = child.stdin.as_mut().ok_or(NoAnswer::Unsent("no stdin".into()))?;
        // A line cut short is no request: the spawner acts on whole lines.
        stdin
            .write_all(line)
            .map_err(|err| NoAnswer::Unsent(format!("cannot send: {err}")))?;
        let mut reply = String::new();
        match replies.read_line(&mut reply) {
            Ok(0) => Err(NoAnswer::Sent("it exited".into())),
            Ok(_) => serde_json::from_str(&reply).map_err(|err| NoAnswer::Sent(format!("bad reply {reply:?}: {err}"))),
            Err(err) => Err(NoAnswer::Sent(format!("cannot read its reply: {err}"))),
        }
    }

    /// Waits until the spawner a previous agent left (its pid in
    /// `pid_file`) is gone: it exits once it has answered what it read,
    /// and until then a launch of the previous agent may still be handed
    /// over. Killed after `patience`.
    pub fn wait_for_old(pid_file: &Path, patience: std::time::Duration) {
        let Some(pid) = std::fs::read_to_string(pid_file)
            .ok()
            .and_then(|text| text.trim().parse::<i32>().ok())
        else {
            return;
        };
        let is_spawner = || {
            is_spawner(
                &std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default(),
                pid,
            )
        };
        let deadline = std::time::Instant::now() + patience;
        while is_spawner() {
            if std::time::Instant::now() > deadline {
                tracing::warn!(pid, "the previous agent's spawner did not exit; killing it");
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// Whether `stat` (the text of /proc/PID/stat of `pid`) is a live spawner:
/// the supervisor's program, not a zombie, and not a supervisor (each of
/// those leads a session of its own).
fn is_spawner(stat: &str, pid: i32) -> bool {
    let Some((comm, rest)) = stat.split_once(") ") else {
        return false;
    };
    // comm is cut at 15 bytes; after "(comm) ": state, ppid, pgrp, session.
    let fields: Vec<&str> = rest.split(' ').collect();
    comm.ends_with(&format!("({}", &SUPERVISOR_BIN[..SUPERVISOR_BIN.len().min(15)]))
        && fields.first().is_some_and(|state| *state != "Z")
        && fields.get(3).is_some_and(|session| *session != pid.to_string())
}

impl Drop for Spawner {
    /// Closing its stdin ends the spawner; supervisors live on.
    fn drop(&mut self) {
        if let Some((mut child, _)) = self.running.take() {
            drop(child.stdin.take());
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_spawner_is_told_from_its_supervisors_and_from_the_dead() {
        let spawner = "4242 (gpool-supervise) S 4100 4100 4000 0 -1 4194560 231 0 0 0";
        assert!(super::is_spawner(spawner, 4242));
        let supervisor = "4300 (gpool-supervise) S 4242 4300 4300 0 -1 4194560 231 0 0 0";
        assert!(!super::is_spawner(supervisor, 4300), "a session leader is a supervisor");
        let zombie = "4242 (gpool-supervise) Z 4100 4100 4000 0 -1 4194560 231 0 0 0";
        assert!(!super::is_spawner(zombie, 4242));
        let other = "4242 (sh) S 4100 4100 4000 0 -1 4194560 231 0 0 0";
        assert!(!super::is_spawner(other, 4242));
    }
}
