//! The state task's side of job arrays: an array is one record until its
//! tasks start (or are acted on alone); then each task is a job of its own
//! with the id reserved for it at submit.

use super::{Batch, State, Write};
use gpool_core::array::{task_id, task_ids, ArraySpec, ArrayTask};
use gpool_core::job_state::{JobEvent, JobState};
use gpool_core::model::Job;
use gpool_core::sched::{JobShape, PendingJob};
use gpool_core::{JobId, Timestamp};
use gpool_proto::pb;
use std::sync::Arc;

/// Most tasks of one array that are not jobs yet the scheduler sees in one
/// cycle (it starts at most as many as there are free GPUs anyway).
pub const ARRAY_VIEW_WINDOW: usize = 512;
/// Most such tasks of all arrays together in one cycle, shared out evenly
/// (but each array gets `ARRAY_VIEW_MIN`).
pub const ARRAY_VIEW_BUDGET: usize = 4096;
pub const ARRAY_VIEW_MIN: usize = 8;
/// Most ranges `array_info` lists of an array's waiting tasks.
const MAX_WAITING_RANGES: usize = 64;

impl State {
    /// The array whose reserved ids hold `id`, and the task's position.
    pub fn array_of(&self, id: JobId) -> Option<(JobId, u32)> {
        let (array, tasks) = self.arrays.range(..id).next_back()?;
        let position = id.0 - array.0 - 1;
        (position < u64::from(*tasks)).then_some((*array, position as u32))
    }

    /// Makes the task with id `id` a job of its own (pending), if it is a
    /// task of a pending array that is not one yet. True if `id` is a job
    /// afterwards.
    pub(super) fn materialize(&mut self, id: JobId, out: &mut Batch) -> bool {
        if self.jobs.contains_key(&id) {
            return true;
        }
        let Some((array_id, position)) = self.array_of(id) else {
            return false;
        };
        let Some(array) = self.jobs.get(&array_id).filter(|job| job.state == JobState::Pending) else {
            return false;
        };
        let Some(index) = array.spec.array.as_ref().and_then(|spec| spec.index_at(position)) else {
            return false;
        };
        let n_tasks = array.spec.array.as_ref().map_or(0, |spec| spec.len());
        let task = task_of(array, id, index);
        self.jobs.insert(id, Box::new(task));
        self.active.insert(id);
        self.count_dep_targets(id, true);
        self.refresh_waiting(id);
        // The lowest position whose task is not a job yet moves past those
        // that are.
        let mut next_position = self.jobs[&array_id].array.as_ref().map_or(0, |p| p.next_position);
        while next_position < n_tasks && self.jobs.contains_key(&task_id(array_id, next_position)) {
            next_position += 1;
        }
        if let Some(progress) = self.jobs.get_mut(&array_id).and_then(|array| array.array.as_mut()) {
            progress.materialized += 1;
            progress.next_position = next_position;
        }
        out.writes.push(Write::Job(id));
        out.writes.push(Write::Job(array_id));
        out.changed.push(id);
        true
    }

    /// An array task's state changed from `before`: keeps its array's
    /// counts, and ends the array when its last task ended.
    pub(super) fn array_task_changed(
        &mut self,
        id: JobId,
        task: ArrayTask,
        before: &JobState,
        now: Timestamp,
        out: &mut Batch,
    ) {
        let Some(after) = self.jobs.get(&id).map(|job| job.state.clone()) else {
            return;
        };
        let was_running = matches!(before, JobState::Running { .. });
        let is_running = matches!(after, JobState::Running { .. });
        match (was_running, is_running) {
            (false, true) => *self.array_running.entry(task.array).or_default() += 1,
            (true, false) => {
                if let Some(running) = self.array_running.get_mut(&task.array) {
                    *running = running.saturating_sub(1);
                }
            }
            _ => {}
        }
        let Some(array) = self.jobs.get_mut(&task.array) else {
            return;
        };
        let n_tasks = array.spec.array.as_ref().map_or(0, |spec| spec.len());
        let Some(progress) = array.array.as_mut() else {
            return;
        };
        let counted = progress.clone();
        if let (false, JobState::Running { started_at, .. }) = (was_running, &after) {
            progress.first_started_at.get_or_insert(*started_at);
        }
        if !before.is_finished() && after.is_finished() {
            progress.ended += 1;
            if !matches!(after, JobState::Completed { .. }) {
                progress.not_completed += 1;
            }
        }
        if *progress != counted {
            out.writes.push(Write::Job(task.array));
        }
        if array.state == JobState::Pending && progress.all_ended(n_tasks) {
            let event = JobEvent::ArrayEnded {
                tasks: n_tasks,
                not_completed: progress.not_completed,
                first_started_at: progress.first_started_at,
                now,
            };
            self.apply_event(task.array, &event, now, out);
            self.array_running.remove(&task.array);
        }
    }

