//! Teams, QoS classes and the multi-factor priority: the sharing rules of
//! DESIGN §3, as data and pure functions.

use crate::auth::{authorize, Action, Caller, Denied};
use crate::ids::Timestamp;
use crate::spec::format_duration;
use crate::spec::{spec_error, SpecError};
use jiff::tz::TimeZone;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

mod ledger;
pub use ledger::Ledger;

/// A team sharing the pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Team {
    pub name: String,
    /// Fair-share weight.
    pub shares: u32,
    /// GPUs the team can always get back, by preemption if need be.
    pub guaranteed_gpus: u32,
    /// More guaranteed GPUs in one pool, or of one GPU model (by name): a
    /// job of that pool, or that accepts only that model, runs under its
    /// entry first.
    #[serde(default)]
    pub guaranteed_in: BTreeMap<String, u32>,
    /// Guaranteed GPU-hours per period; `None` means no budget limit.
    pub gpu_hours: Option<u64>,
    /// At most this many GPUs at once, guaranteed and burst together.
    pub max_gpus: Option<u32>,
    /// Users whose jobs go to this team when they name none, and the only
    /// ones who may submit to it (empty: open to all).
    pub members: Vec<String>,
    /// Users who manage the team's jobs (cancel, signal, read) as its leads.
    #[serde(default)]
    pub leads: Vec<String>,
    /// Caps on each user's jobs in this team.
    #[serde(default)]
    pub user_limits: UserLimits,
}

/// Caps on one user's jobs, as Slurm's association and QoS limits have
/// them (MaxJobs, MaxTRESPerUser=gres/gpu, MaxSubmitJobs). `None`: no cap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserLimits {
    /// Jobs running at once.
    pub max_jobs: Option<u32>,
    /// GPUs held at once.
    pub max_gpus: Option<u32>,
    /// Jobs pending and running together: a submit past it is refused.
    pub max_submit: Option<u32>,
}

impl Team {
    /// The terms of a team no `[[team]]` names: one share, no guarantee.
    pub fn unlisted(name: &str) -> Team {
        Team {
            name: name.to_string(),
            shares: 1,
            guaranteed_gpus: 0,
            guaranteed_in: BTreeMap::new(),
            gpu_hours: None,
            max_gpus: None,
            members: Vec::new(),
            leads: Vec::new(),
            user_limits: UserLimits::default(),
        }
    }
}

/// A QoS class.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Qos {
    pub name: String,
    /// Its weight in the priority (higher runs first).
    pub priority: u32,
    /// Longest time limit; also the limit of jobs that give none.
    pub max_time_secs: Option<u64>,
    /// May preempt running jobs of classes with a lower `priority`.
    pub preempt_lower: bool,
    /// Jobs younger than this are never preempted.
    pub min_runtime_secs: u64,
    /// Between the checkpoint signal and the kill of a preempted attempt.
    pub grace_secs: u64,
    /// GPUs kept free for this class and above in each pool: lower
    /// classes, and burst work, never take them.
    #[serde(default)]
    pub reserve_gpus: u32,
    /// Pool name -> GPUs kept there instead of `reserve_gpus` (a small
    /// pool may keep fewer, or none).
    #[serde(default)]
    pub reserve_in: BTreeMap<String, u32>,
    /// Caps on each user's jobs of this class (Slurm's MaxTRESPerUser).
    #[serde(default)]
    pub user_limits: UserLimits,
}

impl Qos {
    pub fn normal() -> Qos {
        Qos {
            name: "normal".into(),
            priority: 0,
            max_time_secs: None,
            preempt_lower: false,
            min_runtime_secs: 0,
            grace_secs: 60,
            reserve_gpus: 0,
            reserve_in: BTreeMap::new(),
            user_limits: UserLimits::default(),
        }
    }

    /// The GPUs this class keeps free in `pool`.
    pub fn reserve_in_pool(&self, pool: &str) -> u32 {
        self.reserve_in.get(pool).copied().unwrap_or(self.reserve_gpus)
    }

