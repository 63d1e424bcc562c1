//! A cgroup v2 node, for real: Debian's own kernel booted under qemu in
//! cgroup v2 mode, with the real gpoold, gpool-agent and gpool inside it
//! (vm/scenario.sh), one VM for the whole group. Each test reads its
//! behaviour's findings from the VM's console.
//!
//! Needs qemu-system-x86, linux-image-amd64, busybox-static and cpio
//! (`.ci/run` installs them and sets `GPOOL_E2E_REQUIRE=vm`, so that a
//! machine where the VM cannot run fails instead of skipping).

use crate::harness::process::binary;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

/// The longest the VM may take, boot to power-off.
const VM_TIMEOUT: Duration = Duration::from_secs(600);

/// What the VM printed: each `GPOOL-VM key value` line's values by key,
/// and the whole console for failures.
struct Findings {
    values: BTreeMap<String, Vec<String>>,
    console: String,
}

impl Findings {
    fn all(&self, key: &str) -> &[String] {
        self.values.get(key).map_or(&[], Vec::as_slice)
    }

    fn one(&self, key: &str) -> &str {
        self.all(key).first().map_or("", String::as_str)
    }

    /// Fails with the console when `ok` is false.
    fn check(&self, ok: bool, what: &str) {
        assert!(ok, "{what}\n---- the VM's console ----\n{}", self.console);
    }
}

/// The VM's findings, booted once for every test of this file; `None`
/// where the VM cannot run here (and `GPOOL_E2E_REQUIRE` does not name
/// `vm`).
fn findings() -> Option<&'static Findings> {
    static FINDINGS: OnceLock<Result<Findings, String>> = OnceLock::new();
    let required = std::env::var("GPOOL_E2E_REQUIRE").is_ok_and(|list| list.split(',').any(|t| t.trim() == "vm"));
    match FINDINGS.get_or_init(boot) {
        Ok(findings) => Some(findings),
        Err(reason) if required => panic!("the cgroup v2 VM cannot run here, and GPOOL_E2E_REQUIRE needs it: {reason}"),
        Err(reason) => {
            eprintln!("skipped: the cgroup v2 VM cannot run here: {reason}");
            None
        }
    }
}

/// Builds the initramfs, boots it and reads the console.
fn boot() -> Result<Findings, String> {
    let kernel = newest_kernel()?;
    let qemu = which("qemu-system-x86_64").ok_or("qemu-system-x86_64 is not installed (qemu-system-x86)")?;
    let busybox = ["/bin/busybox", "/usr/bin/busybox"]
        .into_iter()
        .map(PathBuf::from)
        .find(|path| path.is_file())
        .ok_or("busybox is not installed (busybox-static)")?;
    which("cpio").ok_or("cpio is not installed")?;
    let dir = tempfile::tempdir().map_err(|err| err.to_string())?;
    let root = dir.path().join("root");
    let initramfs = dir.path().join("initramfs.cpio");
    stage(&root, &busybox)?;
    let packed = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "cd {} && find . | cpio -o -H newc --quiet > {}",
            root.display(),
            initramfs.display()
        ))
        .status()
        .map_err(|err| format!("cpio: {err}"))?;
    if !packed.success() {
        return Err("cpio failed to pack the initramfs".into());
    }
    let console = dir.path().join("console.log");
    let mut vm = Command::new(qemu)
        .args(["-accel", "tcg", "-cpu", "max", "-m", "2048", "-smp", "2"])
        .args(["-nographic", "-no-reboot", "-kernel"])
        .arg(&kernel)
        .arg("-initrd")
        .arg(&initramfs)
        .args(["-append", "console=ttyS0 quiet panic=-1"])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&console).map_err(|err| err.to_string())?)
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|err| format!("cannot start qemu: {err}"))?;
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = vm.try_wait().map_err(|err| err.to_string())? {
            break Some(status);
        }
        if started.elapsed() > VM_TIMEOUT {
            let _ = vm.kill();
            let _ = vm.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let console = String::from_utf8_lossy(&std::fs::read(&console).unwrap_or_default()).replace('\r', "");
    eprintln!("the cgroup v2 VM ran {:.1} s", started.elapsed().as_secs_f64());
    let mut values: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in console.lines() {
        if let Some(rest) = line.trim_start().strip_prefix("GPOOL-VM ") {
            let (key, value) = rest.split_once(' ').unwrap_or((rest, ""));
            values
                .entry(key.to_string())
                .or_default()
                .push(value.trim().to_string());
        }
    }
    match (status, values.contains_key("done")) {
        (_, true) => Ok(Findings { values, console }),
        (None, false) => panic!("the VM ran past {VM_TIMEOUT:?}\n---- console ----\n{console}"),
        (Some(status), false) if values.contains_key("kernel") => {
            panic!("the VM's scenario stopped short ({status})\n---- console ----\n{console}")
        }
        // qemu that cannot boot this kernel here at all: a missing piece of the host.
        (Some(status), false) => Err(format!(
            "qemu exited {status} before the scenario began: {}",
            tail(&console)
        )),
    }
}

