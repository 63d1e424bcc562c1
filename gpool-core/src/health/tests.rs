use super::*;
use proptest::prelude::*;

fn at(secs: i64) -> Timestamp {
    Timestamp(secs * 1000)
}

fn reading(temperature_c: u32, ecc_uncorrected: u64, xids: &[u32]) -> GpuReading {
    GpuReading {
        temperature_c,
        ecc_uncorrected,
        xids: xids.to_vec(),
        ..GpuReading::default()
    }
}

/// Feeds `readings` (one per 2 s heartbeat) to a new watch; what each said.
fn replay(readings: &[Option<GpuReading>]) -> Vec<Assessment> {
    let policy = HealthPolicy::default();
    let mut watch = GpuWatch::default();
    readings
        .iter()
        .enumerate()
        .map(|(i, r)| watch.assess(r.as_ref(), &policy, at(2 * i as i64)))
        .collect()
}

#[test]
fn the_catalogue_buckets_the_xids_the_pool_acts_on() {
    for xid in [13, 31, 43, 45] {
        assert_eq!(classify_xid(xid).0, XidClass::Application, "Xid {xid}");
    }
    for xid in [48, 63, 64, 74, 79, 92, 94, 95] {
        assert_eq!(classify_xid(xid).0, XidClass::Hardware, "Xid {xid}");
    }
    for xid in [61, 62, 119, 120] {
        assert_eq!(classify_xid(xid).0, XidClass::ResetRequired, "Xid {xid}");
    }
    assert_eq!(classify_xid(999).0, XidClass::Informational);
}

#[test]
fn a_hardware_xid_is_a_fault_and_an_application_xid_is_the_jobs() {
    // Recorded: a quiet GPU, then Xid 79 while a job ran, then a job's
    // own Xid 13 on another heartbeat.
    let said = replay(&[
        Some(reading(41, 0, &[])),
        Some(reading(42, 0, &[79])),
        Some(reading(42, 0, &[13])),
        Some(reading(40, 0, &[999])),
    ]);
    assert!(said[0].faults.is_empty());
    assert_eq!(said[1].faults, vec!["Xid 79 (GPU has fallen off the bus)".to_string()]);
    assert!(said[2].faults.is_empty());
    assert_eq!(
        said[2].job_faults,
        vec!["Xid 13 (graphics engine exception)".to_string()]
    );
    assert!(said[3].faults.is_empty() && said[3].notes.len() == 1);
}

#[test]
fn only_new_uncorrectable_ecc_errors_are_a_fault() {
    // The volatile count stays up after a double-bit error until a reset:
    // the first reading is the baseline, a rise is a fault, a steady count
    // is quiet again.
    let said = replay(&[
        Some(reading(40, 2, &[])),
        Some(reading(40, 2, &[])),
        Some(reading(40, 3, &[48])),
        Some(reading(40, 3, &[])),
    ]);
    assert!(said[0].faults.is_empty() && said[1].faults.is_empty());
    assert_eq!(said[2].faults.len(), 2, "{:?}", said[2].faults);
    assert!(said[2].faults[1].contains("1 new uncorrectable ECC errors"));
    assert!(said[3].faults.is_empty());
}

#[test]
fn a_row_remap_failure_lasts_as_long_as_it_is_reported() {
    let failed = GpuReading {
        remap_failure: true,
        ..reading(40, 0, &[64])
    };
    let pending = GpuReading {
        remap_pending: true,
        ..reading(40, 0, &[])
    };
    let still_failed = GpuReading {
        xids: Vec::new(),
        ..failed.clone()
    };
    let said = replay(&[
        Some(failed),
        Some(still_failed),
        Some(pending),
        Some(reading(40, 0, &[])),
    ]);
    assert_eq!(said[0].faults.len(), 2);
    assert_eq!(said[1].faults, vec!["row remapping failed".to_string()]);
    assert_eq!(said[2].faults, vec!["row remap pending a GPU reset".to_string()]);
    assert!(said[3].faults.is_empty());
}

