//! Carrying out a plan's preemptions, holds and rescinds: one applier for
//! gpoold's state task and `gpool sim`. Each side says what happens to its
//! victims (`Victims`: where each stands, its checkpoint signal and grace,
//! a withdrawn preemption taken again, a preemption withdrawn) and which
//! GPUs are free; the applier keeps the hour's waste budget and the
//! promises to waiting jobs, in the same order for both.

use super::waste::Waste;
use super::{Preemption, Promises, WasteBudget};
use crate::ids::{Epoch, JobId, Timestamp};
use crate::model::NodePlacement;
use std::collections::{HashMap, HashSet};

/// Where a plan's victim stands when its preemption is carried out.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Victim {
    /// The attempt the plan saw no longer runs (or a later one does).
    Gone,
    /// Its earlier preemption was withdrawn in its grace: it is taken
    /// again, its signal already sent. `charged`: what that preemption
    /// charged the waste budget, charged again now.
    Withdrawn { charged: Option<Waste> },
    /// It runs, not being preempted: it gets its checkpoint signal.
    Running,
}

/// What one side (gpoold's state, a replay) does to the running attempts
/// a plan preempts or lets go.
pub trait Victims {
    fn victim(&self, preemption: &Preemption) -> Victim;
    /// A `Withdrawn` victim is taken again for `preemption.for_job`: its
    /// grace ends when it was to. Returns its grace (seconds), for how
    /// long what it frees is claimed.
    fn take_again(&mut self, preemption: &Preemption, now: Timestamp) -> u64;
    /// A `Running` victim gets its checkpoint signal now: its grace
    /// (seconds) and the GPU-seconds at stake, or `None` where it could
    /// not be signalled.
    fn signal(&mut self, preemption: &Preemption, now: Timestamp) -> Option<(u64, f64)>;
    /// The victim `(id, epoch)` in its grace is not needed any more: its
    /// preemption is withdrawn where it still may be. `Some` (with what it
    /// charged) where it was.
    fn withdraw(&mut self, victim: (JobId, Epoch), now: Timestamp) -> Option<Option<Waste>>;
    /// GPU `gpu` of `node` is held by no running attempt.
    fn free_now(&self, node: &str, gpu: u32) -> bool;
    /// The side's promises and waste budget.
    fn ledgers(&mut self) -> Ledgers<'_>;
}

/// What of a plan acts on running work.
pub struct Actions<'p> {
    pub preemptions: &'p [Preemption],
    /// Each job that waits on victims, and the GPUs it will start on.
    pub holds: &'p [(JobId, Vec<NodePlacement>)],
    pub rescinds: &'p [(JobId, Epoch)],
}

/// The ledgers every side keeps alike.
pub struct Ledgers<'l> {
    pub promises: &'l mut Promises,
    pub waste: &'l mut WasteBudget,
}

