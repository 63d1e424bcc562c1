//! Where jobs land: requirements on GPU memory, NVLink, labels and node
//! lists, checked at submit against the known nodes; small jobs kept off
//! whole NVLink domains; jobs asking for limits kept off nodes that cannot
//! enforce them, or warned.

use crate::harness::cluster::Cluster;
use crate::harness::process::{wait_for_file, wait_until};
use std::time::Duration;

/// The nodes of a job's latest attempt.
fn node_of(cluster: &Cluster, id: u64) -> String {
    cluster.job(id)["node_list"][0].as_str().unwrap_or_default().to_string()
}

#[test]
fn requirements_are_checked_at_submit_and_steer_jobs() {
    let mut cluster = Cluster::start();
    cluster.start_agent_with("n1", 2, "\n[labels]\nrack = \"r1\"\n");
    cluster.start_agent_with("n2", 2, "\n[labels]\nrack = \"r2\"\n");

    // The simulated H100s have 81,559 MiB: 100G is more than any has.
    let refused = cluster.gpool(&["submit", "--min-gpu-memory", "100G", "--", "true"]);
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains(
            "min_gpu_memory: no GPU of an acceptable model in pool \"default\" has 95368 MiB; the largest has 81559 MiB"
        ),
        "{}",
        refused.stderr
    );
    let unknown = cluster.gpool(&["submit", "-w", "n9", "--", "true"]);
    assert!(
        unknown.stderr.contains("nodelist: no node is named n9 (known: n1, n2)"),
        "{}",
        unknown.stderr
    );
    let no_label = cluster.gpool(&["submit", "--constraint", "rack=r7", "--", "true"]);
    assert!(
        no_label
            .stderr
            .contains("constraint: no node of pool \"default\" has the labels rack=r7"),
        "{}",
        no_label.stderr
    );

    let big = cluster.submit(&["--min-gpu-memory", "80G", "--wait", "--", "true"]);
    assert_eq!(cluster.job(big)["state"], "completed");
    assert_eq!(cluster.job(big)["min_gpu_memory_mib"], 76_294);
    for (flags, node) in [
        (&["-w", "n2"][..], "n2"),
        (&["-x", "n2"][..], "n1"),
        (&["-C", "rack=r2"][..], "n2"),
    ] {
        let mut args = flags.to_vec();
        args.extend(["--wait", "--", "true"]);
        let id = cluster.submit(&args);
        assert_eq!(node_of(&cluster, id), node, "{flags:?}");
    }
    let shown = cluster.gpool(&["show", &big.to_string()]).ok().to_string();
    assert!(shown.contains("GPUs of at least 76294 MiB"), "{shown}");
}

#[test]
fn a_four_gpu_job_gets_a_whole_nvlink_domain_while_one_gpu_jobs_run() {
    let mut cluster = Cluster::start();
    cluster.start_agent_with(
        "n1",
        8,
        "\n[simulated_topology]\nnvlink = [[0, 1, 2, 3], [4, 5], [6, 7]]\n",
    );
    // Each small job records its GPU and waits for its release file.
    let mut small = Vec::new();
    for name in ["a", "b"] {
        let script = format!(
            "echo $CUDA_VISIBLE_DEVICES > gpu-{name}; {}",
            wait_for_file(&format!("release-{name}"))
        );
        small.push(cluster.submit(&["--gpus", "1", "--", "sh", "-c", &script]));
        cluster.wait_for_state(*small.last().unwrap(), "running");
    }
    let read = |name: &str| {
        wait_until(
            &format!("job {name} to record its GPU"),
            Duration::from_secs(20),
            || {
                let text = std::fs::read_to_string(cluster.dir.path().join(format!("gpu-{name}"))).ok()?;
                text.ends_with('\n').then(|| text.trim().to_string())
            },
        )
    };
    // Both small jobs go into the pairs, one broken pair first.
    assert_eq!((read("a"), read("b")), ("4".to_string(), "5".to_string()));
    let run = cluster.gpool(&[
        "submit",
        "--gpus",
        "4",
        "--nvlink",
        "required",
        "--wait",
        "--",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES",
    ]);
    assert_eq!(run.code, 0, "stderr: {}", run.stderr);
    let id = run.stdout.trim();
    let out = cluster.spool_dir("n1").join(format!("jobs/{id}.1.out"));
    assert_eq!(std::fs::read_to_string(out).unwrap_or_default(), "0,1,2,3\n");
    for name in ["a", "b"] {
        std::fs::write(cluster.dir.path().join(format!("release-{name}")), "").unwrap();
    }
    for id in small {
        cluster.wait_for_state(id, "completed");
    }
}

