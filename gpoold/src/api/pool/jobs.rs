//! Jobs for the Pool service: submitting, cancelling and updating them (and
//! what each id came to), and listing them a chunk at a time.

use super::{JobListStream, PoolService};
use crate::api::job_wire::{job_wire, job_wire_apart};
use crate::api::Identity;
use crate::error::Error;
use crate::state::{CancelMode, CancelOutcome, Command, JobUpdate, SharedState};
use gpool_core::auth::{authorize, Action, Caller};
use gpool_core::JobId;
use gpool_proto::convert::{spec_from_wire, state_to_wire};
use gpool_proto::pb;
use prost::Message;
use std::borrow::Cow;
use tonic::{Response, Status};

/// Jobs per ListJobs message, and most jobs looked at under one read lock.
const LIST_CHUNK: usize = 128;
const LIST_SCAN: usize = 8 * LIST_CHUNK;

/// The next chunk of jobs matching `filter` from `*next_id` on, encoded
/// here (`gpool_proto::listing`); advances `*next_id` and says whether
/// jobs remain to be looked at.
fn list_chunk(
    shared: &SharedState,
    caller: &Caller,
    filter: &pb::ListJobsRequest,
    next_id: &mut JobId,
) -> Result<(pb::ListJobsResponse, bool), Error> {
    let wanted_states: Vec<pb::JobState> = filter.states().collect();
    let state = shared.read().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut chunk = pb::ListJobsResponse::default();
    let (mut n_listed, mut n_scanned) = (0, 0);
    // Pending and running jobs only: the jobs that have not ended are
    // looked at, not the whole history (which is read from disk).
    let active_only = if wanted_states.is_empty() {
        !filter.all
    } else {
        wanted_states
            .iter()
            .all(|wanted| matches!(wanted, pb::JobState::Pending | pb::JobState::Running))
    };
    let jobs: Box<dyn Iterator<Item = Result<Cow<'_, gpool_core::Job>, Error>>> = if active_only {
        Box::new(state.active_jobs_from(*next_id).map(|job| Ok(Cow::Borrowed(job))))
    } else {
        Box::new(state.jobs_from(*next_id))
    };
    for job in jobs {
        let job = job?;
        *next_id = JobId(job.id.0 + 1);
        n_scanned += 1;
        let state_ok = if wanted_states.is_empty() {
            filter.all || !job.state.is_finished()
        } else {
            wanted_states.contains(&state_to_wire(&job.state))
        };
        if state_ok
            && (filter.team.is_empty() || job.spec.team == filter.team)
            && (filter.user.is_empty() || job.user == filter.user)
        {
            // A listing shows no environment: leaving it out keeps the
            // messages small (`gpool show` has it).
            let (wire, planned) = job_wire_apart(&state, &job, caller, false);
            chunk.push_encoded(&wire, planned.map_or(&[], |words| words.encoded()));
            n_listed += 1;
        }
        if n_listed == LIST_CHUNK || n_scanned == LIST_SCAN {
            return Ok((chunk, true));
        }
    }
    Ok((chunk, false))
}

impl PoolService {
    /// Job `id` as `caller` may see it, with its environment or not (a
    /// watch sends none, as a listing).
    pub(super) fn job(&self, id: JobId, caller: &Caller, with_env: bool) -> Result<pb::Job, Status> {
        let state = self
            .state
            .shared
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let found = if with_env {
            state.find_job_with_env(id)?
        } else {
            state.find_job(id)?
        };
        let job = found.ok_or(Error::UnknownJob(id))?;
        Ok(job_wire(&state, &job, caller, with_env))
    }

    /// `ids` split into those of jobs in memory (and tasks of arrays in
    /// memory), which the state task acts on, and the rest.
    fn split_live(&self, ids: &[JobId]) -> (Vec<JobId>, Vec<JobId>) {
        let state = self
            .state
            .shared
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        ids.iter()
            .partition(|id| state.job(**id).is_some() || state.virtual_task(**id).is_some())
    }

    /// What a cancel (hold, signal...) of `ids`, none of them a job in
    /// memory, comes to: unknown, refused, or ended already. Read a few at
    /// a time under the state's read lock, on a blocking thread; ids past
    /// the last one ever given out are unknown without a look.
    async fn outcomes_off_task(&self, ids: Vec<JobId>, caller: &Caller, mode: CancelMode) -> Vec<CancelOutcome> {
        const CHUNK: usize = 64;
        let mut outcomes = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(CHUNK) {
            let (shared, chunk, caller) = (self.state.shared.clone(), chunk.to_vec(), caller.clone());
            let looked_up = tokio::task::spawn_blocking(move || {
                let state = shared.read().unwrap_or_else(|poisoned| poisoned.into_inner());
                chunk
                    .into_iter()
                    .map(|id| ended_outcome(&state, id, &caller, mode))
                    .collect::<Vec<_>>()
            })
            .await;
            match looked_up {
                Ok(found) => outcomes.extend(found),
                Err(err) => tracing::warn!("looking up ended jobs: {err}"),
            }
        }
        outcomes
    }

