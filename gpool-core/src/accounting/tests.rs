use super::*;
use proptest::prelude::*;

const HOUR: i64 = 3_600_000;

fn record(team: &str, project: &str, user: &str, gpus: &[(&str, u32)], start_h: f64, end_h: f64) -> AttemptRecord {
    AttemptRecord {
        job: JobId(1),
        display_id: "1".into(),
        attempt: 1,
        epoch: Epoch(1),
        user: user.into(),
        team: team.into(),
        project: project.into(),
        workload_type: "training".into(),
        qos: String::new(),
        pool: "default".into(),
        gpus: gpus.iter().map(|(model, n)| (GpuModel::new(model), *n)).collect(),
        nodes: vec!["n1".into()],
        started_at: Timestamp((start_h * HOUR as f64) as i64),
        ended_at: Timestamp((end_h * HOUR as f64) as i64),
        burst: false,
        end: "completed".into(),
        lost_gpu_secs: 0.0,
        gpu_use: GpuUse::default(),
        share_milli: None,
    }
}

fn pricing() -> Pricing {
    Pricing {
        currency: "USD".into(),
        per_gpu_hour: [(GpuModel::new("h100"), 4.0), (GpuModel::new("l4"), 1.0)].into(),
        team_centers: [("ml".to_string(), "cc-research".to_string())].into(),
        project_centers: [("ads".to_string(), "cc-ads".to_string())].into(),
        node_groups: [("cloud-1".to_string(), ("cloud".to_string(), 9.0))].into(),
    }
}

fn report(records: &[AttemptRecord], since_h: i64, until_h: i64, by: &[Dimension]) -> Report {
    let pricing = pricing();
    let mut builder = ReportBuilder::new(Timestamp(since_h * HOUR), Timestamp(until_h * HOUR), by, &pricing);
    for record in records {
        builder.add(record);
    }
    builder.finish()
}

#[test]
fn rows_group_by_team_and_model_and_are_priced() {
    let records = [
        record("ml", "llm", "ann", &[("h100", 4)], 0.0, 2.0),
        record("ml", "llm", "ann", &[("l4", 1)], 1.0, 4.0),
        record("cv", "seg", "bob", &[("h100", 2)], 0.0, 1.5),
    ];
    let report = report(&records, 0, 24, &[Dimension::Team, Dimension::GpuModel]);
    let rows: Vec<(Vec<String>, f64, Option<f64>)> = report
        .rows
        .iter()
        .map(|row| (row.key.clone(), row.gpu_seconds / 3600.0, row.cost))
        .collect();
    assert_eq!(
        rows,
        vec![
            (vec!["cv".into(), "h100".into()], 3.0, Some(12.0)),
            (vec!["ml".into(), "h100".into()], 8.0, Some(32.0)),
            (vec!["ml".into(), "l4".into()], 3.0, Some(3.0)),
        ]
    );
    assert_eq!(report.total.gpu_seconds, 14.0 * 3600.0);
    assert_eq!(report.total.cost, Some(47.0));
    assert_eq!(report.total.attempts, 3);
}

#[test]
fn cloud_gpu_hours_are_reported_apart_at_their_groups_price() {
    let owned = record("ml", "p", "u", &[("h100", 2)], 0.0, 1.0);
    let mut cloud = record("ml", "p", "u", &[("h100", 8)], 0.0, 1.0);
    cloud.nodes = vec!["cloud-1".into()];
    let report = report(&[owned, cloud], 0, 1, &[Dimension::Source]);
    let rows: Vec<(String, f64, Option<f64>)> = report
        .rows
        .iter()
        .map(|row| (row.key[0].clone(), row.gpu_seconds / 3600.0, row.cost))
        .collect();
    assert_eq!(
        rows,
        vec![
            ("cloud".to_string(), 8.0, Some(72.0)),
            ("owned".to_string(), 2.0, Some(8.0)),
        ]
    );
}

#[test]
fn an_attempt_counts_only_inside_the_window() {
    let records = [record("ml", "llm", "ann", &[("h100", 2)], 0.0, 10.0)];
    let report = report(&records, 4, 6, &[Dimension::Team]);
    assert_eq!(report.total.gpu_seconds, 4.0 * 3600.0);
    assert_eq!(report.total.cost, Some(16.0));
    // Entirely outside: nothing at all.
    let outside = super::tests::report(&records, 10, 20, &[Dimension::Team]);
    assert!(outside.rows.is_empty());
    assert_eq!(outside.total.attempts, 0);
}

#[test]
fn an_attempt_on_two_models_is_split_by_model_but_counted_once() {
    let records = [record("ml", "llm", "ann", &[("h100", 1), ("l4", 1)], 0.0, 1.0)];
    let by_model = report(&records, 0, 1, &[Dimension::GpuModel]);
    assert_eq!(by_model.rows.len(), 2);
    assert!(by_model.rows.iter().all(|row| row.attempts == 1));
    assert_eq!(by_model.total.attempts, 1);
    let by_team = report(&records, 0, 1, &[Dimension::Team]);
    assert_eq!(by_team.rows[0].attempts, 1);
    assert_eq!(by_team.rows[0].cost, Some(5.0));
}

