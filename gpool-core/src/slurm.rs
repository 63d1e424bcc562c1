//! Slurm's view of a running job, for the launchers, frameworks and site
//! scripts that read it: the `SLURM_*` variables of each rank, with
//! Slurm's formats (compressed host lists such as `gpu-[01-04,07]`, task
//! counts such as `2(x4)`). A job's script runs once on each of its nodes,
//! as the node's first task (`SLURM_PROCID` = node rank × tasks per node);
//! `srun` inside it starts the node's tasks, each with its own.

/// What the variables are made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlurmJob<'a> {
    /// The job's (or the array task's) own id.
    pub job_id: u64,
    pub name: &'a str,
    /// Its nodes, rank 0 first.
    pub nodes: &'a [String],
    pub submit_dir: &'a str,
    /// Where it was submitted from, where known (empty: not set).
    pub submit_host: &'a str,
    pub cluster: &'a str,
    /// Its pool, as Slurm's partition.
    pub partition: &'a str,
    /// Its team, as Slurm's account.
    pub account: &'a str,
    /// CPUs per GPU, where the job asked for them.
    pub cpus_per_gpu: Option<u32>,
    /// Memory per node (bytes), where the job asked for it.
    pub mem_bytes: Option<u64>,
    /// 0 for the first attempt.
    pub restart_count: u32,
    /// Tasks on each node (at least 1): `srun` inside the job starts them.
    pub tasks_per_node: u32,
    pub array: Option<SlurmArray>,
}

/// An array task's place in its array.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlurmArray {
    pub array_job_id: u64,
    pub task_id: u32,
    pub task_count: u32,
    pub task_min: u32,
    pub task_max: u32,
}

/// The variables of rank `rank`, which has `gpus_on_node` GPUs.
pub fn env(job: &SlurmJob, rank: u32, gpus_on_node: u32) -> Vec<(String, String)> {
    let n_nodes = job.nodes.len().max(1) as u32;
    let per_node = job.tasks_per_node.max(1);
    let hosts = hostlist(job.nodes);
    let mut env: Vec<(&str, String)> = vec![
        ("SLURM_JOB_ID", job.job_id.to_string()),
        ("SLURM_JOBID", job.job_id.to_string()),
        ("SLURM_JOB_NAME", job.name.to_string()),
        ("SLURM_JOB_NUM_NODES", n_nodes.to_string()),
        ("SLURM_NNODES", n_nodes.to_string()),
        ("SLURM_JOB_NODELIST", hosts.clone()),
        ("SLURM_NODELIST", hosts),
        ("SLURM_SUBMIT_DIR", job.submit_dir.to_string()),
        ("SLURM_CLUSTER_NAME", job.cluster.to_string()),
        ("SLURM_JOB_PARTITION", job.partition.to_string()),
        ("SLURM_JOB_ACCOUNT", job.account.to_string()),
        ("SLURM_NTASKS", (n_nodes * per_node).to_string()),
        ("SLURM_NPROCS", (n_nodes * per_node).to_string()),
        ("SLURM_NTASKS_PER_NODE", per_node.to_string()),
        (
            "SLURM_TASKS_PER_NODE",
            tasks_per_node(&vec![per_node; n_nodes as usize]),
        ),
        ("SLURM_PROCID", (rank * per_node).to_string()),
        ("SLURM_LOCALID", "0".to_string()),
        ("SLURM_NODEID", rank.to_string()),
        ("SLURM_GPUS_ON_NODE", gpus_on_node.to_string()),
        ("SLURM_RESTART_COUNT", job.restart_count.to_string()),
    ];
    if !job.submit_host.is_empty() {
        env.push(("SLURM_SUBMIT_HOST", job.submit_host.to_string()));
    }
    if let Some(cpus_per_gpu) = job.cpus_per_gpu {
        // The node's one task has every CPU the job has there.
        env.push(("SLURM_CPUS_PER_TASK", (cpus_per_gpu * gpus_on_node.max(1)).to_string()));
    }
    if let Some(bytes) = job.mem_bytes {
        // Slurm's megabytes are MiB.
        env.push(("SLURM_MEM_PER_NODE", (bytes >> 20).to_string()));
    }
    if let Some(array) = job.array {
        env.extend([
            ("SLURM_ARRAY_JOB_ID", array.array_job_id.to_string()),
            ("SLURM_ARRAY_TASK_ID", array.task_id.to_string()),
            ("SLURM_ARRAY_TASK_COUNT", array.task_count.to_string()),
            ("SLURM_ARRAY_TASK_MIN", array.task_min.to_string()),
            ("SLURM_ARRAY_TASK_MAX", array.task_max.to_string()),
        ]);
    }
    env.into_iter().map(|(name, value)| (name.to_string(), value)).collect()
}

