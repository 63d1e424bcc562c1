//! How the GPUs of one node are connected, and choosing well-connected GPUs
//! for a job.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The path between two GPUs of a node, best first (as `nvidia-smi topo -m`
/// names them: NV#, PIX/PXB, PHB, NODE, SYS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Link {
    /// Direct NVLink (or through NVSwitch).
    Nvlink,
    /// Through one or more PCIe switches, not the host bridge.
    PcieSwitch,
    /// Through the CPU's PCIe host bridge.
    HostBridge,
    /// Across host bridges within one NUMA node.
    Numa,
    /// Across NUMA nodes (the CPU interconnect).
    System,
}

impl Link {
    pub const ALL: [Link; 5] = [
        Link::Nvlink,
        Link::PcieSwitch,
        Link::HostBridge,
        Link::Numa,
        Link::System,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Link::Nvlink => "nvlink",
            Link::PcieSwitch => "pcie_switch",
            Link::HostBridge => "host_bridge",
            Link::Numa => "numa",
            Link::System => "system",
        }
    }
}

impl fmt::Display for Link {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The link between GPUs `a` and `b` (node-local indices, `a < b`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct GpuLink {
    pub a: u32,
    pub b: u32,
    pub link: Link,
}

/// The links between a node's GPUs. A pair not listed is `System`: nothing
/// better is known of it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// Sorted by `(a, b)`, each pair once, `a < b`.
    links: Vec<GpuLink>,
}

impl Topology {
    /// From links in any order and orientation; a pair given twice keeps
    /// its better link, a GPU linked to itself is dropped.
    pub fn new(links: impl IntoIterator<Item = GpuLink>) -> Topology {
        let mut links: Vec<GpuLink> = links
            .into_iter()
            .filter(|l| l.a != l.b)
            .map(|l| GpuLink {
                a: l.a.min(l.b),
                b: l.a.max(l.b),
                link: l.link,
            })
            .collect();
        links.sort();
        links.dedup_by_key(|l| (l.a, l.b));
        Topology { links }
    }

    pub fn links(&self) -> &[GpuLink] {
        &self.links
    }

    pub fn is_empty(&self) -> bool {
        self.links.is_empty()
    }

    pub fn link(&self, a: u32, b: u32) -> Link {
        let key = (a.min(b), a.max(b));
        match self.links.binary_search_by_key(&key, |l| (l.a, l.b)) {
            Ok(found) => self.links[found].link,
            Err(_) => Link::System,
        }
    }

    /// The worst link between any two of `gpus` (`Nvlink` for one GPU).
    pub fn worst_link(&self, gpus: &[u32]) -> Link {
        let mut worst = Link::Nvlink;
        for (i, a) in gpus.iter().enumerate() {
            for b in &gpus[i + 1..] {
                worst = worst.max(self.link(*a, *b));
            }
        }
        worst
    }

    /// Picks `n` of the `free` GPUs (ascending indices) that are best
    /// connected: grown greedily from each free GPU in turn, adding the GPU
    /// whose worst link to the set so far is best (lowest index on ties),
    /// keeping the set whose worst link is best, then the one that leaves
    /// the fewest free GPUs NVLinked to it (best fit: small jobs go where an
    /// NVLink domain is already broken, whole domains stay free for jobs
    /// that need them), then the best sum of links. On nodes built of
    /// NVLink islands this finds an all-NVLink set whenever one island has
    /// `n` free. Without topology, the lowest indices.
    pub fn choose(&self, free: &[u32], n: usize) -> Vec<u32> {
        if n >= free.len() || n == 0 || self.is_empty() {
            return free[..n.min(free.len())].to_vec();
        }
        let mut best: Option<((Link, usize, usize), Vec<u32>)> = None;
        for seed in free {
            let mut set = vec![*seed];
            while set.len() < n {
                let next = free
                    .iter()
                    .filter(|gpu| !set.contains(gpu))
                    .min_by_key(|gpu| (set.iter().map(|m| self.link(**gpu, *m)).max(), **gpu));
                match next {
                    Some(gpu) => set.push(*gpu),
                    None => break,
                }
            }
            let left_joined = free
                .iter()
                .filter(|gpu| !set.contains(gpu) && set.iter().any(|m| self.link(**gpu, *m) == Link::Nvlink))
                .count();
            let score = (self.worst_link(&set), left_joined, self.link_sum(&set));
            if best.as_ref().is_none_or(|(best_score, _)| score < *best_score) {
                best = Some((score, set));
            }
        }
        let mut chosen = best.map(|(_, set)| set).unwrap_or_default();
        chosen.sort_unstable();
        chosen
    }

