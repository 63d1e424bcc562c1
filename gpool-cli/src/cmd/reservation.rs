//! `gpool reservation`: nodes kept for a window (a maintenance, an event),
//! made and deleted at run time beside gpoold.toml's `[[reservation]]`.

use super::Ctx;
use crate::output;
use crate::CliError;
use gpool_proto::pb;

#[derive(clap::Subcommand)]
pub enum ReservationCommand {
    /// Keep nodes for a window (admins): jobs outside it use them only if
    /// their time limit ends them before it opens; jobs submitted into it
    /// (`--reservation NAME`) by its users or teams run there. A
    /// reservation naming no user or team is a maintenance window.
    Create {
        /// Letters, digits, '.', '_' and '-'.
        name: String,
        /// The nodes it keeps (comma-separated or repeated).
        #[arg(
            long,
            value_delimiter = ',',
            required_unless_present = "gpus",
            conflicts_with = "gpus"
        )]
        nodes: Vec<String>,
        /// Or this many GPUs: gpoold keeps the fewest nodes that have them,
        /// up, undrained and in no other reservation of the window.
        #[arg(long, value_name = "N")]
        gpus: Option<u32>,
        /// When it opens: a date (2026-12-01T08:00:00Z), `now` or `now+2h`.
        #[arg(long)]
        start: String,
        /// How long it lasts (4h, 2d); or give --end.
        #[arg(long, conflicts_with = "end", required_unless_present = "end")]
        duration: Option<String>,
        /// When it closes, as --start.
        #[arg(long)]
        end: Option<String>,
        /// Users who may submit into it.
        #[arg(long, value_delimiter = ',')]
        users: Vec<String>,
        /// Teams whose members and leads may submit into it.
        #[arg(long, value_delimiter = ',')]
        teams: Vec<String>,
    },
    /// Delete a reservation made with `create` (admins); gpoold.toml's
    /// stay until removed there.
    Delete {
        /// The reservation's name, as `list` shows it.
        name: String,
    },
    /// Every reservation, gpoold.toml's and those made with `create`.
    List,
}

pub async fn run(ctx: &Ctx, command: ReservationCommand) -> Result<(), CliError> {
    let mut conn = ctx.connect().await?;
    let reservations = match command {
        ReservationCommand::Create {
            name,
            nodes,
            start,
            duration,
            end,
            users,
            teams,
            gpus,
        } => {
            let request = pb::CreateReservationRequest {
                gpus: gpus.unwrap_or(0),
                name,
                nodes,
                start,
                duration: duration.unwrap_or_default(),
                end: end.unwrap_or_default(),
                users,
                teams,
            };
            let made = conn.client.create_reservation(request).await;
            vec![made.map_err(|s| conn.refused(s))?.into_inner()]
        }
        ReservationCommand::Delete { name } => {
            let deleted = conn
                .client
                .delete_reservation(pb::DeleteReservationRequest { name })
                .await;
            vec![deleted.map_err(|s| conn.refused(s))?.into_inner()]
        }
        ReservationCommand::List => {
            let listed = conn.client.list_reservations(pb::ListReservationsRequest {}).await;
            listed.map_err(|s| conn.refused(s))?.into_inner().reservations
        }
    };
    if ctx.json() {
        let json: Vec<serde_json::Value> = reservations.iter().map(to_json).collect();
        output::print_json(&json);
    } else {
        let rows = reservations
            .iter()
            .map(|r| {
                vec![
                    r.name.clone(),
                    r.nodes.join(","),
                    output::rfc3339(r.start_ms),
                    output::rfc3339(r.end_ms),
                    or_dash(r.users.join(",")),
                    or_dash(r.teams.join(",")),
                    source(r).to_string(),
                ]
            })
            .collect();
        output::print_table(&["NAME", "NODES", "START", "END", "USERS", "TEAMS", "FROM"], rows);
    }
    Ok(())
}

fn source(reservation: &pb::Reservation) -> &'static str {
    if reservation.created {
        "created"
    } else {
        "gpoold.toml"
    }
}

fn or_dash(text: String) -> String {
    if text.is_empty() {
        "-".to_string()
    } else {
        text
    }
}

fn to_json(r: &pb::Reservation) -> serde_json::Value {
    serde_json::json!({
        "name": r.name,
        "nodes": r.nodes,
        "start": output::rfc3339(r.start_ms),
        "end": output::rfc3339(r.end_ms),
        "users": r.users,
        "teams": r.teams,
        "from": source(r),
    })
}
