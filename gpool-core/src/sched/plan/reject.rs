//! Why a job waits: each reason as data, and in words.

use crate::ids::JobId;
use crate::model::GpuModel;
use std::fmt;

/// A job's reasons for waiting.
pub type Reasons = std::sync::Arc<[Reject]>;

/// Why a job did not start, with what was wanted and what there was.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Reject {
    UnknownPool {
        pool: String,
    },
    /// The pool has no known node at all (no agent registered yet).
    NoNodes {
        pool: String,
    },
    /// Nodes exist but none takes new work.
    NodesUnavailable {
        pool: String,
        n_down: usize,
        n_draining: usize,
    },
    /// Reported beside another reason: some nodes of the pool are out.
    SomeNodesUnavailable {
        pool: String,
        n_down: usize,
        n_draining: usize,
    },
    /// No schedulable node of the pool has a GPU of an acceptable model.
    NoGpuModel {
        pool: String,
        wanted: Vec<GpuModel>,
        available: Vec<GpuModel>,
    },
    /// The team is at its `max_gpus`.
    TeamCap {
        team: String,
        max_gpus: u32,
        in_use: u64,
    },
    /// Its user is at one of their caps (pool-wide, in its team, or in its
    /// QoS class).
    UserCap {
        user: String,
        /// "" (pool-wide), " in team T" or " in QoS Q".
        scope: String,
        /// "jobs" or "GPUs".
        what: &'static str,
        max: u64,
        in_use: u64,
    },
    /// Nodes of reservations are kept from it: its run would reach into
    /// their windows (each name with its start, seconds from now; 0: open).
    NodesReserved {
        windows: Vec<(String, u64)>,
        n_nodes: usize,
    },
    /// It runs in a reservation that is not open: `opens_in_secs` from now,
    /// or never again (ended, or gone).
    ReservationClosed {
        name: String,
        opens_in_secs: Option<u64>,
    },
    /// It runs in a reservation, and its time limit (or the lack of one)
    /// would keep it running after the window closes.
    OutlastsReservation {
        name: String,
        closes_in_secs: u64,
    },
    /// Starting it now would delay the job that holds the reservation.
    BehindReservation {
        job: JobId,
        in_secs: u64,
    },
    /// Starting it would dip into GPUs QoS classes keep free.
    Reserved {
        gpus: u64,
        /// A class that may take them, where changing class would help (a
        /// job that runs guaranteed, in a lower class than a reserve's).
        higher_class: Option<String>,
        /// It would run as burst work (its team beyond its guarantee or
        /// budget), which no reserve lends to, whatever its class.
        burst: bool,
        /// The reserves asked for more than half the pool, and keep half:
        /// what they asked, the pool's GPUs and its name.
        capped: Option<(u64, u64, String)>,
    },
    /// The first blocked job: its start cannot be foreseen, because not
    /// every running job in its way has a time limit.
    NoEstimate,
    /// Running jobs are being preempted to make room for this one.
    Reclaiming {
        n_jobs: usize,
    },
    /// Beside another reason: the job can run only as burst work, because
    /// its team used its GPU-hours for the period...
    OverBudget {
        team: String,
        gpu_hours: u64,
    },
    /// ...or runs all the GPUs it is guaranteed.
    BeyondGuarantee {
        team: String,
        guaranteed_gpus: u32,
        in_use: u64,
        wanted: u64,
    },
    /// Beside `Resources`: its counts are of what the job's requirements
    /// (memory, NVLink, labels, node lists) allow, in words.
    Requirements {
        what: String,
    },
    /// Beside `Resources`, under `enforce_limits = "refuse"`: nodes its
    /// requirements allow do not enforce `limits` of those it asks for,
    /// so its counts leave them out: how many, and the first few by name.
    Unenforced {
        limits: crate::enforce::LimitSet,
        n_nodes: usize,
        nodes: Vec<String>,
    },
    /// Beside `Resources`, for a fraction of a GPU: none of the `n_shared`
    /// GPUs fractions share that it may join has room for it (`asked`, in
    /// words); the most memory any has left.
    ShareRoom {
        asked: String,
        n_shared: usize,
        most_free_mib: u64,
    },
    /// The models exist but not enough of them are free right now.
    Resources {
        gpus_per_node: u32,
        nodes: u32,
        total_free: u64,
        max_free_on_one_node: u32,
        n_nodes_with_enough: usize,
        /// Of `total_free`, how many are kept for others (QoS reserves this
        /// job may not take).
        kept: u64,
    },
}

