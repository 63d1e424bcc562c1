//! Prometheus metrics: gpoold serves /metrics with the pool's state.

use crate::harness::cluster::Cluster;
use crate::harness::process::wait_until;
use std::time::Duration;

/// The status line and body of an HTTP GET of `path` at `addr`.
fn get(addr: &str, path: &str) -> (String, String) {
    let (status, _, body) = crate::harness::http_get(addr, path);
    (status, body)
}

/// The value of the sample whose name and labels are `series`.
fn value(body: &str, series: &str) -> Option<f64> {
    body.lines().find_map(|line| {
        line.strip_prefix(series)?
            .strip_prefix(' ')?
            .split(' ')
            .next()?
            .parse()
            .ok()
    })
}

#[test]
fn metrics_show_gpus_jobs_and_scheduling() {
    let mut cluster = Cluster::with_config(
        "metrics_listen = \"127.0.0.1:0\"\n\n[[team]]\nname = \"ml\"\nguaranteed_gpus = 1\ngpu_hours = 100\n",
    );
    cluster.start_agent("n1", 2);
    let job = cluster.submit(&["--team", "ml", "-t", "1h", "--", "sleep", "30"]);
    cluster.wait_for_state(job, "running");
    let addr = std::fs::read_to_string(cluster.state_dir().join("metrics.addr")).unwrap();
    let addr = addr.trim();
    let body = wait_until("the metrics to show the running job", Duration::from_secs(10), || {
        let (status, body) = get(addr, "/metrics");
        assert!(status.contains("200"), "{status}");
        (value(&body, "gpool_jobs{state=\"running\",team=\"ml\"}") == Some(1.0)).then_some(body)
    });
    for (series, expected) in [
        ("gpool_gpus{model=\"h100\",pool=\"default\",state=\"allocated\"}", 1.0),
        ("gpool_gpus{model=\"h100\",pool=\"default\",state=\"idle\"}", 1.0),
        ("gpool_nodes{state=\"up\"}", 1.0),
        ("gpool_team_gpus_in_use{team=\"ml\",ledger=\"guaranteed\"}", 1.0),
        ("gpool_queue_wait_seconds_count{team=\"ml\"}", 1.0),
        ("gpool_preemptions_total", 0.0),
        ("gpool_notifications_dropped_total", 0.0),
        ("gpool_team_guaranteed_gpus{team=\"ml\"}", 1.0),
        ("gpool_team_gpu_hours_budget{team=\"ml\"}", 100.0),
        ("gpool_team_gpu_hours{team=\"ml\",ledger=\"burst\"}", 0.0),
    ] {
        assert_eq!(value(&body, series), Some(expected), "{series} in:\n{body}");
    }
    assert!(
        value(&body, "gpool_scheduling_cycle_seconds_count").is_some_and(|n| n >= 1.0),
        "{body}"
    );
    // The submit and the start were each made durable by a flush.
    assert!(
        value(&body, "gpool_store_flush_seconds_count").is_some_and(|n| n >= 2.0),
        "{body}"
    );
    assert!(body.contains("# TYPE gpool_queue_wait_seconds histogram"), "{body}");
    // The running job is charged as it runs.
    let hours = value(&body, "gpool_team_gpu_hours{team=\"ml\",ledger=\"guaranteed\"}");
    assert!(hours.is_some_and(|hours| hours > 0.0 && hours < 0.1), "{hours:?}");
    assert!(
        value(&body, "gpool_team_gpu_hours_budget_left{team=\"ml\"}").is_some_and(|left| left < 100.0 && left > 99.9)
    );
    assert!(body.trim_end().ends_with("# EOF"), "{body}");
    let (status, _) = get(addr, "/other");
    assert!(status.contains("404"), "{status}");

    // Every query of the Grafana dashboard names metrics gpoold exports.
    let exported: std::collections::BTreeSet<String> = body
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|line| {
            let (name, kind) = line.split_once(' ')?;
            Some(match kind {
                "counter" => vec![format!("{name}_total")],
                "histogram" => ["_bucket", "_sum", "_count"]
                    .iter()
                    .map(|s| format!("{name}{s}"))
                    .collect(),
                _ => vec![name.to_string()],
            })
        })
        .flatten()
        .collect();
    let dashboard_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/grafana/gpool.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&dashboard_path).unwrap()).unwrap();
    let mut n_queries = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            n_queries += 1;
            let names: Vec<&str> = expr
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|word| word.starts_with("gpool_"))
                .collect();
            assert!(!names.is_empty(), "{expr} names no gpool metric");
            for name in names {
                assert!(
                    exported.contains(name),
                    "{name} (in {expr}) is not exported: {exported:?}"
                );
            }
        }
    }
    assert!(n_queries >= 10, "{n_queries} queries");
}

