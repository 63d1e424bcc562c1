//! The state task: applies commands in batches, writes what they touched
//! to sled, and hands their replies to the flusher, which answers them once
//! a flush covers them.

use super::*;

/// Handles the API and the scheduling loop use to reach the state task.
#[derive(Clone)]
pub struct StateHandle {
    pub shared: SharedState,
    pub commands: mpsc::Sender<Command>,
    /// For agents' links: what comes this way is applied ahead of
    /// `commands`.
    pub agent_commands: mpsc::Sender<Command>,
    /// Ids of jobs whose state changed.
    pub job_changes: broadcast::Sender<JobId>,
    /// Woken when something happened that the scheduler should look at.
    pub sched_wakeup: Arc<Notify>,
}

impl StateHandle {
    pub async fn call<T>(&self, make: impl FnOnce(Reply<T>) -> Command) -> Result<T, Error> {
        let (reply, answer) = oneshot::channel();
        self.commands.send(make(reply)).await.map_err(|_| Error::ShuttingDown)?;
        answer.await.map_err(|_| Error::ShuttingDown)?
    }
}

impl Command {
    /// Whether applying it may change what a scheduling cycle sees, beside
    /// what it writes (`Write::seen_by_scheduler`): not so for the
    /// scheduler's own words, heartbeats, an attempt's report that it
    /// started (the cycle placed it already), tokens, messages to agents,
    /// and ticks (a heartbeat or tick that changes anything writes it).
    fn may_change_schedule(&self) -> bool {
        !matches!(
            self,
            Command::Planned(_)
                | Command::AgentHeartbeat { .. }
                | Command::AgentJobEvent {
                    event: AgentEvent {
                        outcome: AttemptOutcome::Started,
                        ..
                    },
                    ..
                }
                | Command::CreateToken { .. }
                | Command::RevokeToken { .. }
                | Command::Tick
                | Command::ToAgent { .. }
                | Command::PowerTick { .. }
                | Command::PowerFailed { .. }
                | Command::PowerSuspended { .. }
        )
    }

    /// Whether someone waits on its answer (a user, a CI script, an
    /// admin): not the agents' reports, the scheduler's starts and words,
    /// or timers.
    fn awaited_by_caller(&self) -> bool {
        !matches!(
            self,
            Command::Planned(_)
                | Command::Start { .. }
                | Command::Preempt { .. }
                | Command::AgentRegister { .. }
                | Command::AgentHeartbeat { .. }
                | Command::AgentJobEvent { .. }
                | Command::AgentGone { .. }
                | Command::Tick
                | Command::PowerTick { .. }
                | Command::PowerFailed { .. }
                | Command::PowerSuspended { .. }
                | Command::ToAgent { .. }
        )
    }
}

/// Most commands applied between two flushes.
const MAX_BATCH: usize = 4096;
/// Agents' events and the scheduler's starts that come within this long
/// of the last batch written (a busy pool's stream of starts and ends)
/// wait `GATHER` for more to share their batch: one write, one flush and
/// one scheduling cycle for several instead of each. A caller's command
/// never waits.
const BUSY_WITHIN: std::time::Duration = std::time::Duration::from_millis(3);
const GATHER: std::time::Duration = std::time::Duration::from_millis(2);

/// Adds to `batch` what comes in `GATHER`, until a caller's command comes.
async fn gather(
    batch: &mut Vec<Command>,
    (agent_inbox, inbox): (&mut mpsc::Receiver<Command>, &mut mpsc::Receiver<Command>),
    (agents_gone, callers_gone): (&mut bool, &mut bool),
) {
    let until = tokio::time::Instant::now() + GATHER;
    while batch.len() < MAX_BATCH {
        tokio::select! {
            _ = tokio::time::sleep_until(until) => return,
            command = agent_inbox.recv(), if !*agents_gone => match command {
                Some(command) => batch.push(command),
                None => *agents_gone = true,
            },
            command = inbox.recv(), if !*callers_gone => match command {
                Some(command) => {
                    let from_caller = command.awaited_by_caller();
                    batch.push(command);
                    if from_caller {
                        return;
                    }
                }
                None => *callers_gone = true,
            },
        }
    }
}

