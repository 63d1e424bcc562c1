//! Taking lent GPUs back as a shared pool does it: the shipped gpoold.toml
//! (teams with guarantees and `guaranteed_in`, QoS classes with a reserve),
//! H100, A100 (tier=inference) and L4 nodes, an array of burst work that
//! checkpoints when told, and another team's array within its guarantee.
//! Then the same scenario replayed by `gpool sim`: the same victims.

use crate::harness::cluster::{current_user, gpool_command, Cluster};
use crate::harness::process::{binary, wait_until};
use serde_json::Value;
use std::time::Duration;

/// The policy of the shipped config/gpoold.toml (pools, sharing, teams,
/// QoS, health, accounting), with the tester among every team's members.
pub(crate) fn shipped_policy() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/gpoold.toml");
    let text = std::fs::read_to_string(path).expect("config/gpoold.toml");
    let from = text.find("[[pool]]").expect("the shipped config has pools");
    let user = current_user();
    text[from..]
        .replace(
            "members = [\"alice\", \"bob\"]",
            &format!("members = [\"alice\", \"bob\", \"{user}\"]"),
        )
        .replace("members = [\"carol\"]", &format!("members = [\"carol\", \"{user}\"]"))
}

/// `shipped_policy` with gpoold's /metrics on, where the tests read how
/// many plans broke a scheduling invariant (`Cluster::invariant_violations`).
pub(crate) fn shipped_config() -> String {
    format!("metrics_listen = \"127.0.0.1:0\"\n{}", shipped_policy())
}

/// The fleet of the scenario: 28 GPUs.
pub(crate) const NODES: [(&str, &str, u32, u64, &str); 4] = [
    ("h100-a", "h100", 8, 81_559, ""),
    ("h100-b", "h100", 8, 81_559, ""),
    ("a100-a", "a100-80gb", 8, 81_920, "[labels]\ntier = \"inference\"\n"),
    ("l4-a", "l4", 4, 23_034, ""),
];

pub(crate) fn agent_config(model: &str, count: u32, memory_mib: u64, labels: &str) -> String {
    format!("{labels}\n[[simulated_gpu]]\nmodel = \"{model}\"\nmemory_mib = {memory_mib}\ncount = {count}\n")
}

/// Every task of the arrays as `gpool jobs -r` lists them, ended ones too.
fn tasks(cluster: &Cluster) -> Vec<Value> {
    let jobs = cluster.gpool(&["jobs", "-r", "--all", "--output", "json"]).json();
    jobs.as_array().expect("a list").clone()
}

fn count(tasks: &[Value], team: &str, state: &str) -> usize {
    tasks
        .iter()
        .filter(|t| t["team"] == team && t["state"] == state && t["array"].is_null())
        .count()
}

fn preemptions(tasks: &[Value], team: &str) -> u64 {
    tasks
        .iter()
        .filter(|t| t["team"] == team)
        .map(|t| t["n_preemptions"].as_u64().unwrap_or(0))
        .sum()
}

