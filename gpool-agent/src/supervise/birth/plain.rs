//! A plain job's birth without a copy of the launcher. The child shares
//! the launcher's memory (`clone3` with `CLONE_VM`, on a small stack of its
//! own) and makes nothing but system calls until its exec, so no page table
//! is copied and no page is copied on write: a fork was about a third of
//! the launcher's CPU per job. All the child uses is made before the clone
//! (its argument and environment arrays, the paths its exec tries, its
//! descriptors) and stays untouched until the child has exec'd or exited.
//! The child calls nothing in libc (the launcher's `errno` is not its own)
//! and allocates nothing.
//!
//! On x86_64 only; elsewhere `Plan::available` is false and jobs are
//! forked as before.

use super::super::prepare::{check_output_dirs, job_environ, open_output, user_output_files, Environ};
use super::super::LaunchRequest;
use super::{CloneArgs, Exec, Gate, CLONE_INTO_CGROUP};
use std::ffi::{c_char, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

/// What the child does, made before the clone.
pub(in crate::supervise) struct Plan {
    /// The paths its exec tries in turn: the program, or the program in
    /// each directory of the job's PATH.
    candidates: Vec<CString>,
    /// The arguments `argv_pointers` points into.
    _argv: Vec<CString>,
    argv_pointers: Vec<*const c_char>,
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
    _plan: Box<Plan>,
    _stack: Box<Stack>,
}

/// The child's stack until its exec: it makes system calls only.
#[repr(C, align(16))]
struct Stack([u8; 16 * 1024]);

// SAFETY: the pointers point into buffers the plan owns and never changes.
unsafe impl Send for Plan {}

impl Plan {
    /// Whether plain jobs are born this way here.
    pub(in crate::supervise) fn available() -> bool {
        cfg!(target_arch = "x86_64") && !REFUSED.load(std::sync::atomic::Ordering::Relaxed)
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
        let nul = |what: &str| format!("{what} holds a NUL byte");
        let argv = std::iter::once(&request.program)
            .chain(&request.args)
            .map(|arg| CString::new(arg.as_bytes()).map_err(|_| nul("an argument")))
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
            .map(|dir| CString::new(dir.join("cgroup.procs").as_os_str().as_bytes()).map_err(|_| nul("a cgroup path")))
            .collect::<Result<Vec<_>, _>>()?;
        let workdir = request.workdir.as_ref();
        let workdir = workdir
            .map(|dir| CString::new(dir.as_os_str().as_bytes()).map_err(|_| nul("its workdir")))
            .transpose()?;
        check_output_dirs(request)?;
        let user_files = user_output_files(request)?;
        let mode = if request.append_output {
            nix::libc::O_APPEND
        } else {
            nix::libc::O_TRUNC
        };
        Ok(Plan {
            candidates: candidates(request)?,
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
        _plan: plan,
        _stack: stack,
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
        // The launcher stands below jobs in the OOM order; the job takes
        // the ordinary place.
        let _ = write_file(c"/proc/self/oom_score_adj", b"0");
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

    /// Execs each candidate in turn, as `execvp` does: past a missing one,
    /// and past one it may not run (then saying so if none ran).
    fn exec(&self) -> i32 {
        use nix::libc::*;
        let mut denied = false;
        for path in &self.candidates {
            let argv = self.argv_pointers.as_ptr() as usize;
            let errno = -sys::call(
                SYS_execve,
                [path.as_ptr() as usize, argv, self.envp.as_ptr() as usize, 0],
            ) as i32;
            match errno {
                ENOENT | ENOTDIR | ENAMETOOLONG | ELOOP => {}
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

#[cfg(target_arch = "x86_64")]
mod sys {
    use super::{CloneArgs, Plan};
    use std::arch::asm;

    /// A system call of up to four arguments: its result, or -errno.
    #[inline(always)]
    pub(super) fn call(number: nix::libc::c_long, args: [usize; 4]) -> isize {
        let result: isize;
        // SAFETY: the kernel reads only what the arguments point to; rcx
        // and r11 are the syscall instruction's own.
        unsafe {
            asm!(
                "syscall",
                inlateout("rax") number as isize => result,
                in("rdi") args[0],
                in("rsi") args[1],
                in("rdx") args[2],
                in("r10") args[3],
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        result
    }

    pub(super) fn exit(code: i32) -> ! {
        loop {
            call(nix::libc::SYS_exit, [code as usize, 0, 0, 0]);
        }
    }

    /// `clone3` whose child calls `entry(plan)` on the stack `args` names:
    /// the child's pid (or -errno) in the caller.
    ///
    /// # Safety
    /// `args` must name a stack the child alone uses, and `plan` must stay
    /// valid until the child has exec'd or exited.
    pub(super) unsafe fn clone3(args: &CloneArgs, entry: extern "C" fn(*const Plan) -> !, plan: &Plan) -> isize {
        let result: isize;
        // SAFETY: as the caller promises. In the child (rax 0) the kernel
        // has switched to the new stack; it calls `entry`, which never
        // returns, with a cleared frame pointer.
        unsafe {
            asm!(
                "syscall",
                "test rax, rax",
                "jnz 2f",
                "xor ebp, ebp",
                "mov rdi, r12",
                "call r13",
                "ud2",
                "2:",
                inlateout("rax") nix::libc::SYS_clone3 as isize => result,
                in("rdi") args as *const CloneArgs,
                in("rsi") std::mem::size_of::<CloneArgs>(),
                in("r12") plan as *const Plan,
                in("r13") entry,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        result
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod sys {
    use super::{CloneArgs, Plan};

    pub(super) fn call(_: nix::libc::c_long, _: [usize; 4]) -> isize {
        -(nix::libc::ENOSYS as isize)
    }

    pub(super) fn exit(code: i32) -> ! {
        // SAFETY: _exit(2) ends this process at once.
        unsafe { nix::libc::_exit(code) }
    }

    pub(super) unsafe fn clone3(_: &CloneArgs, _: extern "C" fn(*const Plan) -> !, _: &Plan) -> isize {
        -(nix::libc::ENOSYS as isize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(program: &str, args: &[&str], dir: &Path) -> LaunchRequest {
        serde_json::from_value(serde_json::json!({
            "job_id": 1, "epoch": 1, "program": program, "args": args,
            "env": [["PATH", "/usr/local/bin:/usr/bin:/bin"], ["GREETING", "hello"]],
            "exit_file": dir.join("exit"), "checkpoint_dir": dir.join("checkpoint"),
            "stdout": dir.join("out"),
        }))
        .unwrap()
    }

    fn null() -> OwnedFd {
        OwnedFd::from(std::fs::File::open("/dev/null").unwrap())
    }

    /// Starts the plan of `request` through a gate that records the pid;
    /// how the job ended, and its exec's report.
    fn run(request: &LaunchRequest) -> (nix::sys::wait::WaitStatus, Option<std::io::Error>) {
        let plan = Plan::of(request, &null()).unwrap();
        let mut gated = None;
        let mut gate = |pid: i32| {
            gated = Some(pid);
            true
        };
        let (pid, pidfd, exec, born) = clone(plan, None, &mut gate).unwrap();
        assert_eq!(gated, Some(pid), "the gate saw the job's pid");
        assert!(pidfd.is_some(), "the kernel gave a pidfd");
        let status = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).unwrap();
        drop(born);
        (status, exec.failure())
    }

    /// A job found on its PATH runs with its arguments and only its own
    /// variables, its output in its file, and leads a session of its own.
    #[test]
    fn a_job_runs_with_its_arguments_environment_and_output() {
        if !Plan::available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let script = r#"echo "$GREETING $1 ${HOME:-no-home} $(ps -o sid= -p $$ | tr -d ' ') $$""#;
        let job = request("sh", &["-c", script, "sh", "world"], dir.path());
        let (status, failure) = run(&job);
        assert!(failure.is_none());
        assert!(matches!(status, nix::sys::wait::WaitStatus::Exited(_, 0)), "{status:?}");
        let out = std::fs::read_to_string(dir.path().join("out")).unwrap();
        let words: Vec<&str> = out.split_whitespace().collect();
        assert_eq!(&words[..3], ["hello", "world", "no-home"], "{out}");
        assert_eq!(words[3], words[4], "the job leads its own session: {out}");
        assert!(dir.path().join("checkpoint").is_dir());
    }

    /// A program that is nowhere, or may not be run, is reported with its
    /// errno, and the child exits 127.
    #[test]
    fn a_failed_exec_is_reported() {
        if !Plan::available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (status, failure) = run(&request("gpool-no-such-program", &[], dir.path()));
        assert!(
            matches!(status, nix::sys::wait::WaitStatus::Exited(_, 127)),
            "{status:?}"
        );
        assert_eq!(failure.unwrap().kind(), std::io::ErrorKind::NotFound);
        let not_executable = dir.path().join("data");
        std::fs::write(&not_executable, "x").unwrap();
        let (_, failure) = run(&request(not_executable.to_str().unwrap(), &[], dir.path()));
        assert_eq!(failure.unwrap().kind(), std::io::ErrorKind::PermissionDenied);
    }

    /// A gate that does not pass the job stops it before anything runs.
    #[test]
    fn a_closed_gate_runs_nothing() {
        if !Plan::available() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let marker = dir.path().join("ran");
        let job = request("touch", &[marker.to_str().unwrap()], dir.path());
        let plan = Plan::of(&job, &null()).unwrap();
        let err = clone(plan, None, &mut |_| false).err().unwrap();
        assert!(err.to_string().contains("could not be recorded"), "{err}");
        assert!(!marker.exists());
    }
}
