//! The scheduling loop: on every change that can free or need GPUs (debounced)
//! and on a timer, runs `gpool_core::sched::schedule` on a view of the state
//! and sends the Plan to the state task.

use crate::state::{Command, StateHandle};
use gpool_core::sched::schedule;
use gpool_core::Timestamp;
use std::time::Duration;

/// A cycle also runs this often when nothing happened (time-based policy).
const PERIOD: Duration = Duration::from_secs(5);
/// Changes arriving within this window share one cycle.
const DEBOUNCE: Duration = Duration::from_millis(2);

pub async fn run(handle: StateHandle, clock: fn() -> Timestamp) {
    loop {
        let _ = tokio::time::timeout(PERIOD, handle.sched_wakeup.notified()).await;
        tokio::time::sleep(DEBOUNCE).await;
        let (view, policy) = {
            let state = handle.shared.read().unwrap_or_else(|poisoned| poisoned.into_inner());
            (state.cluster_view(), state.policy.clone())
        };
        let plan = tokio::task::block_in_place(|| schedule(&view, &policy, clock()));
        if handle.commands.send(Command::Planned(plan)).await.is_err() {
            return;
        }
    }
}
