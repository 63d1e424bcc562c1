//! Identifiers and the timestamp type shared by every part of gpool.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The most job ids one request (cancel, hold, update, wait...) may name:
/// the CLI sends longer lists in several requests.
pub const MAX_IDS_PER_REQUEST: usize = 10_000;

/// A job's id: assigned by gpoold in submit order; an acknowledged id is
/// never reused.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct JobId(pub u64);

/// Fences one launch of a job: every attempt gets a fresh, cluster-wide epoch,
/// and an event carrying another epoch than the job's current one is stale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Epoch(pub u64);

/// Milliseconds since the Unix epoch. gpool-core never reads a clock: callers
/// pass `now` in.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Timestamp(pub i64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl Timestamp {
    pub fn millis_since(self, earlier: Timestamp) -> i64 {
        self.0 - earlier.0
    }
}

impl fmt::Display for Timestamp {
    /// RFC 3339 in UTC, to the second.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match jiff::Timestamp::from_second(self.0.div_euclid(1000)) {
            Ok(at) => write!(f, "{at}"),
            Err(_) => write!(f, "{} ms after 1970", self.0),
        }
    }
}
