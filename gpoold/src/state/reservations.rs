//! Reservations made at run time (`gpool reservation create`): kept in the
//! store, beside gpoold.toml's, and seen by the scheduler with them.

use super::{Batch, State, Write};
use crate::error::Error;
use gpool_core::auth::{authorize, Action, Caller};
use gpool_core::sched::reservations::{Definition, Reservation};
use gpool_core::Timestamp;

/// A change to the reservations made at run time.
#[derive(Debug)]
pub enum ReservationChange {
    Create(Definition),
    Delete(String),
}

impl State {
    /// Whether reservation `name` was made at run time (else it is
    /// gpoold.toml's).
    pub fn is_created_reservation(&self, name: &str) -> bool {
        self.created_reservations.iter().any(|r| r.name == name)
    }

    /// gpoold.toml's reservations (in `policy`), then those made at run
    /// time. One the file now names too is dropped: the file's stands (the
    /// stored list follows at its next change).
    pub(super) fn add_created_reservations(&mut self) {
        let from_config: Vec<String> = self.policy.reservations.iter().map(|r| r.name.clone()).collect();
        self.created_reservations.retain(|created| {
            let shadowed = from_config.contains(&created.name);
            if shadowed {
                tracing::warn!(name = %created.name, "gpoold.toml now names this reservation: its own replaces the one made with `gpool reservation create`");
            }
            !shadowed
        });
        self.policy
            .reservations
            .extend(self.created_reservations.iter().cloned());
    }

    /// Creates or deletes a reservation made at run time (admins only);
    /// returns it.
    pub(super) fn change_reservation(
        &mut self,
        caller: &Caller,
        change: ReservationChange,
        now: Timestamp,
        out: &mut Batch,
    ) -> Result<Reservation, Error> {
        authorize(caller, &Action::ManageReservations)?;
        let invalid = |field: &'static str, reason: String| Error::InvalidRequest { field, reason };
        let changed = match change {
            ReservationChange::Create(definition) => {
                let gpus = definition.gpus;
                let mut reservation =
                    Reservation::define(definition, Some(now)).map_err(|(field, reason)| invalid(field, reason))?;
                if gpus > 0 {
                    let nodes: Vec<&gpool_core::model::Node> = self.nodes.values().collect();
                    reservation
                        .choose_nodes(gpus, &nodes, &self.policy.reservations)
                        .map_err(|(field, reason)| invalid(field, reason))?;
                }
                let known = |node: &str| self.nodes.contains_key(node);
                reservation
                    .may_join(&self.policy.reservations, &known, now)
                    .map_err(|(field, reason)| invalid(field, reason))?;
                self.created_reservations.push(reservation.clone());
                self.policy.reservations.push(reservation.clone());
                tracing::info!(name = %reservation.name, by = %caller.user, "reservation created");
                reservation
            }
            ReservationChange::Delete(name) => {
                let Some(at) = self.created_reservations.iter().position(|r| r.name == name) else {
                    let reason = if self.policy.reservations.iter().any(|r| r.name == name) {
                        format!("reservation {name} is gpoold.toml's: remove it there and reload")
                    } else {
                        format!("no reservation {name}")
                    };
                    return Err(invalid("name", reason));
                };
                let reservation = self.created_reservations.remove(at);
                self.policy.reservations.retain(|r| r.name != name);
                tracing::info!(name = %reservation.name, by = %caller.user, "reservation deleted");
                reservation
            }
        };
        out.writes.push(Write::Reservations);
        Ok(changed)
    }
}
