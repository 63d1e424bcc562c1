//! A Slurm user's batch script, unchanged: its `#SBATCH` lines are read as
//! gpool's flags, and a line gpool cannot honour is refused with its line.

use crate::harness::cluster::{gpool_command, Cluster, Run};
use crate::harness::process::wait_until;
use std::time::Duration;

use crate::arrays::most_at_once;

/// Links Slurm's commands to gpool in the cluster's dir (`bin/`), as a
/// site does with `gpool slurm install`.
fn install_slurm_links(cluster: &Cluster) {
    let bin = cluster.dir.path().join("bin");
    cluster.gpool(&["slurm", "install", &bin.display().to_string()]).ok();
}

/// Slurm's `command` (a link `install_slurm_links` made), run in the
/// cluster's dir against its controller.
fn slurm_command(cluster: &Cluster, command: &str, args: &[&str]) -> Run {
    std::process::Command::new(cluster.dir.path().join("bin").join(command))
        .args(args)
        .env("GPOOL_SERVER", &cluster.cli_server)
        .current_dir(cluster.dir.path())
        .output()
        .expect("run a Slurm command")
        .into()
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
    // sacct's rows, as a Slurm site's tools read them.
    install_slurm_links(&cluster);
    let ids = array.to_string();
    let fields = "JobID,JobName,State,ExitCode,Timelimit,AllocTRES";
    let acct = slurm_command(&cluster, "sacct", &["-P", "-n", "-X", "--format", fields, "-j", &ids]);
    let expected: Vec<String> = (0..10)
        .map(|task| format!("{array}_{task}|sweep|COMPLETED|0:0|00:10:00|gres/gpu=2,node=1"))
        .collect();
    let mut rows: Vec<&str> = acct.stdout.lines().collect();
    rows.sort_by_key(|row| row.split(['_', '|']).nth(1).and_then(|task| task.parse::<u32>().ok()));
    assert_eq!(rows, expected, "{}", acct.stderr);
}

#[test]
fn a_directive_gpool_cannot_honour_is_refused_with_its_line_and_reason() {
    let dir = Cluster::temp_dir();
    let script = "#!/bin/bash\n#SBATCH -J train\n#SBATCH --gres=gpu:2 --licenses=matlab:1\npython train.py\n";
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
            .contains("train.sh:3: #SBATCH --licenses=matlab:1: --licenses: gpool has no equivalent it can honour"),
        "{}",
        run.stderr
    );

    // The operator's list passes it over, and says so.
    let run: Run = gpool_command(&["submit", "train.sh"])
        .current_dir(dir.path())
        .env("GPOOL_SERVER", "127.0.0.1:1")
        .env("GPOOL_SBATCH_IGNORE", "--licenses")
        .output()
        .expect("run gpool")
        .into();
    assert!(
        run.stderr
            .contains("train.sh:3: #SBATCH --licenses=matlab:1 passed over: listed in GPOOL_SBATCH_IGNORE"),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("no equivalent"), "{}", run.stderr);
}