#[test]
fn a_mig_slice_job_gets_its_mig_uuid_and_the_parent_is_never_offered_whole() {
    let mut cluster = Cluster::start();
    cluster.start_agent_with(
        "n1",
        0,
        "[[simulated_gpu]]\nmodel = \"a100-40gb\"\nmemory_mib = 40960\nmig = [\"3g.20gb\", \"1g.5gb\"]\n\n\
         [[simulated_gpu]]\nmodel = \"a100-40gb\"\nmemory_mib = 40960\n",
    );
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    let gpus: Vec<String> = nodes[0]["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            format!(
                "{} {} {}",
                g["index"],
                g["model"].as_str().unwrap_or(""),
                g["mig_parent"]
            )
        })
        .collect();
    assert_eq!(gpus, ["1 a100-40gb null", "2 a100-3g.20gb 0", "3 a100-1g.5gb 0"]);
    assert_eq!(nodes[0]["labels"]["nvidia.mig"], "enabled");
    let run = cluster.gpool(&[
        "submit",
        "--gpu-type",
        "a100-3g.20gb",
        "--wait",
        "--",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES",
    ]);
    assert_eq!(run.code, 0, "stderr: {}", run.stderr);
    let id = run.stdout.trim();
    let out = cluster.spool_dir("n1").join(format!("jobs/{id}.1.out"));
    assert_eq!(std::fs::read_to_string(out).unwrap_or_default(), "MIG-SIM-n1-0-0\n");
    // Only one whole A100 is offered: the one not in MIG mode.
    let two = cluster.gpool(&["submit", "--gpu-type", "a100-40gb", "--gpus", "2", "--", "true"]);
    assert!(
        two.stderr.contains("the largest fit is 1 a100-40gb GPUs on one node"),
        "{}",
        two.stderr
    );
}

/// Agents report their CPUs and memory: a job asking more of either than
/// any node has is refused at submit, naming the field and the most there
/// is, instead of being accepted and run.
#[test]
fn memory_and_cpus_no_node_has_are_refused_at_submit() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 8);
    wait_until("n1 to report its CPUs", Duration::from_secs(20), || {
        let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
        (nodes[0]["cpus"].as_u64()? > 0 && nodes[0]["memory_bytes"].as_u64()? > 0).then_some(())
    });
    let mem = cluster.gpool(&["submit", "--mem", "5000T", "--", "true"]);
    assert_eq!(mem.code, 2, "{}", mem.stderr);
    assert!(
        mem.stderr.contains("mem: no node of pool \"default\" has")
            && mem.stderr.contains("GiB of memory; the most is"),
        "{}",
        mem.stderr
    );
    let cpus = cluster.gpool(&["submit", "--cpus-per-gpu", "1000", "-G", "8", "--", "true"]);
    assert_eq!(cpus.code, 2, "{}", cpus.stderr);
    assert!(
        cpus.stderr
            .contains("is 8000 CPUs on a node; no node of pool \"default\" has that many"),
        "{}",
        cpus.stderr
    );
    // Per GPU: 800T times 8 GPUs on the node.
    let per_gpu = cluster.gpool(&["submit", "--mem-per-gpu", "800T", "-G", "8", "--", "true"]);
    assert_eq!(per_gpu.code, 2, "{}", per_gpu.stderr);
    assert!(
        per_gpu.stderr.contains("mem: no node of pool \"default\" has"),
        "{}",
        per_gpu.stderr
    );
    let both = cluster.gpool(&["submit", "--mem", "1G", "--mem-per-gpu", "1G", "--", "true"]);
    assert_eq!(both.code, 2, "{}", both.stderr);
    let fits = cluster.gpool(&["submit", "--cpus-per-gpu", "1", "--mem", "64M", "--wait", "--", "true"]);
    assert_eq!(fits.code, 0, "{}", fits.stderr);
    let fits = cluster.gpool(&["submit", "--mem-per-gpu", "32M", "-G", "2", "--wait", "--", "true"]);
    assert_eq!(fits.code, 0, "{}", fits.stderr);
}

