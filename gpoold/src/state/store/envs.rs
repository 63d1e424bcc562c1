//! Environments, each stored once. A job's record refers to its
//! environment's set in `env_sets` (`encode_job`), which every job with the
//! same environment shares (the jobs of one shell, a CI script's batch).
//! Before schema 6 the reference, or the environment itself before schema
//! 5, was a job's entry in `envs`; the migration moves it into the record.
//!
//! A set is keyed by a hash of its content, moved on to the next free key
//! where another set holds that one; a write compares the content before it
//! refers to a set. Sets no record refers to any more (their jobs sealed or
//! forgotten) are removed at the first commit after open and after every
//! `COLLECT_AFTER` new sets, between two commits of the state task, the
//! only writer of references.

use super::*;
use std::collections::{HashMap, HashSet};
use std::hash::Hasher;
use std::sync::{Mutex, PoisonError};

pub(super) type Env = Arc<[(String, String)]>;

/// The first byte of a reference in `envs` before schema 6 (an
/// environment's own value starts with `RECORD_VERSION`), followed by the
/// set's key.
const REFERENCE: u8 = b'@';
/// New sets after which the unused ones are removed.
pub(super) const COLLECT_AFTER: usize = 256;

/// `env_sets`, with the sets this gpoold knows to be there.
pub(super) struct EnvSets {
    pub(super) tree: sled::Tree,
    known: Mutex<Known>,
}

/// The sets a write may refer to without looking at sled, by content.
#[derive(Default)]
struct Known {
    by_env: HashMap<Env, u64>,
    keys: HashSet<u64>,
    /// The last environment asked for, held so that its address stays its
    /// own: a batch's jobs share one, found by pointer, not by hash.
    last: Option<(Env, u64)>,
    /// Sets added since the last collection.
    added: usize,
}

/// The set an `envs` value refers to; `None` for an environment itself.
pub(super) fn referred(value: &[u8]) -> Option<u64> {
    match value {
        [REFERENCE, key @ ..] => Some(u64::from_be_bytes(key.try_into().ok()?)),
        _ => None,
    }
}

/// The environment an `envs` entry of job `job_key` stands for, encoded:
/// the value itself, or the set it refers to.
pub(super) fn resolve(sets: &sled::Tree, job_key: &[u8], value: sled::IVec) -> Result<sled::IVec, Error> {
    let Some(key) = referred(&value) else {
        return Ok(value);
    };
    sets.get(key.to_be_bytes())?.ok_or_else(|| Error::CorruptRecord {
        tree: "envs",
        key: key_text(job_key),
        reason: format!("it refers to environment set {key:016x}, which is not in env_sets"),
    })
}

/// Where the set of an encoded environment is looked for first.
pub(super) fn content_key(encoded: &[u8]) -> u64 {
    // A fixed-key SipHash: the same content gets the same key across
    // restarts (a Rust release that changed it would only share less).
    let mut hasher = std::hash::DefaultHasher::new();
    hasher.write(encoded);
    hasher.finish()
}

