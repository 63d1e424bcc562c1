//! Fractions of a GPU within a cycle: a fraction joins the shared GPU it
//! fits best; only where none takes it does it open a whole free GPU,
//! which the free index picks as for any one-GPU job (the fullest node
//! first, so whole nodes stay whole). Fractions neither preempt nor are
//! preempted: their GPU would not be freed by one of them ending.

use super::{Attempt, Cycle, ShapeKey, TeamRow};
use crate::model::NodePlacement;
use crate::sched::{Availability, ClusterView, NodeView, PendingJob, Reject};
use crate::share::{Share, ShareAsk, SharedGpu};

/// The shared GPUs of nodes that are up, by node position and GPU index,
/// with this cycle's starts added.
#[derive(Default)]
pub(super) struct Shares {
    gpus: Vec<((usize, u32), SharedGpu)>,
    /// Some waiting job asks for a fraction (asked once, where some GPU is
    /// shared: otherwise shared GPUs keep no cycle going).
    wanted: Option<bool>,
}

impl Shares {
    pub(super) fn of(view: &ClusterView) -> Shares {
        let gpus = view
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, node)| node.availability == Availability::Up)
            .flat_map(|(at, node)| {
                node.gpus
                    .iter()
                    .filter_map(move |gpu| Some(((at, gpu.index), gpu.shared.clone()?)))
            })
            .collect();
        Shares { gpus, wanted: None }
    }

    /// Some shared GPU may still take a waiting fraction.
    pub(super) fn may_take(&mut self, view: &ClusterView) -> bool {
        !self.gpus.is_empty()
            && *self
                .wanted
                .get_or_insert_with(|| view.pending.iter().any(|job| job.shape.share.is_some()))
    }
}

/// Whether `job` may run on `node` at all, beside its GPU (its pool, its
/// requirements, the limits it wants held).
fn allows(cycle: &Cycle, job: &PendingJob, node: &NodeView) -> bool {
    let pool = cycle.policy.pool(&job.shape.pool);
    pool.is_some_and(|pool| pool.selects(&node.labels))
        && job.allows_node(node)
        && job.enforced_on(node, cycle.policy.enforce_limits)
        && cycle.index.host_fits(&node.name, job.shape.host)
}

impl<'v> Cycle<'v> {
    /// A fraction's turn: it joins a shared GPU, opens a free one, or waits
    /// with the free GPUs' reasons.
    pub(super) fn try_share(&mut self, attempt: &Attempt<'v>, row: &mut TeamRow, shape: ShapeKey<'v>, ask: ShareAsk) {
        let job = attempt.job;
        let rules = self.policy.sharing.shares;
        let view = self.view;
        let shared = self.shares.gpus.iter().enumerate().filter(|(_, ((at, index), _))| {
            let node = &view.nodes[*at];
            node.gpus
                .iter()
                .find(|gpu| gpu.index == *index)
                .is_some_and(|gpu| gpu.model.accepted_by(&job.shape.gpu_types) && job.allows_memory(gpu.memory_mib))
                && allows(self, job, node)
        });
        let shared: Vec<(usize, &SharedGpu)> = shared.map(|(slot, (_, gpu))| (slot, gpu)).collect();
        let room = Reject::ShareRoom {
            asked: match ask.memory_mib {
                0 => format!("{:.3} of a GPU", f64::from(ask.fraction_milli) / 1000.0),
                mib => format!("{mib} MiB"),
            },
            n_shared: shared.len(),
            most_free_mib: shared.iter().map(|(_, gpu)| gpu.free_mib()).max().unwrap_or(0),
        };
        let (placement, share) = match crate::share::best_fit(&ask, &job.user, &rules, shared) {
            Some((slot, share)) => {
                let ((at, index), gpu) = &mut self.shares.gpus[slot];
                gpu.add(&share, &job.user);
                let placement = vec![NodePlacement {
                    node: view.nodes[*at].name.clone(),
                    gpu_indices: vec![*index],
                }];
                self.index.remove(&placement, attempt.host());
                (placement, share)
            }
            None => match self.place(attempt) {
                Ok(placement) => {
                    let share = self.open(&placement, &ask, &job.user);
                    (placement, share)
                }
                Err(mut reasons) => {
                    reasons.push(room);
                    return self.explain(attempt, shape, row, reasons);
                }
            },
        };
        self.reclaim.taken(&placement, attempt.job.shape.host);
        // A fraction counts one GPU against caps and the GPUs a guarantee
        // covers, as running fractions do in every view (GPU-hours count
        // its part).
        self.charge(attempt, row, 1);
        self.launch(attempt, placement);
        if let Some(start) = self.plan.starts.last_mut() {
            start.share = Some(share);
        }
    }

    /// A whole free GPU becomes shared by `ask` of `user`'s.
    fn open(&mut self, placement: &[NodePlacement], ask: &ShareAsk, user: &str) -> Share {
        let rules = self.policy.sharing.shares;
        let (at, node) = self
            .view
            .nodes
            .iter()
            .enumerate()
            .find(|(_, node)| node.name == placement[0].node)
            .expect("a placement is on a node of the view");
        let index = placement[0].gpu_indices[0];
        let usable = node
            .gpus
            .iter()
            .find(|gpu| gpu.index == index)
            .map_or(0, crate::sched::GpuView::usable_mib);
        // The driver may keep so much that the ask no longer fits (the
        // index matched its memory whole): it holds the GPU whole then.
        let share = ask.on(usable, &rules).unwrap_or(Share {
            memory_mib: usable,
            compute_pct: ask.compute_pct,
            milli: 1000,
        });
        let mut gpu = SharedGpu::new(usable);
        gpu.add(&share, user);
        self.shares.gpus.push(((at, index), gpu));
        share
    }
}
