//! Running job attempts: each through a supervisor process (`supervise.rs`)
//! that leads its own session, confined to its GPUs by
//! `CUDA_VISIBLE_DEVICES`, output to files in the spool dir, time limit
//! enforced, killed as a whole group. The running attempts are kept in the
//! journal (`journal.rs`), so a restarted agent re-adopts them. An attempt's
//! output goes to `<spool>/jobs/<job>.<attempt>.{out,err}` (up to the
//! node's `max_output`), its checkpoints to `<spool>/checkpoints/<job>/`,
//! its exit record to a reused slot `<state>/exits/<n>`. The state dir
//! (the spool unless agent.toml names another) also holds the lease and
//! the journal.

use crate::cgroup::Isolation;
use crate::journal::{AttemptRecord as RunningAttempt, Journal};
use crate::supervise::{Ended, LaunchRequest, RunAs, Spawner, SUPERVISOR_BIN};
use gpool_proto::pb;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

mod io;
pub use io::{input_fifo, open_input_fifo};

/// Grace between SIGTERM and SIGKILL for a stale attempt of a job that
/// has a newer one waiting to start here.
const STALE_GRACE: Duration = Duration::from_secs(10);
/// How long after an attempt's time limit and grace the agent ends it
/// itself, should its supervisor not have.
const BACKSTOP_SLACK_MS: i64 = 5_000;
/// A job's grace after its checkpoint signal when it names none.
const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// Where an agent keeps attempts' files, and their caps (agent.toml).
#[derive(Debug, Clone)]
pub struct SpoolDirs {
    pub spool_dir: PathBuf,
    pub state_dir: PathBuf,
    /// The node drains itself while the spool has less free than this.
    pub min_spool_free: u64,
    pub max_output: u64,
    pub max_pids: u64,
}

/// The attempts this node runs, and the events they produce.
pub struct Attempts {
    node: String,
    spool_dir: PathBuf,
    /// The lease, the journal and the exit slots.
    state_dir: PathBuf,
    /// Each attempt's cap on its stdout and on its stderr, in bytes.
    max_output: u64,
    /// Each attempt's cap on its processes and threads (cgroup pids.max).
    max_pids: u64,
    /// Watches the spool's free space; what it said last (empty: room).
    space: Mutex<(crate::spool::SpaceWatch, String)>,
    /// `gpool-supervise`, started from next to this process's binary.
    spawner: Mutex<Spawner>,
    /// Jobs run as their submitter only when the agent runs as root.
    as_root: bool,
    /// What jobs need to call gpoold (`gpool checkpoint` and any other
    /// `gpool` command): `GPOOL_SERVER`, and `GPOOL_CA` where TLS is used.
    /// Their `GPOOL_TOKEN` comes with each Launch.
    controller_env: Vec<(String, String)>,
    /// USER, LOGNAME, HOME and SHELL of this process's own account, for the
    /// jobs it runs as itself (looked up once).
    own_account: Vec<(String, String)>,
    /// The cgroups this host offers, and the node's GPU indices (all that
    /// an attempt's device rules keep it from, but its own).
    isolation: Isolation,
    cgroup_scope: String,
    node_gpus: crate::gpu::GpuDevices,
    /// `podman` or `docker`: runs jobs that name an image.
    container_runtime: String,
    /// Users looked up lately, and when.
    users: Mutex<std::collections::HashMap<String, (std::time::Instant, Option<RunAs>)>>,
    journal: Mutex<Journal>,
    /// Launches waiting for a stale attempt of the same job to end.
    queued: Mutex<std::collections::HashMap<u64, pb::Launch>>,
    events: mpsc::UnboundedSender<pb::JobEvent>,
    tasks: Mutex<JoinSet<()>>,
    /// Attempts this agent was told to kill (their ends are not their own).
    killed: Mutex<std::collections::HashSet<(u64, u64)>>,
    /// Log reads in progress, by request id; set to stop one.
    log_reads: Mutex<std::collections::HashMap<u64, Arc<std::sync::atomic::AtomicBool>>>,
    /// The latest attempts that ended here, (job, epoch), newest last: a
    /// follower that came before its attempt was running knows when to
    /// stop waiting for it.
    recent_ends: Mutex<std::collections::VecDeque<(u64, u64)>>,
    /// The input FIFO of each interactive attempt this agent started,
    /// held open (read and write) from before its supervisor opens it, so
    /// that keys typed as it starts wait in the pipe.
    terminals: Mutex<std::collections::HashMap<(u64, u64), std::fs::File>>,
}

/// How many ended attempts `recent_ends` remembers.
const RECENT_ENDS: usize = 4096;