/// Slurm's commands as tools drive them: `gpool slurm install` links
/// squeue, sacct, scancel and sinfo to gpool, which then takes their
/// options and prints their formats.
#[test]
fn slurms_commands_print_slurms_formats() {
    let mut cluster = Cluster::start();
    cluster.start_agent("gpu-01", 2);
    cluster.start_agent("gpu-02", 2);
    install_slurm_links(&cluster);
    let slurm = |command: &str, args: &[&str]| slurm_command(&cluster, command, args);
    let ok = cluster.submit(&["-J", "ok", "--", "true"]);
    let bad = cluster.submit(&["-J", "bad", "--", "sh", "-c", "exit 3"]);
    let array = cluster.submit(&["-J", "sweep", "-a", "0-2", "--", "true"]);
    let long = cluster.submit(&["-J", "long", "--time", "10:00", "--", "sleep", "300"]);
    cluster.wait_for_state(ok, "completed");
    cluster.wait_for_state(bad, "failed");
    cluster.wait_for_state(long, "running");
    wait_until("the array to end", Duration::from_secs(60), || {
        (cluster.job(array)["state"] == "completed").then_some(())
    });

    let queue = slurm("squeue", &["-h", "-o", "%i|%j|%T|%t|%D|%P|%l"]);
    assert_eq!(queue.code, 0, "{}", queue.stderr);
    assert_eq!(queue.stdout, format!("{long}|long|RUNNING|R|1|default|10:00\n"));
    let long_names = slurm("squeue", &["-h", "-O", "JobID:8,State:.10,Name:6"]);
    assert_eq!(
        long_names.stdout,
        format!("{long:<8}   RUNNINGlong  \n"),
        "{}",
        long_names.stderr
    );
    let unknown = slurm("squeue", &["-O", "Bogus"]);
    assert_eq!(
        unknown.stderr,
        "squeue: error: Invalid job format specification: Bogus\n"
    );
    let default = slurm("squeue", &[]);
    assert!(
        default
            .stdout
            .starts_with("             JOBID PARTITION     NAME     USER ST       TIME  NODES NODELIST(REASON)\n"),
        "{}",
        default.stdout
    );

    let cancelled = slurm("scancel", &[&long.to_string()]);
    assert_eq!(
        (cancelled.code, cancelled.stdout.as_str()),
        (0, ""),
        "{}",
        cancelled.stderr
    );
    cluster.wait_for_state(long, "cancelled");
    let ids = format!("{ok},{bad},{array},{long}");
    let acct = slurm(
        "sacct",
        &[
            "-P",
            "-n",
            "-X",
            "--format",
            "JobID,JobName,State,ExitCode,NNodes",
            "-j",
            &ids,
        ],
    );
    assert_eq!(acct.code, 0, "{}", acct.stderr);
    let rows: Vec<&str> = acct.stdout.lines().collect();
    assert!(
        rows.contains(&format!("{ok}|ok|COMPLETED|0:0|1").as_str()),
        "{}",
        acct.stdout
    );
    assert!(
        rows.contains(&format!("{bad}|bad|FAILED|3:0|1").as_str()),
        "{}",
        acct.stdout
    );
    for task in 0..3 {
        assert!(
            rows.contains(&format!("{array}_{task}|sweep|COMPLETED|0:0|1").as_str()),
            "{}",
            acct.stdout
        );
    }
    assert!(
        rows.iter()
            .any(|row| row.starts_with(&format!("{long}|long|CANCELLED by "))),
        "{}",
        acct.stdout
    );
    let refused = slurm("sacct", &["--format", "JobID,Bogus"]);
    assert_eq!(refused.code, 1);
    assert_eq!(refused.stderr, "sacct: error: Invalid field requested: \"Bogus\"\n");

    let info = slurm("sinfo", &["-h", "-o", "%P %D %t %N"]);
    assert_eq!(info.stdout, "default* 2 idle gpu-[01-02]\n", "{}", info.stderr);
}

/// `sbatch` as workflow tools call it: `--parsable` prints the bare id,
/// its options win over the script's `#SBATCH` lines, `--wrap` runs a
/// command line, and without `--parsable` it says `Submitted batch job N`.
#[test]
fn sbatch_submits_as_tools_call_it() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 4);
    install_slurm_links(&cluster);
    let sbatch = |args: &[&str]| slurm_command(&cluster, "sbatch", args);
    let script = cluster.dir.path().join("job.sh");
    std::fs::write(
        &script,
        "#!/bin/sh\n#SBATCH -J from-script\n#SBATCH --gres=gpu:1\necho \"$SLURM_JOB_NAME $SLURM_GPUS_ON_NODE\"\n",
    )
    .unwrap();
    let run = sbatch(&[
        "--parsable",
        "-J",
        "from-cli",
        "--gres=gpu:2",
        &script.display().to_string(),
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let id: u64 = run
        .stdout
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("a bare id: {:?}", run.stdout));
    cluster.wait_for_state(id, "completed");
    assert_eq!(
        cluster.gpool(&["logs", &id.to_string()]).ok().to_string(),
        "from-cli 2\n"
    );
    let wrapped = sbatch(&["--wrap", "echo wrapped"]);
    assert_eq!(wrapped.code, 0, "{}", wrapped.stderr);
    let id: u64 = wrapped
        .stdout
        .trim()
        .strip_prefix("Submitted batch job ")
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("{:?}", wrapped.stdout));
    cluster.wait_for_state(id, "completed");
    let refused = sbatch(&["--gres=nvme:1", &script.display().to_string()]);
    assert_ne!(refused.code, 0);
    assert!(refused.stderr.contains("--gres=nvme:1"), "{}", refused.stderr);
}

