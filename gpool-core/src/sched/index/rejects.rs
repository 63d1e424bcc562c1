//! Why a job does not fit the free index: the free GPUs it could count
//! on, what its own requirements rule out, and nodes that are down.

use super::FreeIndex;
use crate::model::NvlinkNeed;
use crate::sched::{PendingJob, Reject};
use std::collections::BTreeSet;

impl FreeIndex<'_> {
    pub(super) fn resource_rejects(
        &self,
        job: &PendingJob,
        pool_idx: usize,
        pool_label: &str,
        allowed: &[usize],
    ) -> Vec<Reject> {
        let pool = &self.pools[pool_idx];
        let wanted = job.shape.gpus_per_node as usize;
        let (mut total_free, mut max_free, mut n_with_enough) = (0u64, 0usize, 0usize);
        for buckets in allowed.iter().filter_map(|m| pool.models[*m].as_ref()) {
            if job.narrowed() {
                // Only the groups its requirements allow count.
                let need_nvlink = job.nvlink() == NvlinkNeed::Required;
                let (mut free, mut enough) = (0, 0);
                for group_idx in buckets.by_free.iter().flatten() {
                    let group = &self.groups[*group_idx];
                    let node = &self.nodes[group.node_idx];
                    if !job.allows_node(node)
                        || !job.enforced_on(node, self.enforce)
                        || !job.allows_memory(group.memory_mib)
                        || !job.allows_host(self.host_free[group.node_idx])
                        || (job.shape.exclusive && !self.idle(group.node_idx))
                    {
                        continue;
                    }
                    let usable = if need_nvlink {
                        (1..=group.free.len())
                            .rev()
                            .find(|k| crate::sched::nvlink_set_in(&node.topology, &group.free, *k))
                            .unwrap_or(0)
                    } else {
                        group.free.len()
                    };
                    free += group.free.len() as u64;
                    max_free = max_free.max(usable);
                    enough += usize::from(usable >= wanted);
                }
                total_free += free;
                n_with_enough = n_with_enough.max(enough);
                continue;
            }
            total_free += buckets.total_free;
            if let Some(highest) = buckets.by_free.iter().rposition(|bucket| !bucket.is_empty()) {
                max_free = max_free.max(highest);
            }
            // A gang stays on one model: count the nodes of the best one.
            n_with_enough = n_with_enough.max(buckets.by_free.iter().skip(wanted).map(BTreeSet::len).sum::<usize>());
        }
        let mut rejects = vec![Reject::Resources {
            gpus_per_node: job.shape.gpus_per_node,
            nodes: job.shape.nodes,
            total_free,
            max_free_on_one_node: max_free as u32,
            n_nodes_with_enough: n_with_enough,
            kept: 0,
        }];
        // Only what the job asks for narrows it: a job that asks for
        // nothing is not told to relax anything.
        let in_pool = |name: &str| {
            let groups = self.node_idx_by_name.get(name).map(|i| self.groups_of_node[*i].clone());
            groups.is_some_and(|mut groups| groups.any(|g| self.pool_sets[self.groups[g].pool_set].contains(&pool_idx)))
        };
        let what = if job.narrowed() {
            crate::sched::narrowing::narrowing_words(job, &in_pool)
        } else {
            String::new()
        };
        if !what.is_empty() {
            rejects.push(Reject::Requirements { what });
        }
        let candidates = (allowed.iter().filter_map(|m| pool.models[*m].as_ref()))
            .flat_map(|buckets| buckets.by_free.iter().flatten())
            .map(|group_idx| &self.nodes[self.groups[*group_idx].node_idx]);
        rejects.extend(crate::sched::narrowing::unenforced(job, candidates, self.enforce));
        rejects.extend(self.unavailable_note(pool_idx, pool_label));
        rejects
    }

    pub(super) fn unavailable_note(&self, pool_idx: usize, pool_label: &str) -> Option<Reject> {
        let pool = &self.pools[pool_idx];
        (pool.n_down + pool.n_draining > 0).then(|| Reject::SomeNodesUnavailable {
            pool: pool_label.to_string(),
            n_down: pool.n_down,
            n_draining: pool.n_draining,
        })
    }
}
