//! Ended jobs: they leave memory once their records are written, and are
//! read back from sled (`store::EndedJobs`) when asked for, so gpoold's
//! memory follows the jobs that have not ended, not the history.
//!
//! An ended job stays in memory while something that has not ended needs
//! it: a job that depends on it (`dep_targets`), or, for a task, its array
//! (which tells its done tasks from those that are not jobs yet by what is
//! in memory); an ended array stays while one of its tasks runs.

use super::{Batch, State, Write};
use crate::error::Error;
use gpool_core::array::task_ids;
use gpool_core::deps::DepTarget;
use gpool_core::model::Job;
use gpool_core::{JobId, Timestamp};
use std::borrow::Cow;

/// Distinct environments are looked at for ones no job shares any more
/// after this many jobs left memory.
const PRUNE_ENVS_EVERY: usize = 4096;

impl State {
    /// Job `id` wherever it is: in memory, ended on disk (without its
    /// environment), or a task of an array that is not a job yet (of an
    /// ended array: ended with it).
    pub fn find_job(&self, id: JobId) -> Result<Option<Cow<'_, Job>>, Error> {
        self.find(id, false)
    }

    /// As `find_job`, with the environment of a job read from disk.
    pub fn find_job_with_env(&self, id: JobId) -> Result<Option<Cow<'_, Job>>, Error> {
        self.find(id, true)
    }

    fn find(&self, id: JobId, with_env: bool) -> Result<Option<Cow<'_, Job>>, Error> {
        let from_disk = |job: Job| if with_env { self.ended.with_env(job) } else { Ok(job) };
        if let Some(job) = self.job(id) {
            return Ok(Some(Cow::Borrowed(job)));
        }
        if let Some(job) = self.ended.get(id)? {
            return Ok(Some(Cow::Owned(from_disk(job)?)));
        }
        if let Some(task) = self.virtual_task(id) {
            return Ok(Some(Cow::Owned(task)));
        }
        // A task of an array that ended and left memory before the task
        // became a job: the ended job just below it is the array, or
        // another of its tasks.
        let array = match self.ended.before(id)? {
            Some(below) => match below.array_task {
                Some(task) => self.ended.get(task.array)?,
                None => Some(below),
            },
            None => None,
        };
        // The task takes its array's spec, environment included.
        let array = array.map(from_disk).transpose()?;
        Ok(array
            .and_then(|array| super::arrays::task_as_array_is(&array, id))
            .map(Cow::Owned))
    }

    /// Job `id`'s state, for a reply about it (none where it cannot be
    /// read).
    pub(super) fn state_of(&self, id: JobId) -> Option<gpool_core::JobState> {
        match self.find_job(id) {
            Ok(found) => found.map(|job| job.state.clone()),
            Err(err) => {
                tracing::warn!(job = %id, "cannot read its record: {err}");
                None
            }
        }
    }

    /// Every job from id `first` on, in id order: those in memory merged
    /// with the ended ones on disk.
    pub fn jobs_from(&self, first: JobId) -> impl Iterator<Item = Result<Cow<'_, Job>, Error>> + '_ {
        let mut memory = self.jobs.range(first..).map(|(_, job)| job.as_ref()).peekable();
        let mut disk = self.ended.from(first).peekable();
        std::iter::from_fn(move || {
            let on_disk = match disk.peek() {
                Some(Ok(job)) => Some(job.id),
                Some(Err(_)) => return disk.next().map(|err| err.map(Cow::Owned)),
                None => None,
            };
            match (memory.peek().map(|job| job.id), on_disk) {
                (None, None) => None,
                (Some(in_memory), Some(on_disk)) if on_disk < in_memory => disk.next().map(|job| job.map(Cow::Owned)),
                (Some(in_memory), on_disk) => {
                    // Written and not yet evicted: the one in memory.
                    if on_disk == Some(in_memory) {
                        disk.next();
                    }
                    memory.next().map(|job| Ok(Cow::Borrowed(job)))
                }
                (None, Some(_)) => disk.next().map(|job| job.map(Cow::Owned)),
            }
        })
    }

    /// True if job `id` is in memory, bringing it back from disk if it
    /// ended and left (a new dependency on it needs it at hand).
    pub(super) fn bring_back(&mut self, id: JobId) -> Result<bool, Error> {
        if self.jobs.contains_key(&id) {
            return Ok(true);
        }
        let Some(job) = self.ended.get(id)? else {
            return Ok(false);
        };
        // `gpool show` takes it from memory while it is here.
        let mut job = self.ended.with_env(job)?;
        let env = self.intern_env(&job.spec.env);
        std::sync::Arc::make_mut(&mut job.spec).env = env;
        self.jobs.insert(id, Box::new(job));
        self.to_evict.push(id);
        Ok(true)
    }

    /// Counts job `id`'s dependency targets as needed (`held`) or not any
    /// more; a target no longer needed may leave memory.
    pub(super) fn count_dep_targets(&mut self, id: JobId, held: bool) {
        let Some(job) = self.jobs.get(&id) else { return };
        for dependency in &job.spec.dependencies {
            let DepTarget::Job(target) = dependency.target else {
                continue;
            };
            if held {
                *self.dep_targets.entry(target).or_default() += 1;
            } else if let Some(count) = self.dep_targets.get_mut(&target) {
                *count -= 1;
                if *count == 0 {
                    self.dep_targets.remove(&target);
                    self.to_evict.push(target);
                }
            }
        }
    }

    /// Job `id` just ended: it, and its array if that ended earlier, may
    /// leave memory once written.
    pub(super) fn ended_now(&mut self, id: JobId) {
        self.count_dep_targets(id, false);
        self.to_evict.push(id);
        if let Some(task) = self.jobs.get(&id).and_then(|job| job.array_task) {
            if !self.active.contains(&task.array) {
                self.to_evict.push(task.array);
            }
        }
    }

    /// Drops from memory the ended jobs nothing needs any more; called once
    /// their records are written (a reader finds each job in memory until
    /// then, and in the store after).
    pub fn evict_ended(&mut self) {
        let candidates = std::mem::take(&mut self.to_evict);
        let mut n_evicted = 0;
        for id in candidates {
            if !self.may_leave(id) {
                continue;
            }
            let Some(job) = self.jobs.remove(&id) else { continue };
            n_evicted += 1;
            self.arrays.remove(&id);
            // An array takes its ended tasks with it.
            for task in self.array_task_ids(&job) {
                if self.may_leave(task) {
                    self.jobs.remove(&task);
                    n_evicted += 1;
                }
            }
        }
        self.evicted_since_prune += n_evicted;
        if self.evicted_since_prune >= PRUNE_ENVS_EVERY {
            self.evicted_since_prune = 0;
            self.envs.retain(|env| std::sync::Arc::strong_count(env) > 1);
        }
    }

    /// Whether job `id` is in memory, ended, and needed by nothing that
    /// has not ended.
    fn may_leave(&self, id: JobId) -> bool {
        let Some(job) = self.jobs.get(&id) else {
            return false;
        };
        if !job.state.is_finished() || self.dep_targets.contains_key(&id) {
            return false;
        }
        if job.array_task.is_some_and(|task| self.active.contains(&task.array)) {
            return false;
        }
        // An array whose tasks all ended (none, for a job that is no array).
        let n_tasks = job.spec.array.as_ref().map_or(0, |spec| spec.len());
        self.active.range(task_ids(id, n_tasks)).next().is_none()
    }

    /// Removes the ended jobs that ended before `before` from disk, but
    /// not those something that has not ended still needs (they are in
    /// memory): from sled one by one, and a history file once all its jobs
    /// ended before and none is needed. Returns how many.
    pub(super) fn forget_ended_before(&mut self, before: Timestamp, out: &mut Batch) -> Result<usize, Error> {
        let old = self.ended.ended_before(before)?;
        let mut n_removed = 0;
        for (id, ended_at) in old {
            if self.jobs.contains_key(&id) {
                continue;
            }
            out.writes.push(Write::ForgetJob(id, ended_at));
            n_removed += 1;
        }
        // Under the state's write lock: no listing of ended jobs (they run
        // under its read lock) is under way, so the removal waits for none.
        let held = |ids| {
            self.jobs
                .range(ids)
                .filter(|(_, job)| job.state.is_finished())
                .map(|(id, _)| *id)
                .collect()
        };
        let in_files = self.ended.remove_files_before(before, held)?;
        Ok(n_removed + in_files as usize)
    }
}
