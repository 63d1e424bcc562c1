//! The node's launcher: one long-lived process that starts each job itself
//! (straight into its cgroup; see `birth::plain`), watches it through a pidfd, enforces its
//! time limit, the node's lease and its output cap, and records its end in
//! its exit slot. It is a subreaper, so what a job leaves behind is reaped
//! here too. Interactive and container jobs still get a supervisor of
//! their own (their terminal or runtime needs one); the launcher forks it.
//!
//! The launcher is forked from a keeper, the process the agent starts,
//! which does nothing but wait: should the launcher die, its jobs become
//! the keeper's children, and the keeper records how each ended, from the
//! mark the launcher left in its slot. Both outlive the agent: once the
//! agent is gone (its requests' pipe closed) the launcher runs its jobs to
//! their ends and exits, and a restarted agent starts a new pair.

use super::prepare::{prepare, with_output_files};
use super::run::{after_end, cannot_run, record_keeping_dir, record_of, Watch};
use super::spawner::Supervisors;
use super::*;
use spare_cgroups::SpareCgroups;
use spare_dirs::SpareDirs;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::process::ExitCode;
use std::time::{Duration, Instant};
use zygote::Zygotes;

mod spare_cgroups;
mod spare_dirs;
mod zygote;

/// What ended attempts leave for the next: their empty checkpoint
/// directories and their cgroups.
#[derive(Default)]
struct Spares {
    dirs: SpareDirs,
    cgroups: SpareCgroups,
}

/// How often running jobs are looked at (time limits, lease, output cap).
const CHECK_EVERY: Duration = Duration::from_millis(200);
/// How often a job being ended is looked at, while the rest of its group
/// is waited for.
const ENDING_EVERY_MS: u16 = 50;
/// How long failed cgroup removals are tried again.
const REMOVAL_PATIENCE: Duration = Duration::from_secs(600);

/// The spawner process the agent starts: forks the launcher and becomes
/// its keeper. `exits` is the agent's directory of exit slots.
pub(super) fn start(exits: Option<PathBuf>) -> ExitCode {
    // Out of the agent's session (a terminal's ^C reaches the agent, not
    // the jobs' launcher), and the reaper of whatever its launcher leaves.
    let _ = nix::unistd::setsid();
    set_subreaper();
    let keeper = std::process::id() as i32;
    // SAFETY: this process is single-threaded; both sides go on normally.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            let ids = Launcher {
                pid: std::process::id() as i32,
                keeper,
            };
            serve(ids)
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => keep(child.as_raw(), keeper, exits),
        Err(err) => {
            eprintln!("{SUPERVISOR_BIN}: cannot fork the launcher: {err}");
            ExitCode::FAILURE
        }
    }
}

fn set_subreaper() {
    // SAFETY: prctl with an integer argument.
    unsafe {
        nix::libc::prctl(nix::libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    }
}

/// The keeper: off the agent's pipes (so that the agent sees the
/// launcher's death as the end of its replies), it reaps its children
/// until none is left: the launcher, and the jobs of a launcher that died,
/// whose ends it records.
fn keep(launcher: i32, keeper: i32, exits: Option<PathBuf>) -> ExitCode {
    use nix::sys::wait::{waitpid, WaitStatus};
    if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        let _ = nix::unistd::dup2(null.as_raw_fd(), 0);
        let _ = nix::unistd::dup2(null.as_raw_fd(), 1);
    }
    let ids = Launcher { pid: launcher, keeper };
    loop {
        let (pid, ended) = match waitpid(nix::unistd::Pid::from_raw(-1), None) {
            Ok(WaitStatus::Exited(pid, code)) => (pid.as_raw(), Ended::Code(code)),
            Ok(WaitStatus::Signaled(pid, signal, _)) => (pid.as_raw(), Ended::Signal(signal as i32)),
            Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return ExitCode::SUCCESS,
        };
        if let (Some(exits), true) = (&exits, pid != launcher) {
            record_orphan(exits, pid, ids, &ended);
        }
    }
}

