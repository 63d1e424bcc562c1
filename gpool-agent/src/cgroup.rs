//! Each attempt in a cgroup of its own, where the host offers one: its
//! processes stay countable however they detach (setsid, double fork), so
//! the end of the attempt ends them all; and with the cgroup v1 `devices`
//! controller (or, on cgroup v2, a BPF device filter: `device_filter`),
//! the attempt may open only its own GPUs' device nodes.
//!
//! The agent decides (`Isolation::detect`, `rules_for`); the supervisor
//! acts (`enter`, `sweep`), as root, before the job drops to its user.
//!
//! On cgroup v2 the agent owns a delegated subtree (`v2`), so an attempt's
//! cgroup also carries its limits (memory.max with no swap, cpu.max,
//! pids.max), and the job is born in it (`clone3` with
//! `CLONE_INTO_CGROUP`, in the supervisor). `Isolation::enforced` says
//! which limits a node enforces, for its `gpool.enforces` label.
//!
//! Cost (cgroup v1): moving a process into a cgroup waits for an RCU grace period
//! (9 to 15 ms on cgroup v1 here), once per attempt; so the job joins the
//! `devices` hierarchy only (and `memory`/`cpu` only for limits), the sweep
//! kills without freezing, and the spawner keeps the next supervisor
//! waiting in a cgroup of its own (`Warm`): the attempt's cgroup is that
//! one renamed and the job is born in it, so the wait is off the path from
//! launch to start (the supervisor leaves it after recording the end).

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

mod v2;
use std::time::{Duration, Instant};
pub use v2::V2Limits;

/// Character major of NVIDIA's GPU device nodes (`/dev/nvidiaN` is 195:N;
/// `nvidiactl` is 195:255 and stays open to every job).
pub const NVIDIA_MAJOR: u32 = 195;
const PARENT: &str = "gpool";

/// What this host lets the agent do, found once at start. Each attempt's
/// cgroup goes under `<the agent's own cgroup>/gpool` of each hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Isolation {
    /// cgroup v1: the `devices` hierarchy (GPU device rules; its
    /// cgroup.procs lists the attempt's processes), and `memory` and `cpu`
    /// where mounted (for --mem and --cpus-per-gpu).
    V1 {
        devices: PathBuf,
        memory: Option<PathBuf>,
        cpu: Option<PathBuf>,
        pids: Option<PathBuf>,
    },
    /// cgroup v2: `cgroup.kill` ends every process, and a BPF program
    /// attached to the attempt's cgroup keeps it off the other GPUs where
    /// the kernel lets the agent load one (`device_filter` says why not
    /// otherwise). Limits are the controllers' files of the agent's
    /// delegated subtree (`v2`); `delegated` says why there are none.
    V2 {
        parent: PathBuf,
        device_filter: Result<(), String>,
        limits: V2Limits,
        delegated: Result<(), String>,
        /// Swap beyond memory.max (agent.toml `allow_swap`).
        allow_swap: bool,
    },
    /// No cgroup the agent may use; the reason says why.
    None(String),
}

/// What an attempt may use, for its cgroup.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub mem_bytes: Option<u64>,
    /// CPUs, as a quota of this many CPU-seconds per second.
    pub cpus: Option<u32>,
    /// Processes and threads (pids.max).
    pub pids: Option<u64>,
}

/// The CPU quota period, microseconds.
pub(crate) const CPU_PERIOD_US: u64 = 100_000;