    /// Whether it keeps GPUs free in any pool.
    pub fn reserves_any(&self) -> bool {
        self.reserve_gpus > 0 || self.reserve_in.values().any(|&gpus| gpus > 0)
    }
}

/// Weights of the priority factors, each factor being in [0, 1].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Weights {
    pub qos: f64,
    pub fair_share: f64,
    pub age: f64,
    pub size: f64,
    /// Age at which the age factor reaches 1.
    pub max_age_secs: u64,
}

impl Default for Weights {
    fn default() -> Weights {
        Weights {
            qos: 1000.0,
            fair_share: 1000.0,
            age: 100.0,
            // As Slurm's PriorityWeightJobSize: off unless configured.
            size: 0.0,
            max_age_secs: 7 * 24 * 3600,
        }
    }
}

/// A job's priority and the factors it is made of, as `gpool show` prints
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Priority {
    pub total: f64,
    pub qos: f64,
    pub fair_share: f64,
    pub age: f64,
    pub size: f64,
    /// The job's own `--priority`, added as is.
    pub nice: f64,
}

/// Usage decays by half every `half_life_secs` (Slurm's
/// PriorityDecayHalfLife).
pub fn decay(usage: f64, elapsed_secs: f64, half_life_secs: f64) -> f64 {
    if half_life_secs <= 0.0 || elapsed_secs <= 0.0 {
        return usage;
    }
    usage * (-elapsed_secs / half_life_secs).exp2()
}

/// Slurm's classic fair-share factor 2^(-U/S): U the team's share of all
/// (decayed) usage, S its share of all shares. 1 for an unused team, 0.5 at
/// exactly its share, toward 0 the further it is over.
pub fn fair_share_factor(team_usage: f64, total_usage: f64, team_shares: u32, total_shares: u32) -> f64 {
    if team_shares == 0 || total_shares == 0 {
        return 0.0;
    }
    let norm_usage = if total_usage > 0.0 {
        team_usage / total_usage
    } else {
        0.0
    };
    let norm_shares = f64::from(team_shares) / f64::from(total_shares);
    (-norm_usage / norm_shares).exp2()
}

/// Inputs of one job's priority.
pub struct PriorityInputs {
    pub qos_priority: u32,
    pub max_qos_priority: u32,
    pub fair_share: f64,
    pub submitted_at: Timestamp,
    pub now: Timestamp,
    pub gpus: u64,
    pub max_gpus: u64,
    pub nice: i32,
}

pub fn priority(weights: &Weights, inputs: &PriorityInputs) -> Priority {
    let ratio = |part: f64, whole: f64| {
        if whole > 0.0 {
            (part / whole).clamp(0.0, 1.0)
        } else {
            0.0
        }
    };
    let age_secs = inputs.now.0.saturating_sub(inputs.submitted_at.0) as f64 / 1000.0;
    let qos = weights.qos * ratio(f64::from(inputs.qos_priority), f64::from(inputs.max_qos_priority));
    let fair_share = weights.fair_share * inputs.fair_share.clamp(0.0, 1.0);
    let age = weights.age * ratio(age_secs, weights.max_age_secs as f64);
    let size = weights.size * ratio(inputs.gpus as f64, inputs.max_gpus as f64);
    let nice = f64::from(inputs.nice);
    Priority {
        total: qos + fair_share + age + size + nice,
        qos,
        fair_share,
        age,
        size,
        nice,
    }
}

/// Budget periods, aligned to calendar boundaries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Period {
    Day,
    Week,
    Month,
}