impl Attempts {
    /// Fails when `gpool-supervise` is not installed next to this binary or
    /// the journal cannot be read.
    pub fn new(
        node: String,
        controller_env: Vec<(String, String)>,
        dirs: SpoolDirs,
        (isolation, node_gpus, container_runtime): (Isolation, crate::gpu::GpuDevices, String),
        events: mpsc::UnboundedSender<pb::JobEvent>,
    ) -> Result<Arc<Attempts>, String> {
        let exe = std::env::current_exe().map_err(|err| format!("cannot find this program's path: {err}"))?;
        let supervisor = exe.with_file_name(SUPERVISOR_BIN);
        if !supervisor.is_file() {
            return Err(format!(
                "{} is missing: install it next to {}",
                supervisor.display(),
                exe.display()
            ));
        }
        let SpoolDirs {
            spool_dir,
            state_dir,
            min_spool_free,
            max_output,
            max_pids,
        } = dirs;
        create_dir(&state_dir)?;
        let journal = Journal::open(&state_dir)?;
        create_dir(&state_dir.join("exits"))?;
        for dir in ["jobs", "checkpoints"] {
            create_dir(&spool_dir.join(dir))?;
        }
        let space = crate::spool::SpaceWatch::new(spool_dir.join("jobs"), min_spool_free);
        Ok(Arc::new(Attempts {
            as_root: nix::unistd::geteuid().is_root(),
            cgroup_scope: crate::cgroup::scope_of(&spool_dir),
            isolation,
            node_gpus,
            container_runtime,
            controller_env,
            own_account: crate::supervise::own_account(),
            users: Mutex::new(std::collections::HashMap::new()),
            node,
            spool_dir,
            state_dir,
            max_output,
            max_pids,
            space: Mutex::new((space, String::new())),
            spawner: Mutex::new(Spawner::new(supervisor)),
            journal: Mutex::new(journal),
            queued: Mutex::new(std::collections::HashMap::new()),
            events,
            tasks: Mutex::new(JoinSet::new()),
            log_reads: Mutex::new(std::collections::HashMap::new()),
            terminals: Mutex::new(std::collections::HashMap::new()),
            recent_ends: Mutex::new(std::collections::VecDeque::new()),
            killed: Mutex::new(std::collections::HashSet::new()),
        }))
    }

    /// `<state>/lease`: until when this node may run requeueable attempts.
    fn lease_file(&self) -> PathBuf {
        self.state_dir.join("lease")
    }

    /// gpoold answered a heartbeat sent at `sent_boot_ms`: requeueable
    /// attempts may run `fence_after` past it, then get `grace` to end.
    pub fn renew_lease(&self, sent_boot_ms: u64, fence_after: Duration, grace: Duration) {
        let lease = crate::supervise::Lease {
            until_ms: sent_boot_ms + fence_after.as_millis() as u64,
            grace_ms: grace.as_millis() as u64,
        };
        if let Err(err) = lease.write(&self.lease_file()) {
            tracing::error!("cannot renew the lease in {}: {err}", self.lease_file().display());
        }
    }

    /// Once a heartbeat: reads the spool's free space (why it is short,
    /// or empty while it has room), and catches the journal up with what
    /// a full disk kept it from writing.
    pub fn upkeep(&self) -> String {
        let short = {
            let mut space = self.space.lock().unwrap_or_else(|p| p.into_inner());
            let short = space.0.check();
            if short != space.1 {
                if short.is_empty() {
                    tracing::info!("the spool has room again");
                } else {
                    tracing::warn!("{short}: new attempts are refused, and gpoold drains this node");
                }
                space.1 = short.clone();
            }
            short
        };
        self.journal().catch_up();
        short
    }

    /// The ids of the jobs with an attempt here.
    pub fn live_jobs(&self) -> std::collections::BTreeSet<u64> {
        self.journal().live().keys().copied().collect()
    }

    /// `<spool>/jobs`: attempts' output.
    pub fn jobs_dir(&self) -> PathBuf {
        self.spool_dir.join("jobs")
    }

    /// What Register reports.
    pub fn running(&self) -> Vec<pb::RunningAttempt> {
        self.journal()
            .live()
            .values()
            .map(|a| pb::RunningAttempt {
                job_id: a.job_id,
                epoch: a.epoch,
            })
            .collect()
    }

    /// Takes over the attempts a previous agent left in the journal: those
    /// still running are watched again, those that ended are reported.
    pub fn recover(self: &Arc<Self>) {
        let recorded: Vec<RunningAttempt> = self.journal().live().values().cloned().collect();
        for attempt in recorded {
            if let Some(ended) = Ended::read(&attempt.exit_file, attempt.job_id, attempt.epoch) {
                tracing::info!(
                    job = attempt.job_id,
                    "attempt ended while the agent was away: {ended:?}"
                );
                self.ended(&attempt, ended);
            } else if supervisor_alive(attempt.pgid) {
                tracing::info!(job = attempt.job_id, pid = attempt.pgid, "re-adopting running attempt");
                let attempts = self.clone();
                self.spawn_task(async move { attempts.watch(attempt).await });
            } else {
                tracing::warn!(job = attempt.job_id, "attempt vanished without an exit record");
                self.ended(&attempt, Ended::Vanished);
            }
        }
    }