/// How the state task talks to the rest besides replies. It holds no sender
/// of its own inbox: it ends once every `StateHandle` is gone, or once `stop`
/// turns true (then it refuses new commands and finishes the queued ones).
pub struct Notifiers {
    pub job_changes: broadcast::Sender<JobId>,
    pub sched_wakeup: Arc<Notify>,
    pub stop: tokio::sync::watch::Receiver<bool>,
}

/// The state task: applies commands in batches, writes them to sled, and
/// hands replies to the flusher. Returns when every sender is gone.
pub async fn run_state_task(
    shared: SharedState,
    notifiers: Notifiers,
    store: Store,
    (mut agent_inbox, mut inbox): (mpsc::Receiver<Command>, mpsc::Receiver<Command>),
    flusher: std::sync::mpsc::Sender<Vec<PendingReply>>,
    clock: fn() -> Timestamp,
) -> Result<(), Error> {
    let mut notifiers = notifiers;
    let mut batch = Vec::with_capacity(MAX_BATCH);
    let mut closed = false;
    let (mut agents_gone, mut callers_gone) = (false, false);
    let mut evict_due = false;
    // When the last batch without a caller's command was written: work of
    // agents and of the scheduler that comes right after waits a moment
    // for more.
    let mut written_at: Option<std::time::Instant> = None;
    loop {
        // What agents said goes first (heartbeats keep nodes alive, and
        // their leases; job events free GPUs), then API work to fill the
        // batch: a queue of API commands never holds a heartbeat up.
        take_queued(&mut agent_inbox, &mut batch);
        take_queued(&mut inbox, &mut batch);
        if written_at.is_some_and(|at| at.elapsed() < BUSY_WITHIN) && !batch.iter().any(Command::awaited_by_caller) {
            let inboxes = (&mut agent_inbox, &mut inbox);
            gather(&mut batch, inboxes, (&mut agents_gone, &mut callers_gone)).await;
        }
        if batch.is_empty() {
            if agents_gone && callers_gone {
                return Ok(());
            }
            tokio::select! {
                biased;
                command = agent_inbox.recv(), if !agents_gone => match command {
                    Some(command) => batch.push(command),
                    None => agents_gone = true,
                },
                command = inbox.recv(), if !callers_gone => match command {
                    Some(command) => batch.push(command),
                    None => callers_gone = true,
                },
                _ = notifiers.stop.wait_for(|stop| *stop), if !closed => {
                    inbox.close();
                    agent_inbox.close();
                    closed = true;
                }
            }
            continue;
        }
        // What follows a caller's batch (the starts a submit leads to)
        // is not held: a user waits on it.
        let callers = batch.iter().any(Command::awaited_by_caller);
        let (mut out, schedule_changed) = apply_batch(&shared, &mut batch, evict_due, clock());
        let written = write_batch(&shared, &store, &mut out);
        written_at = (!callers).then(std::time::Instant::now);
        evict_due = written.is_ok();
        if let Err(err) = written {
            for reply in out.replies {
                reply(Err(Error::Storage(err.to_string())));
            }
            return Err(err);
        }
        watch_after_flush(&notifiers.job_changes, &mut out);
        if schedule_changed {
            notifiers.sched_wakeup.notify_one();
        }
        if !out.replies.is_empty() && flusher.send(out.replies).is_err() {
            return Err(Error::Storage("the flusher stopped".into()));
        }
    }
}

/// Moves commands already queued in `inbox` into `batch`, up to MAX_BATCH.
fn take_queued(inbox: &mut mpsc::Receiver<Command>, batch: &mut Vec<Command>) {
    while batch.len() < MAX_BATCH {
        match inbox.try_recv() {
            Ok(command) => batch.push(command),
            Err(_) => break,
        }
    }
}

