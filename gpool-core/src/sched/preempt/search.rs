//! One job's reclaim, step by step: where it starts, the candidates,
//! victims added until the job fits, victims given back, and the commit
//! within the waste budget.

use super::*;

/// One job's reclaim as it goes: what is being freed that it may count
/// on, the GPUs freed on each node (by index), and the nodes it has room
/// on once they are free.
pub(super) struct Search<'v> {
    pub(super) ending: Vec<&'v RunningJob>,
    pub(super) freed_on: HashMap<usize, Vec<u32>, FastHash>,
    pub(super) with_room: HashSet<usize, FastHash>,
    pub(super) pool: Option<&'v crate::model::PoolDef>,
    pub(super) keep: Option<Keep>,
}

/// Where a job fits: the freed jobs it uses, and its placement.
pub(super) type Fit<'v> = (Vec<&'v RunningJob>, Vec<NodePlacement>);

impl<'v> Reclaimer<'v> {
    /// Where `job`'s reclaim starts: what is being freed that it may count
    /// on (its promises and its own victims first, then victims nobody
    /// waiting owns), and the nodes it has room on once that is free.
    pub(super) fn search(&self, job: &PendingJob, keep: Option<Keep>) -> Search<'v> {
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
    pub(super) fn candidates(&self, job: &PendingJob, guaranteed: bool) -> Vec<&'v RunningJob> {
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
        // Its own team's more served work, under LAS order (twins too).
        let las = sharing.las.as_ref();
        let takes_back = |r: &RunningJob| las.is_some_and(|las| las.takes_back(r, job, self.now));
        if !guaranteed && !preempts_lower && las.is_none() {
            // It may take nothing back (the filter below passes no one).
            return Vec::new();
        }
        self.by_cost
            .iter()
            .copied()
            .filter(|r| !r.preempting && !self.claimed.contains(&address(r)))
            // What may make it a victim at all, before its QoS is looked up.
            .filter(|r| (guaranteed && r.burst) || preempts_lower || takes_back(r))
            .filter(|r| {
                let victim_qos = sharing.qos(&r.qos);
                let lower = victim_qos.map_or(0, |qos| qos.priority) < job_qos;
                let old_enough =
                    victim_qos.map_or(0, |qos| qos.min_runtime_secs) as i64 * 1000 <= self.now.0 - r.started_at.0;
                // Burst work of a class that may preempt this job's is not
                // taken back for its guarantee: it would take it back in
                // turn, and the two would trade places every cycle.
                let outranks = victim_qos.is_some_and(|qos| qos.preempt_lower && qos.priority > job_qos);
                old_enough
                    && ((guaranteed && r.burst && !outranks && !twin(r))
                        || (preempts_lower && lower && !twin(r))
                        || takes_back(r))
            })
            .take(MAX_CANDIDATES)
            .collect()
    }

    /// Adds victims until the job fits: the victims chosen and where it
    /// fits, or `None`. Only nodes a new victim frees GPUs on can change
    /// the answer, so the full placement check runs only when one of them
    /// now has room (and, for a gang, enough nodes do).
    pub(super) fn add_victims(
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
    pub(super) fn give_back(
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
    pub(super) fn commit(
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

    /// Whether `job` fits once `freed` end (their GPUs by node:
    /// `freed_on`; the nodes it then has room on: `with_room`); if so, the
    /// freed jobs whose GPUs its placement uses.
    pub(super) fn fits(
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
                let mut node = NodeView::clone(&self.nodes[*node_idx]);
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
