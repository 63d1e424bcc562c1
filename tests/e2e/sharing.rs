//! Teams sharing the pool, end to end: burst work, reclaim by preemption
//! with a checkpoint, requeue and resume.

use crate::harness::cluster::Cluster;
use crate::harness::process::{binary, wait_for_file, wait_until};
use std::time::{Duration, Instant};

const POLICY: &str = r#"
[sharing]
waste_cap_gpu_hours_per_hour = 100

[[team]]
name = "a"

[[team]]
name = "b"
guaranteed_gpus = 2

[[qos]]
name = "normal"
grace = "30s"
"#;

#[test]
fn a_guaranteed_job_reclaims_gpus_from_burst_work_that_checkpoints_and_resumes() {
    let mut cluster = Cluster::with_config(POLICY);
    cluster.start_agent("node-a", 2);
    let gpool = binary("gpool").display().to_string();
    // Team a's job: on its first attempt it checkpoints when told to and
    // waits; restarted, it shows what it resumed from.
    let burst_job = format!(
        "if [ \"$GPOOL_RESTART_COUNT\" = 1 ]; then \
           {{ cat \"$GPOOL_CHECKPOINT_DIR/state\"; echo restart $GPOOL_RESTART_COUNT; }} > resumed-$GPOOL_JOB_ID; exit 0; \
         fi; \
         trap 'echo step-42 > \"$GPOOL_CHECKPOINT_DIR/state\"; {gpool} checkpoint; sleep 30' USR1; \
         touch started-$GPOOL_JOB_ID; {}",
        wait_for_file("release-a")
    );
    let a1 = cluster.submit(&["--team", "a", "--", "sh", "-c", &burst_job]);
    let a2 = cluster.submit(&["--team", "a", "--", "sh", "-c", &burst_job]);
    wait_until("team a's jobs to start", Duration::from_secs(20), || {
        [a1, a2]
            .iter()
            .all(|id| cluster.dir.path().join(format!("started-{id}")).exists())
            .then_some(())
    });
    assert_eq!(
        cluster.job(a1)["burst"],
        true,
        "team a has no guarantee: its jobs are burst work"
    );

    // Team b's guaranteed job finds the pool full and takes a GPU back.
    let submitted = Instant::now();
    let b_job = format!("touch started-b; {}", wait_for_file("release-b"));
    let b = cluster.submit(&["--team", "b", "--", "sh", "-c", &b_job]);
    wait_until("team b's job to start", Duration::from_secs(40), || {
        cluster.dir.path().join("started-b").exists().then_some(())
    });
    let waited = submitted.elapsed();
    // The victim checkpointed at once, so b did not wait out the 30 s grace.
    assert!(waited < Duration::from_secs(10), "b started after {waited:?}");
    assert_eq!(cluster.job(b)["burst"], false);

    let victims: Vec<u64> = [a1, a2]
        .into_iter()
        .filter(|id| cluster.job(*id)["n_preemptions"] == 1)
        .collect();
    assert_eq!(victims.len(), 1, "exactly one of team a's jobs is preempted");
    let victim = victims[0];
    let survivor = if victim == a1 { a2 } else { a1 };
    assert_eq!(cluster.job(victim)["state"], "pending", "requeued, waiting for a GPU");
    assert_eq!(cluster.job(survivor)["state"], "running");

    // `gpool why` says why the victim waits and what would help.
    let why = wait_until("the victim's reasons", Duration::from_secs(20), || {
        let why = cluster.gpool(&["why", &victim.to_string(), "--output", "json"]).json();
        let reasons: Vec<String> = why["reasons"]
            .as_array()?
            .iter()
            .filter_map(|r| r.as_str().map(String::from))
            .collect();
        reasons.iter().any(|r| r.contains("guaranteed")).then_some(why)
    });
    assert_eq!(why["state"], "pending");
    let reasons = why["reasons"].to_string();
    assert!(reasons.contains("wants 1 GPU on one node; none is free"), "{reasons}");
    assert!(reasons.contains("team a runs 0 of its 0 guaranteed GPUs"), "{reasons}");
    let codes = why["reason_codes"].to_string();
    assert!(
        codes.contains("\"resources\"") && codes.contains("\"beyond_guarantee\""),
        "{codes}"
    );
    assert!(
        why["hints"].to_string().contains("wait for running jobs to end"),
        "{}",
        why["hints"]
    );
    assert!(why["priority"]["total"].as_f64().is_some(), "{why}");

    // `gpool usage`: b runs guaranteed, a as burst work.
    let usage = cluster.gpool(&["usage", "--output", "json"]).json();
    let team = |name: &str| {
        usage
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["team"] == name)
            .cloned()
            .unwrap()
    };
    assert_eq!(
        (
            team("b")["gpus_in_use"].as_u64(),
            team("b")["guaranteed_gpus_in_use"].as_u64()
        ),
        (Some(1), Some(1))
    );
    assert_eq!(
        (
            team("a")["gpus_in_use"].as_u64(),
            team("a")["guaranteed_gpus_in_use"].as_u64()
        ),
        (Some(1), Some(0))
    );
    assert!(team("a")["burst_gpu_hours"].as_f64().unwrap() > 0.0, "{usage}");
    assert_eq!(team("a")["guaranteed_gpu_hours"].as_f64(), Some(0.0));
    let bad = cluster.gpool(&["usage", "--team", "zzz"]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(bad.stderr.contains("no team \"zzz\""), "{}", bad.stderr);

    // Once b is done, the victim resumes from its checkpoint.
    std::fs::write(cluster.dir.path().join("release-b"), "").unwrap();
    cluster.wait_for_state(b, "completed");
    let resumed = cluster.wait_for_state(victim, "completed");
    assert_eq!(resumed["attempt"], 2);
    assert_eq!(
        std::fs::read_to_string(cluster.dir.path().join(format!("resumed-{victim}"))).unwrap(),
        "step-42\nrestart 1\n"
    );
    std::fs::write(cluster.dir.path().join("release-a"), "").unwrap();
    cluster.wait_for_state(survivor, "completed");
}

