//! Submit and cancel: what the state task does with a request of new jobs
//! (checked against the policy, caps, reservations and known nodes) or
//! with a cancel, hold, signal or requeue.

use super::*;

impl State {
    /// Refuses a submit that would take `user` past a `max_submit_per_user`:
    /// their jobs pending or running (each task of an array) and `adding`.
    fn check_submit_caps(&self, user: &str, adding: &[Arc<JobSpec>]) -> Result<(), Error> {
        let n_jobs = |spec: &JobSpec| spec.array.as_ref().map_or(1, |array| u64::from(array.len()));
        let adding: Vec<(&str, &str, u64)> = adding
            .iter()
            .map(|spec| (spec.team.as_str(), spec.qos.as_str(), n_jobs(spec)))
            .collect();
        let held = self
            .jobs
            .values()
            .filter(|job| job.user == user && !job.state.is_finished())
            .map(|job| {
                // An array's tasks not yet jobs of their own; those that
                // are count as the jobs they are.
                let n = match &job.array {
                    Some(progress) => n_jobs(&job.spec).saturating_sub(u64::from(progress.materialized)),
                    None => 1,
                };
                (job.spec.team.as_str(), job.spec.qos.as_str(), n)
            });
        match gpool_core::sched::limits::submit_refusal(&self.policy.sharing, user, held, &adding) {
            Some(reason) => Err(Error::OverLimit(reason)),
            None => Ok(()),
        }
    }

    /// Checks the jobs of a submit request and adds them: their ids, and
    /// the writes.
    pub(super) fn submit(
        &mut self,
        caller: &Caller,
        specs: Vec<Arc<JobSpec>>,
        now: Timestamp,
    ) -> Result<(Vec<JobId>, Vec<Write>), Error> {
        if specs.is_empty() {
            return Err(Error::InvalidRequest {
                field: "specs",
                reason: "no job in the request".into(),
            });
        }
        let mut nodes: Vec<Node> = self.nodes.values().cloned().collect();
        nodes.extend(self.sleeping_nodes());
        let of = specs.len();
        let mut checked = Vec::with_capacity(specs.len());
        // The id each job of the request gets: an array's tasks take the
        // ids after its own.
        let mut request_ids: Vec<JobId> = Vec::with_capacity(specs.len());
        let mut next_id = self.next_job_id;
        // The last spec as given, and as checked: the same spec again (a
        // batch of alike jobs) is checked once, unless it names other jobs.
        let mut last: Option<(Arc<JobSpec>, Arc<JobSpec>)> = None;
        for (spec_idx, given) in specs.into_iter().enumerate() {
            let index = spec_idx + 1;
            if let Some((_, checked_spec)) = last
                .as_ref()
                .filter(|(last_given, _)| Arc::ptr_eq(last_given, &given) && given.dependencies.is_empty())
            {
                request_ids.push(JobId(next_id));
                next_id += 1 + checked_spec.array.as_ref().map_or(0, |array| u64::from(array.len()));
                checked.push(checked_spec.clone());
                continue;
            }
            let mut spec = (*given).clone();
            self.admit_spec(&mut spec, caller, (index, of), now)?;
            self.resolve_dependencies(&mut spec, (index, of), &request_ids)?;
            if let Some(pool) = self.policy.pool(&spec.pool) {
                pool.defaults.apply(&mut spec);
            }
            check_feasible(&spec, &self.policy, &nodes).map_err(|source| Error::Infeasible { index, of, source })?;
            request_ids.push(JobId(next_id));
            next_id += 1 + spec.array.as_ref().map_or(0, |array| u64::from(array.len()));
            spec.env = self.intern_env(&spec.env);
            let spec = self.share_spec(Arc::new(spec));
            last = Some((given, spec.clone()));
            checked.push(spec);
        }
        self.check_submit_caps(&caller.user, &checked)?;
        let (ids, writes) = self.insert_submitted(caller, checked, now);
        Ok((ids, writes))
    }

