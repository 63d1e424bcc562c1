//! The scheduler's view of the state: what each cycle plans from, and the
//! entries of waiting jobs kept up to date for it.

use super::*;

impl State {
    /// The scheduler's input: nodes with busy GPUs marked, the queue, the
    /// running jobs, the teams' usage and the hour's waste budget. For a
    /// cycle that only starts and preempts jobs (`starts_only`: no words on
    /// why jobs wait), of the jobs that wait on GPUs alone only those of
    /// each shape it could start, where that gives the same starts and
    /// preemptions (`gpool_core::sched::window_gpus`); the view then says
    /// it is `windowed`.
    pub fn cluster_view(&self, now: Timestamp, starts_only: bool) -> ClusterView {
        #[cfg(debug_assertions)]
        self.check_waiting();
        // Jobs with dependencies or singletons are looked at each cycle
        // (their state depends on others'); the rest only by their view.
        let gated: Vec<&Job> = self
            .not_plain
            .iter()
            .filter(|id| self.waiting.get(id).is_some_and(|waiting| waiting.gated))
            .filter_map(|id| self.job(*id))
            .collect();
        let singletons = self.singleton_holders(&gated);
        let running: Vec<&Job> = self.running().collect();
        let nodes = self.node_views(&running);
        let running: Vec<_> = running
            .into_iter()
            .filter_map(|job| self.running_view(job))
            .map(|mut view| {
                // A withdrawn preemption: it runs on, and may be taken again.
                let preempting = self.preemption(view.id);
                view.preempting &= !preempting.is_some_and(|preempting| preempting.withdrawn);
                view.preempted_for = preempting
                    .and_then(|preempting| preempting.for_job)
                    .filter(|_| view.preempting);
                view
            })
            .collect();
        let promised = self.promised(&nodes);
        let mut others = self.other_pending(now, &singletons);
        let windowed = gpool_core::sched::cycle::window_for(
            &nodes,
            &running,
            (&self.policy, now),
            &self.queue,
            others.len(),
            !starts_only,
        );
        let mut pending: Vec<Arc<PendingJob>> = match windowed {
            Some(gpus) => self.queue.window(gpus).cloned().collect(),
            None => {
                let mut all = Vec::with_capacity(self.waiting.len());
                all.extend(
                    self.waiting
                        .values()
                        .filter(|waiting| waiting.plain())
                        .map(|waiting| waiting.view.clone()),
                );
                all
            }
        };
        pending.append(&mut others);
        ClusterView {
            nodes,
            pending,
            running,
            promised,
            usage: self.usage.clone(),
            waste_budget_gpu_secs: self.waste_budget(now),
            windowed: windowed.is_some(),
        }
    }

    /// The jobs beside those that wait on GPUs alone that may start: held,
    /// gated, arrays and their tasks.
    fn other_pending(&self, now: Timestamp, singletons: &HashMap<(&str, &str), JobId>) -> Vec<Arc<PendingJob>> {
        let mut others: Vec<Arc<PendingJob>> = Vec::new();
        let mut arrays: Vec<(&Job, bool)> = Vec::new();
        let mut pending_tasks: HashMap<JobId, Vec<Arc<PendingJob>>> = HashMap::new();
        for (id, waiting) in self.not_plain.iter().filter_map(|id| self.waiting.get_key_value(id)) {
            let ready = !waiting.held
                && (!waiting.gated
                    || self
                        .job(*id)
                        .is_some_and(|job| begun(job, now) && self.dependencies_met(job, singletons)));
            match (waiting.array, waiting.task_of) {
                (true, _) => arrays.extend(self.job(*id).map(|job| (job, ready))),
                (false, _) if !ready => {}
                (false, Some(array)) => pending_tasks.entry(array).or_default().push(waiting.view.clone()),
                (false, None) => others.push(waiting.view.clone()),
            }
        }
        // Tasks that are not jobs yet, for all arrays together, at most
        // `ARRAY_VIEW_BUDGET`, shared out evenly: the cycle's cost stays
        // bounded however many arrays wait, and every array is seen.
        let n_ready = arrays.iter().filter(|(_, ready)| *ready).count().max(1);
        let window = (arrays::ARRAY_VIEW_BUDGET / n_ready).clamp(arrays::ARRAY_VIEW_MIN, arrays::ARRAY_VIEW_WINDOW);
        // More would be made and dropped again each cycle for nothing.
        let fleet_gpus: u64 = self.nodes.values().map(|node| node.gpus.len() as u64).sum();
        for (array, ready) in arrays {
            let tasks = pending_tasks.remove(&array.id).unwrap_or_default();
            let window = gpool_core::sched::cycle::array_tasks_seen(window, fleet_gpus, array.spec.total_gpus());
            self.array_view(array, ready, tasks, window, &mut others);
        }
        // Tasks of arrays that ended on their own terms (none, normally).
        others.extend(pending_tasks.into_values().flatten());
        others
    }

