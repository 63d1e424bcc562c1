//! The job's command as a supervisor prepares it: its user, its cgroup,
//! its terminal or output files, its environment and its `-o/-e` files.

use super::*;
use std::process::{Command, Stdio};

/// The job's command: its user, output files and checkpoint directory.
/// It joins its cgroup's directories from the `first_to_enter`th on (it is
/// born in those before).
pub(super) fn prepare(
    request: &LaunchRequest,
    first_to_enter: usize,
) -> Result<(Command, Option<Interactive>), String> {
    make_checkpoint_dir(request)?;
    let mut command = Command::new(&request.program);
    // The `pre_exec` steps run between fork and exec in the order they are
    // registered here: cgroup entry, terminal, user switch, output files.
    join_cgroup(&mut command, request, first_to_enter)?;
    command.args(&request.args);
    let interactive = attach_io(&mut command, request)?;
    set_environment(&mut command, request)?;
    if let (Some(workdir), None) = (&request.workdir, &request.run_as) {
        command.current_dir(workdir);
    }
    check_output_dirs(request)?;
    let user_files = user_output_files(request)?;
    switch_user(&mut command, request);
    open_user_files(&mut command, request, user_files);
    Ok((command, interactive))
}

/// Gives `path` to the job's user, when it runs as one.
fn owned_by_user(request: &LaunchRequest, path: &Path) -> Result<(), String> {
    use nix::unistd::{Gid, Uid};
    match &request.run_as {
        Some(user) => nix::unistd::chown(path, Some(Uid::from_raw(user.uid)), Some(Gid::from_raw(user.gid)))
            .map_err(|err| format!("{}: cannot give it to {}: {err}", path.display(), user.name)),
        None => Ok(()),
    }
}

/// Creates the job's checkpoint directory (0700, its user's) if missing.
pub(super) fn make_checkpoint_dir(request: &LaunchRequest) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    // The job's files are its user's alone: 0700 and 0600, whatever the
    // umask (no other user reads them through the spool).
    if !request.checkpoint_dir.is_dir() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&request.checkpoint_dir)
            .map_err(|err| format!("{}: {err}", request.checkpoint_dir.display()))?;
        owned_by_user(request, &request.checkpoint_dir)?;
    }
    Ok(())
}

/// Opens a spool output file (0600, its user's), if there is one.
pub(super) fn open_output(request: &LaunchRequest, path: &Option<PathBuf>) -> Result<Option<std::fs::File>, String> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
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
    owned_by_user(request, path)?;
    Ok(Some(file))
}

/// A spool output file as a stdio, or null where there is none.
fn output(request: &LaunchRequest, path: &Option<PathBuf>) -> Result<Stdio, String> {
    Ok(open_output(request, path)?.map_or_else(Stdio::null, Stdio::from))
}

/// Creates the attempt's cgroup and registers the first `pre_exec` step:
/// entering it.
fn join_cgroup(command: &mut Command, request: &LaunchRequest, first_to_enter: usize) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    // SAFETY: runs in the forked child before exec; one write to procfs.
    // The agent and supervisors stand below jobs in the OOM order; the job
    // takes the ordinary place (raising the score needs no privilege).
    unsafe {
        command.pre_exec(|| {
            let _ = std::fs::write("/proc/self/oom_score_adj", b"0");
            Ok(())
        });
    }
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
    Ok(())
}

/// The job's stdin, stdout and stderr: its terminal (registering the
/// `pre_exec` step that takes it) or its output files.
fn attach_io(command: &mut Command, request: &LaunchRequest) -> Result<Option<Interactive>, String> {
    use std::os::unix::process::CommandExt;
    Ok(match &request.pty {
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
            Some((terminal, open_output(request, &request.stdout)?))
        }
        None => {
            command
                .stdin(Stdio::null())
                .stdout(output(request, &request.stdout)?)
                .stderr(output(request, &request.stderr)?);
            None
        }
    })
}

/// The job's environment: in a container's env file, or as the command's
/// only variables.
fn set_environment(command: &mut Command, request: &LaunchRequest) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
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
        let job_environ = job_environ(request)?;
        // SAFETY: runs in the child of this single-threaded process (or in
        // this process just before its exec): the job's variables, made
        // before the fork, become the environment the exec passes on, and
        // the exec searches the job's PATH. Nothing is allocated there.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(command, move || {
                job_environ.install();
                Ok(())
            });
        }
    }
    Ok(())
}

