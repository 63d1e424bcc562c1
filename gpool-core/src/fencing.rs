//! The fencing rule (ARCHITECTURE.md): how long a node may run requeueable
//! attempts without hearing from gpoold, and the grace it gives them.

use std::time::Duration;

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

/// What a failover may take beyond the dead leader's etcd lease, each part
/// an allowance: a standby reads etcd every half second and campaigns
/// (`FAILOVER_ELECTION`), opens and loads the state dir
/// (`FAILOVER_LOAD`), and each agent redials at most `AGENT_MAX_REDIAL`
/// after its previous try.
pub const FAILOVER_ELECTION: Duration = Duration::from_secs(1);
pub const FAILOVER_LOAD: Duration = Duration::from_secs(2);
pub const AGENT_MAX_REDIAL: Duration = Duration::from_secs(2);

/// The longest a failover may take, from a leader's death to its agents
/// registered with the new leader: its lease of `lease_ttl` runs out at
/// most that long after its last renewal, then the allowances above.
pub fn longest_failover(lease_ttl: Duration) -> Duration {
    lease_ttl + FAILOVER_ELECTION + FAILOVER_LOAD + AGENT_MAX_REDIAL
}

/// The shortest node timeout under which a node's attempts outlive a
/// failover of a leader with `lease_ttl`, in whole seconds. A node may run
/// its attempts half the node timeout from the sending of its last
/// answered heartbeat, and heartbeats go at least every quarter of that:
/// at a leader's death its attempts have three eighths of the node timeout
/// left at least, which must exceed the longest failover.
pub fn least_node_timeout(lease_ttl: Duration) -> Duration {
    let needed_ms = longest_failover(lease_ttl).as_millis() as u64 * 8 / 3;
    Duration::from_secs(needed_ms / 1000 + 1)
}

/// The rule between `node_timeout` and `[ha]`'s `lease_ttl`: a failover
/// never fences a running job, and the node still stops its attempts
/// before any leader gives it up (the new leader counts the node timeout
/// from its own start, after the death). Refuses, naming both fields,
/// where the node timeout is too short.
pub fn check_failover(node_timeout: Duration, lease_ttl: Duration) -> Result<(), String> {
    let least = least_node_timeout(lease_ttl);
    if node_timeout >= least {
        return Ok(());
    }
    Err(format!(
        "node_timeout = \"{}s\" is too short for ha.lease_ttl = \"{}s\": a node keeps its jobs for half the node \
         timeout without a controller, and a failover may take {}s (the lease, then election, load and the agents' \
         redial); set node_timeout to at least \"{}s\" (or leave it out), or shorten ha.lease_ttl",
        node_timeout.as_secs_f64(),
        lease_ttl.as_secs(),
        longest_failover(lease_ttl).as_secs(),
        least.as_secs()
    ))
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
pub fn leader_lease_terms(ttl: Duration) -> (Duration, Duration) {
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
        let ttl = Duration::from_secs(15);
        let (renew_every, stop_after) = leader_lease_terms(ttl);
        assert_eq!(renew_every, Duration::from_secs(5));
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

    #[test]
    fn a_nodes_jobs_outlive_the_longest_failover_and_stop_before_a_new_leader_gives_it_up() {
        for ttl_secs in [2, 3, 15, 60, 3600] {
            let ttl = Duration::from_secs(ttl_secs);
            let least = least_node_timeout(ttl);
            assert!(check_failover(least, ttl).is_ok(), "{ttl:?}");
            assert!(check_failover(least - Duration::from_secs(1), ttl).is_err(), "{ttl:?}");
            let terms = lease_terms(least.as_millis() as i64);
            // The last answered heartbeat went at most a quarter lease
            // before the death: what is left of the lease then.
            let left_at_death = i64::from(terms.fence_after_ms) * 3 / 4;
            assert!(
                left_at_death > longest_failover(ttl).as_millis() as i64,
                "{ttl:?}: {terms:?}"
            );
            // The new leader starts after the death and gives the node up
            // a node timeout after its start: the attempts are gone by then.
            let gone_by = i64::from(terms.fence_after_ms) + i64::from(terms.grace_ms);
            assert!(gone_by < least.as_millis() as i64, "{ttl:?}");
        }
        // The shipped defaults: a 15 s lease takes 54 s of node timeout,
        // and 30 s is refused with both fields named.
        assert_eq!(least_node_timeout(Duration::from_secs(15)), Duration::from_secs(54));
        let refused = check_failover(Duration::from_secs(30), Duration::from_secs(15)).unwrap_err();
        assert!(
            refused.contains("node_timeout = \"30s\"")
                && refused.contains("ha.lease_ttl = \"15s\"")
                && refused.contains("\"54s\""),
            "{refused}"
        );
    }
}