    /// Journals how an attempt ended (kept until gpoold surely has it) and
    /// sends it.
    fn ended(&self, attempt: &RunningAttempt, ended: Ended) {
        let killed = self
            .killed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(attempt.job_id, attempt.epoch));
        // An own end of an attempt this agent killed is recorded as killed.
        let ended = match ended {
            Ended::Code(code) if killed => Ended::Killed(code),
            Ended::Signal(signal) if killed => Ended::KilledBy(signal),
            ended => ended,
        };
        self.journal()
            .ended(attempt.job_id, attempt.epoch, &ended.to_line(), now_ms());
        self.terminals
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(attempt.job_id, attempt.epoch));
        {
            let mut recent = self.recent_ends.lock().unwrap_or_else(|p| p.into_inner());
            if recent.len() == RECENT_ENDS {
                recent.pop_front();
            }
            recent.push_back((attempt.job_id, attempt.epoch));
        }
        let _ = self.events.send(end_event(attempt.job_id, attempt.epoch, ended));
    }

    /// Whether a follower of attempt `epoch` of `job_id` should go on
    /// waiting for more: the attempt runs here, or it has not started yet
    /// (its Launch may still be on its way, for a while) and not ended.
    fn may_write_more(&self, job_id: u64, epoch: u64, asked: std::time::Instant) -> bool {
        if epoch == 0 {
            return false;
        }
        if self.running_epoch(job_id) == Some(epoch) {
            return true;
        }
        let ended = self
            .recent_ends
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains(&(job_id, epoch));
        !ended && asked.elapsed() < LAUNCH_PATIENCE
    }

    /// Ends gpoold may not have yet: every Register carries them.
    pub fn unreported(&self) -> Vec<pb::JobEvent> {
        self.journal()
            .unreported()
            .into_iter()
            .filter_map(|record| {
                let ended = Ended::parse(&record.outcome)?;
                Some(end_event(record.job_id, record.epoch, ended))
            })
            .collect()
    }

    /// A Register that carried these ends succeeded.
    pub fn reported(&self, events: &[pb::JobEvent]) {
        let ends: Vec<(u64, u64)> = events.iter().map(|e| (e.job_id, e.epoch)).collect();
        self.journal().reported(&ends);
    }

    fn journal(&self) -> std::sync::MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The epoch of the attempt of `job_id` running here, if any.
    fn running_epoch(&self, job_id: u64) -> Option<u64> {
        self.journal().live().get(&job_id).map(|a| a.epoch)
    }

    pub fn launch(self: &Arc<Self>, launch: pb::Launch) {
        match self.running_epoch(launch.job_id) {
            Some(epoch) if epoch == launch.epoch => {
                tracing::warn!(
                    job = launch.job_id,
                    epoch,
                    "launch of an attempt already running here; ignored"
                );
                return;
            }
            // gpoold moved on to a new attempt while an old one still runs
            // here (it was fenced off while this node was away): the old one
            // is ended, and the new one starts when it has.
            Some(old_epoch) => {
                tracing::warn!(
                    job = launch.job_id,
                    old_epoch,
                    epoch = launch.epoch,
                    "new attempt waits for the stale one to end"
                );
                self.kill(launch.job_id, old_epoch, STALE_GRACE);
                self.queued
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(launch.job_id, launch);
                return;
            }
            None => {}
        }
        let (job_id, epoch) = (launch.job_id, launch.epoch);
        let short = self.space.lock().unwrap_or_else(|p| p.into_inner()).1.clone();
        if !short.is_empty() {
            // Nothing of it runs: gpoold puts it back in the queue.
            tracing::warn!(job = job_id, epoch, "launch refused: {short}");
            let _ = self.events.send(pb::JobEvent {
                job_id,
                epoch,
                outcome: Some(pb::job_event::Outcome::FailedToStart(format!(
                    "node {} refused it: {short}",
                    self.node
                ))),
                cause: pb::EndCause::NodeRefused as i32,
            });
            return;
        }
        match self.spawn(&launch) {
            Ok((pgid, exit_file)) => {
                tracing::info!(job = job_id, epoch, pid = pgid, "attempt {} started", launch.attempt);
                let deadline_ms = launch.time_limit.map(|limit| now_ms() + limit.seconds as i64 * 1000);
                let attempt = RunningAttempt {
                    job_id,
                    epoch,
                    pgid,
                    exit_file,
                    deadline_ms,
                };
                self.journal().started(attempt.clone());
                self.send(job_id, epoch, pb::job_event::Outcome::Started(true));
                let attempts = self.clone();
                self.spawn_task(async move { attempts.watch(attempt).await });
            }
            Err(reason) => {
                self.terminals
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&(job_id, epoch));
                self.send(job_id, epoch, pb::job_event::Outcome::FailedToStart(reason));
            }
        }
    }

    /// SIGTERM to the attempt's whole process group, SIGKILL after `grace`.
    pub fn kill(self: &Arc<Self>, job_id: u64, epoch: u64, grace: Duration) {
        let attempt = self.journal().live().get(&job_id).cloned();
        let Some(attempt) = attempt.filter(|a| a.epoch == epoch) else {
            return;
        };
        tracing::info!(job = job_id, epoch, "killing attempt");
        self.killed
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((job_id, epoch));
        let attempts = self.clone();
        self.spawn_task(async move { attempts.terminate(&attempt, grace).await });
    }

    /// Sends `signal` to the attempt's whole process group (the supervisor
    /// outlives it; the job gets it).
    pub fn signal(&self, job_id: u64, epoch: u64, signal: i32) {
        let Some(pgid) = self
            .journal()
            .live()
            .get(&job_id)
            .filter(|a| a.epoch == epoch)
            .map(|a| a.pgid)
        else {
            return;
        };
        match Signal::try_from(signal) {
            Ok(signal) => {
                tracing::info!(job = job_id, epoch, "sending {signal}");
                signal_group(pgid, signal);
            }
            Err(_) => tracing::warn!(job = job_id, "signal {signal} is not a signal here; not sent"),
        }
    }

    fn spawn_task(&self, task: impl std::future::Future<Output = ()> + Send + 'static) {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).spawn(task);
    }

    async fn terminate(&self, attempt: &RunningAttempt, grace: Duration) {
        signal_group(attempt.pgid, Signal::SIGTERM);
        tokio::time::sleep(grace).await;
        if self.running_epoch(attempt.job_id) == Some(attempt.epoch) {
            // Everything but the supervisor, which then records the end,
            // kills what is left in the cgroup and removes a container.
            let cgroup = self.isolation.rules_for(
                &self.cgroup_scope,
                (attempt.job_id, attempt.epoch),
                (&[], &[]),
                crate::cgroup::Limits::default(),
            );
            kill_all_but_supervisor(attempt.pgid, cgroup.as_ref());
        }
    }

    /// Waits for the attempt's supervisor to end (ours or one a previous
    /// agent started).
    async fn watch(self: &Arc<Self>, attempt: RunningAttempt) {
        let exited = match ProcessExit::open(attempt.pgid) {
            Ok(exited) => exited,
            Err(err) => {
                // No pidfd (e.g. out of file descriptors): poll instead.
                tracing::warn!(
                    job = attempt.job_id,
                    "cannot open a pidfd for {}: {err}; polling",
                    attempt.pgid
                );
                ProcessExit::Polled(attempt.pgid)
            }
        };
        // The supervisor enforces the time limit (it outlives this agent).
        // A supervisor of an older gpool does not: well past its limit and
        // grace, the attempt is ended here.
        let backstop = attempt.deadline_ms.map(|deadline| {
            let at = deadline + crate::supervise::TIME_LIMIT_GRACE_MS as i64 + BACKSTOP_SLACK_MS;
            Duration::from_millis((at - now_ms()).max(0) as u64)
        });
        let in_time = match backstop {
            None => {
                exited.wait().await;
                true
            }
            Some(limit) => tokio::time::timeout(limit, exited.wait()).await.is_ok(),
        };
        if !in_time {
            tracing::warn!(
                job = attempt.job_id,
                "its supervisor did not end it at its time limit; ending it"
            );
            self.terminate(&attempt, STALE_GRACE).await;
            exited.wait().await;
        }
        self.finish(&attempt);
    }

    /// The supervisor is gone: record and report how the attempt ended,
    /// then start an attempt that waited for this one.
    fn finish(self: &Arc<Self>, attempt: &RunningAttempt) {
        // Anything left in the group goes with it.
        signal_group(attempt.pgid, Signal::SIGKILL);
        // No exit record means the supervisor itself was killed (SIGKILL).
        let ended = Ended::read(&attempt.exit_file, attempt.job_id, attempt.epoch).unwrap_or(Ended::Vanished);
        tracing::info!(job = attempt.job_id, epoch = attempt.epoch, "attempt ended: {ended:?}");
        self.ended(attempt, ended);
        let queued = self
            .queued
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&attempt.job_id);
        if let Some(launch) = queued {
            self.launch(launch);
        }
    }

    fn send(&self, job_id: u64, epoch: u64, outcome: pb::job_event::Outcome) {
        let _ = self.events.send(pb::JobEvent {
            job_id,
            epoch,
            outcome: Some(outcome),
            cause: pb::EndCause::Own as i32,
        });
    }

    /// A `-o/-e` pattern expanded for this node and rank; relative paths
    /// are under the job's workdir. `None` for an empty pattern.
    fn output_file(&self, launch: &pb::Launch, pattern: &str) -> Result<Option<PathBuf>, String> {
        if pattern.is_empty() {
            return Ok(None);
        }
        let fields = gpool_core::array::OutputFields {
            job: launch.job_id,
            array: (launch.array_job_id != 0).then_some(launch.array_job_id),
            task_index: launch.array_task_index,
            node: &self.node,
            rank: launch.node_rank,
            user: &launch.user,
            name: &launch.job_name,
        };
        let path = PathBuf::from(gpool_core::array::expand_output_pattern(pattern, &fields));
        if path.is_absolute() {
            return Ok(Some(path));
        }
        match launch.workdir.as_str() {
            "" => Err(format!(
                "the output file {} is relative, and the job has no workdir",
                path.display()
            )),
            workdir => Ok(Some(Path::new(workdir).join(path))),
        }
    }

    /// Starts the attempt's supervisor; returns its pid and exit file.
    fn spawn(&self, launch: &pb::Launch) -> Result<(i32, PathBuf), String> {
        if launch.command.first().is_none_or(String::is_empty) {
            return Err("the command is empty".into());
        }
        let checkpoint_dir = self.spool_dir.join("checkpoints").join(launch.job_id.to_string());
        let workdir = (!launch.workdir.is_empty()).then(|| PathBuf::from(&launch.workdir));
        let run_as = self.run_as(&launch.user)?;
        // Checked here only for jobs that run as this agent's user on the
        // host; another user's job enters its workdir with its own rights
        // (supervisor), and a container's is inside the image.
        let in_container = !launch.image.is_empty();
        if let Some(workdir) = workdir
            .as_ref()
            .filter(|dir| run_as.is_none() && !in_container && !dir.is_dir())
        {
            return Err(format!(
                "workdir {} does not exist on node {}",
                workdir.display(),
                self.node
            ));
        }
        let exit_file = self.free_exit_slot();
        // A job token in a job that runs as the agent's user, beside other
        // users' jobs, could be read by them: only jobs run as their own
        // user get one.
        let mut env: Vec<(String, String)> = launch
            .env
            .iter()
            .filter(|var| self.as_root || var.name != "GPOOL_TOKEN")
            .map(|var| (var.name.clone(), var.value.clone()))
            .chain(attempt_env(launch, &self.node, &self.node_gpus, &checkpoint_dir))
            .chain(self.controller_env.iter().cloned())
            .collect();
        if !in_container {
            with_gpool_on_path(&mut env);
            // As a login would: the account's USER, LOGNAME, HOME and SHELL
            // (the user's own where the job runs as one; the supervisor sets
            // those), and a PATH where the job brought none.
            if run_as.is_none() {
                env.extend(self.own_account.iter().cloned());
            }
        }
        let limits = crate::cgroup::Limits {
            mem_bytes: (launch.mem_bytes > 0).then_some(launch.mem_bytes),
            cpus: (launch.cpus_per_gpu > 0).then(|| {
                launch
                    .cpus_per_gpu
                    .saturating_mul(launch.gpu_indices.len().max(1) as u32)
            }),
            pids: (self.max_pids > 0).then_some(self.max_pids),
        };
        let env_file = in_container.then(|| attempt_file(&self.spool_dir, launch.job_id, launch.attempt, "env"));
        let (program, args, workdir, cleanup) = if let Some(env_file) = &env_file {
            let name = format!("gpool-{}-{}-{}", self.cgroup_scope, launch.job_id, launch.epoch);
            for (key, value) in &mut env {
                if key == "CUDA_VISIBLE_DEVICES" {
                    *value = crate::container::visible_devices(launch.gpu_indices.len());
                }
            }
            let job = crate::container::ContainerJob {
                runtime: &self.container_runtime,
                name: &name,
                image: &launch.image,
                command: &launch.command,
                env_file,
                user: run_as.as_ref().map(|user| (user.uid, user.gid)),
                workdir: workdir.as_deref(),
                checkpoint_dir: &checkpoint_dir,
                devices: crate::container::gpu_devices(
                    &self.node_gpus.names(&launch.gpu_indices),
                    &self.node_gpus.minors(&launch.gpu_indices),
                ),
                limits,
            };
            let cleanup = job.cleanup_args();
            (self.container_runtime.clone(), job.run_args(), None, Some(cleanup))
        } else {
            let command = self.with_script_copy(launch, run_as.as_ref())?;
            (command[0].clone(), command[1..].to_vec(), workdir, None)
        };
        // Opened by the job's user after the switch: a container runtime
        // stays the agent's user, so its jobs get none.
        if in_container && !(launch.stdout_path.is_empty() && launch.stderr_path.is_empty()) {
            return Err("a container job's output stays in the spool: -o/-e are for jobs on the host".into());
        }
        if launch.pty.is_some() && (in_container || launch.discard_output || !launch.stdout_path.is_empty()) {
            return Err("an interactive job runs on the host, its terminal's output in the spool".into());
        }
        if launch.pty.is_some() {
            // Keys typed before this Launch came made it already.
            let mut terminals = self.terminals.lock().unwrap_or_else(|p| p.into_inner());
            if let std::collections::hash_map::Entry::Vacant(entry) = terminals.entry((launch.job_id, launch.epoch)) {
                entry.insert(open_input_fifo(&input_fifo(
                    &self.spool_dir,
                    launch.job_id,
                    launch.epoch,
                ))?);
            }
        }
        let user_stdout = self.output_file(launch, &launch.stdout_path)?;
        let user_stderr = self.output_file(launch, &launch.stderr_path)?;
        let request = LaunchRequest {
            exit_file: exit_file.clone(),
            job_id: launch.job_id,
            epoch: launch.epoch,
            program,
            args,
            env,
            workdir,
            container_cleanup: cleanup,
            container_env_file: env_file,
            time_limit_ms: launch.time_limit.map(|limit| limit.seconds.saturating_mul(1000)),
            max_output: Some(match launch.max_output_bytes {
                0 => self.max_output,
                asked => asked.min(self.max_output),
            }),
            pty: launch.pty.map(|size| crate::terminal::Pty {
                rows: size.rows.clamp(1, u32::from(u16::MAX)) as u16,
                cols: size.cols.clamp(1, u32::from(u16::MAX)) as u16,
                input: input_fifo(&self.spool_dir, launch.job_id, launch.epoch),
            }),
            fence: launch.requeue.then(|| crate::supervise::Fence {
                lease_file: self.lease_file(),
                signal: if launch.checkpoint_signal > 0 {
                    launch.checkpoint_signal
                } else {
                    Signal::SIGTERM as i32
                },
                grace_ms: if launch.grace_seconds > 0 {
                    u64::from(launch.grace_seconds) * 1000
                } else {
                    DEFAULT_GRACE.as_millis() as u64
                },
            }),
            // The supervisor creates these (each new file or directory costs
            // the filesystem inode work, which the spawner need not wait for).
            stdout: (!launch.discard_output && user_stdout.is_none())
                .then(|| attempt_file(&self.spool_dir, launch.job_id, launch.attempt, "out")),
            stderr: (!launch.discard_output && user_stderr.is_none())
                .then(|| attempt_file(&self.spool_dir, launch.job_id, launch.attempt, "err")),
            user_stdout,
            user_stderr,
            append_output: launch.attempt > 1,
            checkpoint_dir,
            run_as,
            cgroup: self.isolation.rules_for(
                &self.cgroup_scope,
                (launch.job_id, launch.epoch),
                (
                    &self.node_gpus.minors(&launch.gpu_indices),
                    &self.node_gpus.all_minors(),
                ),
                limits,
            ),
        };
        let pid = self
            .spawner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .launch(&request)?;
        Ok((pid, exit_file))
    }
}

