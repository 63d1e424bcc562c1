//! gpoold.toml's checks, each refusal naming its line and field.

use super::*;

#[test]
fn every_example_config_parses() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config");
    let path = dir.join("gpoold.toml");
    let config = Config::load(&path).unwrap_or_else(|err| panic!("{err}"));
    assert!(config.policy.pool("").is_some());
    let sharing = &config.policy.sharing;
    assert_eq!(sharing.team("vision").guaranteed_gpus, 8);
    let vision = sharing.team("vision");
    assert_eq!(vision.guaranteed_in.get("inference"), Some(&2));
    assert_eq!(vision.guaranteed_in.get("a100-80gb"), Some(&4));
    assert_eq!(sharing.team_of_user("carol"), Some("nlp"));
    assert!(sharing.qos("high").is_some_and(|q| q.preempt_lower));
    // The high class keeps 4 GPUs in the default pool, none of the 2 of
    // the inference pool.
    let high = sharing.qos("high").unwrap();
    assert_eq!(
        (high.reserve_in_pool("default"), high.reserve_in_pool("inference")),
        (4, 0)
    );
    assert_eq!(sharing.qos("").map(|q| q.name.as_str()), Some("normal"));
    let pricing = &config.accounting.pricing;
    assert_eq!(pricing.price(&GpuModel::new("H100")), Some(4.10));
    assert_eq!(pricing.cost_center("ml", "ads-ranking"), "ads");
    assert_eq!(pricing.cost_center("nlp", "x"), "research");
}

#[test]
fn history_file_records_is_a_number_in_range() {
    let base = "listen = \"127.0.0.1:1\"\nstate_dir = \"/x\"\n";
    for bad in ["15", "1000001", "-1"] {
        let err = Config::parse("g.toml", &format!("{base}history_file_records = {bad}\n"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!(
                "history_file_records: {bad} is not a number from 16 to 1000000"
            )),
            "{err}"
        );
    }
    let config = Config::parse("g.toml", &format!("{base}history_file_records = 16\n")).unwrap();
    assert_eq!(config.history_file_records, 16);
    let config = Config::parse("g.toml", base).unwrap();
    assert_eq!(config.history_file_records, RECORDS_PER_FILE);
}

