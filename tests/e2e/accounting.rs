//! Accounting: every attempt charged to its team and GPU model, priced,
//! and the pool set against dedicated GPUs per team.

use crate::harness::cluster::Cluster;
use crate::harness::process::wait_until;
use serde_json::Value;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const CONFIG: &str = "[accounting]\ncurrency = \"EUR\"\n[accounting.prices]\nh100 = 4.0\nl4 = 1.0\n\n[[team]]\nname = \"ml\"\n\n[[team]]\nname = \"cv\"\n";
const L4: &str = "[[simulated_gpu]]\nmodel = \"l4\"\nmemory_mib = 23034\ncount = 4\n";

fn millis(text: &Value) -> f64 {
    let at = humantime::parse_rfc3339(text.as_str().expect("a time")).expect("an RFC 3339 time");
    at.duration_since(UNIX_EPOCH).unwrap().as_millis() as f64
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

#[test]
fn reports_charge_every_attempt_to_its_team_and_model_at_its_price() {
    let mut cluster = Cluster::with_config(CONFIG);
    cluster.start_agent("n1", 4);
    cluster.start_agent_with("n2", 0, L4);
    let since = now_rfc3339();
    std::thread::sleep(Duration::from_millis(20));
    // ml: two 2-GPU jobs on the four H100s at once, and one L4 job; cv:
    // one L4 job.
    let jobs = [
        cluster.submit(&["--team", "ml", "--gpus", "2", "--gpu-type", "h100", "--", "sleep", "2"]),
        cluster.submit(&["--team", "ml", "--gpus", "2", "--gpu-type", "h100", "--", "sleep", "2"]),
        cluster.submit(&["--team", "ml", "--gpus", "1", "--gpu-type", "l4", "--", "sleep", "1"]),
        cluster.submit(&["--team", "cv", "--gpus", "1", "--gpu-type", "l4", "--", "sleep", "3"]),
    ];
    let mut expected: BTreeMap<(String, String), f64> = BTreeMap::new();
    let mut marks = Vec::new();
    for id in jobs {
        let job = cluster.wait_for_state(id, "completed");
        let (start, end) = (millis(&job["started_at"]), millis(&job["ended_at"]));
        marks.push((start, end));
        let model = if job["gpu_types"][0] == "h100" { "h100" } else { "l4" };
        let gpus = job["gpus_total"].as_f64().unwrap();
        *expected
            .entry((job["team"].as_str().unwrap().to_string(), model.to_string()))
            .or_default() += gpus * (end - start) / 1000.0;
    }
    std::thread::sleep(Duration::from_millis(20));
    let until = now_rfc3339();

    let report = cluster
        .gpool(&[
            "report",
            "--by",
            "team,gpu-model",
            "--since",
            &since,
            "--until",
            &until,
            "--output",
            "json",
        ])
        .json();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(rows.len(), expected.len(), "{report:#}");
    let price = |model: &str| if model == "h100" { 4.0 } else { 1.0 };
    let mut total_cost = 0.0;
    for row in rows {
        let key = (
            row["team"].as_str().unwrap().to_string(),
            row["gpu_model"].as_str().unwrap().to_string(),
        );
        let want_secs = expected[&key];
        let got_secs = row["gpu_hours"].as_f64().unwrap() * 3600.0;
        assert!(
            (got_secs - want_secs).abs() <= want_secs * 0.01,
            "{key:?}: report {got_secs} GPU-s, jobs' marks {want_secs} GPU-s"
        );
        let want_cost = want_secs / 3600.0 * price(&key.1);
        let got_cost = row["cost"].as_f64().unwrap();
        assert!(
            (got_cost - want_cost).abs() <= want_cost * 0.01,
            "{key:?}: {got_cost} vs {want_cost}"
        );
        total_cost += got_cost;
    }
    assert_eq!(report["currency"], "EUR");
    assert!((report["total"]["cost"].as_f64().unwrap() - total_cost).abs() < 1e-9);
    assert_eq!(report["total"]["attempts"], 4);

    // The same as CSV, a line per row.
    let csv = cluster.gpool(&[
        "report",
        "--by",
        "team,gpu-model",
        "--since",
        &since,
        "--until",
        &until,
        "--csv",
    ]);
    let lines: Vec<&str> = csv.ok().lines().collect();
    assert!(
        lines[0].starts_with("team,gpu_model,attempts,gpu_hours"),
        "{}",
        lines[0]
    );
    assert_eq!(lines.len(), 1 + expected.len());
    assert!(lines.iter().any(|line| line.starts_with("cv,l4,1,")), "{lines:?}");

    // Savings over the same window, worked out from the jobs' marks: ml
    // needed its four H100s at once (its two jobs overlapped), cv one L4;
    // the pool has 4 H100s and 4 L4s.
    let (first_end, second_start) = (marks[0].1.min(marks[1].1), marks[0].0.max(marks[1].0));
    assert!(second_start < first_end, "ml's two H100 jobs ran at once: {marks:?}");
    let savings = cluster
        .gpool(&[
            "report", "savings", "--since", &since, "--until", &until, "--output", "json",
        ])
        .json();
    let window_h = (millis(&Value::from(until.clone())) - millis(&Value::from(since.clone()))) / 3_600_000.0;
    assert_eq!(savings["teams"][0]["team"], "cv");
    assert_eq!(savings["teams"][0]["dedicated_gpus"], serde_json::json!({"l4": 1}));
    assert_eq!(
        savings["teams"][1]["dedicated_gpus"],
        serde_json::json!({"h100": 4, "l4": 1})
    );
    assert_eq!(savings["dedicated"]["gpus"], serde_json::json!({"h100": 4, "l4": 2}));
    assert_eq!(savings["pool"]["gpus"], serde_json::json!({"h100": 4, "l4": 4}));
    assert_eq!(savings["gpus_saved"], -2);
    let close = |got: &Value, want: f64| {
        let got = got.as_f64().unwrap();
        assert!((got - want).abs() <= want.abs() * 0.01 + 1e-9, "{got} vs {want}");
    };
    close(&savings["dedicated"]["cost"], (4.0 * 4.0 + 2.0 * 1.0) * window_h);
    close(&savings["pool"]["cost"], (4.0 * 4.0 + 4.0 * 1.0) * window_h);
    close(&savings["cost_saved"], -2.0 * window_h);
    let used_h: f64 = expected.values().sum::<f64>() / 3600.0;
    close(&savings["used_gpu_hours"], used_h);
    close(&savings["pool"]["utilization"], used_h / (8.0 * window_h));
    close(&savings["dedicated"]["utilization"], used_h / (6.0 * window_h));

    // Records are on disk: after a restart the report is the same.
    cluster.controller().kill9();
    cluster.start_controller();
    let again = wait_until("gpoold to answer again", Duration::from_secs(20), || {
        let run = cluster.gpool(&[
            "report",
            "--by",
            "team,gpu-model",
            "--since",
            &since,
            "--until",
            &until,
            "--output",
            "json",
        ]);
        (run.code == 0).then(|| run.json())
    });
    assert_eq!(again["rows"], report["rows"]);
}

#[test]
fn users_see_their_own_rows_and_bad_dimensions_are_named() {
    let mut cluster = Cluster::with_config(CONFIG);
    cluster.start_agent("n1", 1);
    let id = cluster.submit(&["--team", "ml", "--", "true"]);
    cluster.wait_for_state(id, "completed");
    let bad = cluster.gpool(&["report", "--by", "team,colour"]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(
        bad.stderr.contains("--by") && bad.stderr.contains("colour"),
        "{}",
        bad.stderr
    );
    let backwards = cluster.gpool(&["report", "--since", "1h", "--until", "2h"]);
    assert_ne!(backwards.code, 0);
    assert!(backwards.stderr.contains("until"), "{}", backwards.stderr);
    // A running job counts up to now.
    let running = cluster.submit(&["--team", "cv", "--", "sleep", "30"]);
    cluster.wait_for_state(running, "running");
    std::thread::sleep(Duration::from_millis(300));
    let report = cluster.gpool(&["report", "--by", "team", "--output", "json"]).json();
    let cv = report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["team"] == "cv")
        .cloned();
    assert!(
        cv.is_some_and(|row| row["gpu_hours"].as_f64().unwrap() > 0.0),
        "{report:#}"
    );
}
