//! Reclaiming GPUs by preemption.
//!
//! A job that may preempt (guaranteed, or of a QoS that preempts lower
//! classes) and does not fit first counts on jobs already being preempted
//! whose GPUs nobody claimed yet; then picks new victims: burst jobs (or
//! jobs of a lower QoS), of the teams furthest over their fair share
//! first, each team's in order of least work lost (since the last
//! checkpoint), never one younger than its QoS `min_runtime`. Victims are
//! chosen only if the whole job (every node of a gang, one GPU model) then
//! fits, superfluous ones are given back, and the work lost stays within the
//! hour's waste budget.

use super::index::FreeIndex;
use super::{ClusterView, NodeView, PendingJob, Policy, Preemption, RunningJob};
use crate::ids::{JobId, Timestamp};
use crate::model::NodePlacement;
use std::collections::{BTreeMap, HashMap, HashSet};

pub(super) struct Reclaimer<'v> {
    view: &'v ClusterView,
    policy: &'v Policy,
    fair: &'v BTreeMap<String, f64>,
    now: Timestamp,
    /// The nodes with this cycle's starts marked busy.
    nodes: Vec<NodeView>,
    node_idx: HashMap<&'v str, usize>,
    /// Running jobs whose GPUs a waiting job already counts on.
    claimed: HashSet<JobId>,
    waste_budget: f64,
}

impl<'v> Reclaimer<'v> {
    pub(super) fn new(
        view: &'v ClusterView,
        policy: &'v Policy,
        fair: &'v BTreeMap<String, f64>,
        now: Timestamp,
    ) -> Reclaimer<'v> {
        Reclaimer {
            view,
            policy,
            fair,
            now,
            nodes: view.nodes.clone(),
            node_idx: view
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.name.as_str(), i))
                .collect(),
            claimed: HashSet::new(),
            waste_budget: view.waste_budget_gpu_secs,
        }
    }

    /// Records a start of this cycle.
    pub(super) fn taken(&mut self, placement: &[NodePlacement]) {
        self.set_busy(placement, true);
    }

    fn set_busy(&mut self, placement: &[NodePlacement], busy: bool) {
        for part in placement {
            if let Some(node_idx) = self.node_idx.get(part.node.as_str()) {
                for gpu in &mut self.nodes[*node_idx].gpus {
                    if part.gpu_indices.contains(&gpu.index) {
                        gpu.busy = busy;
                    }
                }
            }
        }
    }

    /// Finds the running jobs whose end lets `job` start, adds the new
    /// victims to `preemptions`, and returns how many jobs it waits for;
    /// `None` if no allowed set of victims makes it fit.
    pub(super) fn plan(
        &mut self,
        job: &PendingJob,
        guaranteed: bool,
        preemptions: &mut Vec<Preemption>,
    ) -> Option<usize> {
        let sharing = &self.policy.sharing;
        let ending: Vec<&'v RunningJob> = self
            .view
            .running
            .iter()
            .filter(|r| r.preempting && !self.claimed.contains(&r.id))
            .collect();
        if let Some(used) = self.fits(job, &ending) {
            self.claim(&used);
            return Some(used.len());
        }
        let job_qos = sharing.qos(&job.qos).map_or(0, |qos| qos.priority);
        let preempts_lower = sharing.qos(&job.qos).is_some_and(|qos| qos.preempt_lower);
        let mut candidates: Vec<&'v RunningJob> = self
            .view
            .running
            .iter()
            .filter(|r| !r.preempting && !self.claimed.contains(&r.id))
            .filter(|r| {
                let victim_qos = sharing.qos(&r.qos);
                let lower = victim_qos.map_or(0, |qos| qos.priority) < job_qos;
                let old_enough =
                    victim_qos.map_or(0, |qos| qos.min_runtime_secs) as i64 * 1000 <= self.now.0 - r.started_at.0;
                old_enough && ((guaranteed && r.burst) || (preempts_lower && lower))
            })
            .collect();
        // Furthest over its fair share (lowest factor) first, then least lost.
        candidates.sort_by(|a, b| {
            let factor = |r: &RunningJob| self.fair.get(&r.team).copied().unwrap_or(1.0);
            factor(a)
                .total_cmp(&factor(b))
                .then(a.lost_gpu_secs(self.now).total_cmp(&b.lost_gpu_secs(self.now)))
                .then(a.id.cmp(&b.id))
        });
        let mut chosen: Vec<&'v RunningJob> = Vec::new();
        let mut fitted = None;
        for candidate in candidates {
            chosen.push(candidate);
            let freed: Vec<&RunningJob> = ending.iter().chain(&chosen).copied().collect();
            if let Some(used) = self.fits(job, &freed) {
                fitted = Some(used);
                break;
            }
        }
        let mut used = fitted?;
        // Give back victims the job turned out not to need, costliest first.
        let mut by_cost: Vec<usize> = (0..chosen.len()).collect();
        by_cost.sort_by(|a, b| {
            chosen[*b]
                .lost_gpu_secs(self.now)
                .total_cmp(&chosen[*a].lost_gpu_secs(self.now))
        });
        let mut keep = vec![true; chosen.len()];
        for drop_idx in by_cost {
            keep[drop_idx] = false;
            let freed: Vec<&RunningJob> = ending
                .iter()
                .copied()
                .chain(chosen.iter().zip(&keep).filter(|(_, k)| **k).map(|(r, _)| *r))
                .collect();
            match self.fits(job, &freed) {
                Some(fewer) => used = fewer,
                None => keep[drop_idx] = true,
            }
        }
        let victims: Vec<&RunningJob> = chosen
            .iter()
            .zip(&keep)
            .filter(|(r, k)| **k && used.iter().any(|u| u.id == r.id))
            .map(|(r, _)| *r)
            .collect();
        let lost: f64 = victims.iter().map(|r| r.lost_gpu_secs(self.now)).sum();
        if lost > self.waste_budget {
            return None;
        }
        self.waste_budget -= lost;
        preemptions.extend(victims.iter().map(|r| Preemption {
            victim: r.id,
            for_job: job.id,
            lost_gpu_secs: r.lost_gpu_secs(self.now),
        }));
        self.claim(&used);
        Some(used.len())
    }

    /// Whether `job` fits once `freed` end; if so, the freed jobs whose GPUs
    /// its placement uses.
    fn fits(&self, job: &PendingJob, freed: &[&'v RunningJob]) -> Option<Vec<&'v RunningJob>> {
        if freed.is_empty() {
            return None;
        }
        let mut nodes = self.nodes.clone();
        for running in freed {
            for part in &running.placement {
                if let Some(node_idx) = self.node_idx.get(part.node.as_str()) {
                    for gpu in &mut nodes[*node_idx].gpus {
                        if part.gpu_indices.contains(&gpu.index) {
                            gpu.busy = false;
                        }
                    }
                }
            }
        }
        let placement = FreeIndex::build(&nodes, self.policy).place(job, self.policy).ok()?;
        let used = freed
            .iter()
            .filter(|running| {
                running.placement.iter().any(|part| {
                    placement
                        .iter()
                        .any(|p| p.node == part.node && p.gpu_indices.iter().any(|g| part.gpu_indices.contains(g)))
                })
            })
            .copied()
            .collect();
        Some(used)
    }

    /// The jobs' GPUs are spoken for: nobody else counts on them, and no
    /// other job is placed on them this cycle.
    fn claim(&mut self, jobs: &[&'v RunningJob]) {
        for running in jobs {
            self.claimed.insert(running.id);
        }
    }
}
