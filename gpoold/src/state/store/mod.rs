//! The sled database: trees, record encoding, schema version, loading.
//!
//! Keys are big-endian so iteration follows id order. Values are a one-byte
//! record version followed by the record as JSON. Only the state task writes.
//!
//! Jobs that have not ended are in `jobs`, and are loaded at start; ended
//! jobs are in `ended` (with `ended_by_time` as the index retention walks),
//! and are read from disk when asked for, so history costs no memory.
//!
//! A batch of writes is one sled transaction, or, past `MAX_AT_ONCE`
//! records, a redo log file applied in parts (`Commit`, `redo`).
//!
//! Old ended jobs and accounting records move on to sealed files in
//! `history/` (`archive`), a file at a time (`Sealer`): sled's memory
//! grows with every record it ever held, the files' does not.

use super::archive::{Archive, Merged, Reader, Record, Segment};
use super::redo::{self, RedoWriter};
use crate::error::Error;
use gpool_core::accounting::AttemptRecord;
use gpool_core::array::task_ids;
use gpool_core::auth::token::TokenRecord;
use gpool_core::deps::DepTarget;
use gpool_core::model::{Job, Node};
use gpool_core::policy::Ledger;
use gpool_core::{JobId, Timestamp};
use serde::de::DeserializeOwned;
use serde::Serialize;
use sled::Transactional;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Schema of the whole database; a change migrates in `open`.
/// Version 2 moved ended jobs from `jobs` to `ended`; version 3 moved each
/// job's environment out of its record, to `envs`; version 4 moved a large
/// batch's redo log from the `redo` tree to a file (an older gpoold would
/// not see the file, so it must refuse the state dir); version 5 stores
/// each distinct environment once, in `env_sets`, and a reference to it in
/// `envs` (an older gpoold would not read the references); version 6
/// moves that reference into the job's record, and `envs` is left empty.
pub const SCHEMA_VERSION: u32 = 6;
const RECORD_VERSION: u8 = 1;
/// The first byte of a job's record since schema 6 (`encode_job`).
const JOB_RECORD: u8 = 2;
/// The environment set of a job without an environment.
const NO_ENV_SET: u64 = 0;
const META_SCHEMA: &[u8] = b"schema_version";
/// Present while the redo log file is to be applied (`Store::apply_redo_log`).
const META_REDO_LOG: &[u8] = b"redo_log_to_apply";
const META_NEXT_JOB_ID: &[u8] = b"next_job_id";
/// The reservations `gpool reservation create` made (gpoold.toml's are
/// not stored), as one record.
const META_RESERVATIONS: &[u8] = b"reservations";
const META_NEXT_EPOCH: &[u8] = b"next_epoch";

pub struct Store {
    db: sled::Db,
    /// Jobs that have not ended, by id.
    jobs: sled::Tree,
    /// Ended jobs, by id: their records no longer change.
    ended: sled::Tree,
    /// An empty value for each ended job, by end time and id
    /// (`time_key`): the ones past retention are one range.
    ended_by_time: sled::Tree,
    /// Each job's environment, by job id, before schema 6 (empty since:
    /// a job's record refers to its set, `envs.rs`).
    envs: sled::Tree,
    /// Each distinct environment once.
    env_sets: EnvSets,
    nodes: sled::Tree,
    meta: sled::Tree,
    /// Each team's usage ledger, by team name.
    usage: sled::Tree,
    /// User token records (keyed hashes, never tokens), by token id.
    tokens: sled::Tree,
    /// Accounting: one record per ended attempt, by end time and epoch
    /// (`attempt_key`); appended, never changed, removed past retention.
    attempts: sled::Tree,
    /// Where gpoold kept a batch's redo log before it was a file
    /// (`redo_path`); read at open, empty after.
    redo: sled::Tree,
    /// The redo log of a batch being written in parts (`Commit`); absent
    /// between batches.
    redo_path: std::path::PathBuf,
    /// Sealed files of ended jobs (each with its environment) and of
    /// accounting records.
    job_files: Arc<Archive>,
    attempt_files: Arc<Archive>,
    /// Records of each kind moved to one file, once sled holds
    /// `SLED_KEEPS` more (or twice as many, where that is fewer).
    per_file: usize,
}

