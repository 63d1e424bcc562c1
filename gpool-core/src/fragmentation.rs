//! Fragmentation as operators read it: how many more jobs of 1, 2, 4 and
//! 8 GPUs, and how many whole-node gangs, could start now on the free GPUs
//! (a job's GPUs are on one node). Enough free GPUs in total but few of
//! these is a fragmented pool.

use serde::Serialize;

/// The job sizes counted.
pub const SIZES: [u32; 4] = [1, 2, 4, 8];

/// What could start now on a set of nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Startable {
    /// Jobs of `SIZES[i]` GPUs, each on one node.
    pub jobs: [u64; 4],
    /// Nodes with all their GPUs free: gangs of whole nodes.
    pub whole_nodes: u64,
    pub free_gpus: u64,
}

impl Startable {
    /// Adds a node with `free` of its `total` GPUs free (in service, on a
    /// node that takes work).
    pub fn add_node(&mut self, free: u32, total: u32) {
        for (count, size) in self.jobs.iter_mut().zip(SIZES) {
            *count += u64::from(free / size);
        }
        self.whole_nodes += u64::from(total > 0 && free == total);
        self.free_gpus += u64::from(free);
    }

    /// `12/6/3/1 (1 whole)`: jobs of 1/2/4/8 GPUs, and whole nodes.
    pub fn summary(&self) -> String {
        let jobs: Vec<String> = self.jobs.iter().map(u64::to_string).collect();
        format!("{} ({} whole)", jobs.join("/"), self.whole_nodes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_gpus_split_across_nodes_start_fewer_large_jobs() {
        // 8 free GPUs either way: on one idle 8-GPU node, or as 2 + 3 + 3.
        let mut whole = Startable::default();
        whole.add_node(8, 8);
        assert_eq!(whole.jobs, [8, 4, 2, 1]);
        assert_eq!((whole.whole_nodes, whole.summary().as_str()), (1, "8/4/2/1 (1 whole)"));
        let mut split = Startable::default();
        for free in [2, 3, 3] {
            split.add_node(free, 8);
        }
        assert_eq!(split.jobs, [8, 3, 0, 0]);
        assert_eq!((split.whole_nodes, split.free_gpus), (0, 8));
        // A node with no GPU is never a whole-node gang.
        let mut empty = Startable::default();
        empty.add_node(0, 0);
        assert_eq!(empty, Startable::default());
    }
}
