//! A waiting job's reasons as data on the wire.

use crate::pb;
use gpool_core::sched::Reason;

pub fn reason_to_wire(reason: &Reason) -> pb::Reason {
    let facts = &reason.facts;
    pb::Reason {
        code: reason.code.to_string(),
        words: reason.words.clone(),
        hint: reason.hint.clone().unwrap_or_default(),
        pool: facts.pool.clone(),
        team: facts.team.clone(),
        user: facts.user.clone(),
        limit: facts.limit,
        in_use: facts.in_use,
        gpus_wanted: facts.gpus_wanted,
        gpus_free: facts.gpus_free,
        gpus_free_on_one_node: facts.gpus_free_on_one_node,
        gpus_kept: facts.gpus_kept,
        nodes_wanted: facts.nodes_wanted,
        nodes_with_enough: facts.nodes_with_enough,
        nodes_down: facts.nodes_down,
        nodes_draining: facts.nodes_draining,
        models_wanted: facts.models_wanted.clone(),
        models_available: facts.models_available.clone(),
        reservation: facts.reservation.clone(),
        in_secs: facts.in_secs,
        job: facts.job.map(|job| job.0),
        count: facts.count,
        at_ms: facts.at.map(|at| at.0),
        limits: facts.limits.clone(),
    }
}
