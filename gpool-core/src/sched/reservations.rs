//! Reservations: nodes kept for a window (a maintenance, an event) from
//! everyone but the jobs submitted into them (`--reservation NAME`).
//!
//! Applied to a cycle's view before it is planned, by gpoold and `gpool
//! sim` alike: a job outside a reservation may use its nodes only if its
//! time limit ends it before the window opens; a job inside one uses only
//! its nodes, and only while it is open.

use super::{ClusterView, JobShape, PendingJob, Reject};
use crate::ids::{JobId, Timestamp};
use crate::model::Requirements;
use std::collections::HashMap;
use std::sync::Arc;

/// Nodes kept from `start` to `end` for the jobs submitted into it, by
/// the users and teams it names (none: a maintenance window, no jobs).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Reservation {
    pub name: String,
    pub nodes: Vec<String>,
    pub start: Timestamp,
    pub end: Timestamp,
    pub users: Vec<String>,
    pub teams: Vec<String>,
}

/// A reservation as written (gpoold.toml's `[[reservation]]`, or `gpool
/// reservation create`): times as text, an end or a duration.
#[derive(Debug, Clone)]
pub struct Definition {
    pub name: String,
    pub nodes: Vec<String>,
    /// `2026-12-01T08:00:00Z`, or `now`.
    pub start: String,
    pub duration: Option<String>,
    pub end: Option<String>,
    pub users: Vec<String>,
    pub teams: Vec<String>,
    /// Instead of `nodes`: this many GPUs, on nodes `choose_nodes` picks.
    pub gpus: u32,
}