/// Carries out `actions` on `side` at `now`: each victim is signalled (or
/// taken again) and what is at stake charged, each job waiting on victims
/// signalled now claims what they free and keeps the free GPUs of its
/// placement, and each rescinded victim's charge goes back.
pub fn carry_out(side: &mut impl Victims, actions: &Actions, now: Timestamp) {
    // The grace of each victim signalled (or taken again) now.
    let mut graces: HashMap<JobId, u64> = HashMap::new();
    for preemption in actions.preemptions {
        match side.victim(preemption) {
            Victim::Gone => {}
            Victim::Withdrawn { charged } => {
                if let Some(charged) = charged {
                    side.ledgers().waste.charge(charged);
                }
                graces.insert(preemption.victim, side.take_again(preemption, now));
            }
            Victim::Running => {
                if let Some((grace_secs, lost_gpu_secs)) = side.signal(preemption, now) {
                    graces.insert(preemption.victim, grace_secs);
                    side.ledgers().waste.charge((now, lost_gpu_secs));
                }
            }
        }
    }
    if !actions.holds.is_empty() {
        // The GPUs of the holds' placements free now.
        let free: HashSet<(&str, u32)> = actions
            .holds
            .iter()
            .flat_map(|(_, placement)| placement)
            .flat_map(|part| part.gpu_indices.iter().map(move |gpu| (part.node.as_str(), *gpu)))
            .filter(|(node, gpu)| side.free_now(node, *gpu))
            .collect();
        let grace_of = |p: &Preemption| graces.get(&p.victim).copied();
        side.ledgers()
            .promises
            .hold(actions.holds, (actions.preemptions, grace_of), now, |node, gpu| {
                free.contains(&(node, gpu))
            });
    }
    for rescind in actions.rescinds {
        if let Some(Some(charged)) = side.withdraw(*rescind, now) {
            side.ledgers().waste.give_back(charged);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A side whose victims stand as `standing` says; every GPU but
    /// `n1`'s 0 is held.
    struct Side {
        standing: HashMap<JobId, Victim>,
        signalled: Vec<JobId>,
        withdrawn: Vec<JobId>,
        promises: Promises,
        waste: WasteBudget,
    }

    impl Victims for Side {
        fn victim(&self, preemption: &Preemption) -> Victim {
            self.standing.get(&preemption.victim).copied().unwrap_or(Victim::Gone)
        }
        fn take_again(&mut self, preemption: &Preemption, _now: Timestamp) -> u64 {
            self.signalled.push(preemption.victim);
            30
        }
        fn signal(&mut self, preemption: &Preemption, _now: Timestamp) -> Option<(u64, f64)> {
            self.signalled.push(preemption.victim);
            Some((30, preemption.lost_gpu_secs))
        }
        fn withdraw(&mut self, (victim, _): (JobId, Epoch), _now: Timestamp) -> Option<Option<Waste>> {
            self.withdrawn.push(victim);
            Some(Some((Timestamp(1_000), 200.0)))
        }
        fn free_now(&self, node: &str, gpu: u32) -> bool {
            (node, gpu) == ("n1", 0)
        }
        fn ledgers(&mut self) -> Ledgers<'_> {
            Ledgers {
                promises: &mut self.promises,
                waste: &mut self.waste,
            }
        }
    }

    fn preempt(victim: u64, for_job: u64, lost_gpu_secs: f64) -> Preemption {
        Preemption {
            victim: JobId(victim),
            epoch: Epoch(1),
            for_job: JobId(for_job),
            lost_gpu_secs,
        }
    }

    /// The signalled victim's stake is charged, a withdrawn one taken
    /// again is charged what it was, a gone one nothing, and a rescind's
    /// charge goes back; only a job whose victims were signalled keeps
    /// the free GPUs of its placement.
    #[test]
    fn victims_are_charged_and_holds_kept_only_for_those_signalled() {
        let now = Timestamp(2_000);
        let mut side = Side {
            standing: HashMap::from([
                (JobId(1), Victim::Running),
                (
                    JobId(2),
                    Victim::Withdrawn {
                        charged: Some((Timestamp(500), 50.0)),
                    },
                ),
            ]),
            signalled: Vec::new(),
            withdrawn: Vec::new(),
            promises: Promises::default(),
            waste: WasteBudget::default(),
        };
        side.waste.charge((Timestamp(1_000), 200.0));
        let placement = |gpu: u32| {
            vec![NodePlacement {
                node: "n1".into(),
                gpu_indices: vec![gpu],
            }]
        };
        // Job 11 waits on 3, which is gone: it keeps nothing.
        let gone = [preempt(3, 11, 400.0)];
        let holds = [(JobId(11), placement(0))];
        let actions = Actions {
            preemptions: &gone,
            holds: &holds,
            rescinds: &[],
        };
        carry_out(&mut side, &actions, now);
        assert!(side.signalled.is_empty());
        assert!(side.promises.is_empty());
        assert_eq!(side.waste.left(now, 1.0), 3600.0 - 200.0);

        let preemptions = [preempt(1, 10, 100.0), preempt(2, 10, 999.0)];
        let holds = [(JobId(10), placement(0))];
        let rescinds = [(JobId(4), Epoch(1))];
        let actions = Actions {
            preemptions: &preemptions,
            holds: &holds,
            rescinds: &rescinds,
        };
        carry_out(&mut side, &actions, now);
        assert_eq!(side.signalled, vec![JobId(1), JobId(2)]);
        assert_eq!(side.withdrawn, vec![JobId(4)]);
        assert!(!side.promises.is_empty(), "job 10 keeps n1's free GPU 0");
        // 100 at stake for job 1, 50 again for job 2; the rescind's 200 back.
        assert_eq!(side.waste.left(now, 1.0), 3600.0 - 150.0);
    }
}
