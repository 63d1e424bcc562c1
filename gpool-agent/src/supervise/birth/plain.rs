//! A plain job's birth without a copy of the launcher. The child shares
//! the launcher's memory (`clone3` with `CLONE_VM`, on a small stack of its
//! own) and makes nothing but system calls until its exec, so no page table
//! is copied and no page is copied on write: a fork was about a third of
//! the launcher's CPU per job. All the child uses is made before the clone
//! (its argument and environment arrays, the paths its exec tries, its
//! descriptors) and stays untouched until the child has exec'd or exited.
//! The child calls nothing in libc (the launcher's `errno` is not its own)
//! and allocates nothing. What it changes of itself that the kernel keeps
//! per memory is the launcher's too: so it writes no `oom_score_adj` (it
//! is born at the launcher's 0), and a change of user leaves the launcher
//! not dumpable (which also keeps the job's user from tracing the child
//! while it shares root's memory).
//!
//! On x86_64 only; elsewhere `Plan::available` is false and jobs are
//! forked as before.

use super::super::prepare::{check_output_dirs, job_environ, open_output, user_output_files, Environ};
use super::super::LaunchRequest;
use super::{CloneArgs, Exec, Gate, CLONE_INTO_CGROUP};
use std::ffi::{c_char, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;
use std::sync::OnceLock;

/// What the child does, made before the clone.
pub(in crate::supervise) struct Plan {
    /// The paths its exec tries in turn: the program, or the program in
    /// each directory of the job's PATH.
    candidates: Vec<CString>,
    /// The arguments `argv_pointers` points into.
    _argv: Vec<CString>,
    argv_pointers: Vec<*const c_char>,
    /// For each candidate, the arguments that run it through `/bin/sh`
    /// (a script without `#!`, as `execvp` runs it).
    sh_argv_pointers: Vec<Vec<*const c_char>>,
    envp: Environ,
    /// Its stdin, stdout and stderr; `files` keeps them open until the
    /// clone, which gives the child its own.
    stdio: [RawFd; 3],
    files: Vec<OwnedFd>,
    /// Its cgroup's `cgroup.procs` files, which it joins from the
    /// `join_from`th on (it is born in those before).
    join: Vec<CString>,
    join_from: usize,
    /// The directory it enters, and whether as its user.
    workdir: Option<CString>,
    user: Option<User>,
    /// `-o/-e` files its user opens, onto stdout and stderr.
    user_files: Vec<(CString, i32)>,
    user_file_flags: i32,
    /// Read until the launcher has recorded the launch; and where a failed
    /// exec's errno goes.
    gate: RawFd,
    gate_other_end: RawFd,
    errors: RawFd,
}

struct User {
    groups: Vec<nix::libc::gid_t>,
    gid: nix::libc::gid_t,
    uid: nix::libc::uid_t,
}

/// Set once the kernel (or a seccomp filter) refused `clone3`.
static REFUSED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// What must outlive the child's exec: its plan and its stack. Dropped
/// once the job has ended.
pub(in crate::supervise) struct Born {
    plan: std::mem::ManuallyDrop<Box<Plan>>,
    stack: std::mem::ManuallyDrop<Box<Stack>>,
}

impl Drop for Born {
    /// Frees them, but for a launcher unwinding from a panic: its child
    /// may not have exec'd yet, and the memory stays for it.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            // SAFETY: dropped once, here, and never used again.
            unsafe {
                std::mem::ManuallyDrop::drop(&mut self.plan);
                std::mem::ManuallyDrop::drop(&mut self.stack);
            }
        }
    }
}

/// The child's stack until its exec: it makes system calls only.
#[repr(C, align(16))]
struct Stack([u8; 16 * 1024]);

// SAFETY: the pointers point into buffers the plan owns and never changes.
unsafe impl Send for Plan {}

