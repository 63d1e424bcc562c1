//! Free GPUs indexed by pool, model and free count, so that finding the
//! best-fitting node for a job costs a few set lookups, not a node scan.

use super::{Availability, FastHash, HostAsk, NodeView, PendingJob, Reject};
use crate::model::{GpuModel, NodePlacement, NvlinkNeed};
use crate::sched::Policy;
use std::collections::{BTreeMap, BTreeSet, HashMap};

mod rejects;

/// The GPUs of one model on one schedulable node.
#[derive(Clone)]
struct Group {
    node_idx: usize,
    /// Free GPU indices, ascending.
    free: Vec<u32>,
    /// The pools (by position in the policy) the node belongs to, by
    /// position in `FreeIndex::pool_sets`.
    pool_set: usize,
    model_idx: usize,
    /// The least memory of its GPUs (MiB).
    memory_mib: u64,
    /// Its GPUs, free or not.
    size: usize,
}

/// Groups of one model in one pool, bucketed by how many GPUs they have free.
#[derive(Clone, Default)]
struct ModelBuckets {
    by_free: Vec<BTreeSet<usize>>,
    total_free: u64,
}

#[derive(Clone, Default)]
struct PoolIndex {
    n_nodes: usize,
    n_down: usize,
    n_draining: usize,
    /// GPUs of its nodes that are up, free or not.
    n_gpus: u64,
    /// By model index; `None` where the pool has no schedulable GPU of it.
    models: Vec<Option<ModelBuckets>>,
}

#[derive(Clone)]
pub(super) struct FreeIndex<'v> {
    nodes: &'v [NodeView],
    /// Groups of each node (pushed in turn), by node position.
    groups_of_node: Vec<std::ops::Range<usize>>,
    /// The sets of pools nodes belong to: nodes with the same labels
    /// (most of a fleet, node after node) share one, worked out once.
    pool_sets: Vec<Vec<usize>>,
    node_idx_by_name: HashMap<&'v str, usize, FastHash>,
    models: Vec<GpuModel>,
    /// Which models are MIG slices (taken only when named, one per node).
    mig_models: Vec<bool>,
    model_idx_by_name: HashMap<GpuModel, usize, FastHash>,
    groups: Vec<Group>,
    pools: Vec<PoolIndex>,
    /// Some node has a `switch` or `rack` label: gangs look for nodes that
    /// share one.
    locality: bool,
    /// By model index: GPUs that jobs which name their models (and accept
    /// this one) want or hold. A job that may take several models goes to
    /// the one others need least (`with_demand`).
    demand: Vec<u64>,
    /// By node position: its free CPUs and memory (`None`: not known).
    host_free: Vec<Option<HostAsk>>,
    /// Whether nodes that do not enforce a job's limits are kept from it.
    enforce: crate::enforce::EnforceLimits,
}

/// Labels that group nodes close on the network, nearest first: a gang
/// goes onto nodes under one switch where it can, else one rack.
pub const LOCALITY_LABELS: [&str; 2] = ["switch", "rack"];

