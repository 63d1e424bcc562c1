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

#[test]
fn kernels_before_5_5_fork() {
    assert!(kernel_at_least("6.1.0-18-amd64", (5, 5)));
    assert!(kernel_at_least("5.5.0", (5, 5)));
    assert!(kernel_at_least("5.15.0-91-generic", (5, 5)));
    assert!(!kernel_at_least("5.4.0-150-generic", (5, 5)));
    assert!(!kernel_at_least("4.18.0-513.el8.x86_64", (5, 5)));
    assert!(!kernel_at_least("garbage", (5, 5)));
}

/// A script without `#!` runs through /bin/sh, as `execvp` runs it.
#[test]
fn a_script_without_its_interpreter_line_runs_through_sh() {
    if !Plan::available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("plain-script");
    std::fs::write(&script, "echo \"ran with $1\"\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let (status, failure) = run(&request(script.to_str().unwrap(), &["its argument"], dir.path()));
    assert!(failure.is_none());
    assert!(matches!(status, nix::sys::wait::WaitStatus::Exited(_, 0)), "{status:?}");
    let out = std::fs::read_to_string(dir.path().join("out")).unwrap();
    assert_eq!(out, "ran with its argument\n");
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