/// Applies `batch` under the write lock; also says whether the schedule changed.
fn apply_batch(shared: &SharedState, batch: &mut Vec<Command>, evict_due: bool, now: Timestamp) -> (Batch, bool) {
    let mut out = Batch::default();
    let mut state = shared.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    // Ended jobs leave memory once their records are written: those of
    // the batch before (a reader finds each in one place or the other).
    if evict_due {
        state.evict_ended();
    }
    let mut may_change_schedule = false;
    for command in batch.drain(..) {
        may_change_schedule |= command.may_change_schedule();
        apply_command(&mut state, command, now, &mut out);
    }
    let schedule_changed = may_change_schedule || out.writes.iter().any(Write::seen_by_scheduler);
    if schedule_changed {
        state.sched_generation += 1;
    }
    drop(state);
    (out, schedule_changed)
}

/// Writes the batch's records under a read lock, and queues its messages
/// for delivery after the flush.
fn write_batch(shared: &SharedState, store: &Store, out: &mut Batch) -> Result<(), Error> {
    // Records are encoded and written under a read lock: API readers go
    // on meanwhile, and nothing else writes the state (this task is its
    // only writer).
    let state = shared.read().unwrap_or_else(|poisoned| poisoned.into_inner());
    let written = write_all(store, &state, &out.writes);
    if !out.messages.is_empty() {
        out.replies
            .push(state.deliver_after_flush(std::mem::take(&mut out.messages)));
    }
    drop(state);
    written
}

/// Queues the news of the batch's changed jobs for after the flush.
fn watch_after_flush(job_changes: &broadcast::Sender<JobId>, out: &mut Batch) {
    if !out.changed.is_empty() {
        // Watchers hear of a change only once it is durable.
        let job_changes = job_changes.clone();
        let changed = std::mem::take(&mut out.changed);
        out.replies.push(Box::new(move |flushed: Result<(), Error>| {
            if flushed.is_ok() {
                changed.into_iter().for_each(|id| drop(job_changes.send(id)));
            }
        }));
    }
}

