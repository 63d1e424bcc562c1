//! `<spool>/attempts.log`: the agent's record of the attempts it runs, so a
//! restarted agent re-adopts them. One JSON line per change (an attempt
//! started, an attempt ended), appended to a file kept open: starting a job
//! costs a write, not a new file. Opening the journal folds it into the set
//! of live attempts and rewrites it with only those; so does growing past
//! a few times the live set.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

const FILE: &str = "attempts.log";
/// Rewrite once the journal holds this many lines more than live attempts.
const COMPACT_SLACK: usize = 4096;

/// One running attempt, as the journal keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AttemptRecord {
    pub job_id: u64,
    pub epoch: u64,
    /// The supervisor's pid, which is also the session and group id.
    pub pgid: i32,
    pub exit_file: PathBuf,
    /// Unix milliseconds when the time limit runs out.
    pub deadline_ms: Option<i64>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Line {
    Started(AttemptRecord),
    Ended { job_id: u64, epoch: u64 },
}

/// The open journal and the live attempts it describes.
pub struct Journal {
    path: PathBuf,
    file: std::fs::File,
    live: BTreeMap<u64, AttemptRecord>,
    lines: usize,
}

impl Journal {
    /// Reads the journal in `spool_dir` (a missing one is empty), rewrites it
    /// compacted, and returns it with the attempts it still lists.
    pub fn open(spool_dir: &Path) -> Result<Journal, String> {
        let path = spool_dir.join(FILE);
        let live = match std::fs::read_to_string(&path) {
            Ok(text) => fold(&path, &text),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(err) => return Err(format!("{}: cannot read: {err}", path.display())),
        };
        let file = rewrite(&path, &live)?;
        Ok(Journal {
            path,
            file,
            lines: live.len(),
            live,
        })
    }

    pub fn live(&self) -> &BTreeMap<u64, AttemptRecord> {
        &self.live
    }

    pub fn started(&mut self, record: AttemptRecord) {
        self.append(&Line::Started(record.clone()));
        self.live.insert(record.job_id, record);
    }

    pub fn ended(&mut self, job_id: u64, epoch: u64) {
        if self.live.get(&job_id).is_some_and(|r| r.epoch == epoch) {
            self.live.remove(&job_id);
            self.append(&Line::Ended { job_id, epoch });
        }
    }

    fn append(&mut self, line: &Line) {
        if self.lines > self.live.len() + COMPACT_SLACK {
            match rewrite(&self.path, &self.live) {
                Ok(file) => {
                    self.file = file;
                    self.lines = self.live.len();
                }
                Err(err) => tracing::error!("{err}"),
            }
        }
        let mut bytes = serde_json::to_vec(line).unwrap_or_default();
        bytes.push(b'\n');
        // One write per line, so a crash leaves at most a torn last line.
        match self.file.write_all(&bytes) {
            Ok(()) => self.lines += 1,
            Err(err) => tracing::error!("{}: cannot append: {err}", self.path.display()),
        }
    }
}

/// The attempts still live after every line; a line that cannot be read
/// (a torn last write) is skipped with a warning.
fn fold(path: &Path, text: &str) -> BTreeMap<u64, AttemptRecord> {
    let mut live = BTreeMap::new();
    for (number, line) in text.lines().enumerate() {
        match serde_json::from_str::<Line>(line) {
            Ok(Line::Started(record)) => {
                live.insert(record.job_id, record);
            }
            Ok(Line::Ended { job_id, epoch }) => {
                if live.get(&job_id).is_some_and(|r: &AttemptRecord| r.epoch == epoch) {
                    live.remove(&job_id);
                }
            }
            Err(err) => tracing::warn!("{}:{}: skipped: {err}", path.display(), number + 1),
        }
    }
    live
}

/// Writes the live attempts to a new file that replaces the journal
/// (temp file, then rename) and returns it open for appending.
fn rewrite(path: &Path, live: &BTreeMap<u64, AttemptRecord>) -> Result<std::fs::File, String> {
    let temp = path.with_extension("log.tmp");
    let mut text = Vec::new();
    for record in live.values() {
        text.extend(serde_json::to_vec(&Line::Started(record.clone())).unwrap_or_default());
        text.push(b'\n');
    }
    std::fs::write(&temp, text)
        .and_then(|()| std::fs::rename(&temp, path))
        .map_err(|err| format!("{}: cannot write: {err}", path.display()))?;
    std::fs::OpenOptions::new()
        .append(true)
        .open(path)
        .map_err(|err| format!("{}: cannot open: {err}", path.display()))
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
        }
    }

    #[test]
    fn reopening_keeps_only_live_attempts() {
        let dir = tempfile::tempdir().unwrap();
        let mut journal = Journal::open(dir.path()).unwrap();
        journal.started(record(1, 1));
        journal.started(record(2, 5));
        journal.ended(1, 1);
        journal.ended(2, 4); // a stale epoch ends nothing
        drop(journal);
        let journal = Journal::open(dir.path()).unwrap();
        assert_eq!(journal.live().values().cloned().collect::<Vec<_>>(), vec![record(2, 5)]);
        let text = std::fs::read_to_string(dir.path().join(FILE)).unwrap();
        assert_eq!(text.lines().count(), 1, "reopening compacts: {text}");
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
            journal.ended(job_id, 1);
        }
        journal.started(record(u64::MAX, 1));
        let lines = std::fs::read_to_string(dir.path().join(FILE)).unwrap().lines().count();
        // 2 x COMPACT_SLACK + 1 lines were appended in all.
        assert!(lines <= COMPACT_SLACK + 2, "{lines} lines after compaction");
        drop(journal);
        assert_eq!(Journal::open(dir.path()).unwrap().live().len(), 1);
    }
}
