#[test]
fn oom_kills_are_read_from_v1_and_v2_files() {
    assert_eq!(super::oom_kills("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n"), 2);
    assert_eq!(super::oom_kills("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n"), 1);
    assert_eq!(super::oom_kills("oom_kill_disable 0\nunder_oom 0\n"), 0);
}

use super::*;

#[test]
fn an_attempt_is_denied_the_other_gpus_of_its_node_and_gets_its_limits() {
    let v1 = Isolation::V1 {
        devices: "/cg/devices/gpool".into(),
        memory: Some("/cg/memory/box/gpool".into()),
        cpu: None,
        pids: Some("/cg/pids/gpool".into()),
    };
    let limits = Limits {
        mem_bytes: Some(1 << 30),
        cpus: Some(4),
        pids: Some(512),
    };
    let cgroup = v1.rules_for("a1", (7, 3), (&[0, 2], &[0, 1, 2, 3]), limits).unwrap();
    assert_eq!(
        cgroup.dirs,
        [
            PathBuf::from("/cg/devices/gpool/a1-7.3"),
            PathBuf::from("/cg/memory/box/gpool/a1-7.3"),
            PathBuf::from("/cg/pids/gpool/a1-7.3")
        ]
    );
    assert_eq!(
        lines(&cgroup),
        [
            "/cg/devices/gpool/a1-7.3/devices.deny c 195:1 rwm",
            "/cg/devices/gpool/a1-7.3/devices.deny c 195:3 rwm",
            "/cg/memory/box/gpool/a1-7.3/memory.limit_in_bytes 1073741824",
            "/cg/pids/gpool/a1-7.3/pids.max 512",
        ],
        "no cpu hierarchy: no CPU quota"
    );
    let v2 = Isolation::V2 {
        parent: "/cg/gpool".into(),
        device_filter: Ok(()),
        limits: V2Limits {
            memory: true,
            swap: true,
            cpu: true,
            pids: true,
        },
        delegated: Ok(()),
        allow_swap: false,
    };
    let cgroup = v2.rules_for("a1", (7, 3), (&[0, 2], &[0, 1, 2, 3]), limits).unwrap();
    assert_eq!(
        lines(&cgroup),
        [
            "/cg/gpool/a1-7.3/memory.max 1073741824",
            "/cg/gpool/a1-7.3/memory.swap.max 0",
            "/cg/gpool/a1-7.3/cpu.max 400000 100000",
            "/cg/gpool/a1-7.3/pids.max 512",
        ]
    );
    assert!(cgroup.unified, "the job is born in its one directory");
    assert_eq!(
        cgroup.deny_devices,
        vec![(195, 1), (195, 3)],
        "the filter refuses the other GPUs"
    );
    assert_eq!(v2.enforced(), ["cpu", "devices", "memory", "pids"]);
    let without = Isolation::V2 {
        parent: "/cg/gpool".into(),
        device_filter: Err("no BPF".into()),
        limits: V2Limits::default(),
        delegated: Err("not delegated".into()),
        allow_swap: false,
    };
    let cgroup = without.rules_for("a1", (7, 3), (&[0], &[0, 1]), limits).unwrap();
    assert!(cgroup.deny_devices.is_empty() && cgroup.settings.is_empty());
    assert!(
        without.enforced().is_empty(),
        "nothing is said to be enforced that is not"
    );
    assert_eq!(without.label(), "cgroup-no-devices");
    assert_eq!(v2.label(), "cgroup-devices");
    assert_eq!(
        Isolation::None("no".into()).rules_for("a1", (7, 3), (&[0], &[0, 1]), limits),
        None
    );
}

#[test]
fn the_agents_own_cgroup_is_read_per_hierarchy() {
    let own = "5:devices:/\n4:memory:/box/a1\n2:cpu,cpuacct:/x\n0::/user.slice/agent.service\n";
    assert_eq!(own_path(own, "memory"), Some(PathBuf::from("box/a1")));
    assert_eq!(own_path(own, "cpu"), Some(PathBuf::from("x")));
    assert_eq!(own_path(own, "devices"), Some(PathBuf::new()));
    assert_eq!(own_path(own, ""), Some(PathBuf::from("user.slice/agent.service")));
    assert_eq!(own_path(own, "pids"), None);
}

/// An attempt cgroup's settings, one `file value` line each.
fn lines(cgroup: &AttemptCgroup) -> Vec<String> {
    cgroup
        .settings
        .iter()
        .map(|(file, value)| format!("{} {value}", file.display()))
        .collect()
}

/// What a killed launcher left (empty cgroups of ended attempts) is
/// removed; the live attempts', other agents', spares and any with
/// something in it stay.
#[test]
fn cgroups_left_behind_are_removed_and_nothing_else() {
    let root = tempfile::tempdir().unwrap();
    let devices = root.path().join("devices/gpool");
    let named = |name: &str| {
        let dir = devices.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    };
    let left = named("0a1b2c3d-7.7");
    let live = named("0a1b2c3d-8.9");
    let other = named("ffffffff-7.7");
    let spare = named("spare-12-1");
    let busy = named("0a1b2c3d-6.6");
    std::fs::write(busy.join("cgroup.procs"), "4242\n").unwrap();
    let v1 = Isolation::V1 {
        devices: devices.clone(),
        memory: None,
        cpu: None,
        pids: None,
    };
    let removed = v1.remove_left_behind("0a1b2c3d", &std::collections::HashSet::from([(8, 9)]));
    assert_eq!(removed, 1);
    assert!(!left.exists());
    for kept in [live, other, spare, busy] {
        assert!(kept.exists(), "{} was removed", kept.display());
    }
}