/// CPUs and memory are shared out as GPUs are (agent.toml's `cpus` and
/// `memory` say what each node gives): a job that asks for CPUs goes where
/// they are free, not only where its GPUs fit best, and waits, saying so,
/// while no node has them, though GPUs are free; jobs that ask for none
/// still take those GPUs.
#[test]
fn a_job_waits_for_cpus_the_nodes_have_given_out_though_gpus_are_free() {
    let mut cluster = Cluster::start();
    for node in ["n1", "n2"] {
        let top = format!("controller = \"{}\"\ncpus = 8\nmemory = \"32G\"\n", cluster.addr);
        cluster.spawn_agent(node, 4, &top, "", None);
        cluster.wait_for_registered(node);
    }
    wait_until("both nodes to report 8 CPUs", Duration::from_secs(20), || {
        let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
        let nodes = nodes.as_array()?;
        (nodes.len() == 2 && nodes.iter().all(|n| n["cpus"] == 8)).then_some(())
    });
    // 6 of one node's 8 CPUs.
    let a = cluster.submit(&["--cpus-per-gpu", "6", "--", "sleep", "300"]);
    cluster.wait_for_state(a, "running");
    let a_node = node_of(&cluster, a);
    // Best fit alone would put it beside a (3 GPUs free there, 4 on the
    // other node), where only 2 CPUs are left.
    let b = cluster.submit(&["--gpus", "2", "--cpus-per-gpu", "3", "--", "sleep", "300"]);
    cluster.wait_for_state(b, "running");
    assert_ne!(node_of(&cluster, b), a_node, "b goes where its 6 CPUs are free");
    // 4 CPUs: each node has 2 left.
    let c = cluster.submit(&["--cpus-per-gpu", "4", "--mem", "1G", "--", "true"]);
    let reason = wait_until("c to say why it waits", Duration::from_secs(20), || {
        let job = cluster.job(c);
        let reasons = job["reasons"]
            .as_array()?
            .iter()
            .filter_map(|r| r.as_str())
            .collect::<Vec<_>>()
            .join("; ");
        (!reasons.is_empty()).then_some(reasons)
    });
    assert!(
        reason.contains("4 free CPUs and 1.0 GiB of free memory on each node"),
        "{reason}"
    );
    assert_eq!(cluster.job(c)["state"], "pending");
    let d = cluster.submit(&["--gpus", "2", "--wait", "--", "true"]);
    assert_eq!(
        cluster.job(d)["state"],
        "completed",
        "a job that asks for no CPUs takes free GPUs"
    );
    cluster.gpool(&["cancel", &a.to_string()]).ok();
    cluster.wait_for_state(c, "completed");
    assert_eq!(node_of(&cluster, c), a_node, "c gets the CPUs a gave back");
    cluster.gpool(&["cancel", &b.to_string()]).ok();
}

/// A pool's `default_cpus_per_gpu` and `default_mem_per_gpu` (Slurm's
/// `DefCpuPerGPU`, `DefMemPerGPU`) are what its jobs get where they ask for
/// nothing themselves, and are placed as their own asks would be.
#[test]
fn a_pools_defaults_give_jobs_cpus_and_memory_they_did_not_ask_for() {
    let mut cluster =
        Cluster::with_config("[[pool]]\nname = \"default\"\ndefault_cpus_per_gpu = 3\ndefault_mem_per_gpu = \"1G\"\n");
    let top = format!("controller = \"{}\"\ncpus = 8\nmemory = \"32G\"\n", cluster.addr);
    cluster.spawn_agent("n1", 4, &top, "", None);
    cluster.wait_for_registered("n1");
    let first = cluster.submit(&["--gpus", "2", "--time", "10m", "--", "sleep", "300"]);
    cluster.wait_for_state(first, "running");
    let job = cluster.job(first);
    assert_eq!(job["cpus_per_gpu"], 3, "{job}");
    assert_eq!(job["mem_bytes"], 2u64 << 30, "1G for each of its 2 GPUs");
    // 6 more CPUs: 2 are left, though 2 GPUs are free.
    let second = cluster.submit(&["--gpus", "2", "--", "true"]);
    wait_until("the second job to say why it waits", Duration::from_secs(20), || {
        let reasons = cluster.job(second)["reasons"].to_string();
        reasons.contains("6 free CPUs").then_some(())
    });
    // Its own ask stands over the pool's (it ends before the second job
    // could start, so backfill lets it ahead).
    let third = cluster.submit(&[
        "--gpus",
        "2",
        "--cpus-per-gpu",
        "1",
        "--mem",
        "1G",
        "--time",
        "1m",
        "--wait",
        "--",
        "true",
    ]);
    assert_eq!(cluster.job(third)["state"], "completed");
    assert_eq!(cluster.job(third)["mem_bytes"], 1u64 << 30);
    cluster.gpool(&["cancel", &first.to_string()]).ok();
    cluster.wait_for_state(second, "completed");
}

