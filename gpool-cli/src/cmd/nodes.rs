//! `gpool nodes`, `gpool drain`, `gpool resume`.

use super::Ctx;
use crate::output;
use crate::CliError;
use gpool_proto::pb;

/// Every node gpoold knows.
async fn fetch_nodes(ctx: &Ctx) -> Result<Vec<pb::Node>, CliError> {
    let mut conn = ctx.connect().await?;
    Ok(conn
        .client
        .list_nodes(pb::ListNodesRequest {})
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner()
        .nodes)
}

/// `gpool nodes`; with `summary`, one line per pool (as sinfo).
pub async fn list(ctx: &Ctx, summary: bool) -> Result<(), CliError> {
    let nodes = fetch_nodes(ctx).await?;
    match (summary, ctx.json()) {
        (true, true) => output::print_json(&output::pool_summaries(&nodes)),
        (true, false) => output::print_pool_summaries(&output::pool_summaries(&nodes)),
        (false, true) => output::print_json(&serde_json::Value::Array(nodes.iter().map(output::node_json).collect())),
        (false, false) => output::print_nodes_table(&nodes),
    }
    Ok(())
}

/// `gpool show NODE`: one node, field by field (JSON: as `gpool nodes`).
pub async fn show(ctx: &Ctx, name: &str) -> Result<(), CliError> {
    let nodes = fetch_nodes(ctx).await?;
    let node = nodes
        .iter()
        .find(|node| node.name == name)
        .ok_or_else(|| {
            CliError::Usage(format!(
                "{name:?} is neither a job id (such as 123, or 123_4 for task 4 of array 123) nor a node's name (see `gpool nodes`)"
            ))
        })?;
    if ctx.json() {
        output::print_json(&output::node_json(node));
    } else {
        output::print_node_details(node);
    }
    Ok(())
}

/// Drains `name` (or only its GPU `gpu`) when a reason is given (with its
/// running jobs requeued at once if asked), resumes it otherwise.
pub async fn drain(ctx: &Ctx, name: String, gpu: Option<u32>, drain: Option<(String, bool)>) -> Result<(), CliError> {
    let mut conn = ctx.connect().await?;
    let node = match drain {
        Some((reason, now)) => {
            conn.client
                .drain_node(pb::DrainNodeRequest { name, reason, now, gpu })
                .await
        }
        None => conn.client.resume_node(pb::ResumeNodeRequest { name, gpu }).await,
    }
    .map_err(|s| conn.refused(s))?
    .into_inner();
    if ctx.json() {
        output::print_json(&output::node_json(&node));
    } else if let Some(gpu) = gpu.and_then(|gpu| node.gpus.iter().find(|g| g.index == gpu)) {
        let state = if gpu.out_of_service.is_some() {
            "out of service"
        } else {
            "in service"
        };
        outln!("{} GPU {} {state}", node.name, gpu.index);
    } else {
        outln!("{} {}", node.name, output::node_state(&node));
    }
    Ok(())
}

/// `gpool health [NODE]`: GPUs and nodes out of service and why, and the
/// health history.
pub async fn health(ctx: &Ctx, node: Option<String>) -> Result<(), CliError> {
    let mut nodes = fetch_nodes(ctx).await?;
    if let Some(name) = &node {
        nodes.retain(|n| &n.name == name);
        if nodes.is_empty() {
            return Err(CliError::Usage(format!("no node {name:?} (see `gpool nodes`)")));
        }
    }
    if ctx.json() {
        output::print_json(&output::health_json(&nodes));
    } else {
        output::print_health(&nodes);
    }
    Ok(())
}

/// `gpool admin inject NODE --gpu IDX ...`: the node's agent reports the
/// fault as NVML would (admins only).
pub async fn inject(ctx: &Ctx, node: String, fault: pb::Inject) -> Result<(), CliError> {
    let mut conn = ctx.connect().await?;
    let gpu = fault.gpu;
    conn.client
        .inject_fault(pb::InjectFaultRequest {
            node: node.clone(),
            fault: Some(fault),
        })
        .await
        .map_err(|s| conn.refused(s))?;
    if ctx.json() {
        output::print_json(&serde_json::json!({ "injected": { "node": node, "gpu": gpu } }));
    } else {
        outln!("fault injected on {node} GPU {gpu}");
    }
    Ok(())
}

/// `gpool admin node remove NODE`: gpoold forgets the node (admins only).
pub async fn remove(ctx: &Ctx, name: String) -> Result<(), CliError> {
    let mut conn = ctx.connect().await?;
    let removed = conn
        .client
        .remove_node(pb::RemoveNodeRequest { name })
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner()
        .name;
    if ctx.json() {
        output::print_json(&serde_json::json!({ "removed": removed }));
    } else {
        outln!("node {removed} removed");
    }
    Ok(())
}

/// `gpool admin reload`: gpoold re-reads gpoold.toml (admins only).
pub async fn reload(ctx: &Ctx) -> Result<(), CliError> {
    let mut conn = ctx.connect().await?;
    let summary = conn
        .client
        .reload_policy(pb::ReloadPolicyRequest {})
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner()
        .summary;
    if ctx.json() {
        crate::output::print_json(&serde_json::json!({ "reloaded": summary }));
    } else {
        outln!("policy reloaded: {summary}");
    }
    Ok(())
}
