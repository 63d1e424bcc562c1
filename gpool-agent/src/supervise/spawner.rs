//! Supervisors, for the jobs that need one (a terminal, a container
//! runtime), forked by the node's launcher; and the agent's end of the
//! launcher, `Spawner`.

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

/// The spawner the agent starts: the node's launcher and its keeper
/// (`launcher`). Its one argument is the agent's directory of exit slots.
pub fn main() -> ExitCode {
    super::launcher::start(std::env::args_os().nth(1).map(PathBuf::from))
}

/// The launcher's side of supervisors, for the jobs that need one (a
/// terminal, a container runtime): each is forked when its launch comes.
#[derive(Default)]
pub(super) struct Supervisors {
    /// Where attempts' cgroups go, from the first request that has one.
    cgroup_parent: Option<PathBuf>,
    cleaned_at: Option<std::time::Instant>,
}

impl Supervisors {
    /// Hands `request` (its JSON `line`) to a new supervisor.
    pub(super) fn hand_over(&mut self, request: &LaunchRequest, line: &str) -> LaunchReply {
        let parent = request.cgroup.as_ref().and_then(|cgroup| cgroup.dirs.first()?.parent());
        if let (None, Some(parent)) = (&self.cgroup_parent, parent) {
            self.cgroup_parent = Some(parent.to_path_buf());
        }
        // What dead waiting supervisors left: looked for once a second
        // at most.
        if let Some(parent) = self.cgroup_parent.as_deref() {
            if self.cleaned_at.is_none_or(|at| at.elapsed() >= CLEAN_UP_EVERY) {
                crate::cgroup::Warm::clean_up_after_the_dead(parent);
                self.cleaned_at = Some(std::time::Instant::now());
            }
        }
        hand_over(request, line, self.cgroup_parent.as_deref())
    }
}

