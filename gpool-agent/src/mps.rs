//! Fractions of a GPU run as clients of one MPS control daemon per shared
//! GPU, which this agent starts (`nvidia-cuda-mps-control -f`, found on
//! its PATH) the first time a fraction lands on the GPU, and starts again
//! where it has ended. Each client is held to its memory and compute by
//! `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` and
//! `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The MPS control program, as NVIDIA ships it.
pub const CONTROL_PROGRAM: &str = "nvidia-cuda-mps-control";

/// How often each daemon is asked whether it still answers, and how long
/// it has to.
const PROBE_EVERY: Duration = Duration::from_secs(5);
/// The NVML cap library, built and installed next to the agent.
const NVML_CAP: &str = "libgpool_nvml_cap.so";
const PROBE_PATIENCE: Duration = Duration::from_secs(3);

pub struct Mps {
    shared: Arc<Shared>,
}

struct Shared {
    /// `<state>/mps`: a directory per GPU, with its pipes and logs.
    root: PathBuf,
    /// The control program; `None` where the node has none.
    program: Option<PathBuf>,
    /// Simulated GPUs have no CUDA to share: fractions run without a daemon.
    simulated: bool,
    /// `libgpool_nvml_cap.so` next to this program, preloaded into
    /// fractions so that NVML reports their cap.
    nvml_cap: Option<PathBuf>,
    daemons: Mutex<BTreeMap<u32, Daemon>>,
    /// Daemons found wedged since the last heartbeat, and why.
    faults: Mutex<Vec<(u32, String)>>,
}