    /// Checks one spec of a submit against the policy, caps, reservations
    /// and notify rules (job `index` of `of`), admitting it to its team.
    fn admit_spec(
        &self,
        spec: &mut JobSpec,
        caller: &Caller,
        (index, of): (usize, usize),
        now: Timestamp,
    ) -> Result<(), Error> {
        self.policy
            .sharing
            .admit(spec, caller, DEFAULT_TEAM)
            .map_err(|refusal| match refusal {
                Refusal::Spec(source) => Error::InvalidSpec { index, of, source },
                Refusal::Denied(source) => Error::SubmitDenied { index, of, source },
            })?;
        spec.validate()
            .map_err(|source| Error::InvalidSpec { index, of, source })?;
        if let Some(reason) =
            gpool_core::sched::limits::never_within_caps(&self.policy.sharing, &spec.team, &spec.qos, spec.total_gpus())
        {
            return Err(Error::InvalidSpec {
                index,
                of,
                source: gpool_core::spec::spec_error("gpus", reason),
            });
        }
        if !spec.reservation.is_empty() {
            gpool_core::sched::reservations::admit(
                &self.policy.reservations,
                &spec.reservation,
                (&caller.user, &spec.team),
                &self.policy.sharing,
                now,
            )
            .map_err(|reason| Error::InvalidSpec {
                index,
                of,
                source: gpool_core::spec::spec_error("reservation", reason),
            })?;
        }
        if let Some(notify) = &spec.notify {
            self.notify_rules.admit(notify).map_err(|reason| Error::InvalidSpec {
                index,
                of,
                source: gpool_core::spec::spec_error("notify", reason),
            })?;
        }
        Ok(())
    }

    /// Points a spec's dependencies at job ids: jobs that exist, or earlier
    /// jobs of this request (`request_ids`).
    fn resolve_dependencies(
        &mut self,
        spec: &mut JobSpec,
        (index, of): (usize, usize),
        request_ids: &[JobId],
    ) -> Result<(), Error> {
        // Dependencies name jobs that exist, or earlier jobs of this
        // request (whose ids are known from here on).
        for dependency in &mut spec.dependencies {
            let target = match dependency.target {
                DepTarget::InRequest(position) if (1..index).contains(&position) => request_ids[position - 1],
                DepTarget::InRequest(position) => {
                    return Err(Error::InvalidSpec {
                        index,
                        of,
                        source: gpool_core::spec::spec_error(
                            "dependency",
                            format!("job {position} of the request is not an earlier job of it"),
                        ),
                    })
                }
                DepTarget::Job(id) if self.bring_back(id)? => id,
                DepTarget::Job(id) => {
                    return Err(Error::InvalidSpec {
                        index,
                        of,
                        source: gpool_core::spec::spec_error("dependency", format!("job {id} does not exist")),
                    })
                }
            };
            dependency.target = DepTarget::Job(target);
        }
        Ok(())
    }

    /// Makes pending jobs of the checked specs: their ids, and the writes.
    fn insert_submitted(
        &mut self,
        caller: &Caller,
        checked: Vec<Arc<JobSpec>>,
        now: Timestamp,
    ) -> (Vec<JobId>, Vec<Write>) {
        let mut ids = Vec::with_capacity(checked.len());
        let mut writes = Vec::with_capacity(checked.len() + 1);
        for spec in checked {
            let id = JobId(self.next_job_id);
            let n_tasks = spec.array.as_ref().map(|array| array.len());
            self.next_job_id += 1 + n_tasks.map_or(0, u64::from);
            if let Some(n_tasks) = n_tasks {
                self.arrays.insert(id, n_tasks);
            }
            let job = Job {
                array: n_tasks.map(|_| Default::default()),
                ..Job::pending(id, spec, &caller.user, now)
            };
            self.jobs.insert(id, Box::new(job));
            self.active.insert(id);
            self.count_dep_targets(id, true);
            self.refresh_waiting(id);
            ids.push(id);
            writes.push(Write::Job(id));
        }
        writes.push(Write::NextJobId);
        (ids, writes)
    }

