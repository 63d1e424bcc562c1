//! Builders and a tiny text fixture format for tests and benchmarks.
//!
//! Nodes, one per line: `n1 8xh100 2xl4 used=0-3 switch=a drain down`
//! (`NxMODEL` adds N GPUs with the next indices; `used=` lists busy GPU
//! indices; `nvlink=0-3/4-7` joins each group's GPUs by NVLink;
//! `drain`/`down` set the node's availability; `enforces=memory,cpu` the
//! limits it enforces, every one where unsaid; `k=v` is a label).
//! Jobs, one per line: `j1 gpus=8 nodes=2 type=h100,a100 prio=5 pool=p
//! team=a qos=high at=SECS time=SECS memgib=N cpus=N` (`at`: submitted;
//! `time`: limit; `memgib`, `cpus`: per node, asking for those limits).
//! Running jobs, one per line: `r7 team=a qos=low burst on=n1:0-3+n2:0,2
//! start=SECS ckpt=SECS ends=SECS preempting for=j3`
//! (`for=`: preempting, for pending job 3); their GPUs are marked busy.
//! Malformed fixtures panic with the offending token: they are test code.

use crate::ids::{JobId, Timestamp};
use crate::job_state::JobState;
use crate::model::NodePlacement;
use crate::model::{Gpu, GpuModel, Job, JobSpec, Node, ThinVec};
use crate::sched::{Availability, ClusterView, GpuView, JobShape, NodeView, PendingJob, RunningJob};
use crate::topology::{group_links, Link, Topology};
use std::collections::BTreeMap;

/// Parses node, running-job and pending-job fixtures into a view with an
/// unlimited waste budget and no past usage.
pub fn cluster_view_with(nodes: &str, running: &str, jobs: &str) -> ClusterView {
    let mut view = cluster_view(nodes, jobs);
    view.running = running
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(parse_running_job)
        .collect();
    for job in &view.running {
        for part in &job.placement {
            let node = view
                .nodes
                .iter_mut()
                .find(|n| n.name == part.node)
                .unwrap_or_else(|| panic!("running fixture: no node {}", part.node));
            for gpu in &part.gpu_indices {
                node.gpus[*gpu as usize].busy = true;
            }
        }
    }
    view
}

/// One running job of the fixture syntax (`r1 on=n1:0,1 team=a ...`).
pub fn running_job(line: &str) -> RunningJob {
    parse_running_job(line)
}

/// One waiting job of the fixture syntax (`j1 gpus=4 team=a ...`).
pub fn pending_job(line: &str) -> PendingJob {
    parse_pending_job(line)
}

fn parse_running_job(line: &str) -> RunningJob {
    let mut tokens = line.split_whitespace();
    let id = tokens
        .next()
        .and_then(|t| t.strip_prefix('r'))
        .and_then(|t| t.parse().ok());
    let mut job = RunningJob {
        id: JobId(id.expect("running line starts with rN")),
        epoch: crate::ids::Epoch(1),
        user: "user".into(),
        team: "default".into(),
        qos: String::new(),
        pool: String::new(),
        gpu_types: Vec::new(),
        burst: false,
        placement: Vec::new(),
        started_at: Timestamp(0),
        last_checkpoint_at: None,
        preempting: false,
        preempted_for: None,
        ends_at: None,
        service_before_gpu_secs: 0,
        share: None,
    };
    for token in tokens {
        match token.split_once('=') {
            None if token == "burst" => job.burst = true,
            None if token == "preempting" => job.preempting = true,
            Some(("for", value)) => {
                job.preempting = true;
                job.preempted_for = Some(JobId(value.trim_start_matches('j').parse().expect("for=jN")));
            }
            Some(("team", value)) => job.team = value.into(),
            Some(("user", value)) => job.user = value.into(),
            Some(("qos", value)) => job.qos = value.into(),
            Some(("pool", value)) => job.pool = value.into(),
            Some(("type", value)) => job.gpu_types = value.split(',').map(GpuModel::new).collect(),
            Some(("start", value)) => job.started_at = Timestamp(value.parse::<i64>().expect("start") * 1000),
            Some(("service", value)) => job.service_before_gpu_secs = value.parse().expect("service (GPU-seconds)"),
            Some(("ends", value)) => job.ends_at = Some(Timestamp(value.parse::<i64>().expect("ends") * 1000)),
            Some(("ckpt", value)) => {
                job.last_checkpoint_at = Some(Timestamp(value.parse::<i64>().expect("ckpt") * 1000))
            }
            Some(("on", value)) => {
                job.placement = value
                    .split('+')
                    .map(|part| {
                        let (node, gpus) = part.split_once(':').expect("on=NODE:GPUS");
                        NodePlacement {
                            node: node.into(),
                            gpu_indices: parse_index_list(gpus),
                        }
                    })
                    .collect()
            }
            _ => panic!("running fixture: cannot read {token:?} in {line:?}"),
        }
    }
    job
}

