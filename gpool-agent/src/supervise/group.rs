//! An attempt's processes as its supervisor sees them: its child's exit,
//! and everything of the attempt to kill at its end.

/// A pidfd on the supervisor's child, to wait for its exit with a timeout
/// (a plain sleep where no pidfd can be had).
pub(super) struct ChildExit(Option<std::os::fd::OwnedFd>);

impl ChildExit {
    pub(super) fn open(pid: i32) -> ChildExit {
        ChildExit(super::pidfd_open(pid).ok())
    }

    /// Returns when the child exited or after `timeout_ms`.
    pub(super) fn wait(&self, timeout_ms: u64) {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        use std::os::fd::AsFd;
        match &self.0 {
            Some(fd) => {
                let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLIN)];
                let _ = poll(
                    &mut fds,
                    PollTimeout::try_from(timeout_ms as i32).unwrap_or(PollTimeout::MAX),
                );
            }
            None => std::thread::sleep(std::time::Duration::from_millis(timeout_ms.min(50))),
        }
    }
}

/// SIGKILL to every process of the attempt except its supervisor (the
/// group's leader): the rest of its process group, and all of its cgroup
/// (which the supervisor is not in).
pub fn kill_all_but_supervisor(pgid: i32, cgroup: Option<&crate::cgroup::AttemptCgroup>) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    if pgid <= 0 {
        return;
    }
    let mut pids = cgroup.map(crate::cgroup::AttemptCgroup::pids).unwrap_or_default();
    pids.extend(group_members(pgid));
    for pid in pids.into_iter().filter(|pid| *pid != pgid) {
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
}

/// The live processes of group `pgid` other than its leader, and of any
/// session a child of its leader leads (an interactive job's).
pub(super) fn group_members(pgid: i32) -> Vec<i32> {
    // (pid, ppid, process group, session) of every live process.
    let mut processes = Vec::new();
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else {
                continue;
            };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            // After "(comm) ": state, ppid, pgrp, session.
            let fields: Vec<&str> = stat
                .rsplit_once(") ")
                .map_or_else(Vec::new, |(_, rest)| rest.split(' ').take(4).collect());
            let number = |i: usize| fields.get(i).and_then(|field| field.parse::<i32>().ok()).unwrap_or(-1);
            if fields.first().is_some_and(|state| *state != "Z") {
                processes.push((pid, number(1), number(2), number(3)));
            }
        }
    }
    let sessions: Vec<i32> = processes
        .iter()
        .filter(|(pid, ppid, _, session)| *ppid == pgid && session == pid)
        .map(|(pid, ..)| *pid)
        .collect();
    processes
        .into_iter()
        .filter(|(pid, _, pgrp, session)| *pid != pgid && (*pgrp == pgid || sessions.contains(session)))
        .map(|(pid, ..)| pid)
        .collect()
}