/// Records in one history file, by default.
pub use gpool_config::RECORDS_PER_FILE;
/// The newest records of each kind that stay in sled at most. sled's
/// memory follows the most records it held at once (it keeps what it
/// freed), so it seals small: holding up to 8,192 ended jobs instead of
/// 5,120 cost gpoold about 3 MiB more for good.
const SLED_KEEPS: usize = 1024;

/// A damaged entry of the redo log.
fn corrupt_redo(key: &[u8], reason: String) -> Error {
    Error::CorruptRecord {
        tree: "redo",
        key: key_text(key),
        reason,
    }
}

/// How long opening the database waits for another holder's lock.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Opens the database, waiting up to `LOCK_WAIT` while another holds its
/// lock: sled lets go of it from a thread of its own a moment after the
/// last handle is dropped, and a gpoold started again at once may find its
/// predecessor's lock still held. A lock held longer (another gpoold on
/// this state dir) is refused with sled's own words.
fn open_when_unlocked(config: &sled::Config) -> sled::Result<sled::Db> {
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        match config.open() {
            // sled says so in words only.
            Err(sled::Error::Io(err))
                if err.to_string().starts_with("could not acquire lock") && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            opened => return opened,
        }
    }
}

/// What `Store::open` found on disk.
pub struct Loaded {
    /// The jobs that have not ended, and the ended ones they need: the
    /// targets of their dependencies, and the ended tasks of arrays that
    /// have not ended (which say which tasks are done).
    pub jobs: Vec<Job>,
    pub ended: EndedJobs,
    pub nodes: Vec<Node>,
    pub next_job_id: u64,
    pub next_epoch: u64,
    pub usage: BTreeMap<String, Ledger>,
    pub tokens: BTreeMap<u64, TokenRecord>,
    pub reservations: Vec<gpool_core::sched::reservations::Reservation>,
}

impl Store {
    pub fn open(dir: &Path) -> Result<(Store, Loaded), Error> {
        Store::open_sealing(dir, RECORDS_PER_FILE)
    }

    /// As `open`, sealing `per_file` records to a history file at a time.
    pub fn open_sealing(dir: &Path, per_file: usize) -> Result<(Store, Loaded), Error> {
        let history = dir.join("history");
        let config = sled::Config::new()
            .path(dir.join("db"))
            // Reads are served from memory; sled's cache only helps loading.
            .cache_capacity(1024 * 1024)
            // Only the flusher makes writes durable, so an acknowledgement
            // never leans on a background flush.
            .flush_every_ms(None);
        let db = open_when_unlocked(&config)?;
        let store = Store {
            jobs: db.open_tree("jobs")?,
            ended: db.open_tree("ended")?,
            ended_by_time: db.open_tree("ended_by_time")?,
            envs: db.open_tree("envs")?,
            env_sets: EnvSets::new(db.open_tree("env_sets")?),
            nodes: db.open_tree("nodes")?,
            meta: db.open_tree("meta")?,
            usage: db.open_tree("usage")?,
            tokens: db.open_tree("tokens")?,
            attempts: db.open_tree("attempts")?,
            redo: db.open_tree("redo")?,
            redo_path: dir.join("redo.log"),
            job_files: Arc::new(Archive::open(&history, "jobs")?),
            attempt_files: Arc::new(Archive::open(&history, "attempts")?),
            per_file: per_file.max(1),
            db,
        };
        // A tree later issues fill; opened now so the layout is fixed from v1.
        store.db.open_tree("events")?;
        store.check_schema()?;
        let loaded = store.load()?;
        Ok((store, loaded))
    }