/// `srun` inside a job starts this node's task, as submitit's scripts and
/// training launchers use it (each rank's output where `-o` says, one task
/// per node); outside a job it runs one as `gpool run` does; `scontrol`
/// shows a job as key=value lines and holds and releases.
#[test]
fn srun_and_scontrol_as_scripts_use_them() {
    let mut cluster = Cluster::start();
    cluster.start_agent("gpu-01", 2);
    cluster.start_agent("gpu-02", 2);
    install_slurm_links(&cluster);
    let dir = cluster.dir.path().display().to_string();
    let srun = format!("{dir}/bin/srun");
    let ranks = format!(
        "{srun} -u -o {dir}/out-%j-%t.txt -n 2 sh -c 'echo rank $SLURM_PROCID of $SLURM_NTASKS on $SLURM_JOB_NODELIST'"
    );
    let gang = cluster.submit(&["-N", "2", "--gpus-per-node", "1", "--", "sh", "-c", &ranks]);
    cluster.wait_for_state(gang, "completed");
    for rank in 0..2 {
        let out = std::fs::read_to_string(format!("{dir}/out-{gang}-{rank}.txt")).unwrap_or_default();
        assert_eq!(out, format!("rank {rank} of 2 on gpu-[01-02]\n"));
    }
    let too_many = cluster.submit(&[
        "-N",
        "2",
        "--gpus-per-node",
        "1",
        "--",
        "sh",
        "-c",
        &format!("{srun} -n 4 true"),
    ]);
    let failed = cluster.wait_for_state(too_many, "failed");
    assert_eq!(failed["exit_code"], 1, "{failed}");

    let slurm = |command: &str, args: &[&str]| slurm_command(&cluster, command, args);
    let outside = slurm("srun", &["--gres=gpu:1", "-J", "hello", "sh", "-c", "echo hi; exit 3"]);
    assert_eq!(
        (outside.code, outside.stdout.as_str()),
        (3, "hi\n"),
        "{}",
        outside.stderr
    );
    let shown = slurm("scontrol", &["show", "job", &gang.to_string()]);
    assert!(
        shown.stdout.starts_with(&format!("JobId={gang} JobName=sh\n")),
        "{}",
        shown.stdout
    );
    assert!(
        shown.stdout.contains("   JobState=COMPLETED Reason=None"),
        "{}",
        shown.stdout
    );
    assert!(shown.stdout.contains("NodeList=gpu-[01-02]"), "{}", shown.stdout);
    // Held twice over (submitted held, held again), then released: it runs.
    let waiting = cluster.submit(&["--hold", "--", "true"]);
    assert_eq!(slurm("scontrol", &["hold", &waiting.to_string()]).code, 0);
    assert!(cluster.job(waiting)["reason_codes"].to_string().contains("held"));
    assert_eq!(slurm("scontrol", &["release", &waiting.to_string()]).code, 0);
    cluster.wait_for_state(waiting, "completed");
    let node = slurm("scontrol", &["show", "node", "gpu-01"]);
    assert!(node.stdout.starts_with("NodeName=gpu-01 State="), "{}", node.stdout);
}

