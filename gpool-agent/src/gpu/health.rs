//! What the agent reports for GPU health besides its readings: Xid events
//! (from NVML's event set, or injected), injected faults, and the latest run
//! of the operator's health program. gpoold decides what they mean.

use gpool_proto::pb;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Most Xid events kept between two heartbeats (a storm is cut short).
const MAX_PENDING_XIDS: usize = 256;

/// Shared between the Xid watcher, the health program's timer, the link
/// (injections arrive there) and the heartbeat.
#[derive(Default)]
pub struct Health {
    state: Mutex<Faults>,
}

#[derive(Default)]
struct Faults {
    xids: Vec<pb::XidEvent>,
    temperature_c: BTreeMap<u32, u32>,
    extra_dbe: BTreeMap<u32, u64>,
    vanished: BTreeSet<u32>,
    remap_failure: BTreeMap<u32, bool>,
    check: Option<pb::HealthCheck>,
}

impl Health {
    fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An Xid event for GPU `index`, reported with the next heartbeat.
    pub fn push_xid(&self, index: u32, xid: u32) {
        let mut faults = self.faults();
        if faults.xids.len() < MAX_PENDING_XIDS {
            faults.xids.push(pb::XidEvent { index, xid });
        }
    }

    /// A fault gpoold asked this node to report (`gpool admin inject`).
    pub fn inject(&self, inject: &pb::Inject) {
        tracing::warn!(gpu = inject.gpu, ?inject, "injecting a GPU fault, as asked by an admin");
        if inject.xid != 0 {
            self.push_xid(inject.gpu, inject.xid);
        }
        let mut faults = self.faults();
        if inject.ecc_dbe {
            *faults.extra_dbe.entry(inject.gpu).or_default() += 1;
        }
        if let Some(temperature) = inject.temperature_c {
            faults.temperature_c.insert(inject.gpu, temperature);
        }
        match inject.vanished {
            Some(true) => {
                faults.vanished.insert(inject.gpu);
            }
            Some(false) => {
                faults.vanished.remove(&inject.gpu);
            }
            None => {}
        }
        if let Some(failed) = inject.remap_failure {
            faults.remap_failure.insert(inject.gpu, failed);
        }
    }

    pub fn set_check(&self, check: pb::HealthCheck) {
        self.faults().check = Some(check);
    }

    /// A heartbeat of `samples` with the injected faults applied, the Xid
    /// events since the last one (taken), and the latest health check.
    pub fn heartbeat(&self, mut samples: Vec<pb::GpuSample>, seq: u64) -> pb::Heartbeat {
        let mut faults = self.faults();
        samples.retain(|sample| !faults.vanished.contains(&sample.index));
        for sample in &mut samples {
            if let Some(temperature) = faults.temperature_c.get(&sample.index) {
                sample.temperature_c = *temperature;
            }
            sample.ecc_uncorrected += faults.extra_dbe.get(&sample.index).copied().unwrap_or(0);
            if let Some(failed) = faults.remap_failure.get(&sample.index) {
                sample.remap_failure = *failed;
            }
        }
        pb::Heartbeat {
            samples,
            seq,
            xids: std::mem::take(&mut faults.xids),
            health_check: faults.check.clone(),
            spool_short: String::new(),
            readings_stuck: String::new(),
            mps_faults: Vec::new(),
        }
    }

    /// Puts back Xid events of a heartbeat that could not be sent.
    pub fn unsent(&self, heartbeat: pb::Heartbeat) {
        let mut faults = self.faults();
        let mut xids = heartbeat.xids;
        xids.append(&mut faults.xids);
        xids.truncate(MAX_PENDING_XIDS);
        faults.xids = xids;
    }
}

/// The operator's health program (as Slurm's HealthCheckProgram): run every
/// `interval`, passing when it exits 0 within `timeout`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthProgram {
    pub program: PathBuf,
    pub interval: Duration,
    pub timeout: Duration,
}

