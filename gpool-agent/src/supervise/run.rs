//! A supervisor's run of one attempt: its job run to the end (time limit,
//! lease, output cap), then its output cut and tidied, its exit record
//! written and its cgroup and container removed.

use super::group::{group_members, ChildExit};
use super::prepare::{prepare, with_output_files, Interactive};
use super::*;
use std::io::Write;
use std::process::{Command, Stdio};

/// How long a supervisor keeps killing what is left in the attempt's cgroup.
const CGROUP_SWEEP_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

/// The supervisor, in the forked child: sets the attempt up, runs the job,
/// records how it ended, exits. Whatever the spawner did on the way here
/// (opening files, creating directories) it does not wait for. With `warm`
/// (the cgroup it waited in), that cgroup becomes the attempt's first and
/// the job is born in it; the supervisor leaves it once the end is
/// recorded.
pub(super) fn supervise(request: &LaunchRequest, warm: Option<crate::cgroup::Warm>) -> ! {
    let born_in_first = take_warm(request, warm);
    // On cgroup v2 the job is born in its one directory (`birth`).
    let into = request
        .cgroup
        .as_ref()
        .filter(|cgroup| cgroup.unified && !born_in_first)
        .and_then(|cgroup| cgroup.dirs.first());
    let ended = match prepare(request, usize::from(born_in_first || into.is_some())) {
        Ok((command, terminal)) => start_and_run(request, command, terminal, into),
        Err(reason) => Ended::FailedToStart(reason),
    };
    // One short write: a reader that catches it half written (only the
    // agent's recovery can, while this process still runs) finds no valid
    // line and looks again once this process is gone.
    write_exit_record(&request.exit_file, record_of(request, &ended).as_bytes());
    clean_up(request, born_in_first);
    // SAFETY: ends this process at once, as a forked child should (no
    // atexit handlers or buffers of the spawner to run twice).
    unsafe { nix::libc::_exit(0) }
}

/// Makes the warm cgroup the attempt's first (or discards it); whether
/// the job is born in the attempt's first cgroup.
pub(super) fn take_warm(request: &LaunchRequest, warm: Option<crate::cgroup::Warm>) -> bool {
    match (warm, &request.cgroup) {
        (Some(warm), Some(cgroup)) => warm
            .become_first_of(cgroup)
            .map_err(crate::cgroup::Warm::discard)
            .is_ok(),
        (Some(warm), None) => {
            warm.discard();
            false
        }
        (None, _) => false,
    }
}

/// Starts the prepared command (in the cgroup directory `into`, where it
/// is born in one) and runs it to its end.
fn start_and_run(
    request: &LaunchRequest,
    mut command: Command,
    terminal: Option<Interactive>,
    into: Option<&PathBuf>,
) -> Ended {
    match super::birth::spawn(&mut command, into.map(PathBuf::as_path), None)
        .map_err(|err| with_output_files(request, err))
    {
        Ok(child) => {
            // The terminal's slave side is the job's alone from here.
            drop(command);
            let relayed = terminal.map(|(terminal, out)| {
                crate::terminal::JOB_SESSION.store(child, std::sync::atomic::Ordering::Relaxed);
                terminal.relay(out)
            });
            let ended = run_to_end(request, child);
            // Its last output is written before its end is recorded
            // (a process it left holding the terminal is not waited for).
            if let Some(relayed) = relayed {
                let _ = relayed.recv_timeout(std::time::Duration::from_secs(2));
            }
            after_end(request, ended)
        }
        Err(err) => Ended::FailedToStart(cannot_run(request, &err)),
    }
}

/// Why the job's command could not start, naming its user and workdir.
pub(super) fn cannot_run(request: &LaunchRequest, err: &str) -> String {
    match (&request.run_as, &request.workdir) {
        (Some(user), Some(workdir)) => format!(
            "cannot run {:?} as {} in {}: {err}",
            request.program,
            user.name,
            workdir.display()
        ),
        _ => format!("cannot run {:?}: {err}", request.program),
    }
}

/// The attempt's end once its job is gone: `OutOfMemory` where its
/// memory limit killed it, and whatever it left in its cgroup killed.
pub(super) fn after_end(request: &LaunchRequest, ended: Ended) -> Ended {
    let ended = with_out_of_memory(request, ended);
    // What the job left behind (detached or not) ends with it.
    if let Some(cgroup) = &request.cgroup {
        cgroup.sweep(CGROUP_SWEEP_PATIENCE);
    }
    ended
}