#[test]
fn enforce_limits_is_refuse_by_default_or_warn_and_nothing_else() {
    use gpool_core::enforce::EnforceLimits;
    let base = "listen = \"127.0.0.1:1\"\nstate_dir = \"/x\"\n";
    let config = Config::parse("g.toml", base).unwrap();
    assert_eq!(config.policy.enforce_limits, EnforceLimits::Refuse);
    let config = Config::parse("g.toml", &format!("{base}enforce_limits = \"warn\"\n")).unwrap();
    assert_eq!(config.policy.enforce_limits, EnforceLimits::Warn);
    let config = Config::parse("g.toml", &format!("{base}enforce_limits = \"refuse\"\n")).unwrap();
    assert_eq!(config.policy.enforce_limits, EnforceLimits::Refuse);
    let err = Config::parse("g.toml", &format!("{base}enforce_limits = \"ignore\"\n"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("g.toml:3"), "{err}");
    assert!(
        err.contains("enforce_limits: \"ignore\" is not \"refuse\" or \"warn\""),
        "{err}"
    );
}

#[test]
fn accounting_errors_name_the_field() {
    let base = "listen = \"127.0.0.1:1\"\nstate_dir = \"/x\"\n[accounting]\n";
    for (extra, expected) in [
        (
            "[accounting.prices]\nh100 = -1.0\n",
            "accounting.prices.h100: -1 is not a price",
        ),
        ("keep = \"soon\"\n", "accounting.keep: \"soon\" is not"),
        (
            "savings_percentile = 0.0\n",
            "accounting.savings_percentile: 0 is not above 0",
        ),
        (
            "[accounting.cost_centers.a]\nteams = [\"ml\"]\n[accounting.cost_centers.b]\nteams = [\"ml\"]\n",
            "accounting.cost_centers.b.teams: \"ml\" is in cost centre \"a\" too",
        ),
        (
            "[accounting.cost_centers.a]\nteams = [\"nobody\"]\n",
            "accounting.cost_centers.a.teams: \"nobody\" is not a [[team]] of this file",
        ),
    ] {
        let err = Config::parse("g.toml", &format!("{base}{extra}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{err}");
    }
    let config = Config::parse("g.toml", &format!("{base}keep = \"forever\"\n")).unwrap();
    assert_eq!(config.accounting.keep, None);
}

#[test]
fn health_errors_name_the_field() {
    let base = "listen = \"127.0.0.1:1\"\nstate_dir = \"/x\"\n[health]\n";
    for (extra, expected) in [
        (
            "quiet_period = \"soon\"\n",
            "health.quiet_period: \"soon\" is not a duration such as 10m",
        ),
        (
            "max_temperature_c = 20\n",
            "health.max_temperature_c: 20 is not from 40 to 150",
        ),
        ("hot_for = \"1x\"\n", "health.hot_for: \"1x\""),
        ("missing = \"1s\"\n", "unknown field `missing`"),
    ] {
        let err = Config::parse("g.toml", &format!("{base}{extra}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{err}");
    }
    let config = Config::parse(
        "g.toml",
        &format!("{base}quiet_period = \"30s\"\nmissing_for = \"5s\"\n"),
    )
    .unwrap();
    assert_eq!((config.health.quiet_ms, config.health.missing_for_ms), (30_000, 5_000));
}

#[test]
fn sharing_errors_name_the_line_and_field() {
    let base = "listen = \"127.0.0.1:1\"\nstate_dir = \"/x\"\n";
    let cases = [
        (
            "[sharing]\nperiod = \"year\"\n",
            "g.toml:3: sharing.period: \"year\" is not day, week or month",
        ),
        (
            "[sharing]\ntime_zone = \"Mars/Olympus\"\n",
            "g.toml:3: sharing.time_zone: \"Mars/Olympus\"",
        ),
        (
            "\n[[team]]\nname = \"a\"\nshares = 0\n",
            "g.toml:4: team.shares: team a needs at least 1 share",
        ),
        (
            "[[team]]\nname = \"a\"\nguaranteed_gpus = 8\nmax_gpus = 4\n",
            "g.toml:3: team.max_gpus: team a caps at 4 GPUs, below its 8 guaranteed",
        ),
        (
            "[[reservation]]\nname = \"m\"\nnodes = [\"n1\"]\nstart = \"2026-12-01T08:00:00Z\"\nend = \"2026-12-01T07:00:00Z\"\n",
            "g.toml:3: reservation.end: reservation m ends before it starts",
        ),
        (
            "[[reservation]]\nname = \"m\"\nnodes = [\"n1\"]\nstart = \"soon\"\nduration = \"1h\"\n",
            "g.toml:3: reservation.start: \"soon\" is not a date or time",
        ),
        (
            "[[reservation]]\nname = \"m\"\nnodes = [\"n1\"]\nstart = \"2026-12-01\"\n",
            "g.toml:3: reservation.duration: reservation m needs a duration or an end",
        ),
        (
            "[[qos]]\nname = \"x\"\nmax_time = \"soon\"\n",
            "g.toml:3: qos.max_time: \"soon\" is not a duration",
        ),
        (
            "[[qos]]\nname = \"high\"\nreserve_in = { gpu = 2 }\n",
            "g.toml:3: qos.reserve_in: class high keeps GPUs in pool \"gpu\", but no [[pool]] has that name",
        ),
        (
            "[sharing]\ndefault_qos = \"gold\"\n",
            "g.toml:1: sharing.default_qos: no [[qos]] is named \"gold\"",
        ),
        ("[[team]]\nname = \"a\"\ngpus = 3\n", "g.toml:5: unknown field `gpus`"),
        (
            "[sharing]\norder = \"sjf\"\n",
            "g.toml:3: sharing.order: \"sjf\" is not \"las\" or \"priority\"",
        ),
        (
            "[sharing]\norder = \"priority\"\n[sharing.las]\npromote_factor = 2\n",
            "g.toml:3: sharing.las: set, but sharing.order is \"priority\"",
        ),
        (
            "[sharing.las]\nthresholds_gpu_hours = [10, 1]\n",
            "g.toml:3: sharing.las.thresholds_gpu_hours: [10.0, 1.0] are not ascending GPU-hours above 0",
        ),
        (
            "[sharing.las]\nmax_lost = \"soon\"\n",
            "g.toml:3: sharing.las.max_lost: \"soon\" is not a duration",
        ),
    ];
    for (extra, expected) in cases {
        let err = Config::parse("g.toml", &format!("{base}{extra}"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with(expected), "{extra:?} gave {err:?}");
    }
}

/// LAS order within teams is on unless `order = "priority"`, and its
/// table tunes what it sets.
#[test]
fn sharing_order_is_las_unless_priority_is_asked() {
    let base = "listen = \"127.0.0.1:1\"\nstate_dir = \"/x\"\n";
    let las = |extra: &str| {
        Config::parse("g.toml", &format!("{base}{extra}"))
            .unwrap()
            .policy
            .sharing
            .las
    };
    assert_eq!(las(""), Some(gpool_core::sched::Las::default()));
    assert_eq!(las("[sharing]\norder = \"priority\"\n"), None);
    let tuned = las("[sharing.las]\nthresholds_gpu_hours = [0.5, 8]\nmax_lost = \"2m\"\n").unwrap();
    assert_eq!(tuned.thresholds_gpu_secs, vec![1800, 28_800]);
    assert_eq!(tuned.max_lost_secs, 120);
    assert_eq!(tuned.promote_factor, gpool_core::sched::Las::default().promote_factor);
}

#[test]
fn errors_name_file_line_and_field() {
    let err = Config::parse("g.toml", "listen = \"127.0.0.1:1\"\nstate_dir = \"/x\"\nlisen = 3\n").unwrap_err();
    assert_eq!(
        err.to_string().split(',').next().unwrap(),
        "g.toml:3: unknown field `lisen`"
    );
    let err = Config::parse("g.toml", "state_dir = \"/x\"\nlisten = \"0.0.0.0:0\"\n").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("g.toml:2: listen: \"0.0.0.0:0\": port 0 would be a new port"),
        "{err}"
    );
    assert!(Config::parse("g.toml", "state_dir = \"/x\"\nlisten = \"127.0.0.1:0\"\n").is_ok());
    let err = Config::parse(
        "g.toml",
        "node_timeout = \"1s\"\nlisten = \"127.0.0.1:1\"\nstate_dir = \"/x\"\n",
    )
    .unwrap_err();
    assert!(err.to_string().contains("shortest node timeout, 4s"), "{err}");
    let err = Config::parse("g.toml", "state_dir = \"/x\"\nlisten = \"nowhere\"\n").unwrap_err();
    assert!(
        err.to_string()
            .starts_with("g.toml:2: listen: \"nowhere\" is not host:port"),
        "{err}"
    );
    let err = Config::parse(
        "g.toml",
        "listen = \"127.0.0.1:1\"\nstate_dir = \"/x\"\ndefault_pool = \"big\"\n",
    )
    .unwrap_err();
    assert_eq!(err.to_string(), "g.toml:3: default_pool: no [[pool]] is named \"big\"");
}

#[test]
fn a_pool_gives_its_jobs_default_cpus_and_memory() {
    let base = "listen = \"127.0.0.1:1\"\nstate_dir = \"/x\"\n[[pool]]\nname = \"default\"\n";
    let config = Config::parse(
        "g.toml",
        &format!("{base}default_cpus_per_gpu = 4\ndefault_mem_per_gpu = \"16G\"\n"),
    )
    .unwrap();
    let defaults = config.policy.pools[0].defaults;
    assert_eq!(defaults.cpus_per_gpu, Some(4));
    assert_eq!(defaults.mem_per_gpu_bytes, Some(16 << 30));
    let err = Config::parse("g.toml", &format!("{base}default_cpus_per_gpu = 0\n")).unwrap_err();
    assert!(
        err.to_string()
            .contains("g.toml:5: pool.default_cpus_per_gpu: pool \"default\": at least 1"),
        "{err}"
    );
    let err = Config::parse("g.toml", &format!("{base}default_mem_per_gpu = \"lots\"\n")).unwrap_err();
    assert!(
        err.to_string()
            .contains("g.toml:5: pool.default_mem_per_gpu: pool \"default\""),
        "{err}"
    );
}

#[test]
fn ha_names_etcd_this_controller_and_its_lease() {
    let base = "listen = \"127.0.0.1:1\"\nstate_dir = \"/x\"\n[ha]\n";
    let good = "etcd = [\"http://10.0.0.5:2379\", \"10.0.0.6:2379\"]\nname = \"ctl-a\"\nadvertise = \"ctl-a.example:7070\"\ninsecure_etcd = true\n";
    let config = Config::parse("g.toml", &format!("{base}{good}")).unwrap_or_else(|err| panic!("{err}"));
    let ha = config.ha.expect("[ha]");
    assert_eq!(ha.etcd.len(), 2);
    assert_eq!(
        (ha.name.as_str(), ha.advertise.as_str()),
        ("ctl-a", "ctl-a.example:7070")
    );
    assert_eq!(ha.lease_ttl, DEFAULT_LEASE_TTL);
    assert_eq!(ha.election, DEFAULT_ELECTION);
    assert_eq!(ha.tls, None);
    let tls = "etcd = [\"https://10.0.0.5:2379\"]\nname = \"a\"\nadvertise = \"a:1\"\nca = \"/e/ca.pem\"\ncert = \"/e/a.pem\"\nkey = \"/e/a.key\"\n";
    let config = Config::parse("g.toml", &format!("{base}{tls}")).unwrap_or_else(|err| panic!("{err}"));
    let etcd_tls = config.ha.and_then(|ha| ha.tls).expect("TLS to etcd");
    assert_eq!(etcd_tls.ca, Path::new("/e/ca.pem"));
    assert_eq!(etcd_tls.cert_key, Some(("/e/a.pem".into(), "/e/a.key".into())));
    let without = Config::parse("g.toml", "listen = \"127.0.0.1:1\"\nstate_dir = \"/x\"\n").unwrap();
    assert_eq!(without.ha, None);
    // Without advertise, others dial the listen address, where it names one.
    let unsaid = good.replace("advertise = \"ctl-a.example:7070\"\n", "");
    let config = Config::parse("g.toml", &format!("{base}{unsaid}")).unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(config.ha.map(|ha| ha.advertise).as_deref(), Some("127.0.0.1:1"));
    let any_port = format!("{}{unsaid}", base.replace("127.0.0.1:1", "127.0.0.1:0"));
    let err = Config::parse("g.toml", &any_port).unwrap_err().to_string();
    assert!(
        err.contains("ha.advertise: needed, since listen = \"127.0.0.1:0\" is not an address"),
        "{err}"
    );
    for (bad, says) in [
        (
            good.replace("[\"http://10.0.0.5:2379\", \"10.0.0.6:2379\"]", "[]"),
            "ha.etcd: name at least one",
        ),
        (
            good.replace("http://10.0.0.5:2379", "https://10.0.0.5:2379"),
            "ha.etcd: \"https://10.0.0.5:2379\" is not http://HOST:PORT (etcd's client URL; https:// needs ha.ca",
        ),
        (
            format!("{good}ca = \"/etc/etcd/ca.pem\"\n"),
            "ha.etcd: \"http://10.0.0.5:2379\" is not https://HOST:PORT",
        ),
        (format!("{good}cert = \"/c.pem\"\n"), "ha.cert and ha.key go together"),
        (good.replace("ctl-a\"\n", "ctl a\"\n"), "ha.name: \"ctl a\" must be"),
        (
            good.replace("ctl-a.example:7070", "ctl-a.example"),
            "ha.advertise: \"ctl-a.example\" is not HOST:PORT",
        ),
        (
            format!("{good}lease_ttl = \"1s\"\n"),
            "ha.lease_ttl: \"1s\" is not a whole number of seconds from 2s to 1h",
        ),
        (format!("{good}lease_ttl = \"2.5s\"\n"), "ha.lease_ttl: \"2.5s\""),
        (format!("{good}leader = true\n"), "unknown field `leader`"),
        (
            format!("{good}lease_ttl = \"2h\"\n"),
            "ha.lease_ttl: \"2h\" is not a whole number of seconds from 2s to 1h",
        ),
        (
            format!("{good}election = \"gpool/\"\n"),
            "ha.election: \"gpool/\" must be",
        ),
        (format!("{good}election = \"\"\n"), "ha.election: \"\" must be"),
        // Plaintext etcd is said out loud, on loopback too.
        (
            good.replace("insecure_etcd = true\n", ""),
            "ha.insecure_etcd: ha.etcd names plaintext etcd (\"http://10.0.0.5:2379\"), where anyone who reaches it can rewrite the election's keys",
        ),
        (
            good.replace("insecure_etcd = true\n", "").replace("10.0.0.5", "127.0.0.1"),
            "set insecure_etcd = true in [ha]",
        ),
        (
            format!("{tls}insecure_etcd = true\n"),
            "ha.insecure_etcd: with ha.ca etcd is reached over TLS",
        ),
    ] {
        let err = Config::parse("g.toml", &format!("{base}{bad}"))
            .unwrap_err()
            .to_string();
        assert!(err.contains(says), "{bad}: {err}");
    }
}

/// A failover never fences a running job: with `[ha]` the node timeout
/// defaults to the least that outlives one, and a shorter one is refused
/// with both fields named.
#[test]
fn ha_takes_a_node_timeout_that_outlives_a_failover() {
    let ha = "[ha]\netcd = [\"http://10.0.0.5:2379\"]\nname = \"a\"\nadvertise = \"a:1\"\ninsecure_etcd = true\n";
    let base = "listen = \"127.0.0.1:1\"\nstate_dir = \"/x\"\n";
    let shipped = Config::parse("g.toml", &format!("{base}{ha}")).unwrap_or_else(|err| panic!("{err}"));
    assert_eq!(shipped.node_timeout, Duration::from_secs(54), "the 15 s lease's least");
    let plain = Config::parse("g.toml", base).unwrap();
    assert_eq!(plain.node_timeout, DEFAULT_NODE_TIMEOUT, "no [ha]: no change");
    let short = format!("{ha}lease_ttl = \"3s\"\n");
    let config = Config::parse("g.toml", &format!("{base}{short}")).unwrap();
    assert_eq!(config.node_timeout, DEFAULT_NODE_TIMEOUT, "never below 30 s");
    let err = Config::parse("g.toml", &format!("{base}node_timeout = \"30s\"\n{ha}"))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("g.toml:3: node_timeout = \"30s\" is too short for ha.lease_ttl = \"15s\"")
            && err.contains("at least \"54s\""),
        "{err}"
    );
    let config = Config::parse("g.toml", &format!("{base}node_timeout = \"2m\"\n{ha}")).unwrap();
    assert_eq!(config.node_timeout, Duration::from_secs(120));
}

#[test]
fn power_groups_expand_their_nodes_and_name_each_mistake() {
    let base = "listen = \"127.0.0.1:1\"\nstate_dir = \"/x\"\n[accounting.prices]\nh100 = 4.1\n";
    let group = |extra: &str| {
        format!(
            "{base}[[power]]\nname = \"cloud\"\nnodes = \"c-[1-3]\"\nmodel = \"H100\"\ngpus = 8\n\
             resume = \"/r\"\nsuspend = \"/s\"\n{extra}"
        )
    };
    // A per-team budget needs teams: without them any team may be named.
    let err = Config::parse("g.toml", &group("max_nodes_per_team = 1\n"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("power \"cloud\": max_nodes_per_team: needs [[team]] tables"),
        "{err}"
    );
    let config = Config::parse("g.toml", &group("max_nodes = 2\nsuspend_after = \"never\"\n")).unwrap();
    let power = &config.power[0];
    assert_eq!(power.group.nodes, ["c-1", "c-2", "c-3"]);
    assert_eq!(power.group.price_per_gpu_hour, 4.1, "the model's price by default");
    assert_eq!(power.group.suspend_after_secs, None);
    assert_eq!(
        power.group.resume_timeout_secs,
        gpool_core::power::DEFAULT_RESUME_TIMEOUT_SECS
    );
    assert_eq!(power.group.max_nodes, Some(2));
    for (extra, wanted) in [
        ("resume_timeout = \"soon\"\n", "power \"cloud\": resume_timeout:"),
        ("gpu_memory = \"lots\"\n", "power \"cloud\": gpu_memory:"),
        ("price_per_gpu_hour = -1.0\n", "power \"cloud\": price_per_gpu_hour: -1 is not a price"),
        ("labels = { tier = \"x\" }\n[[pool]]\nname = \"p\"\nselector = { tier = \"y\" }\n", "power \"cloud\": labels:"),
        (
            "[[power]]\nname = \"other\"\nnodes = [\"c-3\"]\nmodel = \"l4\"\ngpus = 1\nresume = \"/r\"\nsuspend = \"/s\"\n",
            "power \"other\": nodes: c-3 is in power group \"cloud\" too",
        ),
    ] {
        let err = Config::parse("g.toml", &group(extra)).unwrap_err().to_string();
        assert!(err.contains(wanted), "{extra}: {err}");
    }
    let err = Config::parse("g.toml", &group("").replace("c-[1-3]", "c-[3-1]"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("power \"cloud\": nodes:") && err.contains("goes down"),
        "{err}"
    );
}
