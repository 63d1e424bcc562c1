//! The spool's disk: records that must land when it is full, a watch on
//! its free space, and the pruning of old job output.
//!
//! A job that fills the spool must not take its neighbours down with it.
//! The lease, the exit slots and the journal are written where space is
//! already theirs: the lease and an exit record overwrite a file in place
//! (no new block), and the journal appends into space reserved ahead of
//! its end. What still cannot be written is retried until it lands, and
//! the node drains itself while space is short.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// Writes `bytes` over the start of `path` and cuts it there: a file that
/// already held at least as much needs no new block, so this works on a
/// full filesystem where replacing the file would not. A file no longer
/// than `bytes` is not cut (a truncation costs the filesystem a walk of
/// the file's blocks).
pub fn write_in_place(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    let longer = file.metadata()?.len() > bytes.len() as u64;
    file.write_all_at(bytes, 0)?;
    if longer {
        file.set_len(bytes.len() as u64)?;
    }
    Ok(())
}

/// Reserves space for `len` bytes from `offset` without changing the
/// file's size, so appends up to there need no new block. Filesystems
/// without fallocate reserve nothing (and say so, once, through the error).
pub fn reserve(file: &std::fs::File, offset: u64, len: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    nix::fcntl::fallocate(
        file.as_raw_fd(),
        nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
        offset as i64,
        len as i64,
    )
    .map_err(std::io::Error::from)
}

/// Bytes free to unprivileged writers on the filesystem of `dir`.
pub fn free_bytes(dir: &Path) -> std::io::Result<u64> {
    let stat = nix::sys::statvfs::statvfs(dir).map_err(std::io::Error::from)?;
    Ok(stat.blocks_available() as u64 * stat.fragment_size() as u64)
}

/// Whether the spool has room, with hysteresis: short once free space
/// falls under `min_free`, fine again only once it is back over twice
/// that, so a node does not flap between drained and not.
#[derive(Debug)]
pub struct SpaceWatch {
    dir: PathBuf,
    min_free: u64,
    short: bool,
}

impl SpaceWatch {
    pub fn new(dir: PathBuf, min_free: u64) -> SpaceWatch {
        SpaceWatch {
            dir,
            min_free,
            short: false,
        }
    }

    /// Why the spool is short of space (empty while it is not), read now.
    pub fn check(&mut self) -> String {
        match free_bytes(&self.dir) {
            Ok(free) => {
                self.short = short_of_space(self.short, free, self.min_free);
                if self.short {
                    format!(
                        "spool {} has {} free, under min_spool_free {}",
                        self.dir.display(),
                        human_bytes(free),
                        human_bytes(self.min_free)
                    )
                } else {
                    String::new()
                }
            }
            // A spool that cannot be looked at is not a full one.
            Err(err) => {
                tracing::warn!("cannot read the free space of {}: {err}", self.dir.display());
                String::new()
            }
        }
    }
}

impl SpaceWatch {
    /// The free space the watch wants back once short: twice `min_free`.
    pub fn room_wanted(&self) -> u64 {
        self.min_free.saturating_mul(2)
    }
}