/// Records the end of job `pid`, which its launcher `ids` forked, in the
/// exit slot whose mark names it (a process of no slot is not a job).
fn record_orphan(exits: &Path, pid: i32, ids: Launcher, ended: &Ended) {
    let Ok(slots) = std::fs::read_dir(exits) else { return };
    for slot in slots.flatten() {
        let Ok(text) = std::fs::read_to_string(slot.path()) else {
            continue;
        };
        let mut words = text.split(' ');
        let (Some(job), Some(epoch)) = (words.next(), words.next()) else {
            continue;
        };
        let (Ok(job), Ok(epoch)) = (job.parse::<u64>(), epoch.parse::<u64>()) else {
            continue;
        };
        if text == launched_mark(job, epoch, pid, Some(ids)) {
            let record = end_record(job, epoch, ended);
            if let Err(err) = crate::spool::write_in_place(&slot.path(), record.as_bytes()) {
                eprintln!("{SUPERVISOR_BIN}: {}: {err}", slot.path().display());
            }
            return;
        }
    }
}

/// One job the launcher forked.
struct Running {
    request: LaunchRequest,
    pidfd: Option<OwnedFd>,
    /// Read once it has ended: whether its exec failed.
    exec: Option<ExecReport>,
    watch: Watch,
    /// How its first process ended, once it has.
    status: Option<Ended>,
    /// What its birth left that must outlive its exec.
    _born: Option<super::birth::plain::Born>,
}

/// What is left to do after some ends: records a full disk held up, and
/// cgroups still busy.
#[derive(Default)]
struct Leftovers {
    records: Vec<(LaunchRequest, String)>,
    cgroups: Vec<(crate::cgroup::AttemptCgroup, Instant)>,
}

/// The launcher: serves launch requests from its stdin until it closes,
/// then runs its jobs to their ends.
fn serve(ids: Launcher) -> ExitCode {
    set_subreaper();
    // Jobs take the ordinary place in the OOM order, and are born in this
    // one's (see `AGENT_OOM_SCORE_ADJ`); its supervisors go back below.
    let _ = std::fs::write("/proc/self/oom_score_adj", b"0");
    let mut supervisors = Supervisors::default();
    let mut zygotes = Zygotes::default();
    let mut jobs: std::collections::HashMap<i32, Running> = std::collections::HashMap::new();
    let mut leftovers = Leftovers::default();
    let mut spares = Spares::default();
    let mut input = Some(Vec::<u8>::with_capacity(64 * 1024));
    let mut checked = Instant::now();
    reply(&LaunchReply::Ready(ids));
    loop {
        let timeout = poll_timeout(&jobs, &leftovers, checked, zygotes.due_in().filter(|_| input.is_some()));
        let stdin = std::io::stdin();
        let mut fds: Vec<nix::poll::PollFd> = Vec::with_capacity(jobs.len() + 1);
        if input.is_some() {
            fds.push(nix::poll::PollFd::new(stdin.as_fd(), nix::poll::PollFlags::POLLIN));
        }
        fds.extend(
            jobs.values()
                .filter(|job| job.status.is_none())
                .filter_map(|job| job.pidfd.as_ref())
                .map(|fd| nix::poll::PollFd::new(fd.as_fd(), nix::poll::PollFlags::POLLIN)),
        );
        let _ = nix::poll::poll(&mut fds, timeout);
        let readable = input.is_some()
            && fds
                .first()
                .and_then(|fd| fd.revents())
                .is_some_and(|events| !events.is_empty());
        drop(fds);
        if readable {
            if let Some(buffer) = input.as_mut() {
                if !read_requests(buffer, ids, &mut jobs, (&mut supervisors, &mut zygotes, &mut spares)) {
                    input = None;
                    zygotes.ready = None;
                    // No longer the agent's: its successor need not wait.
                    let _ = nix::unistd::setsid();
                }
            }
        }
        if input.is_some() {
            zygotes.refill();
        }
        reap(&mut jobs);
        let check = checked.elapsed() >= CHECK_EVERY;
        if check {
            checked = Instant::now();
            leftovers.retry();
        }
        let over: Vec<(i32, Ended)> = jobs
            .iter_mut()
            .filter(|(_, job)| check || job.status.is_some())
            .filter_map(|(pid, job)| Some((*pid, job.watch.step(&job.request, job.status.as_ref())?)))
            .collect();
        for (pid, ended) in over {
            if let Some(job) = jobs.remove(&pid) {
                leftovers.conclude(job.request, ended, &mut spares);
                let _ = nix::sys::wait::waitpid(
                    nix::unistd::Pid::from_raw(pid),
                    Some(nix::sys::wait::WaitPidFlag::WNOHANG),
                );
            }
        }
        if input.is_none() && jobs.is_empty() && leftovers.is_empty() {
            spares.dirs.remove_all();
            spares.cgroups.remove_all();
            return ExitCode::SUCCESS;
        }
    }
}