    /// Refuses a newer schema; finishes a batch a crash cut short, in the
    /// schema it was written in; then migrates.
    fn check_schema(&self) -> Result<(), Error> {
        let found = match self.meta.get(META_SCHEMA)? {
            None => None,
            Some(raw) => Some(u32::from_be_bytes(raw.as_ref().try_into().map_err(|_| {
                Error::CorruptRecord {
                    tree: "meta",
                    key: "schema_version".into(),
                    reason: format!("{} bytes, expected 4", raw.len()),
                }
            })?)),
        };
        if let Some(found) = found.filter(|found| *found > SCHEMA_VERSION) {
            return Err(Error::SchemaTooNew {
                found,
                supported: SCHEMA_VERSION,
            });
        }
        self.finish_interrupted_commit()?;
        self.sealer().finish_interrupted_seals()?;
        match found {
            None => {
                self.meta.insert(META_SCHEMA, &SCHEMA_VERSION.to_be_bytes())?;
                self.db.flush()?;
                Ok(())
            }
            Some(found) if found < SCHEMA_VERSION => self.migrate(found),
            Some(_) => Ok(()),
        }
    }

    fn load(&self) -> Result<Loaded, Error> {
        let mut envs = self.env_sets.loader();
        let mut jobs: Vec<Job> = self
            .jobs
            .iter()
            .map(|entry| {
                let (key, value) = entry?;
                envs.give("jobs", decode("jobs", &key, &value)?, &key, &value)
            })
            .collect::<Result<_, Error>>()?;
        let ended = self.ended_jobs();
        for job in ended.needed_by(&jobs)? {
            jobs.push(envs.give_ended(job, &ended)?);
        }
        jobs.sort_unstable_by_key(|job| job.id);
        self.env_sets.collect_at_next_commit();
        let nodes: Vec<Node> = self
            .nodes
            .iter()
            .map(|entry| {
                let (key, value) = entry?;
                decode("nodes", &key, &value)
            })
            .collect::<Result<_, Error>>()?;
        // Past every id used, an array's reserved task ids included.
        let after = |job: &Job| job.id.0 + 1 + job.spec.array.as_ref().map_or(0, |array| u64::from(array.len()));
        let after_last = jobs
            .iter()
            .map(after)
            .chain(ended.last()?.as_ref().map(after))
            .max()
            .unwrap_or(1);
        let next_job_id = self.meta_counter(META_NEXT_JOB_ID, "next_job_id")?.max(after_last);
        let next_epoch = self.meta_counter(META_NEXT_EPOCH, "next_epoch")?;
        let usage = self
            .usage
            .iter()
            .map(|entry| {
                let (key, value) = entry?;
                Ok((
                    String::from_utf8_lossy(&key).into_owned(),
                    decode("usage", &key, &value)?,
                ))
            })
            .collect::<Result<_, Error>>()?;
        let tokens = self
            .tokens
            .iter()
            .map(|entry| {
                let (key, value) = entry?;
                let record: TokenRecord = decode("tokens", &key, &value)?;
                Ok((record.id, record))
            })
            .collect::<Result<_, Error>>()?;
        let reservations = match self.meta.get(META_RESERVATIONS)? {
            Some(value) => decode("meta", META_RESERVATIONS, &value)?,
            None => Vec::new(),
        };
        Ok(Loaded {
            jobs,
            ended,
            nodes,
            next_job_id,
            next_epoch,
            usage,
            tokens,
            reservations,
        })
    }

    /// A u64 counter in `meta`; 1 when absent.
    fn meta_counter(&self, key: &[u8], name: &str) -> Result<u64, Error> {
        match self.meta.get(key)? {
            Some(raw) => Ok(u64::from_be_bytes(raw.as_ref().try_into().map_err(|_| {
                Error::CorruptRecord {
                    tree: "meta",
                    key: name.into(),
                    reason: format!("{} bytes, expected 8", raw.len()),
                }
            })?)),
            None => Ok(1),
        }
    }

    /// Writes every record of one state-task batch at once: after a crash
    /// either all of them are on disk or none (a batch of submitted jobs is
    /// whole or absent). See `Commit`.
    pub fn commit(&self, records: Records) -> Result<(), Error> {
        let mut commit = self.begin();
        commit.records = records;
        commit.finish()
    }

