//! The only place where wire types (`pb`) and gpool-core types meet.

use crate::pb;
use gpool_core::array::{ArraySpec, IndexRange};
use gpool_core::deps::{DepKind, DepTarget, Dependency};
use gpool_core::job_state::JobState;
use gpool_core::model::{GpuModel, Job, JobSpec, NodePlacement, NvlinkNeed, Requirements};
use std::collections::BTreeMap;

pub use crate::states::{is_ended, state_from_name, state_name, state_to_wire};

pub fn spec_to_wire(spec: &JobSpec) -> pb::JobSpec {
    spec_to_wire_with(spec, true)
}

/// As `spec_to_wire`; without its environment unless `with_env` (listings
/// leave it out).
/// A submit request of `specs`, each converted and encoded in turn (a
/// batch is never held converted and encoded at once).
pub fn submit_request<'a>(specs: impl IntoIterator<Item = &'a JobSpec>) -> pb::SubmitJobsRequest {
    pb::SubmitJobsRequest {
        specs: specs
            .into_iter()
            .map(|spec| prost::Message::encode_to_vec(&spec_to_wire(spec)).into())
            .collect(),
    }
}

pub fn spec_to_wire_with(spec: &JobSpec, with_env: bool) -> pb::JobSpec {
    pb::JobSpec {
        name: spec.name.clone(),
        command: spec.command.clone(),
        gpus: spec.gpus_per_node,
        nodes: spec.nodes,
        gpu_types: spec.gpu_types.iter().map(|m| m.as_str().to_string()).collect(),
        team: spec.team.to_string(),
        project: spec.project.clone(),
        workload_type: spec.workload_type.clone(),
        time_limit: spec.time_limit_secs.map(|seconds| pb::Duration { seconds }),
        env: if with_env { env_to_wire(&spec.env) } else { Vec::new() },
        workdir: spec.workdir.clone(),
        priority: spec.priority,
        pool: spec.pool.to_string(),
        no_requeue: !spec.requeue,
        discard_output: spec.discard_output,
        qos: spec.qos.to_string(),
        checkpoint_signal: spec.checkpoint_signal.unwrap_or(0),
        grace: spec.grace_secs.map(|seconds| pb::Duration { seconds }),
        image: spec.image.clone(),
        mem_bytes: spec.mem_bytes.unwrap_or(0),
        max_output_bytes: spec.max_output_bytes.unwrap_or(0),
        script: spec.script.as_ref().map(|script| pb::BatchScript {
            text: script.text.clone(),
            at: script.at,
        }),
        reservation: spec.reservation.clone(),
        begin_at_ms: match spec.begin {
            Some(gpool_core::model::Begin::At(at)) => at.0,
            _ => 0,
        },
        begin_after_secs: match spec.begin {
            Some(gpool_core::model::Begin::AfterSecs(secs)) => secs,
            _ => 0,
        },
        begin_now: spec.begin == Some(gpool_core::model::Begin::AfterSecs(0)),
        notify: spec.notify.as_ref().map(|notify| pb::Notify {
            to: notify.to.clone(),
            on_start: notify.on_start,
            on_end: notify.on_end,
            on_fail: notify.on_fail,
        }),
        cpus_per_gpu: spec.cpus_per_gpu.unwrap_or(0),
        dependencies: spec.dependencies.iter().map(dependency_to_wire).collect(),
        singleton: spec.singleton,
        exclusive: spec.exclusive,
        hold: spec.hold,
        tasks_per_node: spec.tasks_per_node,
        pty: spec.pty.map(|size| pb::TerminalSize {
            rows: size.rows.into(),
            cols: size.cols.into(),
        }),
        array: spec.array.as_ref().map(|array| pb::ArraySpec {
            ranges: array
                .ranges
                .iter()
                .map(|range| pb::IndexRange {
                    start: range.start,
                    end: range.end,
                    step: range.step,
                })
                .collect(),
            max_parallel: array.max_parallel.unwrap_or(0),
        }),
        stdout_path: spec.stdout_path.clone(),
        stderr_path: spec.stderr_path.clone(),
        min_gpu_memory_mib: spec.requires.min_gpu_memory_mib,
        gpu_mem_mib: spec.gpu_share.map_or(0, |ask| ask.memory_mib),
        gpu_fraction_milli: spec.gpu_share.map_or(0, |ask| ask.fraction_milli),
        gpu_compute_pct: spec.gpu_share.map_or(0, |ask| u32::from(ask.compute_pct)),
        nvlink: match spec.requires.nvlink {
            NvlinkNeed::Any => String::new(),
            need => need.as_str().to_string(),
        },
        constraints: labels_to_wire(&spec.requires.constraints),
        nodelist: spec.requires.nodelist.clone(),
        exclude: spec.requires.exclude.clone(),
    }
}