impl<'v> FreeIndex<'v> {
    pub(super) fn build(nodes: &'v [NodeView], policy: &Policy) -> FreeIndex<'v> {
        // The models, sorted, each once (a node's GPUs are mostly of one:
        // the last one seen is tried first).
        let mut seen: Vec<&GpuModel> = Vec::new();
        for model in nodes.iter().flat_map(|node| node.gpus.iter().map(|gpu| &gpu.model)) {
            if seen.last() != Some(&model) && !seen.contains(&model) {
                seen.push(model);
            }
        }
        seen.sort_unstable();
        let models: Vec<GpuModel> = seen.into_iter().cloned().collect();
        let model_idx_by_name = models.iter().cloned().enumerate().map(|(i, m)| (m, i)).collect();
        let mut index = FreeIndex {
            nodes,
            groups_of_node: vec![0..0; nodes.len()],
            pool_sets: Vec::new(),
            node_idx_by_name: nodes.iter().enumerate().map(|(i, n)| (n.name.as_str(), i)).collect(),
            mig_models: models.iter().map(GpuModel::is_mig_slice).collect(),
            models,
            model_idx_by_name,
            groups: Vec::new(),
            pools: policy.pools.iter().map(|_| PoolIndex::default()).collect(),
            locality: nodes
                .iter()
                .any(|node| LOCALITY_LABELS.iter().any(|key| node.labels.contains_key(*key))),
            demand: Vec::new(),
            host_free: nodes.iter().map(|node| node.host_free(&[])).collect(),
            enforce: policy.enforce_limits,
        };
        let mut last: Option<(&BTreeMap<String, String>, usize)> = None;
        for (node_idx, node) in nodes.iter().enumerate() {
            let pool_set = match last {
                Some((labels, pool_set)) if *labels == node.labels => pool_set,
                _ => {
                    index.pool_sets.push(
                        (0..policy.pools.len())
                            .filter(|pool_idx| policy.pools[*pool_idx].selects(&node.labels))
                            .collect(),
                    );
                    index.pool_sets.len() - 1
                }
            };
            last = Some((&node.labels, pool_set));
            index.add_node(node_idx, node, pool_set);
        }
        index
    }

    fn add_node(&mut self, node_idx: usize, node: &NodeView, pool_set: usize) {
        let pool_idxs = &self.pool_sets[pool_set];
        for pool_idx in pool_idxs {
            let pool = &mut self.pools[*pool_idx];
            pool.n_nodes += 1;
            match node.availability {
                Availability::Up => {}
                Availability::Draining => pool.n_draining += 1,
                Availability::Down => pool.n_down += 1,
            }
        }
        if node.availability != Availability::Up || pool_idxs.is_empty() {
            return;
        }
        for pool_idx in pool_idxs {
            self.pools[*pool_idx].n_gpus += node.gpus.len() as u64;
        }
        // Per model: whether the node has it, its free GPUs, and the least
        // memory of its GPUs (one lookup per GPU: this runs every cycle).
        let mut by_model: Vec<Option<(Vec<u32>, u64)>> = vec![None; self.models.len()];
        let mut size = vec![0; self.models.len()];
        let mut last: Option<(&GpuModel, usize)> = None;
        for gpu in &node.gpus {
            let model_idx = match last {
                Some((model, idx)) if *model == gpu.model => idx,
                _ => self.model_idx_by_name[&gpu.model],
            };
            last = Some((&gpu.model, model_idx));
            let (free, memory_mib) = by_model[model_idx].get_or_insert_with(|| (Vec::new(), u64::MAX));
            *memory_mib = (*memory_mib).min(gpu.memory_mib);
            size[model_idx] += 1;
            if !gpu.busy {
                free.push(gpu.index);
            }
        }
        let first_group = self.groups.len();
        for (model_idx, found) in by_model.into_iter().enumerate() {
            let Some((mut free, memory_mib)) = found else {
                continue;
            };
            free.sort_unstable();
            let group_idx = self.groups.len();
            for pool_idx in &self.pool_sets[pool_set] {
                let models = &mut self.pools[*pool_idx].models;
                models.resize_with(self.models.len(), || None);
                let buckets = models[model_idx].get_or_insert_with(ModelBuckets::default);
                buckets.insert(group_idx, free.len());
                buckets.total_free += free.len() as u64;
            }
            self.groups.push(Group {
                node_idx,
                free,
                pool_set,
                model_idx,
                memory_mib,
                size: size[model_idx],
            });
        }
        self.groups_of_node[node_idx] = first_group..self.groups.len();
    }

    /// Jobs that may take several models leave alone, as far as they can,
    /// the models that jobs naming theirs need (`demand`: GPUs by model):
    /// an any-model job on the few A10s would leave an A10-only job waiting
    /// while other GPUs stand idle.
    pub(super) fn with_demand(mut self, demand: &HashMap<&GpuModel, u64, FastHash>) -> FreeIndex<'v> {
        self.demand = self
            .models
            .iter()
            .map(|model| demand.get(model).copied().unwrap_or(0))
            .collect();
        self
    }

    /// How much other jobs need the GPUs of `model_idx` in pool
    /// `pool_idx`: none (0.0), else the GPUs they want per GPU of it free.
    fn pressure(&self, pool_idx: usize, model_idx: usize) -> f64 {
        match self.demand.get(model_idx).copied().unwrap_or(0) {
            0 => 0.0,
            wanted => {
                let free = self.pools[pool_idx].models[model_idx]
                    .as_ref()
                    .map_or(0, |buckets| buckets.total_free);
                wanted as f64 / (free + 1) as f64
            }
        }
    }