/// `--exclusive` (as Slurm's): the job waits for a node with nothing
/// running, takes every GPU of it (its CUDA_VISIBLE_DEVICES lists them
/// all), and no other job joins it while it runs.
#[test]
fn an_exclusive_job_gets_a_whole_idle_node_to_itself() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 4);
    cluster.start_agent("n2", 4);
    let busy = cluster.submit(&["--", "sleep", "300"]);
    cluster.wait_for_state(busy, "running");
    let busy_node = node_of(&cluster, busy);
    let whole = cluster.submit(&[
        "--exclusive",
        "--",
        "sh",
        "-c",
        "echo $CUDA_VISIBLE_DEVICES > whole-visible; sleep 300",
    ]);
    cluster.wait_for_state(whole, "running");
    assert_ne!(node_of(&cluster, whole), busy_node, "only the idle node");
    let visible = wait_until("the exclusive job's GPUs", Duration::from_secs(20), || {
        // Whole once its line is written (the shell makes the file first).
        std::fs::read_to_string(cluster.dir.path().join("whole-visible"))
            .ok()
            .filter(|text| text.ends_with('\n'))
    });
    assert_eq!(visible.trim(), "0,1,2,3", "every GPU of its node");
    let job = cluster.job(whole);
    assert_eq!(job["exclusive"], true, "{job}");
    // Another job goes beside `busy`, never beside `whole`.
    let beside = cluster.submit(&["--gpus", "2", "--wait", "--", "true"]);
    assert_eq!(node_of(&cluster, beside), busy_node);
    let second = cluster.submit(&["--exclusive", "--", "true"]);
    let reasons = wait_until(
        "the second exclusive job to say why it waits",
        Duration::from_secs(20),
        || {
            let reasons = cluster.job(second)["reasons"].to_string();
            reasons.contains("--exclusive").then_some(reasons)
        },
    );
    assert!(reasons.contains("nodes with nothing else running"), "{reasons}");
    cluster.gpool(&["cancel", &busy.to_string()]).ok();
    cluster.wait_for_state(second, "completed");
    assert_eq!(node_of(&cluster, second), busy_node);
    cluster.gpool(&["cancel", &whole.to_string()]).ok();
}

/// An agent whose agent.toml turns cgroups off, with `n_gpus` GPUs: a
/// node that enforces no limit.
fn start_unenforcing_agent(cluster: &mut Cluster, node: &str, n_gpus: u32) {
    let top = format!("controller = \"{}\"\ncgroups = false\n", cluster.addr);
    cluster.spawn_agent(node, n_gpus, &top, "", None);
    cluster.wait_for_registered(node);
}

/// What `gpool nodes --output json` says `node` enforces.
fn enforces(cluster: &Cluster, node: &str) -> Vec<String> {
    let nodes = cluster.gpool(&["nodes", "--output", "json"]).json();
    let found = nodes
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["name"] == node).cloned());
    let found = found.unwrap_or_else(|| panic!("gpool nodes lists no {node}: {nodes}"));
    (found["enforces"]
        .as_array()
        .unwrap_or_else(|| panic!("no enforces: {found}"))
        .iter())
    .filter_map(|limit| limit.as_str().map(String::from))
    .collect()
}

