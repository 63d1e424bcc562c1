//! Nothing acknowledged is lost: `kill -9` of gpoold right after a burst of
//! acknowledged changes, then a restart on the same state dir.

use crate::harness::cluster::{gpool_command, Cluster};
use std::collections::BTreeMap;

#[test]
fn acknowledged_submissions_survive_kill_9() {
    let mut cluster = Cluster::start();
    let file = cluster.dir.path().join("batch.toml");
    std::fs::write(&file, "[[job]]\ncommand = [\"true\"]\n".repeat(50)).unwrap();

    // 8 parallel submitters, each one job per process, plus batches.
    let submitters: Vec<_> = (0..8)
        .map(|worker_idx| {
            let addr = cluster.addr.clone();
            let file = file.clone();
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                for round in 0..6 {
                    let args: Vec<String> = if round % 3 == 2 {
                        vec![
                            "submit".into(),
                            "--output".into(),
                            "json".into(),
                            "-f".into(),
                            file.display().to_string(),
                        ]
                    } else {
                        let name = format!("w{worker_idx}-{round}");
                        ["submit", "--output", "json", "--name", &name, "--", "true"]
                            .map(String::from)
                            .to_vec()
                    };
                    let args: Vec<&str> = args.iter().map(String::as_str).collect();
                    let output = gpool_command(&args)
                        .env("GPOOL_SERVER", &addr)
                        .output()
                        .expect("run gpool");
                    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
                    let reply: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
                    acked.extend(reply["ids"].as_array().expect("ids").iter().filter_map(|v| v.as_u64()));
                }
                acked
            })
        })
        .collect();
    let mut acked: Vec<u64> = submitters
        .into_iter()
        .flat_map(|t| t.join().expect("submitter"))
        .collect();
    acked.sort_unstable();
    assert_eq!(acked.len(), 8 * (4 + 2 * 50));

    // Acknowledged cancels are durable too.
    let cancelled: Vec<String> = acked.iter().step_by(7).map(u64::to_string).collect();
    let mut cancel_args = vec!["cancel"];
    cancel_args.extend(cancelled.iter().map(String::as_str));
    cluster.gpool(&cancel_args).ok();

    let before = states(&cluster);
    cluster.controller().kill9();
    cluster.start_controller();
    let after = states(&cluster);
    assert_eq!(after.len(), acked.len());
    for id in &acked {
        assert_eq!(after.get(id), before.get(id), "job {id} changed across kill -9");
    }
    for id in &cancelled {
        assert_eq!(after[&id.parse::<u64>().unwrap()], "cancelled");
    }
    // Ids keep counting up after the restart.
    let next = cluster.submit(&["--", "true"]);
    assert!(next > *acked.last().unwrap(), "id {next} reused");
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
