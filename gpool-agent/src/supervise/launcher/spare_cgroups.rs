//! Attempts' cgroups kept for the next attempts. Making a cgroup (its
//! directories in each hierarchy, a device rule per other GPU, its limits,
//! a BPF device filter on v2) and removing it again cost the kernel more
//! than the job `true` itself. A cgroup its attempt left empty is renamed
//! aside instead, and the next attempt that asks for the same settings
//! (the same GPUs' device rules, the same limits) gets it by a rename.

use super::*;
use crate::cgroup::AttemptCgroup;

/// How many cgroups wait for attempts at most (a node's GPUs, each alone,
/// in pairs and whole, with room).
const KEPT: usize = 32;

/// The launcher's spare cgroups, each in its attempt's parents, named
/// `spare-<launcher pid>-<n>`.
#[derive(Default)]
pub(super) struct SpareCgroups {
    spares: Vec<(Settings, Vec<PathBuf>)>,
    named: u64,
    /// The parents whose spares of dead launchers were removed.
    cleaned: Vec<PathBuf>,
}

/// What makes two attempts' cgroups alike: their parents, and each
/// setting by its directory's place, file name and value.
#[derive(PartialEq, Eq)]
struct Settings {
    parents: Vec<PathBuf>,
    files: Vec<(usize, std::ffi::OsString, String)>,
    deny_devices: Vec<(u32, u32)>,
    unified: bool,
}

impl Settings {
    fn of(cgroup: &AttemptCgroup) -> Option<Settings> {
        let files = cgroup
            .settings
            .iter()
            .map(|(path, value)| {
                let at = cgroup
                    .dirs
                    .iter()
                    .position(|dir| path.parent() == Some(dir.as_path()))?;
                Some((at, path.file_name()?.to_os_string(), value.clone()))
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Settings {
            parents: cgroup
                .dirs
                .iter()
                .map(|dir| dir.parent().map(Path::to_path_buf))
                .collect::<Option<_>>()?,
            files,
            deny_devices: cgroup.deny_devices.clone(),
            unified: cgroup.unified,
        })
    }
}

const PREFIX: &str = "spare-";

impl SpareCgroups {
    /// Gives the attempt of `request` a spare cgroup of its settings, if
    /// one is kept (it is then `made`, and its job is born in or joins it
    /// as in one made anew).
    pub(super) fn place(&mut self, request: &mut LaunchRequest) {
        let Some(cgroup) = request.cgroup.as_mut() else { return };
        let Some(settings) = Settings::of(cgroup) else { return };
        self.clean_up_after_the_dead(&settings.parents);
        let Some(at) = self.spares.iter().position(|(kept, _)| *kept == settings) else {
            return;
        };
        let (_, spare) = self.spares.swap_remove(at);
        let renamed = spare
            .iter()
            .zip(&cgroup.dirs)
            .take_while(|(from, to)| std::fs::rename(from, to).is_ok())
            .count();
        if renamed == spare.len() {
            cgroup.made = true;
            return;
        }
        // Half renamed: neither is the attempt's.
        for dir in cgroup.dirs.iter().take(renamed).chain(spare.iter().skip(renamed)) {
            let _ = std::fs::remove_dir(dir);
        }
    }

    /// Keeps the cgroup of an attempt that ended, once nothing is left in
    /// it and no OOM kill is counted in it (a count a next attempt would
    /// read as its own); `false` where it is not kept, to be removed as
    /// before.
    pub(super) fn keep(&mut self, cgroup: &AttemptCgroup) -> bool {
        if self.spares.len() >= KEPT || !cgroup.pids().is_empty() || cgroup.oom_killed() {
            return false;
        }
        let Some(settings) = Settings::of(cgroup) else {
            return false;
        };
        self.named += 1;
        let name = format!("{PREFIX}{}-{}", std::process::id(), self.named);
        let mut spare = Vec::with_capacity(cgroup.dirs.len());
        for dir in &cgroup.dirs {
            let aside = dir.with_file_name(&name);
            if std::fs::rename(dir, &aside).is_err() {
                // What was set aside goes back, to be removed with the rest.
                for (back, dir) in spare.iter().zip(&cgroup.dirs) {
                    let _ = std::fs::rename(back, dir);
                }
                return false;
            }
            spare.push(aside);
        }
        self.spares.push((settings, spare));
        true
    }

