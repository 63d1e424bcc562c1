//! The policy's tables of gpoold.toml, each checked: `[[pool]]`,
//! `[[reservation]]`, `[accounting]`, and `[sharing]` with its `[[team]]`s
//! and `[[qos]]`.

use super::*;

/// One `[[reservation]]`, checked: a name, nodes, and a window that ends
/// after it starts.
pub(super) fn reservation_from_file(
    spanned: toml::Spanned<ReservationFile>,
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<gpool_core::sched::reservations::Reservation, ConfigError> {
    let at = spanned.span().start;
    let file = spanned.into_inner();
    let definition = gpool_core::sched::reservations::Definition {
        name: file.name,
        nodes: file.nodes,
        start: file.start,
        duration: file.duration,
        end: file.end,
        users: file.users,
        teams: file.teams,
        gpus: 0,
    };
    // Times in gpoold.toml are dates, never relative to a moment.
    gpool_core::sched::reservations::Reservation::define(definition, None)
        .map_err(|(field, reason)| invalid(at, format!("reservation.{field}: {reason}")))
}

/// The `[accounting]` table, checked: prices are finite and not negative,
/// a team or project has one cost centre.
pub(super) fn accounting_from_file(
    file: toml::Spanned<AccountingFile>,
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<Accounting, ConfigError> {
    let at = file.span().start;
    let file = file.into_inner();
    let mut accounting = Accounting::default();
    if let Some(keep) = file.keep {
        accounting.keep = match keep.get_ref().as_str() {
            "forever" => None,
            text => Some(
                humantime::parse_duration(text)
                    .ok()
                    .filter(|age| *age >= Duration::from_secs(1))
                    .ok_or_else(|| {
                        invalid(
                            keep.span().start,
                            format!("accounting.keep: {text:?} is not \"forever\" or a duration such as 400d"),
                        )
                    })?,
            ),
        };
    }
    if let Some(currency) = file.currency {
        accounting.pricing.currency = currency;
    }
    if let Some(percentile) = file.savings_percentile {
        if !(percentile > 0.0 && percentile <= 100.0) {
            return Err(invalid(
                at,
                format!("accounting.savings_percentile: {percentile} is not above 0 and at most 100"),
            ));
        }
        accounting.savings.percentile = percentile;
    }
    for (model, price) in file.prices {
        if !price.is_finite() || price < 0.0 {
            return Err(invalid(
                at,
                format!("accounting.prices.{model}: {price} is not a price (a number, 0 or more, per GPU-hour)"),
            ));
        }
        accounting.pricing.per_gpu_hour.insert(GpuModel::new(&model), price);
    }
    for (center, members) in file.cost_centers {
        for (kind, names, map) in [
            ("teams", members.teams, &mut accounting.pricing.team_centers),
            ("projects", members.projects, &mut accounting.pricing.project_centers),
        ] {
            for name in names {
                if let Some(other) = map.insert(name.clone(), center.clone()) {
                    return Err(invalid(
                        at,
                        format!("accounting.cost_centers.{center}.{kind}: {name:?} is in cost centre {other:?} too"),
                    ));
                }
            }
        }
    }
    Ok(accounting)
}

/// The `[sharing]`, `[[team]]` and `[[qos]]` tables as the scheduler's
/// `Sharing`; `invalid(offset, message)` makes an error at a line.
pub(super) fn sharing_from_file(
    file: Option<toml::Spanned<SharingFile>>,
    teams: Vec<toml::Spanned<TeamFile>>,
    qos: Vec<toml::Spanned<QosFile>>,
    policy_pools: &[String],
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<Sharing, ConfigError> {
    let mut sharing = Sharing::default();
    if let Some(spanned) = file {
        sharing_table(&mut sharing, spanned, invalid)?;
    }
    let mut seen = std::collections::HashSet::new();
    for spanned in teams {
        let team = team_from_file(spanned, &mut seen, policy_pools, invalid)?;
        sharing.teams.push(team);
    }
    if !qos.is_empty() {
        sharing.qos.clear();
    }
    for spanned in qos {
        let class = qos_from_file(spanned, &sharing.qos, policy_pools, invalid)?;
        sharing.qos.push(class);
    }
    if sharing.qos(&sharing.default_qos).is_none() {
        return Err(invalid(
            0,
            format!("sharing.default_qos: no [[qos]] is named {:?}", sharing.default_qos),
        ));
    }
    Ok(sharing)
}

/// Whether a team's or QoS's name is 1 to 64 letters, digits, '.', '_' and '-'.
fn name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

/// An optional duration in seconds; a bad one is an error naming `field` at `offset`.
fn optional_duration(
    offset: usize,
    field: &str,
    text: &Option<String>,
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<Option<u64>, ConfigError> {
    match text {
        None => Ok(None),
        Some(text) => parse_duration(text)
            .map(Some)
            .map_err(|reason| invalid(offset, format!("{field}: {reason}"))),
    }
}

/// The `[sharing]` table into `sharing`, field by field: period, time zone,
/// half-life, waste cap, grace, user priority, default QoS, limits, weights.
fn sharing_table(
    sharing: &mut Sharing,
    spanned: toml::Spanned<SharingFile>,
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<(), ConfigError> {
    let at = spanned.span().start;
    let file = spanned.into_inner();
    if let Some(period) = &file.period {
        sharing.period = match period.as_str() {
            "day" => Period::Day,
            "week" => Period::Week,
            "month" => Period::Month,
            other => {
                return Err(invalid(
                    at,
                    format!("sharing.period: {other:?} is not day, week or month"),
                ))
            }
        };
    }
    if let Some(zone) = &file.time_zone {
        sharing.time_zone =
            jiff::tz::TimeZone::get(zone).map_err(|err| invalid(at, format!("sharing.time_zone: {zone:?}: {err}")))?;
    }
    if let Some(half_life) = optional_duration(at, "sharing.half_life", &file.half_life, invalid)? {
        sharing.half_life_secs = half_life as f64;
    }
    if let Some(cap) = file.waste_cap_gpu_hours_per_hour {
        if cap.is_nan() || cap < 0.0 {
            return Err(invalid(
                at,
                format!("sharing.waste_cap_gpu_hours_per_hour: {cap} is not zero or more"),
            ));
        }
        sharing.waste_cap_gpu_hours_per_hour = cap;
    }
    if let Some(max_grace) = optional_duration(at, "sharing.max_grace", &file.max_grace, invalid)? {
        sharing.max_grace_secs = max_grace;
    }
    if let Some(max_user_priority) = file.max_user_priority {
        if max_user_priority < 0 {
            return Err(invalid(
                at,
                format!("sharing.max_user_priority: {max_user_priority} is not zero or more"),
            ));
        }
        sharing.max_user_priority = max_user_priority;
    }
    if let Some(default_qos) = file.default_qos {
        sharing.default_qos = default_qos;
    }
    sharing.user_limits = UserLimits {
        max_jobs: file.max_jobs_per_user,
        max_gpus: file.max_gpus_per_user,
        max_submit: file.max_submit_per_user,
    };
    if let Some(weights) = file.weights {
        sharing.weights = weights_from_file(at, weights, sharing.weights, invalid)?;
    }
    sharing.las = las_from_file(at, file.order.as_deref(), file.las, sharing.las.take(), invalid)?;
    if let Some(grain) = &file.gpu_share_granularity {
        let bytes = gpool_core::spec::parse_size(grain)
            .map_err(|reason| invalid(at, format!("sharing.gpu_share_granularity: {reason}")))?;
        sharing.shares.granularity_mib = bytes >> 20;
    }
    if let Some(mixed) = file.gpu_share_mixed_users {
        sharing.shares.mixed_users = mixed;
    }
    Ok(())
}

/// `order` and `[sharing.las]`: LAS order within teams (tuned by the
/// table, unset fields from `defaults` or `Las::default`), or `None`
/// where `order = "priority"`.
fn las_from_file(
    at: usize,
    order: Option<&str>,
    table: Option<LasFile>,
    defaults: Option<gpool_core::sched::Las>,
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<Option<gpool_core::sched::Las>, ConfigError> {
    match (order, &table) {
        (Some("priority"), Some(_)) => {
            return Err(invalid(
                at,
                "sharing.las: set, but sharing.order is \"priority\" (LAS order is off)".into(),
            ))
        }
        (Some("priority"), None) => return Ok(None),
        (Some("las") | None, _) => {}
        (Some(other), _) => {
            return Err(invalid(
                at,
                format!("sharing.order: {other:?} is not \"las\" or \"priority\""),
            ))
        }
    }
    let mut las = defaults.unwrap_or_default();
    let Some(table) = table else {
        return Ok(Some(las));
    };
    if let Some(hours) = table.thresholds_gpu_hours {
        if hours.iter().any(|h| h.is_nan() || *h <= 0.0) || hours.windows(2).any(|pair| pair[0] >= pair[1]) {
            return Err(invalid(
                at,
                format!("sharing.las.thresholds_gpu_hours: {hours:?} are not ascending GPU-hours above 0"),
            ));
        }
        las.thresholds_gpu_secs = hours.iter().map(|h| (h * 3600.0).round() as u64).collect();
    }
    if let Some(factor) = table.promote_factor {
        if factor.is_nan() || factor < 0.0 {
            return Err(invalid(
                at,
                format!("sharing.las.promote_factor: {factor} is not zero or more"),
            ));
        }
        las.promote_factor = factor;
    }
    if let Some(max_lost) = optional_duration(at, "sharing.las.max_lost", &table.max_lost, invalid)? {
        las.max_lost_secs = max_lost;
    }
    Ok(Some(las))
}

/// `[sharing.weights]`: each weight zero or more, unset ones from `defaults`.
fn weights_from_file(
    at: usize,
    weights: WeightsFile,
    defaults: Weights,
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<Weights, ConfigError> {
    let weight = |field: &str, value: Option<f64>, default: f64| -> Result<f64, ConfigError> {
        match value {
            Some(value) if value.is_nan() || value < 0.0 => Err(invalid(
                at,
                format!("sharing.weights.{field}: {value} is not zero or more"),
            )),
            Some(value) => Ok(value),
            None => Ok(default),
        }
    };
    Ok(Weights {
        qos: weight("qos", weights.qos, defaults.qos)?,
        fair_share: weight("fair_share", weights.fair_share, defaults.fair_share)?,
        age: weight("age", weights.age, defaults.age)?,
        size: weight("size", weights.size, defaults.size)?,
        max_age_secs: optional_duration(at, "sharing.weights.max_age", &weights.max_age, invalid)?
            .unwrap_or(defaults.max_age_secs),
    })
}

/// One `[[team]]`, checked: a new, well-formed name, at least 1 share, and
/// a cap no lower than its guarantee.
fn team_from_file(
    spanned: toml::Spanned<TeamFile>,
    seen: &mut std::collections::HashSet<String>,
    policy_pools: &[String],
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<Team, ConfigError> {
    let at = spanned.span().start;
    let team = spanned.into_inner();
    if !name_ok(&team.name) || !seen.insert(team.name.clone()) {
        return Err(invalid(
            at,
            format!(
                "team.name: {:?} is repeated or not letters, digits, '.', '_' and '-'",
                team.name
            ),
        ));
    }
    if team.shares == 0 {
        return Err(invalid(
            at,
            format!("team.shares: team {} needs at least 1 share", team.name),
        ));
    }
    if let Some(max_gpus) = team.max_gpus.filter(|max| *max < team.guaranteed_gpus) {
        return Err(invalid(
            at,
            format!(
                "team.max_gpus: team {} caps at {max_gpus} GPUs, below its {} guaranteed",
                team.name, team.guaranteed_gpus
            ),
        ));
    }
    Ok(Team {
        name: team.name,
        shares: team.shares,
        guaranteed_gpus: team.guaranteed_gpus,
        guaranteed_in: team
            .guaranteed_in
            .into_iter()
            .map(|(key, gpus)| {
                // A pool name as written; anything else is a GPU model.
                let pool = policy_pools.contains(&key);
                (
                    if pool {
                        key
                    } else {
                        GpuModel::new(&key).as_str().to_string()
                    },
                    gpus,
                )
            })
            .collect(),
        gpu_hours: team.gpu_hours,
        max_gpus: team.max_gpus,
        members: team.members,
        leads: team.leads,
        user_limits: UserLimits {
            max_jobs: team.max_jobs_per_user,
            max_gpus: team.max_gpus_per_user,
            max_submit: team.max_submit_per_user,
        },
    })
}

/// One `[[qos]]`, checked: a well-formed name not among `earlier`, its
/// durations (max time, min runtime, grace), and pools its reserve names.
fn qos_from_file(
    spanned: toml::Spanned<QosFile>,
    earlier: &[Qos],
    policy_pools: &[String],
    invalid: &dyn Fn(usize, String) -> ConfigError,
) -> Result<Qos, ConfigError> {
    let at = spanned.span().start;
    let class = spanned.into_inner();
    if !name_ok(&class.name) || earlier.iter().any(|q| q.name == class.name) {
        return Err(invalid(
            at,
            format!(
                "qos.name: {:?} is repeated or not letters, digits, '.', '_' and '-'",
                class.name
            ),
        ));
    }
    if let Some(pool) = class.reserve_in.keys().find(|pool| !policy_pools.contains(pool)) {
        return Err(invalid(
            at,
            format!(
                "qos.reserve_in: class {} keeps GPUs in pool {pool:?}, but no [[pool]] has that name (pools: {})",
                class.name,
                policy_pools.join(", ")
            ),
        ));
    }
    Ok(Qos {
        priority: class.priority,
        max_time_secs: optional_duration(at, "qos.max_time", &class.max_time, invalid)?,
        preempt_lower: class.preempt_lower,
        // "0s": no minimum runtime, as leaving it out.
        min_runtime_secs: match class.min_runtime.as_deref().map(str::trim) {
            Some("0" | "0s" | "0m") => 0,
            _ => optional_duration(at, "qos.min_runtime", &class.min_runtime, invalid)?.unwrap_or(0),
        },
        grace_secs: optional_duration(at, "qos.grace", &class.grace, invalid)?.unwrap_or(60),
        reserve_gpus: class.reserve_gpus,
        reserve_in: class.reserve_in,
        user_limits: UserLimits {
            max_jobs: class.max_jobs_per_user,
            max_gpus: class.max_gpus_per_user,
            max_submit: class.max_submit_per_user,
        },
        name: class.name,
    })
}

/// One `[[pool]]`: a name, the node labels it selects, and what its jobs
/// get where they ask for nothing (as Slurm's `DefCpuPerGPU` and
/// `DefMemPerGPU`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct PoolFile {
    pub(super) name: String,
    #[serde(default)]
    selector: BTreeMap<String, String>,
    default_cpus_per_gpu: Option<toml::Spanned<u32>>,
    default_mem_per_gpu: Option<toml::Spanned<String>>,
}

impl PoolFile {
    pub(super) fn into_def(
        self,
        invalid: &dyn Fn(usize, String) -> ConfigError,
    ) -> Result<gpool_core::model::PoolDef, ConfigError> {
        let cpus_per_gpu = match self.default_cpus_per_gpu {
            Some(cpus) if *cpus.get_ref() == 0 => {
                return Err(invalid(
                    cpus.span().start,
                    format!(
                        "pool.default_cpus_per_gpu: pool {:?}: at least 1 (leave it out for none)",
                        self.name
                    ),
                ))
            }
            cpus => cpus.map(toml::Spanned::into_inner),
        };
        let mem_per_gpu_bytes = match self.default_mem_per_gpu {
            None => None,
            Some(size) => match gpool_core::spec::parse_size(size.get_ref()) {
                Ok(bytes) if bytes > 0 => Some(bytes),
                Ok(_) => {
                    return Err(invalid(
                        size.span().start,
                        format!(
                            "pool.default_mem_per_gpu: pool {:?}: more than 0 (leave it out for none)",
                            self.name
                        ),
                    ))
                }
                Err(reason) => {
                    return Err(invalid(
                        size.span().start,
                        format!("pool.default_mem_per_gpu: pool {:?}: {reason}", self.name),
                    ))
                }
            },
        };
        Ok(gpool_core::model::PoolDef {
            name: self.name,
            selector: self.selector,
            defaults: gpool_core::model::PoolDefaults {
                cpus_per_gpu,
                mem_per_gpu_bytes,
            },
        })
    }
}