impl Isolation {
    /// Looks at the cgroup mounts under `root` (/sys/fs/cgroup) and this
    /// process's own cgroups (`own`, the text of /proc/self/cgroup), and
    /// makes sure the agent can create cgroups there.
    pub fn detect(root: &Path, own: &str, allow_swap: bool) -> Isolation {
        if !nix::unistd::geteuid().is_root() {
            return Isolation::None("the agent does not run as root".into());
        }
        let parent_in = |controller: &str, probe: &str| -> Option<PathBuf> {
            let mount = root.join(controller);
            mount.join(probe).exists().then_some(())?;
            let parent = mount.join(own_path(own, controller)?).join(PARENT);
            std::fs::create_dir_all(&parent).ok().map(|()| parent)
        };
        if root.join("devices").join("devices.allow").exists() {
            return match parent_in("devices", "devices.allow") {
                Some(devices) => Isolation::V1 {
                    devices,
                    memory: parent_in("memory", "memory.limit_in_bytes"),
                    cpu: parent_in("cpu", "cpu.cfs_quota_us"),
                    pids: parent_in("pids", "cgroup.procs"),
                },
                None => Isolation::None(format!(
                    "cannot create a cgroup under {}",
                    root.join("devices").display()
                )),
            };
        }
        if root.join("cgroup.controllers").exists() {
            let Some(own) = own_path(own, "") else {
                return Isolation::None("the agent's own cgroup v2 path is not in /proc/self/cgroup".into());
            };
            return match v2::delegate(root, &own) {
                Ok((parent, delegated)) => {
                    let (device_filter, limits) = probe(&parent);
                    Isolation::V2 {
                        parent,
                        device_filter,
                        limits,
                        delegated,
                        allow_swap,
                    }
                }
                Err(reason) => Isolation::None(reason),
            };
        }
        Isolation::None(format!(
            "no cgroup v1 devices controller or cgroup v2 under {}",
            root.display()
        ))
    }