impl Period {
    /// The start of the period holding `now`, in time zone `tz`: midnight,
    /// Monday midnight, or the first of the month (the first valid instant
    /// of that day where a DST change skips midnight).
    pub fn start(self, now: Timestamp, tz: &TimeZone) -> Timestamp {
        let Ok(instant) = jiff::Timestamp::from_millisecond(now.0) else {
            return now;
        };
        let date = instant.to_zoned(tz.clone()).date();
        let first_day = match self {
            Period::Day => Ok(date),
            Period::Week => date.checked_sub(jiff::Span::new().days(i64::from(date.weekday().to_monday_zero_offset()))),
            Period::Month => Ok(date.first_of_month()),
        };
        first_day
            .and_then(|day| day.to_zoned(tz.clone()))
            .map_or(now, |start| Timestamp(start.timestamp().as_millisecond()))
    }
}

/// Why a submitted spec is not admitted: something in it is wrong, or
/// the caller may not submit it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("{0}")]
    Spec(SpecError),
    #[error("{0}")]
    Denied(Denied),
}

/// The sharing rules: teams, QoS classes, weights, budgets.
#[derive(Debug, Clone, PartialEq)]
pub struct Sharing {
    pub teams: Vec<Team>,
    pub qos: Vec<Qos>,
    pub default_qos: String,
    pub weights: Weights,
    pub half_life_secs: f64,
    pub period: Period,
    /// Periods begin at midnight here.
    pub time_zone: TimeZone,
    /// At most this many GPU-hours of work lost to preemption per hour.
    pub waste_cap_gpu_hours_per_hour: f64,
    /// The longest grace a job may ask for.
    pub max_grace_secs: u64,
    /// The highest `--priority` a user who is not an admin may give.
    pub max_user_priority: i32,
    /// Caps on each user's jobs across the pool.
    pub user_limits: UserLimits,
    /// Least-attained-service order within each team (`order = "las"`,
    /// the default); `None`: the priority order alone.
    pub las: Option<crate::sched::Las>,
    /// How fractions share a GPU.
    pub shares: crate::share::ShareRules,
}

impl Default for Sharing {
    fn default() -> Sharing {
        Sharing {
            teams: Vec::new(),
            qos: vec![Qos::normal()],
            default_qos: "normal".into(),
            weights: Weights::default(),
            half_life_secs: 7.0 * 24.0 * 3600.0,
            period: Period::Week,
            time_zone: TimeZone::UTC,
            waste_cap_gpu_hours_per_hour: f64::INFINITY,
            max_grace_secs: 3600,
            max_user_priority: 100,
            user_limits: UserLimits::default(),
            las: Some(crate::sched::Las::default()),
            shares: Default::default(),
        }
    }
}

impl Sharing {
    /// Whether any per-user cap on running jobs or held GPUs is set.
    pub fn has_running_caps(&self) -> bool {
        let capped = |limits: &UserLimits| limits.max_jobs.is_some() || limits.max_gpus.is_some();
        capped(&self.user_limits)
            || self.teams.iter().any(|team| capped(&team.user_limits))
            || self.qos.iter().any(|qos| capped(&qos.user_limits))
    }

    /// The per-user caps of team `name` (none for a team no `[[team]]` names).
    pub fn team_limits(&self, name: &str) -> UserLimits {
        self.teams
            .iter()
            .find(|team| team.name == name)
            .map(|team| team.user_limits)
            .unwrap_or_default()
    }

    /// The team called `name`. A team no `[[team]]` names has one share
    /// and no guarantee; where no team is configured at all, every job runs
    /// guaranteed (nothing is burst work, nothing is preempted).
    pub fn team(&self, name: &str) -> Team {
        match self.teams.iter().find(|team| team.name == name) {
            Some(team) => team.clone(),
            None if self.teams.is_empty() => Team {
                guaranteed_gpus: u32::MAX,
                ..Team::unlisted(name)
            },
            None => Team::unlisted(name),
        }
    }

    /// The team of a job that names none: the first team listing `user`.
    pub fn team_of_user(&self, user: &str) -> Option<&str> {
        self.teams
            .iter()
            .find(|team| team.members.iter().any(|member| member == user))
            .map(|team| team.name.as_str())
    }

