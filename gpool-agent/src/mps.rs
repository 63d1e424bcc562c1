//! Fractions of a GPU run as clients of one MPS control daemon per shared
//! GPU, which this agent starts (`nvidia-cuda-mps-control -f`, found on
//! its PATH) the first time a fraction lands on the GPU, and starts again
//! where it has ended. Each client is held to its memory and compute by
//! `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` and
//! `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

/// The MPS control program, as NVIDIA ships it.
pub const CONTROL_PROGRAM: &str = "nvidia-cuda-mps-control";

pub struct Mps {
    /// `<state>/mps`: a directory per GPU, with its pipes and logs.
    root: PathBuf,
    /// The control program; `None` where the node has none.
    program: Option<PathBuf>,
    /// Simulated GPUs have no CUDA to share: fractions run without a daemon.
    simulated: bool,
    daemons: Mutex<BTreeMap<u32, Child>>,
}

impl Mps {
    pub fn new(state_dir: &Path, simulated: bool) -> Mps {
        Mps {
            root: state_dir.join("mps"),
            program: find_on_path(CONTROL_PROGRAM),
            simulated,
            daemons: Mutex::new(BTreeMap::new()),
        }
    }

    fn dir(&self, gpu: u32, what: &str) -> PathBuf {
        self.root.join(format!("gpu{gpu}")).join(what)
    }

    /// What a fraction's process needs to be a client of GPU `gpu`'s daemon,
    /// capped at `memory_mib` and `compute_pct` (0: no cap). CUDA numbers
    /// the one GPU it sees 0.
    pub fn client_env(&self, gpu: u32, memory_mib: u64, compute_pct: u32) -> Vec<(String, String)> {
        let mut env = vec![
            (
                "CUDA_MPS_PIPE_DIRECTORY".to_string(),
                self.dir(gpu, "pipe").display().to_string(),
            ),
            (
                "CUDA_MPS_LOG_DIRECTORY".to_string(),
                self.dir(gpu, "log").display().to_string(),
            ),
            (
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_string(),
                format!("0={memory_mib}M"),
            ),
            ("GPOOL_GPU_MEM_MIB".to_string(), memory_mib.to_string()),
        ];
        if compute_pct > 0 {
            env.push(("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_string(), compute_pct.to_string()));
        }
        env
    }

    /// GPU `gpu`'s daemon runs (started now if it did not), for a fraction
    /// about to start there; `device` is how CUDA names the GPU.
    pub fn ensure(&self, gpu: u32, device: &str) -> Result<(), String> {
        let mut daemons = self.daemons.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(daemon) = daemons.get_mut(&gpu) {
            match daemon.try_wait() {
                Ok(None) => return Ok(()),
                Ok(Some(status)) => tracing::warn!(gpu, %status, "the GPU's MPS daemon had ended; starting it again"),
                Err(err) => {
                    tracing::warn!(gpu, %err, "cannot tell whether the GPU's MPS daemon runs; starting it again")
                }
            }
            daemons.remove(&gpu);
        }
        let Some(program) = &self.program else {
            if self.simulated {
                return Ok(());
            }
            return Err(format!(
                "{CONTROL_PROGRAM} is not on the agent's PATH: a fraction of a GPU runs under MPS"
            ));
        };
        let (pipe, log) = (self.dir(gpu, "pipe"), self.dir(gpu, "log"));
        for dir in [&pipe, &log] {
            std::fs::create_dir_all(dir).map_err(|err| format!("cannot create {}: {err}", dir.display()))?;
        }
        let output = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log.join("daemon.out"))
            .map_err(|err| format!("cannot open {}: {err}", log.join("daemon.out").display()))?;
        let errors = output.try_clone().map_err(|err| err.to_string())?;
        let daemon = Command::new(program)
            .arg("-f")
            .env("CUDA_VISIBLE_DEVICES", device)
            .env("CUDA_MPS_PIPE_DIRECTORY", &pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &log)
            .stdin(Stdio::null())
            .stdout(output)
            .stderr(errors)
            .spawn()
            .map_err(|err| format!("cannot start {}: {err}", program.display()))?;
        tracing::info!(gpu, pid = daemon.id(), "started the GPU's MPS daemon");
        daemons.insert(gpu, daemon);
        Ok(())
    }

    /// Stops every daemon this agent started (at its shutdown).
    pub fn stop_all(&self) {
        let mut daemons = self.daemons.lock().unwrap_or_else(|e| e.into_inner());
        for (_, mut daemon) in std::mem::take(&mut *daemons) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(daemon.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = daemon.wait();
        }
    }
}

/// `program` in a directory of this process's PATH.
fn find_on_path(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(program))
        .find(|path| path.is_file())
}