/// How long the launcher's poll waits: for ending jobs' groups, for the
/// next look at running jobs (or a second when there are none), and for
/// the next zygote (`zygote_due`).
fn poll_timeout(
    jobs: &std::collections::HashMap<i32, Running>,
    leftovers: &Leftovers,
    checked: Instant,
    zygote_due: Option<Duration>,
) -> nix::poll::PollTimeout {
    let timeout = if jobs.values().any(|job| job.status.is_some()) {
        nix::poll::PollTimeout::from(ENDING_EVERY_MS)
    } else if jobs.is_empty() && leftovers.is_empty() {
        nix::poll::PollTimeout::from(1000u16)
    } else {
        let left = CHECK_EVERY.saturating_sub(checked.elapsed()).as_millis() as u16;
        nix::poll::PollTimeout::from(left.max(1))
    };
    match zygote_due {
        Some(due) => timeout.min(nix::poll::PollTimeout::from((due.as_millis() as u16).max(1))),
        None => timeout,
    }
}

/// Reads what the agent sent and serves each whole line; `false` once the
/// agent closed its end.
fn read_requests(
    buffer: &mut Vec<u8>,
    ids: Launcher,
    jobs: &mut std::collections::HashMap<i32, Running>,
    (supervisors, zygotes, spares): (&mut Supervisors, &mut Zygotes, &mut Spares),
) -> bool {
    let start = buffer.len();
    buffer.resize(start + 64 * 1024, 0);
    let read = nix::unistd::read(0, &mut buffer[start..]);
    let read = match read {
        Ok(0) => {
            buffer.truncate(start);
            return false;
        }
        Ok(n) => n,
        Err(nix::errno::Errno::EINTR | nix::errno::Errno::EAGAIN) => 0,
        Err(_) => {
            buffer.truncate(start);
            return false;
        }
    };
    buffer.truncate(start + read);
    let mut served = 0;
    while let Some(end) = buffer[served..].iter().position(|b| *b == b'\n') {
        let line = String::from_utf8_lossy(&buffer[served..served + end]).into_owned();
        served += end + 1;
        let answer = match serde_json::from_str::<LaunchRequest>(&line) {
            Ok(request) if request.pty.is_none() && request.container_cleanup.is_none() => {
                spares.dirs.place(&request);
                launch(request, ids, jobs, (zygotes, &mut spares.cgroups))
            }
            Ok(request) => supervisors.hand_over(&request, &line),
            Err(err) => LaunchReply::Refused(format!("bad launch request: {err}")),
        };
        reply(&answer);
    }
    buffer.drain(..served);
    true
}

fn reply(answer: &LaunchReply) {
    let mut text = serde_json::to_vec(answer).unwrap_or_default();
    text.push(b'\n');
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(&text).and_then(|()| stdout.flush());
}

