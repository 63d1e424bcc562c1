//! The power loop: once a second it asks the state what the `[[power]]`
//! groups' programs should do, and runs each in a process of its own with
//! a timeout, so that a slow or hung program never holds up the state task
//! or the scheduling loop. What a program prints goes to gpoold's log; a
//! failure goes back to the state (the node's power book and health log).

use crate::state::{Command, PowerAction, StateHandle};
use gpool_core::power::Action;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

/// How often the book is looked at.
const TICK: Duration = Duration::from_secs(1);
/// The longest a `suspend` or `resume_failed` program may run.
const PROGRAM_TIMEOUT: Duration = Duration::from_secs(300);

/// Runs until the state task stops answering. `dir` holds the JSON files
/// of the jobs each resume is for.
pub async fn run(handle: StateHandle, dir: PathBuf) {
    let mut programs = tokio::task::JoinSet::new();
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            Some(_) = programs.join_next() => continue,
        }
        // Without groups (until a reload brings some) the state task is
        // left alone.
        let no_groups = handle.shared.read().map_or(true, |state| state.power.groups.is_empty());
        if no_groups {
            continue;
        }
        let Ok(actions) = handle.call(|reply| Command::PowerTick { reply }).await else {
            break;
        };
        for action in actions {
            programs.spawn(run_action(handle.clone(), action, dir.clone()));
        }
    }
}

async fn run_action(handle: StateHandle, todo: PowerAction, dir: PathBuf) {
    let PowerAction { action, programs } = todo;
    let group = &programs.group;
    let (name, program, nodes, extra, timeout) = match &action {
        Action::Resume { nodes, jobs, .. } => {
            let file = match write_jobs_file(&dir, &group.name, nodes, jobs) {
                Ok(file) => Some(file),
                Err(err) => {
                    tracing::warn!(group = group.name, "power: cannot write the resume's jobs file: {err}");
                    None
                }
            };
            let timeout = Duration::from_secs(group.resume_timeout_secs);
            ("resume", Some(programs.resume.clone()), nodes, file, timeout)
        }
        // Killed by the time the node's suspend times out, so that it never
        // runs on a node that is up (or resumed) again.
        Action::Suspend { nodes, .. } => {
            let timeout = Duration::from_secs(group.suspend_timeout_secs.max(1));
            ("suspend", Some(programs.suspend.clone()), nodes, None, timeout)
        }
        Action::ResumeFailed { nodes, reason, .. } => {
            tracing::warn!(
                group = group.name,
                nodes = nodes.join(","),
                "power: resume failed: {reason}"
            );
            let failed = programs.resume_failed.clone();
            ("resume_failed", failed, nodes, None, PROGRAM_TIMEOUT)
        }
    };
    let Some(program) = program else { return };
    tracing::info!(
        group = group.name,
        nodes = nodes.join(","),
        "power: running {name} ({})",
        program.display()
    );
    let (outcome, mut readers) = run_program(&program, &group.name, nodes, extra.as_deref(), timeout).await;
    if let Some(file) = extra {
        let _ = std::fs::remove_file(file);
    }
    if let Err(why) = &outcome {
        tracing::warn!(
            group = group.name,
            nodes = nodes.join(","),
            "power: {name} failed: {why}"
        );
        let command = Command::PowerFailed {
            program: name,
            nodes: nodes.clone(),
            why: why.clone(),
        };
        let _ = handle.commands.send(command).await;
    }
    if name == "suspend" {
        let _ = handle
            .commands
            .send(Command::PowerSuspended { nodes: nodes.clone() })
            .await;
    }
    // What a program left running (an agent) may write to its pipes for
    // as long as it lives: they are read to their end, so that no write
    // of it meets a closed pipe.
    while readers.join_next().await.is_some() {}
}

/// The jobs a resume is for, as JSON: `{"group", "nodes", "jobs"}`.
fn write_jobs_file(dir: &Path, group: &str, nodes: &[String], jobs: &[gpool_core::JobId]) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let body = serde_json::json!({
        "group": group,
        "nodes": nodes,
        "jobs": jobs.iter().map(|job| job.0).collect::<Vec<u64>>(),
    });
    let file = dir.join(format!(
        "resume-{group}-{}.json",
        nodes.first().map_or("", String::as_str)
    ));
    std::fs::write(&file, body.to_string())?;
    Ok(file)
}

/// Runs `program NODES [FILE]` until it exits or `timeout` passes (then
/// it is killed, with what it started in its process group): Ok where it
/// exited 0, with the tasks that log what it (and what it left running)
/// prints until the pipes close.
async fn run_program(
    program: &Path,
    group: &str,
    nodes: &[String],
    file: Option<&Path>,
    timeout: Duration,
) -> (Result<(), String>, tokio::task::JoinSet<()>) {
    let mut readers = tokio::task::JoinSet::new();
    let mut command = tokio::process::Command::new(program);
    command
        .arg(nodes.join(","))
        .env("GPOOL_POWER_GROUP", group)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(file) = file {
        command.arg(file);
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(err) => return (Err(format!("cannot start {}: {err}", program.display())), readers),
    };
    let pipes: [(Option<Box<dyn tokio::io::AsyncRead + Send + Unpin>>, &'static str); 2] = [
        (child.stdout.take().map(|out| Box::new(out) as _), "stdout"),
        (child.stderr.take().map(|err| Box::new(err) as _), "stderr"),
    ];
    for (pipe, stream) in pipes {
        let Some(pipe) = pipe else { continue };
        let group = group.to_string();
        readers.spawn(async move {
            let mut lines = BufReader::new(pipe).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::info!(group, stream, "power program: {line}");
            }
        });
    }
    (wait_for(&mut child, program, timeout).await, readers)
}

async fn wait_for(child: &mut tokio::process::Child, program: &Path, timeout: Duration) -> Result<(), String> {
    match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(status)) if status.success() => Ok(()),
        Ok(Ok(status)) => Err(format!("{} {status}", program.display())),
        Ok(Err(err)) => Err(format!("waiting for {}: {err}", program.display())),
        Err(_) => {
            if let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) {
                let _ = nix::sys::signal::killpg(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
            }
            let _ = child.start_kill();
            let _ = child.wait().await;
            Err(format!(
                "{} ran past {} s and was killed",
                program.display(),
                timeout.as_secs()
            ))
        }
    }
}