    /// Removes every spare (the launcher ends).
    pub(super) fn remove_all(&mut self) {
        for (_, dirs) in self.spares.drain(..) {
            for dir in dirs {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }

    /// Removes the spares that launchers no longer running left under
    /// `parents` (once per parent).
    fn clean_up_after_the_dead(&mut self, parents: &[PathBuf]) {
        for parent in parents {
            if self.cleaned.contains(parent) {
                continue;
            }
            self.cleaned.push(parent.clone());
            let Ok(entries) = std::fs::read_dir(parent) else {
                continue;
            };
            for entry in entries.flatten() {
                let name = entry.file_name();
                let Some(pid) = name
                    .to_str()
                    .and_then(|name| name.strip_prefix(PREFIX))
                    .and_then(|rest| rest.split('-').next())
                    .and_then(|pid| pid.parse::<i32>().ok())
                else {
                    continue;
                };
                let alive = pid == std::process::id() as i32
                    || nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok();
                if !alive {
                    let _ = std::fs::remove_dir(entry.path());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Directories in place of a cgroup hierarchy: the renames and the
    /// matching are the same.
    fn cgroup_in(root: &Path, name: &str, gpu_denied: u32) -> AttemptCgroup {
        let dir = root.join("devices/gpool").join(name);
        AttemptCgroup {
            settings: vec![(dir.join("devices.deny"), format!("c 195:{gpu_denied} rwm"))],
            dirs: vec![dir],
            deny_devices: Vec::new(),
            unified: false,
            made: false,
        }
    }

    fn request_with(cgroup: AttemptCgroup) -> LaunchRequest {
        let mut request: LaunchRequest = serde_json::from_value(serde_json::json!({
            "job_id": 1, "epoch": 1, "program": "true", "args": [], "env": [],
            "exit_file": "/nonexistent/exit", "checkpoint_dir": "/nonexistent/checkpoint",
        }))
        .unwrap();
        request.cgroup = Some(cgroup);
        request
    }

    /// An ended attempt's cgroup becomes the next one's of the same
    /// settings (renamed, not made again), and no other's.
    #[test]
    fn a_cgroup_is_the_next_alike_attempts() {
        let root = tempfile::tempdir().unwrap();
        let first = cgroup_in(root.path(), "gpool-x-1-1", 3);
        std::fs::create_dir_all(&first.dirs[0]).unwrap();
        let mut spares = SpareCgroups::default();
        assert!(spares.keep(&first));
        assert!(!first.dirs[0].exists());
        let mut other = request_with(cgroup_in(root.path(), "gpool-x-2-1", 5));
        spares.place(&mut other);
        assert!(!other.cgroup.as_ref().unwrap().made, "other GPUs' rules are not these");
        let mut alike = request_with(cgroup_in(root.path(), "gpool-x-3-1", 3));
        spares.place(&mut alike);
        let cgroup = alike.cgroup.unwrap();
        assert!(cgroup.made);
        assert!(cgroup.dirs[0].is_dir());
        assert!(cgroup.create().is_ok(), "nothing left to make");
    }

    /// A cgroup that counts an OOM kill, or still holds a process, is not
    /// kept: the next attempt would read the kill as its own, or share
    /// its cgroup with what the last one left.
    #[test]
    fn a_cgroup_with_an_oom_kill_or_a_process_is_not_kept() {
        let root = tempfile::tempdir().unwrap();
        let mut limited = cgroup_in(root.path(), "gpool-x-1-1", 3);
        let memory = root.path().join("memory/gpool/gpool-x-1-1");
        limited.dirs.push(memory.clone());
        limited
            .settings
            .push((memory.join("memory.limit_in_bytes"), "33554432".into()));
        for dir in &limited.dirs {
            std::fs::create_dir_all(dir).unwrap();
        }
        std::fs::write(
            memory.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n",
        )
        .unwrap();
        let mut spares = SpareCgroups::default();
        assert!(!spares.keep(&limited));
        std::fs::write(
            memory.join("memory.oom_control"),
            "oom_kill_disable 0\nunder_oom 0\noom_kill 0\n",
        )
        .unwrap();
        std::fs::write(limited.dirs[0].join("cgroup.procs"), "4242\n").unwrap();
        assert!(!spares.keep(&limited));
        std::fs::write(limited.dirs[0].join("cgroup.procs"), "").unwrap();
        assert!(spares.keep(&limited), "neither: kept");
    }

    /// What dead launchers set aside is removed; a live one's is not.
    #[test]
    fn spares_of_dead_launchers_are_removed() {
        let root = tempfile::tempdir().unwrap();
        let parent = root.path().join("devices/gpool");
        let dead = parent.join(format!("{PREFIX}{}-1", i32::MAX));
        let live = parent.join(format!("{PREFIX}1-1"));
        std::fs::create_dir_all(&dead).unwrap();
        std::fs::create_dir_all(&live).unwrap();
        let mut request = request_with(cgroup_in(root.path(), "gpool-x-1-1", 3));
        SpareCgroups::default().place(&mut request);
        assert!(!dead.exists());
        assert!(live.exists(), "pid 1 runs");
    }
}