    /// The teams whose `leads` name `user`.
    pub fn teams_led_by(&self, user: &str) -> Vec<String> {
        self.teams
            .iter()
            .filter(|team| team.leads.iter().any(|lead| lead == user))
            .map(|team| team.name.clone())
            .collect()
    }

    pub fn qos(&self, name: &str) -> Option<&Qos> {
        let name = if name.is_empty() { &self.default_qos } else { name };
        self.qos.iter().find(|qos| qos.name == name)
    }

    /// Applies the sharing rules to a submitted spec: a job naming no team
    /// goes to its user's team (else `default_team`); a named team must be
    /// configured (where any is) and let the caller in; the priority must be
    /// within `max_user_priority` unless the caller is an admin; its QoS
    /// class must exist; a job without a time limit gets its class's
    /// `max_time`, and none may ask for more; no grace beyond
    /// `max_grace_secs`.
    pub fn admit(&self, spec: &mut crate::model::JobSpec, caller: &Caller, default_team: &str) -> Result<(), Refusal> {
        if spec.team.is_empty() {
            spec.team = self.team_of_user(&caller.user).unwrap_or(default_team).into();
        }
        let configured = self.teams.iter().find(|team| team.name == spec.team);
        if configured.is_none() && !self.teams.is_empty() && spec.team != default_team {
            let known: Vec<&str> = self.teams.iter().map(|t| t.name.as_str()).collect();
            return Err(Refusal::Spec(spec_error(
                "team",
                format!("no team {:?} (there are: {})", spec.team, known.join(", ")),
            )));
        }
        let submit = Action::Submit {
            team: &spec.team,
            members: configured.map_or(&[][..], |team| team.members.as_slice()),
            priority: spec.priority,
            max_user_priority: self.max_user_priority,
        };
        authorize(caller, &submit).map_err(Refusal::Denied)?;
        let qos = self.qos(&spec.qos).ok_or_else(|| {
            let known: Vec<&str> = self.qos.iter().map(|q| q.name.as_str()).collect();
            Refusal::Spec(spec_error(
                "qos",
                format!("no QoS class {:?} (there are: {})", spec.qos, known.join(", ")),
            ))
        })?;
        if let Some(max_time) = qos.max_time_secs {
            match spec.time_limit_secs {
                None => spec.time_limit_secs = Some(max_time),
                Some(time) if time > max_time => {
                    return Err(Refusal::Spec(spec_error(
                        "time",
                        format!(
                            "{} is longer than QoS {}'s max_time of {}",
                            format_duration(time),
                            qos.name,
                            format_duration(max_time)
                        ),
                    )))
                }
                Some(_) => {}
            }
        }
        if let Some(grace) = spec.grace_secs.filter(|grace| *grace > self.max_grace_secs) {
            return Err(Refusal::Spec(spec_error(
                "grace",
                format!(
                    "{} is longer than the longest grace, {}",
                    format_duration(grace),
                    format_duration(self.max_grace_secs)
                ),
            )));
        }
        Ok(())
    }

    /// Between a preempted attempt's checkpoint signal and its kill: the
    /// job's own grace, else its class's, never more than `max_grace_secs`.
    pub fn grace_secs(&self, spec: &crate::model::JobSpec) -> u64 {
        match spec.grace_secs {
            Some(own) => own.min(self.max_grace_secs),
            None => self.qos_grace_secs(&spec.qos),
        }
    }

    /// The grace of a job of QoS `qos` that names none of its own (`gpool
    /// sim`'s jobs): its class's, never more than `max_grace_secs`.
    pub fn qos_grace_secs(&self, qos: &str) -> u64 {
        self.qos(qos)
            .map_or(Qos::normal().grace_secs, |qos| qos.grace_secs)
            .min(self.max_grace_secs)
    }

    pub fn max_qos_priority(&self) -> u32 {
        self.qos.iter().map(|qos| qos.priority).max().unwrap_or(0)
    }