    fn link_sum(&self, gpus: &[u32]) -> usize {
        let mut sum = 0;
        for (i, a) in gpus.iter().enumerate() {
            for b in &gpus[i + 1..] {
                sum += self.link(*a, *b) as usize;
            }
        }
        sum
    }
}

/// Links of GPU groups: every pair within one group gets `link`.
pub fn group_links(groups: &[Vec<u32>], link: Link) -> Vec<GpuLink> {
    let mut links = Vec::new();
    for group in groups {
        for (i, a) in group.iter().enumerate() {
            for b in &group[i + 1..] {
                links.push(GpuLink { a: *a, b: *b, link });
            }
        }
    }
    links
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A DGX-like node of two NVLink islands of four, each island under
    /// two PCIe switches.
    fn islands() -> Topology {
        let mut links = group_links(&[vec![0, 1, 2, 3], vec![4, 5, 6, 7]], Link::Nvlink);
        links.extend(group_links(&[vec![0, 4], vec![1, 5]], Link::PcieSwitch));
        Topology::new(links)
    }

    #[test]
    fn unlisted_pairs_are_system_and_pairs_have_no_direction() {
        let topology = islands();
        assert_eq!(topology.link(2, 1), Link::Nvlink);
        assert_eq!(topology.link(4, 0), Link::PcieSwitch);
        assert_eq!(topology.link(3, 7), Link::System);
        assert_eq!(topology.worst_link(&[0, 1, 2]), Link::Nvlink);
        assert_eq!(topology.worst_link(&[0, 1, 4]), Link::System);
    }

    #[test]
    fn small_jobs_go_where_an_nvlink_domain_is_already_broken() {
        // A 4-GPU domain and two pairs: single GPUs fill the pairs, so the
        // four stay whole for a job that needs NVLink between four.
        let topology = Topology::new(group_links(&[vec![0, 1, 2, 3], vec![4, 5], vec![6, 7]], Link::Nvlink));
        let all: Vec<u32> = (0..8).collect();
        assert_eq!(topology.choose(&all, 1), vec![4]);
        assert_eq!(topology.choose(&[0, 1, 2, 3, 5, 6, 7], 1), vec![5]);
        assert_eq!(topology.choose(&[0, 1, 2, 3, 6, 7], 2), vec![6, 7]);
        assert_eq!(topology.choose(&[0, 1, 2, 3], 4), vec![0, 1, 2, 3]);
        // On the island node, a GPU next to a busy one goes first.
        assert_eq!(islands().choose(&[1, 2, 3, 4, 5, 6, 7], 1), vec![1]);
    }

    #[test]
    fn choose_keeps_a_job_inside_one_island() {
        let topology = islands();
        // Island one has 0 and 3 free, island two has 5, 6 and 7.
        assert_eq!(topology.choose(&[0, 3, 5, 6, 7], 3), vec![5, 6, 7]);
        assert_eq!(topology.choose(&[0, 3, 5, 6, 7], 2), vec![0, 3]);
        assert_eq!(Topology::default().choose(&[0, 3, 5, 6, 7], 2), vec![0, 3]);
    }

    proptest! {
        /// `choose` returns `n` distinct free GPUs, and on an island node
        /// an all-NVLink set whenever one island has `n` free.
        #[test]
        fn choose_picks_free_gpus_and_finds_whole_islands(
            free_mask in 1u8..=255,
            n in 1usize..=8,
        ) {
            let free: Vec<u32> = (0..8).filter(|i| free_mask & (1 << i) != 0).collect();
            prop_assume!(n <= free.len());
            let topology = islands();
            let chosen = topology.choose(&free, n);
            prop_assert_eq!(chosen.len(), n);
            prop_assert!(chosen.windows(2).all(|w| w[0] < w[1]));
            prop_assert!(chosen.iter().all(|gpu| free.contains(gpu)));
            let island_fits = [0u32, 4].iter().any(|first| free.iter().filter(|g| (*first..first + 4).contains(*g)).count() >= n);
            if island_fits {
                prop_assert_eq!(topology.worst_link(&chosen), Link::Nvlink);
            }
        }
    }
}