    /// Brings job `id`'s entry in `waiting` up to date: after anything
    /// that may change a pending job's view, hold or state.
    pub(super) fn refresh_waiting(&mut self, id: JobId) {
        let old = match self.jobs.get(&id).filter(|job| job.state == JobState::Pending) {
            Some(job) => self.waiting.insert(id, Waiting::of(job, &self.queue)),
            None => self.waiting.remove(&id),
        };
        if let Some(old) = old {
            if old.plain() {
                self.queue.remove(&old.view);
            } else {
                self.not_plain.remove(&id);
            }
        }
        if let Some(new) = self.waiting.get(&id) {
            if new.plain() {
                self.queue.insert(new.view.clone());
            } else {
                self.not_plain.insert(id);
            }
        }
    }

    /// In debug builds (every test's gpoold), each cycle checks `waiting`
    /// against the jobs themselves.
    #[cfg(debug_assertions)]
    fn check_waiting(&self) {
        let expected: BTreeMap<JobId, Waiting> = self
            .active_jobs()
            .filter(|job| job.state == JobState::Pending)
            .map(|job| (job.id, Waiting::of(job, &self.queue)))
            .collect();
        let ids = expected.keys().chain(self.waiting.keys());
        if let Some(id) = ids.into_iter().find(|id| expected.get(id) != self.waiting.get(id)) {
            panic!(
                "the scheduler's copy of pending job {id} is stale: {:?}, the job gives {:?}",
                self.waiting.get(id),
                expected.get(id)
            );
        }
        for (id, waiting) in &self.waiting {
            let filed = if waiting.plain() {
                self.queue.contains(&waiting.view)
            } else {
                self.not_plain.contains(id)
            };
            assert!(filed, "waiting job {id} is missing from the scheduler's queue");
        }
        assert_eq!(
            self.queue.len() + self.not_plain.len(),
            self.waiting.len(),
            "the scheduler's queue holds jobs that do not wait"
        );
    }

    /// The nodes as the scheduler sees them, with the GPUs of `running`
    /// busy; nothing is launched where no agent is linked right now.
    pub(super) fn node_views(&self, running: &[&Job]) -> Vec<NodeView> {
        let mut busy: HashMap<&str, Vec<u32>> = HashMap::new();
        let mut held: HashMap<&str, Vec<gpool_core::sched::HostHold>> = HashMap::new();
        // Nodes an --exclusive job runs on: all their GPUs are busy.
        let mut whole: std::collections::HashSet<&str> = std::collections::HashSet::new();
        for job in running {
            if let JobState::Running { placement, .. } = &job.state {
                let ask = gpool_core::sched::HostAsk::of(&job.spec);
                if job.spec.exclusive {
                    whole.extend(placement.iter().map(|part| part.node.as_str()));
                }
                for part in placement {
                    busy.entry(part.node.as_str()).or_default().extend(&part.gpu_indices);
                    if let Some(ask) = ask {
                        held.entry(part.node.as_str())
                            .or_default()
                            .push(gpool_core::sched::HostHold {
                                gpus: part.gpu_indices.clone(),
                                ask,
                            });
                    }
                }
            }
        }
        let mut nodes: Vec<NodeView> = self
            .nodes
            .values()
            // A node of a power group being put to sleep (or not yet taken
            // as up) is no place for work; the scheduler does not see it.
            .filter(|node| self.power.takes_work(&node.name))
            .map(|node| {
                let mut view = NodeView::from_node(node, busy.get(node.name.as_str()).map_or(&[], Vec::as_slice));
                if let (Some(host), Some(holds)) = (view.host.as_mut(), held.remove(node.name.as_str())) {
                    host.held = holds;
                }
                if whole.contains(node.name.as_str()) {
                    view.gpus.iter_mut().for_each(|gpu| gpu.busy = true);
                }
                if !self.is_linked(&node.name) {
                    view.availability = gpool_core::sched::Availability::Down;
                }
                view
            })
            .collect();
        mark_shares(&mut nodes, running, &self.policy.sharing.shares);
        nodes
    }

    /// Whether a scheduling cycle could start or preempt anything now
    /// (`gpool_core::sched::could_act`), looking at nodes and running jobs
    /// only: the pending queue is not read.
    pub fn cycle_could_act(&self) -> bool {
        let running: Vec<&Job> = self.running().collect();
        let running_views: Vec<_> = running.iter().filter_map(|job| self.running_view(job)).collect();
        gpool_core::sched::could_act(
            &self.node_views(&running),
            &running_views,
            &self.policy,
            crate::wall_clock(),
        )
    }

    /// Whether the newest job waits with no word yet on why (it was just
    /// submitted): then a cycle runs even where it could start nothing.
    /// Held jobs and jobs that wait on others are passed over (back to
    /// `UNEXPLAINED_LOOK_BACK` jobs): a cycle does not see them, so it
    /// never gives them words (they are their hold and their dependencies),
    /// and one such job last in line would make every cycle a whole one.
    pub fn newest_waits_unexplained(&self) -> bool {
        self.active
            .iter()
            .rev()
            .take(UNEXPLAINED_LOOK_BACK)
            .find(|id| {
                !self
                    .waiting
                    .get(id)
                    .is_some_and(|waiting| waiting.held || waiting.gated)
            })
            .and_then(|id| self.jobs.get(id))
            .is_some_and(|job| job.state == JobState::Pending && self.words.reasons(job.id).is_none())
    }
}

