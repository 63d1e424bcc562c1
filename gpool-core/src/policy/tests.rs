use super::*;
use proptest::prelude::*;

const HOUR_MS: i64 = 3_600_000;

#[test]
fn factor_is_one_unused_half_at_share_less_over() {
    assert_eq!(fair_share_factor(0.0, 100.0, 1, 2), 1.0);
    assert!((fair_share_factor(50.0, 100.0, 1, 2) - 0.5).abs() < 1e-12);
    assert!(fair_share_factor(100.0, 100.0, 1, 2) < 0.5);
}

fn sharing(period: Period, half_life_secs: f64) -> Sharing {
    Sharing {
        period,
        half_life_secs,
        ..Sharing::default()
    }
}

#[test]
fn usage_halves_every_half_life() {
    assert!((decay(8.0, 3.0, 1.0) - 1.0).abs() < 1e-12);
    let mut ledger = Ledger::default();
    ledger.charge(
        2.0,
        Timestamp(0),
        Timestamp(HOUR_MS),
        false,
        &sharing(Period::Week, 3600.0),
    );
    assert_eq!(ledger.decayed, 7200.0);
    assert!((ledger.decayed_as_of(Timestamp(2 * HOUR_MS), 3600.0) - 3600.0).abs() < 1e-9);
}

#[test]
fn periods_align_to_the_calendar() {
    let utc = TimeZone::UTC;
    // 2026-11-22T13:00:00Z, a Sunday.
    let now = Timestamp(1_795_352_400_000);
    assert_eq!(Period::Day.start(now, &utc), Timestamp(1_795_305_600_000)); // 2026-11-22
    assert_eq!(Period::Week.start(now, &utc), Timestamp(1_794_787_200_000)); // Mon 2026-11-16
    assert_eq!(Period::Month.start(now, &utc), Timestamp(1_793_491_200_000)); // 2026-11-01
                                                                              // At UTC+9 the week began nine hours earlier; at 11:00 UTC+14 that
                                                                              // instant is already Monday the 23rd, a new week.
    let plus9 = TimeZone::fixed(jiff::tz::offset(9));
    assert_eq!(
        Period::Week.start(now, &plus9),
        Timestamp(1_794_787_200_000 - 9 * HOUR_MS)
    );
    let plus14 = TimeZone::fixed(jiff::tz::offset(14));
    assert_eq!(
        Period::Week.start(now, &plus14),
        Timestamp(1_795_392_000_000 - 14 * HOUR_MS)
    );
}

#[test]
fn usage_reports_count_running_work_and_budgets() {
    let mut sharing = sharing(Period::Day, 1e9);
    sharing.teams = vec![
        Team {
            gpu_hours: Some(10),
            guaranteed_gpus: 4,
            ..Team::unlisted("a")
        },
        Team::unlisted("b"),
    ];
    let now = Timestamp(86_400_000 + 3 * HOUR_MS);
    let mut usage = BTreeMap::new();
    let mut ledger = Ledger::default();
    // Two GPU-hours yesterday and one today, ended.
    ledger.charge(
        1.0,
        Timestamp(86_400_000 - 2 * HOUR_MS),
        Timestamp(86_400_000 + HOUR_MS),
        false,
        &sharing,
    );
    usage.insert("a".to_string(), ledger);
    let running = [
        RunningUse {
            team: "a",
            gpus: 2,
            charged_gpus: 2.0,
            started_at: Timestamp(now.0 - HOUR_MS),
            burst: false,
        },
        RunningUse {
            team: "a",
            gpus: 1,
            charged_gpus: 1.0,
            started_at: Timestamp(now.0 - HOUR_MS),
            burst: true,
        },
    ];
    let report = usage_report(&sharing, &usage, &running, now);
    let a = &report[0];
    assert_eq!(
        (a.team.as_str(), a.guaranteed_gpu_hours, a.burst_gpu_hours),
        ("a", 3.0, 1.0)
    );
    assert_eq!(
        (a.budget_left_gpu_hours, a.gpus_in_use, a.guaranteed_gpus_in_use),
        (Some(7.0), 3, 2)
    );
    assert_eq!(a.period_start, Timestamp(86_400_000));
    let b = &report[1];
    assert_eq!((b.team.as_str(), b.gpus_in_use, b.fair_share), ("b", 0, 1.0));
    assert!(a.fair_share < 0.5);
}

