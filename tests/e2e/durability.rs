//! Nothing acknowledged is lost: `kill -9` of gpoold in the middle of a burst
//! of submissions, then a restart on the same state dir.

use crate::harness::cluster::{gpool_command, Cluster};
use crate::harness::process::wait_until;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Submits until gpool fails (the controller is gone); returns acked ids.
fn submit_until_refused(
    addr: String,
    batch_file: std::path::PathBuf,
    worker_idx: usize,
    n_acked: Arc<AtomicUsize>,
) -> Vec<u64> {
    let mut acked = Vec::new();
    for round in 0.. {
        let file = batch_file.display().to_string();
        let name = format!("w{worker_idx}-{round}");
        let args: Vec<&str> = if round % 3 == 2 {
            vec!["submit", "--output", "json", "-f", &file]
        } else {
            vec!["submit", "--output", "json", "--name", &name, "--", "true"]
        };
        let output = gpool_command(&args)
            .env("GPOOL_SERVER", &addr)
            .output()
            .expect("run gpool");
        if !output.status.success() {
            return acked;
        }
        let reply: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
        let ids: Vec<u64> = reply["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .filter_map(|v| v.as_u64())
            .collect();
        n_acked.fetch_add(ids.len(), Ordering::Relaxed);
        acked.extend(ids);
    }
    acked
}

#[test]
fn acknowledged_changes_survive_kill_9_mid_burst() {
    let mut cluster = Cluster::start();
    let batch_file = cluster.dir.path().join("batch.toml");
    std::fs::write(&batch_file, "[[job]]\ncommand = [\"true\"]\n".repeat(20)).unwrap();

    // Acknowledged cancels are durable too.
    let early: Vec<u64> = (0..6).map(|_| cluster.submit(&["--", "true"])).collect();
    let cancelled: Vec<String> = early.iter().step_by(2).map(u64::to_string).collect();
    let mut cancel_args = vec!["cancel"];
    cancel_args.extend(cancelled.iter().map(String::as_str));
    cluster.gpool(&cancel_args).ok();

    let n_acked = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..8)
        .map(|worker_idx| {
            let (addr, file, n_acked) = (cluster.addr.clone(), batch_file.clone(), n_acked.clone());
            std::thread::spawn(move || submit_until_refused(addr, file, worker_idx, n_acked))
        })
        .collect();
    wait_until("300 acknowledged submissions", Duration::from_secs(60), || {
        (n_acked.load(Ordering::Relaxed) >= 300).then_some(())
    });
    cluster.controller().kill9();
    let mut acked: Vec<u64> = workers.into_iter().flat_map(|w| w.join().expect("submitter")).collect();
    acked.extend(&early);
    acked.sort_unstable();

    cluster.start_controller();
    let after = states(&cluster);
    for id in &acked {
        assert!(after.contains_key(id), "acknowledged job {id} lost by kill -9");
    }
    for id in &cancelled {
        assert_eq!(
            after[&id.parse::<u64>().unwrap()],
            "cancelled",
            "acknowledged cancel of {id} lost"
        );
    }
    // Ids keep counting up after the restart.
    let next = cluster.submit(&["--", "true"]);
    assert!(next > *after.keys().last().unwrap(), "id {next} reused");
}

fn states(cluster: &Cluster) -> BTreeMap<u64, String> {
    let jobs = cluster.gpool(&["jobs", "--all", "--output", "json"]).json();
    jobs.as_array()
        .expect("array")
        .iter()
        .map(|job| {
            (
                job["id"].as_u64().expect("id"),
                job["state"].as_str().expect("state").to_string(),
            )
        })
        .collect()
}

/// Submits batches of jobs named after the batch (`batch_size` of its
/// round) until gpool fails; returns the names of the acknowledged batches.
fn submit_batches_until_refused(addr: String, dir: std::path::PathBuf, worker_idx: usize) -> Vec<String> {
    let mut acked = Vec::new();
    for round in 0.. {
        let name = format!("k{worker_idx}-{round}");
        let args_owned: Vec<String> = if batch_size(round) == 1 {
            ["submit", "--output", "json", "--name", &name, "--", "true"]
                .map(String::from)
                .to_vec()
        } else {
            let file = dir.join(format!("{name}.toml"));
            let job = format!("[[job]]\nname = \"{name}\"\ncommand = [\"true\"]\n");
            std::fs::write(&file, job.repeat(batch_size(round))).expect("write batch file");
            vec![
                "submit".into(),
                "--output".into(),
                "json".into(),
                "-f".into(),
                file.display().to_string(),
            ]
        };
        let args: Vec<&str> = args_owned.iter().map(String::as_str).collect();
        let output = gpool_command(&args)
            .env("GPOOL_SERVER", &addr)
            .output()
            .expect("run gpool");
        if !output.status.success() {
            return acked;
        }
        acked.push(name);
    }
    acked
}