/// A GPU's daemon: this agent's child, or one an earlier agent started
/// that still answers on the GPU's pipe directory (watched by the probe
/// alone: it is not this process's child).
enum Daemon {
    Child(Child),
    Adopted,
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Mps {
    /// Where the node has the control program, a thread asks each daemon
    /// every few seconds whether it answers.
    pub fn new(state_dir: &Path, simulated: bool) -> Mps {
        let shared = Arc::new(Shared {
            root: state_dir.join("mps"),
            program: find_on_path(CONTROL_PROGRAM),
            simulated,
            nvml_cap: std::env::current_exe()
                .map(|exe| exe.with_file_name(NVML_CAP))
                .ok()
                .filter(|path| path.is_file()),
            daemons: Mutex::new(BTreeMap::new()),
            faults: Mutex::new(Vec::new()),
        });
        if shared.program.is_some() {
            let watched = shared.clone();
            std::thread::spawn(move || loop {
                std::thread::sleep(PROBE_EVERY);
                watched.probe_all();
            });
        }
        Mps { shared }
    }

    /// What a fraction's process needs to be a client of GPU `gpu`'s daemon,
    /// capped at `memory_mib` and `compute_pct` (0: no cap). CUDA numbers
    /// the one GPU it sees 0.
    pub fn client_env(&self, gpu: u32, memory_mib: u64, compute_pct: u32) -> Vec<(String, String)> {
        let dir = |what: &str| self.shared.dir(gpu, what).display().to_string();
        let mut env = vec![
            ("CUDA_MPS_PIPE_DIRECTORY".to_string(), dir("pipe")),
            ("CUDA_MPS_LOG_DIRECTORY".to_string(), dir("log")),
            (
                "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_string(),
                format!("0={memory_mib}M"),
            ),
            ("GPOOL_GPU_MEM_MIB".to_string(), memory_mib.to_string()),
            ("GPOOL_SHARED_GPU".to_string(), gpu.to_string()),
        ];
        if compute_pct > 0 {
            env.push(("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_string(), compute_pct.to_string()));
        }
        env
    }

    /// Preloads the NVML cap library into a fraction on the host (its path
    /// means nothing in a container), before any library the job preloads.
    pub fn preload_cap(&self, env: &mut Vec<(String, String)>) {
        let Some(cap) = &self.shared.nvml_cap else { return };
        let mut preload = cap.display().to_string();
        for (_, theirs) in env.iter().filter(|(name, _)| name == "LD_PRELOAD") {
            preload.push(':');
            preload.push_str(theirs);
        }
        env.retain(|(name, _)| name != "LD_PRELOAD");
        env.push(("LD_PRELOAD".to_string(), preload));
    }

    /// GPU `gpu`'s daemon runs (started now if it did not), for a fraction
    /// about to start there; `device` is how CUDA names the GPU.
    pub fn ensure(&self, gpu: u32, device: &str) -> Result<(), String> {
        let shared = &self.shared;
        let mut daemons = locked(&shared.daemons);
        let serving = match daemons.get_mut(&gpu) {
            Some(Daemon::Adopted) => Some(true),
            Some(Daemon::Child(daemon)) => Some(matches!(daemon.try_wait(), Ok(None))),
            None => None,
        };
        match serving {
            Some(true) => return Ok(()),
            Some(false) => {
                daemons.remove(&gpu);
            }
            None if shared.program.is_some() && shared.dir(gpu, "pipe").is_dir() && shared.probe(gpu).is_none() => {
                // An agent before this one started it (its fractions may
                // still run under it): it serves on.
                tracing::info!(gpu, "adopted the GPU's running MPS daemon");
                daemons.insert(gpu, Daemon::Adopted);
                return Ok(());
            }
            None => {}
        }
        let Some(program) = &shared.program else {
            if shared.simulated {
                return Ok(());
            }
            return Err(format!(
                "{CONTROL_PROGRAM} is not on the agent's PATH: a fraction of a GPU runs under MPS"
            ));
        };
        let (pipe, log) = (shared.dir(gpu, "pipe"), shared.dir(gpu, "log"));
        for dir in [&pipe, &log] {
            std::fs::create_dir_all(dir).map_err(|err| format!("cannot create {}: {err}", dir.display()))?;
            // As MPS's own /tmp/nvidia-mps: the server it starts for a job's
            // user (where the agent runs jobs as their users) writes here.
            let open = std::os::unix::fs::PermissionsExt::from_mode(0o1777);
            std::fs::set_permissions(dir, open).map_err(|err| format!("cannot open up {}: {err}", dir.display()))?;
        }
        let out = log.join("daemon.out");
        let output = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&out)
            .map_err(|err| format!("cannot open {}: {err}", out.display()))?;
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
        daemons.insert(gpu, Daemon::Child(daemon));
        Ok(())
    }

    /// The GPUs whose daemon failed since the last call, and how: it
    /// exited, or it stopped answering (and was stopped). The next fraction
    /// on the GPU starts a new one.
    pub fn failures(&self) -> Vec<(u32, String)> {
        let mut failed = std::mem::take(&mut *locked(&self.shared.faults));
        locked(&self.shared.daemons).retain(|gpu, daemon| match daemon {
            Daemon::Adopted => true,
            Daemon::Child(daemon) => match daemon.try_wait() {
                Ok(None) => true,
                Ok(Some(status)) => {
                    tracing::warn!(gpu, %status, "the GPU's MPS daemon exited");
                    failed.push((*gpu, format!("exited ({status})")));
                    false
                }
                Err(err) => {
                    failed.push((*gpu, format!("cannot be waited for ({err})")));
                    false
                }
            },
        });
        failed
    }
}

impl Shared {
    fn dir(&self, gpu: u32, what: &str) -> PathBuf {
        self.root.join(format!("gpu{gpu}")).join(what)
    }

    /// Asks every daemon whether it answers; one that does not is stopped,
    /// and its GPU's failure reported with the next heartbeat.
    fn probe_all(&self) {
        let gpus: Vec<u32> = locked(&self.daemons).keys().copied().collect();
        for gpu in gpus {
            let Some(why) = self.probe(gpu) else {
                continue;
            };
            tracing::warn!(gpu, %why, "the GPU's MPS daemon is wedged: stopping it");
            // An adopted one is not this process's to stop.
            if let Some(Daemon::Child(mut daemon)) = locked(&self.daemons).remove(&gpu) {
                let _ = daemon.kill();
                let _ = daemon.wait();
            }
            locked(&self.faults).push((gpu, why));
        }
    }

    /// Why GPU `gpu`'s daemon did not answer `get_server_list`; `None`
    /// where it did.
    fn probe(&self, gpu: u32) -> Option<String> {
        let program = self.program.as_ref()?;
        let mut client = Command::new(program)
            .env("CUDA_MPS_PIPE_DIRECTORY", self.dir(gpu, "pipe"))
            .env("CUDA_MPS_LOG_DIRECTORY", self.dir(gpu, "log"))
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        if let Some(mut stdin) = client.stdin.take() {
            let _ = std::io::Write::write_all(&mut stdin, b"get_server_list\n");
        }
        let asked = Instant::now();
        loop {
            match client.try_wait() {
                Ok(Some(status)) if status.success() => return None,
                Ok(Some(status)) => return Some(format!("answered get_server_list with {status} (wedged)")),
                Ok(None) if asked.elapsed() < PROBE_PATIENCE => std::thread::sleep(Duration::from_millis(50)),
                _ => {
                    let _ = client.kill();
                    let _ = client.wait();
                    return Some(format!(
                        "did not answer get_server_list within {} s (wedged)",
                        PROBE_PATIENCE.as_secs()
                    ));
                }
            }
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
