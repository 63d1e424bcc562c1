//! Per-user caps (`max_jobs_per_user`, `max_gpus_per_user`) across the
//! pool, within a team and within a QoS class: what each user runs, and
//! whether one more job keeps them within every cap.

use super::{Reject, RunningJob};
use crate::policy::Sharing;
use compact_str::CompactString;
use std::collections::HashMap;

/// Where a cap applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Scope {
    Pool,
    Team,
    Qos,
}

/// Jobs and GPUs each user runs, per scope: (scope, team or class, user).
#[derive(Debug, Default)]
pub struct UserUse {
    counts: HashMap<(Scope, CompactString, CompactString), (u64, u64)>,
    /// No cap is set anywhere: nothing is counted or checked.
    off: bool,
}

impl UserUse {
    /// Whether a per-user cap is set anywhere (else `check` passes all).
    pub fn any_caps(&self) -> bool {
        !self.off
    }

    /// What `running` holds, counted for the caps `sharing` sets.
    pub fn of(sharing: &Sharing, running: &[RunningJob]) -> UserUse {
        let off = !sharing.has_running_caps();
        let mut used = UserUse {
            counts: HashMap::new(),
            off,
        };
        if !off {
            for job in running {
                let gpus = job.placement.iter().map(|p| p.gpu_indices.len() as u64).sum();
                used.add(sharing, &job.user, &job.team, &job.qos, gpus);
            }
        }
        used
    }

    fn keys(sharing: &Sharing, user: &str, team: &str, qos: &str) -> [(Scope, CompactString, CompactString); 3] {
        let qos = if qos.is_empty() {
            sharing.default_qos.as_str()
        } else {
            qos
        };
        [
            (Scope::Pool, CompactString::default(), user.into()),
            (Scope::Team, team.into(), user.into()),
            (Scope::Qos, qos.into(), user.into()),
        ]
    }

    /// Counts one more job of `user` holding `gpus`.
    pub fn add(&mut self, sharing: &Sharing, user: &str, team: &str, qos: &str, gpus: u64) {
        if self.off {
            return;
        }
        for key in Self::keys(sharing, user, team, qos) {
            let entry = self.counts.entry(key).or_default();
            entry.0 += 1;
            entry.1 += gpus;
        }
    }

    /// The first cap one more job of `user` with `gpus` would pass.
    pub fn check(&self, sharing: &Sharing, user: &str, team: &str, qos: &str, gpus: u64) -> Option<Reject> {
        if self.off {
            return None;
        }
        let keys = Self::keys(sharing, user, team, qos);
        let qos_limits = sharing
            .qos
            .iter()
            .find(|q| q.name == keys[2].1)
            .map(|q| q.user_limits)
            .unwrap_or_default();
        let limits = [sharing.user_limits, sharing.team_limits(team), qos_limits];
        for (at, (key, limits)) in keys.iter().zip(limits).enumerate() {
            let (jobs, held) = self.counts.get(key).copied().unwrap_or_default();
            let over_jobs = limits
                .max_jobs
                .filter(|max| jobs + 1 > u64::from(*max))
                .map(|max| ("jobs", max, jobs));
            let over_gpus = limits
                .max_gpus
                .filter(|max| held + gpus > u64::from(*max))
                .map(|max| ("GPUs", max, held));
            if let Some((what, max, in_use)) = over_jobs.or(over_gpus) {
                // Words only for a job a cap holds back.
                let scope = match at {
                    0 => String::new(),
                    1 => format!(" in team {team}"),
                    _ => format!(" in QoS {}", keys[2].1),
                };
                return Some(Reject::UserCap {
                    user: user.to_string(),
                    scope,
                    what,
                    max: max.into(),
                    in_use,
                });
            }
        }
        None
    }
}