impl EnvSets {
    pub(super) fn new(tree: sled::Tree) -> EnvSets {
        EnvSets {
            tree,
            known: Mutex::default(),
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The key of `env`'s set, and whether this write adds it (the set's
    /// record is then pushed on `entries`).
    pub(super) fn key_for(&self, env: &Env, entries: &mut Vec<Entry>) -> Result<(u64, bool), Error> {
        let mut known = self.known();
        if let Some((last, key)) = &known.last {
            if Arc::ptr_eq(last, env) {
                return Ok((*key, false));
            }
        }
        if let Some(key) = known.by_env.get(env).copied() {
            known.last = Some((env.clone(), key));
            return Ok((key, false));
        }
        let encoded = encode(env);
        let mut key = content_key(&encoded);
        let added = loop {
            // A key known for another content is taken; sled has the rest.
            if key != NO_ENV_SET && !known.keys.contains(&key) {
                match self.tree.get(key.to_be_bytes())? {
                    None => {
                        entries.push((TreeId::EnvSets, key.to_be_bytes().to_vec(), Some(encoded)));
                        break true;
                    }
                    Some(stored) if stored == encoded => break false,
                    Some(_) => {}
                }
            }
            key = key.wrapping_add(1);
        };
        known.by_env.insert(env.clone(), key);
        known.keys.insert(key);
        known.last = Some((env.clone(), key));
        known.added += usize::from(added);
        Ok((key, added))
    }

    /// Forgets the sets a commit that failed would have added.
    pub(super) fn forget(&self, envs: &[Env]) {
        let mut known = self.known();
        for env in envs {
            if let Some(key) = known.by_env.remove(env) {
                known.keys.remove(&key);
            }
        }
        known.last = None;
    }

    /// Removes the sets no job record (in `trees`) refers to, once enough
    /// were added; returns how many. Only between commits: a commit under
    /// way may refer to a set sled does not show a reference to yet.
    pub(super) fn collect_if_due(&self, trees: [&sled::Tree; 2]) -> Result<usize, Error> {
        if self.known().added < COLLECT_AFTER {
            return Ok(0);
        }
        let mut used = HashSet::new();
        for tree in trees {
            for entry in tree.iter() {
                let (_, value) = entry?;
                used.extend(env_set_of(&value));
            }
        }
        self.keep_only(&used)
    }

    /// Removes every set but `used`, from sled and from what is known.
    fn keep_only(&self, used: &HashSet<u64>) -> Result<usize, Error> {
        // Forgotten first: a removal that fails half way leaves sets in
        // sled that no write takes for known, never the other way round.
        let mut known = self.known();
        known.by_env.retain(|_, key| used.contains(key));
        known.keys.retain(|key| used.contains(key));
        known.last = None;
        known.added = 0;
        let mut n_removed = 0;
        for entry in self.tree.iter() {
            let (key, _) = entry?;
            let unused = <[u8; 8]>::try_from(key.as_ref()).is_ok_and(|raw| !used.contains(&u64::from_be_bytes(raw)));
            if unused {
                self.tree.remove(&key)?;
                n_removed += 1;
            }
        }
        Ok(n_removed)
    }

    /// What gives loaded jobs their environments.
    pub(super) fn loader(&self) -> EnvLoader<'_> {
        EnvLoader {
            sets: self,
            decoded: HashMap::new(),
            last_filed: None,
            last: None,
        }
    }

    /// Makes the next commit collect the unused sets: those the jobs of an
    /// earlier run left are removed once per run, however few it adds.
    pub(super) fn collect_at_next_commit(&self) {
        self.known().added = COLLECT_AFTER;
    }
}

/// Gives loaded jobs their environments, each set decoded once and made
/// known to writes.
pub(super) struct EnvLoader<'a> {
    sets: &'a EnvSets,
    decoded: HashMap<u64, Env>,
    /// The last environment read from a history file, as stored: an
    /// array's ended tasks share one.
    last_filed: Option<(Vec<u8>, Env)>,
    /// The last job given an environment: its spec as decoded, the
    /// environment, and its spec with it.
    last: Option<(Arc<gpool_core::model::JobSpec>, Env, Arc<gpool_core::model::JobSpec>)>,
}

impl EnvLoader<'_> {
    /// `job`, read from `value` under `key`, with its environment. Alike
    /// jobs (a batch's) share one spec, compared while it is at hand and
    /// before it has its environment (whose pointer is compared instead):
    /// the state's pass then compares pointers.
    pub(super) fn give(&mut self, tree: &'static str, mut job: Job, key: &[u8], value: &[u8]) -> Result<Job, Error> {
        let Some(set) = env_set_of(value) else {
            return Ok(job);
        };
        let env = match self.decoded.get(&set) {
            Some(env) => env.clone(),
            None => self.read_set(tree, key, set)?,
        };
        match &self.last {
            Some((bare, last_env, spec)) if Arc::ptr_eq(last_env, &env) && *bare == job.spec => {
                job.spec = spec.clone();
            }
            _ => {
                let bare = job.spec.clone();
                Arc::make_mut(&mut job.spec).env = env.clone();
                self.last = Some((bare, env, job.spec.clone()));
            }
        }
        Ok(job)
    }

    /// Ended `job` (from `ended.needed_by`) with its environment: the set
    /// its record in sled refers to, or the one its history file holds.
    pub(super) fn give_ended(&mut self, mut job: Job, ended: &EndedJobs) -> Result<Job, Error> {
        let key = job.id.0.to_be_bytes();
        if let Some(record) = ended.jobs.get(key)? {
            return self.give("ended", job, &key, &record);
        }
        let Some(filed) = ended.files.get(&key)?.and_then(|record| record.extra) else {
            return Ok(job);
        };
        let env = match &self.last_filed {
            Some((last, env)) if *last == filed => env.clone(),
            _ => {
                let env: Vec<(String, String)> = decode("history", &key, &filed)?;
                let env: Env = env.into();
                self.last_filed = Some((filed, env.clone()));
                env
            }
        };
        Arc::make_mut(&mut job.spec).env = env;
        Ok(job)
    }

    fn read_set(&mut self, tree: &'static str, key: &[u8], set: u64) -> Result<Env, Error> {
        let encoded = set_value(&self.sets.tree, tree, key, set)?;
        let env: Vec<(String, String)> = decode("env_sets", &set.to_be_bytes(), &encoded)?;
        let env: Env = env.into();
        let mut known = self.sets.known();
        known.by_env.insert(env.clone(), set);
        known.keys.insert(set);
        self.decoded.insert(set, env.clone());
        Ok(env)
    }
}

/// The environment set `set` as stored, which job `key` of `tree` refers
/// to.
pub(super) fn set_value(sets: &sled::Tree, tree: &'static str, key: &[u8], set: u64) -> Result<sled::IVec, Error> {
    sets.get(set.to_be_bytes())?.ok_or_else(|| Error::CorruptRecord {
        tree,
        key: key_text(key),
        reason: format!("it refers to environment set {set:016x}, which is not in env_sets"),
    })
}
