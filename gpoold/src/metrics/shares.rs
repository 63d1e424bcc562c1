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
    for ((node, index), shared) in state.gpu_shares() {
        let model = (state.nodes.get(node))
            .and_then(|known| known.gpus.iter().find(|gpu| gpu.index == index))
            .map_or_else(String::new, |gpu| gpu.model.to_string());
        let labels = vec![
            ("node", node.to_string()),
            ("index", index.to_string()),
            ("model", model),
        ];
        jobs.get_or_create(&labels).set(f64::from(shared.jobs));
        held.get_or_create(&labels).set(shared.used_mib as f64 * 1048576.0);
        free.get_or_create(&labels).set(shared.free_mib() as f64 * 1048576.0);
    }
}
