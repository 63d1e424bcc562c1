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

/// A GPU that has lagged behind its job's others for long enough.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Straggler {
    pub gpu: GpuKey,
    pub utilization_pct: u32,
    pub median_pct: u32,
    pub since: Timestamp,
}

/// The job's stragglers from this round's readings: `found` (from
/// `stragglers`) with each GPU's utilisation and the job's `median`.
pub fn described(found: Vec<(GpuKey, Timestamp)>, readings: &[(GpuKey, u32)], median: u32) -> Vec<Straggler> {
    found
        .into_iter()
        .map(|(gpu, since)| Straggler {
            utilization_pct: readings.iter().find(|(key, _)| *key == gpu).map_or(0, |(_, pct)| *pct),
            median_pct: median,
            since,
            gpu,
        })
        .collect()
}

/// The job's history events between its stragglers `before` and `now`:
/// each GPU newly flagged, and each back in step.
pub fn changes(before: &[Straggler], now: &[Straggler]) -> Vec<String> {
    let mut events = Vec::new();
    for straggler in now {
        if !before.iter().any(|old| old.gpu == straggler.gpu) {
            events.push(format!(
                "straggler: {} GPU {} at {}% while the job's median is {}%, since {}",
                straggler.gpu.node,
                straggler.gpu.index,
                straggler.utilization_pct,
                straggler.median_pct,
                straggler.since
            ));
        }
    }
    for old in before {
        if !now.iter().any(|straggler| straggler.gpu == old.gpu) {
            events.push(format!(
                "{} GPU {} is back in step with the job's others",
                old.gpu.node, old.gpu.index
            ));
        }
    }
    events
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

    #[test]
    fn each_gpu_flagged_and_each_back_in_step_is_one_event() {
        let readings = [(key("n1", 0), 90), (key("n2", 0), 30), (key("n2", 1), 20)];
        let first = described(vec![(key("n2", 0), Timestamp(0))], &readings, 90);
        assert_eq!(
            changes(&[], &first),
            vec!["straggler: n2 GPU 0 at 30% while the job's median is 90%, since 1970-01-01T00:00:00Z".to_string()]
        );
        // Still lagging: nothing new to say.
        assert!(changes(&first, &first).is_empty());
        let second = described(vec![(key("n2", 1), Timestamp(60_000))], &readings, 90);
        assert_eq!(
            changes(&first, &second),
            vec![
                "straggler: n2 GPU 1 at 20% while the job's median is 90%, since 1970-01-01T00:01:00Z".to_string(),
                "n2 GPU 0 is back in step with the job's others".to_string(),
            ]
        );
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