impl Reservation {
    /// The reservation `definition` names, else the field at fault
    /// (`name`, `nodes`, `start`, `end`, `duration`) and why. Times may be
    /// relative to `now` (`now`, `now+2h`) where one is given, else only
    /// dates (a config file's).
    pub fn define(definition: Definition, now: Option<Timestamp>) -> Result<Reservation, (&'static str, String)> {
        let Definition { name, nodes, .. } = &definition;
        let name_ok = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !name_ok {
            return Err(("name", format!("{name:?} is not letters, digits, '.', '_' and '-'")));
        }
        match (nodes.is_empty(), definition.gpus) {
            (true, 0) => return Err(("nodes", format!("reservation {name} names no node (or GPU count)"))),
            (false, gpus) if gpus > 0 => return Err(("gpus", "give nodes or a GPU count, not both".into())),
            _ => {}
        }
        let moment = |field: &'static str, text: &str| match (crate::model::Begin::parse(text), now) {
            (Ok(crate::model::Begin::At(at)), _) => Ok(at),
            (Ok(begin), Some(now)) => Ok(begin.at(now)),
            _ => Err((
                field,
                format!("{text:?} is not a date or time such as 2026-12-01T08:00:00Z"),
            )),
        };
        let start = moment("start", &definition.start)?;
        let end = match (&definition.duration, &definition.end) {
            (Some(duration), None) => {
                let secs = humantime::parse_duration(duration)
                    .map_err(|_| ("duration", format!("{duration:?} is not a duration such as 4h")))?
                    .as_secs();
                Timestamp(start.0.saturating_add(secs.min(i64::MAX as u64 / 1000) as i64 * 1000))
            }
            (None, Some(end)) => moment("end", end)?,
            _ => {
                return Err((
                    "duration",
                    format!("reservation {name} needs a duration or an end, one of them"),
                ))
            }
        };
        if end <= start {
            return Err(("end", format!("reservation {name} ends before it starts")));
        }
        if end.0 > crate::model::Begin::LATEST_MS {
            return Err(("end", format!("reservation {name} ends after the year 9999")));
        }
        Ok(Reservation {
            name: definition.name,
            nodes: definition.nodes,
            start,
            end,
            users: definition.users,
            teams: definition.teams,
        })
    }

    /// Whether a reservation made at run time may join `existing` at `now`:
    /// its name is free, `known` knows each of its nodes, and it has not
    /// ended; else the field at fault and why.
    pub fn may_join(
        &self,
        existing: &[Reservation],
        known: &dyn Fn(&str) -> bool,
        now: Timestamp,
    ) -> Result<(), (&'static str, String)> {
        if existing.iter().any(|r| r.name == self.name) {
            return Err(("name", format!("reservation {} exists", self.name)));
        }
        if let Some(unknown) = self.nodes.iter().find(|node| !known(node.as_str())) {
            return Err(("nodes", format!("node {unknown} is not known to gpoold")));
        }
        if self.end <= now {
            return Err(("end", format!("reservation {} would end in the past", self.name)));
        }
        Ok(())
    }

    /// Its nodes, for a reservation of `gpus` GPUs: nodes that are up, not
    /// drained and in no other reservation overlapping its window, the
    /// largest first, the last the smallest that covers what is left (then
    /// by name); else why not.
    pub fn choose_nodes(
        &mut self,
        gpus: u32,
        nodes: &[&crate::model::Node],
        existing: &[Reservation],
    ) -> Result<(), (&'static str, String)> {
        let taken = |node: &str| {
            existing
                .iter()
                .any(|r| r.start < self.end && self.start < r.end && r.nodes.iter().any(|n| n == node))
        };
        let mut free: Vec<(u32, &str)> = nodes
            .iter()
            .filter(|node| node.alive && node.drain_reason.is_none() && !taken(&node.name))
            .map(|node| (node.gpus_in_service().count() as u32, node.name.as_str()))
            .filter(|(n, _)| *n > 0)
            .collect();
        free.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
        let mut left = gpus;
        while left > 0 {
            // The smallest node that covers the rest, else the largest.
            let pick = free.iter().rposition(|(n, _)| *n >= left).unwrap_or(0);
            let Some((n, name)) = (pick < free.len()).then(|| free.remove(pick)) else {
                let had = gpus - left;
                return Err((
                    "gpus",
                    format!("only {had} GPUs are on nodes free for the window; {gpus} were asked"),
                ));
            };
            self.nodes.push(name.to_string());
            left = left.saturating_sub(n);
        }
        self.nodes.sort();
        Ok(())
    }

    pub fn is_open(&self, now: Timestamp) -> bool {
        self.start <= now && now < self.end
    }

    /// Whether `user` may submit a job of `team` into it: they are among
    /// its users, or a member or lead of one of its teams (naming a team
    /// is not enough: a team without members takes anyone's jobs).
    pub fn admits(&self, user: &str, team: &str, sharing: &crate::policy::Sharing) -> bool {
        self.users.iter().any(|u| u == user)
            || (self.teams.iter().any(|t| t == team)
                && sharing.teams.iter().any(|t| {
                    t.name == team && (t.members.iter().any(|m| m == user) || t.leads.iter().any(|l| l == user))
                }))
    }
}

/// Why a job of `team` by `user` may not be submitted into reservation
/// `name`, if so: no reservation of that name is still to come or open, or
/// its users and teams leave them out (admins too: a maintenance window
/// names none).
pub fn admit(
    reservations: &[Reservation],
    name: &str,
    (user, team): (&str, &str),
    sharing: &crate::policy::Sharing,
    now: Timestamp,
) -> Result<(), String> {
    let Some(reservation) = reservations.iter().find(|r| r.name == name) else {
        let known: Vec<&str> = reservations.iter().map(|r| r.name.as_str()).collect();
        return Err(match known.as_slice() {
            [] => format!("no reservation is named {name:?} (gpoold.toml has none)"),
            known => format!("no reservation is named {name:?} ({})", known.join(", ")),
        });
    };
    if reservation.end <= now {
        return Err(format!("reservation {name} has ended"));
    }
    if !reservation.admits(user, team, sharing) {
        return Err(format!(
            "user {user} (team {team}) is neither among reservation {name}'s users nor a member of its teams"
        ));
    }
    Ok(())
}