/// Starts the job of `request` in its cgroup, its own session's leader.
/// Before anything of it runs, its slot is marked with its pid and this
/// launcher's (an agent that dies before the answer reaches it learns from
/// the mark that the job runs, and never launches it twice).
fn launch(
    request: LaunchRequest,
    ids: Launcher,
    jobs: &mut std::collections::HashMap<i32, Running>,
    (zygotes, cgroups): (&mut Zygotes, &mut SpareCgroups),
) -> LaunchReply {
    let mut request = match zygotes.take_for(&request) {
        Some(zygote) => match zygote.hand(request, ids, jobs) {
            Ok(reply) => return reply,
            // Forked anew below, its slot marked again.
            Err(request) => *request,
        },
        None => request,
    };
    cgroups.place(&mut request);
    // On cgroup v2 the job is born in its one directory.
    let into = request
        .cgroup
        .as_ref()
        .filter(|cgroup| cgroup.unified)
        .and_then(|cgroup| cgroup.dirs.first())
        .cloned();
    let (job_id, epoch, exit_file) = (request.job_id, request.epoch, request.exit_file.clone());
    let mut gate = |pid: i32| {
        let mark = launched_mark(job_id, epoch, pid, Some(ids));
        crate::spool::write_in_place(&exit_file, mark.as_bytes())
            .map_err(|err| {
                eprintln!(
                    "{SUPERVISOR_BIN}: {}: cannot mark the launch: {err}",
                    exit_file.display()
                )
            })
            .is_ok()
    };
    let born = match give_birth(&request, into.as_deref(), &mut gate) {
        Ok(born) => born,
        Err(reason) => return refuse(&request, reason),
    };
    match born {
        Ok((pid, pidfd, exec, kept)) => {
            let watch = Watch::new(&request, pid, false);
            jobs.insert(
                pid,
                Running {
                    request,
                    pidfd: pidfd.or_else(|| pidfd_of(pid)),
                    exec: Some(ExecReport::Forked(exec)),
                    watch,
                    status: None,
                    _born: kept,
                },
            );
            LaunchReply::Direct(pid)
        }
        Err(err) => {
            let reason = cannot_run(&request, &with_output_files(&request, err));
            refuse(&request, reason)
        }
    }
}

/// A job started, as `super::birth::plain::clone` gives it (a forked one
/// has no pidfd yet and keeps nothing).
type Birth = (
    i32,
    Option<OwnedFd>,
    super::birth::Exec,
    Option<super::birth::plain::Born>,
);

/// Starts the job of `request`, in the cgroup v2 directory `into` where
/// given, through `gate`: sharing the launcher's memory until its exec
/// where it can, forked where not. A reason in words where the job could
/// not be prepared.
fn give_birth(
    request: &LaunchRequest,
    into: Option<&Path>,
    gate: super::birth::Gate,
) -> Result<std::io::Result<Birth>, String> {
    use super::birth::plain;
    use std::os::unix::process::CommandExt;
    if plain::Plan::available() {
        let plan = plain::Plan::of(request, null())?;
        match plain::clone(plan, into, &mut *gate) {
            // A kernel (or a seccomp filter) without clone3: forked
            // from here on.
            Err(err) if matches!(err.raw_os_error(), Some(nix::libc::ENOSYS | nix::libc::EPERM)) => {
                eprintln!("{SUPERVISOR_BIN}: clone3 is refused here ({err}); jobs are forked");
                plain::Plan::refused();
            }
            born => return Ok(born.map(|(pid, pidfd, exec, born)| (pid, pidfd, exec, Some(born)))),
        }
    }
    let (mut command, _) = prepare(request, usize::from(into.is_some()))?;
    // SAFETY: setsid(2) between fork and exec.
    unsafe {
        command.pre_exec(|| nix::unistd::setsid().map(drop).map_err(std::io::Error::from));
    }
    Ok(super::birth::fork(&mut command, into, Some(gate)).map(|(pid, exec)| (pid, None, exec, None)))
}

/// /dev/null, opened once: plain jobs' stdin.
fn null() -> &'static OwnedFd {
    static NULL: std::sync::OnceLock<OwnedFd> = std::sync::OnceLock::new();
    NULL.get_or_init(|| {
        let file = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null");
        OwnedFd::from(file.expect("/dev/null opens"))
    })
}

/// A launch that did not happen: its slot says so (over a mark it may
/// have left), and what was made for it is removed.
fn refuse(request: &LaunchRequest, reason: String) -> LaunchReply {
    let ended = Ended::FailedToStart(reason.clone());
    let _ = crate::spool::write_in_place(&request.exit_file, record_of(request, &ended).as_bytes());
    if let Some(cgroup) = &request.cgroup {
        cgroup.remove();
    }
    LaunchReply::Refused(reason)
}

fn pidfd_of(pid: i32) -> Option<OwnedFd> {
    super::pidfd_open(pid).ok()
}

