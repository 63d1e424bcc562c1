//! The ends the node's launcher announces: after it records an attempt's
//! end it says so on its stdout, and the agent's watch on that attempt
//! wakes without polling. A watch that comes after the notice finds it
//! here; one whose launcher is gone is woken to look for itself.

use super::Launcher;
use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

/// Ends announced and watches waiting for one.
#[derive(Default)]
pub struct EndNotices {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    slots: HashMap<(u64, u64), Slot>,
    /// Launchers whose stdout closed: no notice comes from them.
    gone: HashSet<i32>,
}

enum Slot {
    Waiting(i32, tokio::sync::oneshot::Sender<()>),
    Ended,
}

/// Ends announced with no watch yet are kept up to this many.
const UNCLAIMED: usize = 65_536;

impl EndNotices {
    /// The launcher recorded the end of attempt `epoch` of `job_id`.
    pub fn ended(&self, job_id: u64, epoch: u64) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match inner.slots.remove(&(job_id, epoch)) {
            Some(Slot::Waiting(_, wake)) => {
                let _ = wake.send(());
            }
            _ if inner.slots.len() < UNCLAIMED => {
                inner.slots.insert((job_id, epoch), Slot::Ended);
            }
            _ => {}
        }
    }

    /// The launcher `pid` is gone: its watches look for themselves.
    pub fn launcher_gone(&self, pid: i32) {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.gone.insert(pid);
        inner
            .slots
            .retain(|_, slot| !matches!(slot, Slot::Waiting(by, _) if *by == pid));
    }

    /// What to wait on for the end of attempt `epoch` of `job_id`, which
    /// `launcher` forked; `None` when it has come already or never will.
    pub fn wait(&self, job_id: u64, epoch: u64, launcher: Launcher) -> Option<tokio::sync::oneshot::Receiver<()>> {
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if inner.gone.contains(&launcher.pid) {
            return None;
        }
        if let Some(Slot::Ended) = inner.slots.remove(&(job_id, epoch)) {
            return None;
        }
        let (wake, woken) = tokio::sync::oneshot::channel();
        inner.slots.insert((job_id, epoch), Slot::Waiting(launcher.pid, wake));
        Some(woken)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BY: Launcher = Launcher { pid: 7, keeper: 6 };

    #[tokio::test]
    async fn a_notice_wakes_its_watch_before_or_after_it_waits() {
        let notices = EndNotices::default();
        let woken = notices.wait(1, 1, BY).expect("nothing came yet");
        notices.ended(1, 1);
        woken.await.expect("woken by the notice");
        notices.ended(2, 1);
        assert!(notices.wait(2, 1, BY).is_none(), "it came first");
        assert!(notices.wait(2, 1, BY).is_some(), "and is taken once");
    }

    #[tokio::test]
    async fn a_gone_launcher_wakes_its_watches_and_takes_no_new_ones() {
        let notices = EndNotices::default();
        let woken = notices.wait(1, 1, BY).unwrap();
        notices.launcher_gone(BY.pid);
        assert!(woken.await.is_err(), "woken without a notice");
        assert!(notices.wait(3, 1, BY).is_none());
        let other = Launcher { pid: 9, keeper: 8 };
        assert!(notices.wait(3, 1, other).is_some());
    }
}
