//! What heartbeat samples say of running attempts: their GPU use so far,
//! and the GPUs that lag behind the rest of their job (stragglers).

use super::*;

pub use gpool_core::stragglers::Straggler;

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
            self.attempt_mut(id).gpu_use.add_sample(utilization, memory);
        }
    }

    /// For the running jobs on several GPUs with GPUs on `node`: which of
    /// their GPUs lag behind the others (latest samples of all their
    /// nodes), and which have for `straggler_after`.
    pub(super) fn find_stragglers(&mut self, node: &str, now: Timestamp, out: &mut Batch) {
        use gpool_core::stragglers::{changes, described, lagging, stragglers, GpuKey};
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
            let attempt = self.attempt_mut(id);
            let since = &mut attempt.lagging_since;
            let now_straggling = described(stragglers(since, &lagging_now, now, after_ms), &readings, median);
            // Each GPU flagged, and each back in step, is an event in the
            // job's history.
            let events = changes(&attempt.stragglers, &now_straggling);
            attempt.stragglers = now_straggling;
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
