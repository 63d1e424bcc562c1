//! `gpool cancel [--signal SIG] ID...`.

use super::{Ctx, JobRef};
use crate::output;
use crate::CliError;
use gpool_proto::convert::state_name;
use gpool_proto::pb;

/// A signal by name (`USR1`, `SIGUSR1`, any case) or number, of those
/// gpool sends to jobs.
pub fn parse_signal(text: &str) -> Result<i32, String> {
    gpool_core::spec::parse_signal(text)
}

/// Which jobs `gpool cancel` ends besides the ids given (as scancel's -u,
/// -n, -t and -A): pending and running jobs matching all of them.
#[derive(clap::Args, Default)]
pub struct Filter {
    /// Jobs of this user.
    #[arg(long, short = 'u')]
    user: Option<String>,
    /// Your own jobs.
    #[arg(long, conflicts_with = "user")]
    me: bool,
    /// Jobs of this name.
    #[arg(long, short = 'n')]
    name: Option<String>,
    /// Jobs in this state (pending or running).
    #[arg(long, short = 't', value_parser = ["pending", "running"])]
    state: Option<String>,
    /// Jobs of this team.
    #[arg(long, short = 'A')]
    team: Option<String>,
}

impl Filter {
    fn is_empty(&self) -> bool {
        self.user.is_none() && !self.me && self.name.is_none() && self.state.is_none() && self.team.is_none()
    }

    /// The ids of the pending and running jobs it matches.
    async fn ids(&self, conn: &mut super::Connection) -> Result<Vec<u64>, CliError> {
        let user = match (&self.user, self.me) {
            (_, true) => conn.my_name().await?,
            (Some(user), false) => user.clone(),
            (None, false) => String::new(),
        };
        let states = match self.state.as_deref() {
            Some("running") => vec![pb::JobState::Running as i32],
            Some(_) => vec![pb::JobState::Pending as i32],
            None => vec![pb::JobState::Pending as i32, pb::JobState::Running as i32],
        };
        let request = pb::ListJobsRequest {
            states,
            team: self.team.clone().unwrap_or_default(),
            user,
            all: false,
        };
        let mut chunks = conn
            .client
            .list_jobs(request)
            .await
            .map_err(|s| conn.refused(s))?
            .into_inner();
        let mut ids = Vec::new();
        while let Some(chunk) = chunks.message().await.map_err(|s| conn.refused(s))? {
            ids.extend(
                chunk
                    .jobs
                    .iter()
                    .filter(|job| {
                        self.name
                            .as_ref()
                            .is_none_or(|name| job.spec.as_ref().is_some_and(|spec| &spec.name == name))
                    })
                    .map(|job| job.id),
            );
        }
        Ok(ids)
    }
}

/// Cancels (or signals) every id it can and reports each; exits 1 if any
/// id was left alone (no such job, or not the caller's).
pub async fn run(ctx: &Ctx, refs: Vec<JobRef>, signal: Option<i32>, filter: Filter) -> Result<u8, CliError> {
    let mut conn = ctx.connect().await?;
    let (mut ids, names) = conn.resolve_named(&refs).await?;
    // Ids of a range that name no job are passed over quietly.
    let in_ranges: Vec<(u64, u64)> = refs
        .iter()
        .filter_map(|job_ref| match job_ref {
            JobRef::Range { first, last } => Some((*first, *last)),
            _ => None,
        })
        .collect();
    if !filter.is_empty() {
        let matching = filter.ids(&mut conn).await?;
        if matching.is_empty() && ids.is_empty() {
            if ctx.json() {
                output::print_json(&serde_json::json!({ "outcomes": [] }));
            } else {
                outln!("no pending or running job matches");
            }
            return Ok(0);
        }
        ids.extend(matching);
    }
    let request = pb::CancelJobsRequest {
        ids,
        signal: signal.unwrap_or(0),
        // `-t pending`: what started meanwhile, and an array's running
        // tasks, are left alone.
        pending_only: signal.is_none() && filter.state.as_deref() == Some("pending"),
        ..Default::default()
    };
    let mode = if signal.is_some() { Mode::Signal } else { Mode::Cancel };
    let mut response = send(&mut conn, request).await?;
    response.outcomes.retain(|o| {
        let ranged = in_ranges.iter().any(|(first, last)| (*first..=*last).contains(&o.id));
        !(ranged && o.state() == pb::JobState::Unspecified && o.error.contains("not found"))
    });
    report(ctx, response, mode, &names)
}

/// `gpool hold ID...` (`hold` true) and `gpool release ID...`: pending jobs
/// are kept from being scheduled, or let go again; each id is reported.
pub async fn hold(ctx: &Ctx, ids: Vec<JobRef>, hold: bool) -> Result<u8, CliError> {
    let mut conn = ctx.connect().await?;
    let change = if hold {
        pb::HoldChange::Hold
    } else {
        pb::HoldChange::Release
    };
    let (ids, names) = conn.resolve_named(&ids).await?;
    let request = pb::CancelJobsRequest {
        ids,
        hold: change.into(),
        ..Default::default()
    };
    self::change(ctx, conn, request, Mode::Hold, &names).await
}

/// `gpool requeue ID...`.
pub async fn requeue(ctx: &Ctx, ids: Vec<JobRef>) -> Result<u8, CliError> {
    let mut conn = ctx.connect().await?;
    let (ids, names) = conn.resolve_named(&ids).await?;
    let request = pb::CancelJobsRequest {
        ids,
        requeue: true,
        ..Default::default()
    };
    change(ctx, conn, request, Mode::Requeue, &names).await
}

