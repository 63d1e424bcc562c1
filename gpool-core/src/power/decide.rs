//! A tick's choices: the nodes to wake for the jobs that wait (the fewest
//! and cheapest that serve them, within budgets and rates), and the idle
//! nodes to put to sleep.

use super::*;

/// The most waiting jobs one tick looks at (highest priority first).
pub const MAX_LOOKED_AT: usize = 10_000;

impl Book {
    pub(super) fn wake(&mut self, tick: &Tick<'_>) -> Vec<Action> {
        let looked_at = &tick.waiting[..tick.waiting.len().min(MAX_LOOKED_AT)];
        let waiting: BTreeSet<JobId> = looked_at.iter().map(|job| job.id).collect();
        self.waits.retain(|job, _| waiting.contains(job));
        // GPUs no waiting job counts on yet: of waking nodes, and of up
        // nodes that hold nothing (a gang that waits for more nodes than
        // are idle counts on them, rather than wake as many new ones).
        let mut spare: BTreeMap<String, u32> = self
            .nodes
            .iter()
            .filter(|(name, power)| match power.state {
                _ if tick.closed.contains(*name) => false,
                PowerState::PoweringUp => true,
                PowerState::Up => !tick.busy.contains(*name),
                _ => false,
            })
            .map(|(name, power)| (name.clone(), self.groups[power.group].gpus))
            .collect();
        let mut woken: BTreeMap<usize, (Vec<String>, Vec<JobId>)> = BTreeMap::new();
        for job in looked_at {
            let mut nodes = self.room_on(job, &spare, tick.policy);
            if nodes.len() < job.shape.nodes as usize {
                let Some((group, kept, new)) = self.new_nodes(job, &nodes, tick) else {
                    continue;
                };
                nodes = kept;
                for name in &new {
                    let power = self.nodes.get_mut(name).expect("chosen from the book");
                    power.state = PowerState::PoweringUp;
                    power.since = tick.now;
                    power.reason = None;
                    power.woken_for = Some(job.shape.team.to_string());
                    spare.insert(name.clone(), self.groups[group].gpus);
                }
                let state = &mut self.states[group];
                state.resumes.extend(new.iter().map(|_| tick.now));
                state.n_resumes += new.len() as u64;
                let entry = woken.entry(group).or_default();
                entry.0.extend(new.iter().cloned());
                entry.1.push(job.id);
                nodes.extend(new);
            }
            for name in &nodes {
                let left = spare.get_mut(name).expect("counted");
                *left = if job.shape.exclusive {
                    0
                } else {
                    *left - job.shape.gpus_per_node
                };
            }
            nodes.retain(|name| self.nodes[name].state == PowerState::PoweringUp);
            if !nodes.is_empty() {
                let since = self.waits.get(&job.id).map_or(tick.now, |(_, since)| *since);
                self.waits.insert(job.id, (nodes, since));
            }
        }
        woken
            .into_iter()
            .map(|(group, (nodes, jobs))| Action::Resume {
                group: self.groups[group].name.clone(),
                nodes,
                jobs,
            })
            .collect()
    }

    /// Nodes awake or waking with room for `job` that no other waiting job
    /// counts on: the ones with the least room that fit it, at most one per
    /// node it asks for.
    fn room_on(&self, job: &PendingJob, spare: &BTreeMap<String, u32>, policy: &Policy) -> Vec<String> {
        let want = job.shape.gpus_per_node;
        let mut fits: Vec<(u32, &String)> = spare
            .iter()
            .filter(|(name, left)| {
                let group = &self.groups[self.nodes[*name].group];
                **left >= want && (!job.shape.exclusive || **left == group.gpus) && group.serves(name, job, policy)
            })
            .map(|(name, left)| (*left, name))
            .collect();
        fits.sort();
        fits.iter()
            .take(job.shape.nodes as usize)
            .map(|(_, name)| (*name).clone())
            .collect()
    }