/// What a new exit slot holds until its first record: room for one
/// (no record parses from it).
const EXIT_SLOT_ROOM: [u8; 512] = {
    let mut room = [b' '; 512];
    room[511] = b'\n';
    room
};

/// How long a follower waits for an attempt this agent does not run yet
/// (its Launch may be on its way) to create its output file.
const LAUNCH_PATIENCE: Duration = Duration::from_secs(5);

/// `<spool>/jobs/<job>.<attempt>.<suffix>`: an attempt's out, err or exit file.
pub fn attempt_file(spool_dir: &Path, job_id: u64, attempt: u32, suffix: &str) -> PathBuf {
    spool_dir.join("jobs").join(format!("{job_id}.{attempt}.{suffix}"))
}

/// A directory that may already exist; only a missing one costs a mkdir.
fn create_dir(dir: &Path) -> Result<(), String> {
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).map_err(|err| format!("{}: {err}", dir.display()))
}

impl Attempts {
    /// Whom a job of `user` runs as: that user when the agent runs as root
    /// (looked up at most once a minute), else the agent's own user.
    fn run_as(&self, user: &str) -> Result<Option<RunAs>, String> {
        const FRESH: Duration = Duration::from_secs(60);
        if !self.as_root || user.is_empty() {
            return Ok(None);
        }
        let mut users = self.users.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((looked_up, run_as)) = users.get(user) {
            if looked_up.elapsed() < FRESH {
                return Ok(run_as.clone());
            }
        }
        let run_as = RunAs::lookup(user).map_err(|err| format!("{err} (node {})", self.node))?;
        users.insert(user.to_string(), (std::time::Instant::now(), run_as.clone()));
        Ok(run_as)
    }