    /// Submits `request`'s specs for `who` (`SubmitJobs`).
    pub(super) async fn submit(
        &self,
        who: &Identity,
        request: pb::SubmitJobsRequest,
    ) -> Result<Response<pb::SubmitJobsResponse>, Status> {
        let caller = who.caller.clone();
        // Decoded a spec at a time, from the request's own buffer; a spec
        // the same as the one before it (a file of alike jobs) is decoded,
        // checked and held once.
        let mut specs: Vec<std::sync::Arc<gpool_core::model::JobSpec>> = Vec::with_capacity(request.specs.len());
        let n_specs = request.specs.len();
        for (spec_idx, encoded) in request.specs.iter().enumerate() {
            if let Some(last) = specs
                .last()
                .filter(|_| spec_idx > 0 && request.specs[spec_idx - 1] == *encoded)
            {
                specs.push(last.clone());
                continue;
            }
            let spec = pb::JobSpec::decode(encoded.clone()).map_err(|err| Error::InvalidRequest {
                field: "specs",
                reason: format!("spec {} of {n_specs}: {err}", spec_idx + 1),
            })?;
            if !spec.nvlink.is_empty() && gpool_core::model::NvlinkNeed::parse(&spec.nvlink).is_err() {
                return Err(Error::InvalidRequest {
                    field: "nvlink",
                    reason: format!(
                        "spec {} of {n_specs}: {:?} is not required, preferred or any",
                        spec_idx + 1,
                        spec.nvlink
                    ),
                }
                .into());
            }
            specs.push(std::sync::Arc::new(spec_from_wire(spec)));
        }
        drop(request);
        let result = self
            .state
            .call(|reply| Command::Submit { caller, specs, reply })
            .await
            .map_err(Status::from);
        self.audit(who, "submit", "", false, &result);
        Ok(Response::new(pb::SubmitJobsResponse {
            ids: result?.into_iter().map(|id| id.0).collect(),
        }))
    }

    /// Cancels, signals, holds, releases or requeues jobs for `who`
    /// (`CancelJobs`).
    pub(super) async fn cancel(
        &self,
        who: &Identity,
        request: pb::CancelJobsRequest,
    ) -> Result<Response<pb::CancelJobsResponse>, Status> {
        let caller = who.caller.clone();
        if request.signal != 0 {
            gpool_core::spec::parse_signal(&request.signal.to_string()).map_err(|reason| Error::InvalidRequest {
                field: "signal",
                reason,
            })?;
        }
        let mode = match (request.signal, request.hold(), request.requeue) {
            (0, pb::HoldChange::None, false) if request.pending_only => CancelMode::CancelPending,
            (0, pb::HoldChange::None, false) => CancelMode::Cancel,
            (0, pb::HoldChange::Hold, false) => CancelMode::Hold(true),
            (0, pb::HoldChange::Release, false) => CancelMode::Hold(false),
            (0, pb::HoldChange::None, true) => CancelMode::Requeue,
            (signal, pb::HoldChange::None, false) => CancelMode::Signal(signal),
            _ => {
                return Err(Error::InvalidRequest {
                    field: "signal",
                    reason: "a request signals, holds, releases or requeues jobs, one of them".into(),
                }
                .into())
            }
        };
        let ids: Vec<JobId> = request.ids.into_iter().map(JobId).collect();
        check_id_count(ids.len())?;
        let object = ids.iter().map(|id| format!("job {id}")).collect::<Vec<_>>().join(" ");
        // Ids of jobs that ended and left memory, or never were, are
        // answered here, from disk, off the state task: only jobs in
        // memory go to it, so a long list of old ids never holds up
        // heartbeats or other requests.
        let (live, elsewhere) = self.split_live(&ids);
        let answered = self.outcomes_off_task(elsewhere, &caller, mode).await;
        let result = if live.is_empty() && !ids.is_empty() {
            Ok(Vec::new())
        } else {
            self.state
                .call(|reply| Command::Cancel {
                    caller,
                    ids: live,
                    mode,
                    reply,
                })
                .await
                .map_err(Status::from)
        };
        let result = result.map(|mut outcomes| {
            outcomes.extend(answered);
            let position: std::collections::HashMap<JobId, usize> =
                ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
            outcomes.sort_by_key(|outcome| position.get(&outcome.id).copied().unwrap_or(usize::MAX));
            outcomes
        });
        let action = match mode {
            CancelMode::Signal(_) => "signal",
            CancelMode::Hold(true) => "hold",
            CancelMode::Hold(false) => "release",
            CancelMode::Requeue => "requeue",
            CancelMode::Cancel | CancelMode::CancelPending => "cancel",
        };
        self.audit(who, action, &object, false, &result);
        let outcomes = result?;
        // Each refusal of one id is audited like a refused request.
        for outcome in outcomes.iter().filter(|o| matches!(o.refused, Some(Error::Denied(_)))) {
            let reason = outcome.refused.as_ref().map(ToString::to_string).unwrap_or_default();
            let refused: Result<(), Status> = Err(Status::permission_denied(reason));
            self.audit(who, action, &format!("job {}", outcome.id), false, &refused);
        }
        Ok(Response::new(outcomes_to_wire(outcomes)))
    }