/// Notes how each job's first process ended, leaving it unreaped until
/// its end is recorded (should this launcher die before that, the keeper
/// reaps it and records it), and reaps every other child that ended: what
/// jobs left behind, supervisors.
fn reap(jobs: &mut std::collections::HashMap<i32, Running>) {
    use nix::sys::wait::{waitid, waitpid, Id, WaitPidFlag, WaitStatus};
    let peek = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
    for (pid, job) in jobs.iter_mut().filter(|(_, job)| job.status.is_none()) {
        job.status = match waitid(Id::Pid(nix::unistd::Pid::from_raw(*pid)), peek) {
            Ok(WaitStatus::Exited(_, code)) => Some(Ended::Code(code)),
            Ok(WaitStatus::Signaled(_, signal, _)) => Some(Ended::Signal(signal as i32)),
            _ => None,
        };
        if job.status.is_some() {
            job.pidfd = None;
            // Its exec's report is whole now that it has exited.
            if let Some(reason) = job.exec.take().and_then(|exec| exec.failure(&job.request)) {
                job.status = Some(Ended::FailedToStart(reason));
            }
        }
    }
    // The first child that ended, until it is a job's (reaped once its
    // end is recorded).
    while let Ok(status) = waitid(Id::All, peek) {
        match status.pid() {
            Some(pid) if !jobs.contains_key(&pid.as_raw()) => {
                let _ = waitpid(pid, Some(WaitPidFlag::WNOHANG));
            }
            _ => return,
        }
    }
}

impl Leftovers {
    fn is_empty(&self) -> bool {
        self.records.is_empty() && self.cgroups.is_empty()
    }

    /// Records how the job of `request` ended, then removes its cgroup.
    fn conclude(&mut self, request: LaunchRequest, ended: Ended, spares: &mut Spares) {
        let ended = after_end(&request, ended);
        let record = record_keeping_dir(&request, &ended, |request| spares.dirs.keep(request));
        // The end first; the cgroup's removal (which may have to wait for
        // the kernel) after.
        let cgroup = request.cgroup.clone();
        match crate::spool::write_in_place(&request.exit_file, record.as_bytes()) {
            Ok(()) => reply(&LaunchReply::Ended(request.job_id, request.epoch)),
            Err(err) => {
                eprintln!("{SUPERVISOR_BIN}: {}: {err}; trying again", request.exit_file.display());
                self.records.push((request, record));
            }
        }
        if let Some(cgroup) = cgroup.filter(|cgroup| !spares.cgroups.keep(cgroup)) {
            cgroup.remove();
            if cgroup.dirs.iter().any(|dir| dir.exists()) {
                self.cgroups.push((cgroup, Instant::now()));
            }
        }
    }

    /// Tries again what failed: records (given up once their directory is
    /// gone, as no agent will read them) and cgroup removals.
    fn retry(&mut self) {
        self.records.retain(|(request, record)| {
            let slot = &request.exit_file;
            let written = crate::spool::write_in_place(slot, record.as_bytes()).is_ok();
            if written {
                reply(&LaunchReply::Ended(request.job_id, request.epoch));
            }
            !written && slot.parent().is_some_and(Path::exists)
        });
        self.cgroups.retain(|(cgroup, since)| {
            cgroup.remove();
            cgroup.dirs.iter().any(|dir| dir.exists()) && since.elapsed() < REMOVAL_PATIENCE
        });
    }
}

/// How a job's exec went, read once it has exited: an errno from a job
/// forked at its launch, or a reason in words from a zygote.
enum ExecReport {
    Forked(super::birth::Exec),
    Zygote(std::fs::File),
}

impl ExecReport {
    fn failure(self, request: &LaunchRequest) -> Option<String> {
        match self {
            ExecReport::Forked(exec) => exec
                .failure()
                .map(|err| cannot_run(request, &with_output_files(request, err))),
            ExecReport::Zygote(mut report) => {
                let mut reason = String::new();
                let _ = std::io::Read::read_to_string(&mut report, &mut reason);
                (!reason.is_empty()).then_some(reason)
            }
        }
    }
}