    /// The command of `launch`, with a batch script's copy (as it was at
    /// submit, written to `<spool>/jobs/<job>.<attempt>.script`, the job's
    /// user's) in place of the script's path.
    fn with_script_copy(&self, launch: &pb::Launch, run_as: Option<&RunAs>) -> Result<Vec<String>, String> {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let mut command = launch.command.clone();
        let Some(script) = &launch.script else {
            return Ok(command);
        };
        let Some(word) = command.get_mut(script.at as usize) else {
            return Err(format!(
                "the batch script's place ({}) is not in the command",
                script.at
            ));
        };
        let path = attempt_file(&self.spool_dir, launch.job_id, launch.attempt, "script");
        let written = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o700)
            .open(&path)
            .and_then(|mut file| {
                file.set_permissions(std::fs::Permissions::from_mode(0o700))?;
                std::io::Write::write_all(&mut file, script.text.as_bytes())
            })
            .and_then(|()| match run_as {
                Some(user) => std::os::unix::fs::chown(&path, Some(user.uid), Some(user.gid)),
                None => Ok(()),
            });
        written.map_err(|err| format!("{}: cannot write the batch script: {err}", path.display()))?;
        *word = path.display().to_string();
        Ok(command)
    }

    /// The lowest-numbered exit slot no running attempt holds.
    fn free_exit_slot(&self) -> PathBuf {
        let exits = self.state_dir.join("exits");
        let journal = self.journal();
        let held: std::collections::BTreeSet<&Path> = journal.live().values().map(|a| a.exit_file.as_path()).collect();
        let slot = (0..)
            .map(|slot| exits.join(slot.to_string()))
            .find(|path| !held.contains(path.as_path()))
            .unwrap_or_default();
        // A new slot is made with room for its record, so the supervisor
        // writes it in place even on a spool a job has filled.
        if !slot.exists() {
            if let Err(err) = std::fs::write(&slot, EXIT_SLOT_ROOM) {
                tracing::warn!("{}: cannot make an exit slot: {err}", slot.display());
            }
        }
        slot
    }
}