/// The jobs of round `round`'s submission: a single job, a batch one sled
/// transaction writes, or a batch of more records (one a job) than one
/// transaction writes (1,024), which goes through the redo log.
fn batch_size(round: usize) -> usize {
    match round % 4 {
        3 => 1,
        1 => 1_100,
        _ => 600,
    }
}

/// `kill -9` at random moments during batch and single submits from
/// parallel clients: every acknowledged submission is there in full after a
/// restart, and no batch is there in part.
#[test]
fn a_batch_is_whole_or_absent_across_kill_9() {
    let mut cluster = Cluster::start();
    let dir = cluster.dir.path().join("batches");
    std::fs::create_dir(&dir).unwrap();
    // A small xorshift seeded from the clock: random moments, reproducible
    // from the seed printed on failure.
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    println!("seed {seed}");
    let mut acked: Vec<String> = Vec::new();
    for _kill in 0..20 {
        let workers: Vec<_> = (0..4)
            .map(|worker_idx| {
                let (addr, dir) = (cluster.addr.clone(), dir.clone());
                std::thread::spawn(move || submit_batches_until_refused(addr, dir, worker_idx))
            })
            .collect();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        std::thread::sleep(Duration::from_millis(150 + seed % 600));
        cluster.controller().kill9();
        acked.extend(workers.into_iter().flat_map(|w| w.join().expect("submitter")));
        cluster.start_controller();
    }
    // Names repeat across kills (rounds restart at 0), so count per name.
    let mut found: BTreeMap<String, usize> = BTreeMap::new();
    for job in cluster
        .gpool(&["jobs", "--all", "--output", "json"])
        .json()
        .as_array()
        .expect("array")
    {
        *found
            .entry(job["name"].as_str().expect("name").to_string())
            .or_default() += 1;
    }
    let mut expected_acked: BTreeMap<String, usize> = BTreeMap::new();
    for name in &acked {
        let round: usize = name.rsplit('-').next().unwrap().parse().unwrap();
        *expected_acked.entry(name.clone()).or_default() += batch_size(round);
    }
    for (name, n_jobs) in &found {
        let unit = batch_size(name.rsplit('-').next().unwrap().parse::<usize>().unwrap());
        assert_eq!(n_jobs % unit, 0, "submission {name} is on disk in part: {n_jobs} jobs");
    }
    for (name, n_jobs) in &expected_acked {
        let have = found.get(name).copied().unwrap_or(0);
        assert!(have >= *n_jobs, "acknowledged {name}: {n_jobs} jobs, {have} on disk");
    }
    assert!(
        acked.len() >= 10,
        "too few acknowledged submissions ({}) to mean anything",
        acked.len()
    );
}

/// Jobs from two shells wait through kill -9: arrays and separate jobs,
/// each with its shell's environment (stored once per environment), run
/// after the restart with their own, never the other shell's.
#[test]
fn waiting_jobs_keep_their_shells_environment_across_kill_9() {
    let mut cluster = Cluster::start();
    let out = cluster.dir.path().join("out");
    std::fs::create_dir_all(&out).unwrap();
    let write_tag = |name: &str| format!("echo \"$SHELL_TAG\" > {}/{name}", out.display());
    let mut expected = BTreeMap::new();
    for shell in ["first", "second"] {
        let tag = format!("--env=SHELL_TAG={shell}");
        let array_cmd = write_tag(&format!("{shell}-array-$GPOOL_ARRAY_TASK_ID"));
        cluster.submit(&[tag.as_str(), "--array", "0-2", "--", "sh", "-c", &array_cmd]);
        for task in 0..3 {
            expected.insert(format!("{shell}-array-{task}"), shell);
        }
        for job in 0..2 {
            let name = format!("{shell}-job-{job}");
            cluster.submit(&[tag.as_str(), "--", "sh", "-c", &write_tag(&name)]);
            expected.insert(name, shell);
        }
    }
    cluster.controller().kill9();
    cluster.start_controller();
    cluster.start_agent("n1", 2);
    for (name, shell) in &expected {
        let path = out.join(name);
        let tag = wait_until(&format!("{name} to run"), Duration::from_secs(30), || {
            std::fs::read_to_string(&path).ok().filter(|text| text.ends_with('\n'))
        });
        assert_eq!(tag.trim(), *shell, "{name} ran with another shell's environment");
    }
}
