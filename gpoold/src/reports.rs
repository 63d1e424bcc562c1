//! Accounting reports: the records of a window read from sled (never all
//! held in memory), running attempts up to now from the state, grouped and
//! priced by `gpool_core::accounting`.

use crate::error::Error;
use crate::state::store::Accounting;
use crate::state::SharedState;
use gpool_core::accounting::{self, AttemptRecord, Dimension, Report, ReportBuilder, Savings, SavingsRule};
use gpool_core::auth::{authorize, Action, Caller};
use gpool_core::model::GpuModel;
use gpool_core::Timestamp;
use std::collections::BTreeMap;

/// How often records past their retention are looked for.
const PRUNE_EVERY: std::time::Duration = std::time::Duration::from_secs(600);

#[derive(Clone)]
pub struct Reports {
    pub state: SharedState,
    pub records: Accounting,
}

impl Reports {
    /// `[since, until)` from a request: 0 means the start of the sharing
    /// period, and now.
    pub fn window(&self, since_ms: i64, until_ms: i64, now: Timestamp) -> Result<(Timestamp, Timestamp), Error> {
        let state = self.state.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        let sharing = &state.policy.sharing;
        let since = if since_ms == 0 {
            sharing.period.start(now, &sharing.time_zone)
        } else {
            Timestamp(since_ms)
        };
        let until = if until_ms == 0 { now } else { Timestamp(until_ms) };
        if until <= since {
            return Err(Error::InvalidRequest {
                field: "until",
                reason: format!("{until} is not after since ({since})"),
            });
        }
        Ok((since, until))
    }

    /// The records of `[since, until)` that `keep` takes: ended attempts
    /// from sled, running ones up to `now` from the state.
    pub(crate) async fn records(
        &self,
        since: Timestamp,
        until: Timestamp,
        now: Timestamp,
        keep: impl Fn(&AttemptRecord) -> bool + Send + Clone + 'static,
    ) -> Result<Vec<AttemptRecord>, Error> {
        let running: Vec<AttemptRecord> = {
            let state = self.state.read().unwrap_or_else(|poisoned| poisoned.into_inner());
            state.running_records(now)
        };
        let store = self.records.clone();
        let filter = keep.clone();
        let mut records = tokio::task::spawn_blocking(move || store.read(since, until, filter))
            .await
            .map_err(|err| Error::Storage(format!("reading accounting records: {err}")))??;
        records.extend(running.into_iter().filter(|record| keep(record)));
        Ok(records)
    }

    /// GPU-hours and cost by `by`, of the attempts `caller` may see.
    pub async fn report(
        &self,
        caller: &Caller,
        since: Timestamp,
        until: Timestamp,
        by: &[Dimension],
        now: Timestamp,
    ) -> Result<Report, Error> {
        let viewer = caller.clone();
        let records = self
            .records(since, until, now, move |record| accounting::may_see(&viewer, record))
            .await?;
        let pricing = self.pricing();
        let mut builder = ReportBuilder::new(since, until, by, &pricing);
        records.iter().for_each(|record| builder.add(record));
        Ok(builder.finish())
    }

    /// Dedicated GPUs per team against the pool's (admins only).
    pub async fn savings(
        &self,
        caller: &Caller,
        since: Timestamp,
        until: Timestamp,
        percentile: Option<f64>,
        now: Timestamp,
    ) -> Result<Savings, Error> {
        authorize(caller, &Action::ViewPoolSavings)?;
        if let Some(percentile) = percentile.filter(|p| !(*p > 0.0 && *p <= 100.0)) {
            return Err(Error::InvalidRequest {
                field: "percentile",
                reason: format!("{percentile} is not above 0 and at most 100"),
            });
        }
        let records = self.records(since, until, now, |_| true).await?;
        let (pool_gpus, rule) = {
            let state = self.state.read().unwrap_or_else(|poisoned| poisoned.into_inner());
            let mut gpus: BTreeMap<GpuModel, u32> = BTreeMap::new();
            for gpu in state.nodes.values().flat_map(|node| &node.gpus) {
                *gpus.entry(gpu.model.clone()).or_default() += 1;
            }
            let rule = SavingsRule {
                percentile: percentile.unwrap_or(state.accounting.savings.percentile),
            };
            (gpus, rule)
        };
        Ok(accounting::savings(
            &records,
            since,
            until,
            &pool_gpus,
            &self.pricing(),
            rule,
        ))
    }

    fn pricing(&self) -> accounting::Pricing {
        let state = self.state.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut pricing = state.accounting.pricing.clone();
        pricing.node_groups = state
            .power
            .nodes
            .iter()
            .map(|(node, power)| {
                let group = &state.power.groups[power.group];
                (node.clone(), (group.name.clone(), group.price_per_gpu_hour))
            })
            .collect();
        pricing
    }

    /// Removes records past the configured retention, now and every
    /// `PRUNE_EVERY`, until gpoold stops.
    pub async fn prune_periodically(self) {
        let mut ticks = tokio::time::interval(PRUNE_EVERY);
        loop {
            ticks.tick().await;
            let keep = {
                let state = self.state.read().unwrap_or_else(|poisoned| poisoned.into_inner());
                state.accounting.keep
            };
            let Some(keep) = keep else { continue };
            let before = Timestamp(crate::wall_clock().0 - keep.as_millis().min(i64::MAX as u128) as i64);
            let store = self.records.clone();
            match tokio::task::spawn_blocking(move || store.remove_ended_before(before)).await {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => tracing::info!(
                    "{n} accounting records of attempts that ended more than {} ago removed",
                    humantime::format_duration(keep)
                ),
                Ok(Err(err)) => tracing::warn!("removing old accounting records: {err}"),
                Err(err) => tracing::warn!("removing old accounting records: {err}"),
            }
        }
    }
}