impl State {
    /// A running job as the scheduler sees it, its fraction of its GPU
    /// with it; `None` for any other job.
    pub(super) fn running_view(&self, job: &Job) -> Option<gpool_core::sched::RunningJob> {
        let mut view = running_view(job)?;
        view.share = self.share_of(job, &view.placement);
        Some(view)
    }

    /// What `job`'s fraction comes to on its GPU in `placement` (`None`:
    /// whole GPUs, or a GPU no longer known).
    pub(super) fn share_of(
        &self,
        job: &Job,
        placement: &[gpool_core::NodePlacement],
    ) -> Option<gpool_core::share::Share> {
        share_on(&self.nodes, &self.policy.sharing.shares, &job.spec, placement)
    }
}

impl State {
    /// The GPUs fractions share, each with its book (core's `SharedGpu`:
    /// the memory they hold, how many, whose), by node and GPU index.
    pub fn gpu_shares(&self) -> HashMap<(&str, u32), gpool_core::share::SharedGpu> {
        let mut shares: HashMap<(&str, u32), gpool_core::share::SharedGpu> = HashMap::new();
        for job in self.running().filter(|job| job.spec.gpu_share.is_some()) {
            let JobState::Running { placement, .. } = &job.state else {
                continue;
            };
            let (Some(share), Some(part)) = (self.share_of(job, placement), placement.first()) else {
                continue;
            };
            for index in &part.gpu_indices {
                let usable = self.usable_mib(&part.node, *index).unwrap_or(0);
                shares
                    .entry((part.node.as_str(), *index))
                    .or_insert_with(|| gpool_core::share::SharedGpu::new(usable))
                    .add(&share, &job.user);
            }
        }
        shares
    }

    /// What GPU `index` of `node` leaves to jobs (its memory less the
    /// driver's), if the node and GPU are known.
    pub(super) fn usable_mib(&self, node: &str, index: u32) -> Option<u64> {
        let gpu = self.nodes.get(node)?.gpus.iter().find(|gpu| gpu.index == index)?;
        Some(gpu.memory_mib.saturating_sub(gpu.reserved_mib))
    }
}

/// What `spec`'s fraction comes to on its GPU in `placement`, of `nodes`.
pub(super) fn share_on(
    nodes: &std::collections::BTreeMap<String, gpool_core::Node>,
    rules: &gpool_core::share::ShareRules,
    spec: &gpool_core::JobSpec,
    placement: &[gpool_core::NodePlacement],
) -> Option<gpool_core::share::Share> {
    let ask = spec.gpu_share.as_ref()?;
    let part = placement.first()?;
    let node = nodes.get(&part.node)?;
    let gpu = node
        .gpus
        .iter()
        .find(|gpu| Some(&gpu.index) == part.gpu_indices.first())?;
    ask.on(gpu.memory_mib.saturating_sub(gpu.reserved_mib), rules)
}

/// Marks the GPUs running fractions hold as shared in `nodes`.
fn mark_shares(nodes: &mut [NodeView], running: &[&Job], rules: &gpool_core::share::ShareRules) {
    for job in running {
        let (Some(ask), JobState::Running { placement, .. }) = (job.spec.gpu_share.as_ref(), &job.state) else {
            continue;
        };
        let Some(part) = placement.first() else {
            continue;
        };
        if let (Some(node), Some(&index)) = (
            nodes.iter_mut().find(|node| node.name == part.node),
            part.gpu_indices.first(),
        ) {
            node.take_share(index, (ask, &job.user), rules);
        }
    }
}

/// A running job as the scheduler sees it (whole GPUs); `None` for any
/// other job.
fn running_view(job: &Job) -> Option<gpool_core::sched::RunningJob> {
    match &job.state {
        JobState::Running {
            epoch,
            placement,
            started_at,
            burst,
            last_checkpoint_at,
            preempted_at,
        } => Some(gpool_core::sched::RunningJob {
            id: job.id,
            epoch: *epoch,
            user: job.user.to_string(),
            team: job.spec.team.to_string(),
            qos: job.spec.qos.to_string(),
            pool: job.spec.pool.to_string(),
            gpu_types: job.spec.gpu_types.clone(),
            burst: *burst,
            placement: placement.clone(),
            started_at: *started_at,
            last_checkpoint_at: *last_checkpoint_at,
            preempting: preempted_at.is_some(),
            preempted_for: None,
            ends_at: job
                .spec
                .time_limit_secs
                .map(|limit| Timestamp(started_at.0 + limit as i64 * 1000)),
            service_before_gpu_secs: job.service_gpu_secs,
            share: None,
        }),
        _ => None,
    }
}
