//! `<spool>/attempts.log`: the agent's record of the attempts it runs, so a
//! restarted agent re-adopts them, and of how attempts ended until gpoold
//! surely has it (a Register that carried it succeeded, or it was sent on a
//! live link long enough ago). One JSON line per change (started, ended,
//! reported), appended to a file kept open: starting a job costs a write,
//! not a new file. Opening the journal folds it into what is still live or
//! unreported and rewrites it with only those; so does growing past a few
//! times that.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

const FILE: &str = "attempts.log";
/// Rewrite once the journal holds this many lines more than live attempts.
const COMPACT_SLACK: usize = 4096;
/// Space reserved past the journal's end, so appends land on a full disk.
const RESERVE_BYTES: u64 = 1 << 20;
/// An end sent on a live link counts as delivered after this long (a link
/// that broke meanwhile re-registers, and Register carries it again).
const REPORTED_AFTER_MS: i64 = 10 * 60 * 1000;

/// One running attempt, as the journal keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub job_id: u64,
    pub epoch: u64,
    /// The pid of its supervisor, or of the job itself where the node's
    /// launcher forked it (`launcher`); either is also the session and
    /// group id. 0 while its launch is under way (the agent journals an
    /// attempt before it asks the launcher, and a restarted agent learns
    /// the pid from the attempt's exit slot: `supervise::launched`).
    pub pgid: i32,
    pub exit_file: PathBuf,
    /// Unix milliseconds when the time limit runs out.
    pub deadline_ms: Option<i64>,
    /// The launcher that forked the job, which records its end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launcher: Option<crate::supervise::Launcher>,
}

/// An attempt that ended, until gpoold surely knows.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndedRecord {
    pub job_id: u64,
    pub epoch: u64,
    /// The exit record's line (`code 0`, `signal 9`, `failed ...`).
    pub outcome: String,
    /// Unix milliseconds.
    pub at_ms: i64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Line {
    Started(AttemptRecord),
    Ended {
        job_id: u64,
        epoch: u64,
        #[serde(default)]
        outcome: Option<String>,
        #[serde(default)]
        at_ms: i64,
    },
    Reported {
        job_id: u64,
        epoch: u64,
    },
}

/// The open journal and the live attempts it describes.
pub struct Journal {
    path: PathBuf,
    file: std::fs::File,
    live: BTreeMap<u64, AttemptRecord>,
    ended: BTreeMap<u64, EndedRecord>,
    /// `ended`'s entries in the order they ended (time, job, epoch), so
    /// forgetting those sent long ago looks only at the oldest. An entry
    /// whose end was reported meanwhile, or replaced by a later attempt's,
    /// stays here until its time comes and is then passed over.
    by_age: VecDeque<(i64, u64, u64)>,
    lines: usize,
    /// The file's length, and how far space is reserved for it.
    len: u64,
    reserved_to: u64,
    /// A line could not be written: the file is behind what this holds,
    /// until a rewrite catches it up.
    behind: bool,
}

impl Journal {
    /// Reads the journal in `spool_dir` (a missing one is empty), rewrites it
    /// compacted, and returns it with the attempts it still lists.
    pub fn open(spool_dir: &Path) -> Result<Journal, String> {
        let path = spool_dir.join(FILE);
        let (live, ended) = match std::fs::read_to_string(&path) {
            Ok(text) => fold(&path, &text),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => (BTreeMap::new(), BTreeMap::new()),
            Err(err) => return Err(format!("{}: cannot read: {err}", path.display())),
        };
        let (file, len) = rewrite(&path, &live, &ended)?;
        let mut by_age: Vec<(i64, u64, u64)> = ended.values().map(|r| (r.at_ms, r.job_id, r.epoch)).collect();
        by_age.sort_unstable();
        let mut journal = Journal {
            path,
            file,
            lines: live.len() + ended.len(),
            live,
            ended,
            by_age: by_age.into(),
            len,
            reserved_to: len,
            behind: false,
        };
        journal.reserve();
        Ok(journal)
    }

    /// Reserves space past the end, so the next appends need no new block.
    fn reserve(&mut self) {
        match crate::spool::reserve(&self.file, self.len, RESERVE_BYTES) {
            Ok(()) => self.reserved_to = self.len + RESERVE_BYTES,
            Err(err) => tracing::debug!("{}: cannot reserve space: {err}", self.path.display()),
        }
    }

    /// Whether lines are missing from the file (a full disk): they are
    /// written with the next line, or by `catch_up`.
    pub fn is_behind(&self) -> bool {
        self.behind
    }

    /// Rewrites the file from what this holds, once a write failed.
    pub fn catch_up(&mut self) {
        if !self.behind {
            return;
        }
        match rewrite(&self.path, &self.live, &self.ended) {
            Ok((file, len)) => {
                tracing::info!("{}: rewritten in full", self.path.display());
                self.file = file;
                self.len = len;
                self.reserved_to = len;
                self.lines = self.live.len() + self.ended.len();
                self.behind = false;
                self.reserve();
            }
            Err(err) => tracing::debug!("{err}"),
        }
    }

