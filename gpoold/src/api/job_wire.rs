//! Jobs as the wire shows them: what a caller may see of a job, and a
//! waiting job's reasons, hints, priority and estimated start.

use crate::state::words::Rendered;
use crate::state::State;
use gpool_core::auth::{authorize, Action, Caller};
use gpool_proto::convert::{job_to_wire, reason_to_wire};
use gpool_proto::pb;

/// A job as `caller` may see it: in full if they may read it, else as a
/// queue entry (no command, environment or workdir); a pending one with
/// the reasons, hints and priority of the latest scheduling cycle.
pub(crate) fn job_wire(state: &State, job: &gpool_core::Job, caller: &Caller, with_env: bool) -> pb::Job {
    joined(job_wire_apart(state, job, caller, with_env))
}

/// A job with the cycle's reasons after its own.
fn joined((mut wire, planned): (pb::Job, Option<&Rendered>)) -> pb::Job {
    wire.reasons.extend(
        planned
            .into_iter()
            .flat_map(|words| words.reasons())
            .map(reason_to_wire),
    );
    wire
}

/// `job_wire`, but for the reasons the latest cycle gave the job, which
/// come apart: jobs alike share them (`Rendered`), and a listing encodes
/// them once for all (`Rendered::encoded`).
pub(crate) fn job_wire_apart<'s>(
    state: &'s State,
    job: &gpool_core::Job,
    caller: &Caller,
    with_env: bool,
) -> (pb::Job, Option<&'s Rendered>) {
    let (mut wire, planned) = job_wire_in_full_apart(state, job, with_env);
    if authorize(caller, &Action::ReadJob(job.auth_ref())).is_err() {
        if let Some(spec) = wire.spec.as_mut() {
            spec.command.clear();
            spec.env.clear();
            spec.workdir.clear();
            spec.stdout_path.clear();
            spec.stderr_path.clear();
        }
        // A failed start's reason names the program and workdir.
        wire.end_reason.clear();
        wire.redacted = true;
    }
    (wire, planned)
}

pub(crate) fn job_wire_in_full(state: &State, job: &gpool_core::Job, with_env: bool) -> pb::Job {
    joined(job_wire_in_full_apart(state, job, with_env))
}

fn job_wire_in_full_apart<'s>(
    state: &'s State,
    job: &gpool_core::Job,
    with_env: bool,
) -> (pb::Job, Option<&'s Rendered>) {
    let (mut wire, planned) = job_wire_of_state(state, job, with_env);
    wire.array = state.array_info(job);
    // A job that named no class runs in the default one: it is shown so.
    let sharing = &state.policy.sharing;
    if let Some(spec) = wire.spec.as_mut().filter(|spec| spec.qos.is_empty()) {
        if let Some(class) = sharing.qos(&sharing.default_qos) {
            spec.qos.clone_from(&class.name);
        }
    }
    let (service, queue) = gpool_core::sched::las::standing(sharing.las.as_ref(), job, crate::wall_clock());
    wire.service_gpu_secs = service;
    wire.las_queue = queue.map(|queue| queue as u32);
    let attempt = state.attempt(job.id);
    wire.stragglers = attempt
        .into_iter()
        .flat_map(|attempt| &attempt.stragglers)
        .map(|straggler| pb::Straggler {
            node: straggler.gpu.node.clone(),
            index: straggler.gpu.index,
            utilization_pct: straggler.utilization_pct,
            median_pct: straggler.median_pct,
            since_ms: straggler.since.0,
        })
        .collect();
    // A running attempt's use so far counts with the ended ones'.
    if let Some(live) = attempt.map(|attempt| attempt.gpu_use).filter(|live| live.samples > 0) {
        let mut used = job.gpu_use.as_deref().copied().unwrap_or_default();
        used.merge(&live);
        wire.gpu_use = gpool_proto::convert::gpu_use_to_wire(&used);
    }
    (wire, planned)
}

/// The job with its reasons of its own; the cycle's come apart.
fn job_wire_of_state<'s>(state: &'s State, job: &gpool_core::Job, with_env: bool) -> (pb::Job, Option<&'s Rendered>) {
    let mut wire = job_to_wire(job, with_env);
    if job.state != gpool_core::JobState::Pending {
        return (wire, None);
    }
    use gpool_core::sched::gates::{Facts, Gate};
    use gpool_core::sched::Reason;
    let planned = state.words.reasons(job.id);
    let facts = Facts {
        begins: job
            .spec
            .begin
            .map(|begin| begin.at(job.submitted_at))
            .filter(|at| *at > crate::wall_clock()),
        dependency: match state.dependency_state_of(job) {
            gpool_core::deps::DepState::Waiting(reason) => Some(reason),
            _ => None,
        },
        held: job.held,
        array_limit: state.array_at_limit(job),
        planned: planned.is_some(),
    };
    // Reasons of its own (powering nodes up, a requeue), then a gate that
    // keeps it from the cycle; where there is none, what the cycle said of
    // it follows them (handed back apart).
    let gate = Gate::of(job, facts);
    let power = state.power.waiting_for(job.id, crate::wall_clock());
    wire.reasons = power
        .map(gpool_core::power::waiting_reason)
        .into_iter()
        .chain(Reason::requeued(job))
        .chain(gate.as_ref().map(Reason::of_gate))
        .map(|reason| reason_to_wire(&reason))
        .collect();
    let planned = planned.filter(|_| gate.is_none());
    let said = state.words.of(job.id);
    wire.priority = said.and_then(|said| said.priority).map(|p| pb::PriorityFactors {
        total: p.total,
        qos: p.qos,
        fair_share: p.fair_share,
        age: p.age,
        size: p.size,
        nice: p.nice,
    });
    wire.estimated_start_ms = state.words.estimated_start(job.id).map(|at| at.0);
    wire.queue_position = said.and_then(|said| said.position);
    (wire, planned)
}