    /// Sleeping nodes to wake for `job`, all of one group, with those of
    /// `room` (awake or waking) of the same model it keeps (a gang runs on
    /// one model): the cheapest group per GPU-hour that has enough of them
    /// within its budgets and rate, and is not paused.
    fn new_nodes(
        &self,
        job: &PendingJob,
        room: &[String],
        tick: &Tick<'_>,
    ) -> Option<(usize, Vec<String>, Vec<String>)> {
        let mut groups: Vec<usize> = (0..self.groups.len()).collect();
        groups.sort_by(|a, b| {
            self.groups[*a]
                .price_per_gpu_hour
                .total_cmp(&self.groups[*b].price_per_gpu_hour)
                .then(a.cmp(b))
        });
        groups.into_iter().find_map(|index| {
            let group = &self.groups[index];
            let state = &self.states[index];
            let kept: Vec<String> = room
                .iter()
                .filter(|name| self.group_of(name).is_some_and(|other| other.model == group.model))
                .cloned()
                .collect();
            let need = job.shape.nodes as usize - kept.len();
            if self.paused(index, tick.now).is_some() {
                return None;
            }
            // A gang larger than the rate may have the whole of a minute.
            let rate = group.resume_rate as usize;
            if rate > 0 && !state.resumes.is_empty() && state.resumes.len() + need > rate {
                return None;
            }
            let awake = self
                .nodes
                .values()
                .filter(|power| power.group == index && power.state != PowerState::PoweredDown)
                .count();
            if group.max_nodes.is_some_and(|max| awake + need > max as usize) {
                return None;
            }
            if self.over_budget(index, &job.shape.team, need) {
                return None;
            }
            let new: Vec<String> = group
                .nodes
                .iter()
                .filter(|name| {
                    let power = &self.nodes[*name];
                    power.state == PowerState::PoweredDown
                        && power.retry_at <= tick.now
                        && !tick.closed.contains(*name)
                        && group.serves(name, job, tick.policy)
                })
                .take(need)
                .cloned()
                .collect();
            (new.len() == need).then_some((index, kept, new))
        })
    }

    /// Whether waking `need` more nodes of group `index` for a job of
    /// `team` would pass the group's GPU-hours of the period, or the
    /// team's nodes or GPU-hours in it.
    fn over_budget(&self, index: usize, team: &str, need: usize) -> bool {
        let group = &self.groups[index];
        let state = &self.states[index];
        let hours = |gpu_ms: f64| gpu_ms / 3_600_000.0;
        let team_awake = self
            .nodes
            .values()
            .filter(|power| {
                power.group == index
                    && power.state != PowerState::PoweredDown
                    && power.woken_for.as_deref() == Some(team)
            })
            .count();
        let team_hours = hours(state.team_gpu_ms.get(team).copied().unwrap_or(0.0));
        group.max_gpu_hours.is_some_and(|max| hours(state.gpu_ms) >= max)
            || group
                .max_nodes_per_team
                .is_some_and(|max| team_awake + need > max as usize)
            || group.max_gpu_hours_per_team.is_some_and(|max| team_hours >= max)
    }

    /// Up nodes idle for their group's `suspend_after` that no waiting job
    /// could take, within the suspend rate.
    pub(super) fn put_to_sleep(&mut self, tick: &Tick<'_>) -> Vec<Action> {
        let mut sleeping: BTreeMap<usize, Vec<String>> = BTreeMap::new();
        for (name, power) in &mut self.nodes {
            let group = &self.groups[power.group];
            let (Some(idle_since), Some(after)) = (power.idle_since, group.suspend_after_secs) else {
                continue;
            };
            if power.state != PowerState::Up || secs_since(tick.now, idle_since) < after {
                continue;
            }
            let state = &mut self.states[power.group];
            if group.suspend_rate > 0 && state.suspends.len() >= group.suspend_rate as usize {
                continue;
            }
            let closed = tick.closed.contains(name);
            if !closed && tick.waiting.iter().any(|job| group.serves(name, job, tick.policy)) {
                continue;
            }
            power.state = PowerState::PoweringDown;
            power.since = tick.now;
            power.idle_since = None;
            state.suspends.push_back(tick.now);
            sleeping.entry(power.group).or_default().push(name.clone());
        }
        sleeping
            .into_iter()
            .map(|(group, nodes)| Action::Suspend {
                group: self.groups[group].name.clone(),
                nodes,
            })
            .collect()
    }
}

impl Book {
    /// When an up node could next be put to sleep, as things stand: the
    /// earliest end of an idle node's `suspend_after` that no waiting job
    /// holds off (a minute from now where one is due and waits for the
    /// rate). A replay looks again then; `None`: nothing could sleep.
    pub fn next_suspend(&self, tick: &Tick<'_>) -> Option<Timestamp> {
        self.nodes
            .iter()
            .filter(|(_, power)| power.state == PowerState::Up)
            .filter_map(|(name, power)| {
                let group = &self.groups[power.group];
                let due = after(power.idle_since?, group.suspend_after_secs?);
                let held =
                    !tick.closed.contains(name) && tick.waiting.iter().any(|job| group.serves(name, job, tick.policy));
                (!held).then(|| if due > tick.now { due } else { after(tick.now, 60) })
            })
            .min()
    }
}