    /// Places `job` and takes its GPUs out of the index, or says why not.
    pub(super) fn place(&mut self, job: &PendingJob, policy: &Policy) -> Result<Vec<NodePlacement>, Vec<Reject>> {
        let groups = self.find(job, policy)?;
        Ok(groups.into_iter().map(|g| self.take(g, job)).collect())
    }

    /// Nothing runs on the node: every GPU of it is free, and no attempt
    /// holds its CPUs or memory (one on a GPU out of service).
    fn idle(&self, node_idx: usize) -> bool {
        let mut groups = self.groups_of_node[node_idx].clone();
        groups.start < groups.end
            && groups.all(|g| self.groups[g].free.len() == self.groups[g].size)
            && self.nodes[node_idx]
                .host
                .as_ref()
                .is_none_or(|host| host.held.is_empty())
    }

    /// No GPU of the node is free any more (an exclusive job runs there).
    fn close(&mut self, node_idx: usize) {
        for group_idx in self.groups_of_node[node_idx].clone() {
            let group = &mut self.groups[group_idx];
            let old_free = std::mem::take(&mut group.free).len();
            for pool_idx in &self.pool_sets[group.pool_set] {
                if let Some(buckets) = self.pools[*pool_idx].models[group.model_idx].as_mut() {
                    buckets.by_free[old_free].remove(&group_idx);
                    buckets.insert(group_idx, 0);
                    buckets.total_free -= old_free as u64;
                }
            }
        }
    }

    /// Whether `job` would fit now, taking nothing.
    pub(super) fn fits(&self, job: &PendingJob, policy: &Policy) -> bool {
        self.find(job, policy).is_ok()
    }

    /// Whether any GPU is free in any pool.
    pub(super) fn any_free(&self) -> bool {
        self.pools
            .iter()
            .flat_map(|pool| pool.models.iter().flatten())
            .any(|buckets| buckets.total_free > 0)
    }

    /// Free GPUs of the pool `job` runs in, of any model.
    /// The GPUs of the job's pool on nodes that are up, free or not.
    pub(super) fn pool_gpus(&self, job: &PendingJob, policy: &Policy) -> u64 {
        let pool_name = policy.pool(&job.shape.pool).map(|pool| pool.name.as_str());
        let pool_idx = policy.pools.iter().position(|p| Some(p.name.as_str()) == pool_name);
        pool_idx.map_or(0, |pool_idx| self.pools[pool_idx].n_gpus)
    }

    pub(super) fn pool_free(&self, job: &PendingJob, policy: &Policy) -> u64 {
        let pool_name = policy.pool(&job.shape.pool).map(|pool| pool.name.as_str());
        policy
            .pools
            .iter()
            .position(|p| Some(p.name.as_str()) == pool_name)
            .map_or(0, |pool_idx| {
                self.pools[pool_idx].models.iter().flatten().map(|b| b.total_free).sum()
            })
    }

    /// Takes GPUs placed elsewhere (from another index) out of this one,
    /// with the CPUs and memory `host` of the job placed (per node).
    pub(super) fn remove(&mut self, placement: &[NodePlacement], (host, exclusive): (Option<HostAsk>, bool)) {
        for part in placement {
            let Some(node_idx) = self.node_idx_by_name.get(part.node.as_str()).copied() else {
                continue;
            };
            self.take_host(node_idx, host);
            if exclusive {
                self.close(node_idx);
                continue;
            }
            for group_idx in self.groups_of_node[node_idx].clone() {
                let group = &mut self.groups[group_idx];
                let old_free = group.free.len();
                group.free.retain(|gpu| !part.gpu_indices.contains(gpu));
                let new_free = group.free.len();
                if new_free == old_free {
                    continue;
                }
                for pool_idx in &self.pool_sets[group.pool_set] {
                    if let Some(buckets) = self.pools[*pool_idx].models[group.model_idx].as_mut() {
                        buckets.by_free[old_free].remove(&group_idx);
                        buckets.insert(group_idx, new_free);
                        buckets.total_free -= (old_free - new_free) as u64;
                    }
                }
            }
        }
    }

