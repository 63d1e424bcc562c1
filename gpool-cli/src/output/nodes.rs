//! Nodes as tables and JSON: `gpool nodes`, `health`, pool summaries.

use super::*;
use gpool_core::enforce::LimitSet;

pub fn node_state(node: &pb::Node) -> &'static str {
    // A node of a power group that is not up shows where it stands, as
    // sinfo's ~ (powered down), # (powering up) and % (powering down).
    match node.power_state.as_str() {
        "powered_down" => return "powered_down",
        "powering_up" => return "powering_up",
        "powering_down" => return "powering_down",
        _ => {}
    }
    let n_busy = node.gpus.iter().filter(|gpu| gpu.job_id != 0).count();
    match node.state() {
        pb::NodeState::Up if n_busy == 0 => "idle",
        pb::NodeState::Up if n_busy == node.gpus.len() => "allocated",
        pb::NodeState::Up => "mixed",
        pb::NodeState::Draining => "draining",
        pb::NodeState::Drained => "drained",
        pb::NodeState::Down => "down",
        pb::NodeState::Unspecified => "unknown",
    }
}

pub fn gpu_models(node: &pb::Node) -> String {
    let models: std::collections::BTreeSet<&str> = node.gpus.iter().map(|gpu| gpu.model.as_str()).collect();
    models.into_iter().collect::<Vec<_>>().join(",")
}

/// Whether the node's GPUs are simulated ones (its agent's
/// `[[simulated_gpu]]`), not real devices.
pub(super) fn is_simulated(node: &pb::Node) -> bool {
    node.labels
        .iter()
        .any(|l| l.key == "gpool.simulated" && l.value == "true")
}

/// What the node enforces on its jobs, by its agent's `gpool.enforces`
/// label; `None` where its agent does not say (one older than the label),
/// which gpoold takes for nothing.
pub(super) fn enforced(node: &pb::Node) -> Option<LimitSet> {
    node.labels
        .iter()
        .find(|l| l.key == gpool_core::enforce::LABEL)
        .map(|l| LimitSet::parse(&l.value))
}

/// `cpu,devices,memory,pids`, or `none`: the ENFORCES column.
fn enforced_cell(node: &pb::Node) -> String {
    match enforced(node).unwrap_or_default() {
        set if set.is_empty() => "none".to_string(),
        set => set.label(),
    }
}

/// `gpool show NODE`'s `enforces:` line: what it enforces, what not, and
/// where nothing, why.
pub(super) fn enforced_words(node: &pb::Node) -> String {
    let isolation = node
        .labels
        .iter()
        .find(|l| l.key == "isolation")
        .map(|l| l.value.as_str());
    match enforced(node) {
        None => "nothing (its agent does not say what it enforces: an agent older than gpoold)".to_string(),
        Some(set) if set.is_empty() => format!(
            "nothing (isolation: {}; the agent's log says why)",
            isolation.unwrap_or("unknown")
        ),
        Some(set) if set == LimitSet::ALL => set.words(),
        Some(set) => format!("{} (not {})", set.words(), LimitSet::ALL.less(set).words()),
    }
}

