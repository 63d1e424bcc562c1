//! Reclaiming GPUs by preemption.
//!
//! A job that may preempt (guaranteed, or of a QoS that preempts lower
//! classes) and does not fit first counts on what is already being freed:
//! the GPUs promised to it (its victims that ended since), its own victims
//! still in their grace, then jobs being preempted whose GPUs no waiting job
//! was promised. Only then does it pick new victims: burst jobs (or jobs of
//! a lower QoS), of the teams furthest over their fair share first, each
//! team's in order of least work lost (since the last checkpoint), never
//! one younger than its QoS `min_runtime`, never burst work of a class
//! that may preempt the job's own (it would take its GPUs back in turn, and
//! the two would trade places every cycle), and never work of its own team
//! of its own QoS and shape (that would trade a job for its twin). Victims
//! are chosen only if the whole job (every node of a gang, one GPU model)
//! then fits on GPUs it may take, superfluous ones are given back, and the
//! work lost stays within the hour's waste budget.
//!
//! The placement a reclaiming job gets is on its victims' GPUs (and on free
//! GPUs only as far as the QoS reserves leave them to it): what a victim
//! frees goes to the job it was taken for, never back into a reserve, so
//! one victim serves one GPU of its job and a reserve never makes a job
//! take more.

use super::index::FreeIndex;
use super::node_view::room_on;
use super::{ClusterView, FastHash, NodeView, PendingJob, Policy, Preemption, RunningJob};
use crate::ids::{JobId, Timestamp};
use crate::model::NodePlacement;
use std::collections::{BTreeMap, HashMap, HashSet};

mod search;

/// Victims weighed for one job, at most: the least costly come first.
const MAX_CANDIDATES: usize = 256;
/// Jobs that may reclaim GPUs in one cycle; the rest try next cycle.
const MAX_RECLAIMS_PER_CYCLE: usize = 64;
/// Tries that find no victims in one cycle: each weighs up to
/// `MAX_CANDIDATES` of them, so a queue of jobs that cannot reclaim costs
/// at most this many. (Within a cycle a shape that failed is not tried
/// again, so it takes many shapes to reach.)
pub(super) const MAX_FAILED_RECLAIMS_PER_CYCLE: usize = 64;

/// Beside fitting, the free GPUs a job must leave in its pool (QoS
/// reserves it may not take): with `pool_free_now` free, reclaim until
/// `pool_free_now + freed >= gpus + kept`.
#[derive(Debug, Clone, Copy)]
pub(super) struct Keep {
    pub pool_free_now: u64,
    pub kept: u64,
}

pub(super) struct Reclaimer<'v> {
    view: &'v ClusterView,
    policy: &'v Policy,
    now: Timestamp,
    /// The nodes with this cycle's starts marked busy (the view's, each
    /// copied at its first start or hold of the cycle).
    nodes: Vec<std::borrow::Cow<'v, NodeView>>,
    node_idx: HashMap<&'v str, usize, FastHash>,
    /// Running jobs (and promises) whose GPUs a waiting job already counts
    /// on this cycle, by address: a promise may name a job that runs again.
    claimed: HashSet<usize>,
    /// Victims in their grace, and promises, whose GPUs belong to a job of
    /// this view (by address): only that job may count on them.
    owner: HashMap<usize, JobId, FastHash>,
    waste_budget: f64,
    /// Nodes with a free GPU now (the only ones, beside victims' nodes, a
    /// reclaiming job may use).
    with_free: HashSet<usize>,
    n_reclaims: usize,
    n_failed: usize,
    /// Some running job is being preempted, or may become a victim: burst
    /// work, any job where a QoS preempts lower classes, or under LAS
    /// order one near its checkpoint.
    victims_possible: bool,
    /// Running jobs in the order victims are taken: furthest over its fair
    /// share (lowest factor) first, then least lost work, then id.
    by_cost: Vec<&'v RunningJob>,
}