#[test]
fn unpriced_models_leave_the_cost_open_and_say_how_much() {
    let records = [
        record("ml", "llm", "ann", &[("h100", 1)], 0.0, 1.0),
        record("ml", "llm", "ann", &[("a100", 1)], 0.0, 2.0),
    ];
    let report = report(&records, 0, 24, &[Dimension::Team]);
    assert_eq!(report.rows[0].cost, None);
    assert_eq!(report.rows[0].unpriced_gpu_seconds, 7200.0);
    assert_eq!(report.total.cost, None);
}

#[test]
fn a_project_centre_wins_over_its_team_centre() {
    let records = [
        record("ml", "ads", "ann", &[("l4", 1)], 0.0, 1.0),
        record("ml", "llm", "ann", &[("l4", 1)], 0.0, 1.0),
        record("cv", "seg", "bob", &[("l4", 1)], 0.0, 1.0),
    ];
    let report = report(&records, 0, 1, &[Dimension::CostCenter]);
    let keys: Vec<&str> = report.rows.iter().map(|row| row.key[0].as_str()).collect();
    assert_eq!(keys, vec![NO_COST_CENTER, "cc-ads", "cc-research"]);
}

#[test]
fn idle_and_lost_gpu_time_and_utilisation_are_carried() {
    let mut idle = record("ml", "llm", "ann", &[("h100", 2)], 0.0, 1.0);
    idle.gpu_use = GpuUse {
        samples: 10,
        utilization_pct_sum: 0,
        utilization_pct_peak: 0,
        memory_used_mib_peak: 100,
    };
    let mut busy = record("ml", "llm", "ann", &[("h100", 2)], 0.0, 1.0);
    busy.gpu_use = GpuUse {
        samples: 10,
        utilization_pct_sum: 800,
        utilization_pct_peak: 90,
        memory_used_mib_peak: 5000,
    };
    busy.lost_gpu_secs = 600.0;
    busy.burst = true;
    let report = report(&[idle, busy], 0, 1, &[Dimension::Team]);
    let row = &report.rows[0];
    assert_eq!(row.idle_gpu_seconds, 7200.0);
    assert_eq!(row.lost_gpu_seconds, 600.0);
    assert_eq!(row.burst_gpu_seconds, 7200.0);
    assert_eq!(row.guaranteed_gpu_seconds, 7200.0);
    assert_eq!(row.mean_utilization_pct, Some(40.0));
    assert_eq!(row.peak_memory_used_mib, 5000);
}

#[test]
fn dimensions_parse_and_name_the_bad_one() {
    assert_eq!(
        Dimension::parse_list("team,gpu-model,cost_center").unwrap(),
        vec![Dimension::Team, Dimension::GpuModel, Dimension::CostCenter]
    );
    let err = Dimension::parse_list("team,colour").unwrap_err();
    assert!(err.contains("\"colour\"") && err.contains("workload-type"), "{err}");
    assert!(Dimension::parse_list("team,team").unwrap_err().contains("twice"));
}

#[test]
fn users_see_their_own_records_leads_their_teams_and_admins_all() {
    let mine = record("ml", "llm", "ann", &[("l4", 1)], 0.0, 1.0);
    let teammates = record("ml", "llm", "carl", &[("l4", 1)], 0.0, 1.0);
    let others = record("cv", "seg", "bob", &[("l4", 1)], 0.0, 1.0);
    let user = Caller::user("ann");
    let lead = Caller {
        led_teams: vec!["ml".into()],
        ..Caller::user("dee")
    };
    let admin = Caller {
        admin: true,
        ..Caller::user("root")
    };
    let seen = |caller: &Caller| [&mine, &teammates, &others].map(|record| may_see(caller, record));
    assert_eq!(seen(&user), [true, false, false]);
    assert_eq!(seen(&lead), [true, true, false]);
    assert_eq!(seen(&admin), [true, true, true]);
}

/// Team ml: two 2-GPU H100 jobs, overlapping for five hours; team cv: one
/// L4 all day. The pool has 8 of each.
fn savings_case(percentile: f64) -> Savings {
    let records = [
        record("ml", "llm", "ann", &[("h100", 2)], 0.0, 10.0),
        record("ml", "llm", "ann", &[("h100", 2)], 5.0, 15.0),
        record("cv", "seg", "bob", &[("l4", 1)], 0.0, 24.0),
    ];
    let pool = [(GpuModel::new("h100"), 8), (GpuModel::new("l4"), 8)].into();
    savings(
        &records,
        Timestamp(0),
        Timestamp(24 * HOUR),
        &pool,
        &pricing(),
        SavingsRule { percentile },
    )
}