pub fn node_json(node: &pb::Node) -> serde_json::Value {
    let labels: BTreeMap<&str, &str> = node.labels.iter().map(|l| (l.key.as_str(), l.value.as_str())).collect();
    let gpus: Vec<serde_json::Value> = node
        .gpus
        .iter()
        .map(|gpu| {
            serde_json::json!({
                "index": gpu.index, "model": gpu.model, "memory_mib": gpu.memory_mib,
                "uuid": gpu.uuid, "job_id": (gpu.job_id != 0).then_some(gpu.job_id),
                "mig_parent": gpu.mig_parent, "numa_node": gpu.numa_node,
                "compute_capability": (!gpu.compute_capability.is_empty()).then_some(&gpu.compute_capability),
                "utilization_pct": gpu.sample.map(|s| s.utilization_pct),
                "memory_used_mib": gpu.sample.map(|s| s.memory_used_mib),
                "temperature_c": gpu.sample.map(|s| s.temperature_c),
                "power_w": gpu.sample.map(|s| s.power_w),
                "reserved_mib": gpu.reserved_mib,
                "shared": (gpu.shared_jobs > 0).then(|| serde_json::json!({
                    "jobs": gpu.shared_jobs, "used_mib": gpu.shared_used_mib,
                    "free_mib": gpu.memory_mib.saturating_sub(gpu.reserved_mib + gpu.shared_used_mib),
                })),
                "out_of_service": gpu.out_of_service.as_ref().map(|out| serde_json::json!({
                    "reason": out.reason, "since": rfc3339(out.since_ms), "by_operator": out.by_operator,
                })),
            })
        })
        .collect();
    serde_json::json!({
        "name": node.name,
        "state": node_state(node),
        "gpus_total": node.gpus.len(),
        "gpus_free": n_free(node),
        "gpus_out_of_service": node.gpus.iter().filter(|gpu| gpu.out_of_service.is_some()).count(),
        "gpu_model": gpu_models(node),
        "simulated": is_simulated(node),
        "pools": node.pools,
        "labels": labels,
        "enforces": enforced(node).unwrap_or_default().names(),
        "cpus": (node.cpus > 0).then_some(node.cpus),
        "memory_bytes": (node.memory_bytes > 0).then_some(node.memory_bytes),
        "reservations": node.reservations.iter().map(|r| serde_json::json!({
            "name": r.name, "start": rfc3339(r.start_ms), "end": rfc3339(r.end_ms),
        })).collect::<Vec<_>>(),
        "drain_reason": (!node.drain_reason.is_empty()).then_some(&node.drain_reason),
        "power": (!node.power_group.is_empty()).then(|| serde_json::json!({
            "group": node.power_group, "state": node.power_state,
            "since": rfc3339(node.power_since_ms),
            "reason": (!node.power_reason.is_empty()).then_some(&node.power_reason),
            "group_paused": (!node.power_group_paused.is_empty()).then_some(&node.power_group_paused),
        })),
        "drained_by_health": node.drained_by_health,
        "drained_by": (!node.drained_by.is_empty()).then_some(&node.drained_by),
        "drained_at": (node.drained_at_ms != 0).then(|| rfc3339(node.drained_at_ms)),
        "health_check": node.health_check.as_ref().map(health_check_json),
        "gpus": gpus,
        "links": node.links.iter().map(|l| serde_json::json!({
            "a": l.a, "b": l.b, "link": gpool_proto::convert::link_name(l.link()),
        })).collect::<Vec<_>>(),
    })
}

pub fn print_nodes_table(nodes: &[pb::Node]) {
    let rows = nodes
        .iter()
        .map(|node| {
            // What it enforces has its own column.
            let labels: Vec<String> = (node.labels.iter())
                .filter(|l| l.key != gpool_core::enforce::LABEL)
                .map(|l| format!("{}={}", l.key, l.value))
                .collect();
            let n_free = n_free(node);
            let n_out = node.gpus.iter().filter(|gpu| gpu.out_of_service.is_some()).count();
            vec![
                node.name.clone(),
                node_state(node).to_string(),
                node.gpus.len().to_string(),
                n_free.to_string(),
                n_out.to_string(),
                if is_simulated(node) {
                    format!("{} (simulated)", gpu_models(node))
                } else {
                    gpu_models(node)
                },
                shared_cell(node),
                node.pools.join(","),
                enforced_cell(node),
                labels.join(","),
                node_reasons(node),
            ]
        })
        .collect();
    print_table(
        &[
            "NAME", "STATE", "GPUS", "FREE", "OUT", "MODEL", "SHARED", "POOLS", "ENFORCES", "LABELS", "REASON",
        ],
        rows,
    );
}

/// `gpool show NODE`: one node, field by field.
pub fn print_node_details(node: &pb::Node) {
    let label = |key: &str| node.labels.iter().find(|l| l.key == key).map(|l| l.value.clone());
    let others: Vec<String> = (node.labels.iter())
        .filter(|l| l.key != gpool_core::enforce::LABEL && l.key != "isolation")
        .map(|l| format!("{}={}", l.key, l.value))
        .collect();
    let simulated = if is_simulated(node) { " (simulated)" } else { "" };
    let lines = [
        ("name", node.name.clone()),
        ("state", node_state(node).to_string()),
        (
            "gpus",
            format!(
                "{} x {}{simulated}, {} free",
                node.gpus.len(),
                gpu_models(node),
                n_free(node)
            ),
        ),
        (
            "shared",
            Some(shared_cell(node)).filter(|cell| cell != "-").unwrap_or_default(),
        ),
        ("pools", node.pools.join(",")),
        (
            "cpus",
            if node.cpus > 0 {
                node.cpus.to_string()
            } else {
                "-".into()
            },
        ),
        (
            "memory",
            if node.memory_bytes > 0 {
                format!("{:.1} GiB", node.memory_bytes as f64 / (1u64 << 30) as f64)
            } else {
                "-".into()
            },
        ),
        ("isolation", label("isolation").unwrap_or("-".into())),
        ("enforces", enforced_words(node)),
        ("labels", others.join(",")),
        ("reason", node_reasons(node)),
    ];
    for (key, value) in lines {
        if !value.is_empty() {
            outln!("{:<17}{value}", format!("{key}:"));
        }
    }
}

