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
                let handed = waiting.take().and_then(|supervisor| supervisor.hand(&line));
                let reply = match handed {
                    Some(pid) => LaunchReply::Started(pid),
                    // SAFETY: the spawner is single-threaded, so the child
                    // may do anything the parent could; it never returns.
                    None => match unsafe { nix::unistd::fork() } {
                        Ok(nix::unistd::ForkResult::Child) => {
                            become_supervisor();
                            supervise(&request, None)
                        }
                        Ok(nix::unistd::ForkResult::Parent { child }) => LaunchReply::Started(child.as_raw()),
                        Err(err) => LaunchReply::Refused(format!("cannot fork a supervisor: {err}")),
                    },
                };
                let parent = request.cgroup.as_ref().and_then(|cgroup| cgroup.dirs.first()?.parent());
                if let (None, Some(parent)) = (&cgroup_parent, parent) {
                    cgroup_parent = Some(parent.to_path_buf());
                }
                reply
            }
            Err(err) => LaunchReply::Refused(format!("bad launch request: {err}")),
        };
        let mut text = serde_json::to_vec(&reply).unwrap_or_default();
        text.push(b'\n');
        if stdout.write_all(&text).and_then(|()| stdout.flush()).is_err() {
            break;
        }
        // The next one, now that this launch is answered.
        if let (None, Some(parent)) = (&waiting, &cgroup_parent) {
            // What dead waiting supervisors left: looked for once a second
            // at most, not at every launch of a busy node.
            if cleaned_at.is_none_or(|at| at.elapsed() >= CLEAN_UP_EVERY) {
                crate::cgroup::Warm::clean_up_after_the_dead(parent);
                cleaned_at = Some(std::time::Instant::now());
            }
            waiting = Waiting::fork(parent);
        }
    }
    ExitCode::SUCCESS
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
    fn fork(cgroup_parent: &Path) -> Option<Waiting> {
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        use std::os::fd::AsRawFd;
        let (read_end, write_end) = nix::unistd::pipe2(OFlag::O_CLOEXEC).ok()?;
        // The spawner never waits on a supervisor: a request the pipe
        // cannot take at once goes to a supervisor forked for it instead.
        fcntl(write_end.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).ok()?;
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
    /// gone or the pipe is full (a request cut short is no JSON: the
    /// waiting supervisor then removes its cgroup and exits).
    fn hand(mut self, request: &str) -> Option<i32> {
        self.requests.write_all(request.as_bytes()).ok().map(|()| self.pid)
    }
}

/// The waiting supervisor: waits in a cgroup of its own for its request
/// (until the spawner closes the pipe), then supervises it; the spawner
/// gone, it leaves and removes that cgroup.
fn supervise_when_asked(cgroup_parent: &Path, mut requests: std::fs::File) -> ! {
    // On cgroup v2 it waits where it is: its job is born in its cgroup.
    let warm = crate::cgroup::Warm::works_under(cgroup_parent)
        .then(|| crate::cgroup::Warm::enter(cgroup_parent).ok())
        .flatten();
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
    running: Option<(std::process::Child, std::io::BufReader<std::process::ChildStdout>)>,
}

impl Spawner {
    pub fn new(program: PathBuf) -> Spawner {
        Spawner { program, running: None }
    }

    /// Starts a supervisor for `request`; returns its pid.
    pub fn launch(&mut self, request: &LaunchRequest) -> Result<i32, String> {
        let mut line = serde_json::to_vec(request).map_err(|err| err.to_string())?;
        line.push(b'\n');
        // A spawner that died is started again, once per launch.
        let mut last_err = String::new();
        for _ in 0..2 {
            match self.ask(&line) {
                Ok(LaunchReply::Started(pid)) => return Ok(pid),
                Ok(LaunchReply::Refused(reason)) => return Err(reason),
                Err(err) => {
                    last_err = err;
                    if let Some((mut child, _)) = self.running.take() {
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                }
            }
        }
        Err(format!("{}: {last_err}", self.program.display()))
    }

    fn ask(&mut self, line: &[u8]) -> Result<LaunchReply, String> {
        if self.running.is_none() {
            let mut child = Command::new(&self.program)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|err| format!("cannot start: {err}"))?;
            let stdout = child.stdout.take().ok_or("no stdout")?;
            self.running = Some((child, std::io::BufReader::new(stdout)));
        }
        let (child, replies) = self.running.as_mut().ok_or("not running")?;
        let stdin = child.stdin.as_mut().ok_or("no stdin")?;
        stdin.write_all(line).map_err(|err| format!("cannot send: {err}"))?;
        let mut reply = String::new();
        match replies.read_line(&mut reply) {
            Ok(0) => Err("it exited".into()),
            Ok(_) => serde_json::from_str(&reply).map_err(|err| format!("bad reply {reply:?}: {err}")),
            Err(err) => Err(format!("cannot read its reply: {err}")),
        }
    }
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