    /// Removes the empty attempt cgroups of the agent of `scope` (named
    /// `<scope>-<job>.<epoch>`, as `rules_for` names them) that no attempt
    /// in `live` holds: what a launcher killed before its jobs' ends left
    /// behind. One with a process in it stays (rmdir refuses it). How
    /// many directories were removed.
    pub fn remove_left_behind(&self, scope: &str, live: &std::collections::HashSet<(u64, u64)>) -> usize {
        let parents: Vec<&Path> = match self {
            Isolation::V1 {
                devices,
                memory,
                cpu,
                pids,
            } => [Some(devices), memory.as_ref(), cpu.as_ref(), pids.as_ref()]
                .into_iter()
                .flatten()
                .map(PathBuf::as_path)
                .collect(),
            Isolation::V2 { parent, .. } => vec![parent.as_path()],
            Isolation::None(_) => return 0,
        };
        let prefix = format!("{scope}-");
        let mut removed = 0;
        for parent in parents {
            let Ok(entries) = std::fs::read_dir(parent) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let attempt = name.to_str().and_then(|name| {
                    let (job, epoch) = name.strip_prefix(&prefix)?.split_once('.')?;
                    Some((job.parse::<u64>().ok()?, epoch.parse::<u64>().ok()?))
                });
                if attempt.is_some_and(|attempt| !live.contains(&attempt)) && std::fs::remove_dir(entry.path()).is_ok()
                {
                    removed += 1;
                }
            }
        }
        removed
    }

    /// What `gpool nodes` shows as the node's `isolation` label.
    pub fn label(&self) -> &'static str {
        match self {
            Isolation::V1 { .. } => "cgroup-devices",
            Isolation::V2 {
                device_filter: Ok(()), ..
            } => "cgroup-devices",
            Isolation::V2 { .. } => "cgroup-no-devices",
            Isolation::None(_) => "none",
        }
    }

    /// The limits this node enforces on an attempt, for the node's
    /// `gpool.enforces` label: a sorted subset of cpu, devices, memory,
    /// pids.
    pub fn enforced(&self) -> Vec<&'static str> {
        let (cpu, devices, memory, pids) = match self {
            Isolation::V1 { memory, cpu, pids, .. } => (cpu.is_some(), true, memory.is_some(), pids.is_some()),
            Isolation::V2 {
                device_filter, limits, ..
            } => (limits.cpu, device_filter.is_ok(), limits.memory, limits.pids),
            Isolation::None(_) => (false, false, false, false),
        };
        [("cpu", cpu), ("devices", devices), ("memory", memory), ("pids", pids)]
            .into_iter()
            .filter_map(|(name, on)| on.then_some(name))
            .collect()
    }

    /// The cgroup of one attempt: its directories, the device rules that
    /// keep it off the node's other GPUs, and its limits (those the host
    /// can enforce). `scope` tells apart agents sharing a host (tests, dev
    /// mode): one per spool dir.
    pub fn rules_for(
        &self,
        scope: &str,
        (job_id, epoch): (u64, u64),
        (own_gpus, node_gpus): (&[u32], &[u32]),
        limits: Limits,
    ) -> Option<AttemptCgroup> {
        let name = format!("{scope}-{job_id}.{epoch}");
        let other_gpus = node_gpus.iter().copied().filter(|gpu| !own_gpus.contains(gpu));
        match self {
            Isolation::V1 {
                devices,
                memory,
                cpu,
                pids,
            } => {
                let mut cgroup = AttemptCgroup {
                    dirs: vec![devices.join(&name)],
                    settings: other_gpus
                        .map(|gpu| {
                            (
                                devices.join(&name).join("devices.deny"),
                                format!("c {NVIDIA_MAJOR}:{gpu} rwm"),
                            )
                        })
                        .collect(),
                    deny_devices: Vec::new(),
                    unified: false,
                    made: false,
                };
                if let (Some(memory), Some(bytes)) = (memory, limits.mem_bytes) {
                    cgroup.dirs.push(memory.join(&name));
                    cgroup
                        .settings
                        .push((memory.join(&name).join("memory.limit_in_bytes"), bytes.to_string()));
                }
                if let (Some(cpu), Some(cpus)) = (cpu, limits.cpus) {
                    cgroup.dirs.push(cpu.join(&name));
                    cgroup.settings.extend([
                        (cpu.join(&name).join("cpu.cfs_period_us"), CPU_PERIOD_US.to_string()),
                        (
                            cpu.join(&name).join("cpu.cfs_quota_us"),
                            (u64::from(cpus) * CPU_PERIOD_US).to_string(),
                        ),
                    ]);
                }
                if let (Some(pids), Some(max)) = (pids, limits.pids) {
                    cgroup.dirs.push(pids.join(&name));
                    cgroup
                        .settings
                        .push((pids.join(&name).join("pids.max"), max.to_string()));
                }
                Some(cgroup)
            }
            Isolation::V2 {
                parent,
                device_filter,
                limits: can,
                allow_swap,
                ..
            } => {
                let dir = parent.join(&name);
                let settings = v2::settings(&dir, limits, *can, *allow_swap);
                Some(AttemptCgroup {
                    dirs: vec![dir],
                    settings,
                    deny_devices: match device_filter {
                        Ok(()) => other_gpus.map(|gpu| (NVIDIA_MAJOR, gpu)).collect(),
                        Err(_) => Vec::new(),
                    },
                    unified: true,
                    made: false,
                })
            }
            Isolation::None(_) => None,
        }
    }
}

/// Whether a BPF device filter can be attached under `parent`, and which
/// limits an attempt's cgroup there has: tried once, at start, on a
/// cgroup made for the purpose.
fn probe(parent: &Path) -> (Result<(), String>, V2Limits) {
    let probe = parent.join(format!("probe-{}", std::process::id()));
    if let Err(err) = std::fs::create_dir_all(&probe) {
        return (Err(format!("{}: {err}", probe.display())), V2Limits::default());
    }
    let attached = crate::device_filter::attach(&probe, &[(NVIDIA_MAJOR, 0)]);
    let limits = v2::limits_in(&probe);
    let _ = std::fs::remove_dir(&probe);
    (attached, limits)
}

/// This process's path in the hierarchy of `controller` ("" for cgroup
/// v2), relative, from the text of /proc/self/cgroup.
fn own_path(own: &str, controller: &str) -> Option<PathBuf> {
    own.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let matches = if controller.is_empty() {
            controllers.is_empty()
        } else {
            controllers.split(',').any(|c| c == controller)
        };
        matches.then(|| PathBuf::from(path.trim_start_matches('/')))
    })
}

