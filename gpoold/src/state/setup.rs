//! Building the state from what the store loaded, and taking the policy of
//! a re-read config.

use super::*;

impl State {
    /// The state of what the store loaded, under `config`.
    pub fn new(loaded: store::Loaded, config: &crate::config::Config, token_key: Key) -> State {
        let nodes: BTreeMap<String, Node> = loaded.nodes.into_iter().map(|node| (node.name.clone(), node)).collect();
        // Known nodes get a full timeout from this start to reconnect.
        let started = std::time::Instant::now();
        let last_seen = nodes.keys().map(|name| (name.clone(), started)).collect();
        // Nodes already down count from this start towards being forgotten.
        let down_since = nodes
            .values()
            .filter(|node| !node.alive)
            .map(|node| (node.name.clone(), started))
            .collect();
        let mut state = State {
            jobs: loaded.jobs.into_iter().map(|job| (job.id, Box::new(job))).collect(),
            nodes,
            next_job_id: loaded.next_job_id,
            words: words::Words::default(),
            policy: config.policy.clone(),
            created_reservations: loaded.reservations,
            notify_rules: config.notify.clone(),
            admins: config.admins.clone(),
            next_epoch: loaded.next_epoch,
            links: HashMap::new(),
            last_seen,
            gpu_samples: HashMap::new(),
            attempts: HashMap::new(),
            node_timeout_ms: config.node_timeout.as_millis() as i64,
            down_since,
            forget_nodes_after: config.forget_nodes_after,
            keep_ended_jobs: config.keep_ended_jobs,
            accounting: config.accounting.clone(),
            last_compaction: None,
            usage: loaded.usage,
            promises: gpool_core::sched::Promises::default(),
            waste: gpool_core::sched::WasteBudget::default(),
            tokens: loaded.tokens,
            token_key,
            envs: std::collections::HashSet::new(),
            last_spec: None,
            arrays: BTreeMap::new(),
            array_running: HashMap::new(),
            active: std::collections::BTreeSet::new(),
            waiting: BTreeMap::new(),
            queue: Queue::default(),
            not_plain: std::collections::BTreeSet::new(),
            ended: loaded.ended,
            dep_targets: HashMap::new(),
            to_evict: Vec::new(),
            evicted_since_prune: 0,
            metrics: Arc::new(crate::metrics::Metrics::default()),
            sched_generation: 0,
            straggler_after: config.straggler_after,
            health_policy: config.health.clone(),
            gpu_watch: HashMap::new(),
            health_checks: HashMap::new(),
            running_on: HashMap::new(),
            power: Default::default(),
            power_programs: Vec::new(),
        };
        state.set_power(&config.power, crate::wall_clock());
        state.share_loaded_specs();
        state.index_active_jobs();
        state.restore_preempt_deadlines();
        state.add_created_reservations();
        state
    }

    /// Interns the loaded jobs' environments and shares their alike specs.
    fn share_loaded_specs(&mut self) {
        let mut jobs = std::mem::take(&mut self.jobs);
        // The store gives alike environments one Arc, and such jobs come
        // one after another: the last one's is compared by pointer, not
        // hashed again for every job that has it.
        type Env = Arc<[(String, String)]>;
        let mut last: Option<(Env, Env)> = None;
        for job in jobs.values_mut() {
            let env = match &last {
                Some((loaded, interned)) if Arc::ptr_eq(loaded, &job.spec.env) => interned.clone(),
                _ => {
                    let interned = self.intern_env(&job.spec.env);
                    last = Some((job.spec.env.clone(), interned.clone()));
                    interned
                }
            };
            if !Arc::ptr_eq(&env, &job.spec.env) {
                Arc::make_mut(&mut job.spec).env = env;
            }
            job.spec = self.share_spec(job.spec.clone());
        }
        self.jobs = jobs;
    }

    /// Indexes the loaded jobs that have not ended: active, waiting,
    /// dependency targets, running array tasks and jobs running on each node.
    fn index_active_jobs(&mut self) {
        self.active = self
            .jobs
            .values()
            .filter(|job| !job.state.is_finished())
            .map(|job| job.id)
            .collect();
        let active: Vec<JobId> = self.active.iter().copied().collect();
        for id in active {
            self.count_dep_targets(id, true);
            self.refresh_waiting(id);
        }
        self.count_running_tasks();
        let running: Vec<(JobId, Vec<String>)> = self
            .active_jobs()
            .filter_map(|job| match &job.state {
                JobState::Running { placement, .. } => {
                    Some((job.id, placement.iter().map(|part| part.node.clone()).collect()))
                }
                _ => None,
            })
            .collect();
        for (id, nodes) in running {
            for node in nodes {
                self.running_on.entry(node).or_default().insert(id);
            }
        }
    }

    /// Takes the policy and admins of a re-read config (listen address and
    /// state dir need a restart and are left alone), and ends the links of
    /// agents whose certificates are revoked.
    pub(super) fn reload(
        &mut self,
        caller: Option<&Caller>,
        config: crate::config::Config,
        revoked: &std::collections::HashSet<String>,
    ) -> Result<String, Error> {
        if let Some(caller) = caller {
            authorize(caller, &Action::ReloadPolicy)?;
        }
        self.links.retain(|node, conn| {
            let keep = !conn.cert_serial.as_ref().is_some_and(|serial| revoked.contains(serial));
            if !keep {
                tracing::warn!(node, "agent link ended: its certificate is revoked");
            }
            keep
        });
        let sharing = &config.policy.sharing;
        let summary = format!(
            "{} pools, {} teams, {} QoS classes",
            config.policy.pools.len(),
            sharing.teams.len(),
            sharing.qos.len()
        );
        tracing::info!("policy reloaded: {summary}");
        self.policy = config.policy;
        self.set_power(&config.power, crate::wall_clock());
        self.add_created_reservations();
        self.notify_rules = config.notify;
        self.admins = config.admins;
        self.keep_ended_jobs = config.keep_ended_jobs;
        self.health_policy = config.health.clone();
        self.accounting = config.accounting;
        self.restore_preempt_deadlines();
        Ok(summary)
    }
}