    /// Fair-share factors of every team in `usage` (and every configured
    /// team), as of `now`.
    pub fn fair_shares(&self, usage: &BTreeMap<String, Ledger>, now: Timestamp) -> BTreeMap<String, f64> {
        let mut names: Vec<&str> = self.teams.iter().map(|t| t.name.as_str()).collect();
        names.extend(usage.keys().map(String::as_str));
        names.sort_unstable();
        names.dedup();
        let decayed: Vec<f64> = names
            .iter()
            .map(|name| {
                usage
                    .get(*name)
                    .map_or(0.0, |l| l.decayed_as_of(now, self.half_life_secs))
            })
            .collect();
        let total_usage: f64 = decayed.iter().sum();
        let total_shares: u32 = names.iter().map(|name| self.team(name).shares).sum();
        names
            .iter()
            .zip(decayed)
            .map(|(name, used)| {
                let factor = fair_share_factor(used, total_usage, self.team(name).shares, total_shares);
                (name.to_string(), factor)
            })
            .collect()
    }
}

/// One team's standing, as `gpool usage` shows it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TeamUsage {
    pub team: String,
    pub shares: u32,
    pub guaranteed_gpus: u32,
    /// GPU-hours of guaranteed and burst work this period, running
    /// attempts included.
    pub guaranteed_gpu_hours: f64,
    pub burst_gpu_hours: f64,
    pub gpu_hours_budget: Option<u64>,
    pub budget_left_gpu_hours: Option<f64>,
    pub gpus_in_use: u64,
    pub guaranteed_gpus_in_use: u64,
    pub fair_share: f64,
    pub period_start: Timestamp,
}

/// A running attempt as usage reports count it.
pub struct RunningUse<'a> {
    pub team: &'a str,
    pub gpus: u64,
    /// What its GPUs are charged as (a fraction's part of its one GPU).
    pub charged_gpus: f64,
    pub started_at: Timestamp,
    pub burst: bool,
}

/// Every configured team and every team with usage or running work, as of
/// `now`: ended attempts from the ledgers, running ones up to `now`.
pub fn usage_report(
    sharing: &Sharing,
    usage: &BTreeMap<String, Ledger>,
    running: &[RunningUse],
    now: Timestamp,
) -> Vec<TeamUsage> {
    let mut ledgers = usage.clone();
    for team in &sharing.teams {
        ledgers.entry(team.name.clone()).or_default();
    }
    let mut in_use: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
    for job in running {
        ledgers.entry(job.team.to_string()).or_default().charge(
            job.charged_gpus,
            job.started_at,
            now,
            job.burst,
            sharing,
        );
        let counts = in_use.entry(job.team).or_default();
        counts.0 += job.gpus;
        if !job.burst {
            counts.1 += job.gpus;
        }
    }
    let fair = sharing.fair_shares(&ledgers, now);
    ledgers
        .iter()
        .map(|(name, ledger)| {
            let team = sharing.team(name);
            let guaranteed_gpu_hours = ledger.guaranteed_in_period(now, sharing) / 3600.0;
            let (gpus_in_use, guaranteed_gpus_in_use) = in_use.get(name.as_str()).copied().unwrap_or_default();
            TeamUsage {
                team: name.clone(),
                shares: team.shares,
                guaranteed_gpus: team.guaranteed_gpus,
                guaranteed_gpu_hours,
                burst_gpu_hours: ledger.burst_in_period(now, sharing) / 3600.0,
                gpu_hours_budget: team.gpu_hours,
                budget_left_gpu_hours: team
                    .gpu_hours
                    .map(|hours| (hours as f64 - guaranteed_gpu_hours).max(0.0)),
                gpus_in_use,
                guaranteed_gpus_in_use,
                fair_share: fair.get(name).copied().unwrap_or(1.0),
                period_start: sharing.period.start(now, &sharing.time_zone),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests;
