//! The sled database: trees, record encoding, schema version, loading.
//!
//! Keys are big-endian so iteration follows id order. Values are a one-byte
//! record version followed by the record as JSON. Only the state task writes.

use crate::error::Error;
use gpool_core::accounting::AttemptRecord;
use gpool_core::auth::token::TokenRecord;
use gpool_core::model::{Job, Node};
use gpool_core::policy::Ledger;
use gpool_core::Timestamp;
use serde::de::DeserializeOwned;
use serde::Serialize;
use sled::Transactional;
use std::collections::BTreeMap;
use std::path::Path;

/// Schema of the whole database; a change migrates in `open`.
pub const SCHEMA_VERSION: u32 = 1;
const RECORD_VERSION: u8 = 1;
const META_SCHEMA: &[u8] = b"schema_version";
const META_NEXT_JOB_ID: &[u8] = b"next_job_id";
const META_NEXT_EPOCH: &[u8] = b"next_epoch";

pub struct Store {
    db: sled::Db,
    jobs: sled::Tree,
    nodes: sled::Tree,
    meta: sled::Tree,
    /// Each team's usage ledger, by team name.
    usage: sled::Tree,
    /// User token records (keyed hashes, never tokens), by token id.
    tokens: sled::Tree,
    /// Accounting: one record per ended attempt, by end time and epoch
    /// (`attempt_key`); appended, never changed, removed past retention.
    attempts: sled::Tree,
}

/// What `Store::open` found on disk.
pub struct Loaded {
    pub jobs: Vec<Job>,
    pub nodes: Vec<Node>,
    pub next_job_id: u64,
    pub next_epoch: u64,
    pub usage: BTreeMap<String, Ledger>,
    pub tokens: BTreeMap<u64, TokenRecord>,
}

impl Store {
    pub fn open(dir: &Path) -> Result<(Store, Loaded), Error> {
        let db = sled::Config::new()
            .path(dir.join("db"))
            // Reads are served from memory; sled's cache only helps loading.
            .cache_capacity(1024 * 1024)
            // Only the flusher makes writes durable, so an acknowledgement
            // never leans on a background flush.
            .flush_every_ms(None)
            .open()?;
        let store = Store {
            jobs: db.open_tree("jobs")?,
            nodes: db.open_tree("nodes")?,
            meta: db.open_tree("meta")?,
            usage: db.open_tree("usage")?,
            tokens: db.open_tree("tokens")?,
            attempts: db.open_tree("attempts")?,
            db,
        };
        // A tree later issues fill; opened now so the layout is fixed from v1.
        store.db.open_tree("events")?;
        store.check_schema()?;
        let loaded = store.load()?;
        Ok((store, loaded))
    }

    fn check_schema(&self) -> Result<(), Error> {
        match self.meta.get(META_SCHEMA)? {
            None => {
                self.meta.insert(META_SCHEMA, &SCHEMA_VERSION.to_be_bytes())?;
                self.db.flush()?;
                Ok(())
            }
            Some(raw) => {
                let found = u32::from_be_bytes(raw.as_ref().try_into().map_err(|_| Error::CorruptRecord {
                    tree: "meta",
                    key: "schema_version".into(),
                    reason: format!("{} bytes, expected 4", raw.len()),
                })?);
                if found > SCHEMA_VERSION {
                    return Err(Error::SchemaTooNew {
                        found,
                        supported: SCHEMA_VERSION,
                    });
                }
                Ok(())
            }
        }
    }

    fn load(&self) -> Result<Loaded, Error> {
        let jobs: Vec<Job> = self
            .jobs
            .iter()
            .map(|entry| {
                let (key, value) = entry?;
                decode("jobs", &key, &value)
            })
            .collect::<Result<_, Error>>()?;
        let nodes: Vec<Node> = self
            .nodes
            .iter()
            .map(|entry| {
                let (key, value) = entry?;
                decode("nodes", &key, &value)
            })
            .collect::<Result<_, Error>>()?;
        // Past every id used, an array's reserved task ids included.
        let after_last = jobs
            .iter()
            .map(|job| job.id.0 + 1 + job.spec.array.as_ref().map_or(0, |array| u64::from(array.len())))
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
            nodes,
            next_job_id,
            next_epoch,
            usage,
            tokens,
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

    /// Writes every record of one state-task batch in one sled transaction:
    /// after a crash either all of them are on disk or none (a batch of
    /// submitted jobs is whole or absent).
    pub fn commit(&self, records: &Records) -> Result<(), Error> {
        if records.entries.is_empty() {
            return Ok(());
        }
        let trees: [&sled::Tree; 6] = [
            &self.jobs,
            &self.nodes,
            &self.meta,
            &self.usage,
            &self.tokens,
            &self.attempts,
        ];
        trees[..]
            .transaction(|views| {
                for (tree, key, value) in &records.entries {
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

    /// A handle for the flusher thread.
    pub fn db(&self) -> sled::Db {
        self.db.clone()
    }

    /// A handle on the accounting records, for reports.
    pub fn accounting(&self) -> Accounting {
        Accounting(self.attempts.clone())
    }
}

/// The accounting records on disk. Reports read them here, not from the
/// state: they are never held in memory as a whole.
#[derive(Clone)]
pub struct Accounting(sled::Tree);

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
        for entry in self.0.range(attempt_key(since, gpool_core::Epoch(0)).to_vec()..) {
            let (key, value) = entry?;
            let record: AttemptRecord = decode("attempts", &key, &value)?;
            if record.started_at < until && keep(&record) {
                found.push(record);
            }
        }
        Ok(found)
    }

    /// Removes the records of attempts that ended before `before`; returns
    /// how many.
    pub fn remove_ended_before(&self, before: Timestamp) -> Result<usize, Error> {
        let mut batch = sled::Batch::default();
        let mut n = 0;
        for key in self
            .0
            .range(..attempt_key(before, gpool_core::Epoch(0)).to_vec())
            .keys()
        {
            batch.remove(key?);
            n += 1;
        }
        self.0.apply_batch(batch)?;
        Ok(n)
    }
}

/// An accounting record's key: its end time (ms, big-endian) and epoch,
/// so records are in end order and a window is one range.
fn attempt_key(ended_at: Timestamp, epoch: gpool_core::Epoch) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&(ended_at.0.max(0) as u64).to_be_bytes());
    key[8..].copy_from_slice(&epoch.0.to_be_bytes());
    key
}

/// Which tree a record goes to (the order of the trees in `Store::commit`).
#[derive(Clone, Copy)]
enum TreeId {
    Jobs = 0,
    Nodes = 1,
    Meta = 2,
    Usage = 3,
    Tokens = 4,
    Attempts = 5,
}

/// Encoded records waiting for `Store::commit`.
#[derive(Default)]
pub struct Records {
    /// Tree, key, and the value (none: remove the key).
    entries: Vec<(TreeId, Vec<u8>, Option<Vec<u8>>)>,
}

impl Records {
    pub fn job(&mut self, job: &Job) {
        self.entries
            .push((TreeId::Jobs, job.id.0.to_be_bytes().to_vec(), Some(encode(job))));
    }

    pub fn node(&mut self, node: &Node) {
        self.entries
            .push((TreeId::Nodes, node.name.as_bytes().to_vec(), Some(encode(node))));
    }

    /// Removes an ended job (past its retention).
    pub fn remove_job(&mut self, id: gpool_core::JobId) {
        self.entries.push((TreeId::Jobs, id.0.to_be_bytes().to_vec(), None));
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
