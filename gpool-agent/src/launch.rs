//! Running job attempts as processes: each in its own session and process
//! group, confined to its GPUs by `CUDA_VISIBLE_DEVICES`, output to files in
//! the spool dir, time limit enforced, killed as a whole group.

use gpool_proto::pb;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

/// Grace between SIGTERM and SIGKILL when a time limit runs out.
const TIME_LIMIT_GRACE: Duration = Duration::from_secs(10);

/// The attempts this node runs, and the events they produce.
pub struct Attempts {
    node: String,
    spool_dir: PathBuf,
    running: Mutex<HashMap<u64, RunningAttempt>>,
    events: mpsc::UnboundedSender<pb::JobEvent>,
    tasks: Mutex<JoinSet<()>>,
}

#[derive(Debug, Clone, Copy)]
struct RunningAttempt {
    epoch: u64,
    /// The process group (= session) leader's pid.
    pgid: i32,
}

impl Attempts {
    pub fn new(node: String, spool_dir: PathBuf, events: mpsc::UnboundedSender<pb::JobEvent>) -> Arc<Attempts> {
        Arc::new(Attempts {
            node,
            spool_dir,
            running: Mutex::new(HashMap::new()),
            events,
            tasks: Mutex::new(JoinSet::new()),
        })
    }

    /// What Register reports.
    pub fn running(&self) -> Vec<pb::RunningAttempt> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        running
            .iter()
            .map(|(job_id, attempt)| pb::RunningAttempt {
                job_id: *job_id,
                epoch: attempt.epoch,
            })
            .collect()
    }

    pub fn launch(self: &Arc<Self>, launch: pb::Launch) {
        let already = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&launch.job_id)
            .copied();
        if let Some(attempt) = already {
            tracing::warn!(
                job = launch.job_id,
                epoch = attempt.epoch,
                "launch for a job already running here; ignored"
            );
            return;
        }
        let (job_id, epoch) = (launch.job_id, launch.epoch);
        match self.spawn(&launch) {
            Ok(child) => {
                let pgid = child.id().map_or(0, |pid| pid as i32);
                tracing::info!(job = job_id, epoch, pid = pgid, "attempt {} started", launch.attempt);
                self.running
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(job_id, RunningAttempt { epoch, pgid });
                self.send(job_id, epoch, pb::job_event::Outcome::Started(true));
                let attempts = self.clone();
                let time_limit = launch.time_limit.map(|d| Duration::from_secs(d.seconds));
                let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
                tasks.spawn(async move { attempts.supervise(job_id, epoch, pgid, child, time_limit).await });
            }
            Err(reason) => self.send(job_id, epoch, pb::job_event::Outcome::FailedToStart(reason)),
        }
    }

    /// SIGTERM to the attempt's whole process group, SIGKILL after `grace`.
    pub fn kill(self: &Arc<Self>, job_id: u64, epoch: u64, grace: Duration) {
        let attempt = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&job_id)
            .copied();
        let Some(attempt) = attempt.filter(|a| a.epoch == epoch) else {
            return;
        };
        tracing::info!(job = job_id, epoch, "killing attempt");
        let attempts = self.clone();
        let mut tasks = self.tasks.lock().unwrap_or_else(|p| p.into_inner());
        tasks.spawn(async move { attempts.terminate(job_id, attempt, grace).await });
    }

    async fn terminate(&self, job_id: u64, attempt: RunningAttempt, grace: Duration) {
        let _ = killpg(Pid::from_raw(attempt.pgid), Signal::SIGTERM);
        tokio::time::sleep(grace).await;
        let still = self
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&job_id)
            .map(|a| a.epoch);
        if still == Some(attempt.epoch) {
            let _ = killpg(Pid::from_raw(attempt.pgid), Signal::SIGKILL);
        }
    }

    async fn supervise(
        &self,
        job_id: u64,
        epoch: u64,
        pgid: i32,
        mut child: tokio::process::Child,
        time_limit: Option<Duration>,
    ) {
        let status = match time_limit {
            None => child.wait().await,
            Some(limit) => match tokio::time::timeout(limit, child.wait()).await {
                Ok(status) => status,
                Err(_) => {
                    tracing::info!(job = job_id, "time limit of {limit:?} reached");
                    self.terminate(job_id, RunningAttempt { epoch, pgid }, TIME_LIMIT_GRACE)
                        .await;
                    child.wait().await
                }
            },
        };
        // The leader is gone; anything left in its group goes with it.
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        self.running.lock().unwrap_or_else(|p| p.into_inner()).remove(&job_id);
        tracing::info!(job = job_id, epoch, "attempt ended: {status:?}");
        let outcome = match status {
            Ok(status) => match (status.code(), status.signal()) {
                (Some(code), _) => pb::job_event::Outcome::ExitCode(code),
                (None, Some(signal)) => pb::job_event::Outcome::Signal(signal),
                (None, None) => pb::job_event::Outcome::FailedToStart("no exit status".into()),
            },
            Err(err) => pb::job_event::Outcome::FailedToStart(format!("waiting for the process: {err}")),
        };
        self.send(job_id, epoch, outcome);
    }

    fn send(&self, job_id: u64, epoch: u64, outcome: pb::job_event::Outcome) {
        let _ = self.events.send(pb::JobEvent {
            job_id,
            epoch,
            outcome: Some(outcome),
        });
    }

    fn spawn(&self, launch: &pb::Launch) -> Result<tokio::process::Child, String> {
        let program = launch.command.first().ok_or("the command is empty")?;
        let job_dir = self.spool_dir.join("jobs").join(launch.job_id.to_string());
        let checkpoint_dir = self.spool_dir.join("checkpoints").join(launch.job_id.to_string());
        for dir in [&job_dir, &checkpoint_dir] {
            std::fs::create_dir_all(dir).map_err(|err| format!("{}: {err}", dir.display()))?;
        }
        let output = |suffix: &str| -> Result<std::fs::File, String> {
            let path = job_dir.join(format!("attempt-{}.{suffix}", launch.attempt));
            std::fs::File::create(&path).map_err(|err| format!("{}: {err}", path.display()))
        };
        let mut command = tokio::process::Command::new(program);
        command
            .args(&launch.command[1..])
            .envs(launch.env.iter().map(|var| (&var.name, &var.value)))
            .envs(attempt_env(launch, &self.node, &checkpoint_dir))
            .stdin(Stdio::null())
            .stdout(output("out")?)
            .stderr(output("err")?)
            .kill_on_drop(false);
        if !launch.workdir.is_empty() {
            if !Path::new(&launch.workdir).is_dir() {
                return Err(format!(
                    "workdir {} does not exist on node {}",
                    launch.workdir, self.node
                ));
            }
            command.current_dir(&launch.workdir);
        }
        // SAFETY: setsid is async-signal-safe and touches no memory of the
        // parent; it makes the attempt a session and process-group leader so
        // that a kill reaches every process it started.
        unsafe {
            command.pre_exec(|| nix::unistd::setsid().map(|_| ()).map_err(std::io::Error::from));
        }
        command.spawn().map_err(|err| format!("cannot run {program:?}: {err}"))
    }
}

/// The `GPOOL_*`, CUDA and torch.distributed variables of one attempt.
pub fn attempt_env(launch: &pb::Launch, node: &str, checkpoint_dir: &Path) -> Vec<(String, String)> {
    let gpus: Vec<String> = launch.gpu_indices.iter().map(u32::to_string).collect();
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