/// nlp's 21 low-QoS 1-GPU tasks fill the fleet but for 7 GPUs (4 of them
/// kept for QoS high); vision's 10 tasks then come, guaranteed 8. Vision
/// starts 7 on the free GPUs (the 4 kept for `high` too: nlp lends 17
/// burst GPUs that `high` would take back, so the reserve is there within
/// a grace) and takes exactly 1 back: one victim per GPU its guarantee
/// still needs, never a second victim for a task whose first is still in
/// its grace, and the victim's GPU goes to that task, never to another nlp
/// task. Its 2 tasks beyond its guarantee wait as burst work.
#[test]
fn reclaiming_for_a_guaranteed_array_takes_one_victim_per_gpu_it_is_owed() {
    let mut cluster = Cluster::with_config(&shipped_config());
    for (node, model, count, memory_mib, labels) in NODES {
        cluster.start_agent_with(node, 0, &agent_config(model, count, memory_mib, labels));
    }
    let gpool = binary("gpool").display().to_string();
    let nlp_task = format!(
        "trap 'echo step > \"$GPOOL_CHECKPOINT_DIR/state\"; {gpool} checkpoint; exit 0' USR1; \
         touch nlp-$GPOOL_JOB_ID-$GPOOL_RESTART_COUNT; \
         while [ ! -e release ]; do sleep 0.2; done"
    );
    cluster.submit(&[
        "--team", "nlp", "--qos", "low", "-a", "0-20", "--", "sh", "-c", &nlp_task,
    ]);
    // Running, and each has set its checkpoint trap (a signal before that
    // would be lost on the shell).
    wait_until("nlp's 21 tasks to run", Duration::from_secs(60), || {
        let started = std::fs::read_dir(cluster.dir.path())
            .ok()?
            .filter_map(Result::ok)
            .filter(|entry| entry.file_name().to_string_lossy().starts_with("nlp-"))
            .count();
        (started == 21 && count(&tasks(&cluster), "nlp", "running") == 21).then_some(())
    });
    let vision_task = "touch vision-$GPOOL_JOB_ID; while [ ! -e release ]; do sleep 0.2; done";
    cluster.submit(&["--team", "vision", "-a", "0-9", "--", "sh", "-c", vision_task]);
    wait_until("vision's 8 guaranteed tasks to run", Duration::from_secs(90), || {
        (count(&tasks(&cluster), "vision", "running") == 8).then_some(())
    });
    // Cycles go on every few ms: time for any extra victim to show.
    std::thread::sleep(Duration::from_secs(4));
    let tasks = tasks(&cluster);
    let listing: Vec<String> = tasks
        .iter()
        .map(|t| {
            format!(
                "{} {} {} burst={} preempted={} array={}",
                t["id"], t["team"], t["state"], t["burst"], t["n_preemptions"], t["array"]
            )
        })
        .collect();
    let listing = listing.join("\n");
    assert_eq!(preemptions(&tasks, "nlp"), 1, "victims:\n{listing}");
    assert_eq!(preemptions(&tasks, "vision"), 0);
    assert_eq!(count(&tasks, "vision", "running"), 8, "{listing}");
    let vision_array = tasks
        .iter()
        .find(|t| t["team"] == "vision" && !t["array"].is_null())
        .expect("vision's array");
    assert_eq!(vision_array["array"]["waiting"], 2, "{listing}");
    let burst_vision = tasks
        .iter()
        .filter(|t| t["team"] == "vision" && t["state"] == "running" && t["burst"] == true)
        .count();
    assert_eq!(burst_vision, 0, "vision's running tasks are all guaranteed");
    // The victim waits again; the other 20 run their first attempt.
    assert_eq!(count(&tasks, "nlp", "running"), 20, "{listing}");
    assert_eq!(count(&tasks, "nlp", "pending"), 1, "{listing}");
    // Each victim says why it waits again, and for whom it was preempted.
    for victim in tasks.iter().filter(|t| t["n_preemptions"] == 1) {
        assert_eq!(victim["requeue_cause"], "preempted", "{victim}");
        assert!(victim["events"].to_string().contains("preempted for job"), "{victim}");
        assert_eq!(victim["reason_codes"][0], "preempted", "{victim}");
    }
    // Every GPU is busy: the victim's went to vision, not back to nlp.
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    let free: u64 = nodes
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| n["gpus_free"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(free, 0, "{nodes}");
    // Each victim's log line names the vision task it was taken for, one each.
    let log = std::fs::read_to_string(cluster.dir.path().join("gpoold-1.log")).unwrap_or_default();
    let mut for_jobs: Vec<String> = log
        .lines()
        .map(without_colours)
        .filter(|line| line.contains("preempting:"))
        .filter_map(|line| Some(line.split("for_job=").nth(1)?.split_whitespace().next()?.to_string()))
        .collect();
    let n_lines = for_jobs.len();
    for_jobs.sort_unstable();
    for_jobs.dedup();
    assert_eq!(
        (n_lines, for_jobs.len()),
        (1, 1),
        "one victim, for one vision task:\n{log}"
    );
    cluster.assert_plans_sound();
    std::fs::write(cluster.dir.path().join("release"), "").expect("release");
}

/// The shipped config; 24 nlp low-QoS tasks that trap USR1 and run on
/// (with `grace` of their own), each until its own release file or the
/// common one; 4 vision tasks on the GPUs kept for QoS high. A fifth vision
/// job takes an nlp victim; another nlp task then ends and the vision job
/// starts on its GPU, so the victim's preemption is withdrawn. Returns the
/// cluster and the victim's id, once its events say so.
fn withdrawn_victim(grace: &str) -> (Cluster, u64) {
    let mut cluster = Cluster::with_config(&shipped_config());
    for (node, model, count, memory_mib, labels) in NODES {
        cluster.start_agent_with(node, 0, &agent_config(model, count, memory_mib, labels));
    }
    // nlp's tasks checkpoint when signalled and run on (a grace of 4 s of
    // their own), each until its own release file or the common one.
    let nlp_task = "trap 'touch signalled-$GPOOL_JOB_ID' USR1; touch nlp-$GPOOL_JOB_ID-$GPOOL_RESTART_COUNT; \
                    while [ ! -e release-$GPOOL_JOB_ID ] && [ ! -e release ]; do sleep 0.2; done";
    // 24 GPUs for nlp (4 of them guaranteed); the 4 kept for QoS high go
    // to 4 vision tasks within its guarantee, backed by nlp's 20 lent.
    cluster.submit(&[
        "--team", "nlp", "--qos", "low", "--grace", grace, "-a", "0-23", "--", "sh", "-c", nlp_task,
    ]);
    let started = |cluster: &Cluster| {
        std::fs::read_dir(cluster.dir.path())
            .map(|dir| {
                dir.filter_map(Result::ok)
                    .filter(|entry| entry.file_name().to_string_lossy().starts_with("nlp-"))
                    .count()
            })
            .unwrap_or(0)
    };
    wait_until("nlp's 24 tasks to run", Duration::from_secs(60), || {
        (started(&cluster) == 24 && count(&tasks(&cluster), "nlp", "running") == 24).then_some(())
    });
    let hold = "while [ ! -e release ]; do sleep 0.2; done";
    cluster.submit(&["--team", "vision", "-a", "0-3", "--", "sh", "-c", hold]);
    wait_until("vision's 4 tasks to fill the fleet", Duration::from_secs(30), || {
        (count(&tasks(&cluster), "vision", "running") == 4).then_some(())
    });
    let vision = cluster.submit(&["--team", "vision", "--", "sh", "-c", hold]);
    let victim = wait_until("a victim for vision's job", Duration::from_secs(30), || {
        let victim = std::fs::read_dir(cluster.dir.path())
            .ok()?
            .filter_map(Result::ok)
            .find_map(|entry| {
                Some(
                    entry
                        .file_name()
                        .to_string_lossy()
                        .strip_prefix("signalled-")?
                        .to_string(),
                )
            })?;
        victim.parse::<u64>().ok()
    });
    // Another nlp task ends: vision's job starts on its GPU.
    let other = tasks(&cluster)
        .iter()
        .filter(|t| t["team"] == "nlp" && t["state"] == "running" && t["array"].is_null())
        .filter_map(|t| t["id"].as_u64())
        .find(|id| *id != victim)
        .expect("another nlp task");
    std::fs::write(cluster.dir.path().join(format!("release-{other}")), "").expect("release one");
    cluster.wait_for_state(vision, "running");
    wait_until("the preemption to be withdrawn", Duration::from_secs(20), || {
        let shown = cluster.gpool(&["show", &victim.to_string(), "--output", "json"]).json();
        shown["events"]
            .to_string()
            .contains("preemption withdrawn")
            .then_some(())
    });
    (cluster, victim)
}

/// A victim is taken for a vision job; before its grace is over another
/// GPU frees up and the vision job starts there. Nothing needs the
/// victim's GPU any more, so its preemption is withdrawn: it is not killed
/// when its grace ends, runs on in its first attempt, is not counted as
/// preempted, and its events say why.
#[test]
fn a_victim_no_job_needs_any_more_runs_on_in_its_first_attempt() {
    let (cluster, victim) = withdrawn_victim("4s");
    let shown = cluster.gpool(&["show", &victim.to_string(), "--output", "json"]).json();
    assert_eq!(shown["state"], "running", "{shown}");
    // Its grace ends: it is not killed.
    let shown = wait_until("its grace to end", Duration::from_secs(20), || {
        let shown = cluster.gpool(&["show", &victim.to_string(), "--output", "json"]).json();
        shown["events"]
            .to_string()
            .contains("grace over with its preemption withdrawn: it runs on")
            .then_some(shown)
    });
    assert_eq!(shown["state"], "running", "{shown}");
    assert_eq!(shown["n_preemptions"].as_u64().unwrap_or(0), 0, "{shown}");
    assert!(shown["requeue_cause"].is_null(), "{shown}");
    // Well past the cycles that could have killed it: still its first attempt.
    std::thread::sleep(Duration::from_secs(2));
    let tasks = tasks(&cluster);
    assert_eq!(preemptions(&tasks, "nlp"), 0);
    assert_eq!(count(&tasks, "nlp", "running"), 23);
    assert!(!cluster.dir.path().join(format!("nlp-{victim}-1")).exists());
    let log = std::fs::read_to_string(cluster.dir.path().join("gpoold-1.log")).unwrap_or_default();
    assert!(log.contains("preemption withdrawn"), "{log}");
    cluster.assert_plans_sound();
    std::fs::write(cluster.dir.path().join("release"), "").expect("release");
}

/// A withdrawn preemption does not undo the signal: a victim that
/// checkpoints and exits within its grace (as asked) goes back to the
/// queue, counted as preempted, and runs again; it is never taken for
/// completed.
#[test]
fn a_victim_that_exits_within_a_withdrawn_grace_is_requeued_not_completed() {
    let (cluster, victim) = withdrawn_victim("60s");
    std::fs::write(cluster.dir.path().join(format!("release-{victim}")), "").expect("release the victim");
    let shown = wait_until("the victim to run again", Duration::from_secs(30), || {
        let shown = cluster.gpool(&["show", &victim.to_string(), "--output", "json"]).json();
        (shown["state"] != "running" || shown["attempt"] != 1).then_some(shown)
    });
    // Back in the queue, or already in its next attempt (which, finding
    // its release file, may have completed): never completed in attempt 1.
    let attempt = shown["attempt"].as_u64().unwrap_or(0);
    assert!(shown["state"] == "pending" || attempt >= 2, "{shown}");
    assert_eq!(shown["n_preemptions"], 1, "{shown}");
    cluster.assert_plans_sound();
    std::fs::write(cluster.dir.path().join("release"), "").expect("release");
}

/// A victim that does not handle its checkpoint signal (as most scripts
/// do not) ends at it, as SIGUSR1's default action ends a process: its
/// GPU is free at once, and the job it was taken for starts long before
/// the victim's 60-second grace is over. `gpool sim` models trace jobs
/// that say nothing else this way (`on_signal = exit`).
#[test]
fn a_victim_without_a_signal_handler_frees_its_gpu_at_once() {
    let mut cluster = Cluster::with_config(&shipped_config());
    for (node, model, count, memory_mib, labels) in NODES {
        cluster.start_agent_with(node, 0, &agent_config(model, count, memory_mib, labels));
    }
    let nlp_task = "touch nlp-$GPOOL_JOB_ID-$GPOOL_RESTART_COUNT; while [ ! -e release ]; do sleep 0.2; done";
    cluster.submit(&[
        "--team", "nlp", "--qos", "low", "--grace", "60s", "-a", "0-23", "--", "sh", "-c", nlp_task,
    ]);
    wait_until("nlp's 24 tasks to run", Duration::from_secs(60), || {
        (count(&tasks(&cluster), "nlp", "running") == 24).then_some(())
    });
    let hold = "while [ ! -e release ]; do sleep 0.2; done";
    cluster.submit(&["--team", "vision", "-a", "0-3", "--", "sh", "-c", hold]);
    wait_until("vision's 4 tasks to fill the fleet", Duration::from_secs(30), || {
        (count(&tasks(&cluster), "vision", "running") == 4).then_some(())
    });
    let submitted = std::time::Instant::now();
    let vision = cluster.submit(&["--team", "vision", "--", "sh", "-c", hold]);
    cluster.wait_for_state(vision, "running");
    let took = submitted.elapsed();
    assert!(took < Duration::from_secs(45), "vision's job waited {took:?}");
    let tasks = tasks(&cluster);
    assert_eq!(preemptions(&tasks, "nlp"), 1);
    let victim = tasks.iter().find(|t| t["n_preemptions"] == 1).expect("the victim");
    assert_eq!(victim["requeue_cause"], "preempted", "{victim}");
    let events = victim["events"].to_string();
    assert!(events.contains("signal 10, 60 s to checkpoint"), "{events}");
    cluster.assert_plans_sound();
    std::fs::write(cluster.dir.path().join("release"), "").expect("release");
}

/// `line` without its terminal colour sequences (ESC [ ... m).
fn without_colours(line: &str) -> String {
    let mut plain = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for end in chars.by_ref() {
                if end == 'm' {
                    break;
                }
            }
        } else {
            plain.push(c);
        }
    }
    plain
}

