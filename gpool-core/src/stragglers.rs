//! Stragglers: in a job on several GPUs, a GPU whose utilisation stays far
//! below that of the job's other GPUs (a slow card, a throttled node, a
//! rank stuck waiting) holds the whole job back. Pure: readings and time
//! come in, the GPUs that lag come out.

use crate::ids::Timestamp;
use std::collections::BTreeMap;

/// A GPU lags when its utilisation is below this share of the job's median.
pub const LAG_RATIO: f64 = 0.5;
/// ...and that median is at least this (a job that waits on all its GPUs
/// alike has no straggler).
pub const MIN_MEDIAN_PCT: u32 = 20;

/// One GPU of a job: its node and node-local index.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GpuKey {
    pub node: String,
    pub index: u32,
}

/// The median of the job's GPUs' latest utilisation, and the GPUs below
/// `LAG_RATIO` of it; none for a job with fewer than two readings.
pub fn lagging(readings: &[(GpuKey, u32)]) -> (u32, Vec<GpuKey>) {
    if readings.len() < 2 {
        return (0, Vec::new());
    }
    let mut values: Vec<u32> = readings.iter().map(|(_, pct)| *pct).collect();
    values.sort_unstable();
    let median = values[values.len() / 2];
    if median < MIN_MEDIAN_PCT {
        return (median, Vec::new());
    }
    let below = readings
        .iter()
        .filter(|(_, pct)| f64::from(*pct) < f64::from(median) * LAG_RATIO)
        .map(|(key, _)| key.clone())
        .collect();
    (median, below)
}

/// Keeps `since` (when each GPU began to lag without a break) in step with
/// the GPUs that lag `now`, and returns those that have lagged for at least
/// `after_ms`, with when they began.
pub fn stragglers(
    since: &mut BTreeMap<GpuKey, Timestamp>,
    lagging_now: &[GpuKey],
    now: Timestamp,
    after_ms: i64,
) -> Vec<(GpuKey, Timestamp)> {
    since.retain(|key, _| lagging_now.contains(key));
    for key in lagging_now {
        since.entry(key.clone()).or_insert(now);
    }
    since
        .iter()
        .filter(|(_, began)| now.0 - began.0 >= after_ms)
        .map(|(key, began)| (key.clone(), *began))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(node: &str, index: u32) -> GpuKey {
        GpuKey {
            node: node.into(),
            index,
        }
    }

    #[test]
    fn a_gpu_far_below_the_median_lags() {
        let readings = [
            (key("n1", 0), 90),
            (key("n1", 1), 88),
            (key("n2", 0), 30),
            (key("n2", 1), 92),
        ];
        assert_eq!(lagging(&readings), (90, vec![key("n2", 0)]));
        // A job idle on every GPU has no straggler; one GPU alone neither.
        assert_eq!(lagging(&[(key("n1", 0), 5), (key("n1", 1), 0)]).1, Vec::<GpuKey>::new());
        assert_eq!(lagging(&[(key("n1", 0), 0)]).1, Vec::<GpuKey>::new());
    }

    #[test]
    fn a_straggler_is_one_that_lags_without_a_break_for_long_enough() {
        let mut since = BTreeMap::new();
        let slow = vec![key("n2", 0)];
        assert!(stragglers(&mut since, &slow, Timestamp(0), 60_000).is_empty());
        assert!(stragglers(&mut since, &slow, Timestamp(59_999), 60_000).is_empty());
        assert_eq!(
            stragglers(&mut since, &slow, Timestamp(60_000), 60_000),
            vec![(key("n2", 0), Timestamp(0))]
        );
        // A break starts the count again.
        assert!(stragglers(&mut since, &[], Timestamp(61_000), 60_000).is_empty());
        assert!(stragglers(&mut since, &slow, Timestamp(62_000), 60_000).is_empty());
    }

    proptest! {
        #[test]
        fn the_median_gpu_never_lags(values in proptest::collection::vec(0u32..=100, 2..16)) {
            let readings: Vec<(GpuKey, u32)> = values.iter().enumerate().map(|(i, v)| (key("n", i as u32), *v)).collect();
            let (median, below) = lagging(&readings);
            prop_assert!(below.len() < readings.len());
            for key in &below {
                let pct = readings.iter().find(|(k, _)| k == key).unwrap().1;
                prop_assert!(f64::from(pct) < f64::from(median) * LAG_RATIO);
            }
        }
    }
}
