use super::*;
use proptest::prelude::*;

const H100_USABLE: u64 = 80_000;

fn rules() -> ShareRules {
    ShareRules::default()
}

fn by_memory(gib: u64) -> ShareAsk {
    ShareAsk {
        memory_mib: gib * 1024,
        ..ShareAsk::default()
    }
}

#[test]
fn memory_asks_round_up_to_the_grain_and_fractions_round_down() {
    let ask = ShareAsk {
        memory_mib: 1500,
        ..ShareAsk::default()
    };
    assert_eq!(ask.on(H100_USABLE, &rules()).map(|s| s.memory_mib), Some(2048));
    let quarter = ShareAsk {
        fraction_milli: 250,
        ..ShareAsk::default()
    };
    let share = quarter.on(H100_USABLE, &rules()).unwrap();
    assert_eq!((share.memory_mib, share.milli), (19_456, 244));
    assert!(4 * share.memory_mib <= H100_USABLE, "four quarters fit one GPU");
}

#[test]
fn a_share_is_charged_the_larger_of_its_memory_and_its_compute() {
    let ask = ShareAsk {
        compute_pct: 50,
        ..by_memory(10)
    };
    assert_eq!(ask.on(H100_USABLE, &rules()).unwrap().milli, 500);
    assert_eq!(by_memory(40).on(H100_USABLE, &rules()).unwrap().milli, 512);
}

#[test]
fn an_ask_beyond_the_usable_memory_fits_no_gpu() {
    assert_eq!(by_memory(24).on(22_000, &rules()), None, "24G on an L4");
    assert_eq!(by_memory(20).on(22_000, &rules()).map(|s| s.memory_mib), Some(20_480));
}

#[test]
fn fractions_and_compute_shares_parse_or_say_why_not() {
    assert_eq!(ShareAsk::parse_fraction("0.25"), Ok(250));
    assert_eq!(ShareAsk::parse_fraction("25%"), Ok(250));
    assert!(ShareAsk::parse_fraction("1").unwrap_err().contains("below 1"));
    assert!(ShareAsk::parse_fraction("0").is_err());
    assert!(ShareAsk::parse_fraction("half").unwrap_err().contains("not a fraction"));
    assert_eq!(ShareAsk::parse_compute("30%"), Ok(30));
    assert!(ShareAsk::parse_compute("0").is_err());
    assert!(ShareAsk::parse_compute("101%").is_err());
}

#[test]
fn the_best_fit_is_the_gpu_left_fullest() {
    let mut roomy = SharedGpu::new(H100_USABLE);
    roomy.add(&by_memory(10).on(H100_USABLE, &rules()).unwrap(), "ann");
    let mut snug = SharedGpu::new(H100_USABLE);
    snug.add(&by_memory(50).on(H100_USABLE, &rules()).unwrap(), "ann");
    let gpus = [("roomy", &roomy), ("snug", &snug)];
    let chosen = best_fit(&by_memory(20), "ann", &rules(), gpus).map(|(key, _)| key);
    assert_eq!(chosen, Some("snug"));
    let too_big = best_fit(&by_memory(30), "ann", &rules(), gpus).map(|(key, _)| key);
    assert_eq!(too_big, Some("roomy"), "30G no longer fits beside 50G");
}

#[test]
fn users_share_a_gpu_only_where_the_rules_allow() {
    let mut gpu = SharedGpu::new(H100_USABLE);
    gpu.add(&by_memory(10).on(H100_USABLE, &rules()).unwrap(), "ann");
    let share = by_memory(10).on(H100_USABLE, &rules()).unwrap();
    assert!(gpu.takes(&share, "ann", &rules()));
    assert!(!gpu.takes(&share, "bob", &rules()));
    let mixed = ShareRules {
        mixed_users: true,
        ..rules()
    };
    assert!(gpu.takes(&share, "bob", &mixed));
}

#[test]
fn compute_shares_stop_at_the_whole_gpu() {
    let mut gpu = SharedGpu::new(H100_USABLE);
    let seventy = ShareAsk {
        compute_pct: 70,
        ..by_memory(1)
    };
    gpu.add(&seventy.on(H100_USABLE, &rules()).unwrap(), "ann");
    let forty = ShareAsk {
        compute_pct: 40,
        ..by_memory(1)
    };
    assert!(!gpu.takes(&forty.on(H100_USABLE, &rules()).unwrap(), "ann", &rules()));
}

/// An arrival (memory GiB, compute %, user) or the departure of the n-th
/// job still placed.
#[derive(Debug, Clone)]
enum Event {
    Arrive(u64, u8, u8),
    Depart(usize),
}

fn events() -> impl Strategy<Value = Vec<Event>> {
    let event = prop_oneof![
        3 => (1u64..48, prop_oneof![Just(0u8), 10u8..60], 0u8..3).prop_map(|(g, c, u)| Event::Arrive(g, c, u)),
        1 => any::<usize>().prop_map(Event::Depart),
    ];
    proptest::collection::vec(event, 1..120)
}

proptest! {
    /// Over random arrivals and departures on four GPUs (two H100s, an
    /// A100 and an L4), a GPU never holds more memory than it can use nor
    /// more than 100% of compute, users never mix, and a fraction is
    /// refused only where no GPU takes it.
    #[test]
    fn packing_never_overcommits_and_fills_shared_gpus_first(events in events()) {
        let usable = [80_000u64, 80_000, 40_000, 22_000];
        let rules = rules();
        let mut gpus: Vec<SharedGpu> = usable.iter().map(|&u| SharedGpu::new(u)).collect();
        let mut placed: Vec<(usize, Share)> = Vec::new();
        for event in events {
            match event {
                Event::Arrive(gib, pct, user) => {
                    let ask = ShareAsk { compute_pct: pct, ..by_memory(gib) };
                    let user = format!("user{user}");
                    let shared = gpus.iter().enumerate().filter(|(_, gpu)| gpu.jobs > 0);
                    let chosen = best_fit(&ask, &user, &rules, shared).or_else(|| {
                        let free = gpus.iter().enumerate().filter(|(_, gpu)| gpu.jobs == 0);
                        best_fit(&ask, &user, &rules, free)
                    });
                    if let Some((at, share)) = chosen {
                        prop_assert!(gpus[at].takes(&share, &user, &rules));
                        gpus[at].add(&share, &user);
                        placed.push((at, share));
                    } else {
                        // Nothing takes it: not a shared GPU, and no free one.
                        for gpu in &gpus {
                            let fits = ask.on(gpu.usable_mib, &rules).is_some_and(|s| gpu.takes(&s, &user, &rules));
                            prop_assert!(!fits, "{ask:?} of {user} was refused though {gpu:?} takes it");
                        }
                    }
                }
                Event::Depart(n) if !placed.is_empty() => {
                    let (at, share) = placed.remove(n % placed.len());
                    gpus[at].remove(&share);
                }
                Event::Depart(_) => {}
            }
            for gpu in &gpus {
                prop_assert!(gpu.used_mib <= gpu.usable_mib, "{gpu:?} overcommitted");
                prop_assert!(gpu.used_pct <= 100, "{gpu:?} over 100% compute");
                prop_assert!(gpu.users.len() <= 1, "{gpu:?} mixes users");
            }
            let held: u64 = placed.iter().map(|(_, share)| share.memory_mib).sum();
            prop_assert_eq!(held, gpus.iter().map(|gpu| gpu.used_mib).sum::<u64>());
        }
    }
}