/// The attempt's exit record, once its output is tidied and a checkpoint
/// dir it left empty is removed (one a job wrote to stays for its next
/// attempt). That comes before the record: attempts are fenced, so a next
/// attempt starts only once this one is known to be over, and this never
/// takes the dir from under it.
pub(super) fn record_of(request: &LaunchRequest, ended: &Ended) -> String {
    record_keeping_dir(request, ended, |_| false)
}

/// `record_of`, where `keep` may take the empty checkpoint dir (and says
/// whether it did) before it is removed.
pub(super) fn record_keeping_dir(
    request: &LaunchRequest,
    ended: &Ended,
    keep: impl FnOnce(&LaunchRequest) -> bool,
) -> String {
    tidy_output(request, ended);
    if !keep(request) {
        let _ = std::fs::remove_dir(&request.checkpoint_dir);
    }
    end_record(request.job_id, request.epoch, ended)
}

/// `ended`, or `OutOfMemory` where the cgroup's memory limit killed it.
fn with_out_of_memory(request: &LaunchRequest, ended: Ended) -> Ended {
    // A job its memory limit killed ran out of memory, whatever
    // its exit says (a shell reports its child's SIGKILL as 137).
    let out_of_memory = !matches!(
        ended,
        Ended::Code(0) | Ended::Fenced | Ended::TimedOut | Ended::OutputLimit
    ) && request
        .cgroup
        .as_ref()
        .is_some_and(crate::cgroup::AttemptCgroup::oom_killed);
    if out_of_memory {
        Ended::OutOfMemory
    } else {
        ended
    }
}

