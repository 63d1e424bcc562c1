//! Attempt supervisors and the spawner that forks them.
//!
//! The agent starts one `gpool-supervise` process, the spawner: a small,
//! single-threaded process that reads launch requests (one JSON line each)
//! on its stdin and answers each with the pid of a new supervisor on its
//! stdout. A supervisor is a fork of the spawner (no exec of its own, so an
//! attempt costs one exec: the job's). It makes itself the leader of a new
//! session (so a kill of the group reaches everything the job starts), runs
//! the command as its child, and writes how the command ended to its exit
//! file as one line tagged with the job and epoch. Exit files are slots the
//! agent reuses (overwriting a file costs less than creating one); the tag
//! tells a record from what an earlier attempt left there. Because the
//! supervisor, not the agent, is the command's parent, an agent that
//! restarts finds the attempt again and still learns its exit; supervisors
//! outlive the spawner and the agent alike.

use serde::{Deserialize, Serialize};
use std::io::{BufRead, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

mod group;
pub use group::kill_all_but_supervisor;
use group::{group_members, ChildExit};
/// The supervisor's binary, installed next to gpool-agent (and gpoold).
pub const SUPERVISOR_BIN: &str = "gpool-supervise";

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

/// The spawner's answer: the supervisor's pid (also its session and group
/// id), or why there is none.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LaunchReply {
    Started(i32),
    Refused(String),
}

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
                    if crate::cgroup::Warm::works_under(parent) {
                        cgroup_parent = Some(parent.to_path_buf());
                    }
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
    let warm = crate::cgroup::Warm::enter(cgroup_parent).ok();
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

/// How long a supervisor keeps killing what is left in the attempt's cgroup.
const CGROUP_SWEEP_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

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