#[derive(clap::Args)]
pub struct UpdateArgs {
    /// Job ids.
    #[arg(required = true, value_parser = super::parse_job_ref)]
    ids: Vec<JobRef>,
    /// A new time limit (2h, 1:30:00); only admins may make it longer.
    #[arg(long, short = 't', value_name = "DURATION")]
    time: Option<String>,
    /// A new priority (up to max_user_priority).
    #[arg(long, allow_negative_numbers = true)]
    priority: Option<i32>,
    /// An array's most tasks at once (0: no limit).
    #[arg(long, value_name = "N")]
    max_parallel: Option<u32>,
}

/// `gpool update ID... --time/--priority/--max-parallel`.
pub async fn update(ctx: &Ctx, args: UpdateArgs) -> Result<u8, CliError> {
    let time_limit = match args.time.as_deref() {
        Some(text) => Some(pb::Duration {
            seconds: gpool_core::spec::parse_duration(text)
                .map_err(|reason| CliError::Usage(format!("--time: {reason}")))?,
        }),
        None => None,
    };
    if time_limit.is_none() && args.priority.is_none() && args.max_parallel.is_none() {
        return Err(CliError::Usage(
            "nothing to change: give --time, --priority or --max-parallel".into(),
        ));
    }
    let mut conn = ctx.connect().await?;
    let ids_named = conn.resolve_named(&args.ids).await?;
    let request = pb::UpdateJobsRequest {
        ids: ids_named.0,
        time_limit,
        priority: args.priority,
        max_parallel: args.max_parallel,
    };
    let response = conn
        .client
        .update_jobs(request)
        .await
        .map_err(|s| conn.refused(s))?
        .into_inner();
    report(ctx, response, Mode::Update, &ids_named.1)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Cancel,
    Signal,
    Hold,
    Requeue,
    Update,
}

async fn change(
    ctx: &Ctx,
    mut conn: super::Connection,
    request: pb::CancelJobsRequest,
    mode: Mode,
    names: &std::collections::HashMap<u64, String>,
) -> Result<u8, CliError> {
    let response = send(&mut conn, request).await?;
    report(ctx, response, mode, names)
}

/// Sends `request`, its ids at most `MAX_IDS_PER_REQUEST` at a time (a
/// range of 100,000 ids is 10 requests), and gathers the outcomes.
async fn send(
    conn: &mut super::Connection,
    request: pb::CancelJobsRequest,
) -> Result<pb::CancelJobsResponse, CliError> {
    let mut chunks: Vec<Vec<u64>> = request
        .ids
        .chunks(gpool_core::ids::MAX_IDS_PER_REQUEST)
        .map(<[u64]>::to_vec)
        .collect();
    if chunks.is_empty() {
        chunks.push(Vec::new());
    }
    let mut merged = pb::CancelJobsResponse::default();
    for ids in chunks {
        let part = pb::CancelJobsRequest { ids, ..request.clone() };
        let response = conn
            .client
            .cancel_jobs(part)
            .await
            .map_err(|s| conn.refused(s))?
            .into_inner();
        merged.outcomes.extend(response.outcomes);
    }
    Ok(merged)
}

/// Prints each id's outcome (an array task by the name it was given by);
/// 1 if any id was left alone.
fn report(
    ctx: &Ctx,
    response: pb::CancelJobsResponse,
    mode: Mode,
    names: &std::collections::HashMap<u64, String>,
) -> Result<u8, CliError> {
    let code = u8::from(response.outcomes.iter().any(|o| !o.error.is_empty()));
    if ctx.json() {
        let outcomes: Vec<_> = response
            .outcomes
            .iter()
            .map(|o| {
                serde_json::json!({
                    "id": o.id,
                    "state": state_name(o.state()),
                    "cancelled": o.cancelled,
                    "signalled": o.signalled,
                    "error": (!o.error.is_empty()).then_some(&o.error),
                    "held": o.held,
                    "requeued": o.requeued,
                    "updated": o.updated,
                })
            })
            .collect();
        output::print_json(&serde_json::json!({ "outcomes": outcomes }));
        return Ok(code);
    }
    for outcome in response.outcomes {
        let id = names
            .get(&outcome.id)
            .cloned()
            .unwrap_or_else(|| outcome.id.to_string());
        let state = state_name(outcome.state());
        if !outcome.error.is_empty() {
            eprintln!("gpool: job {id} left alone: {}", outcome.error);
            continue;
        }
        match mode {
            Mode::Hold => match (outcome.held, outcome.state(), outcome.updated) {
                (true, _, true) => outln!("job {id} held"),
                (true, _, false) => outln!("job {id} was held already"),
                (false, pb::JobState::Pending, true) => outln!("job {id} released"),
                (false, pb::JobState::Pending, false) => outln!("job {id} was not held"),
                (false, _, _) => outln!("job {id} is {state}: only pending jobs are held"),
            },
            Mode::Signal if outcome.signalled => outln!("signalled job {id}"),
            Mode::Signal => outln!("job {id} is not running ({state})"),
            Mode::Requeue if outcome.requeued => {
                outln!("job {id} is being requeued (its checkpoint signal and grace, then back to the queue)")
            }
            Mode::Requeue => outln!("job {id} is not running ({state}): only running jobs are requeued"),
            Mode::Update if outcome.updated => outln!("job {id} updated"),
            Mode::Update => outln!("job {id} unchanged"),
            Mode::Cancel if outcome.cancelled => outln!("cancelled job {id}"),
            // `--state pending` leaves running jobs alone.
            Mode::Cancel if outcome.state() == pb::JobState::Running => {
                outln!("job {id} is running: left alone (--state pending)")
            }
            Mode::Cancel => outln!("job {id} had already ended ({state})"),
        }
    }
    Ok(code)
}
