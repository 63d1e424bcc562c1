//! Fractions of a GPU in the replay: a fraction's start adds its part to
//! its GPU (opening it where no fraction held it), its end takes the part
//! off and frees the GPU with the last one. Under a setup that rounds
//! fractions up to whole GPUs, they run as one-GPU jobs, counted apart.

use super::Sim;
use crate::sched::{RunningJob, Start};
use crate::share::ShareAsk;

impl Sim<'_> {
    /// What trace job `index` asks for as a fraction (`None`: whole GPUs,
    /// or the setup rounds fractions up to them).
    pub(super) fn share_ask(&self, index: usize) -> Option<ShareAsk> {
        let milli = self.jobs[index].gpu_milli.filter(|_| !self.setup.whole_fractions)?;
        Some(ShareAsk {
            fraction_milli: milli,
            ..ShareAsk::default()
        })
    }

    /// A fraction's `start` of `user`'s takes its part of its GPU.
    pub(super) fn share_start(&mut self, start: &Start, user: &str) {
        let (Some(share), Some(part)) = (start.share, start.placement.first()) else {
            return;
        };
        let Some(node) = self.node_index.get(&part.node).map(|i| &mut self.view.nodes[*i]) else {
            return;
        };
        if node.add_share(part.gpu_indices[0], &share, user) {
            self.out.fraction_gpu(true, false, self.now);
        }
    }

    /// `running`, a fraction, ended (or was stopped): its part leaves its
    /// GPU.
    pub(super) fn share_stop(&mut self, running: &RunningJob) {
        let (Some(share), Some(part)) = (running.share, running.placement.first()) else {
            return;
        };
        let Some(node) = self.node_index.get(&part.node).map(|i| &mut self.view.nodes[*i]) else {
            return;
        };
        if node.remove_share(part.gpu_indices[0], &share) {
            self.out.fraction_gpu(false, false, self.now);
        }
    }

    /// A fraction's attempt `running` (of trace job `index`) starts or
    /// stops (`started`): a rounded-up one's whole GPU counts as the
    /// fractions'; every stop counts the part it ran.
    pub(super) fn fraction_counts(&mut self, index: usize, running: &RunningJob, started: bool) {
        let Some(milli) = self.jobs[index].gpu_milli else {
            return;
        };
        if running.share.is_none() {
            self.out.fraction_gpu(started, true, self.now);
        }
        if !started {
            self.out.fraction_ran(milli, self.now.0 - running.started_at.0);
        }
    }
}
