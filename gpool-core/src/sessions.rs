//! Interactive jobs end with their client, as salloc's allocation ends with
//! salloc: what to do about one whose client has been silent.

use std::time::Duration;

/// From the hangup to the cancel of a job that ran on.
pub const HANGUP_GRACE: Duration = Duration::from_secs(10);

/// What is due to an interactive job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detached {
    /// Its client is silent past the grace: SIGHUP, as a dropped terminal.
    HangUp,
    /// It ran on `HANGUP_GRACE` past its hangup, with no client back.
    End,
}

/// For a job whose client last spoke `silent_for` ago, hung up on
/// `hung_for` ago (if it was), with the pool's `grace`.
pub fn detached(silent_for: Duration, hung_for: Option<Duration>, grace: Duration) -> Option<Detached> {
    match hung_for {
        // A client that spoke since the hangup is back.
        Some(hung_for) if hung_for >= HANGUP_GRACE && silent_for > hung_for => Some(Detached::End),
        Some(_) => None,
        None if silent_for >= grace => Some(Detached::HangUp),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_detached_job_is_hung_up_on_then_ended_unless_its_client_returns() {
        let secs = Duration::from_secs;
        let grace = secs(60);
        assert_eq!(detached(secs(59), None, grace), None);
        assert_eq!(detached(secs(60), None, grace), Some(Detached::HangUp));
        assert_eq!(
            detached(secs(65), Some(secs(5)), grace),
            None,
            "its grace after the hangup"
        );
        assert_eq!(detached(secs(70), Some(secs(10)), grace), Some(Detached::End));
        assert_eq!(detached(secs(4), Some(secs(10)), grace), None, "a client came back");
    }
}
