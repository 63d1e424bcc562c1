//! `WatchJobs`: the jobs a caller names, then each change of those not
//! ended, until they end. Bounded per caller: at most `MAX_WATCHES_PER_USER`
//! streams at once, each of at most `MAX_IDS_PER_REQUEST` ids; the first
//! reads go a chunk at a time on a blocking thread (an ended job may be
//! read from disk), never on the threads that answer requests; after that
//! each change costs one lookup.

use super::jobs::{check_id_count, is_finished};
use super::{JobStream, PoolService};
use crate::api::job_wire::job_wire;
use gpool_core::auth::Caller;
use gpool_core::JobId;
use gpool_proto::pb;
use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use tonic::{Response, Status};

/// Watch streams one user may have open at once.
pub const MAX_WATCHES_PER_USER: usize = 16;
/// Jobs read under one read lock, on a blocking thread, at a watch's start.
const READ_CHUNK: usize = 256;

/// Open watch streams, by user.
#[derive(Default)]
pub struct Watches(Mutex<HashMap<String, usize>>);

/// One open watch of a user: counted until dropped.
struct Open {
    watches: Arc<Watches>,
    user: String,
}

impl Watches {
    fn open(self: &Arc<Self>, user: &str) -> Result<Open, Status> {
        let mut counts = self.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = counts.entry(user.to_string()).or_default();
        if *count >= MAX_WATCHES_PER_USER {
            return Err(Status::resource_exhausted(format!(
                "user {user} has {MAX_WATCHES_PER_USER} watches of jobs open (gpool wait, gpool logs -f...); \
                 at most {MAX_WATCHES_PER_USER} at once: end one, or watch more jobs in one"
            )));
        }
        *count += 1;
        Ok(Open {
            watches: self.clone(),
            user: user.to_string(),
        })
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        let mut counts = self.watches.0.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = counts.get_mut(&self.user) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.user);
            }
        }
    }
}

impl PoolService {
    pub(super) fn watch(&self, caller: Caller, request: &pb::WatchJobsRequest) -> Result<Response<JobStream>, Status> {
        check_id_count(request.ids.len())?;
        let open = self.watches.open(&caller.user)?;
        // Subscribed before the first read, so no change falls between.
        let mut changes = self.state.job_changes.subscribe();
        // Each job once, however often it is named.
        let ids: Vec<JobId> = request
            .ids
            .iter()
            .copied()
            .collect::<BTreeSet<u64>>()
            .into_iter()
            .map(JobId)
            .collect();
        // An id never given out is refused at once, without a look.
        let next_id = self
            .state
            .shared
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .next_job_id();
        if let Some(unknown) = ids.iter().find(|id| id.0 >= next_id) {
            return Err(crate::error::Error::UnknownJob(*unknown).into());
        }
        // Boxed: a channel holds room for 32 of its messages from the
        // start, and a watcher waits long (a `gpool wait` on a day's job).
        let (sender, receiver) = tokio::sync::mpsc::channel::<Box<Result<pb::Job, Status>>>(128);
        let service = self.clone();
        tokio::spawn(async move {
            let _open = open;
            let mut unfinished = BTreeSet::new();
            for chunk in ids.chunks(READ_CHUNK) {
                let (reader, chunk, caller) = (service.clone(), chunk.to_vec(), caller.clone());
                let Ok(read) = tokio::task::spawn_blocking(move || reader.read_jobs(&chunk, &caller)).await else {
                    return;
                };
                for (id, job) in read {
                    if job.as_ref().is_ok_and(|job| !is_finished(job)) {
                        unfinished.insert(id);
                    }
                    let failed = job.is_err();
                    if sender.send(Box::new(job)).await.is_err() || failed {
                        return;
                    }
                }
            }
            while !unfinished.is_empty() {
                let changed: Vec<JobId> = tokio::select! {
                    () = sender.closed() => return,
                    change = changes.recv() => match change {
                        Ok(id) if unfinished.contains(&id) => vec![id],
                        Ok(_) => continue,
                        // Missed changes: send each unfinished job again.
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => unfinished.iter().copied().collect(),
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                    },
                };
                for id in changed {
                    let job = service.job(id, &caller, false);
                    if job.as_ref().map_or(true, is_finished) {
                        unfinished.remove(&id);
                    }
                    if sender.send(Box::new(job)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::StreamExt::map(
            tokio_stream::wrappers::ReceiverStream::new(receiver),
            |job| *job,
        ))))
    }

    /// `ids` as `caller` may see them, under one read lock.
    fn read_jobs(&self, ids: &[JobId], caller: &Caller) -> Vec<(JobId, Result<pb::Job, Status>)> {
        let state = self
            .state
            .shared
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        ids.iter()
            .map(|id| {
                let found = state
                    .find_job(*id)
                    .map_err(Status::from)
                    .and_then(|found| found.ok_or_else(|| Status::from(crate::error::Error::UnknownJob(*id))));
                (*id, found.map(|job| job_wire(&state, &job, caller, false)))
            })
            .collect()
    }
}