/// An ended attempt's event.
fn end_event(job_id: u64, epoch: u64, ended: Ended) -> pb::JobEvent {
    use pb::job_event::Outcome;
    let (outcome, cause) = match ended {
        Ended::Code(code) => (Outcome::ExitCode(code), pb::EndCause::Own),
        Ended::Signal(signal) => (Outcome::Signal(signal), pb::EndCause::Own),
        Ended::FailedToStart(reason) => (Outcome::FailedToStart(reason), pb::EndCause::Own),
        Ended::TimedOut => (Outcome::Signal(Signal::SIGTERM as i32), pb::EndCause::TimeLimit),
        Ended::Fenced => (Outcome::Signal(Signal::SIGKILL as i32), pb::EndCause::Fenced),
        Ended::Vanished => (Outcome::Signal(Signal::SIGKILL as i32), pb::EndCause::Vanished),
        Ended::Killed(code) => (Outcome::ExitCode(code), pb::EndCause::Killed),
        Ended::KilledBy(signal) => (Outcome::Signal(signal), pb::EndCause::Killed),
        Ended::OutOfMemory => (Outcome::Signal(Signal::SIGKILL as i32), pb::EndCause::OutOfMemory),
        Ended::OutputLimit => (Outcome::Signal(Signal::SIGKILL as i32), pb::EndCause::OutputLimit),
    };
    pb::JobEvent {
        job_id,
        epoch,
        outcome: Some(outcome),
        cause: cause as i32,
    }
}

