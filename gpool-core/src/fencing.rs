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

/// Whether an agent that registers as a node may take the node's link
/// over. Yes where no link is live (`silent_ms`: how long the link gpoold
/// has has been silent, `None` for none) past what its lease and grace let
/// its attempts run, or where the same boot registers again (its agent
/// restarted). No where an agent of another boot (another host) still
/// holds it: two agents share the node name, and taking the node from the
/// one that runs its attempts would run them twice.
pub fn may_take_over(
    silent_ms: Option<i64>,
    held_by_boot: &str,
    boot: &str,
    node_timeout_ms: i64,
) -> Result<(), String> {
    let terms = lease_terms(node_timeout_ms);
    let runs_for_ms = i64::from(terms.fence_after_ms) + i64::from(terms.grace_ms);
    match silent_ms {
        Some(silent) if silent < runs_for_ms && !held_by_boot.is_empty() && held_by_boot != boot => Err(format!(
            "the node is held by an agent of another boot ({held_by_boot}, heard from {}s ago), not this one ({boot}): \
             do two hosts share this node_name? this agent may register once that one has been silent for {}s",
            silent / 1000,
            runs_for_ms / 1000
        )),
        _ => Ok(()),
    }
}

/// A leader's lease of `ttl` (`[ha]`): how often it renews, and how long
/// without a confirmed renewal (counted from when the renewal was sent)
/// before it must stop acting. Two thirds: it is silent before the lease
/// can run out and another controller be elected.
pub fn leader_lease_terms(ttl: std::time::Duration) -> (std::time::Duration, std::time::Duration) {
    (ttl / 3, ttl * 2 / 3)
}

/// Whether an agent obeys a message of controller term `term`, having seen
/// `highest` so far: the highest term it knows after this message, or why
/// it refuses. Term 0 is a controller without `[ha]`, which has no terms.
/// A lower term than one already seen is a deposed leader's: it may still
/// think it leads, and obeying it could run a job twice.
pub fn admit_term(highest: u64, term: u64) -> Result<u64, String> {
    match term {
        0 => Ok(highest),
        _ if term < highest => Err(format!(
            "refused a message of controller term {term}: the leader of term {highest} took over from it"
        )),
        _ => Ok(term),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_stops_before_its_lease_can_run_out() {
        let ttl = std::time::Duration::from_secs(15);
        let (renew_every, stop_after) = leader_lease_terms(ttl);
        assert_eq!(renew_every, std::time::Duration::from_secs(5));
        assert!(renew_every < stop_after && stop_after < ttl);
    }

    #[test]
    fn a_deposed_leaders_term_is_refused() {
        assert_eq!(admit_term(0, 0), Ok(0), "no [ha]: no terms");
        assert_eq!(admit_term(0, 7), Ok(7));
        assert_eq!(admit_term(7, 7), Ok(7));
        assert_eq!(admit_term(7, 12), Ok(12), "a newer leader");
        let refused = admit_term(12, 7).unwrap_err();
        assert!(refused.contains("term 7") && refused.contains("term 12"), "{refused}");
    }

    #[test]
    fn an_agent_of_another_boot_may_not_take_a_live_node_over() {
        let timeout = 30_000;
        assert!(may_take_over(None, "boot-a", "boot-b", timeout).is_ok(), "no link");
        assert!(
            may_take_over(Some(1_000), "boot-a", "boot-a", timeout).is_ok(),
            "the agent restarted"
        );
        let err = may_take_over(Some(1_000), "boot-a", "boot-b", timeout).unwrap_err();
        assert!(err.contains("do two hosts share this node_name?"), "{err}");
        // Past the lease and its grace (15 s + 7.5 s) the other agent has
        // stopped its attempts: a node that rebooted takes its name back.
        assert!(may_take_over(Some(22_500), "boot-a", "boot-b", timeout).is_ok());
        assert!(may_take_over(Some(22_499), "boot-a", "boot-b", timeout).is_err());
        assert!(
            may_take_over(Some(1_000), "", "boot-b", timeout).is_ok(),
            "an agent that gave no boot id"
        );
    }

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
