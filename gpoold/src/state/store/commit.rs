//! Writing: the records a batch touched, as one sled transaction or, past
//! `MAX_AT_ONCE` entries, a redo log applied in parts; and the record codec.

use super::*;

/// Which tree a record goes to (the order of the trees in `Store::commit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TreeId {
    Jobs = 0,
    Nodes = 1,
    Meta = 2,
    Usage = 3,
    Tokens = 4,
    Attempts = 5,
    Ended = 6,
    EndedByTime = 7,
    Envs = 8,
    EnvSets = 9,
}

impl TreeId {
    pub(super) const ALL: [TreeId; 10] = [
        TreeId::Jobs,
        TreeId::Nodes,
        TreeId::Meta,
        TreeId::Usage,
        TreeId::Tokens,
        TreeId::Attempts,
        TreeId::Ended,
        TreeId::EndedByTime,
        TreeId::Envs,
        TreeId::EnvSets,
    ];
}

/// A tree, a key, and the value (none: remove the key).
pub(super) type Entry = (TreeId, Vec<u8>, Option<Vec<u8>>);

/// The most records one sled transaction writes.
pub(super) const MAX_AT_ONCE: usize = 1024;
/// The key of the redo log's mark that it is whole (its value: how many
/// parts); the parts' keys are their numbers, 8 bytes big-endian.
pub(super) const REDO_WHOLE: &[u8] = b"whole_log_mark";

/// A part of a redo log: for each entry, its tree (1 byte), its key and
/// its value, each as a 4-byte little-endian length and the bytes; a
/// removal has the length `u32::MAX` and no bytes.
pub(super) fn encode_part(entries: &[Entry]) -> Vec<u8> {
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

pub(super) fn decode_part(bytes: &[u8]) -> Result<Vec<Entry>, String> {
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
    pub(super) entries: Vec<Entry>,
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
    pub(super) store: &'a Store,
    pub records: Records,
    pub(super) log: Option<RedoWriter>,
    /// The environment sets this batch adds: forgotten unless it is
    /// written.
    pub(super) new_env_sets: Vec<std::sync::Arc<[(String, String)]>>,
    pub(super) written: bool,
}

impl Drop for Commit<'_> {
    fn drop(&mut self) {
        if !self.written {
            self.store.env_sets.forget(&self.new_env_sets);
        }
    }
}

impl Commit<'_> {
    /// A job's record, which refers to its environment's set (added where
    /// it is new).
    pub fn job(&mut self, job: &Job) -> Result<(), Error> {
        let env = &job.spec.env;
        let env_set = match env.is_empty() {
            true => NO_ENV_SET,
            false => {
                let (key, added) = self.store.env_sets.key_for(env, &mut self.records.entries)?;
                if added {
                    self.new_env_sets.push(env.clone());
                }
                key
            }
        };
        self.records.job(job, env_set);
        Ok(())
    }

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
    pub(super) fn spill(&mut self, n_entries: usize) -> Result<(), Error> {
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
            if !self.records.entries.is_empty() {
                self.store.apply(&self.records.entries)?;
            }
            self.written = true;
            return Ok(());
        }
        self.spill(self.records.entries.len())?;
        if let Some(log) = self.log.take() {
            log.finish()?;
        }
        self.store.apply_redo_log()?;
        self.written = true;
        Ok(())
    }
}

impl Records {
    /// A job's record, referring to environment set `env_set`: in `jobs`
    /// while it has not ended, then in `ended` (and its index).
    pub(super) fn job(&mut self, job: &Job, env_set: u64) {
        let key = job.id.0.to_be_bytes().to_vec();
        match job.state.ended_at() {
            None => self.entries.push((TreeId::Jobs, key, Some(encode_job(job, env_set)))),
            Some(ended_at) => {
                self.entries.push((
                    TreeId::EndedByTime,
                    time_key(ended_at, job.id.0).to_vec(),
                    Some(Vec::new()),
                ));
                self.entries
                    .push((TreeId::Ended, key.clone(), Some(encode_job(job, env_set))));
                self.entries.push((TreeId::Jobs, key, None));
            }
        }
    }

    pub fn node(&mut self, node: &Node) {
        self.entries
            .push((TreeId::Nodes, node.name.as_bytes().to_vec(), Some(encode(node))));
    }

    /// Removes an ended job (past its retention), which ended at
    /// `ended_at`.
    pub fn remove_job(&mut self, id: gpool_core::JobId, ended_at: Timestamp) {
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

    pub fn reservations(&mut self, reservations: &[gpool_core::sched::reservations::Reservation]) {
        self.entries.push((
            TreeId::Meta,
            super::META_RESERVATIONS.to_vec(),
            Some(encode(&reservations)),
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

pub(super) fn encode<T: Serialize>(record: &T) -> Vec<u8> {
    let mut bytes = vec![RECORD_VERSION];
    // Serializing plain structs of strings and numbers to a Vec cannot fail.
    serde_json::to_writer(&mut bytes, record).expect("records serialize to JSON");
    bytes
}

/// A job's record: `JOB_RECORD`, the key of its environment's set
/// (`NO_ENV_SET` for none), 8 bytes big-endian, then the job as JSON
/// without its environment.
pub(super) fn encode_job(job: &Job, env_set: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(512);
    bytes.push(JOB_RECORD);
    bytes.extend_from_slice(&env_set.to_be_bytes());
    serde_json::to_writer(&mut bytes, job).expect("records serialize to JSON");
    bytes
}

/// The environment set a job's record refers to: `None` for a job without
/// an environment, and for a record from before schema 6 (only in history
/// files since the migration: their environment is the file's).
pub(super) fn env_set_of(value: &[u8]) -> Option<u64> {
    match value {
        [JOB_RECORD, key @ ..] => {
            let key = u64::from_be_bytes(key.get(..8)?.try_into().ok()?);
            (key != NO_ENV_SET).then_some(key)
        }
        _ => None,
    }
}

pub(super) fn decode<T: DeserializeOwned>(tree: &'static str, key: &[u8], value: &[u8]) -> Result<T, Error> {
    let corrupt = |reason: String| Error::CorruptRecord {
        tree,
        key: key_text(key),
        reason,
    };
    match value.split_first() {
        Some((&RECORD_VERSION, json)) => serde_json::from_slice(json).map_err(|err| corrupt(err.to_string())),
        // The header is `env_set_of`'s to read.
        Some((&JOB_RECORD, rest)) => match rest.get(8..) {
            Some(json) => serde_json::from_slice(json).map_err(|err| corrupt(err.to_string())),
            None => Err(corrupt(format!("{} bytes, too short for a job record", value.len()))),
        },
        Some((version, _)) => Err(corrupt(format!("unknown record version {version}"))),
        None => Err(corrupt("empty record".into())),
    }
}

pub(super) fn key_text(key: &[u8]) -> String {
    match <[u8; 8]>::try_from(key) {
        Ok(id) => u64::from_be_bytes(id).to_string(),
        Err(_) => String::from_utf8_lossy(key).into_owned(),
    }
}