#[test]
fn savings_size_each_team_at_its_peak_and_price_both_layouts() {
    let savings = savings_case(100.0);
    let ml = &savings.teams[1];
    assert_eq!((ml.team.as_str(), ml.gpus.values().sum::<u32>()), ("ml", 4));
    assert_eq!(ml.dedicated_cost, Some(4.0 * 24.0 * 4.0));
    assert!((ml.dedicated_utilization - 40.0 / 96.0).abs() < 1e-9);
    assert_eq!(savings.teams[0].gpus, [(GpuModel::new("l4"), 1)].into());
    assert_eq!(savings.dedicated_cost, Some(384.0 + 24.0));
    assert_eq!(savings.pool_cost, Some(768.0 + 192.0));
    assert_eq!(savings.cost_saved, Some(408.0 - 960.0));
    assert_eq!(savings.gpus_saved, 5 - 16);
    assert!((savings.dedicated_utilization - 64.0 / 120.0).abs() < 1e-9);
    assert!((savings.pool_utilization - 64.0 / 384.0).abs() < 1e-9);
}

#[test]
fn savings_at_a_percentile_cover_that_share_of_the_window() {
    // ml's H100s: 0 for 9 h, 2 for 10 h, 4 for 5 h.
    let at = |p: f64| savings_case(p).teams[1].gpus.values().sum::<u32>();
    assert_eq!(at(30.0), 0);
    assert_eq!(at(50.0), 2);
    assert_eq!(at(79.0), 2);
    assert_eq!(at(80.0), 4);
}

#[test]
fn the_allocation_series_spreads_each_attempt_over_its_slices() {
    let records = [
        record("ml", "llm", "ann", &[("h100", 4)], 0.0, 1.5),
        record("cv", "seg", "bob", &[("l4", 2)], 1.0, 3.0),
    ];
    let series = allocation_series(&records, Timestamp(0), Timestamp(4 * HOUR), 4);
    assert_eq!(series, vec![4.0, 2.0 + 2.0, 2.0, 0.0]);
    assert!(allocation_series(&records, Timestamp(0), Timestamp(0), 4)
        .iter()
        .all(|v| *v == 0.0));
}

fn arb_record() -> impl Strategy<Value = AttemptRecord> {
    (
        prop::sample::select(vec!["ml", "cv", "nlp"]),
        prop::sample::select(vec!["ann", "bob"]),
        prop::collection::btree_map(prop::sample::select(vec!["h100", "l4", "a100"]), 1u32..9, 1..3),
        0i64..48 * 60,
        1i64..24 * 60,
        any::<bool>(),
    )
        .prop_map(|(team, user, gpus, start_min, len_min, burst)| {
            let mut record = record(team, "p", user, &[], 0.0, 0.0);
            record.gpus = gpus.into_iter().map(|(model, n)| (GpuModel::new(model), n)).collect();
            record.started_at = Timestamp(start_min * 60_000);
            record.ended_at = Timestamp((start_min + len_min) * 60_000);
            record.burst = burst;
            record
        })
}

proptest! {
    #[test]
    fn rows_add_up_to_the_total_and_windows_add_up(
        records in prop::collection::vec(arb_record(), 0..30),
        split_h in 1i64..72,
    ) {
        let by_all = report(&records, 0, 72, &[Dimension::Team, Dimension::GpuModel, Dimension::User]);
        let by_one = report(&records, 0, 72, &[Dimension::Ledger]);
        let sum = |report: &Report| report.rows.iter().map(|row| row.gpu_seconds).sum::<f64>();
        prop_assert!((sum(&by_all) - by_all.total.gpu_seconds).abs() < 1e-6);
        prop_assert!((sum(&by_one) - by_all.total.gpu_seconds).abs() < 1e-6);
        let expected: f64 = records.iter().map(|r| f64::from(r.total_gpus()) * r.secs_within(Timestamp(0), Timestamp(72 * HOUR))).sum();
        prop_assert!((by_all.total.gpu_seconds - expected).abs() < 1e-6);
        let before = report(&records, 0, split_h, &[Dimension::Team]);
        let after = report(&records, split_h, 72, &[Dimension::Team]);
        prop_assert!((before.total.gpu_seconds + after.total.gpu_seconds - expected).abs() < 1e-6);
        prop_assert_eq!(by_all.total.attempts as usize, records.len());
        // The allocation chart holds the same GPU-time.
        let series = allocation_series(&records, Timestamp(0), Timestamp(72 * HOUR), 72);
        let charted: f64 = series.iter().sum::<f64>() * 3600.0;
        prop_assert!((charted - expected).abs() < 1e-3 * expected.max(1.0));
    }

    #[test]
    fn a_dedicated_allocation_at_its_peak_is_never_over_full(
        records in prop::collection::vec(arb_record(), 1..30),
    ) {
        let pool = BTreeMap::new();
        let savings = savings(&records, Timestamp(0), Timestamp(72 * HOUR), &pool, &pricing(), SavingsRule::default());
        prop_assert!(savings.dedicated_utilization <= 1.0 + 1e-9);
        for team in &savings.teams {
            prop_assert!(team.dedicated_utilization <= 1.0 + 1e-9);
            prop_assert!(team.dedicated_utilization > 0.0);
        }
    }
}
