//! Teams sharing the pool, end to end: burst work, reclaim by preemption
//! with a checkpoint, requeue and resume.

use crate::harness::cluster::Cluster;
use crate::harness::process::{binary, wait_until};
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

/// A shell fragment that waits for `file` (a minute at most).
fn wait_for_file(file: &str) -> String {
    format!("i=0; while [ ! -e {file} ] && [ $i -lt 1200 ]; do sleep 0.05; i=$((i+1)); done")
}

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
         trap 'echo step-42 > \"$GPOOL_CHECKPOINT_DIR/state\"; {gpool} checkpoint > checkpointed-$GPOOL_JOB_ID 2>&1; sleep 30' USR1; \
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
    let checkpointed = std::fs::read_to_string(cluster.dir.path().join(format!("checkpointed-{victim}"))).unwrap();
    assert!(
        checkpointed.contains("being preempted"),
        "gpool checkpoint said: {checkpointed}"
    );
    assert_eq!(cluster.job(victim)["state"], "pending", "requeued, waiting for a GPU");
    assert_eq!(cluster.job(survivor)["state"], "running");

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
