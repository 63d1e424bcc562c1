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
/// not see the file, so it must refuse the state dir).
pub const SCHEMA_VERSION: u32 = 4;
const RECORD_VERSION: u8 = 1;
const META_SCHEMA: &[u8] = b"schema_version";
/// Present while the redo log file is to be applied (`Store::apply_redo_log`).
const META_REDO_LOG: &[u8] = b"redo_log_to_apply";
const META_NEXT_JOB_ID: &[u8] = b"next_job_id";
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
    /// Each job's environment, by job id: written once, at submit (the
    /// job's record leaves it out, so its rewrites stay small).
    envs: sled::Tree,
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
        store.sealer().finish_interrupted_seals()?;
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

    /// From schema `found` to this one, in one transaction; the schema
    /// says so once that is on disk. To 2: ended jobs move from `jobs` to
    /// `ended`. To 3: each job's environment moves out of its record (which
    /// is rewritten without it) to `envs`. To 4: nothing moves.
    fn migrate(&self, found: u32) -> Result<(), Error> {
        let mut records = Records::default();
        let (mut n_moved, mut n_envs) = (0, 0);
        let trees = [(&self.jobs, "jobs"), (&self.ended, "ended")];
        let rewritten = if found < 3 { trees.as_slice() } else { &[] };
        for (tree, name) in rewritten {
            for entry in tree.iter() {
                let (key, value) = entry?;
                let job: Job = decode(name, &key, &value)?;
                if found < 2 && job.state.is_finished() {
                    n_moved += 1;
                }
                records.job(&job);
                if !job.spec.env.is_empty() {
                    records.job_env(&job);
                    n_envs += 1;
                }
            }
        }
        self.commit(records)?;
        self.meta.insert(META_SCHEMA, &SCHEMA_VERSION.to_be_bytes())?;
        self.db.flush()?;
        tracing::info!(
            "schema {found} -> {SCHEMA_VERSION}: {n_moved} ended jobs moved to their own tree, {n_envs} environments to theirs"
        );
        Ok(())
    }

    fn load(&self) -> Result<Loaded, Error> {
        let mut jobs: Vec<Job> = self
            .jobs
            .iter()
            .map(|entry| {
                let (key, value) = entry?;
                decode("jobs", &key, &value)
            })
            .collect::<Result<_, Error>>()?;
        let ended = self.ended_jobs();
        jobs.extend(ended.needed_by(&jobs)?);
        jobs.sort_unstable_by_key(|job| job.id);
        self.load_envs(&mut jobs)?;
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
        Ok(Loaded {
            jobs,
            ended,
            nodes,
            next_job_id,
            next_epoch,
            usage,
            tokens,
        })
    }

    /// Gives each loaded job its environment.
    fn load_envs(&self, jobs: &mut [Job]) -> Result<(), Error> {
        // Jobs from one shell share an environment: each is decoded once.
        let mut decoded: std::collections::HashMap<sled::IVec, std::sync::Arc<[(String, String)]>> =
            std::collections::HashMap::new();
        for job in jobs.iter_mut() {
            let key = job.id.0.to_be_bytes();
            // None: a job submitted with no environment at all. A job read
            // from a history file has its environment there.
            let value = match self.envs.get(key)? {
                Some(value) => value,
                None => match self.job_files.get(&key)?.and_then(|record| record.extra) {
                    Some(value) => value.into(),
                    None => continue,
                },
            };
            let spec = std::sync::Arc::make_mut(&mut job.spec);
            if let Some(env) = decoded.get(&value) {
                spec.env = env.clone();
                continue;
            }
            let env: Vec<(String, String)> = decode("envs", &key, &value)?;
            spec.env = env.into();
            decoded.insert(value, job.spec.env.clone());
        }
        Ok(())
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

    /// A batch of writes, built up in `Commit::records`.
    pub fn begin(&self) -> Commit<'_> {
        Commit {
            store: self,
            records: Records::default(),
            log: None,
        }
    }

    /// `entries` in one sled transaction.
    fn apply(&self, entries: &[Entry]) -> Result<(), Error> {
        let trees: [&sled::Tree; 9] = [
            &self.jobs,
            &self.nodes,
            &self.meta,
            &self.usage,
            &self.tokens,
            &self.attempts,
            &self.ended,
            &self.ended_by_time,
            &self.envs,
        ];
        trees[..]
            .transaction(|views| {
                for (tree, key, value) in entries {
                    let view = &views[*tree as usize];
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
            envs: self.envs.clone(),
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

/// Moves the oldest ended jobs and accounting records from sled to sealed
/// files (`archive`), a file at a time, once sled holds a file's worth
/// more than it keeps (`SLED_KEEPS`). It removes from sled only records it
/// sealed that sled still holds unchanged (compare and swap), so it needs
/// no lock against the state task, which may write an ended job again.
#[derive(Clone)]
pub struct Sealer {
    ended: EndedJobs,
    attempts: Accounting,
    per_file: usize,
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
    fn seal_jobs(&self) -> Result<usize, Error> {
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
                // Sealed before and written again since: its environment
                // left sled with the first seal.
                let extra = match ended.envs.get(id)? {
                    Some(env) => Some(env.to_vec()),
                    None => ended.files.get(&id)?.and_then(|record| record.extra),
                };
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

    /// Removes the jobs sealed in `file` from sled, with their index entries
    /// and environments, where sled still holds the same record; returns
    /// how many. The index entry goes first and comes back if the record
    /// was written again meanwhile (the state task writes both at once), so
    /// a record left in sled always has its entry.
    fn remove_sealed_jobs(&self, file: &Arc<Segment>) -> Result<usize, Error> {
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
            if let Some(env) = &record.extra {
                ended.envs.compare_and_swap(&record.key, Some(env), None::<&[u8]>)?.ok();
            }
        }
        Ok(n_removed)
    }

    /// The `per_file` accounting records of the attempts that ended first,
    /// read from sled as the file is written.
    fn seal_attempts(&self) -> Result<usize, Error> {
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

    fn remove_sealed_attempts(&self, file: &Arc<Segment>) -> Result<usize, Error> {
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
    fn finish_interrupted_seals(&self) -> Result<(), Error> {
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
fn sealed_job_id(file: &Segment, key: &[u8]) -> Result<JobId, Error> {
    <[u8; 8]>::try_from(key)
        .map(|key| JobId(u64::from_be_bytes(key)))
        .map_err(|_| Error::CorruptHistory {
            file: file.name(),
            reason: format!("a job's key of {} bytes, expected 8", key.len()),
        })
}

/// A 16-byte `time_key` read from `tree`.
fn time_key_bytes(tree: &'static str, key: &[u8]) -> Result<[u8; 16], Error> {
    <[u8; 16]>::try_from(key).map_err(|_| Error::CorruptRecord {
        tree,
        key: key_text(key),
        reason: format!("{} bytes, expected 16", key.len()),
    })
}

/// A record from sled, as the merge with history files takes it.
fn sled_record(entry: sled::Result<(sled::IVec, sled::IVec)>) -> Result<Record, Error> {
    let (key, value) = entry?;
    Ok(Record {
        key: key.to_vec(),
        at: 0,
        value: value.to_vec(),
        extra: None,
    })
}

/// The accounting records on disk, in sled and then in history files.
/// Reports read them here, not from the state: they are never held in
/// memory as a whole.
#[derive(Clone)]
pub struct Accounting {
    tree: sled::Tree,
    files: Arc<Archive>,
}

impl Accounting {
    /// Records of attempts that ended at or after `since` and started
    /// before `until`, for which `keep` says yes.
    pub fn read(
        &self,
        since: Timestamp,
        until: Timestamp,
        mut keep: impl FnMut(&AttemptRecord) -> bool,
    ) -> Result<Vec<AttemptRecord>, Error> {
        let mut found = Vec::new();
        let from = attempt_key(since, gpool_core::Epoch(0));
        let in_sled = self.tree.range(from.to_vec()..).map(sled_record);
        for entry in Merged::new(&self.files, &from, in_sled) {
            let Record { key, value, .. } = entry?;
            let record: AttemptRecord = decode("attempts", &key, &value)?;
            if record.started_at < until && keep(&record) {
                found.push(record);
            }
        }
        Ok(found)
    }

    /// Removes the records of attempts that ended before `before` (in
    /// history files, a whole file once all of its records did); returns
    /// how many.
    pub fn remove_ended_before(&self, before: Timestamp) -> Result<usize, Error> {
        let mut batch = sled::Batch::default();
        let mut n = 0;
        for key in self
            .tree
            .range(..attempt_key(before, gpool_core::Epoch(0)).to_vec())
            .keys()
        {
            batch.remove(key?);
            n += 1;
        }
        self.tree.apply_batch(batch)?;
        let in_files = self.files.remove(|file| Ok(file.at.1 < before.0))?;
        Ok(n + in_files as usize)
    }
}

/// An accounting record's key: its end time (ms, big-endian) and epoch,
/// so records are in end order and a window is one range.
fn attempt_key(ended_at: Timestamp, epoch: gpool_core::Epoch) -> [u8; 16] {
    time_key(ended_at, epoch.0)
}

/// A time (ms, big-endian) and then a number, so keys follow time.
fn time_key(at: Timestamp, then: u64) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&(at.0.max(0) as u64).to_be_bytes());
    key[8..].copy_from_slice(&then.to_be_bytes());
    key
}

/// A `time_key`'s time and number.
fn split_time_key(raw: [u8; 16]) -> (u64, u64) {
    let (mut at, mut then) = ([0u8; 8], [0u8; 8]);
    at.copy_from_slice(&raw[..8]);
    then.copy_from_slice(&raw[8..]);
    (u64::from_be_bytes(at), u64::from_be_bytes(then))
}

/// The ended jobs on disk, in sled and then in history files. `gpool
/// show`, `jobs --all` and the rest read them here; they are not held in
/// memory. sled is looked at first: a record leaves it only once its file
/// is published.
#[derive(Clone)]
pub struct EndedJobs {
    jobs: sled::Tree,
    by_time: sled::Tree,
    envs: sled::Tree,
    files: Arc<Archive>,
}

impl EndedJobs {
    /// Ended job `id`, if it is on disk, without its environment.
    pub fn get(&self, id: JobId) -> Result<Option<Job>, Error> {
        let key = id.0.to_be_bytes();
        if let Some(value) = self.jobs.get(key)? {
            return decode("ended", &key, &value).map(Some);
        }
        match self.files.get(&key)? {
            Some(record) => decode("ended", &key, &record.value).map(Some),
            None => Ok(None),
        }
    }

    /// `job` as read from `ended`, with its environment.
    pub fn with_env(&self, mut job: Job) -> Result<Job, Error> {
        let key = job.id.0.to_be_bytes();
        let value = match self.envs.get(key)? {
            Some(value) => Some(value.to_vec()),
            None => self.files.get(&key)?.and_then(|record| record.extra),
        };
        if let Some(value) = value {
            let env: Vec<(String, String)> = decode("envs", &key, &value)?;
            std::sync::Arc::make_mut(&mut job.spec).env = env.into();
        }
        Ok(job)
    }

    /// The ended jobs from id `first` on, in id order, without their
    /// environments (a listing shows none).
    pub fn from(&self, first: JobId) -> impl Iterator<Item = Result<Job, Error>> {
        let key = first.0.to_be_bytes();
        let in_sled = self.jobs.range(key..).map(sled_record);
        Merged::new(&self.files, &key, in_sled).map(|entry| {
            let record = entry?;
            decode("ended", &record.key, &record.value)
        })
    }

    /// The ended job with the highest id below `id` (without its
    /// environment): the array a task of an ended array belongs to, or
    /// another task of it, if any.
    pub fn before(&self, id: JobId) -> Result<Option<Job>, Error> {
        let key = id.0.to_be_bytes();
        let in_sled = self.jobs.range(..key).next_back().map(sled_record).transpose()?;
        let in_files = self.files.last_below(&key)?;
        let last = match (in_sled, in_files) {
            (Some(in_sled), Some(in_files)) if in_files.key > in_sled.key => Some(in_files),
            (None, in_files) => in_files,
            (in_sled, _) => in_sled,
        };
        last.map(|record| decode("ended", &record.key, &record.value))
            .transpose()
    }

    fn last(&self) -> Result<Option<Job>, Error> {
        self.before(JobId(u64::MAX))
    }

    /// The ended jobs that `jobs` (jobs that have not ended) need: the
    /// targets of their dependencies, their arrays' ended tasks, and the
    /// ended arrays of their tasks.
    fn needed_by(&self, jobs: &[Job]) -> Result<Vec<Job>, Error> {
        let mut needed: Vec<Job> = Vec::new();
        for job in jobs {
            let n_tasks = job.spec.array.as_ref().map_or(0, |spec| spec.len());
            if n_tasks == 0 {
                continue;
            }
            let tasks = task_ids(job.id, n_tasks);
            for task in self.from(tasks.start) {
                let task = task?;
                if task.id >= tasks.end {
                    break;
                }
                needed.push(task);
            }
        }
        let targets: std::collections::BTreeSet<JobId> = jobs
            .iter()
            .flat_map(|job| job.spec.dependencies.iter())
            .filter_map(|dependency| match dependency.target {
                DepTarget::Job(id) => Some(id),
                DepTarget::InRequest(_) => None,
            })
            .collect();
        // An ended array whose tasks still run (`cancel -t pending`).
        let arrays: std::collections::BTreeSet<JobId> = jobs
            .iter()
            .filter_map(|job| job.array_task.map(|task| task.array))
            .collect();
        let loaded: std::collections::HashSet<JobId> = jobs.iter().chain(&needed).map(|job| job.id).collect();
        for id in targets.union(&arrays).filter(|id| !loaded.contains(id)) {
            needed.extend(self.get(*id)?);
        }
        Ok(needed)
    }

    /// Removes the history files whose jobs all ended before `before`,
    /// but none that holds a job still needed: `held` gives the ended jobs
    /// in memory with ids in a range, and each is looked up in the file
    /// (such a file goes once it is not needed). Returns how many jobs the
    /// files held.
    pub fn remove_files_before(
        &self,
        before: Timestamp,
        held: impl Fn(std::ops::RangeInclusive<JobId>) -> Vec<JobId>,
    ) -> Result<u64, Error> {
        self.files.remove(|file| {
            if file.at.1 >= before.0 {
                return Ok(false);
            }
            let (first, last) = file.key_range();
            for needed in held(sealed_job_id(file, first)?..=sealed_job_id(file, last)?) {
                if file.get(&needed.0.to_be_bytes())?.is_some() {
                    return Ok(false);
                }
            }
            Ok(true)
        })
    }

    /// The ended jobs in sled that ended before `before`, oldest first,
    /// and when.
    pub fn ended_before(&self, before: Timestamp) -> Result<Vec<(JobId, Timestamp)>, Error> {
        self.by_time
            .range(..time_key(before, 0))
            .keys()
            .map(|key| {
                let key = key?;
                match <[u8; 16]>::try_from(key.as_ref()) {
                    Ok(raw) => {
                        let (at, id) = split_time_key(raw);
                        Ok((JobId(id), Timestamp(at as i64)))
                    }
                    Err(_) => Err(Error::CorruptRecord {
                        tree: "ended_by_time",
                        key: key_text(&key),
                        reason: format!("{} bytes, expected 16", key.len()),
                    }),
                }
            })
            .collect()
    }
}

/// Which tree a record goes to (the order of the trees in `Store::commit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TreeId {
    Jobs = 0,
    Nodes = 1,
    Meta = 2,
    Usage = 3,
    Tokens = 4,
    Attempts = 5,
    Ended = 6,
    EndedByTime = 7,
    Envs = 8,
}

impl TreeId {
    const ALL: [TreeId; 9] = [
        TreeId::Jobs,
        TreeId::Nodes,
        TreeId::Meta,
        TreeId::Usage,
        TreeId::Tokens,
        TreeId::Attempts,
        TreeId::Ended,
        TreeId::EndedByTime,
        TreeId::Envs,
    ];
}

/// A tree, a key, and the value (none: remove the key).
type Entry = (TreeId, Vec<u8>, Option<Vec<u8>>);

/// The most records one sled transaction writes.
const MAX_AT_ONCE: usize = 1024;
/// The key of the redo log's mark that it is whole (its value: how many
/// parts); the parts' keys are their numbers, 8 bytes big-endian.
const REDO_WHOLE: &[u8] = b"whole_log_mark";

/// A part of a redo log: for each entry, its tree (1 byte), its key and
/// its value, each as a 4-byte little-endian length and the bytes; a
/// removal has the length `u32::MAX` and no bytes.
fn encode_part(entries: &[Entry]) -> Vec<u8> {
    let size = entries
        .iter()
        .map(|(_, key, value)| 9 + key.len() + value.as_ref().map_or(0, Vec::len))
        .sum();
    let mut bytes = Vec::with_capacity(size);
    for (tree, key, value) in entries {
        bytes.push(*tree as u8);
        bytes.extend_from_slice(&(key.len() as u32).to_le_bytes());
        bytes.extend_from_slice(key);
        match value {
            Some(value) => {
                bytes.extend_from_slice(&(value.len() as u32).to_le_bytes());
                bytes.extend_from_slice(value);
            }
            None => bytes.extend_from_slice(&u32::MAX.to_le_bytes()),
        }
    }
    bytes
}

fn decode_part(bytes: &[u8]) -> Result<Vec<Entry>, String> {
    let mut bytes = Reader(bytes);
    let mut entries = Vec::new();
    while !bytes.0.is_empty() {
        let tree = bytes.u8()?;
        let tree = *TreeId::ALL
            .get(usize::from(tree))
            .ok_or_else(|| format!("unknown tree {tree}"))?;
        let key_len = bytes.u32()?;
        let key = bytes.take(key_len as usize)?.to_vec();
        let value = match bytes.u32()? {
            u32::MAX => None,
            value_len => Some(bytes.take(value_len as usize)?.to_vec()),
        };
        entries.push((tree, key, value));
    }
    Ok(entries)
}

/// Encoded records waiting for `Store::commit`.
#[derive(Default)]
pub struct Records {
    entries: Vec<Entry>,
}

/// A batch of writes on its way to sled (`Store::begin`). Up to
/// `MAX_AT_ONCE` records are one sled transaction. A larger batch would
/// hold sled's every replaced tree node until it ends (about 14 KB a job,
/// 1.5 GB for a 100,000-job file), so it goes through a redo log file
/// instead (`redo`): its records move there a part at a time as they are
/// added (`spill_if_full`), then the whole log is synced, marked to be
/// applied, applied a part per transaction, flushed, and removed
/// (`Store::apply_redo_log`). A crash before the mark leaves a log that
/// `open` drops (nothing of the batch was applied, nor acknowledged);
/// after, `open` applies the log again: each entry sets or removes a whole
/// record, so applying it twice is applying it once. Neither gpoold nor
/// sled holds such a batch whole: it is written as it is encoded.
pub struct Commit<'a> {
    store: &'a Store,
    pub records: Records,
    log: Option<RedoWriter>,
}

impl Commit<'_> {
    /// Moves the whole parts of the records added so far to the redo log
    /// once they are more than one transaction writes.
    pub fn spill_if_full(&mut self) -> Result<(), Error> {
        if self.records.entries.len() > MAX_AT_ONCE {
            let n_whole = self.records.entries.len() / MAX_AT_ONCE * MAX_AT_ONCE;
            self.spill(n_whole)?;
        }
        Ok(())
    }

    /// Moves the first `n_entries` records to the redo log, in parts.
    fn spill(&mut self, n_entries: usize) -> Result<(), Error> {
        let log = match &mut self.log {
            Some(log) => log,
            None => self.log.insert(RedoWriter::create(&self.store.redo_path)?),
        };
        for part in self.records.entries[..n_entries].chunks(MAX_AT_ONCE) {
            log.part(&encode_part(part))?;
        }
        self.records.entries.drain(..n_entries);
        Ok(())
    }

    /// Writes the batch: whole, or (after a crash) not at all, or, once its
    /// redo log is marked to be applied, whole at the next open.
    pub fn finish(mut self) -> Result<(), Error> {
        if self.log.is_none() && self.records.entries.len() <= MAX_AT_ONCE {
            if self.records.entries.is_empty() {
                return Ok(());
            }
            return self.store.apply(&self.records.entries);
        }
        self.spill(self.records.entries.len())?;
        if let Some(log) = self.log.take() {
            log.finish()?;
        }
        self.store.apply_redo_log()
    }
}

impl Records {
    /// A job's record: in `jobs` while it has not ended, then in `ended`
    /// (and its index).
    pub fn job(&mut self, job: &Job) {
        let key = job.id.0.to_be_bytes().to_vec();
        match job.state.ended_at() {
            None => self.entries.push((TreeId::Jobs, key, Some(encode(job)))),
            Some(ended_at) => {
                self.entries.push((
                    TreeId::EndedByTime,
                    time_key(ended_at, job.id.0).to_vec(),
                    Some(Vec::new()),
                ));
                self.entries.push((TreeId::Ended, key.clone(), Some(encode(job))));
                self.entries.push((TreeId::Jobs, key, None));
            }
        }
    }

    pub fn node(&mut self, node: &Node) {
        self.entries
            .push((TreeId::Nodes, node.name.as_bytes().to_vec(), Some(encode(node))));
    }

    /// A new job's environment (its record leaves it out).
    pub fn job_env(&mut self, job: &Job) {
        self.entries.push((
            TreeId::Envs,
            job.id.0.to_be_bytes().to_vec(),
            Some(encode(&job.spec.env)),
        ));
    }

    /// Removes an ended job (past its retention), which ended at
    /// `ended_at`.
    pub fn remove_job(&mut self, id: gpool_core::JobId, ended_at: Timestamp) {
        self.entries.push((TreeId::Envs, id.0.to_be_bytes().to_vec(), None));
        self.entries.push((TreeId::Ended, id.0.to_be_bytes().to_vec(), None));
        self.entries
            .push((TreeId::EndedByTime, time_key(ended_at, id.0).to_vec(), None));
    }

    /// Forgets a node.
    pub fn remove_node(&mut self, name: &str) {
        self.entries.push((TreeId::Nodes, name.as_bytes().to_vec(), None));
    }

    pub fn usage(&mut self, team: &str, ledger: &Ledger) {
        self.entries
            .push((TreeId::Usage, team.as_bytes().to_vec(), Some(encode(ledger))));
    }

    pub fn token(&mut self, record: &TokenRecord) {
        self.entries
            .push((TreeId::Tokens, record.id.to_be_bytes().to_vec(), Some(encode(record))));
    }

    pub fn attempt(&mut self, record: &AttemptRecord) {
        self.entries.push((
            TreeId::Attempts,
            attempt_key(record.ended_at, record.epoch).to_vec(),
            Some(encode(record)),
        ));
    }

    pub fn next_job_id(&mut self, next_job_id: u64) {
        self.entries.push((
            TreeId::Meta,
            META_NEXT_JOB_ID.to_vec(),
            Some(next_job_id.to_be_bytes().to_vec()),
        ));
    }

    pub fn next_epoch(&mut self, next_epoch: u64) {
        self.entries.push((
            TreeId::Meta,
            META_NEXT_EPOCH.to_vec(),
            Some(next_epoch.to_be_bytes().to_vec()),
        ));
    }
}

fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    let mut bytes = vec![RECORD_VERSION];
    // Serializing plain structs of strings and numbers to a Vec cannot fail.
    serde_json::to_writer(&mut bytes, record).expect("records serialize to JSON");
    bytes
}

fn decode<T: DeserializeOwned>(tree: &'static str, key: &[u8], value: &[u8]) -> Result<T, Error> {
    let corrupt = |reason: String| Error::CorruptRecord {
        tree,
        key: key_text(key),
        reason,
    };
    match value.split_first() {
        Some((&RECORD_VERSION, json)) => serde_json::from_slice(json).map_err(|err| corrupt(err.to_string())),
        Some((version, _)) => Err(corrupt(format!("unknown record version {version}"))),
        None => Err(corrupt("empty record".into())),
    }
}

fn key_text(key: &[u8]) -> String {
    match <[u8; 8]>::try_from(key) {
        Ok(id) => u64::from_be_bytes(id).to_string(),
        Err(_) => String::from_utf8_lossy(key).into_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpool_core::JobState;

    fn job(id: u64, state: JobState) -> Job {
        let mut job = gpool_core::testing::job_builder(JobId(id)).build();
        job.state = state;
        job
    }

    fn cancelled_at(ms: i64) -> JobState {
        JobState::Cancelled {
            started_at: None,
            ended_at: Timestamp(ms),
            by: "alice".into(),
        }
    }

    #[test]
    fn schema_1_moves_ended_jobs_and_environments_to_their_trees() {
        let dir = tempfile::tempdir().expect("a temp dir");
        {
            // A version 1 database: every job in `jobs`.
            let db = sled::open(dir.path().join("db")).expect("sled");
            let jobs = db.open_tree("jobs").expect("jobs");
            for mut job in [
                job(1, cancelled_at(5_000)),
                job(2, JobState::Pending),
                job(3, cancelled_at(2_000)),
            ] {
                // Version 1 records have the environment inline.
                std::sync::Arc::make_mut(&mut job.spec).env =
                    vec![("HOME".to_string(), format!("/home/{}", job.id))].into();
                let mut value = serde_json::to_value(&job).expect("json");
                value["spec"]["env"] = serde_json::to_value(&job.spec.env).expect("json");
                let mut bytes = vec![RECORD_VERSION];
                serde_json::to_writer(&mut bytes, &value).expect("json");
                jobs.insert(job.id.0.to_be_bytes(), bytes).expect("insert");
            }
            db.open_tree("meta")
                .expect("meta")
                .insert(META_SCHEMA, &1u32.to_be_bytes())
                .expect("insert");
            db.flush().expect("flush");
        }
        let (store, loaded) = Store::open(dir.path()).expect("open");
        let ids: Vec<JobId> = loaded.jobs.iter().map(|job| job.id).collect();
        assert_eq!(ids, [JobId(2)]);
        assert_eq!(loaded.next_job_id, 4);
        assert_eq!(
            loaded.jobs[0].spec.env.to_vec(),
            [("HOME".to_string(), "/home/2".to_string())]
        );
        let ended = loaded.ended.get(JobId(1)).expect("read").expect("job 1");
        assert!(ended.spec.env.is_empty(), "the record was rewritten without it");
        let ended = loaded.ended.with_env(ended).expect("read");
        assert_eq!(ended.spec.env.to_vec(), [("HOME".to_string(), "/home/1".to_string())]);
        assert!(loaded.ended.get(JobId(2)).expect("read").is_none());
        let listed: Vec<JobId> = loaded.ended.from(JobId(0)).map(|job| job.expect("read").id).collect();
        assert_eq!(listed, [JobId(1), JobId(3)]);
        assert_eq!(
            loaded.ended.ended_before(Timestamp(5_000)).expect("read"),
            [(JobId(3), Timestamp(2_000))]
        );
        let schema = store.meta.get(META_SCHEMA).expect("read").expect("a schema");
        assert_eq!(schema.as_ref(), SCHEMA_VERSION.to_be_bytes());
        // The pending job's record is rewritten without its environment,
        // which is kept apart since the first open.
        let mut records = Records::default();
        records.job(&loaded.jobs[0]);
        store.commit(records).expect("commit");
        drop((store, loaded));
        // Opened again: nothing moves twice, the same jobs load.
        let (_, loaded) = Store::open(dir.path()).expect("open again");
        assert_eq!(loaded.jobs.len(), 1);
        assert_eq!(loaded.jobs[0].spec.env.len(), 1);
        assert_eq!(loaded.ended.from(JobId(0)).count(), 2);
    }

    #[test]
    fn a_job_record_leaves_out_default_fields_and_reads_records_that_wrote_them() {
        let plain = job(1, JobState::Pending);
        let bytes = encode(&plain);
        let text = std::str::from_utf8(&bytes[1..]).expect("utf-8");
        for left_out in [
            "gpu_types",
            "project",
            "workload_type",
            "time_limit_secs",
            "priority",
            "pool",
            "requeue",
            "discard_output",
            "qos",
            "checkpoint_signal",
            "grace_secs",
            "image",
            "mem_bytes",
            "cpus_per_gpu",
            "n_attempts",
            "last_nodes",
            "n_preemptions",
            "lost_gpu_secs",
        ] {
            assert!(!text.contains(&format!("\"{left_out}\"")), "{left_out} in {text}");
        }
        assert_eq!(decode::<Job>("jobs", b"1", &bytes).expect("decode"), plain);

        // A record written before defaults were left out has every field.
        let older = br#"{"id":1,"spec":{"name":"job","command":["true"],"gpus_per_node":1,"nodes":1,
            "gpu_types":[],"team":"default","project":"","workload_type":"","time_limit_secs":null,
            "workdir":"","priority":0,"pool":"","requeue":true,"discard_output":false,"qos":"",
            "checkpoint_signal":null,"grace_secs":null,"image":"","mem_bytes":null,"cpus_per_gpu":null},
            "user":"alice","submitted_at":0,"state":"Pending","n_attempts":0,"last_nodes":[],
            "n_preemptions":0,"lost_gpu_secs":0}"#;
        let older = [&[RECORD_VERSION][..], older].concat();
        assert_eq!(decode::<Job>("jobs", b"1", &older).expect("decode"), plain);

        // Every field away from its default is written and read back.
        let mut full = job(2, JobState::Pending);
        full.n_attempts = 2;
        full.last_nodes = ["n1".to_string()].into_iter().collect();
        full.n_preemptions = 1;
        full.lost_gpu_secs = 30;
        let spec = std::sync::Arc::make_mut(&mut full.spec);
        spec.gpu_types = vec![gpool_core::GpuModel::new("h100")];
        spec.project = "p".into();
        spec.workload_type = "train".into();
        spec.time_limit_secs = Some(60);
        spec.priority = -3;
        spec.pool = "batch".into();
        spec.requeue = false;
        spec.discard_output = true;
        spec.qos = "high".into();
        spec.checkpoint_signal = Some(10);
        spec.grace_secs = Some(5);
        spec.image = "img".into();
        spec.mem_bytes = Some(1 << 30);
        spec.cpus_per_gpu = Some(4);
        assert_eq!(decode::<Job>("jobs", b"2", &encode(&full)).expect("decode"), full);
    }

    #[test]
    fn a_job_record_moves_when_it_ends_and_is_removed_with_its_index() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let (store, _) = Store::open(dir.path()).expect("open");
        let mut records = Records::default();
        records.job(&job(7, JobState::Pending));
        store.commit(records).expect("commit");
        let mut records = Records::default();
        records.job(&job(7, cancelled_at(9_000)));
        store.commit(records).expect("commit");
        assert!(store.jobs.get(7u64.to_be_bytes()).expect("read").is_none());
        let ended = store.ended_jobs();
        assert_eq!(ended.before(JobId(8)).expect("read").map(|job| job.id), Some(JobId(7)));
        assert_eq!(ended.ended_before(Timestamp(9_001)).expect("read").len(), 1);
        let mut records = Records::default();
        records.remove_job(JobId(7), Timestamp(9_000));
        store.commit(records).expect("commit");
        assert!(ended.get(JobId(7)).expect("read").is_none());
        assert!(ended.ended_before(Timestamp(i64::MAX)).expect("read").is_empty());
    }

    /// Ended jobs 1..=n, job `id` with `ID=id` in its environment, ended at
    /// `1000 * id` ms, written as the state task writes them.
    fn ended_jobs_1_to(store: &Store, n: u64) {
        ended_jobs_from_to(store, 1, n);
    }

    fn ended_jobs_from_to(store: &Store, first: u64, n: u64) {
        let mut records = Records::default();
        for id in first..=n {
            let mut job = job(id, JobState::Pending);
            Arc::make_mut(&mut job.spec).env = vec![("ID".to_string(), id.to_string())].into();
            records.job_env(&job);
            job.state = cancelled_at(1000 * id as i64);
            records.job(&job);
        }
        store.commit(records).expect("commit");
    }

    fn ids(jobs: impl Iterator<Item = Result<Job, Error>>) -> Vec<u64> {
        jobs.map(|job| job.expect("read").id.0).collect()
    }

    #[test]
    fn the_oldest_ended_jobs_move_to_a_history_file_and_read_back_the_same() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let (store, _) = Store::open_sealing(dir.path(), 16).expect("open");
        ended_jobs_1_to(&store, 40);
        let ended = store.ended_jobs();
        let before: Vec<Job> = ended.from(JobId(0)).map(|job| job.expect("read")).collect();
        // 40 is more than twice 16: the 16 that ended first move, once.
        assert_eq!(store.sealer().seal_due().expect("seal"), (16, 0));
        assert_eq!(store.ended.len(), 24);
        assert_eq!(store.ended_by_time.len(), 24);
        assert!(store.ended.get(16u64.to_be_bytes()).expect("read").is_none());
        assert!(store.envs.get(16u64.to_be_bytes()).expect("read").is_none());
        let after: Vec<Job> = ended.from(JobId(0)).map(|job| job.expect("read")).collect();
        assert_eq!(after, before);
        assert_eq!(ids(ended.from(JobId(15))), (15..=40).collect::<Vec<_>>());
        let sealed = ended.get(JobId(7)).expect("read").expect("job 7");
        assert_eq!(sealed, before[6]);
        let env = ended.with_env(sealed).expect("read").spec.env.to_vec();
        assert_eq!(env, [("ID".to_string(), "7".to_string())]);
        assert_eq!(
            ended.before(JobId(17)).expect("read").map(|job| job.id),
            Some(JobId(16))
        );
        assert_eq!(
            ended.before(JobId(16)).expect("read").map(|job| job.id),
            Some(JobId(15))
        );
        assert_eq!(ended.before(JobId(1)).expect("read"), None);
        // Sealed, then written again (an ended array whose task ends): the
        // next seal keeps its environment, which left sled with the first.
        let mut again = before[2].clone();
        Arc::make_mut(&mut again.spec).name = "again".into();
        let mut write = Records::default();
        write.job(&again);
        store.commit(write).expect("commit");
        ended_jobs_from_to(&store, 41, 60);
        // 45 in sled: job 3 (ended first) and 17..=31 move.
        assert_eq!(store.sealer().seal_due().expect("seal"), (16, 0));
        let job_3 = ended.get(JobId(3)).expect("read").expect("job 3");
        assert_eq!(job_3.spec.name, "again");
        let env = ended.with_env(job_3).expect("read").spec.env.to_vec();
        assert_eq!(env, [("ID".to_string(), "3".to_string())]);
        // Retention: a file goes once all its jobs are past it, and not
        // while one of them is still needed.
        let keep = |needed: u64| {
            move |ids: std::ops::RangeInclusive<JobId>| {
                ids.contains(&JobId(needed))
                    .then_some(JobId(needed))
                    .into_iter()
                    .collect()
            }
        };
        assert_eq!(
            ended.remove_files_before(Timestamp(16_000), keep(0)).expect("remove"),
            0
        );
        assert_eq!(
            ended.remove_files_before(Timestamp(16_001), keep(7)).expect("remove"),
            0
        );
        assert_eq!(
            ended.remove_files_before(Timestamp(16_001), keep(0)).expect("remove"),
            16
        );
        // Job 3 is in the later file too, as written again.
        assert_eq!(
            ids(ended.from(JobId(0))),
            [3].into_iter().chain(17..=60).collect::<Vec<_>>()
        );
        assert!(ended.get(JobId(7)).expect("read").is_none());
    }

    #[test]
    fn a_seal_a_crash_cut_short_is_finished_at_open_and_a_record_written_again_stays() {
        let dir = tempfile::tempdir().expect("a temp dir");
        {
            let (store, _) = Store::open_sealing(dir.path(), 16).expect("open");
            ended_jobs_1_to(&store, 20);
            // The file is written and published; the crash comes before
            // anything leaves sled.
            let records: Vec<Record> = (1..=8u64)
                .map(|id| {
                    let key = id.to_be_bytes();
                    Record {
                        key: key.to_vec(),
                        at: 1000 * id as i64,
                        value: store.ended.get(key).expect("read").expect("ended").to_vec(),
                        extra: store.envs.get(key).expect("read").map(|env| env.to_vec()),
                    }
                })
                .collect();
            store.job_files.seal(records.into_iter().map(Ok)).expect("seal");
            // Job 3 is written again before the removal: that one stays.
            let mut again = job(3, cancelled_at(3000));
            Arc::make_mut(&mut again.spec).name = "again".into();
            let mut write = Records::default();
            write.job(&again);
            store.commit(write).expect("commit");
            store.db.flush().expect("flush");
        }
        let (store, loaded) = Store::open_sealing(dir.path(), 16).expect("open again");
        assert_eq!(store.ended.len(), 13, "jobs 3 and 9..=20 are left in sled");
        assert_eq!(store.ended_by_time.len(), 13);
        assert_eq!(ids(loaded.ended.from(JobId(0))), (1..=20).collect::<Vec<_>>());
        let job_3 = loaded.ended.get(JobId(3)).expect("read").expect("job 3");
        assert_eq!(job_3.spec.name, "again");
        let job_5 = loaded.ended.get(JobId(5)).expect("read").expect("job 5");
        assert_ne!(job_5.spec.name, "again");
    }

    #[test]
    fn old_accounting_records_move_to_history_files_and_leave_a_file_at_a_time() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let (store, _) = Store::open_sealing(dir.path(), 16).expect("open");
        let accounting = store.accounting();
        let record = |n: u64| {
            let mut record = AttemptRecord {
                job: JobId(n),
                display_id: n.to_string(),
                attempt: 1,
                epoch: gpool_core::Epoch(n),
                user: "alice".into(),
                team: "ml".into(),
                project: "p".into(),
                workload_type: "training".into(),
                qos: String::new(),
                pool: "default".into(),
                gpus: Default::default(),
                nodes: vec!["n1".into()],
                started_at: Timestamp(0),
                ended_at: Timestamp(0),
                burst: false,
                end: "completed".into(),
                lost_gpu_secs: 0.0,
                gpu_use: Default::default(),
            };
            record.ended_at = Timestamp(n as i64 * 10);
            record
        };
        let mut records = Records::default();
        for n in 1..=50 {
            records.attempt(&record(n));
        }
        store.commit(records).expect("commit");
        let all = accounting.read(Timestamp(0), Timestamp(1), |_| true).expect("read");
        // Twice 16 are due twice: 50, then 34.
        assert_eq!(store.sealer().seal_due().expect("seal"), (0, 32));
        assert_eq!(store.attempts.len(), 18);
        assert_eq!(
            accounting.read(Timestamp(0), Timestamp(1), |_| true).expect("read"),
            all
        );
        let window = accounting.read(Timestamp(155), Timestamp(1), |_| true).expect("read");
        assert_eq!(
            window.iter().map(|record| record.job.0).collect::<Vec<_>>(),
            (16..=50).collect::<Vec<_>>()
        );
        // Records 1..=16 ended at 10..=160: their file goes with them.
        assert_eq!(accounting.remove_ended_before(Timestamp(165)).expect("remove"), 16);
        assert_eq!(
            accounting.read(Timestamp(0), Timestamp(1), |_| true).expect("read"),
            all[16..]
        );
    }

    /// Records of `n` pending jobs from id 1, and the next job id after them.
    fn batch_of(n: u64) -> Records {
        let mut records = Records::default();
        for id in 1..=n {
            records.job(&job(id, JobState::Pending));
        }
        records.next_job_id(n + 1);
        records
    }

    #[test]
    fn a_batch_larger_than_one_transaction_is_written_whole_and_leaves_no_log() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let n = 2 * MAX_AT_ONCE as u64 + 5;
        {
            let (store, _) = Store::open(dir.path()).expect("open");
            // As the state task adds them: spilled to the log as they come.
            let mut commit = store.begin();
            for records in batch_of(n).entries.chunks(7) {
                commit.records.entries.extend_from_slice(records);
                commit.spill_if_full().expect("spill");
                assert!(
                    commit.records.entries.len() <= MAX_AT_ONCE,
                    "never more than a part held"
                );
            }
            assert!(store.redo_path.exists(), "the log is started once a part is full");
            commit.finish().expect("commit");
            assert!(
                !store.redo_path.exists(),
                "the redo log is gone once the batch is written"
            );
            assert!(store.redo.is_empty());
        }
        let (_, loaded) = Store::open(dir.path()).expect("open again");
        assert_eq!(loaded.jobs.len() as u64, n);
        assert_eq!(loaded.next_job_id, n + 1);
    }

    #[test]
    fn a_batch_of_one_transaction_needs_no_log() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let (store, _) = Store::open(dir.path()).expect("open");
        let mut commit = store.begin();
        commit.records = batch_of(MAX_AT_ONCE as u64 - 1);
        commit.spill_if_full().expect("spill");
        assert!(!store.redo_path.exists());
        commit.finish().expect("commit");
        assert_eq!(store.jobs.len(), MAX_AT_ONCE - 1);
    }

    /// A crash's leftovers: the log of a batch of `n` jobs written (with
    /// its whole mark or not), marked to be applied in `meta` or not, and
    /// the first part applied where it was marked.
    fn crash_with_a_log(dir: &Path, n: u64, whole: bool, marked: bool) {
        let entries = batch_of(n).entries;
        let parts: Vec<&[Entry]> = entries.chunks(MAX_AT_ONCE).collect();
        let (store, _) = Store::open(dir).expect("open");
        let mut log = RedoWriter::create(&store.redo_path).expect("create");
        for part in &parts {
            log.part(&encode_part(part)).expect("part");
        }
        if whole {
            log.finish().expect("finish");
        } else {
            drop(log);
        }
        if marked {
            store.meta.insert(META_REDO_LOG, &[]).expect("mark");
            store.apply(parts[0]).expect("apply");
        }
        store.db.flush().expect("flush");
    }

    #[test]
    fn a_batch_cut_short_is_finished_at_open_once_marked_and_dropped_before() {
        let n = MAX_AT_ONCE as u64 + 3;
        assert_eq!(
            decode_part(&encode_part(&batch_of(n).entries[..3])).expect("decode"),
            batch_of(n).entries[..3]
        );
        for (whole, marked, expected) in [(true, true, n), (true, false, 0), (false, false, 0)] {
            let dir = tempfile::tempdir().expect("a temp dir");
            crash_with_a_log(dir.path(), n, whole, marked);
            let (store, loaded) = Store::open(dir.path()).expect("open again");
            let case = format!("whole log: {whole}, marked: {marked}");
            assert_eq!(loaded.jobs.len() as u64, expected, "{case}");
            assert_eq!(loaded.next_job_id, expected + 1, "{case}");
            assert!(!store.redo_path.exists(), "{case}");
            assert!(!store.meta.contains_key(META_REDO_LOG).expect("meta"), "{case}");
        }
    }

    #[test]
    fn a_marked_log_damaged_since_it_was_synced_is_refused_naming_it() {
        let dir = tempfile::tempdir().expect("a temp dir");
        crash_with_a_log(dir.path(), MAX_AT_ONCE as u64 + 3, false, true);
        let err = Store::open(dir.path())
            .err()
            .expect("a half-applied batch is not dropped")
            .to_string();
        assert!(err.contains("redo.log") && err.contains("partly applied"), "{err}");
    }

    #[test]
    fn a_batch_cut_short_with_its_log_in_the_redo_tree_is_finished_at_open() {
        let n = MAX_AT_ONCE as u64 + 3;
        let entries = batch_of(n).entries;
        let parts: Vec<&[Entry]> = entries.chunks(MAX_AT_ONCE).collect();
        for whole in [true, false] {
            let dir = tempfile::tempdir().expect("a temp dir");
            {
                // As an earlier gpoold's crash leaves it.
                let (store, _) = Store::open(dir.path()).expect("open");
                for (n, part) in parts.iter().enumerate() {
                    store
                        .redo
                        .insert((n as u64).to_be_bytes(), encode_part(part))
                        .expect("insert");
                }
                if whole {
                    store
                        .redo
                        .insert(REDO_WHOLE, &(parts.len() as u64).to_be_bytes())
                        .expect("insert");
                    store.apply(parts[0]).expect("apply");
                }
                store.db.flush().expect("flush");
            }
            let (store, loaded) = Store::open(dir.path()).expect("open again");
            let expected = if whole { n } else { 0 };
            assert_eq!(loaded.jobs.len() as u64, expected, "whole log: {whole}");
            assert_eq!(loaded.next_job_id, expected + 1, "whole log: {whole}");
            assert!(store.redo.is_empty());
        }
    }

    /// A part of a redo log whose last record lacks its last bytes.
    fn part_cut_short() -> Vec<u8> {
        let mut part = encode_part(&batch_of(2).entries);
        part.truncate(part.len() - 3);
        part
    }

    #[test]
    fn a_whole_redo_log_with_a_record_that_does_not_decode_names_the_file() {
        let dir = tempfile::tempdir().expect("a temp dir");
        {
            let (store, _) = Store::open(dir.path()).expect("open");
            let part = part_cut_short();
            let mut log = RedoWriter::create(&store.redo_path).expect("create");
            log.part(&part).expect("part");
            log.finish().expect("finish");
            store.meta.insert(META_REDO_LOG, &[]).expect("mark");
            store.db.flush().expect("flush");
        }
        let err = Store::open(dir.path())
            .err()
            .expect("a damaged log is refused")
            .to_string();
        assert!(
            err.contains("redo.log") && err.contains("part 0") && err.contains("cut short"),
            "{err}"
        );
    }

    #[test]
    fn a_damaged_redo_log_names_its_part() {
        let dir = tempfile::tempdir().expect("a temp dir");
        {
            let (store, _) = Store::open(dir.path()).expect("open");
            let part = part_cut_short();
            store.redo.insert(0u64.to_be_bytes(), part).expect("insert");
            store.redo.insert(REDO_WHOLE, &2u64.to_be_bytes()).expect("insert");
            store.db.flush().expect("flush");
        }
        let err = Store::open(dir.path())
            .err()
            .expect("a damaged log is refused")
            .to_string();
        assert!(err.contains("redo") && err.contains("cut short"), "{err}");
    }
}