/// Frees room in a full spool: removes the output files of ended jobs (not
/// in `live`) in `jobs_dir`, least recently written first, until the
/// filesystem has `wanted` bytes free or none is left. A job that filled
/// the spool and was cancelled so frees its own output (oldest first: the
/// newest, which their owners most likely still read, go last), instead of
/// keeping the node drained until `keep_job_files` or an admin. Returns
/// how many files it removed.
pub fn free_up(jobs_dir: &Path, live: &std::collections::BTreeSet<u64>, wanted: u64) -> usize {
    let Ok(entries) = std::fs::read_dir(jobs_dir) else {
        return 0;
    };
    let mut ended: Vec<(SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|entry| {
            let job = entry
                .file_name()
                .to_str()
                .and_then(|name| name.split('.').next()?.parse::<u64>().ok());
            job.is_some_and(|job| !live.contains(&job))
        })
        .filter_map(|entry| Some((entry.metadata().ok()?.modified().ok()?, entry.path())))
        .collect();
    ended.sort();
    let mut removed = 0;
    for (_, path) in ended {
        if free_bytes(jobs_dir).is_ok_and(|free| free >= wanted) {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// The watch's rule: short under `min_free`, and until back over twice it.
pub fn short_of_space(was_short: bool, free: u64, min_free: u64) -> bool {
    if was_short {
        free < min_free.saturating_mul(2)
    } else {
        free < min_free
    }
}

pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// Removes the files in `jobs_dir` (`<job>.<attempt>.<suffix>`) last
/// written more than `keep` ago, except those of jobs in `live`. Returns
/// how many it removed.
pub fn prune(jobs_dir: &Path, keep: Duration, live: &std::collections::BTreeSet<u64>) -> usize {
    let Ok(entries) = std::fs::read_dir(jobs_dir) else {
        return 0;
    };
    let now = SystemTime::now();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(job) = name
            .to_str()
            .and_then(|name| name.split('.').next())
            .and_then(|id| id.parse::<u64>().ok())
        else {
            continue;
        };
        if live.contains(&job) {
            continue;
        }
        let old = entry
            .metadata()
            .and_then(|meta| meta.modified())
            .ok()
            .and_then(|modified| now.duration_since(modified).ok())
            .is_some_and(|age| age > keep);
        if old && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Ended jobs' files go oldest first until the room wanted is there;
    /// live jobs' files stay.
    #[test]
    fn a_full_spool_frees_ended_jobs_output_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, age_secs: u64| {
            let path = dir.path().join(name);
            std::fs::write(&path, b"output").unwrap();
            let at = SystemTime::now() - Duration::from_secs(age_secs);
            std::fs::File::options()
                .write(true)
                .open(&path)
                .unwrap()
                .set_modified(at)
                .unwrap();
        };
        write("1.1.out", 300);
        write("2.1.out", 200);
        write("3.1.out", 100);
        let live = [3].into();
        // More room than any disk has: every ended job's file goes.
        assert_eq!(free_up(dir.path(), &live, u64::MAX), 2);
        assert!(dir.path().join("3.1.out").exists(), "a live job keeps its output");
        write("4.1.out", 50);
        assert_eq!(free_up(dir.path(), &live, 0), 0, "room enough: nothing goes");
    }

    #[test]
    fn in_place_writes_replace_the_whole_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("record");
        write_in_place(&path, b"a long first record\n").unwrap();
        write_in_place(&path, b"short\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "short\n");
        write_in_place(&path, b"a longer record than the last\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "a longer record than the last\n"
        );
    }

    #[test]
    fn pruning_spares_live_jobs_and_new_files() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["1.1.out", "2.1.out", "3.1.err", "notes"] {
            std::fs::write(dir.path().join(name), "x").unwrap();
        }
        let live = [2].into_iter().collect();
        // Nothing is old yet.
        assert_eq!(prune(dir.path(), Duration::from_secs(3600), &live), 0);
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(prune(dir.path(), Duration::from_millis(1), &live), 2);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["2.1.out", "notes"]);
    }

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(3 << 20), "3.0 MiB");
        assert_eq!(human_bytes(10 << 30), "10.0 GiB");
    }

    proptest! {
        /// Short under the minimum, fine only over twice it: between the
        /// two, the watch keeps what it said last.
        #[test]
        fn the_watch_does_not_flap(min_free in 1u64..1 << 40, readings in proptest::collection::vec(0u64..1 << 42, 1..50)) {
            let mut short = false;
            for free in readings {
                let next = short_of_space(short, free, min_free);
                if free < min_free { prop_assert!(next); }
                if free >= min_free * 2 { prop_assert!(!next); }
                if (min_free..min_free * 2).contains(&free) { prop_assert_eq!(next, short); }
                short = next;
            }
        }
    }
}
