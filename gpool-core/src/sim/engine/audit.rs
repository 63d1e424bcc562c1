//! The checks every replay makes, release builds included, and what it
//! records for `--jobs-out` and `--events-out`. Each start is checked
//! against the cluster as it is: its nodes and GPUs exist, no GPU is held
//! by two attempts (who holds each GPU is kept apart from the scheduler's
//! own `busy` flags), and every GPU is of a model its job allows. Each
//! plan is checked against `sched::invariants`.

use super::*;
use crate::sim::outcome::{AttemptRecord, EndState, EventKind, EventRecord, ShapeCount};
use std::collections::BTreeMap;

/// Who holds each GPU, and the records of a replay where they are asked for.
#[derive(Default)]
pub(super) struct Audit {
    /// By (node index, GPU index).
    holders: HashMap<(usize, u32), JobId>,
    /// Attempts each job started, by job index.
    n_attempts: Vec<u32>,
    record: bool,
    /// The running attempt of each job.
    open: HashMap<JobId, AttemptRecord>,
    attempts: Vec<AttemptRecord>,
    events: Vec<EventRecord>,
}

impl Audit {
    pub(super) fn new(n_jobs: usize, record: bool) -> Audit {
        Audit {
            n_attempts: vec![0; n_jobs],
            record,
            ..Audit::default()
        }
    }
}

/// `4 GPU(s) x 2 node(s) of a100|h100`.
fn shape_words(job: &PendingJob) -> String {
    let models = if job.shape.gpu_types.is_empty() {
        "any model".to_string()
    } else {
        job.shape
            .gpu_types
            .iter()
            .map(|model| model.as_str())
            .collect::<Vec<_>>()
            .join("|")
    };
    format!(
        "{} GPU(s) x {} node(s) of {models}",
        job.shape.gpus_per_node, job.shape.nodes
    )
}