/// The supervisor, in the forked child: sets the attempt up, runs the job,
/// records how it ended, exits. Whatever the spawner did on the way here
/// (opening files, creating directories) it does not wait for. With `warm`
/// (the cgroup it waited in), that cgroup becomes the attempt's first and
/// the job is born in it; the supervisor leaves it once the end is
/// recorded.
fn supervise(request: &LaunchRequest, warm: Option<crate::cgroup::Warm>) -> ! {
    let born_in_first = match (warm, &request.cgroup) {
        (Some(warm), Some(cgroup)) => warm
            .become_first_of(cgroup)
            .map_err(crate::cgroup::Warm::discard)
            .is_ok(),
        (Some(warm), None) => {
            warm.discard();
            false
        }
        (None, _) => false,
    };
    let ended = match prepare(request, usize::from(born_in_first)) {
        Ok((mut command, terminal)) => match command.spawn().map_err(|err| with_output_files(request, err)) {
            Ok(child) => {
                // The terminal's slave side is the job's alone from here.
                drop(command);
                let relayed = terminal.map(|(terminal, out)| {
                    crate::terminal::JOB_SESSION.store(child.id() as i32, std::sync::atomic::Ordering::Relaxed);
                    terminal.relay(out)
                });
                let ended = run_to_end(request, child);
                // Its last output is written before its end is recorded
                // (a process it left holding the terminal is not waited for).
                if let Some(relayed) = relayed {
                    let _ = relayed.recv_timeout(std::time::Duration::from_secs(2));
                }
                // A job its memory limit killed ran out of memory, whatever
                // its exit says (a shell reports its child's SIGKILL as 137).
                let out_of_memory = !matches!(
                    ended,
                    Ended::Code(0) | Ended::Fenced | Ended::TimedOut | Ended::OutputLimit
                ) && request
                    .cgroup
                    .as_ref()
                    .is_some_and(crate::cgroup::AttemptCgroup::oom_killed);
                let ended = if out_of_memory { Ended::OutOfMemory } else { ended };
                // What the job left behind (detached or not) ends with it.
                if let Some(cgroup) = &request.cgroup {
                    cgroup.sweep(CGROUP_SWEEP_PATIENCE);
                }
                ended
            }
            Err(err) => Ended::FailedToStart(match (&request.run_as, &request.workdir) {
                (Some(user), Some(workdir)) => format!(
                    "cannot run {:?} as {} in {}: {err}",
                    request.program,
                    user.name,
                    workdir.display()
                ),
                _ => format!("cannot run {:?}: {err}", request.program),
            }),
        },
        Err(reason) => Ended::FailedToStart(reason),
    };
    // Only the spool's files are cut: this process is root here, and a
    // user's own `-o` path may by now lead anywhere (a symlink).
    if let Some(cap) = request.max_output.filter(|_| ended == Ended::OutputLimit) {
        for path in [&request.stdout, &request.stderr].into_iter().flatten() {
            cut_output(path, cap);
        }
    }
    // Empty output is not kept: a missing file reads as empty.
    for path in [&request.stdout, &request.stderr].into_iter().flatten() {
        if std::fs::metadata(path).is_ok_and(|meta| meta.len() == 0) {
            let _ = std::fs::remove_file(path);
        }
    }
    // A checkpoint dir the attempt left empty goes (one a job wrote to
    // stays for its next attempt), before the record: attempts are fenced,
    // so a next attempt starts only once this one is known to be over,
    // and this never takes the dir from under it.
    let _ = std::fs::remove_dir(&request.checkpoint_dir);
    // One short write: a reader that catches it half written (only the
    // agent's recovery can, while this process still runs) finds no valid
    // line and looks again once this process is gone.
    let record = format!("{} {} {}\n", request.job_id, request.epoch, ended.to_line());
    write_exit_record(&request.exit_file, record.as_bytes());
    if let Some(cgroup) = &request.cgroup {
        if born_in_first {
            let _ = cgroup.dirs.first().map(|first| crate::cgroup::leave(first));
        }
        cgroup.remove();
    }
    if let Some(env_file) = &request.container_env_file {
        let _ = std::fs::remove_file(env_file);
    }
    if let Some([program, args @ ..]) = request.container_cleanup.as_deref() {
        let _ = Command::new(program)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    // SAFETY: ends this process at once, as a forked child should (no
    // atexit handlers or buffers of the spawner to run twice).
    unsafe { nix::libc::_exit(0) }
}

/// Writes the exit record over its slot (in place: the agent made the
/// slot with room for it), and on a full disk tries again every second
/// until it lands: the agent learns how the attempt ended from this
/// record alone, so it is never given up.
fn write_exit_record(exit_file: &Path, record: &[u8]) {
    let mut told = false;
    while let Err(err) = crate::spool::write_in_place(exit_file, record) {
        if !told {
            eprintln!(
                "{SUPERVISOR_BIN}: {}: {err}; trying again every second",
                exit_file.display()
            );
            told = true;
        }
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// The files the job's stdout and stderr go to.
fn output_files(request: &LaunchRequest) -> impl Iterator<Item = &PathBuf> {
    [
        request.user_stdout.as_ref().or(request.stdout.as_ref()),
        request.user_stderr.as_ref().or(request.stderr.as_ref()),
    ]
    .into_iter()
    .flatten()
}

/// Whether an output file of the job holds more than `cap` bytes.
fn output_over(request: &LaunchRequest, cap: u64) -> bool {
    output_files(request).any(|path| std::fs::metadata(path).is_ok_and(|meta| meta.len() > cap))
}

/// Cuts an output file the job overfilled back to `cap` bytes and says so
/// at its end (cutting frees the space the line needs).
fn cut_output(path: &Path, cap: u64) {
    use std::io::Seek;
    let Ok(mut file) = std::fs::OpenOptions::new().write(true).open(path) else {
        return;
    };
    if file.metadata().is_ok_and(|meta| meta.len() > cap) && file.set_len(cap).is_ok() {
        let line = format!(
            "\n[gpool: output cut at max_output ({}); the job was ended]\n",
            crate::spool::human_bytes(cap)
        );
        let _ = file
            .seek(std::io::SeekFrom::End(0))
            .and_then(|_| file.write_all(line.as_bytes()));
    }
}

/// Grace between SIGTERM and SIGKILL when a time limit runs out.
pub const TIME_LIMIT_GRACE_MS: u64 = 10_000;
/// How often a supervisor looks at the lease and the time limit.
const CHECK_EVERY_MS: u64 = 200;

/// Waits for the job, ending it when its time limit or the node's lease
/// runs out: its signal first, then SIGKILL to everything of the attempt
/// but this process once the grace is over.
fn run_to_end(request: &LaunchRequest, mut child: std::process::Child) -> Ended {
    let started = boot_ms();
    let exited = ChildExit::open(child.id() as i32);
    // Why we are ending it, and when SIGKILL follows.
    let mut ending: Option<(Ended, u64)> = None;
    let mut lease = request.fence.as_ref().and_then(|fence| Lease::read(&fence.lease_file));
    let own_pid = nix::unistd::getpid().as_raw();
    let mut status = None;
    loop {
        if status.is_none() {
            exited.wait(CHECK_EVERY_MS);
            status = child.try_wait().ok().flatten();
        }
        if let Some(status) = status {
            // Being ended, the attempt is over only when nothing of it is
            // left (a leader that dies first leaves the rest to the grace).
            let rest_gone = ending.is_none() || group_members(own_pid).is_empty();
            if rest_gone {
                return match (&ending, status.code(), status.signal()) {
                    (Some((cause, _)), _, _) => cause.clone(),
                    (None, Some(code), _) => Ended::Code(code),
                    (None, None, Some(signal)) => Ended::Signal(signal),
                    (None, None, None) => Ended::FailedToStart("no exit status".into()),
                };
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let now = boot_ms();
        // Whatever else ends the attempt (its time limit's grace), the
        // node's lease bounds it: once the lease runs out, the attempt is
        // gone by the lease's grace, as a fenced one is, before gpoold
        // requeues it elsewhere.
        if let (Some((_, kill_at)), Some(fence)) = (ending.as_mut(), &request.fence) {
            lease = Lease::read(&fence.lease_file).or(lease);
            if let Some(lease) = lease.filter(|lease| now >= lease.until_ms) {
                *kill_at = (*kill_at).min(lease.until_ms + fence.grace_ms.min(lease.grace_ms));
            }
        }
        match &ending {
            Some((_, kill_at)) if now >= *kill_at => {
                kill_all_but_supervisor(own_pid, request.cgroup.as_ref());
            }
            Some(_) => {}
            None => {
                let over_time = request
                    .time_limit_ms
                    .is_some_and(|limit| now >= started.saturating_add(limit));
                if let Some(fence) = &request.fence {
                    // A lease file being replaced may be missing for a moment.
                    lease = Lease::read(&fence.lease_file).or(lease);
                }
                let fenced = match (&request.fence, lease) {
                    (Some(fence), Some(lease)) if now >= lease.until_ms => Some((fence, lease)),
                    _ => None,
                };
                let over_output = request.max_output.is_some_and(|cap| output_over(request, cap));
                if over_output {
                    // Output at this rate fills the disk in seconds: no grace.
                    kill_all_but_supervisor(own_pid, request.cgroup.as_ref());
                    ending = Some((Ended::OutputLimit, now));
                } else if let Some((fence, lease)) = fenced {
                    let signal =
                        nix::sys::signal::Signal::try_from(fence.signal).unwrap_or(nix::sys::signal::Signal::SIGTERM);
                    let _ = nix::sys::signal::killpg(nix::unistd::getpgrp(), signal);
                    ending = Some((Ended::Fenced, now + fence.grace_ms.min(lease.grace_ms)));
                } else if over_time {
                    let _ = nix::sys::signal::killpg(nix::unistd::getpgrp(), nix::sys::signal::Signal::SIGTERM);
                    ending = Some((Ended::TimedOut, now + TIME_LIMIT_GRACE_MS));
                }
            }
        }
    }
}

/// The job's command: its user, output files and checkpoint directory.
/// It joins its cgroup's directories from the `first_to_enter`th on (it is
/// born in those before).
fn prepare(request: &LaunchRequest, first_to_enter: usize) -> Result<(Command, Option<Interactive>), String> {
    use nix::unistd::{Gid, Uid};
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
    use std::os::unix::process::CommandExt;
    let owned_by_user = |path: &Path| -> Result<(), String> {
        match &request.run_as {
            Some(user) => nix::unistd::chown(path, Some(Uid::from_raw(user.uid)), Some(Gid::from_raw(user.gid)))
                .map_err(|err| format!("{}: cannot give it to {}: {err}", path.display(), user.name)),
            None => Ok(()),
        }
    };
    // The job's files are its user's alone: 0700 and 0600, whatever the
    // umask (no other user reads them through the spool).
    if !request.checkpoint_dir.is_dir() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&request.checkpoint_dir)
            .map_err(|err| format!("{}: {err}", request.checkpoint_dir.display()))?;
        owned_by_user(&request.checkpoint_dir)?;
    }
    let open_output = |path: &Option<PathBuf>| -> Result<Option<std::fs::File>, String> {
        let Some(path) = path else { return Ok(None) };
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)
            .map_err(|err| format!("{}: {err}", path.display()))?;
        // An earlier attempt's file of the same name keeps its mode: set it.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(|err| format!("{}: {err}", path.display()))?;
        owned_by_user(path)?;
        Ok(Some(file))
    };
    let output = |path: &Option<PathBuf>| -> Result<Stdio, String> {
        Ok(open_output(path)?.map_or_else(Stdio::null, Stdio::from))
    };
    let mut command = Command::new(&request.program);
    if let Some(cgroup) = &request.cgroup {
        cgroup.create()?;
        let cgroup = cgroup.clone();
        // SAFETY: runs in the forked child of this single-threaded process
        // before exec, and before the user switch registered below (joining
        // a cgroup takes root).
        unsafe {
            command.pre_exec(move || cgroup.enter_from(first_to_enter));
        }
    }
    command.args(&request.args);
    let interactive = match &request.pty {
        Some(pty) => {
            let owner = request.run_as.as_ref().map(|user| (user.uid, user.gid));
            let terminal = crate::terminal::Terminal::open(pty, owner)?;
            command
                .stdin(terminal.stdio()?)
                .stdout(terminal.stdio()?)
                .stderr(terminal.stdio()?);
            // SAFETY: runs in the forked child before exec, after its
            // stdin became the terminal; setsid and ioctl are
            // async-signal-safe.
            unsafe {
                command.pre_exec(crate::terminal::take_terminal);
            }
            Some((terminal, open_output(&request.stdout)?))
        }
        None => {
            command
                .stdin(Stdio::null())
                .stdout(output(&request.stdout)?)
                .stderr(output(&request.stderr)?);
            None
        }
    };
    if let Some(env_file) = &request.container_env_file {
        let text = crate::container::env_file_text(&request.env)?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(env_file)
            .map_err(|err| format!("{}: {err}", env_file.display()))?;
        std::io::Write::write_all(&mut file, text.as_bytes())
            .map_err(|err| format!("{}: {err}", env_file.display()))?;
    } else {
        // The job's own variables only: never this process's (the agent's
        // environment, its credentials included).
        command
            .env_clear()
            .envs(request.env.iter().map(|(name, value)| (name, value)));
    }
    if let (Some(workdir), None) = (&request.workdir, &request.run_as) {
        command.current_dir(workdir);
    }
    // A missing directory is said as such, not as a command that cannot
    // run (the files are opened by the job's user, just before the exec).
    for path in [&request.user_stdout, &request.user_stderr].into_iter().flatten() {
        if let Some(dir) = path.parent().filter(|dir| !dir.as_os_str().is_empty() && !dir.is_dir()) {
            return Err(format!(
                "the directory of its output file {} does not exist: {}",
                path.display(),
                dir.display()
            ));
        }
    }
    let user_files = user_output_files(request)?;
    // A container runtime stays this process's user; it sets the job's.
    if let Some(user) = request.run_as.as_ref().filter(|_| request.container_cleanup.is_none()) {
        command.envs(account_env(&user.name, &user.home, &user.shell));
        let groups: Vec<Gid> = user.groups.iter().map(|g| Gid::from_raw(*g)).collect();
        let (uid, gid) = (Uid::from_raw(user.uid), Gid::from_raw(user.gid));
        let workdir = request.workdir.clone();
        // SAFETY: runs in the forked child of this single-threaded process
        // before exec. The working directory is entered as the user, so
        // that the user's own access rights (root-squashed NFS homes, 0700
        // directories) decide.
        unsafe {
            command.pre_exec(move || {
                nix::unistd::setgroups(&groups)?;
                nix::unistd::setgid(gid)?;
                nix::unistd::setuid(uid)?;
                if let Some(workdir) = &workdir {
                    nix::unistd::chdir(workdir.as_path())?;
                }
                Ok(())
            });
        }
    }
    if !user_files.is_empty() {
        let flags = if request.append_output {
            nix::fcntl::OFlag::O_APPEND
        } else {
            nix::fcntl::OFlag::O_TRUNC
        } | nix::fcntl::OFlag::O_WRONLY
            | nix::fcntl::OFlag::O_CREAT;
        // SAFETY: runs in the forked child before exec, after the user
        // switch above (so the job's user opens its own files, with its
        // own rights); open and dup2 are async-signal-safe, and the paths
        // were made before the fork.
        unsafe {
            command.pre_exec(move || {
                for (path, target) in &user_files {
                    let fd = nix::fcntl::open(path.as_c_str(), flags, nix::sys::stat::Mode::from_bits_truncate(0o644))?;
                    if fd != *target {
                        nix::unistd::dup2(fd, *target)?;
                        nix::unistd::close(fd)?;
                    }
                }
                Ok(())
            });
        }
    }
    Ok((command, interactive))
}

/// An interactive attempt's terminal, and the file its output goes to.
type Interactive = (crate::terminal::Terminal, Option<std::fs::File>);

/// A failed start, naming the job's own output files (which its user
/// could not open, perhaps).
fn with_output_files(request: &LaunchRequest, err: std::io::Error) -> String {
    let files: Vec<String> = [&request.user_stdout, &request.user_stderr]
        .into_iter()
        .flatten()
        .map(|path| path.display().to_string())
        .collect();
    if files.is_empty() {
        err.to_string()
    } else {
        format!("{err} (or opening its output file {})", files.join(" or "))
    }
}

/// The `-o/-e` files as C strings with the descriptor each replaces.
fn user_output_files(request: &LaunchRequest) -> Result<Vec<(std::ffi::CString, i32)>, String> {
    use std::os::unix::ffi::OsStrExt;
    [(&request.user_stdout, 1), (&request.user_stderr, 2)]
        .into_iter()
        .filter_map(|(path, fd)| Some((path.as_ref()?, fd)))
        .map(|(path, fd)| {
            std::ffi::CString::new(path.as_os_str().as_bytes())
                .map(|path| (path, fd))
                .map_err(|_| format!("{}: a path has no NUL", path.display()))
        })
        .collect()
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
}
