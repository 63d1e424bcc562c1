//! The agent's own subtree on cgroup v2, where limits can be enforced.
//!
//! cgroup v2 hands a controller to a cgroup's children only from a parent
//! that holds no process itself ("no internal processes"). So the agent
//! lives in a leaf, `agent`, of the cgroup it owns (systemd's unit cgroup,
//! with `Delegate=yes` and `DelegateSubgroup=agent`, which starts it in
//! the leaf; or one made for it, see the README), and enables `cpuset`,
//! `cpu`, `memory` and `pids` for `gpool`, the parent of every attempt's
//! cgroup:
//!
//! ```text
//! <the agent's cgroup>/            subtree_control: +cpu +memory +pids …
//!   agent/                         the agent, its spawner, supervisors
//!   gpool/                         subtree_control: +cpu +memory +pids …
//!     <scope>-<job>.<epoch>/       memory.max, cpu.max, pids.max, BPF
//! ```
//!
//! Supervisors stay in `agent` and outlive an agent restart there; the
//! restarted agent joins them.

use std::path::{Path, PathBuf};

/// The controllers gpool enables for attempts, where the kernel offers
/// them (`cpuset` for the CPUs a placement chooses, the rest for limits).
const CONTROLLERS: [&str; 4] = ["cpuset", "cpu", "memory", "pids"];

/// The leaf the agent (and what it forks) moves into.
const AGENT_LEAF: &str = "agent";

/// What a cgroup v2 subtree lets the agent set on an attempt's cgroup:
/// whether each limit's file is there (its controller enabled).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct V2Limits {
    pub memory: bool,
    /// `memory.swap.max` (swap accounting on).
    pub swap: bool,
    pub cpu: bool,
    pub pids: bool,
}

/// Sets up `<home>/gpool` under the cgroup v2 mount `root` for attempts
/// (`own`: the agent's cgroup, relative; `home` is its parent when `own`
/// is already the leaf `agent`, as systemd's `DelegateSubgroup=agent` and
/// the README's recipe start it, else `own` itself). Returns the parent of
/// attempts' cgroups and, when controllers could not be enabled, why not
/// (the parent is still usable for `cgroup.kill` and device rules).
pub fn delegate(root: &Path, own: &Path) -> Result<(PathBuf, Result<(), String>), String> {
    let in_leaf = own.file_name().is_some_and(|name| name == AGENT_LEAF);
    let home = match own.parent() {
        Some(parent) if in_leaf => root.join(parent),
        _ => root.join(own),
    };
    let parent = home.join(super::PARENT);
    std::fs::create_dir_all(&parent).map_err(|err| format!("cannot create {}: {err}", parent.display()))?;
    let offered = read_words(&home.join("cgroup.controllers"));
    let wanted: Vec<&str> = CONTROLLERS
        .into_iter()
        .filter(|c| offered.iter().any(|o| o == c))
        .collect();
    let enabled = unit_root_refused(own, in_leaf)
        .and_then(|()| leave_for_leaf(root, &home, in_leaf))
        .and_then(|()| {
            // The root cgroup may hold processes and still hand controllers on.
            enable(&home, &wanted)?;
            enable(&parent, &wanted)
        });
    Ok((parent, enabled))
}

/// A systemd unit's own cgroup is not made a parent of controllers: a
/// systemd that starts the agent there (one older than 254, which has no
/// `DelegateSubgroup=`) could not start it again while jobs run, as no
/// process may join a cgroup that hands controllers on.
fn unit_root_refused(own: &Path, in_leaf: bool) -> Result<(), String> {
    let unit = own.file_name().and_then(|name| name.to_str()).unwrap_or_default();
    if !in_leaf && [".service", ".scope"].iter().any(|suffix| unit.ends_with(suffix)) {
        return Err(format!(
            "systemd started the agent in its unit's own cgroup ({unit}), not in a leaf `agent` of it: \
             give the unit Delegate=yes and DelegateSubgroup=agent (systemd 254 or later), as the shipped unit does"
        ));
    }
    Ok(())
}

/// Moves the calling process from `home` into its leaf `agent` unless it
/// is there (the root cgroup is exempt from the rule and keeps it). Fails,
/// naming them, when other processes are left in `home`: its controllers
/// could not be enabled for children then.
fn leave_for_leaf(root: &Path, home: &Path, in_leaf: bool) -> Result<(), String> {
    if home == root && !in_leaf {
        return Ok(());
    }
    let leaf = home.join(AGENT_LEAF);
    if !in_leaf {
        std::fs::create_dir_all(&leaf).map_err(|err| format!("cannot create {}: {err}", leaf.display()))?;
        std::fs::write(leaf.join("cgroup.procs"), b"0")
            .map_err(|err| format!("cannot move the agent into {}: {err}", leaf.display()))?;
    }
    let others = read_words(&home.join("cgroup.procs"));
    if !others.is_empty() {
        return Err(format!(
            "{} holds processes other than the agent's ({}): give the agent a cgroup of its own \
             (systemd: Delegate=yes and DelegateSubgroup=agent in its unit)",
            home.display(),
            others.join(" ")
        ));
    }
    Ok(())
}

