//! The start of one attempt: its supervisor's launch request (command,
//! environment, output files, cgroup, fence), whom it runs as, its batch
//! script's copy and its exit slot.

use super::*;
use crate::journal::AttemptRecord as RunningAttempt;
use crate::supervise::LaunchRequest;
use nix::sys::signal::Signal;

/// A job's grace after its checkpoint signal when it names none.
const DEFAULT_GRACE: Duration = Duration::from_secs(30);

/// What a new exit slot holds until its first record: room for one
/// (no record parses from it).
const EXIT_SLOT_ROOM: [u8; 512] = {
    let mut room = [b' '; 512];
    room[511] = b'\n';
    room
};

impl Attempts {
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
    pub(super) fn spawn(&self, launch: &pb::Launch) -> Result<(crate::supervise::Launched, PathBuf), String> {
        if launch.command.first().is_none_or(String::is_empty) {
            return Err("the command is empty".into());
        }
        let checkpoint_dir = self.spool_dir.join("checkpoints").join(launch.job_id.to_string());
        let workdir = (!launch.workdir.is_empty()).then(|| PathBuf::from(&launch.workdir));
        let run_as = self.run_as(&launch.user)?;
        let in_container = !launch.image.is_empty();
        self.check_workdir(workdir.as_ref(), run_as.is_some(), in_container)?;
        let exit_file = self.free_exit_slot();
        let mut env = self.job_env(launch, &checkpoint_dir, run_as.is_some(), in_container);
        if launch.gpu_share_mib > 0 {
            env.extend(self.share_env(launch)?);
            if !in_container {
                self.mps.preload_cap(&mut env);
            }
        }
        let limits = self.limits(launch);
        let env_file = in_container.then(|| attempt_file(&self.spool_dir, launch.job_id, launch.attempt, "env"));
        let (program, args, workdir, cleanup) = if let Some(env_file) = &env_file {
            with_container_devices(&mut env, launch);
            let job = (env_file.as_path(), run_as.as_ref(), workdir.as_deref());
            self.container_command(launch, job, &checkpoint_dir, limits)
        } else {
            let command = self.with_script_copy(launch, run_as.as_ref())?;
            (command[0].clone(), command[1..].to_vec(), workdir, None)
        };
        check_output_options(launch, in_container)?;
        self.open_terminal_input(launch)?;
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
            max_output: Some(self.max_output_of(launch)),
            pty: self.pty_of(launch),
            fence: self.fence_of(launch),
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
            cgroup: self.cgroup_of(launch, limits),
        };
        // Journaled before the spawner acts on it: an agent that dies in
        // between finds the launch again (`recover`), and runs it once.
        self.journal().started(RunningAttempt {
            job_id: launch.job_id,
            epoch: launch.epoch,
            pgid: 0,
            exit_file: exit_file.clone(),
            deadline_ms: None,
            launcher: None,
        });
        let launched = self.spawner.lock().unwrap_or_else(|p| p.into_inner()).launch(&request);
        match launched {
            Ok(launched) => Ok((launched, exit_file)),
            Err(reason) => {
                self.journal().abandoned(launch.job_id, launch.epoch);
                Err(reason)
            }
        }
    }

    /// Fails when the job's workdir is missing here, where that is this
    /// agent's to check.
    fn check_workdir(&self, workdir: Option<&PathBuf>, has_run_as: bool, in_container: bool) -> Result<(), String> {
        // Checked here only for jobs that run as this agent's user on the
        // host; another user's job enters its workdir with its own rights
        // (supervisor), and a container's is inside the image.
        if let Some(workdir) = workdir.filter(|dir| !has_run_as && !in_container && !dir.is_dir()) {
            return Err(format!(
                "workdir {} does not exist on node {}",
                workdir.display(),
                self.node
            ));
        }
        Ok(())
    }

    /// The GPUs whose MPS daemon failed since the last look, and how.
    pub fn mps_failures(&self) -> Vec<(u32, String)> {
        self.mps.failures()
    }

    /// A fraction's MPS client variables, its GPU's daemon started.
    fn share_env(&self, launch: &pb::Launch) -> Result<Vec<(String, String)>, String> {
        let (Some(&gpu), Some(device)) = (
            launch.gpu_indices.first(),
            self.node_gpus.names(&launch.gpu_indices).first().cloned(),
        ) else {
            return Err("a fraction of a GPU names no GPU".into());
        };
        self.mps.ensure(gpu, &device)?;
        Ok(self
            .mps
            .client_env(gpu, launch.gpu_share_mib, launch.gpu_share_compute_pct))
    }

    /// The job's environment: its own variables, the attempt's, the
    /// controller's, and on the host `gpool` on its PATH and the account's.
    fn job_env(
        &self,
        launch: &pb::Launch,
        checkpoint_dir: &Path,
        has_run_as: bool,
        in_container: bool,
    ) -> Vec<(String, String)> {
        // A job token in a job that runs as the agent's user, beside other
        // users' jobs, could be read by them: only jobs run as their own
        // user get one.
        let mut env: Vec<(String, String)> = launch
            .env
            .iter()
            .filter(|var| self.as_root || var.name != "GPOOL_TOKEN")
            .map(|var| (var.name.clone(), var.value.clone()))
            .chain(attempt_env(launch, &self.node, &self.node_gpus, checkpoint_dir))
            .chain(self.controller_env.iter().cloned())
            .collect();
        if !in_container {
            if let Some(dir) = &self.gpool_dir {
                with_gpool_on_path(&mut env, dir);
            }
            // As a login would: the account's USER, LOGNAME, HOME and SHELL
            // (the user's own where the job runs as one; the supervisor sets
            // those), and a PATH where the job brought none.
            if !has_run_as {
                env.extend(self.own_account.iter().cloned());
            }
        }
        env
    }

    /// The attempt's memory, CPU and process limits.
    fn limits(&self, launch: &pb::Launch) -> crate::cgroup::Limits {
        crate::cgroup::Limits {
            mem_bytes: (launch.mem_bytes > 0).then_some(launch.mem_bytes),
            cpus: (launch.cpus_per_gpu > 0).then(|| {
                launch
                    .cpus_per_gpu
                    .saturating_mul(launch.gpu_indices.len().max(1) as u32)
            }),
            pids: (self.max_pids > 0).then_some(self.max_pids),
        }
    }

    /// The container runtime's command for a container job (its env file,
    /// user and workdir in `job`), with the arguments that clean it up.
    fn container_command(
        &self,
        launch: &pb::Launch,
        (env_file, run_as, workdir): (&Path, Option<&RunAs>, Option<&Path>),
        checkpoint_dir: &Path,
        limits: crate::cgroup::Limits,
    ) -> CommandParts {
        let name = format!("gpool-{}-{}-{}", self.cgroup_scope, launch.job_id, launch.epoch);
        let job = crate::container::ContainerJob {
            runtime: &self.container_runtime,
            name: &name,
            image: &launch.image,
            command: &launch.command,
            env_file,
            user: run_as.map(|user| (user.uid, user.gid)),
            workdir,
            checkpoint_dir,
            devices: crate::container::gpu_devices(
                &self.node_gpus.names(&launch.gpu_indices),
                &self.node_gpus.minors(&launch.gpu_indices),
            ),
            limits,
        };
        let cleanup = job.cleanup_args();
        (self.container_runtime.clone(), job.run_args(), None, Some(cleanup))
    }

    /// An interactive attempt's input FIFO, made now unless keys typed
    /// before this Launch came made it already.
    fn open_terminal_input(&self, launch: &pb::Launch) -> Result<(), String> {
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
        Ok(())
    }

    /// The most output the attempt may write: the job's cap, at most the
    /// node's.
    fn max_output_of(&self, launch: &pb::Launch) -> u64 {
        match launch.max_output_bytes {
            0 => self.max_output,
            asked => asked.min(self.max_output),
        }
    }

    /// An interactive attempt's terminal: its size and input FIFO.
    fn pty_of(&self, launch: &pb::Launch) -> Option<crate::terminal::Pty> {
        launch.pty.map(|size| crate::terminal::Pty {
            rows: size.rows.clamp(1, u32::from(u16::MAX)) as u16,
            cols: size.cols.clamp(1, u32::from(u16::MAX)) as u16,
            input: input_fifo(&self.spool_dir, launch.job_id, launch.epoch),
        })
    }

    /// A requeueable attempt's fence: the lease file, its checkpoint signal
    /// and its grace.
    fn fence_of(&self, launch: &pb::Launch) -> Option<crate::supervise::Fence> {
        launch.requeue.then(|| crate::supervise::Fence {
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
        })
    }

    /// The attempt's cgroup rules: its GPUs' device nodes and its limits.
    fn cgroup_of(&self, launch: &pb::Launch, limits: crate::cgroup::Limits) -> Option<crate::cgroup::AttemptCgroup> {
        self.isolation.rules_for(
            &self.cgroup_scope,
            (launch.job_id, launch.epoch),
            (
                &self.node_gpus.minors(&launch.gpu_indices),
                &self.node_gpus.all_minors(),
            ),
            limits,
        )
    }

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