/// The GPUs fractions share: `0:40/80G x2` (GPU 0, 40 GiB of 80 usable
/// held by two jobs), `-` where none is shared.
fn shared_cell(node: &pb::Node) -> String {
    let gib = |mib: u64| (mib as f64 / 1024.0).round();
    let shared: Vec<String> = (node.gpus.iter())
        .filter(|gpu| gpu.shared_jobs > 0)
        .map(|gpu| {
            let usable = gpu.memory_mib.saturating_sub(gpu.reserved_mib);
            let (used, jobs) = (gib(gpu.shared_used_mib), gpu.shared_jobs);
            format!("{}:{used}/{}G x{jobs}", gpu.index, gib(usable))
        })
        .collect();
    if shared.is_empty() {
        "-".to_string()
    } else {
        shared.join(",")
    }
}

/// Free and in service: a job may be placed on it.
pub(super) fn is_free(gpu: &pb::Gpu) -> bool {
    gpu.job_id == 0 && gpu.out_of_service.is_none()
}

/// GPUs that could take work now: none on a node that is down, drained
/// or draining.
pub(super) fn n_free(node: &pb::Node) -> usize {
    if node.state() != pb::NodeState::Up {
        return 0;
    }
    node.gpus.iter().filter(|gpu| is_free(gpu)).count()
}

/// The node's drain reason, then each GPU out of service and why.
pub(super) fn node_reasons(node: &pb::Node) -> String {
    let mut reasons: Vec<String> = Vec::new();
    if !node.power_reason.is_empty() {
        reasons.push(node.power_reason.clone());
    }
    if !node.power_group_paused.is_empty() {
        reasons.push(format!("power group {} {}", node.power_group, node.power_group_paused));
    }
    if !node.drain_reason.is_empty() {
        if node.drained_by.is_empty() {
            reasons.push(node.drain_reason.clone());
        } else {
            let at = rfc3339(node.drained_at_ms);
            reasons.push(format!("{} (by {}, {at})", node.drain_reason, node.drained_by));
        }
    }
    for gpu in &node.gpus {
        if let Some(out) = &gpu.out_of_service {
            let pinned = if out.by_operator { ", drained" } else { "" };
            reasons.push(format!("GPU {}{pinned}: {}", gpu.index, out.reason));
        }
    }
    for reservation in &node.reservations {
        reasons.push(format!(
            "reserved for {} from {} to {}",
            reservation.name,
            rfc3339(reservation.start_ms),
            rfc3339(reservation.end_ms)
        ));
    }
    reasons.join("; ")
}

/// `gpool health`: GPUs and nodes out of service now, then each node's
/// health log, oldest first.
pub fn print_health(nodes: &[pb::Node]) {
    let mut out_rows = Vec::new();
    for node in nodes {
        if node.drained_by_health {
            out_rows.push(vec![
                node.name.clone(),
                "-".into(),
                "health".into(),
                node.drain_reason.clone(),
            ]);
        }
        for gpu in &node.gpus {
            if let Some(out) = &gpu.out_of_service {
                let by = if out.by_operator { "operator" } else { "health" };
                out_rows.push(vec![
                    node.name.clone(),
                    gpu.index.to_string(),
                    by.into(),
                    format!("{} (since {})", out.reason, rfc3339(out.since_ms)),
                ]);
            }
        }
    }
    if out_rows.is_empty() {
        outln!("every GPU is in service");
    } else {
        outln!("Out of service:");
        print_table(&["NODE", "GPU", "BY", "REASON"], out_rows);
    }
    for node in nodes {
        if let Some(check) = node.health_check.as_ref().filter(|check| !check.passed) {
            outln!(
                "{}: health program failing at {}: {}",
                node.name,
                rfc3339(check.at_ms),
                check.message
            );
        }
    }
    let mut log: Vec<(&pb::HealthEvent, &str)> = nodes
        .iter()
        .flat_map(|node| node.health_log.iter().map(move |event| (event, node.name.as_str())))
        .collect();
    log.sort_by_key(|(event, _)| event.at_ms);
    if !log.is_empty() {
        outln!("History:");
        let rows = log
            .into_iter()
            .map(|(event, node)| {
                vec![
                    rfc3339(event.at_ms),
                    node.to_string(),
                    event.gpu.map_or("-".to_string(), |gpu| gpu.to_string()),
                    event.transition.clone(),
                    event.reason.clone(),
                ]
            })
            .collect();
        print_table(&["TIME", "NODE", "GPU", "EVENT", "REASON"], rows);
    }
}