#[test]
fn admission_fills_team_and_time_and_refuses_what_the_class_forbids() {
    let mut sharing = Sharing {
        teams: vec![Team {
            members: vec!["alice".into()],
            ..Team::unlisted("vision")
        }],
        ..Sharing::default()
    };
    sharing.qos[0].max_time_secs = Some(3600);
    let mut spec = (*crate::testing::job_builder(crate::ids::JobId(1)).build().spec).clone();
    spec.team.clear();
    sharing.admit(&mut spec, &Caller::user("alice"), "default").unwrap();
    assert_eq!((spec.team.as_str(), spec.time_limit_secs), ("vision", Some(3600)));
    spec.team.clear();
    sharing.admit(&mut spec, &Caller::user("bob"), "default").unwrap();
    assert_eq!(spec.team, "default");
    spec.time_limit_secs = Some(7200);
    assert_eq!(
        sharing
            .admit(&mut spec, &Caller::user("bob"), "default")
            .unwrap_err()
            .to_string(),
        "time: 2h is longer than QoS normal's max_time of 1h"
    );
    spec.time_limit_secs = None;
    spec.qos = "gold".into();
    assert_eq!(
        sharing
            .admit(&mut spec, &Caller::user("bob"), "default")
            .unwrap_err()
            .to_string(),
        "qos: no QoS class \"gold\" (there are: normal)"
    );
    spec.qos.clear();
    spec.team = "visoin".into();
    assert_eq!(
        sharing
            .admit(&mut spec, &Caller::user("alice"), "default")
            .unwrap_err()
            .to_string(),
        "team: no team \"visoin\" (there are: vision)"
    );
    spec.team = "vision".into();
    assert!(matches!(
        sharing.admit(&mut spec, &Caller::user("bob"), "default"),
        Err(Refusal::Denied(_))
    ));
    sharing.teams[0].leads = vec!["carol".into()];
    let carol = Caller {
        led_teams: sharing.teams_led_by("carol"),
        ..Caller::user("carol")
    };
    sharing.admit(&mut spec, &carol, "default").unwrap();
    spec.priority = 1_000_000;
    assert_eq!(
        sharing.admit(&mut spec, &Caller::user("alice"), "default").unwrap_err().to_string(),
        "user alice may not submit to team vision at priority 1000000: priority is above max_user_priority (100); only admins go beyond it"
    );
    let root = Caller {
        admin: true,
        ..Caller::user("root")
    };
    sharing.admit(&mut spec, &root, "default").unwrap();
    spec.priority = 0;
    spec.grace_secs = Some(7200);
    assert_eq!(
        sharing
            .admit(&mut spec, &Caller::user("alice"), "default")
            .unwrap_err()
            .to_string()
            .split(':')
            .next(),
        Some("grace")
    );
}

#[test]
fn a_new_period_starts_the_budget_over() {
    let daily = sharing(Period::Day, 1e9);
    let mut ledger = Ledger::default();
    let day = 86_400_000;
    ledger.charge(1.0, Timestamp(day - HOUR_MS), Timestamp(day + HOUR_MS), false, &daily);
    // Only the hour inside the new day counts toward its budget.
    assert_eq!(ledger.guaranteed_in_period(Timestamp(day + HOUR_MS), &daily), 3600.0);
    assert_eq!(ledger.guaranteed_in_period(Timestamp(2 * day), &daily), 0.0);
}

proptest! {
    #[test]
    fn period_starts_are_at_or_before_now(now in 0i64..4_000_000_000_000) {
        for period in [Period::Day, Period::Week, Period::Month] {
            let start = period.start(Timestamp(now), &TimeZone::UTC);
            prop_assert!(start.0 <= now && now - start.0 < 31 * 86_400_000);
            prop_assert_eq!(period.start(start, &TimeZone::UTC), start);
        }
    }

    /// More usage never raises a team's factor; factors stay in (0, 1].
    #[test]
    fn factor_falls_with_usage(used in 0.0f64..1e6, more in 0.0f64..1e6, other in 0.0f64..1e6, shares in 1u32..10) {
        let low = fair_share_factor(used, used + other, shares, shares + 5);
        let high = fair_share_factor(used + more, used + more + other, shares, shares + 5);
        prop_assert!(high <= low + 1e-12);
        prop_assert!(low > 0.0 && low <= 1.0);
    }
}