/// Parses node and job fixtures into a view.
pub fn cluster_view(nodes: &str, jobs: &str) -> ClusterView {
    ClusterView {
        nodes: nodes
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(parse_node_view)
            .collect(),
        pending: jobs
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|line| std::sync::Arc::new(parse_pending_job(line)))
            .collect(),
        running: Vec::new(),
        usage: BTreeMap::new(),
        promised: Vec::new(),
        waste_budget_gpu_secs: f64::INFINITY,
        windowed: false,
    }
}

fn parse_node_view(line: &str) -> NodeView {
    let mut tokens = line.split_whitespace();
    let name = tokens.next().expect("node line has a name").to_string();
    let mut node = NodeView {
        name,
        labels: BTreeMap::new(),
        availability: Availability::Up,
        gpus: Vec::new(),
        topology: Default::default(),
        host: None,
        enforces: crate::enforce::LimitSet::ALL,
    };
    for token in tokens {
        if let Some((count, model)) = token.split_once('x').filter(|(c, _)| c.parse::<u32>().is_ok()) {
            for _ in 0..count.parse::<u32>().unwrap_or(0) {
                let index = node.gpus.len() as u32;
                node.gpus.push(GpuView {
                    index,
                    model: GpuModel::new(model),
                    busy: false,
                    memory_mib: 81_920,
                    reserved_mib: 0,
                    shared: None,
                });
            }
        } else if let Some(list) = token.strip_prefix("used=") {
            for index in parse_index_list(list) {
                node.gpus[index as usize].busy = true;
            }
        } else if let Some(groups) = token.strip_prefix("nvlink=") {
            let groups: Vec<Vec<u32>> = groups.split('/').map(parse_index_list).collect();
            node.topology = Topology::new(group_links(&groups, Link::Nvlink));
        } else if let Some(mib) = token.strip_prefix("gpumem=") {
            for gpu in &mut node.gpus {
                gpu.memory_mib = mib.parse().expect("gpumem (MiB)");
            }
        } else if let Some(cpus) = token.strip_prefix("cpus=") {
            node.host.get_or_insert_with(Default::default).total.cpus = cpus.parse().expect("cpus");
        } else if let Some(gib) = token.strip_prefix("memgib=") {
            node.host.get_or_insert_with(Default::default).total.memory_bytes =
                gib.parse::<u64>().expect("memgib") << 30;
        } else if let Some(hold) = token.strip_prefix("hold=") {
            // hold=GPUS:CPUS:MEMGIB, what a running attempt on GPUS holds.
            let mut parts = hold.split(':');
            let gpus = parse_index_list(parts.next().expect("hold=GPUS:CPUS:MEMGIB"));
            let cpus = parts.next().map_or(0, |c| c.parse().expect("hold cpus"));
            let memory_bytes = parts.next().map_or(0, |m| m.parse::<u64>().expect("hold memgib") << 30);
            node.host
                .get_or_insert_with(Default::default)
                .held
                .push(crate::sched::HostHold {
                    gpus,
                    ask: crate::sched::HostAsk { cpus, memory_bytes },
                });
        } else if let Some(limits) = token.strip_prefix("enforces=") {
            // enforces=memory,cpu or enforces= (nothing); every limit if unsaid.
            node.enforces = crate::enforce::LimitSet::parse(limits);
        } else if token == "drain" {
            node.availability = Availability::Draining;
        } else if token == "down" {
            node.availability = Availability::Down;
        } else if let Some((key, value)) = token.split_once('=') {
            node.labels.insert(key.into(), value.into());
        } else {
            panic!("node fixture: cannot read {token:?} in {line:?}");
        }
    }
    node
}

