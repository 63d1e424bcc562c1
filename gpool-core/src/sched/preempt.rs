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

/// One job's reclaim as it goes: what is being freed that it may count
/// on, the GPUs freed on each node (by index), and the nodes it has room
/// on once they are free.
struct Search<'v> {
    ending: Vec<&'v RunningJob>,
    freed_on: HashMap<usize, Vec<u32>, FastHash>,
    with_room: HashSet<usize, FastHash>,
    pool: Option<&'v crate::model::PoolDef>,
    keep: Option<Keep>,
}

/// Where a job fits: the freed jobs it uses, and its placement.
type Fit<'v> = (Vec<&'v RunningJob>, Vec<NodePlacement>);

pub(super) struct Reclaimer<'v> {
    view: &'v ClusterView,
    policy: &'v Policy,
    now: Timestamp,
    /// The nodes with this cycle's starts marked busy.
    nodes: Vec<NodeView>,
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
    /// work, or any job where a QoS preempts lower classes.
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
            nodes: view.nodes.clone(),
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
                || view.running.iter().any(|r| r.preempting || r.burst)
                || !view.promised.is_empty(),
            by_cost: {
                let mut keyed: Vec<(f64, f64, &RunningJob)> = view
                    .running
                    .iter()
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
    pub(super) fn nodes(&self) -> &[NodeView] {
        &self.nodes
    }

    /// Records a start of this cycle, with the CPUs and memory it takes.
    pub(super) fn taken(&mut self, placement: &[NodePlacement], host: Option<crate::sched::HostAsk>) {
        for part in placement {
            if let Some(node_idx) = self.node_idx.get(part.node.as_str()) {
                let node = &mut self.nodes[*node_idx];
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

    /// Where `job`'s reclaim starts: what is being freed that it may count
    /// on (its promises and its own victims first, then victims nobody
    /// waiting owns), and the nodes it has room on once that is free.
    fn search(&self, job: &PendingJob, keep: Option<Keep>) -> Search<'v> {
        let may_count_on = |r: &&'v RunningJob| {
            !self.claimed.contains(&address(r)) && self.owner.get(&address(r)).is_none_or(|owner| *owner == job.id)
        };
        let mut ending: Vec<&'v RunningJob> = self
            .view
            .promised
            .iter()
            .filter(|p| self.owner.get(&address(p)) == Some(&job.id) && !self.claimed.contains(&address(p)))
            .chain(self.view.running.iter().filter(|r| r.preempting).filter(may_count_on))
            .collect();
        ending.sort_by_key(|r| self.owner.get(&address(r)) != Some(&job.id));
        // Nodes the job has room on once the freed GPUs are free: kept up
        // to date as victims are added, so a placement check looks only at
        // them, never at every node with a free GPU again.
        let pool = self.policy.pool(&job.shape.pool);
        let freed_on = self.freed_on(&ending);
        let with_room = self
            .with_free
            .iter()
            .chain(freed_on.keys())
            .copied()
            .filter(|node_idx| self.has_room(job, pool, *node_idx, &freed_on))
            .collect();
        Search {
            ending,
            freed_on,
            with_room,
            pool,
            keep,
        }
    }

    /// The running jobs `job` may take back, cheapest first: burst work
    /// for its guarantee, lower classes where its QoS preempts them; never
    /// its own team's running twin, nor work younger than its QoS's
    /// `min_runtime`.
    fn candidates(&self, job: &PendingJob, guaranteed: bool) -> Vec<&'v RunningJob> {
        let sharing = &self.policy.sharing;
        let job_pool = self.policy.pool(&job.shape.pool).map(|pool| pool.name.as_str());
        // Its own team's running twin: same QoS, pool, models and size.
        let twin = |r: &RunningJob| {
            r.team == job.shape.team.as_str()
                && sharing.qos(&r.qos).map(|q| &q.name) == sharing.qos(&job.shape.qos).map(|q| &q.name)
                && self.policy.pool(&r.pool).map(|p| p.name.as_str()) == job_pool
                && r.gpu_types == job.shape.gpu_types
                && r.gpus() == job.total_gpus()
        };
        let job_qos = sharing.qos(&job.shape.qos).map_or(0, |qos| qos.priority);
        let preempts_lower = sharing.qos(&job.shape.qos).is_some_and(|qos| qos.preempt_lower);
        self.by_cost
            .iter()
            .copied()
            .filter(|r| !r.preempting && !self.claimed.contains(&address(r)) && !twin(r))
            .filter(|r| {
                let victim_qos = sharing.qos(&r.qos);
                let lower = victim_qos.map_or(0, |qos| qos.priority) < job_qos;
                let old_enough =
                    victim_qos.map_or(0, |qos| qos.min_runtime_secs) as i64 * 1000 <= self.now.0 - r.started_at.0;
                // Burst work of a class that may preempt this job's is not
                // taken back for its guarantee: it would take it back in
                // turn, and the two would trade places every cycle.
                let outranks = victim_qos.is_some_and(|qos| qos.preempt_lower && qos.priority > job_qos);
                old_enough && ((guaranteed && r.burst && !outranks) || (preempts_lower && lower))
            })
            .take(MAX_CANDIDATES)
            .collect()
    }

    /// Adds victims until the job fits: the victims chosen and where it
    /// fits, or `None`. Only nodes a new victim frees GPUs on can change
    /// the answer, so the full placement check runs only when one of them
    /// now has room (and, for a gang, enough nodes do).
    fn add_victims(
        &self,
        job: &PendingJob,
        search: &mut Search<'v>,
        candidates: Vec<&'v RunningJob>,
    ) -> Option<(Vec<&'v RunningJob>, Fit<'v>)> {
        let mut chosen: Vec<&'v RunningJob> = Vec::new();
        for candidate in candidates {
            chosen.push(candidate);
            self.add_freed(&mut search.freed_on, candidate);
            let (gained, any_room) =
                self.recheck_room(job, search.pool, candidate, &search.freed_on, &mut search.with_room);
            let changed = gained || (job.shape.nodes == 1 && any_room);
            // With GPUs to keep free, any victim in the pool may be the one
            // that was missing.
            if (!changed && search.keep.is_none()) || search.with_room.len() < job.shape.nodes as usize {
                continue;
            }
            let freed: Vec<&RunningJob> = search.ending.iter().chain(&chosen).copied().collect();
            if let Some(used) = self.fits(job, &freed, &search.freed_on, &search.with_room, search.keep) {
                return Some((chosen, used));
            }
        }
        None
    }

    /// Gives back victims the job turned out not to need, costliest first:
    /// where it fits then, and which of `chosen` it keeps. Only the
    /// given-back victim's nodes change, so each try looks again at them
    /// alone.
    fn give_back(
        &self,
        job: &PendingJob,
        search: &mut Search<'v>,
        chosen: &[&'v RunningJob],
        mut used: Fit<'v>,
    ) -> (Fit<'v>, Vec<bool>) {
        let mut by_cost: Vec<usize> = (0..chosen.len()).collect();
        by_cost.sort_by(|a, b| {
            chosen[*b]
                .lost_gpu_secs(self.now)
                .total_cmp(&chosen[*a].lost_gpu_secs(self.now))
        });
        let mut keep = vec![true; chosen.len()];
        for drop_idx in by_cost {
            keep[drop_idx] = false;
            let dropped = chosen[drop_idx];
            self.unfree(&mut search.freed_on, dropped);
            let mut room = search.with_room.clone();
            self.recheck_room(job, search.pool, dropped, &search.freed_on, &mut room);
            let freed: Vec<&RunningJob> = search
                .ending
                .iter()
                .copied()
                .chain(chosen.iter().zip(&keep).filter(|(_, k)| **k).map(|(r, _)| *r))
                .collect();
            match self.fits(job, &freed, &search.freed_on, &room, search.keep) {
                Some(fewer) => {
                    used = fewer;
                    search.with_room = room;
                }
                None => {
                    keep[drop_idx] = true;
                    self.add_freed(&mut search.freed_on, dropped);
                }
            }
        }
        (used, keep)
    }

    /// Takes the victims `job` needs, within the waste budget: their
    /// preemptions, and how many jobs it waits on where it will run.
    fn commit(
        &mut self,
        job: &PendingJob,
        ending: &[&'v RunningJob],
        (chosen, keep): (&[&'v RunningJob], &[bool]),
        (used, placement): Fit<'v>,
        preemptions: &mut Vec<Preemption>,
    ) -> Option<(usize, Vec<NodePlacement>)> {
        // New victims only with every GPU already freed for this job in use:
        // a claim left aside would make it wait on more than it needs.
        let leaves_a_claim = ending
            .iter()
            .filter(|r| self.owner.get(&address(r)) == Some(&job.id))
            .any(|owned| !used.iter().any(|u| std::ptr::eq(*u, *owned)));
        if leaves_a_claim {
            return None;
        }
        let victims: Vec<&RunningJob> = chosen
            .iter()
            .zip(keep)
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
            epoch: r.epoch,
            for_job: job.id,
            lost_gpu_secs: r.lost_gpu_secs(self.now),
        }));
        self.claim(&used);
        Some((self.n_running(&used), placement))
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
        room_on(job, pool, &self.nodes[node_idx], extra)
    }

    /// Whether `job` fits once `freed` end (their GPUs by node:
    /// `freed_on`; the nodes it then has room on: `with_room`); if so, the
    /// freed jobs whose GPUs its placement uses.
    fn fits(
        &self,
        job: &PendingJob,
        freed: &[&'v RunningJob],
        freed_on: &HashMap<usize, Vec<u32>, FastHash>,
        with_room: &HashSet<usize, FastHash>,
        keep: Option<Keep>,
    ) -> Option<(Vec<&'v RunningJob>, Vec<NodePlacement>)> {
        if freed.is_empty() {
            return None;
        }
        // The job did not fit before, so a node with freed GPUs must have
        // room now. A single-node job can only be on such a node; a gang
        // may use nodes with free GPUs too.
        if !with_room.iter().any(|node_idx| freed_on.contains_key(node_idx)) {
            return None;
        }
        let mut candidates: Vec<usize> = with_room
            .iter()
            .copied()
            .filter(|node_idx| job.shape.nodes > 1 || freed_on.contains_key(node_idx))
            .collect();
        if candidates.len() < job.shape.nodes as usize {
            return None;
        }
        // Then the real placement, on the nodes that could take part.
        candidates.sort_unstable();
        let nodes = self.with_freed(&candidates, freed_on);
        let freed_gpu = |node: &str, gpu: u32| {
            self.node_idx
                .get(node)
                .and_then(|idx| freed_on.get(idx))
                .is_some_and(|gpus| gpus.contains(&gpu))
        };
        let free_used = |placement: &[NodePlacement]| -> u64 {
            placement
                .iter()
                .map(|part| part.gpu_indices.iter().filter(|g| !freed_gpu(&part.node, **g)).count() as u64)
                .sum()
        };
        let place = |nodes: &[NodeView]| FreeIndex::build(nodes, self.policy).place(job, self.policy).ok();
        let placement = match keep.filter(|keep| keep.kept > 0) {
            None => place(&nodes)?,
            // Kept GPUs stay free: the job may take free GPUs only as far
            // as the pool has more than it keeps, else only freed ones.
            Some(keep) => {
                let allowance = keep.pool_free_now.saturating_sub(keep.kept);
                match place(&nodes).filter(|placement| free_used(placement) <= allowance) {
                    Some(placement) => placement,
                    None => {
                        let freed_only: Vec<NodeView> = nodes
                            .iter()
                            .map(|node| {
                                let mut node = node.clone();
                                for gpu in &mut node.gpus {
                                    gpu.busy = !freed_gpu(&node.name, gpu.index);
                                }
                                node
                            })
                            .collect();
                        place(&freed_only)?
                    }
                }
            }
        };
        Some((used_by(freed, &placement), placement))
    }

    /// The nodes `candidates` (by index), with the GPUs freed on them free.
    fn with_freed(&self, candidates: &[usize], freed_on: &HashMap<usize, Vec<u32>, FastHash>) -> Vec<NodeView> {
        candidates
            .iter()
            .map(|node_idx| {
                let mut node = self.nodes[*node_idx].clone();
                if let Some(extra) = freed_on.get(node_idx) {
                    for gpu in &mut node.gpus {
                        if extra.contains(&gpu.index) {
                            gpu.busy = false;
                        }
                    }
                }
                node
            })
            .collect()
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

/// The jobs of `freed` whose GPUs `placement` uses.
fn used_by<'v>(freed: &[&'v RunningJob], placement: &[NodePlacement]) -> Vec<&'v RunningJob> {
    freed
        .iter()
        .filter(|running| {
            running.placement.iter().any(|part| {
                placement
                    .iter()
                    .any(|p| p.node == part.node && p.gpu_indices.iter().any(|g| part.gpu_indices.contains(g)))
            })
        })
        .copied()
        .collect()
}
