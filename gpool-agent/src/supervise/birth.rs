//! The job's birth. On cgroup v2 it is forked straight into its cgroup
//! (`clone3` with `CLONE_INTO_CGROUP`, Linux 5.7+), so it never runs an
//! instruction outside its limits; where the kernel refuses that, it is
//! forked and moves itself in before anything else, and the log says so.
//! Either way the child then runs the prepared `Command`'s steps and execs
//! (`CommandExt::exec`), and an exec that fails is reported back through
//! a close-on-exec pipe, as `Command::spawn` does.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

pub(super) mod plain;

/// `CLONE_INTO_CGROUP` (linux/sched.h).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// `struct clone_args` as of Linux 5.7 (its `cgroup` field last).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

/// What the launcher does between the job's fork and its exec, given its
/// pid: `false` stops the launch (the child exits without running anything).
pub(super) type Gate<'a> = &'a mut dyn FnMut(i32) -> bool;

/// Starts `command` as a child of this (single-threaded) process, in the
/// cgroup v2 directory `into` where there is one; its pid, once it has
/// exec'd. With a `gate`, the child waits before anything of the job runs
/// until the gate has passed it (the launcher records the launch there
/// first).
pub(super) fn spawn(command: &mut Command, into: Option<&Path>, gate: Option<Gate>) -> std::io::Result<i32> {
    let (pid, exec) = fork(command, into, gate)?;
    match exec.failure() {
        Some(err) => {
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
            Err(err)
        }
        None => Ok(pid),
    }
}

/// The end of the pipe a child reports a failed exec through: four bytes
/// (its errno) when it failed, none once it succeeded.
pub(super) struct Exec(std::fs::File);

impl Exec {
    /// Why the exec failed, if it did; blocks until the child has exec'd
    /// or exited.
    pub(super) fn failure(self) -> Option<std::io::Error> {
        let mut code = [0u8; 4];
        let mut errors = self.0;
        std::io::Read::read_exact(&mut errors, &mut code)
            .ok()
            .map(|()| std::io::Error::from_raw_os_error(i32::from_ne_bytes(code)))
    }
}

/// Forks `command` as `spawn` does, without waiting for its exec: its pid,
/// and the pipe that says whether the exec failed.
pub(super) fn fork(command: &mut Command, into: Option<&Path>, gate: Option<Gate>) -> std::io::Result<(i32, Exec)> {
    let cgroup = into.map(open_dir).transpose()?;
    let (errors, error_out) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    let gate_pipe = gate
        .is_some()
        .then(|| nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC))
        .transpose()?;
    let (pid, born_in_it) = match fork_into(cgroup.as_ref()) {
        Ok(pid) => (pid, cgroup.is_some()),
        Err(err) => {
            if let Some(dir) = into {
                eprintln!(
                    "gpool-supervise: clone3 into {} failed ({err}); forking and moving the job in instead",
                    dir.display()
                );
            }
            // SAFETY: this process is single-threaded; the child only
            // runs `child` below, which execs or exits.
            match unsafe { nix::libc::fork() } {
                -1 => return Err(std::io::Error::last_os_error()),
                pid => (pid, false),
            }
        }
    };
    if pid == 0 {
        drop(errors);
        if let Some((wait_for, passed)) = gate_pipe {
            drop(passed);
            let mut byte = [0u8; 1];
            if !matches!(nix::unistd::read(wait_for.as_raw_fd(), &mut byte), Ok(1)) {
                // SAFETY: ends this forked child before anything of the job ran.
                unsafe { nix::libc::_exit(127) }
            }
        }
        child(command, into.filter(|_| !born_in_it), &error_out);
    }
    drop(error_out);
    drop(cgroup);
    if let (Some(gate), Some((wait_for, passed))) = (gate, gate_pipe) {
        drop(wait_for);
        if !gate(pid) || nix::unistd::write(&passed, b"1") != Ok(1) {
            drop(passed);
            let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
            return Err(std::io::Error::other("its launch could not be recorded"));
        }
    }
    Ok((pid, Exec(std::fs::File::from(errors))))
}

/// The child: joins `move_into` when it was not born there, runs the
/// command's steps and execs; reports a failure's errno and exits 127.
fn child(command: &mut Command, move_into: Option<&Path>, error_out: &OwnedFd) -> ! {
    let failed = match move_into.map(|dir| std::fs::write(dir.join("cgroup.procs"), b"0")) {
        Some(Err(err)) => err,
        _ => command.exec(),
    };
    let code = failed.raw_os_error().unwrap_or(nix::libc::EIO).to_ne_bytes();
    // SAFETY: write(2) and _exit(2) on a descriptor this process owns.
    unsafe {
        nix::libc::write(error_out.as_raw_fd(), code.as_ptr().cast(), code.len());
        nix::libc::_exit(127)
    }
}

/// `clone3` into the cgroup `cgroup` (a plain fork without one): 0 in the
/// child, its pid in the parent.
fn fork_into(cgroup: Option<&OwnedFd>) -> std::io::Result<i32> {
    let Some(cgroup) = cgroup else {
        // SAFETY: as in `spawn`: single-threaded, and the child execs.
        return match unsafe { nix::libc::fork() } {
            -1 => Err(std::io::Error::last_os_error()),
            pid => Ok(pid),
        };
    };
    let args = CloneArgs {
        flags: CLONE_INTO_CGROUP,
        exit_signal: nix::libc::SIGCHLD as u64,
        cgroup: cgroup.as_raw_fd() as u64,
        ..CloneArgs::default()
    };
    // SAFETY: clone3 with no stack and no CLONE_VM is a fork: the child
    // gets a copy of this single-threaded process and returns 0 here.
    let pid = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_clone3,
            &args as *const CloneArgs,
            std::mem::size_of::<CloneArgs>(),
        )
    };
    if pid < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(pid as i32)
    }
}

fn open_dir(dir: &Path) -> std::io::Result<OwnedFd> {
    use nix::fcntl::OFlag;
    let fd = nix::fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    // SAFETY: a new descriptor nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    /// Without a cgroup it starts a command as `Command::spawn` would,
    /// and reports a command that cannot run with its errno.
    #[test]
    fn a_command_starts_and_a_missing_one_is_reported() {
        let mut command = std::process::Command::new("true");
        let pid = super::spawn(&mut command, None, None).unwrap();
        let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap();
        assert_eq!(
            status,
            nix::sys::wait::WaitStatus::Exited(nix::unistd::Pid::from_raw(pid), 0)
        );
        let mut missing = std::process::Command::new("/nonexistent/gpool-test");
        let err = super::spawn(&mut missing, None, None).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    }
}