    /// The groups `job` would be placed on, or why it does not fit.
    fn find(&self, job: &PendingJob, policy: &Policy) -> Result<Vec<usize>, Vec<Reject>> {
        let pool_name = policy.pool(&job.shape.pool).map(|pool| pool.name.clone());
        let Some(pool_idx) = pool_name.and_then(|name| policy.pools.iter().position(|p| p.name == name)) else {
            return Err(vec![Reject::UnknownPool {
                pool: job.shape.pool.to_string(),
            }]);
        };
        let pool_label = &policy.pools[pool_idx].name;
        let allowed = self.allowed_models(job, pool_idx, pool_label)?;
        // The model others need least, then the best fit (fewest free GPUs
        // left on the groups taken).
        let mut best: Option<((f64, u64), Vec<usize>)> = None;
        for model_idx in &allowed {
            let Some(found) = self.fitting_groups(pool_idx, *model_idx, job) else {
                continue;
            };
            let pressure = if allowed.len() > 1 {
                self.pressure(pool_idx, *model_idx)
            } else {
                0.0
            };
            let cost = (pressure, found.iter().map(|g| self.groups[*g].free.len() as u64).sum());
            if best.as_ref().is_none_or(|(best_cost, _)| cost < *best_cost) {
                best = Some((cost, found));
            }
        }
        match best {
            Some((_, group_idxs)) => Ok(group_idxs),
            None => Err(self.resource_rejects(job, pool_idx, pool_label, &allowed)),
        }
    }

    /// The models the job accepts that the pool has on schedulable nodes.
    fn allowed_models(&self, job: &PendingJob, pool_idx: usize, pool_label: &str) -> Result<Vec<usize>, Vec<Reject>> {
        let pool = &self.pools[pool_idx];
        let pool_name = pool_label.to_string();
        if pool.n_nodes == 0 {
            return Err(vec![Reject::NoNodes { pool: pool_name }]);
        }
        let present: Vec<usize> = (0..pool.models.len()).filter(|m| pool.models[*m].is_some()).collect();
        if present.is_empty() && pool.n_down + pool.n_draining > 0 {
            return Err(vec![Reject::NodesUnavailable {
                pool: pool_name,
                n_down: pool.n_down,
                n_draining: pool.n_draining,
            }]);
        }
        let any_mig = self.mig_models.iter().any(|mig| *mig);
        if job.shape.gpu_types.is_empty() && !present.is_empty() && !any_mig {
            return Ok(present);
        }
        let allowed: Vec<usize> = if job.shape.gpu_types.is_empty() {
            present.iter().copied().filter(|m| !self.mig_models[*m]).collect()
        } else {
            job.shape
                .gpu_types
                .iter()
                .filter_map(|model| self.model_idx_by_name.get(model).copied())
                .filter(|model_idx| present.contains(model_idx))
                // A MIG slice takes one GPU per node.
                .filter(|model_idx| job.shape.gpus_per_node == 1 || !self.mig_models[*model_idx])
                .collect()
        };
        if allowed.is_empty() {
            let mut rejects = vec![Reject::NoGpuModel {
                pool: pool_name,
                wanted: job.shape.gpu_types.clone(),
                available: present.iter().map(|m| self.models[*m].clone()).collect(),
            }];
            rejects.extend(self.unavailable_note(pool_idx, pool_label));
            return Err(rejects);
        }
        Ok(allowed)
    }

    /// The best-fitting `job.shape.nodes` groups of one model, or `None`.
    fn fitting_groups(&self, pool_idx: usize, model_idx: usize, job: &PendingJob) -> Option<Vec<usize>> {
        let buckets = self.pools[pool_idx].models[model_idx].as_ref()?;
        let wanted = job.shape.gpus_per_node as usize;
        let n_nodes = job.shape.nodes as usize;
        // NVLink preferred: first only groups that give it, then any.
        let passes: &[bool] = match job.nvlink() {
            NvlinkNeed::Any => &[false],
            NvlinkNeed::Preferred => &[true, false],
            NvlinkNeed::Required => &[true],
        };
        for need_nvlink in passes {
            if n_nodes > 1 && self.locality {
                match self.gang_groups(buckets, job, *need_nvlink) {
                    Some(found) => return Some(found),
                    None => continue,
                }
            }
            let mut found = Vec::with_capacity(n_nodes);
            for bucket in buckets.by_free.iter().skip(wanted) {
                for group_idx in bucket {
                    if job.narrowed() && !self.group_allows(*group_idx, job, *need_nvlink) {
                        continue;
                    }
                    found.push(*group_idx);
                    if found.len() == n_nodes {
                        return Some(found);
                    }
                }
            }
        }
        None
    }

