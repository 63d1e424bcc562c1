//! GPUs that fractions share: how many fractions run on each, and how much
//! of its usable memory they hold and leave.

use super::gauge;
use crate::state::State;
use prometheus_client::registry::Registry;

pub(super) fn render(registry: &mut Registry, state: &State) {
    let jobs = gauge(registry, "gpu_shared_jobs", "Fractions of the GPU running on it");
    let held = gauge(
        registry,
        "gpu_shared_memory_bytes",
        "GPU memory the fractions on a shared GPU hold (their caps)",
    );
    let free = gauge(
        registry,
        "gpu_shared_free_bytes",
        "GPU memory a shared GPU has left for more fractions",
    );
    for ((node, index), (used_mib, n)) in state.gpu_shares() {
        let Some(gpu) = (state.nodes.get(node)).and_then(|known| known.gpus.iter().find(|gpu| gpu.index == index))
        else {
            continue;
        };
        let labels = vec![
            ("node", node.to_string()),
            ("index", index.to_string()),
            ("model", gpu.model.to_string()),
        ];
        let usable_mib = gpu.memory_mib.saturating_sub(gpu.reserved_mib);
        jobs.get_or_create(&labels).set(f64::from(n));
        held.get_or_create(&labels).set(used_mib as f64 * 1048576.0);
        free.get_or_create(&labels)
            .set(usable_mib.saturating_sub(used_mib) as f64 * 1048576.0);
    }
}