fn dependency_to_wire(dependency: &Dependency) -> pb::Dependency {
    let (job_id, in_request) = match dependency.target {
        DepTarget::Job(id) => (id.0, 0),
        DepTarget::InRequest(position) => (0, position as u32),
    };
    pb::Dependency {
        kind: match dependency.kind {
            DepKind::AfterOk => pb::DependencyKind::AfterOk,
            DepKind::AfterAny => pb::DependencyKind::AfterAny,
            DepKind::AfterNotOk => pb::DependencyKind::AfterNotOk,
        }
        .into(),
        job_id,
        in_request,
    }
}

fn dependency_from_wire(dependency: &pb::Dependency) -> Dependency {
    Dependency {
        kind: match dependency.kind() {
            pb::DependencyKind::AfterOk => DepKind::AfterOk,
            pb::DependencyKind::AfterAny => DepKind::AfterAny,
            pb::DependencyKind::AfterNotOk => DepKind::AfterNotOk,
        },
        target: match dependency.job_id {
            0 => DepTarget::InRequest(dependency.in_request as usize),
            id => DepTarget::Job(gpool_core::JobId(id)),
        },
    }
}

/// A reservation to make, as `gpool reservation create` asks for it.
pub fn reservation_from_wire(request: pb::CreateReservationRequest) -> gpool_core::sched::reservations::Definition {
    let none_if_empty = |text: String| (!text.is_empty()).then_some(text);
    gpool_core::sched::reservations::Definition {
        name: request.name,
        nodes: request.nodes,
        start: request.start,
        duration: none_if_empty(request.duration),
        end: none_if_empty(request.end),
        users: request.users,
        teams: request.teams,
        gpus: request.gpus,
    }
}

pub fn env_to_wire(env: &[(String, String)]) -> Vec<pb::EnvVar> {
    env.iter()
        .map(|(name, value)| pb::EnvVar {
            name: name.clone(),
            value: value.clone(),
        })
        .collect()
}

pub fn labels_to_wire(labels: &BTreeMap<String, String>) -> Vec<pb::Label> {
    labels
        .iter()
        .map(|(key, value)| pb::Label {
            key: key.clone(),
            value: value.clone(),
        })
        .collect()
}

pub fn labels_from_wire(labels: Vec<pb::Label>) -> BTreeMap<String, String> {
    labels.into_iter().map(|label| (label.key, label.value)).collect()
}

/// Not validated here: the receiver calls `JobSpec::validate`.
pub fn spec_from_wire(spec: pb::JobSpec) -> JobSpec {
    let gpu_share = share_from_wire(&spec);
    JobSpec {
        name: spec.name,
        command: spec.command,
        gpus_per_node: spec.gpus,
        nodes: spec.nodes,
        gpu_types: spec.gpu_types.iter().map(|m| GpuModel::new(m)).collect(),
        team: spec.team.into(),
        project: spec.project,
        workload_type: spec.workload_type,
        time_limit_secs: spec.time_limit.map(|d| d.seconds),
        env: spec.env.into_iter().map(|var| (var.name, var.value)).collect(),
        workdir: spec.workdir,
        priority: spec.priority,
        pool: spec.pool.into(),
        requeue: !spec.no_requeue,
        discard_output: spec.discard_output,
        qos: spec.qos.into(),
        checkpoint_signal: (spec.checkpoint_signal != 0).then_some(spec.checkpoint_signal),
        grace_secs: spec.grace.map(|d| d.seconds),
        image: spec.image,
        mem_bytes: (spec.mem_bytes != 0).then_some(spec.mem_bytes),
        max_output_bytes: (spec.max_output_bytes != 0).then_some(spec.max_output_bytes),
        script: spec.script.map(|script| gpool_core::model::BatchScript {
            text: script.text,
            at: script.at,
        }),
        reservation: spec.reservation,
        begin: match (spec.begin_at_ms, spec.begin_after_secs, spec.begin_now) {
            (0, 0, false) => None,
            (0, secs, _) => Some(gpool_core::model::Begin::AfterSecs(secs)),
            (ms, _, _) => Some(gpool_core::model::Begin::At(gpool_core::Timestamp(ms))),
        },
        notify: spec.notify.map(|notify| gpool_core::model::Notify {
            to: notify.to,
            on_start: notify.on_start,
            on_end: notify.on_end,
            on_fail: notify.on_fail,
        }),
        cpus_per_gpu: (spec.cpus_per_gpu != 0).then_some(spec.cpus_per_gpu),
        dependencies: spec.dependencies.iter().map(dependency_from_wire).collect(),
        singleton: spec.singleton,
        exclusive: spec.exclusive,
        hold: spec.hold,
        tasks_per_node: spec.tasks_per_node,
        pty: spec.pty.map(|size| gpool_core::model::TerminalSize {
            rows: size.rows.clamp(1, u32::from(u16::MAX)) as u16,
            cols: size.cols.clamp(1, u32::from(u16::MAX)) as u16,
        }),
        array: spec.array.map(|array| {
            Box::new(ArraySpec {
                ranges: array
                    .ranges
                    .iter()
                    .map(|range| IndexRange {
                        start: range.start,
                        end: range.end,
                        step: range.step,
                    })
                    .collect(),
                max_parallel: (array.max_parallel != 0).then_some(array.max_parallel),
            })
        }),
        stdout_path: spec.stdout_path,
        stderr_path: spec.stderr_path,
        requires: Requirements {
            min_gpu_memory_mib: spec.min_gpu_memory_mib,
            nvlink: nvlink_from_wire(&spec.nvlink),
            constraints: labels_from_wire(spec.constraints),
            nodelist: spec.nodelist,
            exclude: spec.exclude,
        },
        gpu_share,
    }
}