/// The VM's root: busybox, the workspace's binaries (debug info
/// stripped) with the libraries they load, and the scenario as `/init`.
fn stage(root: &Path, busybox: &Path) -> Result<(), String> {
    let bin = root.join("bin");
    for dir in ["bin", "etc", "proc", "sys", "dev", "tmp", "root"] {
        std::fs::create_dir_all(root.join(dir)).map_err(|err| err.to_string())?;
    }
    std::fs::copy(busybox, bin.join("busybox")).map_err(|err| err.to_string())?;
    let mut libraries = std::collections::BTreeSet::new();
    for name in ["gpoold", "gpool-agent", "gpool", "gpool-supervise"] {
        let built = binary(name);
        let stripped = Command::new("objcopy")
            .arg("--strip-debug")
            .arg(&built)
            .arg(bin.join(name))
            .status()
            .map_err(|err| format!("objcopy: {err}"))?;
        if !stripped.success() {
            std::fs::copy(&built, bin.join(name)).map_err(|err| err.to_string())?;
        }
        libraries.extend(shared_libraries(&built)?);
    }
    for library in libraries {
        let target = root.join(library.strip_prefix("/").unwrap_or(&library));
        std::fs::create_dir_all(target.parent().unwrap_or(root)).map_err(|err| err.to_string())?;
        std::fs::copy(&library, &target).map_err(|err| format!("{}: {err}", library.display()))?;
    }
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/vm/scenario.sh");
    std::fs::copy(scenario, root.join("init")).map_err(|err| err.to_string())?;
    let etc = root.join("etc");
    let files = [
        (
            "passwd",
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
        ),
        ("group", "root:x:0:\nnogroup:x:65534:\n"),
        ("hosts", "127.0.0.1 localhost\n"),
    ];
    for (name, text) in files {
        std::fs::write(etc.join(name), text).map_err(|err| err.to_string())?;
    }
    Ok(())
}

/// The shared libraries `binary` loads (its interpreter included), as ldd
/// resolves them.
fn shared_libraries(binary: &Path) -> Result<Vec<PathBuf>, String> {
    let out = Command::new("ldd")
        .arg(binary)
        .output()
        .map_err(|err| format!("ldd: {err}"))?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let path = line.split("=>").last()?.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

fn newest_kernel() -> Result<PathBuf, String> {
    let mut kernels: Vec<PathBuf> = std::fs::read_dir("/boot")
        .map_err(|err| format!("/boot: {err}"))?
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .collect();
    kernels.sort();
    kernels
        .pop()
        .ok_or_else(|| "no kernel in /boot (linux-image-amd64)".to_string())
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|path| path.is_file())
    })
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// Behaviour 1: A job that allocates past `--mem 256M` ends out_of_memory (its
/// cgroup's `memory.events` says so), and its neighbour runs on unharmed.
#[test]
fn a_job_past_its_memory_ends_out_of_memory_and_its_neighbour_runs_on() {
    let Some(vm) = findings() else { return };
    vm.check(
        vm.one("oom-state") == "out_of_memory",
        "the job past --mem 256M ends out_of_memory",
    );
    vm.check(
        !vm.all("oom-out").iter().any(|line| line.contains("survived")),
        "the job past its memory did not go on",
    );
    vm.check(vm.one("neighbour-state") == "completed", "the neighbour completes");
    vm.check(
        vm.all("neighbour-out").iter().any(|l| l == "neighbour-ok"),
        "the neighbour's output",
    );
}

