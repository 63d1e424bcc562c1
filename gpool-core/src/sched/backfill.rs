//! Reservations for backfill: when would a blocked job start, and on which
//! GPUs, if running jobs end by their time limits?

use super::index::FreeIndex;
use super::node_view::room_on;
use super::{NodeView, PendingJob, Policy};
use crate::ids::{JobId, Timestamp};
use crate::model::NodePlacement;
use std::collections::{HashMap, HashSet};

/// GPUs held for the highest-priority blocked job from `at` on.
#[derive(Debug, Clone)]
pub(super) struct Reservation {
    pub job: JobId,
    pub at: Timestamp,
    pub placement: Vec<NodePlacement>,
}

/// A running attempt's GPUs and when they come free (`None`: no limit).
pub(super) struct Release<'a> {
    pub ends_at: Option<Timestamp>,
    pub placement: &'a [NodePlacement],
}

/// The earliest time `job` fits on `nodes` (busy GPUs as they are now) as
/// `releases` end by their time limits, and where; `None` if it does not
/// fit before a release with no limit (or at all).
pub(super) fn earliest_start<N: std::borrow::Borrow<NodeView>>(
    job: &PendingJob,
    nodes: &[N],
    mut releases: Vec<Release>,
    policy: &Policy,
) -> Option<(Timestamp, Vec<NodePlacement>)> {
    releases.sort_by_key(|release| release.ends_at.map_or(i64::MAX, |at| at.0));
    let pool = policy.pool(&job.shape.pool);
    let node_idx: HashMap<&str, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, n)| (n.borrow().name.as_str(), i))
        .collect();
    let mut freed_on: HashMap<usize, Vec<u32>> = HashMap::new();
    let room = |node_idx: usize, freed_on: &HashMap<usize, Vec<u32>>| {
        room_on(
            job,
            (pool, policy.enforce_limits),
            nodes[node_idx].borrow(),
            freed_on.get(&node_idx).map_or(&[][..], Vec::as_slice),
        )
    };
    let mut with_room: HashSet<usize> = (0..nodes.len()).filter(|i| room(*i, &freed_on)).collect();
    for release in releases {
        let at = release.ends_at?;
        let mut changed = false;
        for part in release.placement {
            if let Some(idx) = node_idx.get(part.node.as_str()) {
                freed_on.entry(*idx).or_default().extend(&part.gpu_indices);
                if room(*idx, &freed_on) {
                    with_room.insert(*idx);
                    changed = true;
                }
            }
        }
        if !changed || with_room.len() < job.shape.nodes as usize {
            continue;
        }
        let mut candidates: Vec<usize> = with_room.iter().copied().collect();
        candidates.sort_unstable();
        let hypothetical: Vec<NodeView> = candidates
            .iter()
            .map(|idx| {
                let mut node = nodes[*idx].borrow().clone();
                if let Some(extra) = freed_on.get(idx) {
                    for gpu in &mut node.gpus {
                        if extra.contains(&gpu.index) {
                            gpu.busy = false;
                        }
                    }
                }
                node
            })
            .collect();
        if let Ok(placement) = FreeIndex::build(&hypothetical, policy).place(job, policy) {
            return Some((at, placement));
        }
    }
    None
}
