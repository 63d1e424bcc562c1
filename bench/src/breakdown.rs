//! Where the CPU goes while 4 agents drain a 10,000-task array of `true`,
//! per job and by process, beside the machine's floor (`xargs -P 8` running
//! as many `true`s): gpoold, the agents, the nodes' launchers (each with its
//! keeper), and the rest (the jobs themselves and the kernel's work for
//! them, such as forks and cgroups), with the share of the CPUs left idle.
//!
//! Long-lived processes are read from `/proc/PID/stat`; the short-lived
//! ones only show in the machine's total (`/proc/stat`), so on a shared
//! machine "the rest" also holds whatever else ran: the load average is
//! printed beside it.

use super::*;

/// CPU time in clock ticks (`USER_HZ`, 100 a second on Linux).
const TICKS_PER_SEC: f64 = 100.0;

/// The machine's busy and idle ticks, all CPUs together.
fn machine_ticks() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = text
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|field| field.parse().ok())
        .collect();
    let at = |index: usize| fields.get(index).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal
    let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    (busy, at(3) + at(4))
}

/// A process's own CPU ticks (all its threads) and those of the children
/// it reaped.
fn process_ticks(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name, which is in parentheses.
    let rest = text.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<u64> = rest
        .split_whitespace()
        .skip(1)
        .map(|field| field.parse().unwrap_or(0))
        .collect();
    let at = |index: usize| fields.get(index).copied().unwrap_or(0);
    // utime stime cutime cstime are fields 14-17, 11-14 after the state.
    (at(10) + at(11), at(12) + at(13))
}

/// The children of process `pid` (an agent's keeper, a keeper's launcher).
fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|text| {
            text.split_whitespace()
                .filter_map(|child| child.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// Ticks of each part at one moment.
#[derive(Default, Clone, Copy)]
struct Snapshot {
    busy: u64,
    idle: u64,
    gpoold: u64,
    agents: u64,
    spawners: u64,
}

fn snapshot(gpoold: u32, agents: &[u32]) -> Snapshot {
    let (busy, idle) = machine_ticks();
    // Their own CPU only: what a launcher reaped is its jobs'.
    let spawners: u64 = agents
        .iter()
        .flat_map(|agent| children(*agent))
        .flat_map(|keeper| std::iter::once(keeper).chain(children(keeper)))
        .map(|process| process_ticks(process).0)
        .sum();
    Snapshot {
        busy,
        idle,
        gpoold: process_ticks(gpoold).0,
        agents: agents.iter().map(|agent| process_ticks(*agent).0).sum(),
        spawners,
    }
}

/// Milliseconds of CPU per job for `ticks` over `n_jobs`.
fn per_job_ms(ticks: u64, n_jobs: usize) -> f64 {
    ticks as f64 / TICKS_PER_SEC * 1000.0 / n_jobs as f64
}

/// The floor: `seq N | xargs -P 8 -n 1 true`, its rate and CPU per process.
fn floor(n_jobs: usize) -> anyhow::Result<(f64, f64, f64)> {
    let before = machine_ticks();
    let started = Instant::now();
    let status = Command::new("sh")
        .arg("-c")
        .arg(format!("seq {n_jobs} | xargs -P 8 -n 1 true"))
        .status()?;
    if !status.success() {
        bail!("xargs -P 8 -n 1 true failed: {status}");
    }
    let wall = started.elapsed().as_secs_f64();
    let after = machine_ticks();
    let idle = (after.1 - before.1) as f64 / ((after.0 + after.1) - (before.0 + before.1)).max(1) as f64;
    Ok((n_jobs as f64 / wall, per_job_ms(after.0 - before.0, n_jobs), idle))
}

pub(crate) fn breakdown(n_agents: usize, n_gpus: u32, n_jobs: usize) -> anyhow::Result<()> {
    let (floor_rate, floor_ms, floor_idle) = floor(n_jobs)?;
    report(
        &format!("floor: seq {n_jobs} | xargs -P 8 -n 1 true"),
        format!(
            "{floor_rate:.0}/s, {floor_ms:.2} ms CPU each, idle {:.0}%",
            floor_idle * 100.0
        ),
    );
    let dir = tempfile::tempdir()?;
    let controller = Controller::start(dir.path())?;
    let agents = start_agents(&controller, n_agents, n_gpus)?;
    let agent_pids: Vec<u32> = agents.0.iter().map(Child::id).collect();
    let before = snapshot(controller.child.id(), &agent_pids);
    let started = Instant::now();
    let last = format!("0-{}", n_jobs - 1);
    let submitted = gpool(
        &controller.addr,
        &[
            "submit",
            "--array",
            &last,
            "--gpus",
            "1",
            "--discard-output",
            "--",
            "true",
        ],
    )?;
    let id = String::from_utf8_lossy(&submitted.stdout).trim().to_string();
    let waited = gpool(&controller.addr, &["wait", &id])?;
    if !waited.status.success() {
        bail!("gpool wait {id}: {}", String::from_utf8_lossy(&waited.stderr));
    }
    let wall = started.elapsed().as_secs_f64();
    let after = snapshot(controller.child.id(), &agent_pids);
    let busy = after.busy - before.busy;
    let total = busy + (after.idle - before.idle);
    let parts = [
        ("gpoold", after.gpoold - before.gpoold),
        ("agents (their own threads)", after.agents - before.agents),
        ("launchers and keepers (their own)", after.spawners - before.spawners),
    ];
    let named: u64 = parts.iter().map(|(_, ticks)| ticks).sum();
    let shape = format!("{n_agents} agents x {n_gpus} GPUs, {n_jobs}-task array of true");
    report(
        &format!("{shape}: rate"),
        format!(
            "{:.0}/s ({:.0}% of the floor)",
            n_jobs as f64 / wall,
            n_jobs as f64 / wall / floor_rate * 100.0
        ),
    );
    report(
        &format!("{shape}: CPU per job, all"),
        format!(
            "{:.2} ms, idle {:.0}%",
            per_job_ms(busy, n_jobs),
            (total - busy) as f64 / total.max(1) as f64 * 100.0
        ),
    );
    for (part, ticks) in parts {
        report(&format!("  {part}"), format!("{:.2} ms", per_job_ms(ticks, n_jobs)));
    }
    let rest = busy.saturating_sub(named);
    report(
        "  the rest: jobs, kernel work, anything else running",
        format!("{:.2} ms", per_job_ms(rest, n_jobs)),
    );
    report(
        "  of it beyond the floor's cost of one true",
        format!("{:.2} ms", per_job_ms(rest, n_jobs) - floor_ms),
    );
    drop(agents);
    controller.stop();
    Ok(())
}