    /// A gang's groups: the best-fitting ones under one `switch` where one
    /// has enough, else in one `rack`, else anywhere.
    fn gang_groups(&self, buckets: &ModelBuckets, job: &PendingJob, need_nvlink: bool) -> Option<Vec<usize>> {
        let n_nodes = job.shape.nodes as usize;
        // Fewest free GPUs first: the best fits.
        let candidates: Vec<usize> = buckets
            .by_free
            .iter()
            .skip(job.shape.gpus_per_node as usize)
            .flatten()
            .copied()
            .filter(|group_idx| !job.narrowed() || self.group_allows(*group_idx, job, need_nvlink))
            .collect();
        if candidates.len() < n_nodes {
            return None;
        }
        for key in LOCALITY_LABELS {
            let mut domains: HashMap<&str, Vec<usize>> = HashMap::new();
            for group_idx in &candidates {
                if let Some(value) = self.nodes[self.groups[*group_idx].node_idx].labels.get(key) {
                    domains.entry(value.as_str()).or_default().push(*group_idx);
                }
            }
            let best = domains
                .into_iter()
                .filter(|(_, groups)| groups.len() >= n_nodes)
                .map(|(value, groups)| {
                    let chosen = groups[..n_nodes].to_vec();
                    let cost: usize = chosen.iter().map(|g| self.groups[*g].free.len()).sum();
                    ((cost, value), chosen)
                })
                .min_by(|a, b| a.0.cmp(&b.0));
            if let Some((_, chosen)) = best {
                return Some(chosen);
            }
        }
        Some(candidates[..n_nodes].to_vec())
    }

    /// The job's requirements let it have `job.shape.gpus_per_node` GPUs of the
    /// group (with NVLink between them where `need_nvlink`), and its node
    /// has the CPUs and memory it asks for free.
    fn group_allows(&self, group_idx: usize, job: &PendingJob, need_nvlink: bool) -> bool {
        let group = &self.groups[group_idx];
        let node = &self.nodes[group.node_idx];
        job.allows_node(node)
            && job.enforced_on(node, self.enforce)
            && job.allows_memory(group.memory_mib)
            && job.allows_host(self.host_free[group.node_idx])
            && (!job.shape.exclusive || self.idle(group.node_idx))
            && (!need_nvlink || super::nvlink_set_in(&node.topology, &group.free, job.shape.gpus_per_node as usize))
    }

    /// The CPUs and memory `host` are no longer free on the node.
    /// Whether `host` fits what the node `node` has free now.
    pub(super) fn host_fits(&self, node: &str, host: Option<HostAsk>) -> bool {
        let free = self.node_idx_by_name.get(node).and_then(|at| self.host_free[*at]);
        match (host, free) {
            (Some(ask), Some(free)) => ask.fits_in(free),
            _ => true,
        }
    }

    fn take_host(&mut self, node_idx: usize, host: Option<HostAsk>) {
        if let (Some(ask), Some(Some(free))) = (host, self.host_free.get_mut(node_idx)) {
            *free = free.less(ask);
        }
    }

    fn take(&mut self, group_idx: usize, job: &PendingJob) -> NodePlacement {
        let node_idx = self.groups[group_idx].node_idx;
        if job.shape.exclusive {
            let placement = NodePlacement {
                node: self.nodes[node_idx].name.clone(),
                gpu_indices: self.groups[group_idx].free.clone(),
            };
            self.take_host(node_idx, job.shape.host);
            self.close(node_idx);
            return placement;
        }
        let n_gpus = job.shape.gpus_per_node;
        self.take_host(node_idx, job.shape.host);
        let group = &mut self.groups[group_idx];
        let old_free = group.free.len();
        let taken = self.nodes[group.node_idx].topology.choose(&group.free, n_gpus as usize);
        group.free.retain(|gpu| !taken.contains(gpu));
        let new_free = group.free.len();
        for pool_idx in &self.pool_sets[group.pool_set] {
            if let Some(buckets) = self.pools[*pool_idx].models[group.model_idx].as_mut() {
                buckets.by_free[old_free].remove(&group_idx);
                buckets.insert(group_idx, new_free);
                buckets.total_free -= taken.len() as u64;
            }
        }
        NodePlacement {
            node: self.nodes[group.node_idx].name.clone(),
            gpu_indices: taken,
        }
    }
}

impl ModelBuckets {
    fn insert(&mut self, group_idx: usize, n_free: usize) {
        if self.by_free.len() <= n_free {
            self.by_free.resize_with(n_free + 1, BTreeSet::new);
        }
        self.by_free[n_free].insert(group_idx);
    }
}