#[test]
fn only_sustained_heat_is_a_fault() {
    let policy = HealthPolicy {
        hot_for_ms: 5_000,
        ..HealthPolicy::default()
    };
    let mut watch = GpuWatch::default();
    // A spike that cools is nothing.
    assert!(watch
        .assess(Some(&reading(95, 0, &[])), &policy, at(0))
        .faults
        .is_empty());
    assert!(watch
        .assess(Some(&reading(60, 0, &[])), &policy, at(2))
        .faults
        .is_empty());
    // Hot from 4 s on: a fault at 9 s, not at 8.
    assert!(watch
        .assess(Some(&reading(95, 0, &[])), &policy, at(4))
        .faults
        .is_empty());
    assert!(watch
        .assess(Some(&reading(92, 0, &[])), &policy, at(8))
        .faults
        .is_empty());
    let hot = watch.assess(Some(&reading(91, 0, &[])), &policy, at(9));
    assert_eq!(hot.faults, vec!["91 °C, at or above 90 °C for 5 s".to_string()]);
}

#[test]
fn a_gpu_missing_from_the_readings_for_a_while_is_a_fault() {
    // Heartbeats every 2 s: one unreadable heartbeat is nothing, missing
    // for 10 s is a fault, and a reading in between starts over.
    let mut readings = vec![Some(reading(40, 0, &[])), None, Some(reading(40, 0, &[]))];
    readings.extend(std::iter::repeat_n(None, 6));
    let said = replay(&readings);
    assert!(said[..8].iter().all(|a| a.faults.is_empty()), "{said:?}");
    assert_eq!(
        said[8].faults,
        ["missing from its node's readings for 10 s (gone from the bus, or unreadable)"]
    );
}

fn out(by: TakenBy, last_fault_secs: i64) -> OutOfService {
    OutOfService {
        reason: "Xid 79 (GPU has fallen off the bus)".into(),
        since: at(0),
        by,
        last_fault_at: at(last_fault_secs),
    }
}

#[test]
fn a_gpu_returns_after_the_quiet_period_and_a_passing_probe() {
    let policy = HealthPolicy {
        quiet_ms: 60_000,
        ..HealthPolicy::default()
    };
    let fault = vec!["Xid 79 (GPU has fallen off the bus)".to_string()];
    assert_eq!(decide(None, &[], true, &policy, at(0)), Change::Keep);
    assert_eq!(
        decide(None, &fault, true, &policy, at(0)),
        Change::TakeOut(fault[0].clone())
    );
    let health = out(TakenBy::Health, 10);
    assert_eq!(
        decide(Some(&health), &fault, true, &policy, at(20)),
        Change::StillFaulty
    );
    assert_eq!(decide(Some(&health), &[], true, &policy, at(69)), Change::Keep);
    assert_eq!(decide(Some(&health), &[], false, &policy, at(70)), Change::Keep);
    assert_eq!(decide(Some(&health), &[], true, &policy, at(70)), Change::Return);
}

#[test]
fn an_operator_pin_never_returns_by_itself() {
    let policy = HealthPolicy::default();
    let pinned = out(TakenBy::Operator, 0);
    assert_eq!(decide(Some(&pinned), &[], true, &policy, at(1_000_000)), Change::Keep);
    // Its faults still count, for when it is resumed.
    assert_eq!(
        decide(Some(&pinned), &["Xid 48".to_string()], true, &policy, at(5)),
        Change::StillFaulty
    );
}

#[test]
fn the_log_keeps_the_newest_entries() {
    let mut log = Vec::new();
    for i in 0..(MAX_HEALTH_EVENTS as i64 + 5) {
        record(
            &mut log,
            HealthEvent {
                at: at(i),
                gpu: Some(0),
                transition: Transition::Note,
                reason: String::new(),
            },
        );
    }
    assert_eq!(log.len(), MAX_HEALTH_EVENTS);
    assert_eq!(log[0].at, at(5));
}

proptest! {
    /// A watch never reports a fault on a reading with no Xid, a steady
    /// ECC count, no remap flag and a cool GPU, whatever came before.
    #[test]
    fn quiet_readings_are_never_a_fault(
        history in proptest::collection::vec((0u32..120, 0u64..4, proptest::collection::vec(0u32..160, 0..3)), 0..20),
    ) {
        let policy = HealthPolicy::default();
        let mut watch = GpuWatch::default();
        let mut ecc = 0;
        for (i, (temperature_c, ecc_step, xids)) in history.iter().enumerate() {
            ecc += ecc_step;
            watch.assess(Some(&reading(*temperature_c, ecc, xids)), &policy, at(2 * i as i64));
        }
        let quiet = watch.assess(Some(&reading(40, ecc, &[])), &policy, at(1_000));
        prop_assert!(quiet.faults.is_empty(), "{:?}", quiet.faults);
    }
}