    /// Changes pending jobs for `who` (`UpdateJobs`).
    pub(super) async fn update(
        &self,
        who: &Identity,
        request: pb::UpdateJobsRequest,
    ) -> Result<Response<pb::CancelJobsResponse>, Status> {
        let caller = who.caller.clone();
        let change = JobUpdate {
            time_limit_secs: request.time_limit.map(|limit| limit.seconds),
            priority: request.priority,
            max_parallel: request.max_parallel.map(|max| (max != 0).then_some(max)),
        };
        let ids: Vec<JobId> = request.ids.into_iter().map(JobId).collect();
        let object = ids.iter().map(|id| format!("job {id}")).collect::<Vec<_>>().join(" ");
        let result = self
            .state
            .call(|reply| Command::Update {
                caller,
                ids,
                change,
                reply,
            })
            .await
            .map_err(Status::from);
        self.audit(who, "update", &object, false, &result);
        let outcomes = result?;
        for outcome in outcomes.iter().filter(|o| matches!(o.refused, Some(Error::Denied(_)))) {
            let reason = outcome.refused.as_ref().map(ToString::to_string).unwrap_or_default();
            let refused: Result<(), Status> = Err(Status::permission_denied(reason));
            self.audit(who, "update", &format!("job {}", outcome.id), false, &refused);
        }
        Ok(Response::new(outcomes_to_wire(outcomes)))
    }

    /// The jobs matching `filter`, as `caller` may see them (`ListJobs`).
    pub(super) fn list(&self, caller: Caller, filter: pb::ListJobsRequest) -> Result<Response<JobListStream>, Status> {
        if let Some(bad) = filter.states.iter().find(|raw| pb::JobState::try_from(**raw).is_err()) {
            return Err(Error::InvalidRequest {
                field: "states",
                reason: format!("{bad} is not a job state"),
            }
            .into());
        }
        let shared = self.state.shared.clone();
        let (sender, receiver) = tokio::sync::mpsc::channel(2);
        // Chunks are built under short read locks, so a long listing neither
        // blocks the state task nor builds one huge message.
        tokio::spawn(async move {
            let mut next_id = JobId(0);
            loop {
                let (chunk, more) = match list_chunk(&shared, &caller, &filter, &mut next_id) {
                    Ok(found) => found,
                    Err(err) => {
                        drop(sender.send(Err(err.into())).await);
                        return;
                    }
                };
                if !chunk.encoded.is_empty() && sender.send(Ok(chunk)).await.is_err() {
                    return;
                }
                if !more {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(
            receiver,
        ))))
    }
}

/// Refuses a request naming more job ids than one may.
pub(super) fn check_id_count(n_ids: usize) -> Result<(), Status> {
    if n_ids > gpool_core::ids::MAX_IDS_PER_REQUEST {
        return Err(Error::InvalidRequest {
            field: "ids",
            reason: format!(
                "{n_ids} job ids in one request; at most {} (send the rest in further requests)",
                gpool_core::ids::MAX_IDS_PER_REQUEST
            ),
        }
        .into());
    }
    Ok(())
}

/// The outcome of cancelling (holding, signalling...) `id`, a job not in
/// memory: it never was, the caller may not touch it, or it ended.
fn ended_outcome(state: &crate::state::State, id: JobId, caller: &Caller, mode: CancelMode) -> CancelOutcome {
    let unknown = CancelOutcome {
        id,
        refused: Some(Error::UnknownJob(id)),
        ..CancelOutcome::default()
    };
    if id.0 >= state.next_job_id() {
        return unknown;
    }
    let job = match state.find_job(id) {
        Ok(Some(job)) => job,
        Ok(None) => return unknown,
        Err(err) => {
            return CancelOutcome {
                id,
                refused: Some(err),
                ..CancelOutcome::default()
            }
        }
    };
    let action = match mode {
        CancelMode::Signal(_) => Action::SignalJob(job.auth_ref()),
        _ => Action::CancelJob(job.auth_ref()),
    };
    CancelOutcome {
        id,
        state: Some(job.state.clone()),
        refused: authorize(caller, &action).err().map(Error::from),
        ..CancelOutcome::default()
    }
}

fn outcomes_to_wire(outcomes: Vec<CancelOutcome>) -> pb::CancelJobsResponse {
    let outcomes = outcomes
        .into_iter()
        .map(|o| pb::CancelOutcome {
            id: o.id.0,
            state: o.state.as_ref().map_or(pb::JobState::Unspecified, state_to_wire).into(),
            cancelled: o.cancelled,
            signalled: o.signalled,
            error: o.refused.map(|err| err.to_string()).unwrap_or_default(),
            held: o.held,
            requeued: o.requeued,
            updated: o.updated,
        })
        .collect();
    pb::CancelJobsResponse { outcomes }
}

pub(super) fn is_finished(job: &pb::Job) -> bool {
    gpool_proto::convert::is_ended(job.state())
}
