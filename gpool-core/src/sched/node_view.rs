//! The nodes as the scheduler sees them: their GPUs, which are busy, and
//! the CPUs and memory their agents report with what running attempts
//! hold of them.

use crate::model::{GpuModel, JobSpec, Node};
use crate::topology::Topology;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    Up,
    Draining,
    Down,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub availability: Availability,
    pub gpus: Vec<GpuView>,
    pub topology: Topology,
    /// Its CPUs and memory, where its agent reports them; `None`: jobs'
    /// CPU and memory asks are not held against it.
    pub host: Option<HostView>,
    /// The limits it enforces on its attempts: its agent's word (the
    /// `gpool.enforces` label; nothing where the agent does not say), every
    /// one on the simulator's nodes.
    pub enforces: crate::enforce::LimitSet,
}

/// CPUs and memory: what a job takes on each of its nodes, or what a node
/// has free.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HostAsk {
    pub cpus: u64,
    pub memory_bytes: u64,
}

impl HostAsk {
    /// What `spec` takes on each node: `--cpus-per-gpu` times its GPUs
    /// there, and `--mem` (`--mem-per-gpu` made per node); `None` where it
    /// asks for neither.
    pub fn of(spec: &JobSpec) -> Option<HostAsk> {
        let ask = HostAsk {
            cpus: u64::from(spec.cpus_per_gpu.unwrap_or(0)) * u64::from(spec.gpus_per_node.max(1)),
            memory_bytes: spec.mem_bytes.unwrap_or(0),
        };
        (ask != HostAsk::default()).then_some(ask)
    }

    /// `ask` with what it leaves out (0) from `defaults`, a pool's, as
    /// gpoold fills them in at submit.
    pub fn or_defaults(ask: Option<HostAsk>, defaults: &crate::model::PoolDefaults, gpus: u32) -> Option<HostAsk> {
        let ask = ask.unwrap_or_default();
        let per_node = |per_gpu: Option<u64>| per_gpu.unwrap_or(0).saturating_mul(u64::from(gpus.max(1)));
        let filled = HostAsk {
            cpus: if ask.cpus > 0 {
                ask.cpus
            } else {
                per_node(defaults.cpus_per_gpu.map(u64::from))
            },
            memory_bytes: if ask.memory_bytes > 0 {
                ask.memory_bytes
            } else {
                per_node(defaults.mem_per_gpu_bytes)
            },
        };
        (filled != HostAsk::default()).then_some(filled)
    }

    pub fn fits_in(&self, free: HostAsk) -> bool {
        self.cpus <= free.cpus && self.memory_bytes <= free.memory_bytes
    }

    pub fn less(self, taken: HostAsk) -> HostAsk {
        HostAsk {
            cpus: self.cpus.saturating_sub(taken.cpus),
            memory_bytes: self.memory_bytes.saturating_sub(taken.memory_bytes),
        }
    }
}

/// A node's CPUs and memory, and what its running attempts hold of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostView {
    pub total: HostAsk,
    pub held: Vec<HostHold>,
}

/// What one running attempt holds on a node, by the GPUs it holds there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostHold {
    pub gpus: Vec<u32>,
    pub ask: HostAsk,
}

impl NodeView {
    /// Marks `gpus` busy for an attempt that holds `ask` of the node's CPUs
    /// and memory (beside what attempts still ending on them hold).
    pub fn occupy(&mut self, gpus: &[u32], ask: Option<HostAsk>) {
        for gpu in self.gpus.iter_mut().filter(|gpu| gpus.contains(&gpu.index)) {
            gpu.busy = true;
        }
        if let (Some(host), Some(ask)) = (self.host.as_mut(), ask) {
            host.held.push(HostHold {
                gpus: gpus.to_vec(),
                ask,
            });
        }
    }

    /// Marks `gpus` free, with the CPUs and memory of the attempt on them.
    pub fn release(&mut self, gpus: &[u32]) {
        // The view holds GPUs in service only: by index, not position.
        for gpu in self.gpus.iter_mut().filter(|gpu| gpus.contains(&gpu.index)) {
            gpu.busy = false;
        }
        if let Some(host) = self.host.as_mut() {
            host.held.retain(|hold| !hold.gpus.iter().any(|gpu| gpus.contains(gpu)));
        }
    }