/// `trace` replayed by `gpool sim` under the gpool policy of `policy` on
/// the fleet of `NODES` (its cluster file written in `dir`), with `extra`
/// options: the policy's report, once it says no plan broke an invariant.
pub(crate) fn replay_on_the_fleet(
    dir: &std::path::Path,
    trace: &std::path::Path,
    policy: &std::path::Path,
    extra: &[&str],
) -> Value {
    let mut fleet = String::new();
    for (node, model, count, _, labels) in NODES {
        let labels = if labels.is_empty() {
            ""
        } else {
            "labels = { tier = \"inference\" }\n"
        };
        fleet += &format!("[[nodes]]\ncount = 1\ngpus = {count}\nmodel = \"{model}\"\nprefix = \"{node}\"\n{labels}\n");
    }
    let cluster_file = dir.join("cluster.toml");
    std::fs::write(&cluster_file, fleet).expect("cluster");
    let path = |p: &std::path::Path| p.to_str().expect("a path").to_string();
    let mut args = vec![
        "sim".to_string(),
        "--trace".into(),
        path(trace),
        "--cluster".into(),
        path(&cluster_file),
    ];
    args.extend([
        "--policy".into(),
        path(policy),
        "--compare".into(),
        "gpool".into(),
        "--no-savings".into(),
    ]);
    args.extend(extra.iter().map(|arg| arg.to_string()));
    args.extend(["--output".into(), "json".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run: crate::harness::cluster::Run = gpool_command(&args).output().expect("run gpool sim").into();
    run.ok();
    let gpool = run.json()["policies"][0].clone();
    assert_eq!(gpool["invariant_violations"], 0, "{gpool}");
    gpool
}

/// The same scenario replayed by `gpool sim` under the shipped policy: the
/// same victim, and no plan that breaks a scheduling invariant.
#[test]
fn the_simulator_replays_the_reclaim_with_the_same_victims() {
    let dir = Cluster::temp_dir();
    let mut trace = String::from("submit,duration,team,qos,checkpoint_on_signal\n");
    for _ in 0..21 {
        trace += "2026-11-23T10:00:00Z,36000,nlp,low,true\n";
    }
    for _ in 0..10 {
        trace += "2026-11-23T10:05:00Z,36000,vision,,false\n";
    }
    let trace_file = dir.path().join("trace.csv");
    std::fs::write(&trace_file, trace).expect("trace");
    let policy = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../config/gpoold.toml"));
    let gpool = replay_on_the_fleet(dir.path(), &trace_file, policy, &["--tick", "5s"]);
    assert_eq!(gpool["preemptions"], 1, "{gpool}");
    assert_eq!(gpool["overcommits"], 0, "{gpool}");
}

/// Per-user caps in config mode: the shipped config with nlp capping each
/// user at 2 running jobs and the pool at 12 jobs pending or running per
/// user. An nlp array and separate nlp jobs run 2 at a time, the rest
/// waiting with `user_cap`; the same user's vision job starts beside them;
/// a submit past max_submit_per_user is refused whole, naming the cap.
#[test]
fn per_user_caps_hold_jobs_back_and_refuse_a_submit_past_max_submit() {
    let policy = shipped_policy()
        .replace("guaranteed_gpus = 4\n", "guaranteed_gpus = 4\nmax_jobs_per_user = 2\n")
        .replace("# max_submit_per_user = 100000", "max_submit_per_user = 12");
    assert!(policy.contains("max_jobs_per_user = 2") && policy.contains("max_submit_per_user = 12"));
    let mut cluster = Cluster::with_config(&policy);
    for (node, model, count, memory_mib, labels) in NODES {
        cluster.start_agent_with(node, 0, &agent_config(model, count, memory_mib, labels));
    }
    let hold = "while [ ! -e release ]; do sleep 0.2; done";
    let array = cluster.submit(&["--team", "nlp", "-a", "0-4", "--", "sh", "-c", hold]);
    let separate: Vec<u64> = (0..3)
        .map(|_| cluster.submit(&["--team", "nlp", "--", "sh", "-c", hold]))
        .collect();
    let vision = cluster.submit(&["--team", "vision", "--", "sh", "-c", hold]);
    cluster.wait_for_state(vision, "running");
    let running = || {
        tasks(&cluster)
            .iter()
            .filter(|job| job["team"] == "nlp" && job["state"] == "running" && job["array"].is_null())
            .count()
    };
    wait_until("2 nlp jobs to run", Duration::from_secs(20), || {
        (running() == 2).then_some(())
    });
    // Several cycles later, still 2: the cap holds, whatever is free.
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(running(), 2);
    let waiting = separate
        .iter()
        .copied()
        .find(|id| cluster.job(*id)["state"] == "pending")
        .expect("a separate nlp job waits");
    let why = cluster.gpool(&["why", "--output", "json", &waiting.to_string()]).json();
    assert_eq!(why["reason_codes"], serde_json::json!(["user_cap"]), "{why}");
    // The same reason as data, for scripts: whose cap, and how full.
    let cap = &why["reason_details"][0];
    assert_eq!(cap["code"], "user_cap", "{why}");
    assert_eq!(
        (cap["limit"].as_u64(), cap["in_use"].as_u64()),
        (Some(2), Some(2)),
        "{why}"
    );
    assert_eq!(cap["user"], cluster.job(waiting)["user"], "{why}");
    assert!(
        cap["reason"]
            .as_str()
            .is_some_and(|words| words.contains("runs 2 of at most 2 jobs")),
        "{why}"
    );
    let said = cluster.gpool(&["why", &waiting.to_string()]).ok().to_string();
    assert!(said.contains("runs 2 of at most 2 jobs in team nlp"), "{said}");
    assert!(said.contains("(user_cap)"), "{said}");

    // 9 jobs now (5 tasks, 3 jobs, 1 vision): 4 more pass 12, 3 do not.
    let refused = cluster.gpool(&["submit", "--team", "vision", "-a", "0-3", "--", "true"]);
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("max_submit_per_user: user")
            && refused
                .stderr
                .contains("has 9 jobs pending or running and may have at most 12; these 4 would make 13"),
        "{}",
        refused.stderr
    );
    let fits = cluster.gpool(&["submit", "--team", "vision", "-a", "0-2", "--", "true"]);
    assert_eq!(fits.code, 0, "{}", fits.stderr);

    std::fs::write(cluster.dir.path().join("release"), "").unwrap();
    for id in separate.iter().chain([&vision, &array]) {
        cluster.wait_for_state(*id, "completed");
    }
}

/// Vision's 2-GPU job of an hour, submitted into reservation `event` on
/// h100-b, runs there.
fn runs_in_the_event(cluster: &Cluster, hold: &str) -> u64 {
    let args = [
        "--team",
        "vision",
        "--reservation",
        "event",
        "-G",
        "2",
        "-t",
        "1h",
        "--",
        "sh",
        "-c",
        hold,
    ];
    let inside = cluster.submit(&args);
    let job = cluster.wait_for_state(inside, "running");
    assert_eq!(job["node_list"], serde_json::json!(["h100-b"]), "{job}");
    inside
}

/// `gpool reservation create` as an admin would use it on the shipped
/// config: an event on an H100 node for team vision from now, beside
/// gpoold.toml's maintenance window. Vision's job in it runs there; nlp's
/// job that would outlast it goes elsewhere; it survives a kill -9 of
/// gpoold; gpoold.toml's cannot be deleted from the CLI; once deleted,
/// jobs may not join it. Bad input names the field.
#[test]
fn an_admin_creates_and_deletes_a_reservation_that_survives_a_restart() {
    let policy = format!(
        "{}\n[[reservation]]\nname = \"maint\"\nnodes = [\"l4-a\"]\nstart = \"2099-01-01T00:00:00Z\"\nduration = \"2h\"\n",
        shipped_policy()
    );
    let mut cluster = Cluster::with_config(&policy);
    for (node, model, count, memory_mib, labels) in NODES {
        cluster.start_agent_with(node, 0, &agent_config(model, count, memory_mib, labels));
    }
    let made = cluster
        .gpool(&[
            "reservation",
            "create",
            "event",
            "--nodes",
            "h100-b",
            "--start",
            "now",
            "--duration",
            "4h",
            "--teams",
            "vision",
            "--output",
            "json",
        ])
        .json();
    assert_eq!(made[0]["name"], "event", "{made}");
    assert_eq!(made[0]["from"], "created", "{made}");
    for (args, expected) in [
        (vec!["event", "--nodes", "h100-a"], "name: reservation event exists"),
        (
            vec!["e2", "--nodes", "nope-1"],
            "nodes: node nope-1 is not known to gpoold",
        ),
        (
            vec!["e3", "--nodes", "h100-a", "--start", "soon"],
            "start: \"soon\" is not a date or time",
        ),
        (
            vec!["bad name", "--nodes", "h100-a"],
            "name: \"bad name\" is not letters",
        ),
    ] {
        let mut full = vec!["reservation", "create"];
        full.extend(&args);
        if !args.contains(&"--start") {
            full.extend(["--start", "now"]);
        }
        full.extend(["--duration", "1h"]);
        let refused = cluster.gpool(&full);
        assert_ne!(refused.code, 0, "{args:?}");
        assert!(refused.stderr.contains(expected), "{args:?}: {}", refused.stderr);
    }
    // By GPU count: the fewest nodes free for the window (h100-b is the
    // event's): the largest, then the smallest that covers the rest.
    let by_gpus = cluster
        .gpool(&[
            "reservation",
            "create",
            "gpu12",
            "--gpus",
            "12",
            "--start",
            "now",
            "--duration",
            "1h",
            "--output",
            "json",
        ])
        .json();
    assert_eq!(by_gpus[0]["nodes"], serde_json::json!(["a100-a", "l4-a"]), "{by_gpus}");
    let too_many = cluster.gpool(&[
        "reservation",
        "create",
        "big",
        "--gpus",
        "100",
        "--start",
        "now",
        "--duration",
        "1h",
    ]);
    assert!(
        too_many
            .stderr
            .contains("gpus: only 8 GPUs are on nodes free for the window; 100 were asked"),
        "{}",
        too_many.stderr
    );
    cluster.gpool(&["reservation", "delete", "gpu12"]).ok();
    let hold = "while [ ! -e release ]; do sleep 0.2; done";
    runs_in_the_event(&cluster, hold);
    // An H100 job outside it, limited past its close, goes to the other H100.
    let outside = cluster.submit(&["--team", "nlp", "--gpu-type", "h100", "-G", "8", "--", "sh", "-c", hold]);
    let job = cluster.wait_for_state(outside, "running");
    assert_eq!(job["node_list"], serde_json::json!(["h100-a"]), "{job}");

    cluster.controller().kill9();
    cluster.start_controller();
    let listed = wait_until("gpoold back with both reservations", Duration::from_secs(20), || {
        let run = cluster.gpool(&["reservation", "list", "--output", "json"]);
        (run.code == 0).then(|| run.json())
    });
    let names: Vec<(&str, &str)> = listed
        .as_array()
        .expect("a list")
        .iter()
        .map(|r| (r["name"].as_str().unwrap_or(""), r["from"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(names, [("maint", "gpoold.toml"), ("event", "created")], "{listed}");
    let table = cluster.gpool(&["reservation", "list"]).ok().to_string();
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("event") && l.contains("h100-b") && l.contains("vision")),
        "{table}"
    );

    let kept = cluster.gpool(&["reservation", "delete", "maint"]);
    assert_ne!(kept.code, 0);
    assert!(
        kept.stderr.contains("reservation maint is gpoold.toml's"),
        "{}",
        kept.stderr
    );
    cluster.gpool(&["reservation", "delete", "event"]).ok();
    let late = cluster.gpool(&["submit", "--team", "vision", "--reservation", "event", "--", "true"]);
    assert_ne!(late.code, 0);
    assert!(
        late.stderr.contains("no reservation is named \"event\""),
        "{}",
        late.stderr
    );
    std::fs::write(cluster.dir.path().join("release"), "").expect("release");
}

/// Reservations in config mode: the shipped config with a maintenance
/// window on the L4 node an hour ahead and an event open now on an H100
/// node for team vision. `gpool nodes` shows both; vision's job in the
/// event runs there; nlp may not join it; an L4 job whose limit (the
/// default class's 2 days) reaches into the window waits, saying so, and
/// one of 30 minutes runs; an unknown reservation is refused by name.
#[test]
fn reservations_keep_their_nodes_for_their_jobs_and_windows() {
    let at = |from_now_secs: i64| {
        let now = std::time::SystemTime::now();
        let moment = if from_now_secs >= 0 {
            now + Duration::from_secs(from_now_secs as u64)
        } else {
            now - Duration::from_secs((-from_now_secs) as u64)
        };
        humantime::format_rfc3339_seconds(moment).to_string()
    };
    let policy = format!(
        "{}\n[[reservation]]\nname = \"maint\"\nnodes = [\"l4-a\"]\nstart = \"{}\"\nduration = \"2h\"\n\n\
         [[reservation]]\nname = \"event\"\nnodes = [\"h100-b\"]\nstart = \"{}\"\nend = \"{}\"\nteams = [\"vision\"]\n",
        shipped_policy(),
        at(3600),
        at(-60),
        at(7200)
    );
    let mut cluster = Cluster::with_config(&policy);
    for (node, model, count, memory_mib, labels) in NODES {
        cluster.start_agent_with(node, 0, &agent_config(model, count, memory_mib, labels));
    }
    let nodes = cluster.gpool(&["nodes"]).ok().to_string();
    assert!(
        nodes
            .lines()
            .any(|l| l.starts_with("l4-a") && l.contains("reserved for maint from")),
        "{nodes}"
    );
    assert!(
        nodes
            .lines()
            .any(|l| l.starts_with("h100-b") && l.contains("reserved for event from")),
        "{nodes}"
    );

    let hold = "while [ ! -e release ]; do sleep 0.2; done";
    // Inside a window, a job must end by its close: the default class's
    // 2-day limit would not.
    let outlasting = cluster.submit(&["--team", "vision", "--reservation", "event", "--", "true"]);
    let inside = runs_in_the_event(&cluster, hold);
    let refused = cluster.gpool(&["submit", "--team", "nlp", "--reservation", "event", "--", "true"]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("reservation: user")
            && refused
                .stderr
                .contains("(team nlp) is neither among reservation event's users nor a member of its teams"),
        "{}",
        refused.stderr
    );
    let unknown = cluster.gpool(&["submit", "--reservation", "nope", "--", "true"]);
    assert_eq!(unknown.code, 2);
    assert!(
        unknown
            .stderr
            .contains("no reservation is named \"nope\" (maint, event)"),
        "{}",
        unknown.stderr
    );

    // Outside both: an L4 job with the default 2-day limit would reach into
    // the window; one of 30 minutes ends before it.
    let long = cluster.submit(&["--team", "nlp", "--gpu-type", "l4", "--", "sh", "-c", hold]);
    let short = cluster.submit(&["--team", "nlp", "--gpu-type", "l4", "-t", "30m", "--", "sh", "-c", hold]);
    let job = cluster.wait_for_state(short, "running");
    assert_eq!(job["node_list"], serde_json::json!(["l4-a"]), "{job}");
    let why = wait_until("the long job's words", Duration::from_secs(20), || {
        let why = cluster.gpool(&["why", "--output", "json", &long.to_string()]).json();
        (why["reason_codes"][0] == "node_reservation").then_some(why)
    });
    assert!(
        why["reasons"][0]
            .as_str()
            .unwrap()
            .starts_with("2 nodes reserved for event (open), maint (from 5"),
        "{why}"
    );
    assert_eq!(cluster.job(long)["state"], "pending");
    wait_until("the outlasting job's words", Duration::from_secs(20), || {
        let why = cluster.gpool(&["why", &outlasting.to_string()]).ok().to_string();
        why.contains("its time limit would keep it running after reservation event closes")
            .then_some(())
    });
    std::fs::write(cluster.dir.path().join("release"), "").unwrap();
    for id in [inside, short] {
        cluster.wait_for_state(id, "completed");
    }
}

/// CPUs and whole nodes in the shipped config's pool: nlp's low-QoS array
/// of 2-GPU tasks asking 8 CPUs each fills the H100 nodes' CPUs (16 each)
/// while half their GPUs stay free, and its last tasks wait for CPUs;
/// vision's `--exclusive` job takes the L4 node whole; vision's guaranteed
/// job that asks for CPUs takes back exactly one burst task, the one whose
/// CPUs it needs, and runs where it freed them.
#[test]
fn a_guaranteed_job_short_of_cpus_takes_back_one_burst_task_beside_an_exclusive_job() {
    let mut cluster = Cluster::with_config(&shipped_config());
    for (node, model, count, memory_mib, labels) in NODES.iter().filter(|n| n.0 != "a100-a") {
        let top = format!(
            "controller = \"{}\"\ncpus = {}\nmemory = \"64G\"\n",
            cluster.addr,
            if *model == "l4" { 8 } else { 16 }
        );
        cluster.spawn_agent(node, 0, &top, &agent_config(model, *count, *memory_mib, labels), None);
        cluster.wait_for_registered(node);
    }
    let gpool = binary("gpool").display().to_string();
    let nlp_task = format!(
        "trap '{gpool} checkpoint; exit 0' USR1; touch nlp-$GPOOL_JOB_ID-$GPOOL_RESTART_COUNT; \
         while [ ! -e release ]; do sleep 0.2; done"
    );
    cluster.submit(&[
        "--team",
        "nlp",
        "--qos",
        "low",
        "-a",
        "0-5",
        "--gpus",
        "2",
        "--cpus-per-gpu",
        "4",
        "--gpu-type",
        "h100",
        "--",
        "sh",
        "-c",
        &nlp_task,
    ]);
    wait_until(
        "4 nlp tasks to run, 2 to wait for CPUs",
        Duration::from_secs(60),
        || {
            let tasks = tasks(&cluster);
            let started = std::fs::read_dir(cluster.dir.path())
                .ok()?
                .filter_map(Result::ok)
                .filter(|entry| entry.file_name().to_string_lossy().starts_with("nlp-"))
                .count();
            // The array's record speaks for its waiting tasks.
            let array = tasks.iter().find(|t| t["team"] == "nlp" && !t["array"].is_null())?;
            let waiting_for_cpus =
                array["array"]["waiting"] == 2 && array["reasons"].to_string().contains("8 free CPUs on each node");
            (started == 4 && count(&tasks, "nlp", "running") == 4 && waiting_for_cpus).then_some(())
        },
    );
    let whole = cluster.submit(&[
        "--team",
        "vision",
        "--exclusive",
        "--gpu-type",
        "l4",
        "--",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES > l4-visible; while [ ! -e release ]; do sleep 0.2; done",
    ]);
    cluster.wait_for_state(whole, "running");
    // The shell creates the file before it writes the line: wait for the line.
    let visible = wait_until("the exclusive job's GPUs", Duration::from_secs(20), || {
        std::fs::read_to_string(cluster.dir.path().join("l4-visible"))
            .ok()
            .filter(|text| text.ends_with('\n'))
    });
    assert_eq!(visible.trim(), "0,1,2,3", "every L4 of the node");
    // 8 H100 GPUs are free, but no CPUs beside them.
    let reclaiming = cluster.submit(&[
        "--team",
        "vision",
        "--gpus",
        "2",
        "--cpus-per-gpu",
        "4",
        "--gpu-type",
        "h100",
        "--",
        "sh",
        "-c",
        "while [ ! -e release ]; do sleep 0.2; done",
    ]);
    cluster.wait_for_state(reclaiming, "running");
    std::thread::sleep(Duration::from_secs(3));
    let tasks = tasks(&cluster);
    assert_eq!(preemptions(&tasks, "nlp"), 1, "one victim: {tasks:?}");
    let victim = tasks.iter().find(|t| t["n_preemptions"] == 1).expect("the victim");
    assert_eq!(victim["requeue_cause"], "preempted", "{victim}");
    let job = cluster.job(reclaiming);
    assert_eq!(job["burst"], false, "vision's job runs guaranteed: {job}");
    cluster.assert_plans_sound();
    std::fs::write(cluster.dir.path().join("release"), "").expect("release");
}