#[test]
fn the_policy_reloads_on_request_and_on_sighup_and_a_bad_file_changes_nothing() {
    let mut cluster = Cluster::with_config(POLICY);
    let file = cluster.dir.path().join("gpoold.toml");
    let original = std::fs::read_to_string(&file).unwrap();
    let teams = |cluster: &Cluster| -> Vec<String> {
        let usage = cluster.gpool(&["usage", "--output", "json"]).json();
        usage
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["team"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(teams(&cluster), ["a", "b"]);

    // A bad file is refused with its line and field; the old policy stays.
    std::fs::write(&file, format!("{original}\n[[team]]\nname = \"c\"\nshares = 0\n")).unwrap();
    let n_lines = original.lines().count();
    let bad = cluster.gpool(&["admin", "reload"]);
    assert_eq!(bad.code, 2, "stdout: {}", bad.stdout);
    let expected = format!(
        "{}:{}: team.shares: team c needs at least 1 share",
        file.display(),
        n_lines + 2
    );
    assert!(bad.stderr.contains(&expected), "{} does not say {expected}", bad.stderr);
    assert_eq!(teams(&cluster), ["a", "b"]);

    std::fs::write(&file, format!("{original}\n[[team]]\nname = \"c\"\n")).unwrap();
    let good = cluster.gpool(&["admin", "reload"]);
    assert_eq!(good.code, 0, "stderr: {}", good.stderr);
    assert_eq!(good.stdout.trim(), "policy reloaded: 1 pools, 3 teams, 1 QoS classes");
    assert_eq!(teams(&cluster), ["a", "b", "c"]);

    std::fs::write(&file, format!("{original}\n[[team]]\nname = \"d\"\n")).unwrap();
    let pid = cluster.controller().pid();
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    wait_until("SIGHUP to reload the policy", Duration::from_secs(10), || {
        (teams(&cluster) == ["a", "b", "d"]).then_some(())
    });
}

#[test]
fn backfill_lets_a_short_job_run_ahead_and_why_gives_the_reserved_start() {
    let mut cluster = Cluster::start();
    cluster.start_agent("node-a", 3);
    let hold = |name: &str| format!("touch started-{name}; {}", wait_for_file(&format!("release-{name}")));
    let a = cluster.submit(&["--gpus", "2", "--time", "1h", "--", "sh", "-c", &hold("a")]);
    wait_until("a to start", Duration::from_secs(20), || {
        cluster.dir.path().join("started-a").exists().then_some(())
    });
    // b needs all 3 GPUs: it gets the reservation, from a's time limit on.
    let b = cluster.submit(&["--gpus", "3", "--", "true"]);
    // c has no time limit: it would hold b up, so it waits.
    let c = cluster.submit(&["--", "sh", "-c", &hold("c")]);
    let why_c = wait_until("c to wait for b", Duration::from_secs(20), || {
        let why = cluster.gpool(&["why", &c.to_string(), "--output", "json"]).json();
        let first = why["reasons"][0].as_str().unwrap_or_default().to_string();
        first.starts_with("it would delay job").then_some(why)
    });
    assert!(
        why_c["reasons"][0]
            .as_str()
            .unwrap()
            .starts_with(&format!("it would delay job {b}, which has GPUs reserved from 59 min")),
        "{why_c}"
    );
    // d ends (by its limit) before a does: it runs now, on the free GPU.
    let d = cluster.submit(&["--time", "30m", "--", "sh", "-c", &hold("d")]);
    wait_until("d to start ahead", Duration::from_secs(20), || {
        cluster.dir.path().join("started-d").exists().then_some(())
    });
    let why_b = wait_until("b's reservation", Duration::from_secs(20), || {
        let why = cluster.gpool(&["why", &b.to_string(), "--output", "json"]).json();
        why["estimated_start"].is_string().then_some(why)
    });
    let started_a = cluster.job(a)["started_at"].as_str().unwrap().to_string();
    let expected = humantime::parse_rfc3339(&started_a).unwrap() + Duration::from_secs(3600);
    let estimated = humantime::parse_rfc3339(why_b["estimated_start"].as_str().unwrap()).unwrap();
    let off = estimated.duration_since(expected).unwrap_or_else(|e| e.duration());
    assert!(
        off <= Duration::from_secs(2),
        "b expected at {estimated:?}, a ends at {expected:?}"
    );
    for name in ["a", "d", "c"] {
        std::fs::write(cluster.dir.path().join(format!("release-{name}")), "").unwrap();
    }
    for id in [a, b, c, d] {
        cluster.wait_for_state(id, "completed");
    }
}

#[test]
fn usage_and_refusals_speak_as_users_write() {
    // No [[team]]: every job runs guaranteed, the whole pool.
    let mut cluster = Cluster::with_config("[[qos]]\nname = \"normal\"\nmax_time = \"12h\"\n");
    cluster.start_agent("n1", 1);
    let id = cluster.submit(&["--time", "1h", "--", "true"]);
    cluster.wait_for_state(id, "completed");
    let usage = cluster.gpool(&["usage", "--output", "json"]).json();
    let team = usage.as_array().unwrap().first().cloned().unwrap_or_default();
    assert_eq!(
        (team["team"].as_str(), &team["guaranteed_gpus"]),
        (Some("default"), &serde_json::Value::Null),
        "{usage}"
    );

    // One job: no position; the limits as durations.
    let run = cluster.gpool(&["submit", "--time", "13h", "--", "true"]);
    assert_ne!(run.code, 0);
    assert!(
        run.stderr
            .contains("refused: time: 13h is longer than QoS normal's max_time of 12h"),
        "{}",
        run.stderr
    );
    // In a batch, the position says of how many.
    let file = cluster.dir.path().join("two.toml");
    std::fs::write(
        &file,
        "[[job]]\ncommand = [\"true\"]\n[[job]]\ncommand = [\"true\"]\ntime = \"13h\"\n",
    )
    .unwrap();
    let run = cluster.gpool(&["submit", "-f", &file.display().to_string()]);
    assert!(
        run.stderr.contains("job 2 of 2 in the request: time: 13h is longer"),
        "{}",
        run.stderr
    );
}

/// GPUs a QoS class keeps free stay free for it while a long queue of a
/// lower class waits (the cycles that look at the first jobs of each shape
/// alone keep them too), and the class takes them at once.
#[test]
fn gpus_kept_for_a_class_stay_free_for_it_under_a_queue() {
    let mut cluster = Cluster::with_config(
        "[[qos]]\nname = \"normal\"\n\n[[qos]]\nname = \"high\"\npriority = 10\nreserve_gpus = 1\n",
    );
    cluster.start_agent("n1", 3);
    let queued: Vec<u64> = (0..6).map(|_| cluster.submit(&["--", "sleep", "60"])).collect();
    for id in &queued[..2] {
        cluster.wait_for_state(*id, "running");
    }
    for id in &queued[2..] {
        wait_until("the kept GPU as its reason", Duration::from_secs(20), || {
            let job = cluster.job(*id);
            (job["reason_codes"][0] == "reserved").then_some(())
        });
    }
    let high = cluster.submit(&["--qos", "high", "--", "sleep", "60"]);
    cluster.wait_for_state(high, "running");
    for id in &queued[2..] {
        assert_eq!(cluster.job(*id)["state"], "pending");
    }
}

/// The shipped gpoold.toml on H100 and L4 nodes, the L4s (2 GPUs) its
/// `inference` pool: the `high` class keeps 4 GPUs in each pool but none
/// in that one (`reserve_in`), so team vision's jobs of the default class
/// run there on its guarantee, while the default pool still keeps its 4.
#[test]
fn a_small_pool_keeps_no_reserve_under_the_shipped_config() {
    use crate::preemption::{agent_config, shipped_config};
    let mut cluster = Cluster::with_config(&shipped_config());
    cluster.start_agent_with("h100-a", 0, &agent_config("h100", 8, 81_559, ""));
    cluster.start_agent_with(
        "l4-a",
        0,
        &agent_config("l4", 2, 23_034, "[labels]\ntier = \"inference\"\n"),
    );
    let l4 = cluster.submit(&[
        "--team",
        "vision",
        "--pool",
        "inference",
        "--gpu-type",
        "l4",
        "--",
        "sleep",
        "60",
    ]);
    cluster.wait_for_state(l4, "running");
    // The default pool takes every node: 9 GPUs free, 4 of them kept.
    let eight_h100 = |cluster: &Cluster, qos: &str| {
        cluster.submit(&[
            "--team",
            "vision",
            "--qos",
            qos,
            "--gpu-type",
            "h100",
            "--gpus",
            "8",
            "--",
            "sleep",
            "60",
        ])
    };
    let eight = eight_h100(&cluster, "normal");
    wait_until("the kept GPUs as its reason", Duration::from_secs(20), || {
        (cluster.job(eight)["reason_codes"][0] == "reserved").then_some(())
    });
    let high = eight_h100(&cluster, "high");
    cluster.wait_for_state(high, "running");
    assert_eq!(cluster.job(eight)["state"], "pending");
    cluster.assert_plans_sound();
}