/// A short name for the agent of `spool_dir` (unique among the agents of
/// one host, which never share a spool dir).
pub fn scope_of(spool_dir: &Path) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    spool_dir.hash(&mut hasher);
    format!("{:08x}", hasher.finish() as u32)
}

/// One attempt's cgroup, as the supervisor gets it in the launch request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptCgroup {
    /// One directory per hierarchy; the job joins each. The first one's
    /// cgroup.procs lists all of the attempt's processes.
    pub dirs: Vec<PathBuf>,
    /// Files to write once the directories exist: device rules, limits.
    pub settings: Vec<(PathBuf, String)>,
    /// Character devices (major, minor) the first directory's BPF device
    /// filter refuses (cgroup v2; empty: no filter).
    #[serde(default)]
    pub deny_devices: Vec<(u32, u32)>,
    /// cgroup v2: one directory, which the job is born in (`clone3`).
    #[serde(default)]
    pub unified: bool,
    /// Its directories exist with its settings already (an earlier
    /// attempt's, renamed): `create` has nothing to do.
    #[serde(default)]
    pub made: bool,
}

impl AttemptCgroup {
    /// Creates the directories and writes the device rules (the supervisor,
    /// as root, before the job starts).
    pub fn create(&self) -> Result<(), String> {
        if self.made {
            return Ok(());
        }
        for dir in &self.dirs {
            std::fs::create_dir_all(dir).map_err(|err| format!("cgroup {}: {err}", dir.display()))?;
        }
        // Settings of one file follow each other (a device rule per other
        // GPU): one open for each run of them, one write per setting, as
        // cgroupfs takes one rule per write.
        let mut open: Option<(&Path, std::fs::File)> = None;
        for (path, value) in &self.settings {
            let file = match open.take() {
                Some((open_path, file)) if open_path == path.as_path() => file,
                _ => std::fs::OpenOptions::new()
                    .write(true)
                    .open(path)
                    .map_err(|err| format!("{}: {err}", path.display()))?,
            };
            let mut writer = &file;
            std::io::Write::write_all(&mut writer, value.as_bytes())
                .map_err(|err| format!("{}: {err}", path.display()))?;
            open = Some((path, file));
        }
        if let (false, Some(dir)) = (self.deny_devices.is_empty(), self.dirs.first()) {
            crate::device_filter::attach(dir, &self.deny_devices)?;
        }
        Ok(())
    }

    /// Moves the calling process into every directory from the
    /// `first`th on (in the job's process, between fork and exec, still as
    /// root; the ones before it the job is born in).
    pub fn enter_from(&self, first: usize) -> std::io::Result<()> {
        for dir in self.dirs.iter().skip(first) {
            std::fs::write(dir.join("cgroup.procs"), b"0")?;
        }
        Ok(())
    }

