//! Empty checkpoint directories kept for the next jobs. Creating a
//! directory allocates a block on disk and removing it frees the block
//! again (with the `discard` mount option, a synchronous discard in the
//! launcher's one thread). A directory an attempt left empty is renamed
//! aside instead, and the next job's directory is renamed from there.

use super::*;

/// How many empty directories wait for jobs at most.
const KEPT: usize = 64;

/// The launcher's spare checkpoint directories, under `<checkpoints>/.spare`
/// (known from the first request; job directories are named by id, so the
/// name cannot be a job's).
#[derive(Default)]
pub(super) struct SpareDirs {
    dir: Option<PathBuf>,
    spares: Vec<Spare>,
    named: u64,
}

/// A spare, and whether what its last job left running was killed (the
/// job's cgroup swept) before it was set aside.
struct Spare {
    dir: PathBuf,
    swept: bool,
}

impl SpareDirs {
    /// Gives the job of `request` a spare as its checkpoint directory, if
    /// it has none and a spare is there (otherwise `prepare` creates one).
    pub(super) fn place(&mut self, request: &LaunchRequest) {
        self.learn(request);
        let target = &request.checkpoint_dir;
        if target.is_dir() {
            return;
        }
        while let Some(Spare { dir: spare, swept }) = self.spares.pop() {
            // Kept empty and this process's own, after its job's cgroup
            // was swept; where there was none, something the job left
            // running may have written to it since: still empty, or left.
            if (!swept && !is_empty(&spare)) || std::fs::rename(&spare, target).is_err() {
                continue;
            }
            let given = match &request.run_as {
                Some(user) => chown(target, user.uid, user.gid),
                None => Ok(()),
            };
            if given.is_err() {
                let _ = std::fs::remove_dir(target);
            }
            return;
        }
    }

    /// Keeps the checkpoint directory of `request` for a next job if the
    /// attempt left it empty (one a job wrote to stays for its next
    /// attempt); `false` where it is not kept, to be removed as before.
    pub(super) fn keep(&mut self, request: &LaunchRequest) -> bool {
        let dir = &request.checkpoint_dir;
        let Some(spares) = self.dir.as_ref().filter(|_| self.spares.len() < KEPT) else {
            return false;
        };
        // Taken from its user first (who can then add nothing to it),
        // then found empty before it is set aside; given back otherwise.
        let own = (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw());
        if let Some(user) = &request.run_as {
            if chown(dir, own.0, own.1).is_err() {
                return false;
            }
            if !is_empty(dir) {
                let _ = chown(dir, user.uid, user.gid);
                return false;
            }
        } else if !is_empty(dir) {
            return false;
        }
        self.named += 1;
        let spare = spares.join(format!("{}-{}", std::process::id(), self.named));
        if std::fs::rename(dir, &spare).is_err() {
            return false;
        }
        let swept = request.cgroup.is_some();
        self.spares.push(Spare { dir: spare, swept });
        true
    }

    /// Removes every spare (the launcher ends).
    pub(super) fn remove_all(&mut self) {
        for spare in self.spares.drain(..) {
            let _ = std::fs::remove_dir(spare.dir);
        }
    }

    /// Learns where spares go from the first request, and removes what
    /// an earlier launcher left there.
    fn learn(&mut self, request: &LaunchRequest) {
        if self.dir.is_some() {
            return;
        }
        let Some(parent) = request.checkpoint_dir.parent() else {
            return;
        };
        let dir = parent.join(".spare");
        if let Ok(left) = std::fs::read_dir(&dir) {
            for entry in left.flatten() {
                let _ = std::fs::remove_dir(entry.path());
            }
        }
        if std::fs::DirBuilder::new().recursive(true).create(&dir).is_ok() {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700));
            self.dir = Some(dir);
        }
    }
}

fn is_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_none())
}

fn chown(dir: &Path, uid: u32, gid: u32) -> nix::Result<()> {
    nix::unistd::chown(
        dir,
        Some(nix::unistd::Uid::from_raw(uid)),
        Some(nix::unistd::Gid::from_raw(gid)),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request_in(checkpoints: &Path, job: u64) -> LaunchRequest {
        let mut request: LaunchRequest = serde_json::from_value(serde_json::json!({
            "job_id": job, "epoch": 1, "program": "true", "args": [], "env": [],
            "exit_file": checkpoints.join(format!("{job}.exit")),
            "checkpoint_dir": checkpoints.join(job.to_string()),
        }))
        .unwrap();
        request.run_as = None;
        request
    }

    /// A temp dir's `checkpoints`, and no spares yet.
    fn checkpoints() -> (tempfile::TempDir, PathBuf, SpareDirs) {
        let root = tempfile::tempdir().unwrap();
        let checkpoints = root.path().join("checkpoints");
        std::fs::create_dir(&checkpoints).unwrap();
        (root, checkpoints, SpareDirs::default())
    }

    /// An empty directory is set aside and becomes the next job's; one a
    /// job wrote to stays where it is, for that job's next attempt.
    #[test]
    fn an_empty_dir_is_the_next_jobs_and_a_written_one_stays() {
        let (_root, checkpoints, mut spares) = checkpoints();
        let (first, second, third) = (
            request_in(&checkpoints, 1),
            request_in(&checkpoints, 2),
            request_in(&checkpoints, 3),
        );
        spares.place(&first);
        std::fs::create_dir(&first.checkpoint_dir).unwrap();
        assert!(spares.keep(&first));
        assert!(!first.checkpoint_dir.exists());
        spares.place(&second);
        assert!(second.checkpoint_dir.is_dir(), "the spare became job 2's");
        std::fs::write(second.checkpoint_dir.join("state"), b"step 7").unwrap();
        assert!(!spares.keep(&second));
        assert_eq!(std::fs::read(second.checkpoint_dir.join("state")).unwrap(), b"step 7");
        spares.place(&third);
        assert!(!third.checkpoint_dir.exists(), "no spare was left for job 3");
    }

    /// A spare something wrote into after it was set aside is no job's.
    #[test]
    fn a_spare_written_to_is_given_to_no_job() {
        let (_root, checkpoints, mut spares) = checkpoints();
        let (first, second) = (request_in(&checkpoints, 1), request_in(&checkpoints, 2));
        spares.place(&first);
        std::fs::create_dir(&first.checkpoint_dir).unwrap();
        assert!(spares.keep(&first));
        let spare = spares.spares[0].dir.clone();
        std::fs::write(spare.join("late"), b"x").unwrap();
        spares.place(&second);
        assert!(!second.checkpoint_dir.exists());
        assert!(spare.join("late").exists(), "left where it was");
    }
}