impl<'v> Reclaimer<'v> {
    pub(super) fn new(
        view: &'v ClusterView,
        policy: &'v Policy,
        fair: &'v BTreeMap<String, f64>,
        now: Timestamp,
        entitled: &HashSet<JobId, FastHash>,
    ) -> Reclaimer<'v> {
        let owner = owners(view, entitled);
        let mut reclaimer = Reclaimer {
            view,
            policy,
            now,
            nodes: view.nodes.iter().map(std::borrow::Cow::Borrowed).collect(),
            node_idx: view
                .nodes
                .iter()
                .enumerate()
                .map(|(i, n)| (n.name.as_str(), i))
                .collect(),
            claimed: HashSet::new(),
            owner,
            waste_budget: view.waste_budget_gpu_secs,
            with_free: view
                .nodes
                .iter()
                .enumerate()
                .filter(|(_, node)| node.gpus.iter().any(|gpu| !gpu.busy))
                .map(|(idx, _)| idx)
                .collect(),
            n_reclaims: 0,
            n_failed: 0,
            victims_possible: policy.sharing.qos.iter().any(|qos| qos.preempt_lower)
                || view.running.iter().any(|r| {
                    r.preempting || r.burst || policy.sharing.las.as_ref().is_some_and(|las| las.may_be_taken(r, now))
                })
                || !view.promised.is_empty(),
            by_cost: {
                let mut keyed: Vec<(f64, f64, &RunningJob)> = view
                    .running
                    .iter()
                    // A fraction's end frees no GPU: never a victim.
                    .filter(|r| r.share.is_none())
                    .map(|r| (fair.get(&r.team).copied().unwrap_or(1.0), r.lost_gpu_secs(now), r))
                    .collect();
                keyed.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)).then(a.2.id.cmp(&b.2.id)));
                keyed.into_iter().map(|(_, _, r)| r).collect()
            },
        };
        // Promised GPUs are free, but no other job's: busy to everyone else.
        for promise in &view.promised {
            if reclaimer.owner.contains_key(&address(promise)) {
                reclaimer.taken(&promise.placement, None);
            }
        }
        reclaimer
    }

    /// Whether GPUs are promised to `job` (by victims that ended, or that
    /// end in their grace): it counts on them even where it may not take
    /// new victims.
    pub(super) fn has_claim(&self, job: JobId) -> bool {
        self.owner.values().any(|owner| *owner == job)
    }

    /// Victims in their grace that no waiting job owns and none counted on
    /// this cycle: nothing needs their GPUs, so their preemption is
    /// withdrawn. None where the view holds only the queue's window (the
    /// job they were taken for may wait past it) or the cycle's tries ran
    /// out (a job not tried might have counted on them).
    pub(super) fn unneeded(&self) -> Vec<(JobId, crate::ids::Epoch)> {
        if self.view.windowed
            || self.n_reclaims == MAX_RECLAIMS_PER_CYCLE
            || self.n_failed == MAX_FAILED_RECLAIMS_PER_CYCLE
        {
            return Vec::new();
        }
        let owned = |r: &RunningJob| self.owner.contains_key(&address(r)) || self.claimed.contains(&address(r));
        self.view
            .running
            .iter()
            // Taken for a job (an operator's requeue names none).
            .filter(|r| r.preempting && r.preempted_for.is_some() && !owned(r))
            .map(|r| (r.id, r.epoch))
            .collect()
    }

    /// Whether a later job might still reclaim GPUs this cycle.
    pub(super) fn may_act(&self) -> bool {
        self.victims_possible
            && self.n_reclaims < MAX_RECLAIMS_PER_CYCLE
            && self.n_failed < MAX_FAILED_RECLAIMS_PER_CYCLE
    }

    /// The nodes with this cycle's starts marked busy.
    pub(super) fn nodes(&self) -> &[std::borrow::Cow<'v, NodeView>] {
        &self.nodes
    }

    /// Records a start of this cycle, with the CPUs and memory it takes.
    pub(super) fn taken(&mut self, placement: &[NodePlacement], host: Option<crate::sched::HostAsk>) {
        for part in placement {
            if let Some(node_idx) = self.node_idx.get(part.node.as_str()) {
                let node = self.nodes[*node_idx].to_mut();
                node.occupy(&part.gpu_indices, host);
                if node.gpus.iter().all(|gpu| gpu.busy) {
                    self.with_free.remove(node_idx);
                }
            }
        }
    }

    /// Finds the running jobs whose end lets `job` start (new victims only
    /// if `new_victims`), adds the new victims to `preemptions`, and
    /// returns how many running jobs it waits for and the placement it will
    /// get (whose free GPUs the caller must hold for it; with 0 to wait
    /// for, it starts there now, on GPUs promised to it); `None` if no
    /// allowed set of victims makes it fit, or the cycle's tries are spent.
    /// A try that fails changes nothing but the count of failed tries.
    pub(super) fn plan(
        &mut self,
        job: &PendingJob,
        guaranteed: bool,
        new_victims: bool,
        keep: Option<Keep>,
        preemptions: &mut Vec<Preemption>,
    ) -> Option<(usize, Vec<NodePlacement>)> {
        if self.n_reclaims == MAX_RECLAIMS_PER_CYCLE || self.n_failed == MAX_FAILED_RECLAIMS_PER_CYCLE {
            return None;
        }
        let planned = self.try_plan(job, guaranteed, new_victims, keep, preemptions);
        match planned {
            Some(_) => self.n_reclaims += 1,
            None => self.n_failed += 1,
        }
        planned
    }

    fn try_plan(
        &mut self,
        job: &PendingJob,
        guaranteed: bool,
        new_victims: bool,
        keep: Option<Keep>,
        preemptions: &mut Vec<Preemption>,
    ) -> Option<(usize, Vec<NodePlacement>)> {
        let mut search = self.search(job, keep);
        if let Some((used, placement)) = self.fits(job, &search.ending, &search.freed_on, &search.with_room, keep) {
            self.claim(&used);
            return Some((self.n_running(&used), placement));
        }
        if !new_victims {
            return None;
        }
        let candidates = self.candidates(job, guaranteed);
        let (chosen, used) = self.add_victims(job, &mut search, candidates)?;
        let (used, kept) = self.give_back(job, &mut search, &chosen, used);
        self.commit(job, &search.ending, (&chosen, &kept), used, preemptions)
    }

    /// How many of `used` still run (the rest are promises: free already).
    fn n_running(&self, used: &[&RunningJob]) -> usize {
        used.iter()
            .filter(|r| !self.view.promised.iter().any(|p| std::ptr::eq(p, **r)))
            .count()
    }

    /// The GPUs `freed` jobs hold, by node.
    fn freed_on(&self, freed: &[&RunningJob]) -> HashMap<usize, Vec<u32>, FastHash> {
        let mut freed_on: HashMap<usize, Vec<u32>, FastHash> = HashMap::default();
        for running in freed {
            self.add_freed(&mut freed_on, running);
        }
        freed_on
    }

    /// Adds the GPUs `running` holds to `freed_on`.
    fn add_freed(&self, freed_on: &mut HashMap<usize, Vec<u32>, FastHash>, running: &RunningJob) {
        for part in &running.placement {
            if let Some(node_idx) = self.node_idx.get(part.node.as_str()) {
                freed_on.entry(*node_idx).or_default().extend(&part.gpu_indices);
            }
        }
    }

    /// Takes the GPUs `running` holds out of `freed_on`.
    fn unfree(&self, freed_on: &mut HashMap<usize, Vec<u32>, FastHash>, running: &RunningJob) {
        for part in &running.placement {
            if let Some(node_idx) = self.node_idx.get(part.node.as_str()) {
                if let Some(gpus) = freed_on.get_mut(node_idx) {
                    gpus.retain(|gpu| !part.gpu_indices.contains(gpu));
                    if gpus.is_empty() {
                        freed_on.remove(node_idx);
                    }
                }
            }
        }
    }

    /// Sets whether `job` has room on each node of `running` from the check
    /// (either way: where NVLink is required, more free GPUs need not mean
    /// room); whether a node gained room, and whether any has room.
    fn recheck_room(
        &self,
        job: &PendingJob,
        pool: Option<&crate::model::PoolDef>,
        running: &RunningJob,
        freed_on: &HashMap<usize, Vec<u32>, FastHash>,
        room: &mut HashSet<usize, FastHash>,
    ) -> (bool, bool) {
        let (mut gained, mut any_room) = (false, false);
        for part in &running.placement {
            if let Some(node_idx) = self.node_idx.get(part.node.as_str()) {
                if self.has_room(job, pool, *node_idx, freed_on) {
                    gained |= room.insert(*node_idx);
                    any_room = true;
                } else {
                    room.remove(node_idx);
                }
            }
        }
        (gained, any_room)
    }

    fn has_room(
        &self,
        job: &PendingJob,
        pool: Option<&crate::model::PoolDef>,
        node_idx: usize,
        freed_on: &HashMap<usize, Vec<u32>, FastHash>,
    ) -> bool {
        let extra = freed_on.get(&node_idx).map_or(&[][..], Vec::as_slice);
        room_on(job, (pool, self.policy.enforce_limits), &self.nodes[node_idx], extra)
    }

    /// The jobs' GPUs are spoken for: nobody else counts on them, and no
    /// other job is placed on them this cycle.
    fn claim(&mut self, jobs: &[&'v RunningJob]) {
        for running in jobs {
            self.claimed.insert(address(running));
        }
    }
}