/// A view with reservations applied, and why jobs they touch wait.
pub struct Applied {
    pub view: ClusterView,
    /// Jobs that may not run now at all (their reservation is closed).
    pub closed: Vec<(JobId, Reject)>,
    /// Jobs kept off reserved nodes: said first if they wait.
    pub kept_off: HashMap<JobId, Reject>,
}

/// `view` as jobs may use it at `now` under `reservations`; `None` where
/// none bears on it (no reservation that has not ended).
pub fn apply(view: &ClusterView, reservations: &[Reservation], now: Timestamp) -> Option<Applied> {
    let live: Vec<&Reservation> = reservations.iter().filter(|r| r.end > now).collect();
    let members = view.pending.iter().any(|job| !job.shape.reservation.is_empty());
    if live.is_empty() && !members {
        return None;
    }
    let mut applied = Applied {
        view: ClusterView {
            pending: Vec::with_capacity(view.pending.len()),
            ..view.clone()
        },
        closed: Vec::new(),
        kept_off: HashMap::new(),
    };
    // Jobs of one shape get one new shape (a queue of alike jobs costs one).
    let mut reshaped: HashMap<*const JobShape, Reshaped> = HashMap::new();
    for job in &view.pending {
        let outcome = reshaped
            .entry(Arc::as_ptr(&job.shape))
            .or_insert_with(|| reshape(&job.shape, &live, reservations, now));
        match outcome {
            Err(closed) => applied.closed.push((job.id, closed.clone())),
            Ok((shape, kept_off)) => {
                if let Some(reason) = kept_off {
                    applied.kept_off.insert(job.id, reason.clone());
                }
                if Arc::ptr_eq(shape, &job.shape) {
                    applied.view.pending.push(job.clone());
                } else {
                    applied.view.pending.push(Arc::new(PendingJob {
                        shape: shape.clone(),
                        ..(**job).clone()
                    }));
                }
            }
        }
    }
    Some(applied)
}

/// A job's shape as reservations leave it, and why it is kept off their
/// nodes; or why it may not run at all now.
type Reshaped = Result<(Arc<JobShape>, Option<Reject>), Reject>;

/// The shape a job of `shape` has at `now`: kept to its reservation's
/// nodes, or off the nodes of reservations its run would reach into.
fn reshape(shape: &Arc<JobShape>, live: &[&Reservation], all: &[Reservation], now: Timestamp) -> Reshaped {
    let mut requires = shape.requires.as_deref().cloned().unwrap_or_default();
    // Its run, as far as its limit lets anyone know.
    let ends = shape
        .time_limit_secs
        .map(|secs| Timestamp(now.0.saturating_add(secs as i64 * 1000)));
    let mut own_name = "";
    if !shape.reservation.is_empty() {
        let Some(own) = all.iter().find(|r| r.name == shape.reservation.as_str()) else {
            return Err(Reject::ReservationClosed {
                name: shape.reservation.to_string(),
                opens_in_secs: None,
            });
        };
        if !own.is_open(now) {
            return Err(Reject::ReservationClosed {
                name: own.name.clone(),
                opens_in_secs: (own.start > now).then(|| ((own.start.0 - now.0) / 1000) as u64),
            });
        }
        // It must be done when the window closes.
        if ends.is_none_or(|end| end > own.end) {
            return Err(Reject::OutlastsReservation {
                name: own.name.clone(),
                closes_in_secs: ((own.end.0 - now.0) / 1000) as u64,
            });
        }
        requires.nodelist = if requires.nodelist.is_empty() {
            own.nodes.clone()
        } else {
            requires
                .nodelist
                .iter()
                .filter(|n| own.nodes.contains(n))
                .cloned()
                .collect()
        };
        if requires.nodelist.is_empty() {
            // Of the nodes it named, none is the reservation's.
            requires.nodelist = vec![String::new()];
        }
        own_name = own.name.as_str();
    }
    // Other windows its run would reach into keep their nodes from it.
    // A job kept to some nodes (its reservation's, or its --nodelist) is
    // reached only by windows on those nodes.
    let may_use = |node: &String| requires.nodelist.is_empty() || requires.nodelist.contains(node);
    let reached: Vec<&&Reservation> = live
        .iter()
        .filter(|r| r.name != own_name && ends.is_none_or(|end| end > r.start))
        .filter(|r| r.nodes.iter().any(may_use))
        .collect();
    if reached.is_empty() {
        return Ok((with_requires(shape, requires), None));
    }
    let mut in_order = reached.clone();
    in_order.sort_by_key(|r| (r.start, r.name.clone()));
    let reason = Reject::NodesReserved {
        windows: in_order
            .iter()
            .map(|r| (r.name.clone(), ((r.start.0 - now.0).max(0) / 1000) as u64))
            .collect(),
        n_nodes: in_order.iter().map(|r| r.nodes.len()).sum(),
    };
    for reservation in &reached {
        for node in &reservation.nodes {
            if !requires.exclude.contains(node) {
                requires.exclude.push(node.clone());
            }
        }
    }
    Ok((with_requires(shape, requires), Some(reason)))
}