/// Hands `request` (its JSON `line`) to a supervisor forked for it, after
/// marking the attempt's exit slot with that supervisor's pid: an agent
/// that dies before this answer reaches it learns from the mark, once
/// this launcher is gone, whether the attempt was launched (`launched`),
/// and never launches it twice.
fn hand_over(request: &LaunchRequest, line: &str, cgroup_parent: Option<&Path>) -> LaunchReply {
    // A supervisor that died before it took the request is replaced, once.
    for _ in 0..2 {
        let Some(next) = Waiting::fork(cgroup_parent) else {
            return LaunchReply::Refused("cannot fork a supervisor".into());
        };
        let mark = super::launched_mark(request.job_id, request.epoch, next.pid, None);
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
    // Below jobs in the OOM order, as the agent (the launcher that forks
    // it stands at 0; its own job is set back to 0 before its exec).
    let _ = std::fs::write("/proc/self/oom_score_adj", crate::AGENT_OOM_SCORE_ADJ);
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

/// The agent's end of the launcher: one keeper and launcher pair, started
/// again if the launcher dies.
pub struct Spawner {
    program: PathBuf,
    /// Where the running launcher's pid is kept, for a restarted agent to
    /// wait for the launcher its predecessor left (`Spawner::wait_for_old`).
    pid_file: PathBuf,
    running: Option<Running>,
    /// Keepers of launchers that died, reaped once they end.
    retired: Vec<std::process::Child>,
    /// Where the ends the launcher announces go.
    notices: std::sync::Arc<super::EndNotices>,
}

/// The keeper the agent started, and its launcher's answers (read by a
/// thread of their own, which hands on the ends it announces).
struct Running {
    keeper: std::process::Child,
    replies: std::sync::mpsc::Receiver<Result<LaunchReply, String>>,
    launcher: Launcher,
}

/// What became of a launch request.
#[derive(Debug)]
pub enum Launched {
    /// Its supervisor runs, with this pid.
    Running(i32),
    /// The launcher forked the job itself: its pid, and the launcher's.
    Direct(i32, Launcher),
    /// The launcher died before answering, and the attempt had already run
    /// to its end by the time the agent looked.
    Ended(Ended),
}

/// Why a request got no answer: the launcher could not be reached (nothing
/// was sent), or it died after the request was sent (it may have acted).
enum NoAnswer {
    Unsent(String),
    Sent(String),
}

impl Spawner {
    pub fn new(program: PathBuf, pid_file: PathBuf, notices: std::sync::Arc<super::EndNotices>) -> Spawner {
        Spawner {
            program,
            pid_file,
            running: None,
            retired: Vec::new(),
            notices,
        }
    }

    /// Starts `request`'s attempt. A launcher that dies is started again;
    /// a request it may have acted on is looked up in the attempt's exit
    /// slot first, so an attempt is never launched twice.
    pub fn launch(&mut self, request: &LaunchRequest) -> Result<Launched, String> {
        let mut line = serde_json::to_vec(request).map_err(|err| err.to_string())?;
        line.push(b'\n');
        let mut last_err = String::new();
        for _ in 0..2 {
            match self.ask(&line) {
                Ok(LaunchReply::Started(pid)) => return Ok(Launched::Running(pid)),
                Ok(LaunchReply::Direct(pid)) => {
                    let launcher = self.running.as_ref().map(|running| running.launcher);
                    return launcher
                        .map(|launcher| Launched::Direct(pid, launcher))
                        .ok_or_else(|| "no launcher".to_string());
                }
                Ok(LaunchReply::Refused(reason)) => return Err(reason),
                Ok(LaunchReply::Ready(_) | LaunchReply::Ended(..)) => {
                    last_err = "it answered a request with something else".into()
                }
                Err(no_answer) => {
                    // Gone for good before the slot is read: it acts no
                    // more. Its keeper lives on while its jobs do.
                    self.retire();
                    let (job_id, epoch) = (request.job_id, request.epoch);
                    match no_answer {
                        NoAnswer::Sent(err) => {
                            match super::launched(&request.exit_file, job_id, epoch) {
                                Some((pid, None)) => return Ok(Launched::Running(pid)),
                                Some((pid, Some(launcher))) => return Ok(Launched::Direct(pid, launcher)),
                                None => {}
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

    /// Kills the running launcher (its keeper records its jobs' ends).
    fn retire(&mut self) {
        if let Some(running) = self.running.take() {
            let pid = nix::unistd::Pid::from_raw(running.launcher.pid);
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            if is_spawner(&stat, pid.as_raw()) {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            }
            self.retired.push(running.keeper);
        }
        self.retired
            .retain_mut(|keeper| keeper.try_wait().ok().flatten().is_none());
    }

    /// Starts a keeper and its launcher, and reads who they are.
    fn start(&mut self) -> Result<(), NoAnswer> {
        let exits = self.pid_file.with_file_name("exits");
        let mut keeper = Command::new(&self.program)
            .arg(exits)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|err| NoAnswer::Unsent(format!("cannot start: {err}")))?;
        let stdout = keeper.stdout.take().ok_or(NoAnswer::Unsent("no stdout".into()))?;
        let mut replies = std::io::BufReader::new(stdout);
        let mut greeting = String::new();
        let launcher = match replies
            .read_line(&mut greeting)
            .map(|_| serde_json::from_str(&greeting))
        {
            Ok(Ok(LaunchReply::Ready(launcher))) => launcher,
            _ => {
                let _ = keeper.kill();
                let _ = keeper.wait();
                return Err(NoAnswer::Unsent(format!("no greeting from it: {greeting:?}")));
            }
        };
        let (to_ask, answers) = std::sync::mpsc::channel();
        let notices = self.notices.clone();
        let reading = std::thread::Builder::new()
            .name("launcher".into())
            .spawn(move || read_replies(replies, &to_ask, &notices, launcher.pid));
        if let Err(err) = reading {
            let _ = keeper.kill();
            let _ = keeper.wait();
            return Err(NoAnswer::Unsent(format!("cannot start a thread to read it: {err}")));
        }
        // Kept before any request goes to it.
        if let Err(err) = crate::spool::write_in_place(&self.pid_file, format!("{}\n", launcher.pid).as_bytes()) {
            tracing::warn!("{}: {err}", self.pid_file.display());
        }
        self.running = Some(Running {
            keeper,
            replies: answers,
            launcher,
        });
        Ok(())
    }

    fn ask(&mut self, line: &[u8]) -> Result<LaunchReply, NoAnswer> {
        // A keeper that died (killed) can no longer stand in for its
        // launcher: the pair is let go (the launcher runs its jobs to
        // their ends) and a new one started.
        if let Some(running) = self.running.as_mut() {
            if !matches!(running.keeper.try_wait(), Ok(None)) {
                tracing::warn!(
                    pid = running.launcher.keeper,
                    "the launcher's keeper is gone; starting a new pair"
                );
                drop(running.keeper.stdin.take());
                self.running = None;
            }
        }
        if self.running.is_none() {
            self.start()?;
        }
        let running = self.running.as_mut().ok_or(NoAnswer::Unsent("not running".into()))?;
        let stdin = running
            .keeper
            .stdin
            .as_mut()
            .ok_or(NoAnswer::Unsent("no stdin".into()))?;
        // A line cut short is no request: the launcher acts on whole lines.
        stdin
            .write_all(line)
            .map_err(|err| NoAnswer::Unsent(format!("cannot send: {err}")))?;
        match running.replies.recv() {
            Ok(answer) => answer.map_err(NoAnswer::Sent),
            Err(_) => Err(NoAnswer::Sent("it exited".into())),
        }
    }

    /// Waits until the launcher a previous agent left (its pid in
    /// `pid_file`) no longer serves it: once it has answered what it read,
    /// it leaves that agent's session (and runs its jobs to their ends),
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
                tracing::warn!(pid, "the previous agent's launcher did not let go; killing it");
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// Reads the launcher `pid`'s stdout until it closes: answers go to the
/// request waiting for one, announced ends to `notices`.
fn read_replies(
    mut replies: std::io::BufReader<std::process::ChildStdout>,
    to_ask: &std::sync::mpsc::Sender<Result<LaunchReply, String>>,
    notices: &super::EndNotices,
    pid: i32,
) {
    let mut line = String::new();
    loop {
        line.clear();
        match replies.read_line(&mut line) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        match serde_json::from_str::<LaunchReply>(&line) {
            Ok(LaunchReply::Ended(job_id, epoch)) => notices.ended(job_id, epoch),
            Ok(answer) => {
                let _ = to_ask.send(Ok(answer));
            }
            Err(err) => {
                let _ = to_ask.send(Err(format!("bad reply {line:?}: {err}")));
            }
        }
    }
    notices.launcher_gone(pid);
}

/// Whether `stat` (the text of /proc/PID/stat of `pid`) is a live spawner:
/// the supervisor's program, not a zombie, and not a supervisor (each of
/// those leads a session of its own).
fn is_spawner(stat: &str, pid: i32) -> bool {
    // After "(comm) ": state, ppid, pgrp, session.
    super::live_supervisor(stat).is_some_and(|fields| fields.get(3).is_some_and(|session| *session != pid.to_string()))
}

impl Drop for Spawner {
    /// Closing its stdin lets the launcher go: it runs its jobs to their
    /// ends, then exits, and its keeper with it.
    fn drop(&mut self) {
        if let Some(mut running) = self.running.take() {
            drop(running.keeper.stdin.take());
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
