//! `gpool sim --cloud`: a group of cloud nodes beside the cluster, asleep
//! until jobs wait for them, replayed once per `--suspend-after` and
//! `--cloud-budget` pair beside the `gpool` policy without it, and the
//! table of what each costs against the waits it buys down.

use super::{SimArgs, Timing};
use crate::output;
use crate::CliError;
use gpool_core::model::GpuModel;
use gpool_core::power::Group;
use gpool_core::sim::{self, Outcome};

/// The gpool policy without the group, then with it at each sweep point.
pub(super) fn setups(
    args: &SimArgs,
    spec: &str,
    gpool: sim::Setup,
    prices: &std::collections::BTreeMap<GpuModel, f64>,
) -> Result<Vec<sim::Setup>, CliError> {
    let (model, gpus) = spec
        .split_once(':')
        .and_then(|(model, gpus)| Some((GpuModel::new(model), gpus.parse::<u32>().ok().filter(|n| *n > 0)?)))
        .ok_or_else(|| CliError::Usage(format!("--cloud {spec:?}: give MODEL:GPUS, e.g. h100:8")))?;
    if args.cloud_nodes == 0 || args.cloud_budget.is_empty() || args.suspend_after.is_empty() {
        return Err(CliError::Usage(
            "--cloud: --cloud-nodes, --cloud-budget and --suspend-after need at least one".into(),
        ));
    }
    if let Some(price) = args.cloud_price.filter(|price| !(*price >= 0.0 && price.is_finite())) {
        return Err(CliError::Usage(format!("--cloud-price {price}: not a price")));
    }
    if args.cloud_budget.contains(&0) {
        return Err(CliError::Usage("--cloud-budget: each budget is at least 1 node".into()));
    }
    let price = args.cloud_price.or_else(|| prices.get(&model).copied()).unwrap_or(0.0);
    let mut setups = vec![sim::Setup {
        name: "no cloud".into(),
        ..gpool.clone()
    }];
    for after in &args.suspend_after {
        let suspend_after_secs = match after.as_str() {
            "never" => None,
            text => Some(
                gpool_core::spec::parse_duration(text)
                    .map_err(|reason| CliError::Usage(format!("--suspend-after {text:?}: {reason}")))?,
            ),
        };
        for budget in &args.cloud_budget {
            let nodes = (1..=args.cloud_nodes).map(|i| format!("cloud-{i:03}")).collect();
            let group = Group {
                suspend_after_secs,
                max_nodes: Some(*budget),
                ..Group::new("cloud", nodes, model.clone(), gpus, price)
            };
            let mut setup = sim::with_power(gpool.clone(), group, args.resume_delay.as_secs());
            setup.name = format!("{after}/{budget}");
            setups.push(setup);
        }
    }
    Ok(setups)
}

/// One row per replay: its sweep point, what the group cost and saved,
/// and the waits.
pub(super) fn print_table(results: &[(Outcome, Timing)], currency: &str) {
    outln!("\ncloud nodes: cost against waits (suspend_after/budget: most nodes up at once)");
    let rows = results
        .iter()
        .map(|(outcome, _)| {
            let power = outcome.power.clone().unwrap_or_default();
            vec![
                outcome.policy.clone(),
                format!("{:.0}", power.powered_gpu_hours),
                format!("{:.0} {currency}", power.cost),
                format!("{:.0}", power.saved_gpu_hours),
                power.resumes.to_string(),
                super::tables::human(outcome.queue_delay.mean),
                super::tables::human(outcome.queue_delay.median),
                super::tables::human(outcome.queue_delay.p95),
            ]
        })
        .collect();
    output::print_table(
        &[
            "SETUP",
            "CLOUD GPU-H",
            "COST",
            "SLEPT GPU-H",
            "RESUMES",
            "MEAN WAIT",
            "MEDIAN WAIT",
            "P95 WAIT",
        ],
        rows,
    );
}
