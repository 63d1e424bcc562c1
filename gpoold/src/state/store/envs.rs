//! Environments, each stored once. A job's entry in `envs` is a reference
//! to its environment's set in `env_sets`, which every job with the same
//! environment shares (the jobs of one shell, a CI script's batch). An entry
//! written before schema 5 holds the environment itself; both are read.
//!
//! A set is keyed by a hash of its content, moved on to the next free key
//! where another set holds that one; a write compares the content before it
//! refers to a set. Sets no entry refers to any more (their jobs sealed or
//! forgotten) are removed at open and after every `COLLECT_AFTER` new sets,
//! between two commits of the state task, the only writer of references.

use super::*;
use std::collections::{HashMap, HashSet};
use std::hash::Hasher;
use std::sync::{Mutex, PoisonError};

type Env = Arc<[(String, String)]>;

/// The first byte of a reference (an environment's own value starts with
/// `RECORD_VERSION`), followed by the set's key.
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

/// The value of an `envs` entry that refers to set `key`.
pub(super) fn reference(key: u64) -> Vec<u8> {
    let mut value = Vec::with_capacity(9);
    value.push(REFERENCE);
    value.extend_from_slice(&key.to_be_bytes());
    value
}

/// The set an `envs` value refers to; `None` for an environment itself.
fn referred(value: &[u8]) -> Option<u64> {
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
            if !known.keys.contains(&key) {
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

    /// Removes the sets no entry of `envs` refers to, once enough were
    /// added; returns how many. Only between commits: a commit under way
    /// may refer to a set sled does not show a reference to yet.
    pub(super) fn collect_if_due(&self, envs: &sled::Tree) -> Result<usize, Error> {
        if self.known().added < COLLECT_AFTER {
            return Ok(0);
        }
        let mut used = HashSet::new();
        for entry in envs.iter() {
            let (_, value) = entry?;
            used.extend(referred(&value));
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

    /// Gives the loaded `jobs` (sorted by id) their environments: from one
    /// pass over `envs`, in id order as `jobs` is (a lookup per job costs
    /// several times more), then from the history files. Removes the sets
    /// no entry refers to.
    pub(super) fn load(&self, envs: &sled::Tree, files: &Archive, jobs: &mut [Job]) -> Result<(), Error> {
        let mut shared = SharedEnvs::default();
        let mut used = HashSet::new();
        let mut found = vec![false; jobs.len()];
        let mut known = self.known();
        // The last job given an environment: its spec as decoded, the
        // environment, and its spec with it.
        let mut last: Option<(Arc<gpool_core::model::JobSpec>, Env, Arc<gpool_core::model::JobSpec>)> = None;
        for entry in envs.iter() {
            let (key, value) = entry?;
            let set = referred(&value);
            used.extend(set);
            let id = <[u8; 8]>::try_from(key.as_ref()).map(u64::from_be_bytes);
            let Some(at) = id
                .ok()
                .and_then(|id| jobs.binary_search_by_key(&id, |job| job.id.0).ok())
            else {
                continue;
            };
            let env = shared.get(&key, value, |raw| resolve(&self.tree, &key, raw))?;
            if let Some(set) = set.filter(|set| !known.keys.contains(set)) {
                known.by_env.insert(env.clone(), set);
                known.keys.insert(set);
            }
            found[at] = true;
            // Alike jobs (a batch's) share one spec, compared while it is
            // at hand and before it has its environment (whose pointer is
            // compared instead): the state's pass then compares pointers.
            match &last {
                Some((bare, last_env, spec)) if Arc::ptr_eq(last_env, &env) && *bare == jobs[at].spec => {
                    jobs[at].spec = spec.clone();
                }
                _ => {
                    let bare = jobs[at].spec.clone();
                    Arc::make_mut(&mut jobs[at].spec).env = env.clone();
                    last = Some((bare, env, jobs[at].spec.clone()));
                }
            }
        }
        drop(known);
        // A job read from a history file has its environment there; a job
        // submitted with no environment has none anywhere.
        for (job, found) in jobs.iter_mut().zip(found) {
            let key = job.id.0.to_be_bytes();
            if let (false, Some(value)) = (found, files.get(&key)?.and_then(|record| record.extra)) {
                Arc::make_mut(&mut job.spec).env = shared.get(&key, value.into(), Ok)?;
            }
        }
        let n_removed = self.keep_only(&used)?;
        if n_removed > 0 {
            tracing::info!("{n_removed} environment sets no job refers to removed");
        }
        Ok(())
    }
}

/// The environments decoded so far, by stored value, so that jobs from one
/// shell share one.
#[derive(Default)]
struct SharedEnvs {
    decoded: HashMap<sled::IVec, Env>,
    /// Such jobs mostly come one after another: the last one is tried
    /// first, which costs a compare instead of a hash.
    last: Option<(sled::IVec, Env)>,
}

impl SharedEnvs {
    /// The environment stored as `value` (`resolve`d the first time).
    fn get(
        &mut self,
        key: &[u8],
        value: sled::IVec,
        resolve: impl FnOnce(sled::IVec) -> Result<sled::IVec, Error>,
    ) -> Result<Env, Error> {
        if let Some((raw, env)) = &self.last {
            if *raw == value {
                return Ok(env.clone());
            }
        }
        let env = match self.decoded.get(&value) {
            Some(env) => env.clone(),
            None => {
                let env: Vec<(String, String)> = decode("envs", key, &resolve(value.clone())?)?;
                let env: Env = env.into();
                self.decoded.insert(value.clone(), env.clone());
                env
            }
        };
        self.last = Some((value, env.clone()));
        Ok(env)
    }
}