use crate::supervise::kill_all_but_supervisor;

fn signal_group(pgid: i32, signal: Signal) {
    if pgid > 0 {
        let _ = killpg(Pid::from_raw(pgid), signal);
        let _ = kill(Pid::from_raw(pgid), signal);
    }
}

/// Whether `pid` is still one of our supervisors (and not a reused pid):
/// a live session leader running the supervisor's program.
fn supervisor_alive(pid: i32) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let program = cmdline.split(|b| *b == 0).next().unwrap_or_default();
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // After "(comm) ": state, ppid, pgrp, session.
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .map_or(vec![], |(_, rest)| rest.split(' ').collect());
    let leader = fields.get(3).is_some_and(|session| *session == pid.to_string());
    program.ends_with(SUPERVISOR_BIN.as_bytes()) && leader && fields.first() != Some(&"Z")
}

/// A process's exit: through a pidfd (which works for any process, our
/// child or not), or by polling /proc where no pidfd could be had.
enum ProcessExit {
    Gone,
    Pidfd(tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>),
    Polled(i32),
}

impl ProcessExit {
    fn open(pid: i32) -> std::io::Result<ProcessExit> {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open takes a pid and flags and returns a new fd.
        let fd = unsafe { nix::libc::syscall(nix::libc::SYS_pidfd_open, pid, 0) };
        if fd < 0 {
            let err = std::io::Error::last_os_error();
            // Already gone (and reaped).
            return match err.raw_os_error() {
                Some(nix::libc::ESRCH) => Ok(ProcessExit::Gone),
                _ => Err(err),
            };
        }
        // SAFETY: the fd was just opened and nothing else owns it; the
        // AsyncFd owns it from here on and never replaces it.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) };
        let registered = unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) };
        Ok(ProcessExit::Pidfd(registered?))
    }

    /// Resolves once the process has exited.
    async fn wait(&self) {
        match self {
            ProcessExit::Gone => {}
            // A pidfd stays readable once its process has exited.
            ProcessExit::Pidfd(fd) => {
                if let Err(err) = fd.readable().await {
                    tracing::error!("waiting on a pidfd: {err}");
                }
            }
            ProcessExit::Polled(pid) => {
                while process_alive(*pid) {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }
}

/// Whether `pid` exists and is not a zombie.
fn process_alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| stat.rsplit_once(") ").map(|(_, rest)| !rest.starts_with('Z')))
        .unwrap_or(false)
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Appends the directory of the `gpool` installed beside this agent to the
/// job's PATH (the submitter's, or this agent's), so `gpool checkpoint`
/// works from a job; the job's own entries come first.
fn with_gpool_on_path(env: &mut Vec<(String, String)>) {
    let Some(dir) = std::env::current_exe()
        .ok()
        .map(|exe| exe.with_file_name("gpool"))
        .filter(|gpool| gpool.is_file())
        .and_then(|gpool| gpool.parent().map(|dir| dir.display().to_string()))
    else {
        return;
    };
    let path = env
        .iter()
        .rev()
        .find(|(name, _)| name == "PATH")
        .map(|(_, value)| value.clone())
        .or_else(|| std::env::var("PATH").ok())
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".to_string());
    if !path.split(':').any(|entry| entry == dir) {
        env.push(("PATH".to_string(), format!("{path}:{dir}")));
    }
}

/// The `GPOOL_*`, CUDA and torch.distributed variables of one attempt.
pub fn attempt_env(
    launch: &pb::Launch,
    node: &str,
    devices: &crate::gpu::GpuDevices,
    checkpoint_dir: &Path,
) -> Vec<(String, String)> {
    // Whole GPUs by index, MIG slices by UUID.
    let gpus: Vec<String> = devices.names(&launch.gpu_indices);
    let mut env = vec![
        ("CUDA_VISIBLE_DEVICES".to_string(), gpus.join(",")),
        ("CUDA_DEVICE_ORDER".to_string(), "PCI_BUS_ID".to_string()),
        ("GPOOL_JOB_ID".to_string(), launch.job_id.to_string()),
        ("GPOOL_ATTEMPT".to_string(), launch.attempt.to_string()),
        ("GPOOL_NODE".to_string(), node.to_string()),
        ("GPOOL_GPUS".to_string(), gpus.len().to_string()),
        (
            "GPOOL_RESTART_COUNT".to_string(),
            launch.attempt.saturating_sub(1).to_string(),
        ),
        ("GPOOL_CHECKPOINT_DIR".to_string(), checkpoint_dir.display().to_string()),
    ];
    if let Some(index) = launch.array_task_index {
        env.extend([
            ("GPOOL_ARRAY_JOB_ID".to_string(), launch.array_job_id.to_string()),
            ("GPOOL_ARRAY_TASK_ID".to_string(), index.to_string()),
        ]);
    }
    if launch.num_nodes > 1 {
        env.extend([
            ("GPOOL_NUM_NODES".to_string(), launch.num_nodes.to_string()),
            ("GPOOL_NODE_RANK".to_string(), launch.node_rank.to_string()),
            ("MASTER_ADDR".to_string(), launch.master_addr.clone()),
            ("MASTER_PORT".to_string(), launch.master_port.to_string()),
        ]);
    }
    env
}

#[cfg(test)]
mod pidfd_tests {
    use super::*;

    #[tokio::test(flavor = "multi_thread")]
    async fn waits_for_a_process_to_exit() {
        // A process that is not our child, as supervisors are not.
        let mut parent = std::process::Command::new("sh")
            .args(["-c", "sleep 0.3 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(parent.stdout.take().unwrap()), &mut line).unwrap();
        let started = std::time::Instant::now();
        let exited = ProcessExit::open(line.trim().parse().unwrap()).unwrap();
        exited.wait().await;
        assert!(
            started.elapsed() > Duration::from_millis(200),
            "{:?}",
            started.elapsed()
        );
        let _ = parent.wait();
    }
}
