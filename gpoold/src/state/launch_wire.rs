//! The Launch messages of a start: what each node of the attempt is told
//! to run, built from the job's record.

use super::State;
use gpool_core::model::NodePlacement;
use gpool_core::{Epoch, JobId};
use gpool_proto::pb;

impl State {
    pub(super) fn launch_messages(
        &self,
        job_id: JobId,
        epoch: Epoch,
        placement: &[NodePlacement],
    ) -> Vec<(String, pb::ControllerMessage)> {
        let Some(job) = self.jobs.get(&job_id) else {
            return Vec::new();
        };
        let master_addr = placement
            .first()
            .and_then(|rank0| self.links.get(&rank0.node))
            .map_or_else(String::new, |conn| conn.ip.clone());
        let nodes: Vec<String> = placement.iter().map(|part| part.node.clone()).collect();
        let slurm = self.slurm_job(job, &nodes);
        let share = self.share_of(job, placement);
        placement
            .iter()
            .enumerate()
            .map(|(rank, part)| {
                let launch = pb::Launch {
                    job_id: job_id.0,
                    epoch: epoch.0,
                    attempt: job.n_attempts,
                    command: job.spec.command.clone(),
                    env: self.launch_env(job, epoch, (&slurm, rank as u32, part.gpu_indices.len() as u32)),
                    workdir: job.spec.workdir.clone(),
                    gpu_indices: part.gpu_indices.clone(),
                    time_limit: job.time_left_secs().map(|seconds| pb::Duration { seconds }),
                    num_nodes: placement.len() as u32,
                    node_rank: rank as u32,
                    master_addr: master_addr.clone(),
                    // A port per job, below the ephemeral range.
                    master_port: 20_000 + (job_id.0 % 10_000) as u32,
                    discard_output: job.spec.discard_output,
                    user: job.user.to_string(),
                    image: job.spec.image.clone(),
                    mem_bytes: job.spec.mem_bytes.unwrap_or(0),
                    max_output_bytes: job.spec.max_output_bytes.unwrap_or(0),
                    script: job.spec.script.as_ref().map(|script| pb::BatchScript {
                        text: script.text.clone(),
                        at: script.at,
                    }),
                    cpus_per_gpu: job.spec.cpus_per_gpu.unwrap_or(0),
                    requeue: job.spec.requeue,
                    // The signal and grace preemption would give it.
                    checkpoint_signal: job
                        .spec
                        .checkpoint_signal
                        .unwrap_or(super::sharing::DEFAULT_CHECKPOINT_SIGNAL),
                    grace_seconds: self.grace_secs(job_id).min(u64::from(u32::MAX)) as u32,
                    array_job_id: job.array_task.map_or(0, |task| task.array.0),
                    array_task_index: job.array_task.map(|task| task.index),
                    stdout_path: job.spec.stdout_path.clone(),
                    stderr_path: job.spec.stderr_path.clone(),
                    job_name: job.spec.name.clone(),
                    pty: job.spec.pty.map(|size| pb::TerminalSize {
                        rows: size.rows.into(),
                        cols: size.cols.into(),
                    }),
                    gpu_share_mib: share.map_or(0, |share| share.memory_mib),
                    gpu_share_compute_pct: share.map_or(0, |share| u32::from(share.compute_pct)),
                };
                let message = pb::ControllerMessage {
                    term: 0,
                    msg: Some(pb::controller_message::Msg::Launch(launch)),
                };
                (part.node.clone(), message)
            })
            .collect()
    }

    /// A rank's environment: the submitter's, its job token, then Slurm's
    /// view of it (after the submitter's own: a shell inside another
    /// Slurm job brings that job's).
    fn launch_env(
        &self,
        job: &gpool_core::Job,
        epoch: Epoch,
        (slurm, rank, gpus_on_node): (&gpool_core::slurm::SlurmJob, u32, u32),
    ) -> Vec<pb::EnvVar> {
        gpool_proto::convert::env_to_wire(&job.spec.env)
            .into_iter()
            .chain([pb::EnvVar {
                // Lets `gpool` inside the job act as its owner, for as long
                // as this attempt runs.
                name: "GPOOL_TOKEN".into(),
                value: gpool_core::auth::token::job_token_text(&self.token_key, job.id, epoch),
            }])
            .chain(
                gpool_core::slurm::env(slurm, rank, gpus_on_node)
                    .into_iter()
                    .map(|(name, value)| pb::EnvVar { name, value }),
            )
            .collect()
    }

    /// What `job`'s `SLURM_*` variables are made of, on `nodes`.
    fn slurm_job<'a>(&'a self, job: &'a gpool_core::Job, nodes: &'a [String]) -> gpool_core::slurm::SlurmJob<'a> {
        let partition = self
            .policy
            .pool(&job.spec.pool)
            .map_or(job.spec.pool.as_str(), |pool| pool.name.as_str());
        let submit_host = job
            .spec
            .env
            .iter()
            .rev()
            .find(|(name, _)| name == "HOSTNAME")
            .map_or("", |(_, value)| value.as_str());
        let array = job.array_task.and_then(|task| {
            let spec = self.jobs.get(&task.array)?.spec.array.as_deref()?;
            let last = spec.ranges.last()?;
            Some(gpool_core::slurm::SlurmArray {
                array_job_id: task.array.0,
                task_id: task.index,
                task_count: spec.len(),
                task_min: spec.ranges.first()?.start,
                task_max: last.start + (last.len() - 1) * last.step,
            })
        });
        gpool_core::slurm::SlurmJob {
            job_id: job.id.0,
            name: &job.spec.name,
            nodes,
            submit_dir: &job.spec.workdir,
            submit_host,
            cluster: "gpool",
            partition,
            account: &job.spec.team,
            cpus_per_gpu: job.spec.cpus_per_gpu,
            mem_bytes: job.spec.mem_bytes,
            restart_count: job.n_attempts.saturating_sub(1),
            tasks_per_node: job.spec.tasks_per_node.max(1),
            array,
        }
    }
}