#[test]
fn a_jobs_gpu_use_is_kept_and_an_idle_allocation_is_flagged() {
    let mut cluster = Cluster::start();
    cluster.start_agent("n1", 2);
    let job = cluster.submit(&["--gpus", "2", "--", "sleep", "30"]);
    cluster.wait_for_state(job, "running");
    // Simulated GPUs report no load: the job holds GPUs it does not use.
    let used = wait_until("a few samples of its GPUs", Duration::from_secs(20), || {
        let shown = cluster.job(job);
        (shown["gpu_use"]["samples"].as_u64()? >= 4).then_some(shown["gpu_use"].clone())
    });
    assert_eq!(used["mean_utilization_pct"], 0.0, "{used}");
    assert_eq!(used["idle"], true, "{used}");
    let text = cluster.gpool(&["show", &job.to_string()]).ok().to_string();
    assert!(text.contains("idle: it holds GPUs it does not use"), "{text}");
    // Ended, the job keeps what its attempt used, across a restart.
    cluster.gpool(&["cancel", &job.to_string()]).ok();
    cluster.controller().stop();
    cluster.start_controller();
    let kept = cluster.job(job)["gpu_use"].clone();
    assert!(kept["samples"].as_u64().is_some_and(|n| n >= 4), "{kept}");
}

#[test]
fn a_gpu_far_behind_its_jobs_others_is_a_straggler() {
    let mut cluster = Cluster::with_config("straggler_after = \"1s\"\nmetrics_listen = \"127.0.0.1:0\"\n");
    // GPU 0 reports itself idle, GPUs 1 to 3 90% in use.
    cluster.start_agent_with(
        "n1",
        1,
        "\n[[simulated_gpu]]\nmodel = \"h100\"\nmemory_mib = 81559\ncount = 3\nutilization_pct = 90\necc_corrected = 12\necc_uncorrected = 3\n",
    );
    let job = cluster.submit(&["--gpus", "4", "--", "sleep", "30"]);
    cluster.wait_for_state(job, "running");
    let shown = wait_until("the straggler to be flagged", Duration::from_secs(20), || {
        let shown = cluster.job(job);
        (shown["stragglers"].as_array()?.len() == 1).then_some(shown)
    });
    let straggler = &shown["stragglers"][0];
    assert_eq!(straggler["node"], "n1", "{shown}");
    assert_eq!(straggler["index"], 0, "{shown}");
    assert_eq!(straggler["utilization_pct"], 0, "{shown}");
    assert_eq!(straggler["median_pct"], 90, "{shown}");
    let text = cluster.gpool(&["show", &job.to_string()]).ok().to_string();
    assert!(text.contains("n1 GPU 0 at 0% while the job's median is 90%"), "{text}");
    let addr = std::fs::read_to_string(cluster.state_dir().join("metrics.addr")).unwrap();
    let (_, body) = get(addr.trim(), "/metrics");
    assert_eq!(
        value(&body, "gpool_straggler_gpus{team=\"default\"}"),
        Some(1.0),
        "{body}"
    );
    // ECC counts are per GPU, as its samples report them.
    let labels = "node=\"n1\",index=\"1\",model=\"h100\"";
    assert_eq!(
        value(&body, &format!("gpool_gpu_ecc_errors{{{labels},kind=\"uncorrected\"}}")),
        Some(3.0),
        "{body}"
    );
    assert_eq!(
        value(&body, &format!("gpool_gpu_ecc_errors{{{labels},kind=\"corrected\"}}")),
        Some(12.0),
        "{body}"
    );
    // Its mean use counts all four GPUs.
    let mean = shown["gpu_use"]["mean_utilization_pct"].as_f64().unwrap_or_default();
    assert!((67.0..=68.0).contains(&mean), "{mean}");
    cluster.gpool(&["cancel", &job.to_string()]).ok();
    let ended = cluster.wait_for_state(job, "cancelled");
    assert_eq!(ended["stragglers"], serde_json::json!([]), "{ended}");
    // The flagging stays in the job's history.
    let events = ended["events"].as_array().unwrap();
    assert_eq!(events.len(), 1, "{ended}");
    let event = events[0]["text"].as_str().unwrap();
    assert!(
        event.starts_with("straggler: n1 GPU 0 at 0% while the job's median is 90%"),
        "{event}"
    );
    let text = cluster.gpool(&["show", &job.to_string()]).ok().to_string();
    assert!(text.contains("event") && text.contains("straggler: n1 GPU 0"), "{text}");
}

