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
use crate::journal::Journal;
use crate::supervise::{RunAs, Spawner, SUPERVISOR_BIN};
use gpool_proto::pb;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

mod io;
mod lifecycle;
mod process;
mod spawn;
pub use io::{input_fifo, open_input_fifo};
pub use spawn::attempt_env;

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
    /// The ends the launcher announces.
    notices: Arc<crate::supervise::EndNotices>,
    /// The directory of the `gpool` installed beside this agent, if any
    /// (put on jobs' PATH).
    gpool_dir: Option<String>,
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
    /// The MPS daemons of the GPUs fractions share.
    mps: crate::mps::Mps,
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
/// The running spawner's pid, in the state dir.
const SPAWNER_PID_FILE: &str = "spawner.pid";
/// How long a restarted agent waits for its predecessor's spawner to exit.
const OLD_SPAWNER_PATIENCE: Duration = Duration::from_secs(5);

impl Attempts {
    /// Fails when `gpool-supervise` is not installed next to this binary or
    /// the journal cannot be read.
    pub fn new(
        node: String,
        controller_env: Vec<(String, String)>,
        dirs: SpoolDirs,
        (isolation, node_gpus, container_runtime): (Isolation, crate::gpu::GpuDevices, String),
        mps: crate::mps::Mps,
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
        let notices = Arc::new(crate::supervise::EndNotices::default());
        let spawner = Spawner::new(supervisor, state_dir.join(SPAWNER_PID_FILE), notices.clone());
        let gpool_dir = Some(exe.with_file_name("gpool"))
            .filter(|gpool| gpool.is_file())
            .and_then(|gpool| Some(gpool.parent()?.display().to_string()));
        Ok(Arc::new(Attempts {
            as_root: nix::unistd::geteuid().is_root(),
            cgroup_scope: crate::cgroup::scope_of(&spool_dir),
            isolation,
            node_gpus,
            container_runtime,
            mps,
            controller_env,
            own_account: crate::supervise::own_account(),
            users: Mutex::new(std::collections::HashMap::new()),
            node,
            spool_dir,
            state_dir,
            max_output,
            max_pids,
            space: Mutex::new((space, String::new())),
            spawner: Mutex::new(spawner),
            notices,
            gpool_dir,
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
            let mut short = space.0.check();
            if !short.is_empty() {
                let removed = crate::spool::free_up(&self.jobs_dir(), &self.live_jobs(), space.0.room_wanted());
                if removed > 0 {
                    tracing::warn!("{short}: removed the output of ended jobs, oldest first ({removed} files)");
                    short = space.0.check();
                }
            }
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

    /// Removes the empty cgroups of this node's attempts that no attempt
    /// here holds (those of a launcher killed before its jobs ended);
    /// how many.
    pub fn remove_left_behind_cgroups(&self) -> usize {
        let live: std::collections::HashSet<(u64, u64)> = self
            .journal()
            .live()
            .values()
            .map(|attempt| (attempt.job_id, attempt.epoch))
            .collect();
        self.isolation.remove_left_behind(&self.cgroup_scope, &live)
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

    fn journal(&self) -> std::sync::MutexGuard<'_, Journal> {
        self.journal.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The epoch of the attempt of `job_id` running here, if any.
    fn running_epoch(&self, job_id: u64) -> Option<u64> {
        self.journal().live().get(&job_id).map(|a| a.epoch)
    }
}

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

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
