//! A Slurm user's batch script, unchanged: its `#SBATCH` lines are read as
//! gpool's flags, and a line gpool cannot honour is refused with its line.

use crate::harness::cluster::{gpool_command, Cluster, Run};
use crate::harness::process::wait_until;
use std::time::Duration;

/// The highest number of tasks a marks file shows running at once (each
/// task appends `+` when it starts and `-` before it ends).
fn most_at_once(marks: &str) -> usize {
    let (mut now, mut most) = (0usize, 0usize);
    for line in marks.lines() {
        match line {
            "+" => now += 1,
            "-" => now = now.saturating_sub(1),
            _ => {}
        }
        most = most.max(now);
    }
    most
}

const SLURM_SCRIPT: &str = "#!/bin/sh
#SBATCH -J sweep
#SBATCH --gres=gpu:2
#SBATCH --array=0-9%3
#SBATCH -o out-%A_%a.log
#SBATCH --time=0:10:00

echo + >> marks
echo \"gpus=$CUDA_VISIBLE_DEVICES\"
sleep 1
echo - >> marks
";

#[test]
fn an_unchanged_slurm_array_script_runs_with_its_gpus_limit_files_name_and_time() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 8);
    let dir = cluster.dir.path().to_path_buf();
    std::fs::write(dir.join("sweep.sh"), SLURM_SCRIPT).unwrap();
    let array = cluster.submit(&["sweep.sh"]);

    let record = cluster.job(array);
    assert_eq!(record["name"], "sweep", "{record}");
    assert_eq!(record["time_limit_secs"], 600, "{record}");
    assert_eq!(record["gpus"], 2, "{record}");
    assert_eq!(record["stdout_path"], "out-%A_%a.log", "{record}");
    assert_eq!(record["array"]["indices"], "0-9%3", "{record}");

    let done = wait_until("the array to end", Duration::from_secs(120), || {
        let record = cluster.job(array);
        (!matches!(record["state"].as_str(), Some("pending" | "running"))).then_some(record)
    });
    assert_eq!(done["state"], "completed", "{done}");
    assert_eq!(done["array"]["ended"], 10, "{done}");

    // 8 GPUs would run 4 tasks of 2 at once: the %3 held it to 3.
    let marks = std::fs::read_to_string(dir.join("marks")).unwrap();
    assert_eq!(marks.lines().filter(|line| *line == "+").count(), 10, "{marks}");
    let most = most_at_once(&marks);
    assert!((1..=3).contains(&most), "{most} ran at once:\n{marks}");

    for task_idx in 0..10 {
        let file = dir.join(format!("out-{array}_{task_idx}.log"));
        let output = std::fs::read_to_string(&file).unwrap_or_else(|err| panic!("{}: {err}", file.display()));
        let gpus = output
            .lines()
            .find_map(|line| line.strip_prefix("gpus="))
            .unwrap_or_else(|| panic!("{}: {output}", file.display()));
        assert_eq!(gpus.split(',').count(), 2, "task {task_idx} got {gpus}");
        let task = cluster
            .gpool(&["show", &format!("{array}_{task_idx}"), "--output", "json"])
            .json();
        assert_eq!(
            (
                task["name"].as_str(),
                task["time_limit_secs"].as_u64(),
                task["gpus"].as_u64()
            ),
            (Some("sweep"), Some(600), Some(2)),
            "{task}"
        );
    }
}

#[test]
fn a_directive_gpool_cannot_honour_is_refused_with_its_line_and_reason() {
    let dir = Cluster::temp_dir();
    let script = "#!/bin/bash\n#SBATCH -J train\n#SBATCH --gres=gpu:2 --ntasks-per-node=8\npython train.py\n";
    std::fs::write(dir.path().join("train.sh"), script).unwrap();
    let run: Run = gpool_command(&["submit", "train.sh"])
        .current_dir(dir.path())
        .env("GPOOL_SERVER", "127.0.0.1:1")
        .output()
        .expect("run gpool")
        .into();
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("train.sh:3: #SBATCH --ntasks-per-node=8: gpool runs one task per node, not 8"),
        "{}",
        run.stderr
    );

    // The operator's list passes it over, and says so.
    let run: Run = gpool_command(&["submit", "train.sh"])
        .current_dir(dir.path())
        .env("GPOOL_SERVER", "127.0.0.1:1")
        .env("GPOOL_SBATCH_IGNORE", "--ntasks-per-node")
        .output()
        .expect("run gpool")
        .into();
    assert!(
        run.stderr
            .contains("train.sh:3: #SBATCH --ntasks-per-node=8 passed over: listed in GPOOL_SBATCH_IGNORE"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("one task per node"), "{}", run.stderr);
}