/// A real Prometheus scrapes gpoold, and PromQL gives the GPUs allocated
/// while jobs run.
#[test]
fn a_real_prometheus_scrapes_gpoold_and_promql_counts_allocated_gpus() {
    let Some(prometheus) = crate::harness::outside_tool("prometheus", "prometheus") else {
        return;
    };
    let mut cluster = Cluster::with_config("metrics_listen = \"127.0.0.1:0\"\n");
    cluster.start_agent("n1", 4);
    let jobs = [
        cluster.submit(&["--gpus", "2", "--", "sleep", "60"]),
        cluster.submit(&["--gpus", "1", "--", "sleep", "60"]),
    ];
    for job in jobs {
        cluster.wait_for_state(job, "running");
    }
    let metrics_addr = std::fs::read_to_string(cluster.state_dir().join("metrics.addr")).unwrap();
    let dir = Cluster::temp_dir();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: gpoold\n    static_configs:\n      - targets: ['{}']\n",
            metrics_addr.trim()
        ),
    )
    .unwrap();
    let web = format!("127.0.0.1:{}", crate::harness::free_port());
    let mut command = std::process::Command::new(prometheus);
    command
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", dir.path().join("tsdb").display()))
        .arg(format!("--web.listen-address={web}"));
    let server = crate::harness::process::Process::spawn("prometheus", command, dir.path().join("prometheus.log"));
    let query = "sum(gpool_gpus%7Bstate%3D%22allocated%22%7D)";
    let answer = wait_until(
        "Prometheus to have scraped the allocated GPUs",
        Duration::from_secs(60),
        || {
            let stream = std::net::TcpStream::connect(&web).ok()?;
            drop(stream);
            let (status, body) = get(&web, &format!("/api/v1/query?query={query}"));
            if !status.contains("200") {
                return None;
            }
            let answer: serde_json::Value = serde_json::from_str(&body).ok()?;
            let value = answer["data"]["result"][0]["value"][1].as_str()?.to_string();
            (value == "3").then_some(answer)
        },
    );
    assert_eq!(answer["status"], "success", "{answer}");
    // The scrape target is up, as Prometheus sees it.
    let (_, up) = get(&web, "/api/v1/query?query=up%7Bjob%3D%22gpoold%22%7D");
    assert!(up.contains("\"1\""), "{up}\n{}", server.log_tail(20));
}