/// Why a job of `gpus` GPUs in `team` and `qos` could never start under
/// the per-user GPU caps, if so: it alone asks for more than one allows.
pub fn never_within_caps(sharing: &Sharing, team: &str, qos: &str, gpus: u64) -> Option<String> {
    let qos = if qos.is_empty() {
        sharing.default_qos.as_str()
    } else {
        qos
    };
    let qos_cap = sharing
        .qos
        .iter()
        .find(|q| q.name == qos)
        .and_then(|q| q.user_limits.max_gpus);
    [
        (sharing.user_limits.max_gpus, String::new()),
        (sharing.team_limits(team).max_gpus, format!(" of team {team}")),
        (qos_cap, format!(" of QoS {qos}")),
    ]
    .into_iter()
    .find_map(|(max, scope)| {
        let max = max?;
        (gpus > u64::from(max))
            .then(|| format!("{gpus} GPUs is more than max_gpus_per_user{scope} ({max}): it could never start"))
    })
}

/// Why a submit of `adding` more jobs by one user is refused, if it is:
/// the first `max_submit_per_user` (pool-wide, in a team, in a QoS class)
/// that the jobs they have pending or running (`held`) and the new ones
/// together would pass. Each entry is (team, QoS, number of jobs); an
/// array counts each of its tasks, as Slurm counts them.
pub fn submit_refusal<'a>(
    sharing: &Sharing,
    user: &str,
    held: impl IntoIterator<Item = (&'a str, &'a str, u64)>,
    adding: &[(&str, &str, u64)],
) -> Option<String> {
    let capped = sharing.user_limits.max_submit.is_some()
        || sharing.teams.iter().any(|team| team.user_limits.max_submit.is_some())
        || sharing.qos.iter().any(|qos| qos.user_limits.max_submit.is_some());
    if !capped {
        return None;
    }
    let mut counts: HashMap<(Scope, CompactString), (u64, u64)> = HashMap::new();
    let mut count = |team: &str, qos: &str, n: u64, new: bool| {
        for (scope, name, _) in UserUse::keys(sharing, user, team, qos) {
            let entry = counts.entry((scope, name)).or_default();
            if new {
                entry.1 += n;
            } else {
                entry.0 += n;
            }
        }
    };
    for (team, qos, n) in held {
        count(team, qos, n, false);
    }
    for (team, qos, n) in adding {
        count(team, qos, *n, true);
    }
    let mut scopes: Vec<_> = counts.into_iter().filter(|(_, (_, new))| *new > 0).collect();
    scopes.sort_by_key(|((scope, name), _)| (*scope as u8, name.clone()));
    scopes.into_iter().find_map(|((scope, name), (now, new))| {
        let (max, place) = match scope {
            Scope::Pool => (sharing.user_limits.max_submit, String::new()),
            Scope::Team => (sharing.team_limits(&name).max_submit, format!(" in team {name}")),
            Scope::Qos => (
                sharing
                    .qos
                    .iter()
                    .find(|q| q.name == name.as_str())
                    .and_then(|q| q.user_limits.max_submit),
                format!(" in QoS {name}"),
            ),
        };
        let max = u64::from(max?);
        (now + new > max).then(|| {
            format!(
                "max_submit_per_user{place}: user {user} has {now} jobs pending or running and may have at most {max}; \
                 these {new} would make {}",
                now + new
            )
        })
    })
}

