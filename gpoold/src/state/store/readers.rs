//! Reading ended jobs and accounting records, from sled and then from the
//! history files, without holding them in memory.

use super::*;

/// The accounting records on disk, in sled and then in history files.
/// Reports read them here, not from the state: they are never held in
/// memory as a whole.
#[derive(Clone)]
pub struct Accounting {
    pub(super) tree: sled::Tree,
    pub(super) files: Arc<Archive>,
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
pub(super) fn attempt_key(ended_at: Timestamp, epoch: gpool_core::Epoch) -> [u8; 16] {
    time_key(ended_at, epoch.0)
}

/// A time (ms, big-endian) and then a number, so keys follow time.
pub(super) fn time_key(at: Timestamp, then: u64) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&(at.0.max(0) as u64).to_be_bytes());
    key[8..].copy_from_slice(&then.to_be_bytes());
    key
}

/// A `time_key`'s time and number.
pub(super) fn split_time_key(raw: [u8; 16]) -> (u64, u64) {
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
    pub(super) jobs: sled::Tree,
    pub(super) by_time: sled::Tree,
    pub(super) env_sets: sled::Tree,
    pub(super) files: Arc<Archive>,
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

    /// `job` as read from `ended`, with its environment: the set its
    /// record in sled refers to, or the one its history file holds.
    pub fn with_env(&self, mut job: Job) -> Result<Job, Error> {
        let key = job.id.0.to_be_bytes();
        let value = match self.jobs.get(key)? {
            Some(record) => self.record_env(&key, &record)?,
            None => self.files.get(&key)?.and_then(|record| record.extra),
        };
        if let Some(value) = value {
            let env: Vec<(String, String)> = decode("envs", &key, &value)?;
            std::sync::Arc::make_mut(&mut job.spec).env = env.into();
        }
        Ok(job)
    }

    /// The environment, as stored, of the set ended job `key`'s record in
    /// sled (`record`) refers to; none for a job without one.
    pub(super) fn record_env(&self, key: &[u8], record: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        let set = env_set_of(record).map(|set| set_value(&self.env_sets, "ended", key, set));
        Ok(set.transpose()?.map(|env| env.to_vec()))
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

    pub(super) fn last(&self) -> Result<Option<Job>, Error> {
        self.before(JobId(u64::MAX))
    }

    /// The ended jobs that `jobs` (jobs that have not ended) need: the
    /// targets of their dependencies, their arrays' ended tasks, and the
    /// ended arrays of their tasks.
    pub(super) fn needed_by(&self, jobs: &[Job]) -> Result<Vec<Job>, Error> {
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