impl Plan {
    /// Whether plain jobs are born this way here: on x86_64, with Linux
    /// 5.5 or later (whose clone3 puts the child's stack pointer at the
    /// top of the stack it is given), until the kernel refuses it.
    pub(in crate::supervise) fn available() -> bool {
        static KERNEL_OK: OnceLock<bool> = OnceLock::new();
        let kernel_ok = *KERNEL_OK.get_or_init(|| {
            // SAFETY: uname fills the struct it is given.
            let mut name: nix::libc::utsname = unsafe { std::mem::zeroed() };
            // SAFETY: as above; the release is a NUL-ended C string.
            let release = (unsafe { nix::libc::uname(&mut name) } == 0).then(|| {
                unsafe { std::ffi::CStr::from_ptr(name.release.as_ptr()) }
                    .to_string_lossy()
                    .into_owned()
            });
            release.is_some_and(|release| kernel_at_least(&release, (5, 5)))
        });
        cfg!(target_arch = "x86_64") && kernel_ok && !REFUSED.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Notes that the kernel refused `clone3`: jobs are forked instead.
    pub(in crate::supervise) fn refused() {
        REFUSED.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The plan of `request`'s job, whose stdin is `null`.
    pub(in crate::supervise) fn of(request: &LaunchRequest, null: &OwnedFd) -> Result<Plan, String> {
        use std::os::unix::ffi::OsStrExt;
        super::super::prepare::make_checkpoint_dir(request)?;
        if let Some(cgroup) = &request.cgroup {
            cgroup.create()?;
        }
        let nul = |what: String| format!("{what} holds a NUL byte");
        let argv = std::iter::once(&request.program)
            .chain(&request.args)
            .enumerate()
            .map(|(n, arg)| CString::new(arg.as_bytes()).map_err(|_| nul(format!("its argument {n} ({arg:?})"))))
            .collect::<Result<Vec<_>, _>>()?;
        let mut argv_pointers: Vec<*const c_char> = argv.iter().map(|arg| arg.as_ptr()).collect();
        argv_pointers.push(std::ptr::null());
        let mut files = Vec::new();
        let mut stdio = [null.as_raw_fd(); 3];
        for (slot, path) in [(1, &request.stdout), (2, &request.stderr)] {
            if let Some(file) = open_output(request, path)? {
                stdio[slot] = file.as_raw_fd();
                files.push(OwnedFd::from(file));
            }
        }
        let join = request.cgroup.iter().flat_map(|cgroup| cgroup.dirs.iter());
        let join = join
            .map(|dir| {
                let procs = dir.join("cgroup.procs");
                CString::new(procs.as_os_str().as_bytes()).map_err(|_| nul(format!("cgroup file {}", procs.display())))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let workdir = request.workdir.as_ref();
        let workdir = workdir
            .map(|dir| {
                CString::new(dir.as_os_str().as_bytes()).map_err(|_| nul(format!("its workdir {}", dir.display())))
            })
            .transpose()?;
        check_output_dirs(request)?;
        let user_files = user_output_files(request)?;
        let mode = if request.append_output {
            nix::libc::O_APPEND
        } else {
            nix::libc::O_TRUNC
        };
        let candidates = candidates(request)?;
        let sh_argv_pointers = (candidates.iter())
            .map(|path| {
                let args = argv.iter().skip(1).map(|arg| arg.as_ptr());
                let mut pointers = vec![c"sh".as_ptr(), path.as_ptr()];
                pointers.extend(args.chain([std::ptr::null()]));
                pointers
            })
            .collect();
        Ok(Plan {
            candidates,
            sh_argv_pointers,
            _argv: argv,
            argv_pointers,
            envp: job_environ(request)?,
            stdio,
            files,
            join,
            join_from: 0,
            workdir,
            user: request.run_as.as_ref().map(|user| User {
                groups: user.groups.clone(),
                gid: user.gid,
                uid: user.uid,
            }),
            user_files,
            user_file_flags: mode | nix::libc::O_WRONLY | nix::libc::O_CREAT | nix::libc::O_CLOEXEC,
            gate: -1,
            gate_other_end: -1,
            errors: -1,
        })
    }
}

/// Whether a kernel release ("6.1.0-18-amd64") is `wanted` or later.
fn kernel_at_least(release: &str, wanted: (u32, u32)) -> bool {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let mut next = || parts.next().and_then(|part| part.parse::<u32>().ok());
    matches!((next(), next()), (Some(major), Some(minor)) if (major, minor) >= wanted)
}

/// The paths an exec of the job's program tries, as `execvp` would with
/// the job's PATH (`/bin:/usr/bin` without one).
fn candidates(request: &LaunchRequest) -> Result<Vec<CString>, String> {
    let program = &request.program;
    let nul = || format!("its program {program} holds a NUL byte");
    if program.contains('/') {
        return Ok(vec![CString::new(program.as_bytes()).map_err(|_| nul())?]);
    }
    let path = request
        .env
        .iter()
        .rev()
        .find(|(name, _)| name == "PATH")
        .map_or("/bin:/usr/bin", |(_, value)| value.as_str());
    path.split(':')
        .map(|dir| {
            let dir = if dir.is_empty() { "." } else { dir };
            CString::new(format!("{dir}/{program}")).map_err(|_| nul())
        })
        .collect()
}

/// Starts the job of `plan` in the cgroup v2 directory `into` where there
/// is one; with `gate`, nothing of the job runs until the gate passed it.
/// Its pid, its pidfd where the kernel gave one, its exec's report, and
/// what must be kept until it has ended.
pub(in crate::supervise) fn clone(
    mut plan: Plan,
    into: Option<&Path>,
    gate: Gate,
) -> std::io::Result<(i32, Option<OwnedFd>, Exec, Born)> {
    use nix::fcntl::OFlag;
    let cgroup = into.map(super::open_dir).transpose()?;
    let (errors, error_out) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    let (wait_for, passed) = nix::unistd::pipe2(OFlag::O_CLOEXEC)?;
    plan.errors = error_out.as_raw_fd();
    plan.gate = wait_for.as_raw_fd();
    plan.gate_other_end = passed.as_raw_fd();
    plan.join_from = usize::from(cgroup.is_some());
    let files = std::mem::take(&mut plan.files);
    let mut plan = Box::new(plan);
    let mut stack = Box::new(Stack([0; 16 * 1024]));
    let (pid, pidfd) = match start(&plan, &mut stack, cgroup.as_ref()) {
        Err(err) if cgroup.is_some() => {
            eprintln!("gpool-supervise: clone3 into a cgroup failed ({err}); the job moves in itself");
            plan.join_from = 0;
            start(&plan, &mut stack, None)?
        }
        started => started?,
    };
    // The child has its own copies of the descriptors: the job's files,
    // its ends of the pipes.
    drop((error_out, wait_for, cgroup, files));
    let born = Born {
        plan: std::mem::ManuallyDrop::new(plan),
        stack: std::mem::ManuallyDrop::new(stack),
    };
    if !gate(pid) || nix::unistd::write(&passed, b"1") != Ok(1) {
        drop(passed);
        let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None);
        return Err(std::io::Error::other("its launch could not be recorded"));
    }
    Ok((pid, pidfd, Exec(std::fs::File::from(errors)), born))
}

/// `clone3` with `CLONE_VM` into `cgroup` (where given), the child running
/// `plan` on `stack`: the child's pid and pidfd.
fn start(plan: &Plan, stack: &mut Stack, cgroup: Option<&OwnedFd>) -> std::io::Result<(i32, Option<OwnedFd>)> {
    const CLONE_PIDFD: u64 = nix::libc::CLONE_PIDFD as u64;
    let mut pidfd: RawFd = -1;
    let args = CloneArgs {
        flags: nix::libc::CLONE_VM as u64 | CLONE_PIDFD | cgroup.map_or(0, |_| CLONE_INTO_CGROUP),
        pidfd: &mut pidfd as *mut RawFd as u64,
        exit_signal: nix::libc::SIGCHLD as u64,
        stack: stack.0.as_mut_ptr() as u64,
        stack_size: stack.0.len() as u64,
        cgroup: cgroup.map_or(0, |fd| fd.as_raw_fd() as u64),
        ..CloneArgs::default()
    };
    // SAFETY: the child runs `child` on its own stack and never returns;
    // it reads only `plan`, which the caller keeps (with the stack) until
    // the child has exec'd or exited.
    let pid = unsafe { sys::clone3(&args, child, plan) };
    if pid < 0 {
        return Err(std::io::Error::from_raw_os_error(-pid as i32));
    }
    // SAFETY: a descriptor the kernel just made for this process.
    let pidfd = (pidfd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(pidfd) });
    Ok((pid as i32, pidfd))
}

/// The child: runs its plan up to the exec; a failure's errno goes to the
/// launcher, and the child exits 127.
extern "C" fn child(plan: *const Plan) -> ! {
    // SAFETY: the plan outlives the child's use of it (see `start`).
    let plan = unsafe { &*plan };
    let errno = plan.run();
    let code = errno.to_ne_bytes();
    sys::call(
        nix::libc::SYS_write,
        [plan.errors as usize, code.as_ptr() as usize, 4, 0],
    );
    sys::exit(127)
}

impl Plan {
    /// From the gate to the exec, in system calls only; returns the errno
    /// of what failed.
    fn run(&self) -> i32 {
        match self.set_up() {
            Ok(()) => self.exec(),
            Err(errno) => errno,
        }
    }

    /// Everything before the exec: its session, cgroup, descriptors, user
    /// and directory.
    fn set_up(&self) -> Result<(), i32> {
        use nix::libc::*;
        use sys::call;
        call(SYS_close, [self.gate_other_end as usize, 0, 0, 0]);
        let mut byte = 0u8;
        if call(SYS_read, [self.gate as usize, &mut byte as *mut u8 as usize, 1, 0]) != 1 {
            sys::exit(127);
        }
        call(SYS_setsid, [0; 4]);
        // The job's place in the OOM order is set by the launcher once it
        // has exec'd: written here, where the memory is still shared, it
        // would be the launcher's too.
        for procs in self.join.iter().skip(self.join_from) {
            write_file(procs, b"0")?;
        }
        for (target, fd) in self.stdio.iter().enumerate() {
            ok(call(SYS_dup2, [*fd as usize, target, 0, 0]))?;
        }
        if let (Some(dir), None) = (&self.workdir, &self.user) {
            ok(call(SYS_chdir, [dir.as_ptr() as usize, 0, 0, 0]))?;
        }
        if let Some(user) = &self.user {
            ok(call(
                SYS_setgroups,
                [user.groups.len(), user.groups.as_ptr() as usize, 0, 0],
            ))?;
            ok(call(SYS_setgid, [user.gid as usize, 0, 0, 0]))?;
            ok(call(SYS_setuid, [user.uid as usize, 0, 0, 0]))?;
            if let Some(dir) = &self.workdir {
                ok(call(SYS_chdir, [dir.as_ptr() as usize, 0, 0, 0]))?;
            }
        }
        for (path, target) in &self.user_files {
            let fd = ok(call(
                SYS_openat,
                [
                    AT_FDCWD as usize,
                    path.as_ptr() as usize,
                    self.user_file_flags as usize,
                    0o644,
                ],
            ))?;
            ok(call(SYS_dup2, [fd as usize, *target as usize, 0, 0]))?;
            call(SYS_close, [fd as usize, 0, 0, 0]);
        }
        // Rust programs ignore SIGPIPE; the job gets the default, and no
        // signal blocked.
        let default = [0u64; 4];
        call(SYS_rt_sigaction, [SIGPIPE as usize, default.as_ptr() as usize, 0, 8]);
        call(
            SYS_rt_sigprocmask,
            [SIG_SETMASK as usize, default.as_ptr() as usize, 0, 8],
        );
        Ok(())
    }

    /// Execs each candidate in turn, as glibc's `execvp` does: past one
    /// that is missing or on a file system gone away, past one it may not
    /// run (then saying so if none ran), and a file of no known format
    /// through `/bin/sh`.
    fn exec(&self) -> i32 {
        use nix::libc::*;
        let mut denied = false;
        let envp = self.envp.as_ptr() as usize;
        for (path, through_sh) in self.candidates.iter().zip(&self.sh_argv_pointers) {
            let argv = self.argv_pointers.as_ptr() as usize;
            let mut errno = -sys::call(SYS_execve, [path.as_ptr() as usize, argv, envp, 0]) as i32;
            if errno == ENOEXEC {
                let sh_argv = through_sh.as_ptr() as usize;
                errno = -sys::call(SYS_execve, [c"/bin/sh".as_ptr() as usize, sh_argv, envp, 0]) as i32;
            }
            match errno {
                ENOENT | ENOTDIR | ESTALE | ENODEV | ETIMEDOUT => {}
                EACCES => denied = true,
                _ => return errno,
            }
        }
        if denied {
            EACCES
        } else {
            ENOENT
        }
    }
}

/// Writes `bytes` to the file at `path` (opened and closed here).
fn write_file(path: &std::ffi::CStr, bytes: &[u8]) -> Result<(), i32> {
    use nix::libc::*;
    let flags = (O_WRONLY | O_CLOEXEC) as usize;
    let fd = ok(sys::call(
        SYS_openat,
        [AT_FDCWD as usize, path.as_ptr() as usize, flags, 0],
    ))?;
    let written = sys::call(SYS_write, [fd as usize, bytes.as_ptr() as usize, bytes.len(), 0]);
    sys::call(SYS_close, [fd as usize, 0, 0, 0]);
    ok(written).map(drop)
}

/// A system call's result, or its errno.
fn ok(result: isize) -> Result<isize, i32> {
    if result < 0 {
        Err(-result as i32)
    } else {
        Ok(result)
    }
}

mod sys;
#[cfg(test)]
mod tests;