/// An unknown word is kept as "required": the stricter reading.
fn nvlink_from_wire(word: &str) -> NvlinkNeed {
    match word {
        "" | "any" => NvlinkNeed::Any,
        "preferred" => NvlinkNeed::Preferred,
        _ => NvlinkNeed::Required,
    }
}

/// A fraction of one GPU, if the spec asks for one (a compute share alone
/// is kept, for validation to refuse).
fn share_from_wire(spec: &pb::JobSpec) -> Option<gpool_core::share::ShareAsk> {
    (spec.gpu_mem_mib != 0 || spec.gpu_fraction_milli != 0 || spec.gpu_compute_pct != 0).then(|| {
        gpool_core::share::ShareAsk {
            memory_mib: spec.gpu_mem_mib,
            fraction_milli: spec.gpu_fraction_milli,
            // Out of range reads as more than 100 (refused by validation).
            compute_pct: u8::try_from(spec.gpu_compute_pct).unwrap_or(u8::MAX),
        }
    })
}

fn placement_to_wire(placement: &[NodePlacement]) -> Vec<pb::Placement> {
    placement
        .iter()
        .map(|part| pb::Placement {
            node: part.node.clone(),
            gpu_indices: part.gpu_indices.clone(),
        })
        .collect()
}

/// Job `job` as its record has it, the spec without its environment unless
/// `with_env`: a waiting job's reasons, priority and place come from the
/// latest scheduling cycle, not the record, and are left for the caller.
pub fn job_to_wire(job: &Job, with_env: bool) -> pb::Job {
    let (burst, preempted_at_ms, last_checkpoint_at_ms) = running_to_wire(&job.state);
    let (exit_code, end_reason, epoch, placement, cancelled_by) = outcome_to_wire(&job.state);
    pb::Job {
        id: job.id.0,
        spec: Some(spec_to_wire_with(&job.spec, with_env)),
        user: job.user.to_string(),
        state: state_to_wire(&job.state).into(),
        submitted_at_ms: job.submitted_at.0,
        started_at_ms: job.state.started_at().map(|t| t.0),
        ended_at_ms: job.state.ended_at().map(|t| t.0),
        exit_code,
        end_reason,
        attempt: job.n_attempts,
        epoch,
        placement,
        cancelled_by,
        burst,
        n_preemptions: job.n_preemptions,
        lost_gpu_secs: job.lost_gpu_secs,
        service_gpu_secs: job.service_gpu_secs,
        las_queue: None,
        requeue_cause: job
            .requeue_cause
            .map_or_else(String::new, |cause| cause.as_str().to_string()),
        preempted_at_ms,
        last_checkpoint_at_ms,
        priority: None,
        estimated_start_ms: None,
        redacted: false,
        reasons: Vec::new(),
        last_nodes: job.last_nodes.to_vec(),
        array: None,
        array_job_id: job.array_task.map_or(0, |task| task.array.0),
        array_task_index: job.array_task.map(|task| task.index),
        queue_position: None,
        gpu_use: job.gpu_use.as_deref().and_then(gpu_use_to_wire),
        stragglers: Vec::new(),
        events: job
            .events
            .iter()
            .map(|event| pb::JobEventNote {
                at_ms: event.at.0,
                text: event.text.clone(),
            })
            .collect(),
    }
}

/// A running job's burst flag, preemption and last checkpoint times.
fn running_to_wire(state: &JobState) -> (bool, Option<i64>, Option<i64>) {
    match state {
        JobState::Running {
            burst,
            preempted_at,
            last_checkpoint_at,
            ..
        } => (*burst, preempted_at.map(|t| t.0), last_checkpoint_at.map(|t| t.0)),
        _ => (false, None, None),
    }
}