/// By default (`enforce_limits = "refuse"`), a job asking for a memory
/// limit never runs on a node that cannot enforce it: it waits, and its
/// reason names the limit and the node; a job asking for no limit runs
/// there. `gpool nodes` and `gpool show NODE` say the node enforces
/// nothing.
#[test]
fn a_job_asking_for_memory_waits_where_no_node_enforces_it() {
    let mut cluster = Cluster::with_config("");
    start_unenforcing_agent(&mut cluster, "n1", 2);
    assert_eq!(enforces(&cluster, "n1"), Vec::<String>::new());
    let table = cluster.gpool(&["nodes"]);
    assert!(table.ok().contains("ENFORCES"), "{}", table.stdout);
    let shown = cluster.gpool(&["show", "n1"]);
    assert!(shown.ok().contains("enforces:        nothing"), "{}", shown.stdout);

    let limited = cluster.submit(&["--mem", "256M", "--", "true"]);
    let reasons = wait_until("the job to say why it waits", Duration::from_secs(20), || {
        let job = cluster.job(limited);
        let codes = job["reason_codes"].to_string();
        codes.contains("limits_not_enforced").then_some(job)
    });
    assert_eq!(reasons["state"], "pending");
    let words = reasons["reasons"].to_string();
    assert!(
        words.contains("memory limit (--mem) not enforced on 1 node: n1"),
        "{words}"
    );
    let why = cluster.gpool(&["why", &limited.to_string()]);
    assert!(why.ok().contains("not enforced on 1 node: n1"), "{}", why.stdout);

    let plain = cluster.gpool(&["submit", "--wait", "--", "true"]);
    assert_eq!(plain.code, 0, "a job asking for no limit runs there: {}", plain.stderr);
    assert_eq!(cluster.job(limited)["state"], "pending");
    cluster.gpool(&["cancel", &limited.to_string()]).ok();
}

/// With `enforce_limits = "warn"` the same job runs there, and `gpool show`
/// warns that the node does not enforce its memory limit, before and
/// after a restart of gpoold.
#[test]
fn with_warn_a_job_runs_where_its_limit_is_not_enforced_and_says_so() {
    let mut cluster = Cluster::with_config("enforce_limits = \"warn\"\n");
    start_unenforcing_agent(&mut cluster, "n1", 2);
    let run = cluster.gpool(&["submit", "--output", "json", "--mem", "256M", "--wait", "--", "true"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let id = run.json()["ids"][0].as_u64().expect("an id");
    let expected = "node n1 does not enforce memory (--mem 256M): the job may use more";
    let check = |cluster: &Cluster| {
        let shown = cluster.gpool(&["show", &id.to_string()]);
        let line = shown
            .ok()
            .lines()
            .find(|line| line.starts_with("warning:"))
            .map(String::from);
        assert!(
            line.as_deref().is_some_and(|line| line.contains(expected)),
            "{}",
            shown.stdout
        );
        assert_eq!(cluster.job(id)["warnings"][0], expected);
    };
    check(&cluster);
    cluster.controller().stop();
    cluster.start_controller();
    check(&cluster);
}

/// Where one node enforces limits (an agent as root, with cgroups) and
/// another does not, a job asking for memory lands on the first, though
/// the other is the better fit.
#[test]
fn a_job_asking_for_memory_lands_on_the_node_that_enforces_it() {
    let mut cluster = Cluster::with_config("");
    start_unenforcing_agent(&mut cluster, "loose", 1);
    cluster.start_agent("strict", 4);
    if !enforces(&cluster, "strict").iter().any(|limit| limit == "memory") {
        let required = std::env::var("GPOOL_E2E_REQUIRE").is_ok_and(|list| list.split(',').any(|t| t.trim() == "root"));
        let why = format!(
            "an agent here enforces {:?}, not memory (it needs root and a cgroup memory controller)",
            enforces(&cluster, "strict")
        );
        assert!(!required, "{why}, and GPOOL_E2E_REQUIRE needs root");
        eprintln!("skipped: {why}");
        return;
    }
    let shown = cluster.gpool(&["show", "strict"]);
    assert!(shown.ok().contains("memory"), "{}", shown.stdout);
    let id = cluster.submit(&["--mem", "256M", "--", "true"]);
    cluster.wait_for_state(id, "completed");
    assert_eq!(node_of(&cluster, id), "strict");
    assert!(cluster.job(id)["warnings"].as_array().is_some_and(Vec::is_empty));
}