/// A running job's (or promise's) identity within one cycle.
fn address(job: &RunningJob) -> usize {
    std::ptr::from_ref(job) as usize
}

/// The jobs something is being freed for (victims in their grace, or
/// promises).
pub(super) fn claimants(view: &ClusterView) -> HashSet<JobId, FastHash> {
    view.running
        .iter()
        .filter(|r| r.preempting)
        .chain(&view.promised)
        .filter_map(|r| r.preempted_for)
        .collect()
}

/// Victims in their grace and promises whose GPUs belong to a job that
/// waits in `view` and may still reclaim GPUs (`entitled`): only that job
/// counts on them.
fn owners(view: &ClusterView, waiting: &HashSet<JobId, FastHash>) -> HashMap<usize, JobId, FastHash> {
    if waiting.is_empty() {
        return HashMap::default();
    }
    view.running
        .iter()
        .filter(|r| r.preempting)
        .chain(&view.promised)
        .filter_map(|r| {
            let owner = r.preempted_for.filter(|owner| waiting.contains(owner))?;
            Some((address(r), owner))
        })
        .collect()
}

/// Holds the free GPUs of a reclaiming job's placement for it, so that no
/// later job of this cycle takes them.
pub(super) fn hold(
    (placement, host): (&[NodePlacement], (Option<crate::sched::HostAsk>, bool)),
    index: &mut FreeIndex,
    masked: Option<&mut FreeIndex>,
    reclaim: &mut Reclaimer,
) {
    index.remove(placement, host);
    if let Some(masked) = masked {
        masked.remove(placement, host);
    }
    reclaim.taken(placement, host.0);
}