fn models(list: &[GpuModel]) -> String {
    let names: Vec<&str> = list.iter().map(GpuModel::as_str).collect();
    names.join(", ")
}

/// `45 s`, `12 min`, `3 h 5 min`.
fn humanize_secs(secs: u64) -> String {
    match secs {
        0..60 => format!("{secs} s"),
        60..3600 => format!("{} min", secs / 60),
        _ => format!("{} h {} min", secs / 3600, secs % 3600 / 60),
    }
}

/// `--mem, --cpus-per-gpu`: the flags that ask for `limits`.
fn flags(limits: crate::enforce::LimitSet) -> String {
    let flags: Vec<&str> = limits.iter().filter_map(crate::enforce::Limit::flag).collect();
    flags.join(", ")
}

fn plural(count: u64, one: &str, many: &str) -> String {
    format!("{count} {}", if count == 1 { one } else { many })
}

impl Reject {
    /// A stable snake_case identifier of the reason, for scripts (the
    /// sentences may change; these do not).
    pub fn code(&self) -> &'static str {
        match self {
            Reject::UnknownPool { .. } => "unknown_pool",
            Reject::NoNodes { .. } => "no_nodes",
            Reject::NodesUnavailable { .. } => "nodes_unavailable",
            Reject::SomeNodesUnavailable { .. } => "some_nodes_unavailable",
            Reject::Requirements { .. } => "requirements",
            Reject::Unenforced { .. } => "limits_not_enforced",
            Reject::NoGpuModel { .. } => "gpu_model_unavailable",
            Reject::TeamCap { .. } => "team_cap",
            Reject::UserCap { .. } => "user_cap",
            Reject::NodesReserved { .. } => "node_reservation",
            Reject::ReservationClosed { .. } | Reject::OutlastsReservation { .. } => "reservation",
            Reject::BehindReservation { .. } => "behind_reservation",
            Reject::Reserved { .. } => "reserved",
            Reject::NoEstimate => "no_estimate",
            Reject::Reclaiming { .. } => "preempting",
            Reject::OverBudget { .. } => "budget_exhausted",
            Reject::BeyondGuarantee { .. } => "beyond_guarantee",
            Reject::Resources { .. } => "resources",
            Reject::ShareRoom { .. } => "share_room",
        }
    }

    /// What would make the job start sooner, where something would.
    // Long by design: one arm per reason.
    pub fn hint(&self) -> Option<String> {
        let hint = match self {
            Reject::UnknownPool { .. } => "submit it to a pool that exists".to_string(),
            Reject::NoNodes { pool } => format!("start a gpool-agent on a node of pool {pool:?}"),
            Reject::NodesUnavailable { .. } => {
                "resume drained nodes (gpool resume NODE) or bring down nodes back".to_string()
            }
            Reject::SomeNodesUnavailable { .. } => return None,
            Reject::Requirements { what } => format!("relax what narrows where it may run: {what}"),
            Reject::Unenforced { limits, .. } => format!(
                "wait for nodes that enforce {} (gpool nodes: ENFORCES), or submit it without {} to run where nothing holds it to them",
                limits.words(),
                flags(*limits)
            ),
            Reject::NoGpuModel { available, .. } if !available.is_empty() => {
                format!("accept another GPU model: {}", models(available))
            }
            Reject::NoGpuModel { .. } => "add nodes with GPUs to the pool".to_string(),
            Reject::TeamCap { team, .. } => format!("wait for team {team}'s running jobs to end"),
            Reject::UserCap { user, .. } => format!("wait for user {user}'s running jobs to end"),
            Reject::NodesReserved { windows, .. } if windows.iter().any(|(_, in_secs)| *in_secs > 0) => {
                "give it a --time that ends it before the reservation opens".to_string()
            }
            Reject::OutlastsReservation { .. } => "give it a --time that ends it before the window closes".to_string(),
            Reject::NodesReserved { .. } | Reject::ReservationClosed { .. } => return None,
            Reject::BehindReservation { .. } => {
                "give it a --time short enough to end before the reservation".to_string()
            }
            Reject::Reserved {
                higher_class: Some(class),
                ..
            } => format!("use QoS class {class}, which may take them, or wait for GPUs beyond the reserve to free up"),
            Reject::Reserved { burst: true, .. } => {
                "wait for GPUs beyond the reserve to free up, or for the team's guaranteed jobs to end so that it runs guaranteed".to_string()
            }
            Reject::Reserved { .. } => "wait for GPUs beyond the reserve to free up".to_string(),
            Reject::NoEstimate => return None,
            Reject::ShareRoom { .. } => {
                "ask for less GPU memory (--gpu-mem), or wait for fractions or whole GPUs to free up".to_string()
            }
            Reject::Reclaiming { .. } => {
                "nothing: it starts once the preempted jobs have checkpointed or their grace ran out".to_string()
            }
            Reject::OverBudget { .. } => {
                "wait for idle GPUs, or for the budget to start over with the next period".to_string()
            }
            Reject::BeyondGuarantee {
                guaranteed_gpus,
                in_use,
                ..
            } => {
                let left = u64::from(*guaranteed_gpus).saturating_sub(*in_use);
                if left > 0 {
                    format!(
                        "ask for at most {} to run guaranteed (the team's unused guarantee)",
                        plural(left, "GPU", "GPUs")
                    )
                } else {
                    "wait for the team's guaranteed jobs to end, or for idle GPUs".to_string()
                }
            }
            Reject::Resources {
                nodes: 1,
                max_free_on_one_node,
                total_free,
                kept,
                ..
            } => {
                // What a smaller job could take: free on one node, and not
                // the GPUs kept for others.
                let usable = u64::from(*max_free_on_one_node).min(total_free.saturating_sub(*kept));
                if usable > 0 {
                    format!(
                        "ask for at most {} to start now, or wait for running jobs to end",
                        plural(usable, "GPU", "GPUs")
                    )
                } else {
                    "wait for running jobs to end".to_string()
                }
            }
            Reject::Resources {
                n_nodes_with_enough: 0, ..
            } => "wait for running jobs to end".to_string(),
            Reject::Resources {
                n_nodes_with_enough, ..
            } => format!(
                "use at most {} (that many have the GPUs free now), or wait for running jobs to end",
                plural(*n_nodes_with_enough as u64, "node", "nodes")
            ),
        };
        Some(hint)
    }
}

