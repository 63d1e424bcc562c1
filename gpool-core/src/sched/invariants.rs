//! What a plan must never do, checked against the view it was made from:
//! the simulator runs this on every cycle, and property tests on every
//! plan they make.
//!
//! - No GPU is given twice, nor one that is busy, out of service, on a node
//!   that takes no work, or promised to another waiting job.
//! - A victim runs the attempt named, is not already being preempted, and
//!   is burst work of a class that may not preempt its job's (or of a
//!   lower QoS than a job whose QoS preempts lower classes); it is never
//!   its job's twin (same team, QoS, pool, models and
//!   size); and its job does not start in the same plan.
//! - A job never waits on more victims than it has GPUs: the victims a
//!   cycle takes for it, those in their grace for it and the GPUs promised
//!   to it by victims that ended, together, are at most its GPUs (each one
//!   it waits on serves at least one of its GPUs).
//! - A rescinded victim is in its grace, was taken for a job that no
//!   longer owns it (started, or let go of its claims), and no job of the
//!   plan waits on its GPUs.

use super::{Availability, ClusterView, FastHash, PendingJob, Plan, Policy};
use crate::ids::{JobId, Timestamp};
use std::collections::{HashMap, HashSet};

/// Waiting jobs by id: those the checks look up (a plan's claimants, and
/// those victims in their grace or promises name), not the whole queue.
type Jobs<'v> = HashMap<JobId, &'v PendingJob, FastHash>;

/// The first broken invariant of `plan`, in words; `Ok` if none is.
pub fn check(view: &ClusterView, policy: &Policy, now: Timestamp, plan: &Plan) -> Result<(), String> {
    let named: HashSet<JobId, FastHash> = view
        .running
        .iter()
        .filter(|r| r.preempting)
        .chain(&view.promised)
        .filter_map(|r| r.preempted_for)
        .chain(plan.preemptions.iter().map(|p| p.for_job))
        .collect();
    let pending: Jobs = if named.is_empty() {
        Jobs::default()
    } else {
        view.pending
            .iter()
            .filter(|job| named.contains(&job.id))
            .map(|job| (job.id, &**job))
            .collect()
    };
    // Jobs whose claims the plan let go of own nothing this cycle.
    let owning: Jobs = pending
        .iter()
        .filter(|(id, _)| !plan.released_claims.contains(id))
        .map(|(id, job)| (*id, *job))
        .collect();
    check_starts(view, plan, &owning)?;
    check_victims(view, (policy, now), plan, &pending, &owning)?;
    check_rescinds(view, plan, &owning)
}

fn check_rescinds(view: &ClusterView, plan: &Plan, owning: &Jobs) -> Result<(), String> {
    for (id, epoch) in &plan.rescinds {
        let victim = view
            .running
            .iter()
            .find(|r| r.id == *id && r.epoch == *epoch && r.preempting)
            .ok_or_else(|| format!("j{id} is rescinded but not in its grace"))?;
        match victim.preempted_for {
            None => return Err(format!("j{id} is rescinded but was not taken for a job")),
            Some(owner) if owning.contains_key(&owner) => {
                return Err(format!("j{id} is rescinded while j{owner} still counts on it"))
            }
            Some(_) => {}
        }
        for (job, held) in &plan.holds {
            let shared = held.iter().any(|h| {
                victim
                    .placement
                    .iter()
                    .any(|v| v.node == h.node && v.gpu_indices.iter().any(|g| h.gpu_indices.contains(g)))
            });
            if shared {
                return Err(format!("j{id} is rescinded while j{job} waits on its GPUs"));
            }
        }
    }
    Ok(())
}

