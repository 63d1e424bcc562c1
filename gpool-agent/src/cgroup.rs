//! Each attempt in a cgroup of its own, where the host offers one: its
//! processes stay countable however they detach (setsid, double fork), so
//! the end of the attempt ends them all; and with the cgroup v1 `devices`
//! controller, the attempt may open only its own GPUs' device nodes.
//!
//! The agent decides (`Isolation::detect`, `rules_for`); the supervisor
//! acts (`enter`, `sweep`), as root, before the job drops to its user.
//!
//! Cost: on cgroup v1, moving a process into a cgroup waits for an RCU
//! grace period (about 15 ms here), once per attempt; so the job joins the
//! `devices` hierarchy only, and the sweep kills without freezing.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Character major of NVIDIA's GPU device nodes (`/dev/nvidiaN` is 195:N;
/// `nvidiactl` is 195:255 and stays open to every job).
pub const NVIDIA_MAJOR: u32 = 195;
const PARENT: &str = "gpool";

/// What this host lets the agent do, found once at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Isolation {
    /// cgroup v1: the `devices` controller (GPU device rules; its
    /// cgroup.procs lists the attempt's processes), mounted under `root`.
    V1 { root: PathBuf },
    /// cgroup v2 at `root`: `cgroup.kill` ends every process; device rules
    /// would need a BPF program, which gpool does not load.
    V2 { root: PathBuf },
    /// No cgroup the agent may use; the reason says why.
    None(String),
}

impl Isolation {
    /// Looks at the cgroup mounts under `root` (/sys/fs/cgroup) and makes
    /// sure the agent can create cgroups there.
    pub fn detect(root: &Path) -> Isolation {
        if !nix::unistd::geteuid().is_root() {
            return Isolation::None("the agent does not run as root".into());
        }
        let (isolation, parents) = if root.join("devices").join("devices.allow").exists() {
            (
                Isolation::V1 {
                    root: root.to_path_buf(),
                },
                vec![root.join("devices").join(PARENT)],
            )
        } else if root.join("cgroup.controllers").exists() && root.join("cgroup.procs").exists() {
            (
                Isolation::V2 {
                    root: root.to_path_buf(),
                },
                vec![root.join(PARENT)],
            )
        } else {
            return Isolation::None(format!(
                "no cgroup v1 devices controller or cgroup v2 under {}",
                root.display()
            ));
        };
        for parent in parents {
            if let Err(err) = std::fs::create_dir_all(&parent) {
                return Isolation::None(format!("cannot create cgroup {}: {err}", parent.display()));
            }
        }
        isolation
    }

    /// What `gpool nodes` shows as the node's `isolation` label.
    pub fn label(&self) -> &'static str {
        match self {
            Isolation::V1 { .. } => "cgroup-devices",
            Isolation::V2 { .. } => "cgroup-no-devices",
            Isolation::None(_) => "none",
        }
    }

    /// The cgroup of one attempt: its directories, and the device rules
    /// that keep it off the node's other GPUs. `scope` tells apart agents
    /// sharing a host (tests, dev mode): one per spool dir.
    pub fn rules_for(
        &self,
        scope: &str,
        (job_id, epoch): (u64, u64),
        own_gpus: &[u32],
        node_gpus: &[u32],
    ) -> Option<AttemptCgroup> {
        let name = format!("{scope}-{job_id}.{epoch}");
        let (dirs, deny) = match self {
            Isolation::V1 { root } => (
                vec![root.join("devices").join(PARENT).join(&name)],
                node_gpus
                    .iter()
                    .filter(|gpu| !own_gpus.contains(gpu))
                    .map(|gpu| format!("c {NVIDIA_MAJOR}:{gpu} rwm"))
                    .collect(),
            ),
            Isolation::V2 { root } => (vec![root.join(PARENT).join(&name)], Vec::new()),
            Isolation::None(_) => return None,
        };
        Some(AttemptCgroup { dirs, deny })
    }
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
    /// One directory per hierarchy; the job joins each.
    pub dirs: Vec<PathBuf>,
    /// `devices.deny` lines (cgroup v1).
    pub deny: Vec<String>,
}

impl AttemptCgroup {
    /// Creates the directories and writes the device rules (the supervisor,
    /// as root, before the job starts).
    pub fn create(&self) -> Result<(), String> {
        for dir in &self.dirs {
            std::fs::create_dir_all(dir).map_err(|err| format!("cgroup {}: {err}", dir.display()))?;
            if dir.components().any(|c| c.as_os_str() == "devices") {
                for rule in &self.deny {
                    write(&dir.join("devices.deny"), rule)?;
                }
            }
        }
        Ok(())
    }

    /// Moves the calling process into every directory (in the job's
    /// process, between fork and exec, still as root).
    pub fn enter(&self) -> std::io::Result<()> {
        for dir in &self.dirs {
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
        loop {
            let pids = read_pids(&dir.join("cgroup.procs"));
            if pids.is_empty() || Instant::now() > deadline {
                return;
            }
            if kill_file.exists() {
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

    /// Removes the (empty) cgroup.
    pub fn remove(&self) {
        for dir in &self.dirs {
            let _ = std::fs::remove_dir(dir);
        }
    }
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
mod tests {
    use super::*;

    #[test]
    fn an_attempt_is_denied_the_other_gpus_of_its_node() {
        let v1 = Isolation::V1 {
            root: "/sys/fs/cgroup".into(),
        };
        let cgroup = v1.rules_for("a1", (7, 3), &[0, 2], &[0, 1, 2, 3]).unwrap();
        assert_eq!(cgroup.deny, ["c 195:1 rwm", "c 195:3 rwm"]);
        assert_eq!(cgroup.dirs, [PathBuf::from("/sys/fs/cgroup/devices/gpool/a1-7.3")]);
        let v2 = Isolation::V2 {
            root: "/sys/fs/cgroup".into(),
        };
        assert!(v2.rules_for("a1", (7, 3), &[0], &[0, 1]).unwrap().deny.is_empty());
        assert_eq!(
            Isolation::None("no".into()).rules_for("a1", (7, 3), &[0], &[0, 1]),
            None
        );
    }
}