/// Cuts the spool's output files to the cap where output ended the job,
/// and removes empty ones.
fn tidy_output(request: &LaunchRequest, ended: &Ended) {
    // Only the spool's files are cut: this process is root here, and a
    // user's own `-o` path may by now lead anywhere (a symlink).
    if let Some(cap) = request.max_output.filter(|_| *ended == Ended::OutputLimit) {
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
}

/// After the record: leaves and removes the attempt's cgroup, removes its
/// env file and runs its container's cleanup.
fn clean_up(request: &LaunchRequest, born_in_first: bool) {
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
}

/// Writes the exit record over its slot (in place: the agent made the
/// slot with room for it), and on a full disk tries again every second
/// until it lands: the agent learns how the attempt ended from this
/// record alone, so it is not given up while the agent could read it.
/// Once the directory that held its slot is gone (the node's agent
/// removed with its state dir), no agent will: it gives up and says so.
fn write_exit_record(exit_file: &Path, record: &[u8]) {
    let mut told = false;
    while let Err(err) = crate::spool::write_in_place(exit_file, record) {
        if exit_file.parent().is_some_and(|dir| !dir.exists()) {
            eprintln!(
                "{SUPERVISOR_BIN}: {}: {err}; its directory is gone, so no agent will read it: giving up",
                exit_file.display()
            );
            return;
        }
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

/// How the child `pid` ended (`Code` or `Signal`), once it has.
fn exit_of(pid: i32) -> Option<Ended> {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    match waitpid(nix::unistd::Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
        Ok(WaitStatus::Exited(_, code)) => Some(Ended::Code(code)),
        Ok(WaitStatus::Signaled(_, signal, _)) => Some(Ended::Signal(signal as i32)),
        Ok(_) => None,
        Err(err) => Some(Ended::FailedToStart(format!("cannot wait for the job: {err}"))),
    }
}

/// Grace between SIGTERM and SIGKILL when a time limit runs out.
pub const TIME_LIMIT_GRACE_MS: u64 = 10_000;
/// How often a supervisor looks at the lease and the time limit.
const CHECK_EVERY_MS: u64 = 200;

/// Waits for the job, ending it when its time limit or the node's lease
/// runs out: its signal first, then SIGKILL to everything of the attempt
/// but this process once the grace is over.
fn run_to_end(request: &LaunchRequest, child: i32) -> Ended {
    let exited = ChildExit::open(child);
    let mut watch = Watch::new(request, nix::unistd::getpid().as_raw(), true);
    let mut status = None;
    loop {
        if status.is_none() {
            exited.wait(CHECK_EVERY_MS);
            status = exit_of(child);
        }
        if let Some(ended) = watch.step(request, status.as_ref()) {
            return ended;
        }
        if status.is_some() {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }
}

/// The watch on one running attempt, looked at every `CHECK_EVERY_MS`:
/// its time limit, the node's lease and its output cap, and once one of
/// those ends it, the grace before SIGKILL. A supervisor keeps one for its
/// job (the group's leader is the supervisor itself, which outlives it);
/// the node's launcher keeps one for each job it forked (each leads its
/// own group).
pub(super) struct Watch {
    /// The attempt's process group.
    group: i32,
    /// Whether the group's leader is the supervisor (spared) or the job.
    supervised: bool,
    started: u64,
    /// Why we are ending it, and when SIGKILL follows.
    ending: Option<(Ended, u64)>,
    lease: Option<Lease>,
}

impl Watch {
    pub(super) fn new(request: &LaunchRequest, group: i32, supervised: bool) -> Watch {
        Watch {
            group,
            supervised,
            started: boot_ms(),
            ending: None,
            lease: request.fence.as_ref().and_then(|fence| Lease::read(&fence.lease_file)),
        }
    }

    /// One look, given how the group's first process (the job) ended if
    /// it has: how the attempt ended once it is over.
    pub(super) fn step(&mut self, request: &LaunchRequest, status: Option<&Ended>) -> Option<Ended> {
        if let Some(status) = status {
            // Being ended, the attempt is over only when nothing of it is
            // left (a leader that dies first leaves the rest to the grace).
            if self.ending.is_none() || group_members(self.group).is_empty() {
                return Some(match &self.ending {
                    Some((cause, _)) => cause.clone(),
                    None => status.clone(),
                });
            }
        }
        let now = boot_ms();
        // Whatever else ends the attempt (its time limit's grace), the
        // node's lease bounds it: once the lease runs out, the attempt is
        // gone by the lease's grace, as a fenced one is, before gpoold
        // requeues it elsewhere.
        if let (Some((_, kill_at)), Some(fence)) = (self.ending.as_mut(), &request.fence) {
            self.lease = Lease::read(&fence.lease_file).or(self.lease);
            if let Some(lease) = self.lease.filter(|lease| now >= lease.until_ms) {
                *kill_at = (*kill_at).min(lease.until_ms + fence.grace_ms.min(lease.grace_ms));
            }
        }
        match &self.ending {
            Some((_, kill_at)) if now >= *kill_at => self.kill_all(request),
            Some(_) => {}
            None => self.ending = self.reason_to_end(request, now),
        }
        None
    }

    /// Why the attempt is to end now, if it is, with the signals sent.
    fn reason_to_end(&mut self, request: &LaunchRequest, now: u64) -> Option<(Ended, u64)> {
        use nix::sys::signal::Signal;
        let over_time = request
            .time_limit_ms
            .is_some_and(|limit| now >= self.started.saturating_add(limit));
        if let Some(fence) = &request.fence {
            // A lease file being replaced may be missing for a moment.
            self.lease = Lease::read(&fence.lease_file).or(self.lease);
        }
        let fenced = match (&request.fence, self.lease) {
            (Some(fence), Some(lease)) if now >= lease.until_ms => Some((fence, lease)),
            _ => None,
        };
        if request.max_output.is_some_and(|cap| output_over(request, cap)) {
            // Output at this rate fills the disk in seconds: no grace.
            self.kill_all(request);
            Some((Ended::OutputLimit, now))
        } else if let Some((fence, lease)) = fenced {
            self.signal(Signal::try_from(fence.signal).unwrap_or(Signal::SIGTERM));
            Some((Ended::Fenced, now + fence.grace_ms.min(lease.grace_ms)))
        } else if over_time {
            self.signal(Signal::SIGTERM);
            Some((Ended::TimedOut, now + TIME_LIMIT_GRACE_MS))
        } else {
            None
        }
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(self.group), signal);
    }

    /// SIGKILL to everything of the attempt (but its supervisor).
    fn kill_all(&self, request: &LaunchRequest) {
        kill_all_but_supervisor(self.group, request.cgroup.as_ref());
        if !self.supervised {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.group),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    /// A supervisor whose node's state dir was removed does not wait
    /// for room to write its exit record there for ever.
    #[test]
    fn an_exit_record_whose_directory_is_gone_is_given_up() {
        let dir = tempfile::tempdir().unwrap();
        let exits = dir.path().join("exits");
        std::fs::create_dir(&exits).unwrap();
        let slot = exits.join("7.1");
        super::write_exit_record(&slot, b"code 0\n");
        assert_eq!(std::fs::read(&slot).unwrap(), b"code 0\n");
        std::fs::remove_dir_all(&exits).unwrap();
        let started = std::time::Instant::now();
        super::write_exit_record(&slot, b"code 0\n");
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
    }
}