    /// Removes the environment sets no job refers to any more, once
    /// enough were added. Between commits only (`EnvSets::collect_if_due`).
    pub fn collect_env_sets_if_due(&self) -> Result<(), Error> {
        self.env_sets.collect_if_due([&self.jobs, &self.ended]).map(drop)
    }

    /// A batch of writes, built up in `Commit::records`.
    pub fn begin(&self) -> Commit<'_> {
        Commit {
            store: self,
            records: Records::default(),
            log: None,
            new_env_sets: Vec::new(),
            written: false,
        }
    }

    /// `entries` in one sled transaction, over only the trees they touch
    /// (a transaction's cost grows with its trees).
    fn apply(&self, entries: &[Entry]) -> Result<(), Error> {
        let all: [&sled::Tree; 10] = [
            &self.jobs,
            &self.nodes,
            &self.meta,
            &self.usage,
            &self.tokens,
            &self.attempts,
            &self.ended,
            &self.ended_by_time,
            &self.envs,
            &self.env_sets.tree,
        ];
        // Each touched tree's place among the transaction's views.
        let mut place = [usize::MAX; 10];
        let mut trees: Vec<&sled::Tree> = Vec::with_capacity(all.len());
        for id in TreeId::ALL {
            if entries.iter().any(|(tree, _, _)| *tree == id) {
                place[id as usize] = trees.len();
                trees.push(all[id as usize]);
            }
        }
        trees[..]
            .transaction(|views| {
                for (tree, key, value) in entries {
                    let view = &views[place[*tree as usize]];
                    match value {
                        Some(value) => view.insert(key.as_slice(), value.as_slice())?,
                        None => view.remove(key.as_slice())?,
                    };
                }
                Ok(())
            })
            .map_err(|err: sled::transaction::TransactionError<()>| match err {
                sled::transaction::TransactionError::Storage(err) => Error::from(err),
                sled::transaction::TransactionError::Abort(()) => Error::Storage("a write was aborted".into()),
            })
    }

    /// Applies the redo log file of a batch, synced whole: first marks it
    /// to be applied in `meta`, flushed with every write before it. A crash
    /// before that leaves a log that `open` drops (nothing of it was
    /// applied, and its batch was never acknowledged); after, one that
    /// `open` applies again.
    fn apply_redo_log(&self) -> Result<(), Error> {
        self.meta.insert(META_REDO_LOG, &[])?;
        self.db.flush()?;
        match self.replay_redo()? {
            Some(_) => Ok(()),
            None => Err(redo::damaged(&self.redo_path, "written and synced, it was gone")),
        }
    }

    /// Applies the redo log if it is marked to be applied, a part per
    /// transaction, makes that durable, then removes the log and the mark
    /// (durably too, before any later log can be written). How many
    /// records it held; none where there was no log to apply. A log never
    /// marked is removed unapplied.
    fn replay_redo(&self) -> Result<Option<usize>, Error> {
        let path = &self.redo_path;
        if !self.meta.contains_key(META_REDO_LOG)? {
            if redo::remove(path)? {
                tracing::warn!(
                    "removed {}: the redo log of a batch that a crash cut short before it was applied (the batch was not acknowledged)",
                    path.display()
                );
            }
            return Ok(None);
        }
        let mut n_records = 0;
        let replayed = redo::replay(path, |part_idx, part| {
            let entries =
                decode_part(part).map_err(|reason| redo::damaged(path, format!("part {part_idx}: {reason}")))?;
            n_records += entries.len();
            self.apply(&entries)
        })?;
        let applied = match replayed {
            redo::Replayed::NotWhole(reason) => {
                return Err(redo::damaged(
                    path,
                    format!("it was synced whole and is partly applied, yet now {reason}"),
                ))
            }
            // Removed once what it held was flushed.
            redo::Replayed::NoLog => None,
            redo::Replayed::Applied { .. } => {
                self.db.flush()?;
                redo::remove(path)?;
                Some(n_records)
            }
        };
        self.meta.remove(META_REDO_LOG)?;
        self.db.flush()?;
        Ok(applied)
    }

    /// Finishes the batch a crash cut short, if any: from the redo log
    /// file, or from the `redo` tree, where gpoold kept the log before.
    fn finish_interrupted_commit(&self) -> Result<(), Error> {
        if let Some(n_records) = self.replay_redo()? {
            tracing::warn!(
                "finished writing a batch of {n_records} records that a crash cut short, from {}",
                self.redo_path.display()
            );
        }
        self.finish_interrupted_commit_in_sled()
    }

    /// Applies the `n_parts` parts of the redo log in the `redo` tree, one
    /// transaction each, then flushes; returns how many records they held.
    fn apply_redo(&self, n_parts: u64) -> Result<usize, Error> {
        let mut n_records = 0;
        for n in 0..n_parts {
            let key = n.to_be_bytes();
            let part = self
                .redo
                .get(key)?
                .ok_or_else(|| corrupt_redo(&key, format!("part {n} of {n_parts} is missing")))?;
            let entries = decode_part(&part).map_err(|reason| corrupt_redo(&key, reason))?;
            n_records += entries.len();
            self.apply(&entries)?;
        }
        self.db.flush()?;
        Ok(n_records)
    }

    /// Finishes a batch whose redo log a crash left in the `redo` tree
    /// (where gpoold kept it before the log was a file), if any.
    fn finish_interrupted_commit_in_sled(&self) -> Result<(), Error> {
        if self.redo.is_empty() {
            return Ok(());
        }
        match self.redo.get(REDO_WHOLE)? {
            None => tracing::warn!("dropping the redo log of a batch a crash cut short before it was whole"),
            Some(mark) => {
                let n_parts = u64::from_be_bytes(
                    mark.as_ref()
                        .try_into()
                        .map_err(|_| corrupt_redo(REDO_WHOLE, format!("{} bytes, expected 8", mark.len())))?,
                );
                let n_records = self.apply_redo(n_parts)?;
                tracing::warn!("finished writing a batch of {n_records} records that a crash cut short");
            }
        }
        self.clear_redo()
    }

    /// Empties the redo log at once, durably.
    fn clear_redo(&self) -> Result<(), Error> {
        let keys: Vec<sled::IVec> = self.redo.iter().keys().collect::<Result<_, _>>()?;
        self.redo
            .transaction(|redo| {
                for key in &keys {
                    redo.remove(key)?;
                }
                Ok(())
            })
            .map_err(|err: sled::transaction::TransactionError<()>| match err {
                sled::transaction::TransactionError::Storage(err) => Error::from(err),
                sled::transaction::TransactionError::Abort(()) => Error::Storage("a write was aborted".into()),
            })?;
        self.db.flush()?;
        Ok(())
    }

    /// A handle for the flusher thread.
    pub fn db(&self) -> sled::Db {
        self.db.clone()
    }

    /// A handle on the accounting records, for reports.
    pub fn accounting(&self) -> Accounting {
        Accounting {
            tree: self.attempts.clone(),
            files: self.attempt_files.clone(),
        }
    }

    fn ended_jobs(&self) -> EndedJobs {
        EndedJobs {
            jobs: self.ended.clone(),
            by_time: self.ended_by_time.clone(),
            env_sets: self.env_sets.tree.clone(),
            files: self.job_files.clone(),
        }
    }

    /// A handle for the task that moves old records to history files.
    pub fn sealer(&self) -> Sealer {
        Sealer {
            ended: self.ended_jobs(),
            attempts: self.accounting(),
            per_file: self.per_file,
        }
    }
}

mod commit;
mod envs;
#[cfg(test)]
mod envs_tests;
mod migrate;
mod readers;
mod seal;
#[cfg(test)]
mod tests;

use commit::*;
pub use commit::{Commit, Records};
use envs::*;
use readers::*;
pub use readers::{Accounting, EndedJobs};
pub use seal::Sealer;
use seal::*;
