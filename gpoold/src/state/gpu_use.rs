//! What heartbeat samples say of running attempts: their GPU use so far,
//! and the GPUs that lag behind the rest of their job (stragglers).

use super::*;

/// A GPU that has lagged behind its job's others for `straggler_after`.
#[derive(Debug, Clone)]
pub struct Straggler {
    pub gpu: gpool_core::stragglers::GpuKey,
    pub utilization_pct: u32,
    pub median_pct: u32,
    pub since: Timestamp,
}

impl State {
    /// Adds `node`'s samples to the GPU use of the attempts running there.
    pub(super) fn count_gpu_use(&mut self, node: &str, samples: &[pb::GpuSample]) {
        let mut counted = Vec::new();
        for job in self.running_jobs_on(node) {
            let JobState::Running { placement, .. } = &job.state else {
                continue;
            };
            for part in placement.iter().filter(|part| part.node == node) {
                for sample in samples.iter().filter(|sample| part.gpu_indices.contains(&sample.index)) {
                    counted.push((job.id, sample.utilization_pct, sample.memory_used_mib));
                }
            }
        }
        for (id, utilization, memory) in counted {
            self.gpu_use_live.entry(id).or_default().add_sample(utilization, memory);
        }
    }

    /// For the running jobs on several GPUs with GPUs on `node`: which of
    /// their GPUs lag behind the others (latest samples of all their
    /// nodes), and which have for `straggler_after`.
    pub(super) fn find_stragglers(&mut self, node: &str, now: Timestamp, out: &mut Batch) {
        use gpool_core::stragglers::{lagging, stragglers, GpuKey};
        let mut found = Vec::new();
        for job in self.running_jobs_on(node) {
            let JobState::Running { placement, .. } = &job.state else {
                continue;
            };
            let n_gpus: usize = placement.iter().map(|part| part.gpu_indices.len()).sum();
            if n_gpus < 2 || !placement.iter().any(|part| part.node == node) {
                continue;
            }
            let readings: Vec<(GpuKey, u32)> = placement
                .iter()
                .flat_map(|part| {
                    let samples = self.gpu_samples.get(&part.node).map_or(&[][..], Vec::as_slice);
                    samples
                        .iter()
                        .filter(|sample| part.gpu_indices.contains(&sample.index))
                        .map(|sample| {
                            let key = GpuKey {
                                node: part.node.clone(),
                                index: sample.index,
                            };
                            (key, sample.utilization_pct)
                        })
                })
                .collect();
            found.push((job.id, readings));
        }
        let after_ms = self.straggler_after.as_millis().min(i64::MAX as u128) as i64;
        for (id, readings) in found {
            let (median, lagging_now) = lagging(&readings);
            let since = self.lagging_since.entry(id).or_default();
            let now_straggling: Vec<Straggler> = stragglers(since, &lagging_now, now, after_ms)
                .into_iter()
                .map(|(gpu, began)| Straggler {
                    utilization_pct: readings.iter().find(|(key, _)| *key == gpu).map_or(0, |(_, pct)| *pct),
                    median_pct: median,
                    since: began,
                    gpu,
                })
                .collect();
            // Each GPU flagged, and each back in step, is an event in the
            // job's history.
            let before: Vec<Straggler> = self.stragglers.remove(&id).unwrap_or_default();
            let mut events = Vec::new();
            for straggler in &now_straggling {
                if !before.iter().any(|old| old.gpu == straggler.gpu) {
                    events.push(format!(
                        "straggler: {} GPU {} at {}% while the job's median is {}%, since {}",
                        straggler.gpu.node,
                        straggler.gpu.index,
                        straggler.utilization_pct,
                        straggler.median_pct,
                        straggler.since
                    ));
                }
            }
            for old in &before {
                if !now_straggling.iter().any(|straggler| straggler.gpu == old.gpu) {
                    events.push(format!(
                        "{} GPU {} is back in step with the job's others",
                        old.gpu.node, old.gpu.index
                    ));
                }
            }
            if !now_straggling.is_empty() {
                self.stragglers.insert(id, now_straggling);
            }
            if !events.is_empty() {
                let Some(job) = self.jobs.get_mut(&id) else { continue };
                for text in events {
                    tracing::warn!(job = %id, "{text}");
                    job.record_event(now, text);
                }
                out.writes.push(Write::Job(id));
            }
        }
    }

    /// The running jobs with GPUs on `node`.
    fn running_jobs_on(&self, node: &str) -> impl Iterator<Item = &Job> {
        self.running_on
            .get(node)
            .into_iter()
            .flatten()
            .filter_map(|id| self.job(*id))
    }
}