#[test]
fn drift_names_the_gpus_that_left_and_joined() {
    let before = crate::testing::node("n1", 3, "a100-40gb").gpus;
    // GPU 2 fell off the bus; GPU 0 was put in MIG mode and comes back as
    // two slices after the whole GPUs.
    let mut after: Vec<crate::model::Gpu> = before[1..2].to_vec();
    for (k, profile) in ["3g.20gb", "4g.20gb"].iter().enumerate() {
        after.push(crate::model::Gpu {
            index: 3 + k as u32,
            uuid: format!("MIG-{k}"),
            model: crate::model::GpuModel::new(&format!("a100-{profile}")),
            mig_parent: Some(0),
            ..before[0].clone()
        });
    }
    let said: Vec<String> = drift(&before, &after).iter().map(ToString::to_string).collect();
    assert_eq!(
        said,
        [
            "GPU 0 (a100-40gb GPU-n1-0) left the inventory",
            "GPU 2 (a100-40gb GPU-n1-2) left the inventory",
            "GPU 3 (a100-3g.20gb MIG-0) joined the inventory",
            "GPU 4 (a100-4g.20gb MIG-1) joined the inventory",
        ]
    );
    assert!(drift(&before, &before).is_empty());
}

#[test]
fn faults_that_need_a_reset_stay_out_until_resumed() {
    for xid in [79, 48, 95, 64, 119, 154] {
        assert!(xid_needs_reset(xid), "Xid {xid}");
    }
    for xid in [13, 31, 92, 94, 63] {
        assert!(!xid_needs_reset(xid), "Xid {xid}");
    }
    let mut watch = GpuWatch::default();
    let policy = HealthPolicy::default();
    let said = watch.assess(Some(&reading(40, 0, &[79])), &policy, at(0));
    assert!(said.needs_reset && !said.faults.is_empty());
    let out = OutOfService {
        reason: said.faults.join("; "),
        since: at(0),
        by: TakenBy::UntilReset,
        last_fault_at: at(0),
    };
    // Quiet for ten quiet periods, probe passing: still out...
    let later = at(10 * policy.quiet_ms / 1000);
    assert_eq!(decide(Some(&out), &[], true, &policy, later), Change::Keep);
    // ...unless the operator lets such faults return by themselves.
    let lenient = HealthPolicy {
        reset_faults_return: true,
        ..HealthPolicy::default()
    };
    assert_eq!(decide(Some(&out), &[], true, &lenient, later), Change::Return);
}

/// A new boot id brings back the GPUs that waited for a reset, and only
/// those; the same boot, or an agent that names none, brings back nothing.
#[test]
fn a_reboot_brings_back_only_what_waited_for_a_reset() {
    let out = |by| OutOfService {
        reason: "x".into(),
        since: Timestamp(0),
        by,
        last_fault_at: Timestamp(0),
    };
    let gpus_out: std::collections::BTreeMap<u32, OutOfService> = [
        (0, out(TakenBy::UntilReset)),
        (1, out(TakenBy::Health)),
        (2, out(TakenBy::Operator)),
        (3, out(TakenBy::UntilReset)),
    ]
    .into_iter()
    .collect();
    assert_eq!(reset_by_reboot("boot-a", "boot-b", &gpus_out), vec![0, 3]);
    assert!(reset_by_reboot("boot-a", "boot-a", &gpus_out).is_empty());
    assert!(reset_by_reboot("", "boot-b", &gpus_out).is_empty());
    assert!(reset_by_reboot("boot-a", "", &gpus_out).is_empty());
}

/// An agent's drain takes only an undrained node and lifts only itself.
#[test]
fn an_agents_drain_leaves_an_operators_alone() {
    let full = "spool full: ";
    assert_eq!(
        agent_drain(None, full, "2 MiB free"),
        Some(Some("spool full: 2 MiB free".into()))
    );
    assert_eq!(agent_drain(None, full, ""), None);
    assert_eq!(agent_drain(Some("spool full: 2 MiB free"), full, ""), Some(None));
    assert_eq!(agent_drain(Some("spool full: 2 MiB free"), full, "1 MiB free"), None);
    assert_eq!(agent_drain(Some("fan failure"), full, "2 MiB free"), None);
    assert_eq!(agent_drain(Some("fan failure"), full, ""), None);
}