    /// Tasks of `array` that are jobs, in index order.
    pub fn array_task_ids(&self, array: &Job) -> Vec<JobId> {
        let n_tasks = array.spec.array.as_ref().map_or(0, |spec| spec.len());
        self.jobs
            .range(task_ids(array.id, n_tasks))
            .map(|(id, _)| *id)
            .collect()
    }

    /// The scheduler's view of an array's tasks: its pending tasks that
    /// are jobs (`pending_tasks`), then tasks that are not jobs yet, within
    /// its `%N` and `window`.
    pub(super) fn array_view(
        &self,
        array: &Job,
        ready: bool,
        pending_tasks: Vec<Arc<PendingJob>>,
        window: usize,
        into: &mut Vec<Arc<PendingJob>>,
    ) {
        let Some(spec) = array.spec.array.as_ref() else {
            return;
        };
        let running = self.array_running.get(&array.id).copied().unwrap_or(0);
        let mut allowance = spec
            .max_parallel
            .map_or(usize::MAX, |max| max.saturating_sub(running) as usize);
        for task in pending_tasks.into_iter().take(allowance) {
            into.push(task);
            allowance -= 1;
        }
        if !ready || array.state != JobState::Pending {
            return;
        }
        let progress = array.array.as_ref().cloned().unwrap_or_default();
        let waiting = (progress.next_position..spec.len())
            .map(|position| task_id(array.id, position))
            .filter(|id| !self.jobs.contains_key(id))
            .take(allowance.min(window));
        // Its tasks have its shape (the array's own view has it).
        let shape = match self.waiting.get(&array.id) {
            Some(entry) => entry.view.shape.clone(),
            None => Arc::new(JobShape::of(&array.spec)),
        };
        for id in waiting {
            into.push(Arc::new(pending_view(id, array, shape.clone())));
        }
    }

    /// Whether another task of `array` may start (its `%N`).
    pub(super) fn array_may_start(&self, array: JobId) -> bool {
        let running = self.array_running.get(&array).copied().unwrap_or(0);
        self.jobs
            .get(&array)
            .and_then(|job| job.spec.array.as_ref())
            .and_then(|spec| spec.max_parallel)
            .is_none_or(|max| running < max)
    }

    /// For an array, or a pending task of one, whose %N tasks all run: the
    /// array and N.
    pub fn array_at_limit(&self, job: &Job) -> Option<(JobId, u32)> {
        let array = match job.array_task {
            Some(task) => task.array,
            None if job.array.is_some() => job.id,
            None => return None,
        };
        let max = self.jobs.get(&array)?.spec.array.as_ref()?.max_parallel?;
        let running = self.array_running.get(&array).copied().unwrap_or(0);
        (running >= max).then_some((array, max))
    }