/// `0-3,5` into `[0, 1, 2, 3, 5]`.
pub fn parse_index_list(list: &str) -> Vec<u32> {
    let mut indices = Vec::new();
    for part in list.split(',') {
        let (start, end) = part.split_once('-').unwrap_or((part, part));
        let (start, end): (u32, u32) = (
            start.parse().expect("index list number"),
            end.parse().expect("index list number"),
        );
        indices.extend(start..=end);
    }
    indices
}

/// What a job of `team` asking for one GPU of any model, and nothing
/// else, looks like to the scheduler.
pub fn one_gpu_shape(team: &str) -> JobShape {
    JobShape {
        team: team.into(),
        reservation: Default::default(),
        qos: Default::default(),
        pool: Default::default(),
        gpu_types: Vec::new(),
        gpus_per_node: 1,
        nodes: 1,
        priority: 0,
        time_limit_secs: None,
        requires: None,
        host: None,
        exclusive: false,
        limits: crate::enforce::LimitSet::NONE,
        share: None,
    }
}

fn parse_pending_job(line: &str) -> PendingJob {
    let mut tokens = line.split_whitespace();
    let id = tokens
        .next()
        .and_then(|t| t.strip_prefix('j'))
        .and_then(|t| t.parse().ok());
    let mut job = one_gpu_shape("default");
    let mut submitted_at = Timestamp(0);
    let mut user = compact_str::CompactString::from("user");
    let (mut service_gpu_secs, mut waiting_since) = (0, None);
    for token in tokens {
        let (key, value) = token.split_once('=').expect("job fixture token is key=value");
        match key {
            "gpus" => job.gpus_per_node = value.parse().expect("gpus"),
            "nodes" => job.nodes = value.parse().expect("nodes"),
            "prio" => job.priority = value.parse().expect("prio"),
            "type" => job.gpu_types = value.split(',').map(GpuModel::new).collect(),
            "pool" => job.pool = value.into(),
            "team" => job.team = value.into(),
            "user" => user = value.into(),
            "qos" => job.qos = value.into(),
            "time" => job.time_limit_secs = Some(value.parse().expect("time (seconds)")),
            "at" => submitted_at = Timestamp(value.parse::<i64>().expect("at") * 1000),
            "service" => service_gpu_secs = value.parse().expect("service (GPU-seconds)"),
            "since" => waiting_since = Some(Timestamp(value.parse::<i64>().expect("since") * 1000)),
            "exclusive" => job.exclusive = value == "yes",
            "cpus" => {
                job.host.get_or_insert_with(Default::default).cpus = value.parse().expect("cpus (per node)");
                job.limits = job.limits.with(crate::enforce::Limit::Cpu);
            }
            "memgib" => {
                job.host.get_or_insert_with(Default::default).memory_bytes =
                    value.parse::<u64>().expect("memgib (per node)") << 30;
                job.limits = job.limits.with(crate::enforce::Limit::Memory);
            }
            "mingpumem" => requires(&mut job).min_gpu_memory_mib = value.parse().expect("mingpumem (MiB)"),
            "nvlink" => {
                requires(&mut job).nvlink = crate::model::NvlinkNeed::parse(value).expect("nvlink");
            }
            "only" => requires(&mut job).nodelist = value.split(',').map(String::from).collect(),
            "not" => requires(&mut job).exclude = value.split(',').map(String::from).collect(),
            "label" => {
                let (k, v) = value.split_once(':').expect("label=key:value");
                requires(&mut job).constraints.insert(k.into(), v.into());
            }
            other => panic!("job fixture: unknown key {other:?} in {line:?}"),
        }
    }
    PendingJob {
        id: JobId(id.expect("job line starts with jN")),
        submitted_at,
        shape: std::sync::Arc::new(job),
        user,
        service_gpu_secs,
        waiting_since: waiting_since.unwrap_or(submitted_at),
    }
}

