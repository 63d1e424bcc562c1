//! Jobs in containers: the command line of the node's OCI runtime (podman
//! or docker, which share it) for one attempt, and the one that removes
//! what is left of it. The runtime runs as the agent's user (root), the
//! job inside as its submitter.

use std::path::Path;

/// What the agent knows about the container an attempt runs in.
pub struct ContainerJob<'a> {
    /// The runtime program (`podman`, `docker`, or a path).
    pub runtime: &'a str,
    /// Unique on the node: `gpool-<scope>-<job>-<epoch>`.
    pub name: &'a str,
    pub image: &'a str,
    pub command: &'a [String],
    /// Names of the variables the runtime passes in from its own
    /// environment (values never go on a command line others can read).
    pub env_names: Vec<&'a str>,
    /// uid and gid to run as inside; `None`: the image's user.
    pub user: Option<(u32, u32)>,
    pub workdir: Option<&'a Path>,
    /// Mounted at the same path inside.
    pub checkpoint_dir: &'a Path,
    /// `--device` arguments: CDI names or device node paths.
    pub devices: Vec<String>,
}

impl ContainerJob<'_> {
    /// `runtime run …`: removed when it ends, signals passed on to it,
    /// the host's network (gangs reach MASTER_ADDR as on the host).
    pub fn run_args(&self) -> Vec<String> {
        let mut args: Vec<String> = ["run", "--rm", "--sig-proxy=true", "--network", "host", "--name"]
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
        for name in &self.env_names {
            args.extend(["--env".to_string(), name.to_string()]);
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

/// The `--device` arguments for GPUs `gpu_indices`: CDI names where the
/// NVIDIA container toolkit wrote a CDI spec, else the device nodes that
/// exist (the GPUs', and the driver's control nodes).
pub fn gpu_devices(gpu_indices: &[u32]) -> Vec<String> {
    let cdi = [
        "/etc/cdi/nvidia.yaml",
        "/var/run/cdi/nvidia.yaml",
        "/etc/cdi/nvidia.json",
    ]
    .iter()
    .any(|spec| Path::new(spec).exists());
    if cdi {
        return gpu_indices.iter().map(|idx| format!("nvidia.com/gpu={idx}")).collect();
    }
    gpu_indices
        .iter()
        .map(|idx| format!("/dev/nvidia{idx}"))
        .chain(
            ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"]
                .iter()
                .map(|node| format!("/dev/{node}")),
        )
        .filter(|path| Path::new(path).exists())
        .collect()
}

/// Inside the container its GPUs are numbered from 0.
pub fn visible_devices(n_gpus: usize) -> String {
    (0..n_gpus).map(|idx| idx.to_string()).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_container_gets_its_user_mounts_devices_and_env_names_only() {
        let command = vec!["python".to_string(), "train.py".to_string()];
        let job = ContainerJob {
            runtime: "podman",
            name: "gpool-ab-7-3",
            image: "registry.example/ml:1",
            command: &command,
            env_names: vec!["CUDA_VISIBLE_DEVICES", "SECRET"],
            user: Some((1000, 100)),
            workdir: Some(Path::new("/work")),
            checkpoint_dir: Path::new("/spool/checkpoints/7"),
            devices: vec!["nvidia.com/gpu=2".into()],
        };
        assert_eq!(
            job.run_args().join(" "),
            "run --rm --sig-proxy=true --network host --name gpool-ab-7-3 --user 1000:100 --workdir /work \
             --volume /spool/checkpoints/7:/spool/checkpoints/7 --device nvidia.com/gpu=2 \
             --env CUDA_VISIBLE_DEVICES --env SECRET registry.example/ml:1 python train.py"
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