    /// Where an array's tasks stand, as `gpool jobs` and `show` print it:
    /// its waiting tasks as ranges (the first `MAX_WAITING_RANGES`), found
    /// from its ranges and its tasks that are jobs, not task by task.
    pub fn array_info(&self, array: &Job) -> Option<pb::ArrayInfo> {
        let spec = array.spec.array.as_ref()?;
        let progress = array.array.clone().unwrap_or_default();
        let n_tasks = spec.len();
        let (mut waiting, mut pieces) = (0u32, Vec::new());
        if array.state == JobState::Pending && progress.next_position < n_tasks {
            // Positions from `next_position` on, less those that are jobs.
            let mut from = progress.next_position;
            let jobs = self
                .jobs
                .range(task_id(array.id, from)..=task_id(array.id, n_tasks - 1))
                .map(|(id, _)| (id.0 - array.id.0 - 1) as u32)
                .chain(std::iter::once(n_tasks));
            for taken in jobs {
                if taken > from {
                    waiting += taken - from;
                    if pieces.len() < MAX_WAITING_RANGES {
                        pieces.extend(spec.ranges_between(from, taken));
                    }
                }
                from = taken + 1;
            }
        }
        pieces.truncate(MAX_WAITING_RANGES);
        let waiting_indices = ArraySpec {
            ranges: pieces,
            max_parallel: None,
        };
        Some(pb::ArrayInfo {
            tasks: n_tasks,
            waiting_indices: if waiting_indices.ranges.is_empty() {
                String::new()
            } else {
                waiting_indices.to_string()
            },
            waiting,
            running: self.array_running.get(&array.id).copied().unwrap_or(0),
            ended: progress.ended,
            not_completed: progress.not_completed,
        })
    }

    /// A task that is not a job yet, as `gpool show` prints it.
    /// Of an array that ended (cancelled, or its dependency never met),
    /// it ended with it.
    pub fn virtual_task(&self, id: JobId) -> Option<Job> {
        let (array_id, _) = self.array_of(id)?;
        task_as_array_is(self.jobs.get(&array_id)?, id)
    }

    /// Counts of running tasks per array, from the jobs (at load).
    pub(super) fn count_running_tasks(&mut self) {
        self.array_running.clear();
        for job in self.jobs.values() {
            if let (Some(task), JobState::Running { .. }) = (job.array_task, &job.state) {
                *self.array_running.entry(task.array).or_default() += 1;
            }
        }
        self.arrays = self
            .jobs
            .values()
            .filter_map(|job| Some((job.id, job.spec.array.as_ref()?.len())))
            .collect();
    }
}

/// Task `id` of `array` while it is not a job: in the array's state.
pub(super) fn task_as_array_is(array: &Job, id: JobId) -> Option<Job> {
    let position = u32::try_from(id.0.checked_sub(array.id.0 + 1)?).ok()?;
    let index = array.spec.array.as_ref()?.index_at(position)?;
    let mut task = task_of(array, id, index);
    task.state = array.state.clone();
    Some(task)
}

/// The job a task of `array` becomes.
fn task_of(array: &Job, id: JobId, index: u32) -> Job {
    let mut spec = (*array.spec).clone();
    spec.array = None;
    Job {
        // A task that becomes a job while its array is held is held too.
        held: array.held,
        array_task: Some(ArrayTask { array: array.id, index }),
        ..Job::pending(id, Arc::new(spec), &array.user, array.submitted_at)
    }
}

/// A pending job as the scheduler sees it, of `shape` (its spec's).
pub fn pending_view(id: JobId, job: &Job, shape: Arc<JobShape>) -> PendingJob {
    PendingJob {
        id,
        submitted_at: job.submitted_at,
        shape,
        user: job.user.clone(),
        service_gpu_secs: job.service_gpu_secs,
        waiting_since: job.requeued_at.unwrap_or(job.submitted_at),
    }
}

impl State {
    /// An array waits for the reasons of its first task that is not a job
    /// yet (the scheduler saw that task, not the array).
    pub(super) fn lend_task_reasons_to_arrays(&mut self) {
        let mut lent: Vec<(JobId, JobId)> = self
            .words
            .ids()
            .filter(|id| !self.jobs.contains_key(id))
            .filter_map(|id| Some((self.array_of(id)?.0, id)))
            .collect();
        // The first task of each array (ids are in order already).
        lent.dedup_by_key(|(array, _)| *array);
        for (array, task) in lent {
            self.words.lend(array, task);
        }
    }
}