#[test]
fn a_full_pool_where_nothing_changes_runs_no_cycle_and_the_next_change_does() {
    let mut cluster = Cluster::with_config("metrics_listen = \"127.0.0.1:0\"\n");
    cluster.start_agent("n1", 1);
    let running = cluster.submit(&["--", "sleep", "60"]);
    cluster.wait_for_state(running, "running");
    let waiting = cluster.submit(&["--", "true"]);
    let addr = std::fs::read_to_string(cluster.state_dir().join("metrics.addr")).unwrap();
    let addr = addr.trim();
    let counts = || {
        let (_, body) = get(addr, "/metrics");
        (
            value(&body, "gpool_scheduling_cycle_seconds_count").unwrap_or(0.0),
            value(&body, "gpool_scheduling_unchanged_seconds_count").unwrap_or(0.0),
        )
    };
    // The cycle after the submit says why the job waits; from then on
    // the periodic wake-ups (every 5 s) find nothing changed: no cycle.
    wait_until("a reason for the waiting job", Duration::from_secs(15), || {
        cluster.job(waiting)["reasons"][0].as_str().map(String::from)
    });
    let (_, first) = counts();
    let (cycles, unchanged) = wait_until("a wake-up that finds nothing changed", Duration::from_secs(15), || {
        let (cycles, unchanged) = counts();
        (unchanged > first).then_some((cycles, unchanged))
    });
    let later = wait_until("a second such wake-up", Duration::from_secs(15), || {
        let (cycles, later) = counts();
        (later > unchanged).then_some(cycles)
    });
    assert_eq!(later, cycles, "a cycle ran though nothing changed");
    // A change is scheduled at once.
    cluster.gpool(&["cancel", &running.to_string()]).ok();
    cluster.wait_for_state(waiting, "completed");
}

/// A job last in line that a cycle cannot see (held, or waiting on another
/// job) gets no words from one; where nothing could start, changes must not
/// each run a cycle for it (with 100,000 jobs waiting, each would be a
/// whole-queue plan). Cycles then run only when their words are due.
#[test]
fn a_held_or_gated_job_last_in_line_does_not_make_each_change_a_cycle() {
    let mut cluster = Cluster::with_config("metrics_listen = \"127.0.0.1:0\"\n");
    cluster.start_agent("n1", 1);
    let running = cluster.submit(&["--", "sleep", "60"]);
    cluster.wait_for_state(running, "running");
    let waiting = cluster.submit(&["--", "true"]);
    let held = cluster.submit(&["--", "true"]);
    cluster.gpool(&["hold", &held.to_string()]).ok();
    let addr = std::fs::read_to_string(cluster.state_dir().join("metrics.addr")).unwrap();
    let cycles = || {
        let (_, body) = get(addr.trim(), "/metrics");
        value(&body, "gpool_scheduling_cycle_seconds_count").expect("the cycle count")
    };
    // The pool is full: the waiting job has its words once a cycle ran.
    wait_until("the waiting job's words", Duration::from_secs(10), || {
        (!cluster.job(waiting)["reasons"].as_array().unwrap().is_empty()).then_some(())
    });
    std::thread::sleep(Duration::from_secs(1));
    let before = cycles();
    let started = std::time::Instant::now();
    // At most one a WORDS_EVERY (500 ms), and a few over.
    let due = || started.elapsed().as_secs_f64() / 0.5 + 3.0;
    let after_running = format!("afterok:{running}");
    let mut changes = 0;
    // Enough changes that one cycle each would be over twice what is due,
    // however slow the machine.
    while changes < 30 || (f64::from(changes) <= 2.0 * due() && changes < 400) {
        let gated = cluster.submit(&["-d", &after_running, "--", "true"]);
        cluster.gpool(&["cancel", &gated.to_string()]).ok();
        changes += 2;
    }
    let ran = cycles() - before;
    assert!(
        ran <= due(),
        "{ran} cycles for {changes} changes in {:?}",
        started.elapsed()
    );
    assert_eq!(cluster.job(held)["state"], "pending");
}