impl Sim<'_> {
    /// Checks `start` of `job` against the cluster before it runs, and
    /// notes who holds its GPUs.
    pub(super) fn check_placement(&mut self, job: &PendingJob, start: &Start) {
        let mut broken = Vec::new();
        for part in &start.placement {
            let Some(node_idx) = self.node_index.get(&part.node).copied() else {
                broken.push(format!("j{} starts on unknown node {}", job.id, part.node));
                continue;
            };
            let node = &self.view.nodes[node_idx];
            for gpu_idx in &part.gpu_indices {
                let Some(gpu) = node.gpus.iter().find(|gpu| gpu.index == *gpu_idx) else {
                    broken.push(format!(
                        "j{} starts on {}[{gpu_idx}], which does not exist",
                        job.id, node.name
                    ));
                    continue;
                };
                if !gpu.model.accepted_by(&job.shape.gpu_types) {
                    broken.push(format!(
                        "j{} runs on {}[{gpu_idx}], a {}, which it does not allow ({})",
                        job.id,
                        node.name,
                        gpu.model.as_str(),
                        shape_words(job)
                    ));
                }
                // A shared GPU holds fractions of several jobs.
                let holder = start
                    .share
                    .is_none()
                    .then(|| self.audit.holders.insert((node_idx, *gpu_idx), job.id));
                if let Some(other) = holder.flatten() {
                    broken.push(format!("{}[{gpu_idx}] is held by j{other} and j{}", node.name, job.id));
                }
            }
        }
        for words in broken {
            self.out.broke(self.now, words);
        }
    }

    /// The GPUs `running` held are nobody's now; its record ends.
    pub(super) fn release(&mut self, running: &RunningJob, state: EndState) {
        for part in &running.placement {
            if let Some(node_idx) = self.node_index.get(&part.node).copied() {
                for gpu_idx in &part.gpu_indices {
                    if self.audit.holders.get(&(node_idx, *gpu_idx)) == Some(&running.id) {
                        self.audit.holders.remove(&(node_idx, *gpu_idx));
                    }
                }
            }
        }
        if let Some(mut record) = self.audit.open.remove(&running.id) {
            record.end = Some(self.now);
            record.end_state = state;
            record.preempted_for = running
                .preempted_for
                .filter(|_| state == EndState::Preempted)
                .map(|id| id.0);
            self.audit.attempts.push(record);
        }
    }

    /// A new attempt of `job` runs as `running`.
    pub(super) fn opened(&mut self, job: &PendingJob, running: &RunningJob) {
        let index = job.id.0 as usize - 1;
        self.audit.n_attempts[index] += 1;
        if !self.audit.record {
            return;
        }
        let mut models: Vec<String> = Vec::new();
        for part in &running.placement {
            let node = self.node_index.get(&part.node).map(|i| &self.view.nodes[*i]);
            for gpu in node.iter().flat_map(|node| node.gpus.iter()) {
                if part.gpu_indices.contains(&gpu.index) && !models.iter().any(|m| m == gpu.model.as_str()) {
                    models.push(gpu.model.as_str().to_string());
                }
            }
        }
        let record = AttemptRecord {
            job: job.id.0,
            attempt: self.audit.n_attempts[index],
            team: job.shape.team.to_string(),
            submit: self.jobs[index].submit,
            start: Some(self.now),
            end: None,
            placement: running
                .placement
                .iter()
                .map(|part| (part.node.clone(), part.gpu_indices.clone()))
                .collect(),
            gpu_models: models,
            gpus: running.gpus(),
            end_state: EndState::Running,
            preempted_for: None,
        };
        self.audit.open.insert(job.id, record);
    }

    /// A preemption (`for_job`, `lost_gpu_secs`) or a rescind of `victim`, with why.
    pub(super) fn note_event(&mut self, kind: EventKind, victim: &RunningJob, for_job: JobId, reason: String) {
        if !self.audit.record {
            return;
        }
        self.audit.events.push(EventRecord {
            at: self.now,
            kind,
            job: victim.id.0,
            attempt: self.audit.n_attempts[victim.id.0 as usize - 1],
            for_job: for_job.0,
            reason,
        });
    }

    /// Why `victim` is preempted for `for_job`.
    pub(super) fn preemption_reason(&self, victim: &RunningJob, preemption: &Preemption) -> String {
        let sharing = &self.setup.policy.sharing;
        let claimant = &self.jobs[preemption.for_job.0 as usize - 1];
        let qos_of = |name: &str| sharing.qos(name);
        let (victim_qos, claimant_qos) = (qos_of(&victim.qos), qos_of(&claimant.qos));
        let lower = victim_qos.map_or(0, |q| q.priority) < claimant_qos.map_or(0, |q| q.priority);
        let what = if claimant_qos.is_some_and(|q| q.preempt_lower) && lower {
            format!(
                "runs in QoS {}, below j{}'s {}, which preempts lower classes",
                victim_qos.map_or("-", |q| q.name.as_str()),
                preemption.for_job,
                claimant_qos.map_or("-", |q| q.name.as_str())
            )
        } else {
            format!("runs as burst work of team {}, beyond its guarantee", victim.team)
        };
        format!(
            "j{} (team {}) waits for {} GPU(s); j{} {what}; {:.0} GPU-seconds since its last checkpoint",
            preemption.for_job,
            claimant.team,
            claimant.total_gpus(),
            victim.id,
            preemption.lost_gpu_secs
        )
    }

    /// Why `victim`'s preemption for `for_job` is withdrawn.
    pub(super) fn rescind_reason(&self, for_job: JobId, released: &[JobId]) -> String {
        if self.view.running.iter().any(|r| r.id == for_job) {
            format!("j{for_job}, which it was taken for, started on other GPUs that came free in its grace")
        } else if released.contains(&for_job) {
            format!("j{for_job}, which it was taken for, let go of its claims (it cannot start on what they free)")
        } else {
            format!("j{for_job}, which it was taken for, no longer waits")
        }
    }

    /// The records, each job that never started among them (where asked
    /// for), and the never-started jobs by shape, most first.
    pub(super) fn finish_records(&mut self) -> (Vec<AttemptRecord>, Vec<EventRecord>, Vec<ShapeCount>) {
        let mut by_shape: BTreeMap<String, usize> = BTreeMap::new();
        let mut never = Vec::new();
        for job in &self.view.pending {
            let index = job.id.0 as usize - 1;
            if self.audit.n_attempts[index] > 0 {
                continue;
            }
            *by_shape.entry(shape_words(job)).or_default() += 1;
            if self.audit.record {
                never.push(AttemptRecord {
                    job: job.id.0,
                    attempt: 0,
                    team: job.shape.team.to_string(),
                    submit: job.submitted_at,
                    start: None,
                    end: None,
                    placement: Vec::new(),
                    gpu_models: Vec::new(),
                    gpus: job.total_gpus(),
                    end_state: EndState::NeverStarted,
                    preempted_for: None,
                });
            }
        }
        let mut attempts = std::mem::take(&mut self.audit.attempts);
        let mut open: Vec<AttemptRecord> = self.audit.open.drain().map(|(_, record)| record).collect();
        open.sort_by_key(|record| record.job);
        attempts.extend(open);
        never.sort_by_key(|record| record.job);
        attempts.extend(never);
        let mut shapes: Vec<ShapeCount> = by_shape
            .into_iter()
            .map(|(shape, jobs)| ShapeCount { shape, jobs })
            .collect();
        shapes.sort_by(|a, b| b.jobs.cmp(&a.jobs).then(a.shape.cmp(&b.shape)));
        (attempts, std::mem::take(&mut self.audit.events), shapes)
    }
}

impl Sim<'_> {
    /// Moves the first GPU of `start` onto one the checks must refuse: on
    /// its node (else on any), a GPU that is taken, else one of a model the
    /// job does not allow. Tests only (`Options::corrupt_start`).
    pub(super) fn corrupt(&self, job: &PendingJob, start: &mut Start) {
        let wrong = |node: &crate::sched::NodeView| {
            let taken = node.gpus.iter().find(|gpu| gpu.busy);
            let other_model = node
                .gpus
                .iter()
                .find(|gpu| !gpu.model.accepted_by(&job.shape.gpu_types));
            taken.or(other_model).map(|gpu| (node.name.clone(), gpu.index))
        };
        let Some(part) = start.placement.first_mut() else {
            return;
        };
        let own = self
            .node_index
            .get(&part.node)
            .and_then(|i| wrong(&self.view.nodes[*i]));
        if let Some((node, gpu_idx)) = own.or_else(|| self.view.nodes.iter().find_map(wrong)) {
            part.node = node;
            if let Some(first) = part.gpu_indices.first_mut() {
                *first = gpu_idx;
            }
        }
    }
}
