//! What a gpool daemon was started with that its children must not get.

/// Marks every descriptor above stderr that this process was started with
/// close-on-exec, so that nothing it runs (a job, a hook) inherits one.
/// Whatever started it (a shell, a wrapper script, a container runtime) may
/// have left descriptors open across that exec: a file opened for writing,
/// a pipe, a terminal's master side. A job that runs as another user must
/// not hold them. Called first in `main`, before this process opens any
/// descriptor of its own (those are close-on-exec already).
pub fn close_inherited_on_exec() {
    use nix::libc;
    // SAFETY: close_range with CLOSE_RANGE_CLOEXEC only sets descriptor
    // flags, and touches no memory.
    let marked = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    if marked == 0 {
        return;
    }
    // Kernels before 5.11 have no CLOSE_RANGE_CLOEXEC: one at a time.
    let Ok(entries) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    let fds: Vec<i32> = entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd > 2)
        .collect();
    for fd in fds {
        // The listing's own descriptor is closed by now: EBADF, ignored.
        let _ = nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC));
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;

    #[test]
    fn a_descriptor_open_across_exec_is_marked_close_on_exec() {
        let file = std::fs::File::open("/proc/self/stat").expect("open");
        // A duplicate made by dup2 is open across exec, as an inherited one is.
        let inherited = nix::unistd::dup(file.as_raw_fd()).expect("dup");
        let flags = |fd| nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GETFD).expect("F_GETFD");
        nix::fcntl::fcntl(inherited, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty())).expect("clear");
        assert_eq!(flags(inherited) & nix::libc::FD_CLOEXEC, 0);
        super::close_inherited_on_exec();
        assert_eq!(flags(inherited) & nix::libc::FD_CLOEXEC, nix::libc::FD_CLOEXEC);
        nix::unistd::close(inherited).expect("close");
    }
}