/// What QoS reserves keep of a pool of `pool_gpus` GPUs (up, free or
/// not), where they ask for `kept`: at most half of it, so that a reserve
/// written for the large pools never keeps a small one (or one whose nodes
/// are mostly down) from every other class.
pub fn capped_reserve(kept: u64, pool_gpus: u64) -> u64 {
    kept.min(pool_gpus / 2)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{Qos, Team, UserLimits};

    fn sharing() -> Sharing {
        let mut vision = Team::unlisted("vision");
        vision.user_limits.max_gpus = Some(4);
        let mut high = Qos::normal();
        high.name = "high".into();
        high.user_limits.max_jobs = Some(1);
        Sharing {
            teams: vec![vision, Team::unlisted("nlp")],
            qos: vec![Qos::normal(), high],
            user_limits: UserLimits {
                max_jobs: Some(3),
                ..UserLimits::default()
            },
            ..Sharing::default()
        }
    }

    #[test]
    fn each_scope_caps_its_own_count() {
        let sharing = sharing();
        let mut used = UserUse::of(&sharing, &[]);
        assert_eq!(used.check(&sharing, "alice", "vision", "", 4), None);
        used.add(&sharing, "alice", "vision", "", 4);
        // The team's GPU cap, for alice alone.
        let cap = used.check(&sharing, "alice", "vision", "", 1).expect("capped");
        assert_eq!(cap.to_string(), "user alice runs 4 of at most 4 GPUs in team vision");
        assert_eq!(used.check(&sharing, "bob", "vision", "", 1), None);
        assert_eq!(used.check(&sharing, "alice", "nlp", "", 8), None);
        // The class's job cap; the default class is "normal".
        used.add(&sharing, "alice", "nlp", "high", 1);
        let cap = used.check(&sharing, "alice", "nlp", "high", 1).expect("capped");
        assert_eq!(cap.code(), "user_cap");
        assert!(cap.to_string().ends_with("1 of at most 1 jobs in QoS high"), "{cap}");
        // The pool-wide cap counts every team and class.
        used.add(&sharing, "alice", "nlp", "normal", 1);
        let cap = used.check(&sharing, "alice", "nlp", "normal", 1).expect("capped");
        assert_eq!(cap.to_string(), "user alice runs 3 of at most 3 jobs");
    }

    /// Through the scheduler, both ways (a whole plan and a starts-only
    /// one): capped jobs wait with the cap as their reason and others go.
    #[test]
    fn a_capped_users_jobs_wait_and_others_start() {
        use crate::sched::{schedule, schedule_starts, Policy};
        use crate::testing::cluster_view_with;
        let policy = Policy {
            sharing: sharing(),
            ..Policy::default()
        };
        let view = cluster_view_with(
            "n1 8xh100",
            "r1 user=alice team=vision on=n1:0-1",
            "j2 user=alice team=vision gpus=2 at=1\nj3 user=alice team=vision gpus=1 at=2\nj4 user=bob team=vision gpus=2 at=3",
        );
        let now = crate::ids::Timestamp(10_000);
        for plan in [schedule(&view, &policy, now), schedule_starts(&view, &policy, now)] {
            let started: Vec<u64> = plan.starts.iter().map(|start| start.job.0).collect();
            // alice holds 2 GPUs of vision's 4 per user: j2 (2 more) fits,
            // j3 then would be her fifth GPU.
            assert_eq!(started, [2, 4], "{plan}");
            let reasons = plan.reasons_of(crate::JobId(3)).expect("j3 waits");
            assert_eq!(reasons[0].code(), "user_cap");
        }
    }

    #[test]
    fn a_submit_past_max_submit_is_refused_naming_the_cap() {
        let mut sharing = sharing();
        assert_eq!(
            submit_refusal(&sharing, "alice", [("vision", "", 10_000)], &[("vision", "", 1)]),
            None
        );
        sharing.teams[0].user_limits.max_submit = Some(100);
        let held = [("vision", "normal", 60), ("nlp", "normal", 500)];
        assert_eq!(submit_refusal(&sharing, "alice", held, &[("vision", "", 40)]), None);
        let refused = submit_refusal(&sharing, "alice", held, &[("nlp", "", 1), ("vision", "", 41)]).expect("refused");
        assert_eq!(
            refused,
            "max_submit_per_user in team vision: user alice has 60 jobs pending or running and may have at most 100; \
             these 41 would make 101"
        );
        sharing.user_limits.max_submit = Some(561);
        let refused = submit_refusal(&sharing, "alice", held, &[("nlp", "", 2)]).expect("refused");
        assert!(
            refused.starts_with("max_submit_per_user: user alice has 560"),
            "{refused}"
        );
    }

    #[test]
    fn a_job_larger_than_a_gpu_cap_could_never_start() {
        let sharing = sharing();
        assert_eq!(never_within_caps(&sharing, "vision", "", 4), None);
        assert_eq!(
            never_within_caps(&sharing, "vision", "", 8).as_deref(),
            Some("8 GPUs is more than max_gpus_per_user of team vision (4): it could never start")
        );
        assert_eq!(never_within_caps(&sharing, "nlp", "high", 64), None);
    }

    #[test]
    fn without_caps_nothing_is_counted() {
        let sharing = Sharing::default();
        let mut used = UserUse::of(&sharing, &[]);
        used.add(&sharing, "alice", "t", "", 1_000);
        assert!(used.counts.is_empty());
        assert_eq!(used.check(&sharing, "alice", "t", "", 1_000_000), None);
    }
}