pub(super) fn health_check_json(check: &pb::HealthCheck) -> serde_json::Value {
    serde_json::json!({ "passed": check.passed, "message": check.message, "at": rfc3339(check.at_ms) })
}

pub fn health_json(nodes: &[pb::Node]) -> serde_json::Value {
    serde_json::Value::Array(
        nodes
            .iter()
            .map(|node| {
                serde_json::json!({
                    "node": node.name,
                    "drained_by_health": node.drained_by_health,
                    "drain_reason": (!node.drain_reason.is_empty()).then_some(&node.drain_reason),
                    "health_check": node.health_check.as_ref().map(health_check_json),
                    "out_of_service": node.gpus.iter().filter_map(|gpu| gpu.out_of_service.as_ref().map(|out| serde_json::json!({
                        "gpu": gpu.index, "reason": out.reason, "since": rfc3339(out.since_ms), "by_operator": out.by_operator,
                    }))).collect::<Vec<_>>(),
                    "log": node.health_log.iter().map(|event| serde_json::json!({
                        "at": rfc3339(event.at_ms), "gpu": event.gpu, "event": event.transition, "reason": event.reason,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

/// One pool's line of `gpool nodes --summary`, as sinfo's.
#[derive(Default, Serialize)]
pub struct PoolSummary {
    pub pool: String,
    pub nodes: usize,
    /// Nodes by state (idle, mixed, allocated, draining, drained, down).
    pub node_states: BTreeMap<&'static str, usize>,
    pub gpus_total: usize,
    pub gpus_allocated: usize,
    pub gpus_idle: usize,
    /// Free GPUs out of service, and those of nodes that are down, drained
    /// or draining.
    pub gpus_unavailable: usize,
    /// GPUs by model.
    pub models: BTreeMap<String, usize>,
    /// How many more jobs of 1, 2, 4 and 8 GPUs, and whole-node gangs,
    /// could start now.
    pub startable: gpool_core::fragmentation::Startable,
}

/// Per pool (a node counts in each pool it belongs to): its nodes by state
/// and its GPUs allocated, idle and out of service.
pub fn pool_summaries(nodes: &[pb::Node]) -> Vec<PoolSummary> {
    let mut pools: BTreeMap<String, PoolSummary> = BTreeMap::new();
    for node in nodes {
        let state = node_state(node);
        let available = matches!(state, "idle" | "mixed" | "allocated");
        let n_busy = node.gpus.iter().filter(|gpu| gpu.job_id != 0).count();
        // Free GPUs out of service count as such even on a node in service.
        let n_out = node
            .gpus
            .iter()
            .filter(|gpu| gpu.job_id == 0 && gpu.out_of_service.is_some())
            .count();
        // A node no pool selects is counted under "(none)".
        let none = ["(none)".to_string()];
        let node_pools = if node.pools.is_empty() {
            &none[..]
        } else {
            &node.pools[..]
        };
        for pool in node_pools {
            let summary = pools.entry(pool.clone()).or_insert_with(|| PoolSummary {
                pool: pool.clone(),
                ..PoolSummary::default()
            });
            summary.nodes += 1;
            *summary.node_states.entry(state).or_default() += 1;
            summary.gpus_total += node.gpus.len();
            summary.gpus_allocated += n_busy;
            if available {
                summary.gpus_idle += node.gpus.len() - n_busy - n_out;
                summary.gpus_unavailable += n_out;
                summary
                    .startable
                    .add_node((node.gpus.len() - n_busy - n_out) as u32, node.gpus.len() as u32);
            } else {
                summary.gpus_unavailable += node.gpus.len() - n_busy;
            }
            for gpu in &node.gpus {
                *summary.models.entry(gpu.model.clone()).or_default() += 1;
            }
        }
    }
    pools.into_values().collect()
}

pub fn print_pool_summaries(summaries: &[PoolSummary]) {
    let rows = summaries
        .iter()
        .map(|summary| {
            let states: Vec<String> = summary
                .node_states
                .iter()
                .map(|(state, n)| format!("{n} {state}"))
                .collect();
            let models: Vec<String> = summary.models.iter().map(|(model, n)| format!("{n}x{model}")).collect();
            vec![
                summary.pool.clone(),
                summary.nodes.to_string(),
                states.join(", "),
                format!(
                    "{}/{}/{}/{}",
                    summary.gpus_allocated, summary.gpus_idle, summary.gpus_unavailable, summary.gpus_total
                ),
                summary.startable.summary(),
                models.join(","),
            ]
        })
        .collect();
    print_table(
        &[
            "POOL",
            "NODES",
            "NODE STATES",
            "GPUS(A/I/O/T)",
            "FITS 1/2/4/8 GPUS",
            "MODELS",
        ],
        rows,
    );
}