    pub fn live(&self) -> &BTreeMap<u64, AttemptRecord> {
        &self.live
    }

    pub fn started(&mut self, record: AttemptRecord) {
        let line = Line::Started(record.clone());
        self.live.insert(record.job_id, record);
        self.append(&line);
    }

    /// Attempt `epoch` of `job_id`, journaled before its launch, was never
    /// launched (the spawner refused it): it is forgotten.
    pub fn abandoned(&mut self, job_id: u64, epoch: u64) {
        if self.live.get(&job_id).is_some_and(|r| r.epoch == epoch) {
            self.live.remove(&job_id);
            self.append(&Line::Ended {
                job_id,
                epoch,
                outcome: None,
                at_ms: 0,
            });
        }
    }

    /// Ends of attempts gpoold may not have yet.
    pub fn unreported(&self) -> Vec<EndedRecord> {
        self.ended.values().cloned().collect()
    }

    /// Attempt `epoch` of `job_id` ended with `outcome` at `now_ms`. Ends
    /// sent long enough ago on a live link are forgotten on the way.
    pub fn ended(&mut self, job_id: u64, epoch: u64, outcome: &str, now_ms: i64) {
        if self.live.get(&job_id).is_some_and(|r| r.epoch == epoch) {
            self.live.remove(&job_id);
        }
        let record = EndedRecord {
            job_id,
            epoch,
            outcome: outcome.to_string(),
            at_ms: now_ms,
        };
        let line = Line::Ended {
            job_id,
            epoch,
            outcome: Some(record.outcome.clone()),
            at_ms: now_ms,
        };
        self.ended.insert(job_id, record);
        self.append(&line);
        self.by_age.push_back((now_ms, job_id, epoch));
        let mut old = Vec::new();
        while let Some(&(at_ms, job_id, epoch)) = self.by_age.front() {
            if now_ms - at_ms <= REPORTED_AFTER_MS {
                break;
            }
            self.by_age.pop_front();
            old.push((job_id, epoch));
        }
        self.reported(&old);
    }

    /// gpoold has these ends (a Register that carried them succeeded).
    pub fn reported(&mut self, ends: &[(u64, u64)]) {
        for (job_id, epoch) in ends {
            if self.ended.get(job_id).is_some_and(|r| r.epoch == *epoch) {
                self.ended.remove(job_id);
                self.append(&Line::Reported {
                    job_id: *job_id,
                    epoch: *epoch,
                });
            }
        }
    }

    /// Writes `line`, a change this already holds.
    fn append(&mut self, line: &Line) {
        // A rewrite writes this line too: it is in `live` or `ended`.
        if self.behind {
            self.catch_up();
            return;
        }
        let kept = self.live.len() + self.ended.len();
        if self.lines > kept + COMPACT_SLACK {
            self.behind = true;
            self.catch_up();
            if !self.behind {
                return;
            }
            // No room for a rewrite: append into the reserved space.
            self.behind = false;
        }
        let mut bytes = serde_json::to_vec(line).unwrap_or_default();
        bytes.push(b'\n');
        if self.len + bytes.len() as u64 > self.reserved_to {
            self.reserve();
        }
        // One write per line, so a crash leaves at most a torn last line.
        match self.file.write_all(&bytes) {
            Ok(()) => {
                self.lines += 1;
                self.len += bytes.len() as u64;
            }
            Err(err) => {
                tracing::error!(
                    "{}: cannot append: {err}; kept in memory until it can be written",
                    self.path.display()
                );
                self.behind = true;
            }
        }
    }
}

type Folded = (BTreeMap<u64, AttemptRecord>, BTreeMap<u64, EndedRecord>);

/// The attempts still live, and the ends not yet reported, after every
/// line; a line that cannot be read (a torn last write) is skipped with a
/// warning.
fn fold(path: &Path, text: &str) -> Folded {
    let mut live = BTreeMap::new();
    let mut ended = BTreeMap::new();
    for (number, line) in text.lines().enumerate() {
        match serde_json::from_str::<Line>(line) {
            Ok(Line::Started(record)) => {
                live.insert(record.job_id, record);
            }
            Ok(Line::Ended {
                job_id,
                epoch,
                outcome,
                at_ms,
            }) => {
                if live.get(&job_id).is_some_and(|r: &AttemptRecord| r.epoch == epoch) {
                    live.remove(&job_id);
                }
                if let Some(outcome) = outcome {
                    let record = EndedRecord {
                        job_id,
                        epoch,
                        outcome,
                        at_ms,
                    };
                    ended.insert(job_id, record);
                }
            }
            Ok(Line::Reported { job_id, epoch }) => {
                if ended.get(&job_id).is_some_and(|r: &EndedRecord| r.epoch == epoch) {
                    ended.remove(&job_id);
                }
            }
            Err(err) => tracing::warn!("{}:{}: skipped: {err}", path.display(), number + 1),
        }
    }
    (live, ended)
}

