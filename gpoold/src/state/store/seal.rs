//! Sealing: the oldest ended jobs and accounting records move from sled
//! to history files, a file at a time.

use super::*;

/// Moves the oldest ended jobs and accounting records from sled to sealed
/// files (`archive`), a file at a time, once sled holds a file's worth
/// more than it keeps (`SLED_KEEPS`). It removes from sled only records it
/// sealed that sled still holds unchanged (compare and swap), so it needs
/// no lock against the state task, which may write an ended job again.
#[derive(Clone)]
pub struct Sealer {
    pub(super) ended: EndedJobs,
    pub(super) attempts: Accounting,
    pub(super) per_file: usize,
}

impl Sealer {
    /// Seals what is due; returns how many ended jobs and accounting
    /// records left sled.
    pub fn seal_due(&self) -> Result<(usize, usize), Error> {
        let due = self.per_file + self.per_file.min(SLED_KEEPS);
        let mut moved = (0, 0);
        // A round that moved nothing (every record written again meanwhile)
        // waits for the next call.
        while self.ended.by_time.iter().keys().take(due).count() == due {
            match self.seal_jobs()? {
                0 => break,
                n => moved.0 += n,
            }
        }
        while self.attempts.tree.iter().keys().take(due).count() == due {
            match self.seal_attempts()? {
                0 => break,
                n => moved.1 += n,
            }
        }
        Ok(moved)
    }

    /// The `per_file` jobs that ended first, each with its environment,
    /// read from sled one at a time as the file is written.
    pub(super) fn seal_jobs(&self) -> Result<usize, Error> {
        let ended = &self.ended;
        let mut oldest: Vec<(u64, u64, sled::IVec)> = Vec::with_capacity(self.per_file);
        for key in ended.by_time.iter().keys().take(self.per_file) {
            let key = key?;
            let (at, id) = split_time_key(time_key_bytes("ended_by_time", &key)?);
            oldest.push((id, at, key));
        }
        // Ended twice (it ran again): the later end is the one in `ended`.
        oldest.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
        oldest.dedup_by_key(|(id, _, _)| *id);
        let mut gone = Vec::new();
        let records = oldest.iter().filter_map(|(id, _, key)| {
            let id = id.to_be_bytes();
            let record = (|| {
                let Some(value) = ended.jobs.get(id)? else {
                    // Its record went past retention meanwhile, or was
                    // sealed under a later end (`key` is a stale index).
                    gone.push(key.clone());
                    return Ok(None);
                };
                // The time of its record, not of an index entry an end
                // before it left.
                let job: Job = decode("ended", &id, &value)?;
                let at = job.state.ended_at().map_or(0, |at| at.0);
                // The file holds the environment itself: the set may go
                // once no record in sled refers to it. (The record keeps
                // its header, which nothing reads in a file.)
                let extra = ended.record_env(&id, &value)?;
                Ok(Some(Record {
                    key: id.to_vec(),
                    at,
                    value: value.to_vec(),
                    extra,
                }))
            })();
            record.transpose()
        });
        let file = ended.files.seal(records)?;
        for key in gone {
            ended.by_time.compare_and_swap(&key, Some(&[]), None::<&[u8]>)?.ok();
        }
        match file {
            Some(file) => self.remove_sealed_jobs(&file),
            None => Ok(0),
        }
    }

    /// Removes the jobs sealed in `file` from sled, with their index
    /// entries, where sled still holds the same record; returns
    /// how many. The index entry goes first and comes back if the record
    /// was written again meanwhile (the state task writes both at once), so
    /// a record left in sled always has its entry.
    pub(super) fn remove_sealed_jobs(&self, file: &Arc<Segment>) -> Result<usize, Error> {
        let ended = &self.ended;
        let mut n_removed = 0;
        for record in file.records_from(&[]) {
            let record = record?;
            let id = sealed_job_id(file, &record.key)?;
            let index_key = time_key(Timestamp(record.at), id.0);
            let unindexed = ended
                .by_time
                .compare_and_swap(index_key, Some(&[]), None::<&[u8]>)?
                .is_ok();
            let removed = ended
                .jobs
                .compare_and_swap(&record.key, Some(&record.value), None::<&[u8]>)?
                .is_ok();
            if !removed {
                if unindexed {
                    ended.by_time.insert(index_key, &[])?;
                }
                continue;
            }
            n_removed += 1;
        }
        Ok(n_removed)
    }

    /// The `per_file` accounting records of the attempts that ended first,
    /// read from sled as the file is written.
    pub(super) fn seal_attempts(&self) -> Result<usize, Error> {
        let records = self.attempts.tree.iter().take(self.per_file).map(|entry| {
            let (key, value) = entry?;
            let (at, _) = split_time_key(time_key_bytes("attempts", &key)?);
            Ok(Record {
                key: key.to_vec(),
                at: at as i64,
                value: value.to_vec(),
                extra: None,
            })
        });
        match self.attempts.files.seal(records)? {
            Some(file) => self.remove_sealed_attempts(&file),
            None => Ok(0),
        }
    }

    pub(super) fn remove_sealed_attempts(&self, file: &Arc<Segment>) -> Result<usize, Error> {
        let mut n_removed = 0;
        for record in file.records_from(&[]) {
            let record = record?;
            let swapped = self
                .attempts
                .tree
                .compare_and_swap(&record.key, Some(&record.value), None::<&[u8]>)?;
            n_removed += usize::from(swapped.is_ok());
        }
        Ok(n_removed)
    }

    /// A crash may have cut the last seal of each kind short after its
    /// file was written: its records leave sled now.
    pub(super) fn finish_interrupted_seals(&self) -> Result<(), Error> {
        if let Some(file) = self.ended.files.newest() {
            let n = self.remove_sealed_jobs(&file)?;
            if n > 0 {
                tracing::warn!("{n} ended jobs sealed in {} before a crash left sled now", file.name());
            }
        }
        if let Some(file) = self.attempts.files.newest() {
            let n = self.remove_sealed_attempts(&file)?;
            if n > 0 {
                tracing::warn!(
                    "{n} accounting records sealed in {} before a crash left sled now",
                    file.name()
                );
            }
        }
        Ok(())
    }
}

/// The id a job's key in history file `file` names.
pub(super) fn sealed_job_id(file: &Segment, key: &[u8]) -> Result<JobId, Error> {
    <[u8; 8]>::try_from(key)
        .map(|key| JobId(u64::from_be_bytes(key)))
        .map_err(|_| Error::CorruptHistory {
            file: file.name(),
            reason: format!("a job's key of {} bytes, expected 8", key.len()),
        })
}

/// A 16-byte `time_key` read from `tree`.
pub(super) fn time_key_bytes(tree: &'static str, key: &[u8]) -> Result<[u8; 16], Error> {
    <[u8; 16]>::try_from(key).map_err(|_| Error::CorruptRecord {
        tree,
        key: key_text(key),
        reason: format!("{} bytes, expected 16", key.len()),
    })
}

/// A record from sled, as the merge with history files takes it.
pub(super) fn sled_record(entry: sled::Result<(sled::IVec, sled::IVec)>) -> Result<Record, Error> {
    let (key, value) = entry?;
    Ok(Record {
        key: key.to_vec(),
        at: 0,
        value: value.to_vec(),
        extra: None,
    })
}