/// Behaviour 2: Four busy threads under `--cpus-per-gpu 1` get about one CPU of the
/// VM's two, measured from the attempt's own cpu.stat.
#[test]
fn four_busy_threads_under_one_cpu_get_about_one_cpu() {
    let Some(vm) = findings() else { return };
    vm.check(vm.one("cpu-state") == "completed", "the CPU job completes");
    let stat = |name: &str| -> u64 {
        vm.all("cpu-out")
            .iter()
            .find_map(|line| line.strip_prefix(&format!("cpu.stat {name} "))?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no cpu.stat {name}\n{}", vm.console))
    };
    vm.check(
        vm.all("cpu-out").iter().any(|l| l == "cpu.max 100000 100000"),
        "cpu.max is one CPU",
    );
    let used = stat("usage_usec");
    eprintln!(
        "4 busy threads for 6 s under 1 CPU: {:.2} CPU-s used, {} of {} periods throttled",
        used as f64 / 1e6,
        stat("nr_throttled"),
        stat("nr_periods")
    );
    // Unlimited, the 4 threads would take both CPUs: 12 CPU-s.
    vm.check(used <= 7_800_000, "at most about 1 CPU over the 6 s");
    vm.check(stat("nr_throttled") > 0, "the quota throttled the job");
}

/// Behaviour 3: A fork bomb stops at agent.toml's `max_pids` (64), and the node
/// stays up: the next job runs.
#[test]
fn a_fork_bomb_stops_at_max_pids_and_the_node_stays_up() {
    let Some(vm) = findings() else { return };
    let out = vm.all("bomb-out");
    let pids = out
        .iter()
        .find_map(|line| line.strip_prefix("pids "))
        .unwrap_or_default();
    let refused = out
        .iter()
        .find_map(|line| line.strip_prefix("events max "))
        .unwrap_or_default();
    eprintln!("fork bomb: {pids} processes; {refused} forks refused");
    let (current, max) = pids.split_once(" of ").unwrap_or_default();
    vm.check(max == "64", "pids.max is agent.toml's max_pids");
    vm.check(
        current.parse::<u64>().is_ok_and(|n| (32..=64).contains(&n)),
        "the bomb holds at most 64 processes",
    );
    vm.check(
        refused.parse::<u64>().is_ok_and(|n| n > 0),
        "forks past the limit were refused",
    );
    vm.check(
        vm.one("bomb-state") == "completed",
        "the bomb's job ends as it chose to",
    );
    vm.check(vm.one("after-bomb-state") == "completed", "the next job runs");
    vm.check(
        vm.all("after-bomb-out").iter().any(|l| l == "node-still-up"),
        "its output",
    );
}

/// Behaviour 4: An attempt cannot open a `/dev/nvidiaN` it was not given (the BPF
/// device filter says EPERM; its own, with no driver behind it, ENXIO).
#[test]
fn an_attempt_cannot_open_a_gpu_it_was_not_given() {
    let Some(vm) = findings() else { return };
    vm.check(vm.one("devices-state") == "completed", "the device job completes");
    let out = vm.all("devices-out");
    let refused = out.iter().filter(|l| l.ends_with("Operation not permitted")).count();
    let own = out.iter().filter(|l| l.ends_with("No such device or address")).count();
    vm.check(refused == 7 && own == 1, "7 other GPUs refused, its own one reached");
    vm.check(
        out.iter().any(|l| l == "oom_score_adj 0"),
        "the job takes the ordinary OOM place",
    );
    vm.check(
        vm.one("agent-oom-score-adj") == "-900",
        "the agent stands below jobs in the OOM order",
    );
    let node = vm.all("supervise-oom");
    vm.check(
        node.iter().any(|l| l == "keeper -900") && node.iter().any(|l| l == "launcher 0"),
        "the launcher's keeper below jobs, the launcher (where plain jobs are born) at 0",
    );
}

/// Behaviour 5: After `kill -9` of the agent, the restarted agent re-adopts the
/// running attempt, its limits intact.
#[test]
fn a_restarted_agent_readopts_a_running_attempt_with_its_limits() {
    let Some(vm) = findings() else { return };
    vm.check(
        vm.one("agent-killed") == "running",
        "the job ran when the agent was killed",
    );
    vm.check(vm.one("kept-state") == "completed", "the re-adopted job completes");
    vm.check(
        vm.all("kept-out").iter().any(|l| l == "memory.max 100663296 swap 0"),
        "its memory.max (96M) and no swap held through the restart",
    );
}

/// Behaviour 6: The agent in a cgroup of its own owns its subtree: it reports every
/// limit as enforced, sits in its leaf, and each job is born in its cgroup
/// (no fallback to a move after the fork).
#[test]
fn the_agent_owns_its_subtree_and_jobs_are_born_in_their_cgroups() {
    let Some(vm) = findings() else { return };
    eprintln!("kernel {}; controllers: {}", vm.one("kernel"), vm.one("controllers"));
    vm.check(
        vm.one("enforces") == "cpu,devices,memory,pids",
        "the node enforces every limit",
    );
    vm.check(
        vm.one("agent-cgroup") == "/gpool-agent/agent",
        "the agent moved into its leaf",
    );
    vm.check(vm.one("clone3-fallbacks") == "0", "every job was born in its cgroup");
}
