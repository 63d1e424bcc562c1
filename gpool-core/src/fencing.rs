//! The fencing rule (ARCHITECTURE.md): how long a node may run requeueable
//! attempts without hearing from gpoold, and the grace it gives them.

/// What a node is granted with each answered heartbeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTerms {
    /// From the heartbeat's sending: how long requeueable attempts may run.
    pub fence_after_ms: u32,
    /// The most an attempt then gets to end after its checkpoint signal.
    pub grace_ms: u32,
}

/// Half the node timeout to run, a quarter to end: the last quarter is the
/// margin before gpoold gives the node up and requeues its jobs.
pub fn lease_terms(node_timeout_ms: i64) -> LeaseTerms {
    let part = |divisor: i64| (node_timeout_ms / divisor).clamp(0, i64::from(u32::MAX)) as u32;
    LeaseTerms {
        fence_after_ms: part(2),
        grace_ms: part(4),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stopped_before_the_node_is_given_up_with_a_quarter_to_spare() {
        for timeout_ms in [4_000, 6_000, 30_000, 3_600_000] {
            let terms = lease_terms(timeout_ms);
            let killed_by = i64::from(terms.fence_after_ms) + i64::from(terms.grace_ms);
            assert!(killed_by + timeout_ms / 4 <= timeout_ms, "{timeout_ms}: {terms:?}");
            assert!(timeout_ms - killed_by >= 1_000, "at least a second of margin");
        }
    }
}
