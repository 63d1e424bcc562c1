//! Jobs in containers: the command line of the node's OCI runtime (podman
//! or docker, which share it) for one attempt, and the one that removes
//! what is left of it. The runtime runs as the agent's user (root), with
//! the agent's environment, never the job's (which goes in through a 0600
//! env file); the job inside runs as its submitter, without privileges.

use std::path::Path;

/// What the agent knows about the container an attempt runs in.
pub struct ContainerJob<'a> {
    /// The runtime program (`podman`, `docker`, or a path).
    pub runtime: &'a str,
    /// Unique on the node: `gpool-<scope>-<job>-<epoch>`.
    pub name: &'a str,
    pub image: &'a str,
    pub command: &'a [String],
    /// The job's environment, as a file only root reads (values never go
    /// on a command line others can read).
    pub env_file: &'a Path,
    /// uid and gid to run as inside; `None`: the image's user.
    pub user: Option<(u32, u32)>,
    pub workdir: Option<&'a Path>,
    /// Mounted at the same path inside.
    pub checkpoint_dir: &'a Path,
    /// `--device` arguments: CDI names or device node paths.
    pub devices: Vec<String>,
    /// --mem and --cpus-per-gpu (times its GPUs), for the runtime's cgroup.
    pub limits: crate::cgroup::Limits,
}

impl ContainerJob<'_> {
    /// `runtime run …`: removed when it ends, signals passed on to it,
    /// the host's network (gangs reach MASTER_ADDR as on the host).
    pub fn run_args(&self) -> Vec<String> {
        let mut args: Vec<String> = [
            "run",
            "--rm",
            "--sig-proxy=true",
            "--network",
            "host",
            // A setuid binary in the image gains nothing.
            "--security-opt=no-new-privileges",
            "--cap-drop=all",
            "--name",
        ]
        .iter()
        .map(|arg| arg.to_string())
        .collect();
        args.push(self.name.to_string());
        if let Some((uid, gid)) = self.user {
            args.extend(["--user".to_string(), format!("{uid}:{gid}")]);
        }
        if let Some(workdir) = self.workdir {
            args.extend(["--workdir".to_string(), workdir.display().to_string()]);
        }
        let mount = self.checkpoint_dir.display();
        args.extend(["--volume".to_string(), format!("{mount}:{mount}")]);
        for device in &self.devices {
            args.extend(["--device".to_string(), device.clone()]);
        }
        args.extend(["--env-file".to_string(), self.env_file.display().to_string()]);
        if let Some(bytes) = self.limits.mem_bytes {
            args.extend(["--memory".to_string(), bytes.to_string()]);
        }
        if let Some(cpus) = self.limits.cpus {
            args.extend(["--cpus".to_string(), cpus.to_string()]);
        }
        if let Some(pids) = self.limits.pids {
            args.extend(["--pids-limit".to_string(), pids.to_string()]);
        }
        args.push(self.image.to_string());
        args.extend(self.command.iter().cloned());
        args
    }

    /// Removes the container at once if it is still there (its runtime
    /// was killed before it could).
    pub fn cleanup_args(&self) -> Vec<String> {
        let mut args = vec![self.runtime.to_string(), "rm".to_string(), "--force".to_string()];
        if Path::new(self.runtime).file_name().is_some_and(|name| name == "podman") {
            args.extend(["--time".to_string(), "0".to_string(), "--ignore".to_string()]);
        }
        args.push(self.name.to_string());
        args
    }
}

/// The `--device` arguments for GPUs named `names` (an index, or a MIG
/// slice's UUID) with device minors `minors`: CDI names where the NVIDIA
/// container toolkit wrote a CDI spec, else the device nodes that exist
/// (the GPUs', and the driver's control nodes).
pub fn gpu_devices(names: &[String], minors: &[u32]) -> Vec<String> {
    let cdi = [
        "/etc/cdi/nvidia.yaml",
        "/var/run/cdi/nvidia.yaml",
        "/etc/cdi/nvidia.json",
    ]
    .iter()
    .any(|spec| Path::new(spec).exists());
    if cdi {
        return names.iter().map(|name| format!("nvidia.com/gpu={name}")).collect();
    }
    minors
        .iter()
        .map(|minor| format!("/dev/nvidia{minor}"))
        .chain(
            ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"]
                .iter()
                .map(|node| format!("/dev/{node}")),
        )
        .filter(|path| Path::new(path).exists())
        .collect()
}

/// The env file's text: `NAME=value` lines. A value with a line break
/// cannot be written there, and is refused.
pub fn env_file_text(env: &[(String, String)]) -> Result<String, String> {
    let mut text = String::new();
    for (name, value) in env {
        if value.contains(['\n', '\r']) {
            return Err(format!(
                "env.{name}: a value with a line break cannot be passed into a container"
            ));
        }
        text.push_str(&format!("{name}={value}\n"));
    }
    Ok(text)
}

/// `program` as found on the agent's PATH (so that no job changes which
/// binary root runs); as given if it has a slash or is not found.
pub fn resolve_program(program: &str) -> String {
    if program.contains('/') {
        return program.to_string();
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join(program))
        .find(|path| path.is_file())
        .map_or_else(|| program.to_string(), |path| path.display().to_string())
}

/// Inside the container its GPUs are numbered from 0.
pub fn visible_devices(n_gpus: usize) -> String {
    (0..n_gpus).map(|idx| idx.to_string()).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_gets_its_user_mounts_devices_env_file_and_limits_only() {
        let command = vec!["python".to_string(), "train.py".to_string()];
        let job = ContainerJob {
            runtime: "podman",
            name: "gpool-ab-7-3",
            image: "registry.example/ml:1",
            command: &command,
            env_file: Path::new("/spool/jobs/7.1.env"),
            user: Some((1000, 100)),
            workdir: Some(Path::new("/work")),
            checkpoint_dir: Path::new("/spool/checkpoints/7"),
            devices: vec!["nvidia.com/gpu=2".into()],
            limits: crate::cgroup::Limits {
                mem_bytes: Some(1 << 30),
                cpus: Some(8),
                pids: Some(4096),
            },
        };
        assert_eq!(
            job.run_args().join(" "),
            "run --rm --sig-proxy=true --network host --security-opt=no-new-privileges --cap-drop=all \
             --name gpool-ab-7-3 --user 1000:100 --workdir /work \
             --volume /spool/checkpoints/7:/spool/checkpoints/7 --device nvidia.com/gpu=2 \
             --env-file /spool/jobs/7.1.env --memory 1073741824 --cpus 8 --pids-limit 4096 \
             registry.example/ml:1 python train.py"
        );
        assert_eq!(
            job.cleanup_args().join(" "),
            "podman rm --force --time 0 --ignore gpool-ab-7-3"
        );
        let docker = ContainerJob {
            runtime: "docker",
            ..job
        };
        assert_eq!(docker.cleanup_args().join(" "), "docker rm --force gpool-ab-7-3");
        assert_eq!(visible_devices(3), "0,1,2");
    }
}