/// Applies one command to the state, adding its writes and replies to `out`.
// Long by design: one match arm per command, each a short call into the
// state; splitting it would only add indirection.
fn apply_command(state: &mut State, command: Command, now: Timestamp, out: &mut Batch) {
    match command {
        Command::Submit { caller, specs, reply } => match state.submit(&caller, specs, now) {
            Ok((ids, writes)) => {
                out.writes.extend(writes);
                out.replies.push(deferred(reply, ids));
            }
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::Cancel {
            caller,
            ids,
            mode,
            reply,
        } => match state.cancel(&caller, &ids, mode, now, out) {
            Ok(outcomes) => out.replies.push(deferred(reply, outcomes)),
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::Update {
            caller,
            ids,
            change,
            reply,
        } => match state.update(&caller, &ids, change, out) {
            Ok(outcomes) => out.replies.push(deferred(reply, outcomes)),
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::Drain {
            caller,
            node,
            reason,
            at_once,
            gpu: Some(gpu),
            reply,
        } => match state.set_gpu_drain(&caller, &node, gpu, Some((reason, at_once)), now, out) {
            Ok(node) => out.replies.push(deferred(reply, node)),
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::Drain {
            caller,
            node,
            reason,
            at_once,
            gpu: None,
            reply,
        } => {
            let drained = state.set_drain(&caller, &node, Some(reason), now);
            if at_once && drained.is_ok() {
                let why = format!("{node} was drained at once");
                state.requeue_jobs_on(&node, (gpool_core::model::RequeueCause::Requeued, &why), now, out);
            }
            node_reply(drained, reply, out)
        }
        Command::Reservation { caller, change, reply } => match state.change_reservation(&caller, change, now, out) {
            Ok(reservation) => out.replies.push(deferred(reply, reservation)),
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::RemoveNode { caller, node, reply } => match state.remove_node(&caller, &node, out) {
            Ok(()) => out.replies.push(deferred(reply, node)),
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::Resume {
            caller,
            node,
            gpu: Some(gpu),
            reply,
        } => match state.set_gpu_drain(&caller, &node, gpu, None, now, out) {
            Ok(node) => out.replies.push(deferred(reply, node)),
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::Resume {
            caller,
            node,
            gpu: None,
            reply,
        } => node_reply(state.set_drain(&caller, &node, None, now), reply, out),
        Command::Planned(words) => {
            state.words = *words;
            state.lend_task_reasons_to_arrays();
        }
        Command::Start { starts } => state.start(starts, now, out),
        Command::Preempt {
            preemptions,
            holds,
            rescinds,
        } => {
            state.carry_out(&preemptions, &holds, &rescinds, now, out);
        }
        Command::Reload {
            caller,
            config,
            revoked,
            reply,
        } => drop(reply.send(state.reload(caller.as_ref(), *config, &revoked))),
        Command::CreateToken { caller, request, reply } => match state.create_token(&caller, request, now) {
            Ok((record, text, writes)) => {
                out.writes.extend(writes);
                out.replies.push(deferred(reply, (record, text)));
            }
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::RevokeToken { caller, id, reply } => match state.revoke_token(&caller, id, now) {
            Ok((record, writes)) => {
                out.writes.extend(writes);
                out.replies.push(deferred(reply, record));
            }
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::Checkpoint {
            caller,
            job,
            attempt,
            reply,
        } => match state.checkpoint(&caller, job, attempt, now, out) {
            Ok(outcome) => out.replies.push(deferred(reply, outcome)),
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::AgentRegister {
            node,
            running,
            ended,
            conn,
            reply,
        } => match state.register_agent(node, running, ended, conn, now, out) {
            Ok(()) => out.replies.push(deferred(reply, ())),
            Err(err) => drop(reply.send(Err(err))),
        },
        Command::AgentHeartbeat {
            node,
            conn_id,
            samples,
            seq,
            xids,
            mps_faults,
            health_check,
            spool_short,
            readings_stuck,
        } => {
            if state.is_current_link(&node, conn_id) {
                state.heartbeat(&node, conn_id);
                state.grant_lease(&node, seq);
                state.assess_health(&node, &samples, (&xids, &mps_faults), health_check, now, out);
                state.assess_agent_drain(&node, health::SPOOL_DRAIN, &spool_short, now, out);
                state.assess_agent_drain(&node, health::READINGS_DRAIN, &readings_stuck, now, out);
                state.count_gpu_use(&node, &samples);
                state.gpu_samples.insert(node.clone(), samples);
                state.find_stragglers(&node, now, out);
            }
        }
        Command::AgentJobEvent { node, conn_id, event } => state.agent_event(&node, conn_id, event, now, out),
        Command::AgentGone { node, conn_id } => state.agent_gone(&node, conn_id, now),
        Command::PowerTick { reply } => drop(reply.send(Ok(state.power_tick(now)))),
        Command::PowerFailed { program, nodes, why } => state.power_program_failed(program, &nodes, &why, now, out),
        Command::PowerSuspended { nodes } => {
            for node in nodes {
                state.power.suspend_done(&node, now);
            }
        }
        Command::Tick => {
            state.end_unmeetable_dependencies(now, out);
            state.mark_silent_nodes_down(now, out);
            state.enforce_preemption_grace(now, out);
            state.remove_old_ended_jobs(now, out);
        }
        Command::ToAgent { node, message, reply } => drop(reply.send(state.send_now(&node, message))),
    }
}

fn node_reply(result: Result<(Node, Vec<Write>), Error>, reply: Reply<Node>, out: &mut Batch) {
    match result {
        Ok((node, writes)) => {
            out.writes.extend(writes);
            out.replies.push(deferred(reply, node));
        }
        Err(err) => drop(reply.send(Err(err))),
    }
}

fn write_all(store: &Store, state: &State, writes: &[Write]) -> Result<(), Error> {
    // Encoded a part at a time: a large batch goes on to its redo log as
    // it is encoded.
    let mut commit = store.begin();
    // A job touched many times in a batch (an array's record as its tasks
    // end) is encoded once.
    let mut jobs_written = std::collections::HashSet::new();
    for write in writes {
        match write {
            Write::Job(id) if !jobs_written.insert(*id) => {}
            // Its environment's set may be new: the commit looks it up.
            Write::Job(id) => {
                if let Some(job) = state.jobs.get(id) {
                    commit.job(job)?;
                }
            }
            Write::Node(name) | Write::NodeFaultSeen(name) => state
                .nodes
                .get(name)
                .into_iter()
                .for_each(|node| commit.records.node(node)),
            Write::ForgetNode(name) => commit.records.remove_node(name),
            // Brought back into memory since (a new dependency): kept.
            Write::ForgetJob(id, _) if state.jobs.contains_key(id) => {}
            Write::ForgetJob(id, ended_at) => commit.records.remove_job(*id, *ended_at),
            Write::NextJobId => commit.records.next_job_id(state.next_job_id),
            Write::NextEpoch => commit.records.next_epoch(state.next_epoch),
            Write::Usage(team) => state
                .usage
                .get(team)
                .into_iter()
                .for_each(|ledger| commit.records.usage(team, ledger)),
            Write::Token(id) => state
                .tokens
                .get(id)
                .into_iter()
                .for_each(|record| commit.records.token(record)),
            Write::Attempt(record) => commit.records.attempt(record),
            Write::Reservations => commit.records.reservations(&state.created_reservations),
        }
        commit.spill_if_full()?;
    }
    commit.finish()?;
    // Housekeeping once the batch is written: a failure only leaves
    // unused sets for the next try.
    if let Err(err) = store.collect_env_sets_if_due() {
        tracing::warn!("removing unused environment sets: {err}");
    }
    Ok(())
}

/// The flusher: one blocking thread that makes a batch durable with one
/// `flush`, then answers it; `took` records each flush's time. Returns
/// the error that stopped it, if any.
pub fn run_flusher(
    db: sled::Db,
    batches: std::sync::mpsc::Receiver<Vec<PendingReply>>,
    took: prometheus_client::metrics::histogram::Histogram,
) -> Result<(), Error> {
    while let Ok(first) = batches.recv() {
        let mut replies = first;
        while let Ok(more) = batches.try_recv() {
            replies.extend(more);
        }
        let started = std::time::Instant::now();
        let flushed = db.flush();
        took.observe(started.elapsed().as_secs_f64());
        match flushed {
            Ok(_) => replies.into_iter().for_each(|reply| reply(Ok(()))),
            Err(err) => {
                let message = err.to_string();
                replies
                    .into_iter()
                    .for_each(|reply| reply(Err(Error::Storage(message.clone()))));
                return Err(Error::Storage(message));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::{AgentEvent, AttemptOutcome};
    use super::Command;
    use gpool_core::job_state::ExitStatus;
    use gpool_core::{Epoch, JobId};

    fn report(outcome: AttemptOutcome) -> Command {
        Command::AgentJobEvent {
            node: "n1".into(),
            conn_id: 1,
            event: AgentEvent {
                job: JobId(1),
                epoch: Epoch(1),
                outcome,
            },
        }
    }

    #[test]
    fn agents_reports_and_timers_have_no_caller_waiting() {
        assert!(!report(AttemptOutcome::Started).awaited_by_caller());
        assert!(!report(AttemptOutcome::Exited(ExitStatus::Code(0))).awaited_by_caller());
        assert!(!Command::Tick.awaited_by_caller());
    }

    #[test]
    fn an_attempt_that_started_wakes_no_cycle_and_one_that_ended_does() {
        assert!(!report(AttemptOutcome::Started).may_change_schedule());
        assert!(report(AttemptOutcome::Exited(ExitStatus::Code(0))).may_change_schedule());
        assert!(report(AttemptOutcome::FailedToStart("x".into())).may_change_schedule());
    }
}