    /// Its free CPUs and memory once the attempts on the GPUs `freed` end
    /// (`None`: not known, so not limiting). An attempt's hold ends with
    /// its GPUs: where every GPU it holds is free in the view (or freed),
    /// so a view that frees GPUs (a victim, a time limit's end) frees the
    /// CPUs and memory of their attempts with them.
    pub fn host_free(&self, freed: &[u32]) -> Option<HostAsk> {
        let host = self.host.as_ref()?;
        let released = |gpu: &u32| freed.contains(gpu) || self.gpus.iter().any(|view| view.index == *gpu && !view.busy);
        Some(
            host.held
                .iter()
                .filter(|hold| !hold.gpus.iter().all(released))
                .fold(host.total, |free, hold| free.less(hold.ask)),
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuView {
    pub index: u32,
    pub model: GpuModel,
    pub memory_mib: u64,
    /// What its driver keeps of `memory_mib` (no job can have it).
    pub reserved_mib: u64,
    /// Held by a running attempt.
    pub busy: bool,
    /// Shared by fractions (it is `busy` then, to whole-GPU jobs).
    pub shared: Option<crate::share::SharedGpu>,
}

impl GpuView {
    /// Memory jobs may have: its memory less what the driver keeps.
    pub fn usable_mib(&self) -> u64 {
        self.memory_mib.saturating_sub(self.reserved_mib)
    }

    /// Shared by fractions, with memory left for another.
    pub fn has_shared_room(&self) -> bool {
        self.shared.as_ref().is_some_and(|shared| shared.free_mib() > 0)
    }
}

impl NodeView {
    /// The scheduler's view of a node; `busy` lists the GPU indices running
    /// attempts hold.
    pub fn from_node(node: &Node, busy: &[u32]) -> NodeView {
        let availability = if !node.alive {
            Availability::Down
        } else if node.drain_reason.is_some() {
            Availability::Draining
        } else {
            Availability::Up
        };
        NodeView {
            name: node.name.clone(),
            labels: node.labels.clone(),
            availability,
            gpus: node
                .gpus_in_service()
                .map(|gpu| GpuView {
                    index: gpu.index,
                    model: gpu.model.clone(),
                    memory_mib: gpu.memory_mib,
                    reserved_mib: gpu.reserved_mib,
                    busy: busy.contains(&gpu.index),
                    shared: None,
                })
                .collect(),
            topology: node.topology.clone(),
            host: (node.cpus > 0 && node.memory_bytes > 0).then(|| HostView {
                total: HostAsk {
                    cpus: u64::from(node.cpus),
                    memory_bytes: node.memory_bytes,
                },
                held: Vec::new(),
            }),
            enforces: crate::enforce::LimitSet::of_node(&node.labels),
        }
    }
}

impl NodeView {
    /// Marks its GPU `index` shared by a running fraction `ask` of
    /// `user`'s, and what that comes to there (`None`: no such GPU in
    /// service, or the ask fits it no longer; the job runs on, uncounted).
    pub fn take_share(
        &mut self,
        index: u32,
        (ask, user): (&crate::share::ShareAsk, &str),
        rules: &crate::share::ShareRules,
    ) -> Option<crate::share::Share> {
        let gpu = self.gpus.iter_mut().find(|gpu| gpu.index == index)?;
        gpu.busy = true;
        let share = ask.on(gpu.usable_mib(), rules)?;
        self.add_share(index, &share, user);
        Some(share)
    }

    /// Adds a fraction `share` of `user`'s to its GPU `index` (busy to
    /// whole-GPU jobs from now on); whether that opened the GPU (no
    /// fraction held it).
    pub fn add_share(&mut self, index: u32, share: &crate::share::Share, user: &str) -> bool {
        let Some(gpu) = self.gpus.iter_mut().find(|gpu| gpu.index == index) else {
            return false;
        };
        let (opened, usable) = (gpu.shared.is_none(), gpu.usable_mib());
        gpu.busy = true;
        gpu.shared
            .get_or_insert_with(|| crate::share::SharedGpu::new(usable))
            .add(share, user);
        opened
    }

    /// Takes a fraction `share` off its GPU `index`; whether that was the
    /// last, and the GPU is free now.
    pub fn remove_share(&mut self, index: u32, share: &crate::share::Share) -> bool {
        let Some(gpu) = self.gpus.iter_mut().find(|gpu| gpu.index == index) else {
            return false;
        };
        let Some(shared) = gpu.shared.as_mut() else {
            return false;
        };
        shared.remove(share);
        let closed = shared.jobs == 0;
        if closed {
            gpu.shared = None;
            self.release(&[index]);
        }
        closed
    }
}

/// Whether `node`, of the job's pool, would have `gpus_per_node` free GPUs
/// of one acceptable model once its GPUs `extra` are freed too (and holds
/// the job to its limits, as `enforce` asks).
pub(super) fn room_on(
    job: &super::PendingJob,
    (pool, enforce): (Option<&crate::model::PoolDef>, crate::enforce::EnforceLimits),
    node: &NodeView,
    extra: &[u32],
) -> bool {
    if node.availability != Availability::Up
        || !pool.is_some_and(|pool| pool.selects(&node.labels))
        || !job.allows_node(node)
        || !job.enforced_on(node, enforce)
    {
        return false;
    }
    if !job.allows_host(node.host_free(extra))
        || (job.shape.exclusive
            && (node.gpus.iter().any(|gpu| gpu.busy && !extra.contains(&gpu.index))
                || node.host.as_ref().is_some_and(|host| {
                    host.held
                        .iter()
                        .any(|hold| !hold.gpus.iter().all(|gpu| extra.contains(gpu)))
                })))
    {
        return false;
    }
    let usable = |gpu: &GpuView| {
        (!gpu.busy || extra.contains(&gpu.index))
            && gpu.model.accepted_by(&job.shape.gpu_types)
            && job.allows_memory(gpu.memory_mib)
    };
    let wanted = job.shape.gpus_per_node as usize;
    // Most nodes have one model: counting is enough, without NVLink needs.
    if job.nvlink() != crate::model::NvlinkNeed::Required {
        let mut usable_gpus = node.gpus.iter().filter(|gpu| usable(gpu));
        if let Some(first) = usable_gpus.next() {
            let mut count = 1;
            let one_model = usable_gpus.all(|gpu| {
                count += 1;
                gpu.model == first.model
            });
            if one_model {
                return count >= wanted;
            }
        }
    }
    let mut by_model: Vec<(&crate::model::GpuModel, Vec<u32>)> = Vec::new();
    for gpu in &node.gpus {
        if usable(gpu) {
            match by_model.iter_mut().find(|(model, _)| *model == &gpu.model) {
                Some((_, free)) => free.push(gpu.index),
                None => by_model.push((&gpu.model, vec![gpu.index])),
            }
        }
    }
    by_model.iter().any(|(_, free)| {
        free.len() >= wanted
            && (job.nvlink() != crate::model::NvlinkNeed::Required
                || super::nvlink_set_in(&node.topology, free, wanted))
    })
}
