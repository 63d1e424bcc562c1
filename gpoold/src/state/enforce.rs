//! The limits a start's nodes do not enforce of what its job asks for
//! (`gpool_core::enforce`): under `enforce_limits = "refuse"` the start is
//! dropped (the view it came from may be older than a node's last
//! registration), under `"warn"` the job keeps a warning for each node,
//! which `gpool show` prints and a restart keeps.

use super::{Batch, State, Write};
use gpool_core::enforce::{self, EnforceLimits, LimitSet};
use gpool_core::model::NodePlacement;
use gpool_core::{JobId, Timestamp};

impl State {
    /// Each node of `placement` that does not hold job `id` to all the
    /// limits it asks for, with those it does not enforce.
    fn unenforced_on(&self, id: JobId, placement: &[NodePlacement]) -> Vec<(String, LimitSet)> {
        let Some(job) = self.jobs.get(&id) else {
            return Vec::new();
        };
        let asked = enforce::asked_by(&job.spec);
        if asked.is_empty() {
            return Vec::new();
        }
        placement
            .iter()
            .filter_map(|part| {
                let enforced = self.nodes.get(&part.node).map(|node| LimitSet::of_node(&node.labels));
                let missing = enforce::unenforced(asked, enforced);
                (!missing.is_empty()).then(|| (part.node.clone(), missing))
            })
            .collect()
    }

    /// Whether a start of job `id` on `placement` may go ahead: under
    /// `refuse`, only where every node enforces what the job asks for.
    pub(super) fn enforcement_allows(&self, id: JobId, placement: &[NodePlacement]) -> bool {
        self.policy.enforce_limits == EnforceLimits::Warn || self.unenforced_on(id, placement).is_empty()
    }

    /// Keeps a warning on job `id`, just started on `placement`, for each
    /// node that does not enforce what it asks for (under `warn`, the only
    /// mode in which such a start goes ahead).
    pub(super) fn warn_unenforced(&mut self, id: JobId, placement: &[NodePlacement], now: Timestamp, out: &mut Batch) {
        let unenforced = self.unenforced_on(id, placement);
        let Some(job) = self.jobs.get_mut(&id).filter(|_| !unenforced.is_empty()) else {
            return;
        };
        for (node, missing) in unenforced {
            let warning = enforce::warning(&node, missing, &job.spec);
            tracing::warn!("job {id}: {warning}");
            job.record_event(now, warning);
        }
        out.writes.push(Write::Job(id));
    }
}