/// A supervisor's program, arguments, workdir and container cleanup.
type CommandParts = (String, Vec<String>, Option<PathBuf>, Option<Vec<String>>);

/// A container job's CUDA_VISIBLE_DEVICES: its GPUs as the container
/// numbers them.
fn with_container_devices(env: &mut [(String, String)], launch: &pb::Launch) {
    for (key, value) in env {
        if key == "CUDA_VISIBLE_DEVICES" {
            *value = crate::container::visible_devices(launch.gpu_indices.len());
        }
    }
}

/// Fails on `-o/-e` for a container job, and on an interactive job that
/// runs in a container, discards its output or names an `-o` file.
fn check_output_options(launch: &pb::Launch, in_container: bool) -> Result<(), String> {
    // Opened by the job's user after the switch: a container runtime
    // stays the agent's user, so its jobs get none.
    if in_container && !(launch.stdout_path.is_empty() && launch.stderr_path.is_empty()) {
        return Err("a container job's output stays in the spool: -o/-e are for jobs on the host".into());
    }
    if launch.pty.is_some() && (in_container || launch.discard_output || !launch.stdout_path.is_empty()) {
        return Err("an interactive job runs on the host, its terminal's output in the spool".into());
    }
    Ok(())
}

/// Appends `dir`, that of the `gpool` installed beside this agent, to the
/// job's PATH (the submitter's, or this agent's), so `gpool checkpoint`
/// works from a job; the job's own entries come first.
fn with_gpool_on_path(env: &mut Vec<(String, String)>, dir: &str) {
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