fn check_starts(view: &ClusterView, plan: &Plan, pending: &Jobs) -> Result<(), String> {
    let promised: HashMap<(&str, u32), JobId> = view
        .promised
        .iter()
        .filter_map(|p| Some((p.preempted_for.filter(|owner| pending.contains_key(owner))?, p)))
        .flat_map(|(owner, p)| {
            p.placement.iter().flat_map(move |part| {
                part.gpu_indices
                    .iter()
                    .map(move |gpu| ((part.node.as_str(), *gpu), owner))
            })
        })
        .collect();
    let mut given: HashSet<(&str, u32)> = HashSet::new();
    // GPUs fractions share, with the memory they hold.
    let mut shared: HashMap<(&str, u32), u64> = HashMap::new();
    for start in &plan.starts {
        for part in &start.placement {
            let node = view
                .nodes
                .iter()
                .find(|node| node.name == part.node)
                .ok_or_else(|| format!("j{} starts on unknown node {}", start.job, part.node))?;
            if node.availability != Availability::Up {
                return Err(format!("j{} starts on {}, which takes no work", start.job, node.name));
            }
            if let Some(share) = &start.share {
                check_share(node, (start.job, share, part), &given, &mut shared)?;
                continue;
            }
            for idx in &part.gpu_indices {
                let free = node.gpus.iter().any(|gpu| gpu.index == *idx && !gpu.busy);
                if !free || shared.contains_key(&(node.name.as_str(), *idx)) {
                    return Err(format!(
                        "j{} starts on {}[{idx}], which is not free",
                        start.job, node.name
                    ));
                }
                if !given.insert((node.name.as_str(), *idx)) {
                    return Err(format!("{}[{idx}] is given twice (j{})", node.name, start.job));
                }
                if let Some(owner) = promised
                    .get(&(node.name.as_str(), *idx))
                    .filter(|owner| **owner != start.job)
                {
                    return Err(format!(
                        "j{} starts on {}[{idx}], which was freed for j{owner}",
                        start.job, node.name
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A fraction starts on one GPU that is free or shared (never one a
/// whole-GPU start of the plan takes), and fractions together stay within
/// its usable memory.
fn check_share<'v>(
    node: &'v super::NodeView,
    (job, share, part): (JobId, &crate::share::Share, &crate::model::NodePlacement),
    given: &HashSet<(&str, u32)>,
    shared: &mut HashMap<(&'v str, u32), u64>,
) -> Result<(), String> {
    let [idx] = part.gpu_indices[..] else {
        return Err(format!("j{job} is a fraction on {} GPUs", part.gpu_indices.len()));
    };
    let gpu = node
        .gpus
        .iter()
        .find(|gpu| gpu.index == idx && (!gpu.busy || gpu.shared.is_some()))
        .filter(|_| !given.contains(&(node.name.as_str(), idx)))
        .ok_or_else(|| {
            format!(
                "j{job}'s fraction starts on {}[{idx}], which is neither free nor shared",
                node.name
            )
        })?;
    let held = shared
        .entry((node.name.as_str(), idx))
        .or_insert_with(|| gpu.shared.as_ref().map_or(0, |shared| shared.used_mib));
    *held += share.memory_mib;
    if *held > gpu.usable_mib() {
        return Err(format!(
            "{}[{idx}] holds {held} MiB of fractions with j{job}, more than its {} usable",
            node.name,
            gpu.usable_mib()
        ));
    }
    Ok(())
}

fn check_victims(
    view: &ClusterView,
    (policy, now): (&Policy, Timestamp),
    plan: &Plan,
    pending: &Jobs,
    owning: &Jobs,
) -> Result<(), String> {
    let starting: HashSet<JobId> = plan.starts.iter().map(|start| start.job).collect();
    let mut waits_on: HashMap<JobId, u64> = HashMap::new();
    for r in view.running.iter().filter(|r| r.preempting).chain(&view.promised) {
        if let Some(owner) = r.preempted_for.filter(|owner| owning.contains_key(owner)) {
            *waits_on.entry(owner).or_default() += 1;
        }
    }
    let mut seen = HashSet::new();
    for preemption in &plan.preemptions {
        let (victim_id, for_id) = (preemption.victim, preemption.for_job);
        let victim = view
            .running
            .iter()
            .find(|r| r.id == victim_id && r.epoch == preemption.epoch)
            .ok_or_else(|| format!("victim j{victim_id} does not run attempt {}", preemption.epoch.0))?;
        let job = pending
            .get(&for_id)
            .ok_or_else(|| format!("j{victim_id} is preempted for j{for_id}, which does not wait"))?;
        if victim.preempting || !seen.insert(victim_id) {
            return Err(format!("j{victim_id} is preempted again (for j{for_id})"));
        }
        if starting.contains(&for_id) {
            return Err(format!("j{victim_id} is preempted for j{for_id}, which starts now"));
        }
        may_take((policy, now), victim, job)?;
        *waits_on.entry(for_id).or_default() += 1;
    }
    for (job_id, n_victims) in waits_on {
        let gpus = pending.get(&job_id).map_or(0, |job| job.total_gpus());
        if n_victims > gpus {
            return Err(too_many_victims(view, plan, job_id, (n_victims, gpus)));
        }
    }
    Ok(())
}

/// `job` may take `victim` back: burst work it does not rank below, or a
/// lower class where its QoS preempts them, never its own team's twin;
/// or, under LAS order, its own team's work of a later queue.
fn may_take((policy, now): (&Policy, Timestamp), victim: &super::RunningJob, job: &PendingJob) -> Result<(), String> {
    let sharing = &policy.sharing;
    let (victim_id, for_id) = (victim.id, job.id);
    if sharing.las.as_ref().is_some_and(|las| las.takes_back(victim, job, now)) {
        return Ok(());
    }
    let qos_of = |name: &str| sharing.qos(name).map_or(0, |qos| qos.priority);
    let lower = qos_of(&victim.qos) < qos_of(&job.shape.qos);
    let preempts_lower = sharing.qos(&job.shape.qos).is_some_and(|qos| qos.preempt_lower);
    let outranks = sharing
        .qos(&victim.qos)
        .is_some_and(|qos| qos.preempt_lower && qos.priority > qos_of(&job.shape.qos));
    if !(victim.burst && !outranks || preempts_lower && lower) {
        return Err(format!("j{victim_id} is work of a class j{for_id} may not preempt"));
    }
    let twin = victim.team == job.shape.team.as_str()
        && sharing.qos(&victim.qos).map(|q| &q.name) == sharing.qos(&job.shape.qos).map(|q| &q.name)
        && policy.pool(&victim.pool).map(|p| &p.name) == policy.pool(&job.shape.pool).map(|p| &p.name)
        && victim.gpu_types == job.shape.gpu_types
        && victim.gpus() == job.total_gpus();
    if twin {
        return Err(format!("j{victim_id} is preempted for its twin j{for_id}"));
    }
    Ok(())
}

/// Says which victims job `job_id` waits on, beyond its GPUs.
fn too_many_victims(view: &ClusterView, plan: &Plan, job_id: JobId, (n_victims, gpus): (u64, u64)) -> String {
    let of = |r: &super::RunningJob| format!("j{}{:?}", r.id, r.placement);
    let in_grace: Vec<String> = view
        .running
        .iter()
        .filter(|r| r.preempting && r.preempted_for == Some(job_id))
        .map(of)
        .collect();
    let promised: Vec<String> = view
        .promised
        .iter()
        .filter(|r| r.preempted_for == Some(job_id))
        .map(of)
        .collect();
    let new: Vec<JobId> = plan
        .preemptions
        .iter()
        .filter(|p| p.for_job == job_id)
        .map(|p| p.victim)
        .collect();
    format!(
        "j{job_id} waits on {n_victims} victims for its {gpus} GPU(s): in their grace {in_grace:?}, \
         promised {promised:?}, new {new:?}"
    )
}