fn requires(job: &mut JobShape) -> &mut crate::model::Requirements {
    std::sync::Arc::make_mut(job.requires.get_or_insert_with(Default::default))
}

/// A node with `n_gpus` GPUs of `model`, alive and undrained.
pub fn node(name: &str, n_gpus: u32, model: &str) -> Node {
    Node {
        name: name.into(),
        gpus: (0..n_gpus)
            .map(|index| Gpu {
                index,
                uuid: format!("GPU-{name}-{index}"),
                model: GpuModel::new(model),
                memory_mib: 81_920,
                reserved_mib: 0,
                pci_bus_id: format!("00000000:{:02x}:00.0", index + 1),
                mig_parent: None,
                numa_node: None,
                compute_capability: String::new(),
            })
            .collect(),
        labels: BTreeMap::new(),
        drain_reason: None,
        drained_by: None,
        alive: true,
        topology: Default::default(),
        gpus_out: Default::default(),
        health_drain: None,
        health_log: Vec::new(),
        boot_id: String::new(),
        cpus: 0,
        memory_bytes: 0,
    }
}

pub struct JobBuilder {
    job: Job,
}

/// A pending one-GPU `true` job, to be adjusted with the builder's methods.
pub fn job_builder(id: JobId) -> JobBuilder {
    JobBuilder {
        job: Job {
            id,
            spec: std::sync::Arc::new(JobSpec {
                name: "job".into(),
                command: vec!["true".into()],
                gpus_per_node: 1,
                nodes: 1,
                gpu_types: Vec::new(),
                team: "default".into(),
                project: String::new(),
                workload_type: String::new(),
                time_limit_secs: None,
                env: Default::default(),
                workdir: String::new(),
                priority: 0,
                pool: Default::default(),
                requeue: true,
                discard_output: false,
                qos: Default::default(),
                checkpoint_signal: None,
                grace_secs: None,
                image: String::new(),
                mem_bytes: None,
                max_output_bytes: None,
                script: None,
                reservation: String::new(),
                begin: None,
                notify: None,
                cpus_per_gpu: None,
                dependencies: Vec::new(),
                singleton: false,
                exclusive: false,
                pty: None,
                hold: false,
                tasks_per_node: 0,
                array: None,
                stdout_path: String::new(),
                stderr_path: String::new(),
                requires: Default::default(),
                gpu_share: None,
            }),
            user: "alice".into(),
            submitted_at: Timestamp(0),
            state: JobState::Pending,
            n_attempts: 0,
            last_nodes: ThinVec::new(),
            n_preemptions: 0,
            requeue_cause: None,
            lost_gpu_secs: 0,
            used_secs: 0,
            service_gpu_secs: 0,
            requeued_at: None,
            lost_attempts: ThinVec::new(),
            held: false,
            array: None,
            array_task: None,
            past_attempts: ThinVec::new(),
            gpu_use: None,
            events: ThinVec::new(),
        },
    }
}

impl JobBuilder {
    pub fn gpus(mut self, gpus_per_node: u32) -> JobBuilder {
        std::sync::Arc::make_mut(&mut self.job.spec).gpus_per_node = gpus_per_node;
        self
    }

    pub fn nodes(mut self, nodes: u32) -> JobBuilder {
        std::sync::Arc::make_mut(&mut self.job.spec).nodes = nodes;
        self
    }

    pub fn gpu_types(mut self, models: &[&str]) -> JobBuilder {
        std::sync::Arc::make_mut(&mut self.job.spec).gpu_types = models.iter().map(|m| GpuModel::new(m)).collect();
        self
    }

    pub fn build(self) -> Job {
        self.job
    }
}

/// `text` with each `(position, insert)` inserted (positions taken modulo
/// the length, moved back to a char boundary): the fuzz tests' mutation of
/// a valid file.
pub fn insert_edits(text: &str, edits: &[(usize, String)]) -> String {
    let mut text = text.to_string();
    for (position, insert) in edits {
        let mut at = position % (text.len() + 1);
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        text.insert_str(at, insert);
    }
    text
}