/// submitit, a real Slurm client nobody here wrote, drives gpool through
/// the links as it drives Slurm: a function job, an array of 20
/// (`map_array`), a 2-node × 2-task job whose ranks read
/// `JobEnvironment()`, a job
/// that fails (its exception comes back), and a cancel through `scancel`.
/// The operator passes over `--open-mode` (gpool does not append to output
/// files) with `GPOOL_SBATCH_IGNORE`.
#[test]
fn submitit_drives_gpool_through_slurms_commands() {
    let has_submitit = std::process::Command::new("python3")
        .args(["-c", "import submitit"])
        .status()
        .is_ok_and(|status| status.success());
    let required = std::env::var("GPOOL_E2E_REQUIRE").is_ok_and(|list| list.split(',').any(|t| t.trim() == "submitit"));
    if !has_submitit {
        assert!(
            !required,
            "submitit is not installed (pip install submitit), and GPOOL_E2E_REQUIRE needs it"
        );
        eprintln!("skipped: submitit is not installed (pip install submitit; .ci/run installs it)");
        return;
    }
    let mut cluster = Cluster::start();
    cluster.start_agent("gpu-01", 2);
    cluster.start_agent("gpu-02", 2);
    install_slurm_links(&cluster);
    let logs = cluster.dir.path().join("logs");
    let script = format!(
        r#"
import submitit, time
def add(a, b):
    return a + b
def boom():
    raise ValueError("boom")
def ranks():
    env = submitit.JobEnvironment()
    return (env.global_rank, env.local_rank, env.num_tasks, env.num_nodes, env.hostnames)
ex = submitit.AutoExecutor(folder="{logs}", cluster="slurm")
ex.update_parameters(timeout_min=5, slurm_partition="default", gpus_per_node=1)
print("result", ex.submit(add, 2, 3).result())
print("array", [job.result() for job in ex.map_array(add, list(range(20)), [10] * 20)])
gang = submitit.AutoExecutor(folder="{logs}", cluster="slurm")
gang.update_parameters(timeout_min=5, nodes=2, tasks_per_node=2, gpus_per_node=1)
print("gang", gang.submit(ranks).results())
try:
    ex.submit(boom).result()
except Exception as err:
    print("failed", type(err).__name__, "ValueError: boom" in str(err))
slow = ex.submit(time.sleep, 300)
while slow.state != "RUNNING":
    time.sleep(0.2)
slow.cancel()
while not slow.state.startswith("CANCELLED"):
    time.sleep(0.2)
print("cancelled", slow.state.split()[0])
"#,
        logs = logs.display()
    );
    let bin = cluster.dir.path().join("bin");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());
    let child = std::process::Command::new("python3")
        .args(["-c", &script])
        .env("PATH", path)
        .env("GPOOL_SERVER", &cluster.cli_server)
        .env("GPOOL_SBATCH_IGNORE", "--open-mode")
        .current_dir(cluster.dir.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run python3");
    let output = crate::harness::process::output_within(child, "submitit's script", Duration::from_secs(240));
    let said = String::from_utf8_lossy(&output.stdout).to_string();
    assert!(
        output.status.success(),
        "{said}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let array: Vec<String> = (0..20).map(|n| (n + 10).to_string()).collect();
    assert_eq!(
        said.lines().collect::<Vec<_>>(),
        [
            "result 5".to_string(),
            format!("array [{}]", array.join(", ")),
            "gang [(0, 0, 4, 2, ['gpu-01', 'gpu-02']), (1, 1, 4, 2, ['gpu-01', 'gpu-02']), \
             (2, 0, 4, 2, ['gpu-01', 'gpu-02']), (3, 1, 4, 2, ['gpu-01', 'gpu-02'])]"
                .to_string(),
            "failed FailedJobError True".to_string(),
            "cancelled CANCELLED".to_string(),
        ]
    );
}

/// `sacct -P` and `squeue -h -o` for 1,000 jobs, field by field, in the
/// forms Slurm's manuals give: ids `N` or `N_I`, Slurm's state names,
/// `code:signal`, `[D-]HH:MM:SS`, ISO times or `Unknown`, node lists.
#[test]
fn sacct_and_squeue_rows_of_a_thousand_jobs_are_in_slurms_forms() {
    let mut cluster = Cluster::start();
    cluster.start_agent("gpu-01", 8);
    cluster.start_agent("gpu-02", 8);
    install_slurm_links(&cluster);
    let slurm = |command: &str, args: &[&str]| slurm_command(&cluster, command, args);
    let array = cluster.submit(&[
        "-J",
        "many",
        "-a",
        "0-989",
        "--",
        "sh",
        "-c",
        "exit $((SLURM_ARRAY_TASK_ID % 3))",
    ]);
    let waiting: Vec<u64> = (0..10).map(|_| cluster.submit(&["--hold", "--", "true"])).collect();
    wait_until("the array to end", Duration::from_secs(300), || {
        (cluster.job(array)["state"] != "pending" && cluster.job(array)["state"] != "running").then_some(())
    });
    let fields = "JobID,JobName,State,ExitCode,Elapsed,Start,End,NodeList,NNodes,Partition";
    let acct = slurm(
        "sacct",
        &["-P", "-n", "-X", "-a", "--format", fields, "-S", "2000-01-01"],
    );
    assert_eq!(acct.code, 0, "{}", acct.stderr);
    let time = |value: &str| {
        value == "Unknown"
            || (value.len() == 19
                && value.as_bytes()[10] == b'T'
                && value.chars().filter(char::is_ascii_digit).count() == 14)
    };
    let elapsed = |value: &str| {
        let clock = value.rsplit('-').next().unwrap_or("");
        clock.len() == 8
            && clock
                .split(':')
                .all(|part| part.len() == 2 && part.parse::<u32>().is_ok())
    };
    let rows: Vec<&str> = acct.stdout.lines().collect();
    assert_eq!(rows.len(), 1000, "{}", acct.stdout);
    for row in &rows {
        let f: Vec<&str> = row.split('|').collect();
        assert_eq!(f.len(), 10, "{row}");
        let (id, task) = f[0].split_once('_').unwrap_or((f[0], "0"));
        assert!(id.parse::<u64>().is_ok() && task.parse::<u32>().is_ok(), "JobID: {row}");
        assert!(["COMPLETED", "FAILED", "PENDING"].contains(&f[2]), "State: {row}");
        let (code, signal) = f[3].split_once(':').expect("ExitCode is code:signal");
        assert!(
            code.parse::<i32>().is_ok() && signal.parse::<i32>().is_ok(),
            "ExitCode: {row}"
        );
        assert!(elapsed(f[4]) && time(f[5]) && time(f[6]), "times: {row}");
        assert!(f[7] == "None assigned" || f[7].starts_with("gpu-0"), "NodeList: {row}");
        assert_eq!((f[8], f[9]), ("1", "default"), "{row}");
        if f[2] == "FAILED" {
            assert!(f[3] == "1:0" || f[3] == "2:0", "{row}");
        }
    }
    let failed = rows.iter().filter(|row| row.contains("|FAILED|")).count();
    assert_eq!(failed, 660, "two tasks in three exit non-zero");
    let queue = slurm("squeue", &["-h", "-o", "%i|%t|%T|%M|%l|%D|%R"]);
    let queued: Vec<&str> = queue.stdout.lines().collect();
    assert_eq!(queued.len(), 10, "{}", queue.stdout);
    for (row, id) in queued.iter().zip(&waiting) {
        assert_eq!(*row, format!("{id}|PD|PENDING|0:00|UNLIMITED|1|(JobHeldUser)"));
    }
}

/// The README's Slurm script, as it is written there, through `sbatch`:
/// ten tasks of two GPUs, each writing its own `out-%A_%a.log`.
#[test]
fn the_readmes_slurm_script_runs_unchanged() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let from = readme
        .find("    #!/bin/sh\n    #SBATCH -J sweep")
        .expect("the README's script");
    let script: String = readme[from..]
        .lines()
        .take_while(|line| line.starts_with("    "))
        .map(|line| format!("{}\n", &line[4..]))
        .collect();
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 8);
    let dir = cluster.dir.path().to_path_buf();
    std::fs::write(dir.join("sweep.sh"), &script).unwrap();
    install_slurm_links(&cluster);
    let run = slurm_command(&cluster, "sbatch", &["--parsable", "sweep.sh"]);
    let array: u64 = run
        .stdout
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("{} {}", run.stdout, run.stderr));
    wait_until("the array to end", Duration::from_secs(120), || {
        (cluster.job(array)["state"] == "completed").then_some(())
    });
    for task in 0..10 {
        let out = std::fs::read_to_string(dir.join(format!("out-{array}_{task}.log"))).unwrap_or_default();
        let gpus = out
            .trim()
            .strip_prefix(&format!("task {task} of {array} on n1, GPUs "))
            .unwrap_or_else(|| panic!("task {task}: {out:?}"));
        assert_eq!(gpus.split(',').count(), 2, "{out}");
    }
}