/// Host names in Slurm's compressed form: names that differ only in a
/// trailing number share a bracket of ranges (`gpu-[01-04,07]`), zero
/// padding kept (`005` and `100` share a width of 3; `9` and `10` share
/// none); others stand alone, comma-separated, in first-seen order of
/// their prefixes.
pub fn hostlist(names: &[String]) -> String {
    // The widths zero-padded numbers of each prefix are written in.
    let padded: Vec<(&str, usize)> = names
        .iter()
        .map(|name| split_number(name))
        .filter(|(_, number)| number.len() > 1 && number.starts_with('0'))
        .map(|(prefix, number)| (prefix, number.len()))
        .collect();
    // (prefix, width of its numbers, or 0 for unpadded) -> numbers.
    let mut groups: Vec<((&str, usize), Vec<u64>)> = Vec::new();
    let mut plain: Vec<(usize, &str)> = Vec::new();
    for (position, name) in names.iter().enumerate() {
        let (prefix, number) = split_number(name);
        let Ok(value) = number.parse::<u64>() else {
            plain.push((position, name));
            continue;
        };
        let width = if padded.contains(&(prefix, number.len())) {
            number.len()
        } else {
            0
        };
        let key = (prefix, width);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, numbers)) => numbers.push(value),
            None => groups.push((key, vec![value])),
        }
    }
    let mut parts: Vec<String> = plain.into_iter().map(|(_, name)| name.to_string()).collect();
    for ((prefix, width), mut numbers) in groups {
        numbers.sort_unstable();
        numbers.dedup();
        let show = |n: u64| format!("{n:0width$}");
        let ranges = number_ranges(&numbers)
            .into_iter()
            .map(|(first, last)| {
                if first == last {
                    show(first)
                } else {
                    format!("{}-{}", show(first), show(last))
                }
            })
            .collect::<Vec<_>>();
        if numbers.len() == 1 {
            parts.push(format!("{prefix}{}", ranges[0]));
        } else {
            parts.push(format!("{prefix}[{}]", ranges.join(",")));
        }
    }
    parts.join(",")
}

/// A host name as its prefix and trailing digits.
fn split_number(name: &str) -> (&str, &str) {
    let digits = name.len() - name.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    name.split_at(name.len() - digits)
}

/// Consecutive runs of sorted `numbers`, as (first, last).
fn number_ranges(numbers: &[u64]) -> Vec<(u64, u64)> {
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    for &n in numbers {
        match ranges.last_mut() {
            Some((_, last)) if *last + 1 == n => *last = n,
            _ => ranges.push((n, n)),
        }
    }
    ranges
}

/// Tasks per node in Slurm's form: runs of equal counts as `N(xK)`,
/// comma-separated (`2(x3),1`).
pub fn tasks_per_node(counts: &[u32]) -> String {
    let mut runs: Vec<(u32, usize)> = Vec::new();
    for &count in counts {
        match runs.last_mut() {
            Some((last, times)) if *last == count => *times += 1,
            _ => runs.push((count, 1)),
        }
    }
    runs.into_iter()
        .map(|(count, times)| {
            if times > 1 {
                format!("{count}(x{times})")
            } else {
                count.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests;