fn with_requires(shape: &Arc<JobShape>, requires: Requirements) -> Arc<JobShape> {
    if shape
        .requires
        .as_deref()
        .map_or(requires.is_empty(), |had| *had == requires)
    {
        return shape.clone();
    }
    Arc::new(JobShape {
        requires: (!requires.is_empty()).then(|| Arc::new(requires)),
        ..(**shape).clone()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::{schedule, schedule_starts, Policy};
    use crate::testing::cluster_view;

    #[test]
    fn a_definition_is_checked_and_times_may_be_relative_only_where_a_moment_is_given() {
        let definition = |start: &str, duration: Option<&str>| Definition {
            name: "event".into(),
            nodes: vec!["n1".into()],
            start: start.into(),
            duration: duration.map(str::to_string),
            end: None,
            users: Vec::new(),
            teams: vec!["vision".into()],
            gpus: 0,
        };
        let now = Timestamp(1_800_000_000_000);
        let made = Reservation::define(definition("now+1h", Some("2h")), Some(now)).expect("valid");
        assert_eq!(
            (made.start, made.end),
            (Timestamp(now.0 + 3_600_000), Timestamp(now.0 + 10_800_000))
        );
        // A config file's times are dates.
        let refused = Reservation::define(definition("now", Some("2h")), None).unwrap_err();
        assert_eq!(refused.0, "start");
        let refused = Reservation::define(definition("now", None), Some(now)).unwrap_err();
        assert_eq!(
            refused,
            (
                "duration",
                "reservation event needs a duration or an end, one of them".to_string()
            )
        );
        let mut nameless = definition("now", Some("1h"));
        nameless.name = "a b".into();
        assert_eq!(Reservation::define(nameless, Some(now)).unwrap_err().0, "name");
        // Joining those in force: a free name, known nodes, not ended.
        let known = |node: &str| node == "n1";
        assert_eq!(made.may_join(&[], &known, now), Ok(()));
        assert_eq!(
            made.may_join(std::slice::from_ref(&made), &known, now).unwrap_err().0,
            "name"
        );
        assert_eq!(made.may_join(&[], &|_: &str| false, now).unwrap_err().0, "nodes");
        assert_eq!(made.may_join(&[], &known, made.end).unwrap_err().0, "end");
        let mut nodeless = definition("now", Some("1h"));
        nodeless.nodes.clear();
        assert_eq!(Reservation::define(nodeless, Some(now)).unwrap_err().0, "nodes");
    }

    fn maintenance(start_secs: i64) -> Reservation {
        Reservation {
            name: "maint".into(),
            nodes: vec!["n1".into()],
            start: Timestamp(start_secs * 1000),
            end: Timestamp((start_secs + 3600) * 1000),
            users: Vec::new(),
            teams: Vec::new(),
        }
    }

    /// Before the window: a job that ends before it may use the node, one
    /// without a limit (or a longer one) goes elsewhere or waits, saying
    /// why; both plan kinds agree.
    #[test]
    fn a_window_ahead_takes_only_jobs_that_end_before_it() {
        let policy = Policy {
            reservations: vec![maintenance(3600)],
            ..Policy::default()
        };
        let view = cluster_view(
            "n1 4xh100\nn2 2xh100",
            "j1 gpus=4 time=600\nj2 gpus=4\nj3 gpus=2 time=7200\nj4 gpus=2",
        );
        let now = Timestamp(0);
        for plan in [schedule(&view, &policy, now), schedule_starts(&view, &policy, now)] {
            let started: Vec<(u64, String)> = plan
                .starts
                .iter()
                .map(|s| (s.job.0, s.placement[0].node.clone()))
                .collect();
            assert_eq!(started, [(1, "n1".to_string()), (3, "n2".to_string())], "{plan}");
        }
        let plan = schedule(&view, &policy, now);
        let reasons = plan.reasons_of(JobId(2)).expect("j2 waits");
        assert_eq!(reasons[0].code(), "node_reservation");
        assert!(
            reasons[0]
                .to_string()
                .starts_with("1 node reserved for maint (from 1 h 0 min from now): only a job"),
            "{}",
            reasons[0]
        );
    }

    #[test]
    fn only_its_users_and_team_members_submit_into_it() {
        let mut event = maintenance(100);
        event.name = "event".into();
        event.users = vec!["carol".into()];
        event.teams = vec!["vision".into()];
        let mut vision = crate::policy::Team::unlisted("vision");
        vision.members = vec!["alice".into()];
        let sharing = crate::policy::Sharing {
            teams: vec![vision, crate::policy::Team::unlisted("nlp")],
            ..Default::default()
        };
        let now = Timestamp(0);
        let all = [event];
        assert_eq!(admit(&all, "event", ("carol", "nlp"), &sharing, now), Ok(()));
        assert_eq!(admit(&all, "event", ("alice", "vision"), &sharing, now), Ok(()));
        let err = admit(&all, "event", ("bob", "vision"), &sharing, now).unwrap_err();
        assert!(err.contains("user bob (team vision) is neither"), "{err}");
        let err = admit(&all, "nope", ("carol", "nlp"), &sharing, now).unwrap_err();
        assert_eq!(err, "no reservation is named \"nope\" (event)");
        let err = admit(&all, "event", ("carol", "nlp"), &sharing, Timestamp(10_000_000)).unwrap_err();
        assert_eq!(err, "reservation event has ended");
    }

    /// In the window: only its jobs use its nodes; its jobs wait while it
    /// is closed, and never go elsewhere.
    #[test]
    fn an_open_window_is_its_jobs_alone() {
        let mut open = maintenance(0);
        open.name = "event".into();
        open.users = vec!["user".into()];
        let policy = Policy {
            reservations: vec![open.clone()],
            ..Policy::default()
        };
        let mut view = cluster_view(
            "n1 4xh100\nn2 4xh100",
            "j1 gpus=4 time=600\nj2 gpus=4\nj3 gpus=4 time=600",
        );
        let inside = |job: &Arc<PendingJob>| {
            Arc::new(PendingJob {
                shape: Arc::new(JobShape {
                    reservation: "event".into(),
                    ..(*job.shape).clone()
                }),
                ..(**job).clone()
            })
        };
        view.pending[0] = inside(&view.pending[0]);
        view.pending[2] = inside(&view.pending[2]);
        let plan = schedule(&view, &policy, Timestamp(10_000));
        let started: Vec<(u64, String)> = plan
            .starts
            .iter()
            .map(|s| (s.job.0, s.placement[0].node.clone()))
            .collect();
        // j1 takes the reserved node; j2 the other; j3 waits for n1, not n2.
        assert_eq!(started, [(1, "n1".to_string()), (2, "n2".to_string())], "{plan}");
        let plan = schedule(&view, &policy, Timestamp(3_700_000));
        let reasons = plan.reasons_of(JobId(1)).expect("closed: j1 waits");
        assert_eq!(reasons[0].to_string(), "reservation event has ended or does not exist");
        assert!(plan.starts.iter().all(|s| s.job.0 == 2), "{plan}");
    }

    /// A job of one reservation is not told of another window on nodes it
    /// may not use anyway; a job outside both is told of both, and its
    /// reasons name no node outside its pool.
    #[test]
    fn a_job_is_told_only_of_windows_on_nodes_it_may_use() {
        let mut hack = maintenance(0);
        hack.name = "hack".into();
        hack.nodes = vec!["n2".into()];
        hack.users = vec!["user".into()];
        let policy = Policy {
            reservations: vec![maintenance(600), hack],
            ..Policy::default()
        };
        let mut view = cluster_view(
            "n1 4xh100\nn2 4xh100 used=0-3",
            "j1 gpus=4 time=1200\nj2 gpus=4 time=1200",
        );
        view.pending[0] = Arc::new(PendingJob {
            shape: Arc::new(JobShape {
                reservation: "hack".into(),
                ..(*view.pending[0].shape).clone()
            }),
            ..(*view.pending[0]).clone()
        });
        let plan = schedule(&view, &policy, Timestamp(10_000));
        let reasons_of = |id: u64| {
            let reasons = plan.reasons_of(JobId(id)).expect("it waits");
            reasons.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
        };
        let inside = reasons_of(1);
        assert!(!inside.contains("maint") && !inside.contains("n1"), "{inside}");
        let outside = reasons_of(2);
        assert!(
            outside.contains("reserved for hack, maint") || outside.contains("maint"),
            "{outside}"
        );
    }

    #[test]
    fn a_reservation_by_gpu_count_takes_the_fewest_free_nodes() {
        use crate::testing::node;
        let mut down = node("n4", 8, "h100");
        down.alive = false;
        let mut drained = node("n5", 8, "h100");
        drained.drain_reason = Some("maintenance".into());
        let nodes = [
            node("n1", 8, "h100"),
            node("n2", 4, "l4"),
            node("n3", 8, "a100"),
            down,
            drained,
        ];
        let nodes: Vec<&crate::model::Node> = nodes.iter().collect();
        let window = |name: &str, nodes: &[&str], start: i64, end: i64| Reservation {
            name: name.into(),
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
            start: Timestamp(start),
            end: Timestamp(end),
            users: Vec::new(),
            teams: Vec::new(),
        };
        // n3 is another reservation's in an overlapping window; one that
        // has closed by then leaves n1 free.
        let existing = [window("a", &["n3"], 0, 2000), window("b", &["n1"], 0, 500)];
        let mut wanted = window("w", &[], 1000, 3000);
        wanted.choose_nodes(10, &nodes, &existing).unwrap();
        assert_eq!(wanted.nodes, ["n1", "n2"], "8, then the smallest that covers 2");
        let mut small = window("s", &[], 1000, 3000);
        small.choose_nodes(3, &nodes, &existing).unwrap();
        assert_eq!(small.nodes, ["n2"]);
        let mut big = window("g", &[], 1000, 3000);
        let err = big.choose_nodes(13, &nodes, &existing).unwrap_err();
        assert_eq!(
            err,
            (
                "gpus",
                "only 12 GPUs are on nodes free for the window; 13 were asked".to_string()
            )
        );
    }
}