/// The job's own variables only: never this process's (the agent's
/// environment, its credentials included), and its account's where it
/// runs as a user (over any of the same name).
pub(super) fn job_environ(request: &LaunchRequest) -> Result<Environ, String> {
    let mut vars: Vec<(&str, &str)> = request
        .env
        .iter()
        .map(|(name, value)| (name.as_str(), value.as_str()))
        .collect();
    let account = request
        .run_as
        .as_ref()
        .map(|user| account_env(&user.name, &user.home, &user.shell))
        .unwrap_or_default();
    vars.retain(|(name, _)| !account.iter().any(|(own, _)| own == name));
    vars.extend(account.iter().map(|(name, value)| (name.as_str(), value.as_str())));
    Environ::of(&vars)
}

/// A job's environment as a C `environ` array, made before the fork (a
/// `Command`'s variables are a map, copied into such an array in the
/// child after the fork, at a cost per variable on every launch).
pub(super) struct Environ {
    vars: Vec<std::ffi::CString>,
    pointers: Vec<*const std::ffi::c_char>,
}

// SAFETY: the pointers point into `vars`' heap buffers, which `Environ`
// owns and never changes; they are read only in the forked child.
unsafe impl Send for Environ {}
unsafe impl Sync for Environ {}

extern "C" {
    static mut environ: *const *const std::ffi::c_char;
}

impl Environ {
    fn of(vars: &[(&str, &str)]) -> Result<Environ, String> {
        let vars = vars
            .iter()
            .map(|(name, value)| {
                let mut line = Vec::with_capacity(name.len() + value.len() + 2);
                line.extend_from_slice(name.as_bytes());
                line.push(b'=');
                line.extend_from_slice(value.as_bytes());
                std::ffi::CString::new(line).map_err(|_| format!("environment variable {name} holds a NUL byte"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut pointers: Vec<*const std::ffi::c_char> = vars.iter().map(|var| var.as_ptr()).collect();
        pointers.push(std::ptr::null());
        Ok(Environ { vars, pointers })
    }

    /// The array, ended by a null, for an exec.
    pub(super) fn as_ptr(&self) -> *const *const std::ffi::c_char {
        self.pointers.as_ptr()
    }

    /// Makes it this process's environment.
    ///
    /// # Safety
    /// Only in a single-threaded process about to exec (no other thread
    /// reads the environment).
    unsafe fn install(&self) {
        debug_assert_eq!(self.pointers.len(), self.vars.len() + 1);
        // SAFETY: as the caller promises; the array ends with a null.
        unsafe {
            environ = self.pointers.as_ptr();
        }
    }
}

/// Fails when the directory of a `-o/-e` file does not exist.
pub(super) fn check_output_dirs(request: &LaunchRequest) -> Result<(), String> {
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
    Ok(())
}

/// Registers the `pre_exec` step that switches to the job's user (and
/// enters its workdir as that user), with the account's variables.
fn switch_user(command: &mut Command, request: &LaunchRequest) {
    use nix::unistd::{Gid, Uid};
    use std::os::unix::process::CommandExt;
    // A container runtime stays this process's user; it sets the job's.
    if let Some(user) = request.run_as.as_ref().filter(|_| request.container_cleanup.is_none()) {
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
}

/// Registers the last `pre_exec` step: opening the `-o/-e` files as the
/// job's user, onto its stdout and stderr.
fn open_user_files(command: &mut Command, request: &LaunchRequest, user_files: Vec<(std::ffi::CString, i32)>) {
    use std::os::unix::process::CommandExt;
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
}

/// An interactive attempt's terminal, and the file its output goes to.
pub(super) type Interactive = (crate::terminal::Terminal, Option<std::fs::File>);

/// A failed start, naming the job's own output files (which its user
/// could not open, perhaps).
pub(super) fn with_output_files(request: &LaunchRequest, err: std::io::Error) -> String {
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
pub(super) fn user_output_files(request: &LaunchRequest) -> Result<Vec<(std::ffi::CString, i32)>, String> {
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