    /// Ends every process still in the cgroup (what the job left behind,
    /// detached or not). Kills again while any remain (one that forks is
    /// caught at the next round); gives up after `patience`.
    pub fn sweep(&self, patience: Duration) {
        let deadline = Instant::now() + patience;
        let Some(dir) = self.dirs.first() else { return };
        let kill_file = dir.join("cgroup.kill");
        let own_pid = std::process::id() as i32;
        loop {
            // The supervisor, when it waited in it, is in it and not swept.
            let mut pids = read_pids(&dir.join("cgroup.procs"));
            let supervisor_in_it = pids.contains(&own_pid);
            pids.retain(|pid| *pid != own_pid);
            if pids.is_empty() || Instant::now() > deadline {
                return;
            }
            if kill_file.exists() && !supervisor_in_it {
                let _ = write(&kill_file, "1");
            } else {
                for pid in pids {
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The processes in it now.
    pub fn pids(&self) -> Vec<i32> {
        self.dirs
            .first()
            .map_or_else(Vec::new, |dir| read_pids(&dir.join("cgroup.procs")))
    }

    /// Whether the OOM killer of its memory limit killed a process of it:
    /// `oom_kill` in cgroup v1's memory.oom_control or v2's memory.events.
    /// Only a directory that has them is read: v2's one, and v1's in the
    /// memory hierarchy (the one a memory limit is set in).
    pub fn oom_killed(&self) -> bool {
        self.dirs.iter().any(|dir| {
            let file = if self.unified {
                "memory.events"
            } else if self.settings.iter().any(|(path, _)| {
                path.parent() == Some(dir.as_path())
                    && path
                        .file_name()
                        .is_some_and(|name| name.as_encoded_bytes().starts_with(b"memory."))
            }) {
                "memory.oom_control"
            } else {
                return false;
            };
            std::fs::read_to_string(dir.join(file)).is_ok_and(|text| oom_kills(&text) > 0)
        })
    }

    /// Removes the (empty) cgroup.
    pub fn remove(&self) {
        for dir in &self.dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
}

/// A supervisor's cgroup made ahead of its attempt, in the hierarchy whose
/// attempt directories are under `parent` (an attempt's first directory):
/// the supervisor waits in it, so that the attempt's job, forked there, is
/// in it from birth.
#[derive(Debug)]
pub struct Warm {
    dir: PathBuf,
}

impl Warm {
    /// Whether attempts under `parent` are made this way: cgroup v1
    /// renames a cgroup; on v2 the job is born in its cgroup by `clone3`
    /// instead, and its supervisor waits outside it.
    pub fn works_under(parent: &Path) -> bool {
        !parent.join("cgroup.controllers").exists()
    }

    /// Creates `<parent>/warm-<pid>` and moves the calling process into it.
    pub fn enter(parent: &Path) -> Result<Warm, String> {
        let warm = Warm {
            dir: parent.join(format!("{WARM_PREFIX}{}", std::process::id())),
        };
        std::fs::create_dir_all(&warm.dir).map_err(|err| format!("cgroup {}: {err}", warm.dir.display()))?;
        if let Err(err) = write(&warm.dir.join("cgroup.procs"), "0") {
            let _ = std::fs::remove_dir(&warm.dir);
            return Err(err);
        }
        Ok(warm)
    }

    /// Makes it `cgroup`'s first directory (a rename, so the calling
    /// process stays in it); `Err` gives it back when `cgroup` is under
    /// another parent or the rename fails.
    pub fn become_first_of(self, cgroup: &AttemptCgroup) -> Result<(), Warm> {
        match cgroup.dirs.first() {
            Some(first) if first.parent() == self.dir.parent() && std::fs::rename(&self.dir, first).is_ok() => Ok(()),
            _ => Err(self),
        }
    }

    /// Leaves it (back to the agent's own cgroup) and removes it.
    pub fn discard(self) {
        if let Some(dir) = leave(&self.dir) {
            let _ = std::fs::remove_dir(dir);
        }
    }

    /// Removes what supervisors killed while waiting left under `parent`.
    pub fn clean_up_after_the_dead(parent: &Path) {
        let Ok(entries) = std::fs::read_dir(parent) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|name| name.strip_prefix(WARM_PREFIX)) else {
                continue;
            };
            let alive = pid
                .parse::<i32>()
                .is_ok_and(|pid| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok());
            if !alive {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
    }
}

const WARM_PREFIX: &str = "warm-";

/// Moves the calling process out of the attempt directory `dir` (under
/// `<the agent's own cgroup>/gpool`) back to the agent's own cgroup, where
/// its spawner is, else to `gpool` itself. Returns `dir` when it left.
pub fn leave(dir: &Path) -> Option<&Path> {
    let parent = dir.parent()?;
    [parent.parent(), Some(parent)]
        .into_iter()
        .flatten()
        .any(|home| std::fs::write(home.join("cgroup.procs"), b"0").is_ok())
        .then_some(dir)
}

/// The `oom_kill N` count of a memory.oom_control or memory.events file.
fn oom_kills(text: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix("oom_kill "))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or(0)
}

fn read_pids(path: &Path) -> Vec<i32> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect()
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|err| format!("{}: {err}", path.display()))
}

#[cfg(test)]
mod tests;
