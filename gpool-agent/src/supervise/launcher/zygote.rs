//! The zygotes of cgroup v1 nodes: jobs forked ahead, each waiting in a
//! cgroup of its own for its request.

use super::*;

/// On cgroup v1, where joining a cgroup costs a process a grace period of
/// the kernel's (about 15 ms), the next job waits ahead as a zygote: a
/// fork of the launcher, already the leader of its session and in a
/// cgroup of its own, which becomes the attempt's when its request comes
/// (a rename) and then execs the job. The launcher knows where attempts'
/// cgroups go from the first request that has one.
///
/// A zygote costs more CPU than a fork at the launch (its warm cgroup is
/// made, joined and renamed), and under a stream of launches the kernel's
/// grace periods are shared, so one waits ahead only once launches pause
/// (`QUIET`): the job that ends a pause, the one a user waits for, starts
/// at once, and a stream costs no more than it must.
#[derive(Default)]
pub(super) struct Zygotes {
    cgroup_parent: Option<PathBuf>,
    pub(super) ready: Option<Zygote>,
    last_launch: Option<Instant>,
    cleaned_at: Option<Instant>,
}

/// How long launches must pause before a zygote waits ahead.
const QUIET: Duration = Duration::from_millis(20);
/// How often what dead zygotes left is looked for.
const CLEAN_UP_EVERY: Duration = Duration::from_secs(1);

/// A forked child waiting for its request on `requests`; it reports a
/// failed start on `report`.
pub(super) struct Zygote {
    pid: i32,
    requests: std::fs::File,
    report: std::fs::File,
}

impl Zygotes {
    /// The zygote waiting under `request`'s cgroup parent, if one is ready.
    pub(super) fn take_for(&mut self, request: &LaunchRequest) -> Option<Zygote> {
        let parent = request
            .cgroup
            .as_ref()
            .filter(|cgroup| !cgroup.unified)
            .and_then(|cgroup| cgroup.dirs.first()?.parent())?;
        if self.cgroup_parent.is_none() && crate::cgroup::Warm::works_under(parent) {
            self.cgroup_parent = Some(parent.to_path_buf());
        }
        self.last_launch = Some(Instant::now());
        self.ready
            .take()
            .filter(|_| self.cgroup_parent.as_deref() == Some(parent))
    }

    /// How long until a zygote is due (launches have paused), if one is
    /// wanted and not ready.
    pub(super) fn due_in(&self) -> Option<Duration> {
        if self.ready.is_some() || self.cgroup_parent.is_none() {
            return None;
        }
        Some(QUIET.saturating_sub(self.last_launch.map_or(QUIET, |at| at.elapsed())))
    }

    /// Forks the next zygote, once attempts' cgroups are known and
    /// launches have paused.
    pub(super) fn refill(&mut self) {
        if self.due_in() != Some(Duration::ZERO) {
            return;
        }
        if let Some(parent) = self.cgroup_parent.clone() {
            if self.cleaned_at.is_none_or(|at| at.elapsed() >= CLEAN_UP_EVERY) {
                crate::cgroup::Warm::clean_up_after_the_dead(&parent);
                self.cleaned_at = Some(Instant::now());
            }
            self.ready = Zygote::fork(&parent);
        }
    }
}

impl Zygote {
    fn fork(cgroup_parent: &Path) -> Option<Zygote> {
        use nix::fcntl::OFlag;
        let (request_in, requests) = nix::unistd::pipe2(OFlag::O_CLOEXEC).ok()?;
        let (report, report_out) = nix::unistd::pipe2(OFlag::O_CLOEXEC).ok()?;
        // SAFETY: this process is single-threaded; the child never returns.
        match unsafe { nix::unistd::fork() }.ok()? {
            nix::unistd::ForkResult::Child => {
                drop((requests, report));
                become_job(
                    cgroup_parent,
                    std::fs::File::from(request_in),
                    std::fs::File::from(report_out),
                )
            }
            nix::unistd::ForkResult::Parent { child } => Some(Zygote {
                pid: child.as_raw(),
                requests: std::fs::File::from(requests),
                report: std::fs::File::from(report),
            }),
        }
    }

    /// Marks the attempt's slot with the zygote's pid, then hands it the
    /// request: from there it is the job. The request comes back if the
    /// zygote is gone.
    pub(super) fn hand(
        mut self,
        request: LaunchRequest,
        ids: Launcher,
        jobs: &mut std::collections::HashMap<i32, Running>,
    ) -> Result<LaunchReply, Box<LaunchRequest>> {
        let mark = launched_mark(request.job_id, request.epoch, self.pid, Some(ids));
        if let Err(err) = crate::spool::write_in_place(&request.exit_file, mark.as_bytes()) {
            let reason = format!("{}: cannot mark the launch: {err}", request.exit_file.display());
            return Ok(refuse(&request, reason));
        }
        let mut line = match serde_json::to_vec(&request) {
            Ok(line) => line,
            Err(err) => return Ok(refuse(&request, format!("cannot encode its request: {err}"))),
        };
        line.push(b'\n');
        // A zygote gone before its request took nothing of it (its end,
        // reaped here, is no job's).
        if self.requests.write_all(&line).is_err() {
            return Err(Box::new(request));
        }
        drop(self.requests);
        let watch = Watch::new(&request, self.pid, false);
        jobs.insert(
            self.pid,
            Running {
                request,
                pidfd: pidfd_of(self.pid),
                exec: Some(ExecReport::Zygote(self.report)),
                watch,
                status: None,
                _born: None,
            },
        );
        Ok(LaunchReply::Direct(self.pid))
    }
}

/// The zygote: leads a session of its own and waits, in a cgroup of its
/// own under `cgroup_parent`, for its request; then makes that cgroup the
/// attempt's and execs the job. Whatever stops the start is written to
/// `report`.
fn become_job(cgroup_parent: &Path, mut requests: std::fs::File, mut report: std::fs::File) -> ! {
    use std::os::unix::process::CommandExt;
    let _ = nix::unistd::setsid();
    // The launcher's pipes are the agent's: off them while it waits.
    if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        let _ = nix::unistd::dup2(null.as_raw_fd(), 0);
        let _ = nix::unistd::dup2(null.as_raw_fd(), 1);
    }
    let warm = crate::cgroup::Warm::enter(cgroup_parent).ok();
    let mut text = String::with_capacity(16 * 1024);
    let request = std::io::Read::read_to_string(&mut requests, &mut text)
        .ok()
        .and_then(|_| serde_json::from_str::<LaunchRequest>(&text).ok());
    drop(requests);
    let Some(request) = request else {
        if let Some(warm) = warm {
            warm.discard();
        }
        // SAFETY: ends this forked child at once.
        unsafe { nix::libc::_exit(0) }
    };
    let born_in_first = super::run::take_warm(&request, warm);
    let reason = match prepare(&request, usize::from(born_in_first)) {
        Ok((mut command, _)) => cannot_run(&request, &with_output_files(&request, command.exec())),
        Err(reason) => reason,
    };
    let _ = report.write_all(reason.as_bytes());
    // SAFETY: ends this forked child at once.
    unsafe { nix::libc::_exit(127) }
}
