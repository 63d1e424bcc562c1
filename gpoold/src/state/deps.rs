//! Dependencies and singletons: where a pending job stands with the jobs
//! it waits on, and ending those whose dependency can never be met.

use super::*;

impl State {
    /// For `singleton`: by (user, name), the job that runs, else the
    /// earliest pending singleton (which may start first). `waiting`: the
    /// pending jobs, by id.
    pub fn singleton_holders<'a>(&'a self, waiting: &[&'a Job]) -> HashMap<(&'a str, &'a str), JobId> {
        // Only the names of waiting singletons matter (usually none): the
        // running jobs are not hashed each cycle for nothing.
        let wanted: std::collections::HashSet<(&str, &str)> = waiting
            .iter()
            .filter(|job| job.spec.singleton && !job.held)
            .map(|job| (job.user.as_str(), job.spec.name.as_str()))
            .collect();
        let mut holders: HashMap<(&str, &str), JobId> = HashMap::new();
        if wanted.is_empty() {
            return holders;
        }
        for job in self.running() {
            let key = (job.user.as_str(), job.spec.name.as_str());
            if wanted.contains(&key) {
                holders.insert(key, job.id);
            }
        }
        for job in waiting.iter().filter(|job| job.spec.singleton && !job.held) {
            holders
                .entry((job.user.as_str(), job.spec.name.as_str()))
                .or_insert(job.id);
        }
        holders
    }

    /// Where a pending job stands with its dependencies.
    pub fn dependency_state(&self, job: &Job, singletons: &HashMap<(&str, &str), JobId>) -> DepState {
        if job.spec.dependencies.is_empty() && !job.spec.singleton {
            return DepState::Met;
        }
        let holder = singletons
            .get(&(job.user.as_str(), job.spec.name.as_str()))
            .copied()
            .filter(|holder| *holder != job.id);
        dependency_state(job, |id| self.job(id), holder)
    }

    /// As `dependency_state`, for one job (the singleton scan only for a
    /// singleton).
    pub fn dependency_state_of(&self, job: &Job) -> DepState {
        if job.spec.dependencies.is_empty() && !job.spec.singleton {
            return DepState::Met;
        }
        let holder = job.spec.singleton.then(|| {
            self.active_jobs().find(|other| {
                other.id != job.id
                    && other.user == job.user
                    && other.spec.name == job.spec.name
                    && match other.state {
                        JobState::Running { .. } => true,
                        JobState::Pending => other.spec.singleton && !other.held && other.id < job.id,
                        _ => false,
                    }
            })
        });
        dependency_state(job, |id| self.job(id), holder.flatten().map(|other| other.id))
    }

    pub(super) fn dependencies_met(&self, job: &Job, singletons: &HashMap<(&str, &str), JobId>) -> bool {
        self.dependency_state(job, singletons) == DepState::Met
    }

    /// Pending jobs whose dependency can never be met end, saying why.
    pub(super) fn end_unmeetable_dependencies(&mut self, now: Timestamp, out: &mut Batch) {
        // A singleton only ever waits, so no holder is needed to see "never".
        let never: Vec<(JobId, String)> = self
            .active_jobs()
            .filter(|job| job.state == JobState::Pending && !job.spec.dependencies.is_empty())
            .filter_map(|job| match dependency_state(job, |id| self.job(id), None) {
                DepState::Never(reason) => Some((job.id, reason)),
                _ => None,
            })
            .collect();
        for (id, reason) in never {
            tracing::info!(job = %id, "its dependency can never be met: {reason}");
            self.apply_event(id, &JobEvent::DependencyNeverMet { reason, now }, now, out);
        }
    }
}