/// A job's exit code, end reason, epoch, placement and canceller.
fn outcome_to_wire(state: &JobState) -> (Option<i32>, String, u64, Vec<pb::Placement>, String) {
    match state {
        JobState::Pending => (None, String::new(), 0, Vec::new(), String::new()),
        JobState::Running { epoch, placement, .. } => (
            None,
            String::new(),
            epoch.0,
            placement_to_wire(placement),
            String::new(),
        ),
        JobState::Completed { .. } => (Some(0), String::new(), 0, Vec::new(), String::new()),
        JobState::Failed { exit_code, reason, .. } => (*exit_code, reason.clone(), 0, Vec::new(), String::new()),
        JobState::Cancelled { by, .. } => (None, format!("cancelled by {by}"), 0, Vec::new(), by.clone()),
        JobState::Timeout { .. } => (None, "its time limit ran out".to_string(), 0, Vec::new(), String::new()),
        JobState::NodeFail { .. } => (
            None,
            "its node was lost or drained at once, and it asked not to be requeued".to_string(),
            0,
            Vec::new(),
            String::new(),
        ),
        JobState::OutOfMemory { .. } => (
            None,
            "it ran out of memory: its memory limit's OOM killer ended it".to_string(),
            0,
            Vec::new(),
            String::new(),
        ),
    }
}

/// `None` before any sample.
pub fn gpu_use_to_wire(used: &gpool_core::model::GpuUse) -> Option<pb::GpuUse> {
    Some(pb::GpuUse {
        samples: used.samples,
        mean_utilization_pct: used.mean_utilization_pct()?,
        peak_utilization_pct: used.utilization_pct_peak,
        peak_memory_used_mib: used.memory_used_mib_peak,
    })
}

pub fn report_to_wire(report: &gpool_core::accounting::Report) -> pb::ReportResponse {
    pb::ReportResponse {
        since_ms: report.since.0,
        until_ms: report.until.0,
        by: report.by.iter().map(|d| d.name().to_string()).collect(),
        currency: report.currency.clone(),
        rows: report.rows.iter().map(report_row_to_wire).collect(),
        total: Some(report_row_to_wire(&report.total)),
    }
}

fn report_row_to_wire(row: &gpool_core::accounting::ReportRow) -> pb::ReportRow {
    pb::ReportRow {
        key: row.key.clone(),
        attempts: row.attempts,
        gpu_seconds: row.gpu_seconds,
        guaranteed_gpu_seconds: row.guaranteed_gpu_seconds,
        burst_gpu_seconds: row.burst_gpu_seconds,
        lost_gpu_seconds: row.lost_gpu_seconds,
        idle_gpu_seconds: row.idle_gpu_seconds,
        mean_utilization_pct: row.mean_utilization_pct,
        peak_memory_used_mib: row.peak_memory_used_mib,
        cost: row.cost,
        unpriced_gpu_seconds: row.unpriced_gpu_seconds,
    }
}

fn gpu_counts_to_wire(gpus: &BTreeMap<GpuModel, u32>) -> Vec<pb::GpuCount> {
    gpus.iter()
        .map(|(model, count)| pb::GpuCount {
            model: model.as_str().to_string(),
            count: *count,
        })
        .collect()
}

pub fn savings_to_wire(savings: &gpool_core::accounting::Savings) -> pb::SavingsResponse {
    pb::SavingsResponse {
        since_ms: savings.since.0,
        until_ms: savings.until.0,
        currency: savings.currency.clone(),
        percentile: savings.percentile,
        teams: savings
            .teams
            .iter()
            .map(|team| pb::TeamSavings {
                team: team.team.clone(),
                gpus: gpu_counts_to_wire(&team.gpus),
                used_gpu_seconds: team.used_gpu_seconds,
                dedicated_cost: team.dedicated_cost,
                dedicated_utilization: team.dedicated_utilization,
            })
            .collect(),
        dedicated_gpus: gpu_counts_to_wire(&savings.dedicated_gpus),
        dedicated_cost: savings.dedicated_cost,
        dedicated_utilization: savings.dedicated_utilization,
        pool_gpus: gpu_counts_to_wire(&savings.pool_gpus),
        pool_cost: savings.pool_cost,
        pool_utilization: savings.pool_utilization,
        used_gpu_seconds: savings.used_gpu_seconds,
        gpus_saved: savings.gpus_saved,
        cost_saved: savings.cost_saved,
    }
}

mod nodes;
pub use nodes::*;
mod reason;
pub use reason::reason_to_wire;

#[cfg(test)]
mod tests;