/// Writes the live attempts to a new file that replaces the journal
/// (temp file, then rename) and returns it open for appending, with its
/// length.
fn rewrite(
    path: &Path,
    live: &BTreeMap<u64, AttemptRecord>,
    ended: &BTreeMap<u64, EndedRecord>,
) -> Result<(std::fs::File, u64), String> {
    let temp = path.with_extension("log.tmp");
    let mut text = Vec::new();
    let lines = ended
        .values()
        .map(|r| Line::Ended {
            job_id: r.job_id,
            epoch: r.epoch,
            outcome: Some(r.outcome.clone()),
            at_ms: r.at_ms,
        })
        .chain(live.values().map(|record| Line::Started(record.clone())));
    for line in lines {
        text.extend(serde_json::to_vec(&line).unwrap_or_default());
        text.push(b'\n');
    }
    // Only the agent reads it: it names every user's jobs and their files.
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&temp)
        .and_then(|mut file| {
            file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
            std::io::Write::write_all(&mut file, &text)
        });
    if let Err(err) = written.and_then(|()| std::fs::rename(&temp, path)) {
        let _ = std::fs::remove_file(&temp);
        return Err(format!("{}: cannot write: {err}", path.display()));
    }
    let file = std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|err| format!("{}: cannot open: {err}", path.display()))?;
    Ok((file, text.len() as u64))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(job_id: u64, epoch: u64) -> AttemptRecord {
        AttemptRecord {
            job_id,
            epoch,
            pgid: 1000 + job_id as i32,
            exit_file: PathBuf::from(format!("jobs/{job_id}.1.exit")),
            deadline_ms: Some(42),
            launcher: None,
        }
    }

    #[test]
    fn reopening_keeps_only_live_attempts() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path()).unwrap();
        journal.started(record(1, 1));
        journal.started(record(2, 5));
        journal.ended(1, 1, "code 0", 1000);
        journal.ended(2, 4, "code 1", 1000); // a stale epoch ends no live attempt
        journal.reported(&[(2, 4)]);
        drop(journal);
        let mut journal = Journal::open(dir.path()).unwrap();
        assert_eq!(journal.live().values().cloned().collect::<Vec<_>>(), vec![record(2, 5)]);
        // The end of job 1 is kept until a Register carries it.
        let unreported: Vec<(u64, u64, String)> = journal
            .unreported()
            .into_iter()
            .map(|r| (r.job_id, r.epoch, r.outcome))
            .collect();
        assert_eq!(unreported, vec![(1, 1, "code 0".to_string())]);
        let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert_eq!(text.lines().count(), 2, "reopening compacts: {text}");
        journal.reported(&[(1, 1)]);
        drop(journal);
        assert!(Journal::open(dir.path()).unwrap().unreported().is_empty());
    }

    #[test]
    fn a_torn_last_line_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path()).unwrap();
        journal.started(record(7, 2));
        drop(journal);
        let path = dir.path().join(FILE);
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push_str("{\"ended\":{\"job_id\":7,");
        std::fs::write(&path, text).unwrap();
        let journal = Journal::open(dir.path()).unwrap();
        assert_eq!(journal.live().get(&7), Some(&record(7, 2)));
    }

    #[test]
    fn it_compacts_when_it_grows() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path()).unwrap();
        for job_id in 0..(COMPACT_SLACK as u64) {
            journal.started(record(job_id, 1));
            journal.ended(job_id, 1, "code 0", 0);
            journal.reported(&[(job_id, 1)]);
        }
        journal.started(record(u64::MAX, 1));
        let lines = std::fs::read_to_string(dir.path().join(FILE)).unwrap().lines().count();
        // 3 x COMPACT_SLACK + 1 lines were appended in all.
        assert!(lines <= COMPACT_SLACK + 3, "{lines} lines after compaction");
        drop(journal);
        assert_eq!(Journal::open(dir.path()).unwrap().live().len(), 1);
    }

    #[test]
    fn ends_sent_long_ago_on_a_live_link_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path()).unwrap();
        journal.started(record(1, 1));
        journal.ended(1, 1, "code 0", 0);
        journal.started(record(2, 1));
        journal.ended(2, 1, "signal 9", REPORTED_AFTER_MS + 1);
        let left: Vec<u64> = journal.unreported().iter().map(|r| r.job_id).collect();
        assert_eq!(left, vec![2]);
    }

    #[test]
    fn a_reopened_journal_forgets_old_ends_oldest_first() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path()).unwrap();
        // Job 1 ends after job 2 in the file, but at an earlier time.
        journal.ended(2, 1, "code 0", 5);
        journal.ended(1, 1, "code 0", 1);
        // Reported through a Register: passed over when its time comes.
        journal.ended(3, 1, "code 0", 0);
        journal.reported(&[(3, 1)]);
        drop(journal);
        let mut journal = Journal::open(dir.path()).unwrap();
        journal.ended(4, 1, "code 1", REPORTED_AFTER_MS + 2);
        let left: Vec<u64> = journal.unreported().iter().map(|r| r.job_id).collect();
        assert_eq!(left, vec![2, 4]);
        journal.ended(5, 1, "code 1", REPORTED_AFTER_MS + 6);
        let left: Vec<u64> = journal.unreported().iter().map(|r| r.job_id).collect();
        assert_eq!(left, vec![4, 5]);
    }
}