/// Enables `controllers` for the children of `dir`, one at a time (one
/// the kernel refuses leaves the others on).
fn enable(dir: &Path, controllers: &[&str]) -> Result<(), String> {
    let file = dir.join("cgroup.subtree_control");
    let mut refused = Vec::new();
    for controller in controllers {
        if let Err(err) = std::fs::write(&file, format!("+{controller}")) {
            refused.push(format!("{controller} ({err})"));
        }
    }
    if refused.is_empty() {
        Ok(())
    } else {
        Err(format!("{}: cannot enable {}", file.display(), refused.join(", ")))
    }
}

/// The limit files of the attempt cgroup `dir` and their values: those
/// `limits` asks for and the subtree has (`can`); no swap beyond the
/// memory limit unless `allow_swap`.
pub fn settings(dir: &Path, limits: super::Limits, can: V2Limits, allow_swap: bool) -> Vec<(PathBuf, String)> {
    let period = super::CPU_PERIOD_US;
    let cpu_max = |cpus: u32| format!("{} {period}", u64::from(cpus) * period);
    [
        (
            "memory.max",
            limits.mem_bytes.filter(|_| can.memory).map(|b| b.to_string()),
        ),
        (
            "memory.swap.max",
            limits.mem_bytes.filter(|_| can.swap && !allow_swap).map(|_| "0".into()),
        ),
        ("cpu.max", limits.cpus.filter(|_| can.cpu).map(cpu_max)),
        ("pids.max", limits.pids.filter(|_| can.pids).map(|max| max.to_string())),
    ]
    .into_iter()
    .filter_map(|(file, value)| Some((dir.join(file), value?)))
    .collect()
}

/// Which limit files a new cgroup under `parent` has, looked at in
/// `probe` (one made for the purpose).
pub fn limits_in(probe: &Path) -> V2Limits {
    V2Limits {
        memory: probe.join("memory.max").exists(),
        swap: probe.join("memory.swap.max").exists(),
        cpu: probe.join("cpu.max").exists(),
        pids: probe.join("pids.max").exists(),
    }
}

fn read_words(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod tests {
    /// On a directory tree shaped as cgroupfs (files only, no kernel):
    /// the controllers offered are asked for, in order, for both levels.
    #[test]
    fn the_offered_controllers_are_enabled_for_the_agents_subtree() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("cgroup.controllers"), "cpu io memory pids\n").unwrap();
        let (parent, enabled) = super::delegate(root.path(), std::path::Path::new("")).unwrap();
        assert_eq!(parent, root.path().join("gpool"));
        assert_eq!(enabled, Ok(()));
        // A plain file keeps the last write; cgroupfs would keep them all.
        let last = std::fs::read_to_string(root.path().join("gpool/cgroup.subtree_control")).unwrap();
        assert_eq!(last, "+pids");
    }

    /// An agent that shares its cgroup with other processes is told why
    /// its limits cannot be enabled, and who is in the way.
    #[test]
    fn other_processes_in_the_agents_cgroup_are_named() {
        let root = tempfile::tempdir().unwrap();
        let own = root.path().join("user.slice/user-1000.slice/shell");
        std::fs::create_dir_all(own.join("agent")).unwrap();
        std::fs::write(own.join("cgroup.controllers"), "memory pids\n").unwrap();
        std::fs::write(own.join("cgroup.procs"), "4242\n").unwrap();
        let (_, enabled) =
            super::delegate(root.path(), std::path::Path::new("user.slice/user-1000.slice/shell")).unwrap();
        let reason = enabled.unwrap_err();
        assert!(reason.contains("4242") && reason.contains("Delegate=yes"), "{reason}");
    }

    /// Started in the leaf `agent` (DelegateSubgroup=agent, the README's
    /// recipe), the agent's home is the leaf's parent; started in a systemd
    /// unit's own cgroup, it enables nothing there, and says why.
    #[test]
    fn the_leaf_agent_is_the_home_of_a_delegated_unit_and_a_unit_root_is_left_alone() {
        let root = tempfile::tempdir().unwrap();
        let unit = root.path().join("system.slice/gpool-agent.service");
        std::fs::create_dir_all(unit.join("agent")).unwrap();
        std::fs::write(unit.join("cgroup.controllers"), "memory\n").unwrap();
        std::fs::write(unit.join("cgroup.procs"), "").unwrap();
        let leaf = std::path::Path::new("system.slice/gpool-agent.service/agent");
        let (parent, enabled) = super::delegate(root.path(), leaf).unwrap();
        assert_eq!(parent, unit.join("gpool"));
        assert_eq!(enabled, Ok(()));
        let unit_root = std::path::Path::new("system.slice/gpool-agent.service");
        let (parent, enabled) = super::delegate(root.path(), unit_root).unwrap();
        assert_eq!(
            parent,
            unit.join("gpool"),
            "still a parent for cgroup.kill and device rules"
        );
        assert!(enabled.unwrap_err().contains("DelegateSubgroup=agent"));
    }
}