/// Runs `program` now and then every interval, keeping each result in
/// `health` for the heartbeats.
pub async fn run_health_program(program: HealthProgram, health: Arc<Health>) {
    let mut timer = tokio::time::interval(program.interval);
    loop {
        timer.tick().await;
        let check = run_once(&program).await;
        if !check.passed {
            tracing::warn!(program = %program.program.display(), message = %check.message, "health program failed");
        }
        health.set_check(check);
    }
}

async fn run_once(program: &HealthProgram) -> pb::HealthCheck {
    let at_ms = crate::launch::now_ms();
    let child = tokio::process::Command::new(&program.program)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn();
    let child = match child {
        Ok(child) => child,
        Err(err) => {
            return pb::HealthCheck {
                passed: false,
                message: format!("cannot run {}: {err}", program.program.display()),
                at_ms,
            }
        }
    };
    let (passed, message) = match tokio::time::timeout(program.timeout, child.wait_with_output()).await {
        Err(_) => (
            false,
            format!("did not finish within {}", humantime::format_duration(program.timeout)),
        ),
        Ok(Err(err)) => (false, format!("cannot wait for it: {err}")),
        Ok(Ok(output)) => {
            let text = String::from_utf8_lossy(if output.stdout.is_empty() {
                &output.stderr
            } else {
                &output.stdout
            })
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(200)
            .collect::<String>();
            match output.status.code() {
                Some(0) => (true, text),
                Some(code) if text.is_empty() => (false, format!("exited with {code}")),
                Some(code) => (false, format!("exited with {code}: {text}")),
                None => (false, "killed by a signal".into()),
            }
        }
    };
    pb::HealthCheck { passed, message, at_ms }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(index: u32) -> pb::GpuSample {
        pb::GpuSample {
            index,
            temperature_c: 35,
            ..pb::GpuSample::default()
        }
    }

    #[test]
    fn injected_faults_show_in_the_next_heartbeats() {
        let health = Health::default();
        health.inject(&pb::Inject {
            gpu: 1,
            xid: 79,
            ecc_dbe: true,
            temperature_c: Some(95),
            vanished: None,
            remap_failure: None,
        });
        health.inject(&pb::Inject {
            gpu: 2,
            vanished: Some(true),
            ..pb::Inject::default()
        });
        let first = health.heartbeat(vec![sample(0), sample(1), sample(2)], 1);
        assert_eq!(first.samples.iter().map(|s| s.index).collect::<Vec<_>>(), vec![0, 1]);
        assert_eq!(
            (first.samples[1].temperature_c, first.samples[1].ecc_uncorrected),
            (95, 1)
        );
        assert_eq!(first.xids, vec![pb::XidEvent { index: 1, xid: 79 }]);
        // The Xid is sent once; the rest lasts.
        let second = health.heartbeat(vec![sample(0), sample(1)], 2);
        assert!(second.xids.is_empty());
        assert_eq!(second.samples[1].temperature_c, 95);
        health.unsent(first);
        assert_eq!(health.heartbeat(vec![], 3).xids.len(), 1);
    }

    #[tokio::test]
    async fn a_health_program_passes_on_exit_0_and_fails_otherwise() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, body: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            let mut permissions = std::fs::metadata(&path).unwrap().permissions();
            std::os::unix::fs::PermissionsExt::set_mode(&mut permissions, 0o755);
            std::fs::set_permissions(&path, permissions).unwrap();
            path
        };
        let program = |path: PathBuf| HealthProgram {
            program: path,
            interval: Duration::from_secs(1),
            timeout: Duration::from_millis(500),
        };
        let good = run_once(&program(write("good", "echo all fine"))).await;
        assert!(good.passed && good.message == "all fine", "{good:?}");
        let bad = run_once(&program(write("bad", "echo fan 3 failed; exit 2"))).await;
        assert_eq!(
            (bad.passed, bad.message.as_str()),
            (false, "exited with 2: fan 3 failed")
        );
        let slow = run_once(&program(write("slow", "sleep 5"))).await;
        assert!(!slow.passed && slow.message.starts_with("did not finish"), "{slow:?}");
        let missing = run_once(&program(dir.path().join("none"))).await;
        assert!(
            !missing.passed && missing.message.starts_with("cannot run"),
            "{missing:?}"
        );
    }
}