    /// Cancels, holds, signals or requeues each of `ids`: an outcome for each.
    pub(super) fn cancel(
        &mut self,
        caller: &Caller,
        ids: &[JobId],
        mode: CancelMode,
        now: Timestamp,
        out: &mut Batch,
    ) -> Result<Vec<CancelOutcome>, Error> {
        if ids.is_empty() {
            return Err(Error::InvalidRequest {
                field: "ids",
                reason: "no job id given".into(),
            });
        }
        // Each id on its own: one that names no job, or a job the caller
        // may not touch, is reported and the others go ahead.
        let mut outcomes = Vec::with_capacity(ids.len());
        for id in ids {
            let found = match self.find_job(*id) {
                Ok(found) => found.map(std::borrow::Cow::into_owned),
                Err(err) => {
                    outcomes.push(CancelOutcome {
                        id: *id,
                        refused: Some(err),
                        ..CancelOutcome::default()
                    });
                    continue;
                }
            };
            let refused = match &found {
                None => Some(Error::UnknownJob(*id)),
                Some(job) => {
                    let job = job.auth_ref();
                    let action = match mode {
                        CancelMode::Signal(_) => Action::SignalJob(job),
                        _ => Action::CancelJob(job),
                    };
                    authorize(caller, &action).err().map(Error::from)
                }
            };
            if let Some(refused) = refused {
                outcomes.push(CancelOutcome {
                    id: *id,
                    state: found.map(|job| job.state),
                    refused: Some(refused),
                    ..CancelOutcome::default()
                });
                continue;
            }
            let outcome = self.cancel_with_tasks(caller, *id, mode, now, out);
            outcomes.push(outcome);
        }
        Ok(outcomes)
    }

    /// Cancels (holds, signals, requeues) `id`, an array with its tasks,
    /// once the caller may: its outcome.
    fn cancel_with_tasks(
        &mut self,
        caller: &Caller,
        id: JobId,
        mode: CancelMode,
        now: Timestamp,
        out: &mut Batch,
    ) -> CancelOutcome {
        // A task that is not a job yet becomes one when it is cancelled,
        // held or released alone (a signal or requeue has nothing to
        // do to it); an array takes the request with its tasks.
        if matches!(
            mode,
            CancelMode::Cancel | CancelMode::CancelPending | CancelMode::Hold(_)
        ) {
            self.materialize(id, out);
        }
        let mut targets = vec![id];
        if let Some(array) = self.jobs.get(&id).filter(|job| job.array.is_some()) {
            targets.extend(self.array_task_ids(array));
        }
        let mut outcome = CancelOutcome {
            id,
            ..CancelOutcome::default()
        };
        for target in targets {
            let applied = self.cancel_one(caller, target, mode, now, out);
            outcome.cancelled |= applied.cancelled;
            outcome.signalled |= applied.signalled;
            outcome.requeued |= applied.requeued;
            if target == id {
                outcome.held = applied.held;
                outcome.updated = applied.updated;
            }
        }
        outcome.state = self.state_of(id);
        outcome
    }

    /// `cancel` for one job the caller may act on.
    fn cancel_one(
        &mut self,
        caller: &Caller,
        id: JobId,
        mode: CancelMode,
        now: Timestamp,
        out: &mut Batch,
    ) -> CancelOutcome {
        let mut outcome = CancelOutcome {
            id,
            ..CancelOutcome::default()
        };
        let Some(job) = self.jobs.get(&id) else {
            return outcome;
        };
        let running = match &job.state {
            JobState::Running { epoch, placement, .. } => Some((*epoch, placement.clone())),
            _ => None,
        };
        match (mode, &running) {
            (CancelMode::Hold(hold), _) => {
                // Only a pending job is held or released; others as they are.
                let before = job.held;
                self.apply_event(id, &JobEvent::Hold { held: hold }, now, out);
                outcome.held = self.jobs.get(&id).is_some_and(|job| job.held);
                outcome.updated = outcome.held != before;
            }
            (CancelMode::Signal(signal), Some((epoch, placement))) => {
                for part in placement {
                    out.messages
                        .push((part.node.clone(), signal_message(id, *epoch, signal)));
                }
                outcome.signalled = true;
            }
            (CancelMode::Requeue, Some((epoch, _))) => {
                outcome.requeued = self.requeue_attempt(id, *epoch, &caller.user, now, out);
            }
            (CancelMode::CancelPending, None) | (CancelMode::Cancel, _) if !job.state.is_finished() => {
                let event = JobEvent::Cancel {
                    by: caller.user.clone(),
                    now,
                };
                // Pending and running jobs always take a cancel.
                self.apply_event(id, &event, now, out);
                if let Some((epoch, placement)) = running {
                    for part in placement {
                        out.messages.push((part.node, kill_message(id, epoch)));
                    }
                }
                outcome.cancelled = true;
            }
            _ => {}
        }
        outcome
    }
}