impl fmt::Display for Reject {
    // Long by design: one arm per reason, each its sentence, side by side
    // with `code` and `hint` above.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reject::UnknownPool { pool } => write!(f, "unknown pool {pool:?}"),
            Reject::NoNodes { pool } => write!(f, "no nodes: pool {pool:?} has no known node yet"),
            Reject::NodesUnavailable {
                pool,
                n_down,
                n_draining,
            } => write!(
                f,
                "no node of pool {pool:?} takes new work ({n_down} down, {n_draining} draining or drained)"
            ),
            Reject::SomeNodesUnavailable {
                pool,
                n_down,
                n_draining,
            } => write!(
                f,
                "pool {pool:?} has {n_down} down and {n_draining} draining or drained"
            ),
            Reject::NoGpuModel {
                pool,
                wanted,
                available,
            } => write!(
                f,
                "no GPU of model {} on an available node of pool {pool:?} (it has: {})",
                if wanted.is_empty() {
                    "any".to_string()
                } else {
                    models(wanted)
                },
                if available.is_empty() {
                    "none".to_string()
                } else {
                    models(available)
                }
            ),
            Reject::TeamCap {
                team,
                max_gpus,
                in_use,
            } => write!(f, "team {team} is at its cap: {in_use} of at most {max_gpus} GPUs in use"),
            Reject::UserCap {
                user,
                scope,
                what,
                max,
                in_use,
            } => write!(f, "user {user} runs {in_use} of at most {max} {what}{scope}"),
            Reject::NodesReserved { windows, n_nodes } => {
                let windows: Vec<String> = windows
                    .iter()
                    .map(|(name, in_secs)| match in_secs {
                        0 => format!("{name} (open)"),
                        secs => format!("{name} (from {} from now)", humanize_secs(*secs)),
                    })
                    .collect();
                write!(
                    f,
                    "{} reserved for {}: only a job whose time limit ends it before a window opens runs there",
                    plural(*n_nodes as u64, "node", "nodes"),
                    windows.join(", ")
                )
            }
            Reject::ReservationClosed {
                name,
                opens_in_secs: Some(secs),
            } => write!(f, "reservation {name} opens in {}", humanize_secs(*secs)),
            Reject::OutlastsReservation { name, closes_in_secs } => write!(
                f,
                "its time limit would keep it running after reservation {name} closes, in {}",
                humanize_secs(*closes_in_secs)
            ),
            Reject::ReservationClosed { name, opens_in_secs: None } => {
                write!(f, "reservation {name} has ended or does not exist")
            }
            Reject::BehindReservation { job, in_secs } => write!(
                f,
                "it would delay job {job}, which has GPUs reserved from {} from now",
                humanize_secs(*in_secs)
            ),
            Reject::Requirements { what } => write!(f, "counting only what its requirements allow: {what}"),
            Reject::Unenforced {
                limits,
                n_nodes,
                nodes,
            } => {
                let names = limits.names();
                write!(
                    f,
                    "{} {} ({}) not enforced on {}: {}",
                    names.join(" and "),
                    if names.len() == 1 { "limit" } else { "limits" },
                    flags(*limits),
                    plural(*n_nodes as u64, "node", "nodes"),
                    nodes.join(", ")
                )?;
                if *n_nodes > nodes.len() {
                    f.write_str(", ...")?;
                }
                Ok(())
            }
            Reject::NoEstimate => f.write_str(
                "no start time can be foreseen: not every running job in its way has a time limit",
            ),
            Reject::ShareRoom { asked, n_shared: 0, .. } => write!(
                f,
                "a fraction of {asked}: no GPU fractions share takes it, and it waits for a whole free GPU"
            ),
            Reject::ShareRoom {
                asked,
                n_shared,
                most_free_mib,
            } => write!(
                f,
                "a fraction of {asked}: none of the {} fractions share has that much left (the most is {most_free_mib} MiB), and it waits for a whole free GPU",
                plural(*n_shared as u64, "GPU", "GPUs")
            ),
            Reject::Reserved {
                gpus, burst, capped, ..
            } => {
                let gpus = plural(*gpus, "GPU", "GPUs");
                if *burst {
                    write!(f, "the free GPUs are the {gpus} that QoS reserves keep for guaranteed work, and this job would run as burst work")?;
                } else {
                    write!(f, "the free GPUs are the {gpus} that higher QoS classes keep free")?;
                }
                if let Some((asked, pool_gpus, pool)) = capped {
                    write!(f, " (their reserves ask {asked} of pool {pool:?}'s {pool_gpus} and keep half of it at most)")?;
                }
                Ok(())
            }
            Reject::Reclaiming { n_jobs } => write!(
                f,
                "preempting {} to make room for it",
                plural(*n_jobs as u64, "running job", "running jobs")
            ),
            Reject::OverBudget { team, gpu_hours } => write!(
                f,
                "team {team} used its {gpu_hours} guaranteed GPU-hours this period, so it runs only as burst work on idle GPUs"
            ),
            Reject::BeyondGuarantee {
                team,
                guaranteed_gpus,
                in_use,
                wanted,
            } => write!(
                f,
                "team {team} runs {in_use} of its {guaranteed_gpus} guaranteed GPUs; {} more run only as burst work on idle GPUs",
                plural(*wanted, "GPU", "GPUs")
            ),
            Reject::Resources {
                gpus_per_node,
                nodes,
                total_free: 0,
                ..
            } => write!(
                f,
                "wants {} on {}; none is free",
                plural(u64::from(*gpus_per_node), "GPU", "GPUs"),
                if *nodes == 1 {
                    "one node".to_string()
                } else {
                    format!("each of {nodes} nodes")
                }
            ),
            Reject::Resources {
                gpus_per_node,
                nodes: 1,
                total_free,
                max_free_on_one_node,
                ..
            } => write!(
                f,
                "wants {} on one node; {} free in total but at most {max_free_on_one_node} on one node",
                plural(u64::from(*gpus_per_node), "GPU", "GPUs"),
                *total_free
            ),
            Reject::Resources {
                gpus_per_node,
                nodes,
                total_free,
                n_nodes_with_enough,
                ..
            } => write!(
                f,
                "wants {} on each of {nodes} nodes; {} that many free ({} free in total)",
                plural(u64::from(*gpus_per_node), "GPU", "GPUs"),
                plural(*n_nodes_with_enough as u64, "node has", "nodes have"),
                *total_free
            ),
        }
    }
}
