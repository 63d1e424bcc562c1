//! Unit tests of `gpool sim`'s progress lines and report notes, and of the
//! shipped example files against the shipped policy it replays.

use super::progress::progress_line;
use std::path::Path;
use std::time::Duration;

const DAY_MS: i64 = 86_400_000;

#[test]
fn a_progress_line_says_how_far_the_virtual_clock_is() {
    let line = progress_line("gpool", 11 * DAY_MS + 5, 30 * DAY_MS, Duration::from_secs(25));
    assert_eq!(line, "sim: gpool: 36% of the trace (simulated day 12 of 30), 25 s");
    let start = progress_line("fifo", 0, 30 * DAY_MS, Duration::ZERO);
    assert_eq!(start, "sim: fifo: 0% of the trace (simulated day 1 of 30), 0 s");
    let last = progress_line("fifo", 30 * DAY_MS, 30 * DAY_MS, Duration::from_secs(90));
    assert_eq!(last, "sim: fifo: 100% of the trace (simulated day 30 of 30), 90 s");
    // A short trace counts hours; past the last arrival, the queue drains.
    let short = progress_line("dedicated", 5 * 3_600_000, 20 * 3_600_000, Duration::from_secs(3));
    assert_eq!(short, "sim: dedicated: 25% of the trace (simulated hour 6 of 20), 3 s");
    let draining = progress_line("gpool", 33 * DAY_MS, 30 * DAY_MS, Duration::from_secs(140));
    assert_eq!(
        draining,
        "sim: gpool: the whole trace has arrived, its queue drains (simulated day 34, the last arrival on day 30), 140 s"
    );
}

/// The example job file names only teams, QoS classes and pools of the
/// shipped gpoold.toml, as gpoold checks them at submit (as a member of
/// its team): its jobs are not refused by the controller they ship with.
#[test]
fn the_example_job_file_fits_the_shipped_policy() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (policy, _) = super::load_policy(&root.join("config/gpoold.toml")).unwrap_or_else(|err| panic!("{err}"));
    let text = std::fs::read_to_string(root.join("config/jobs.example.toml")).expect("config/jobs.example.toml");
    let specs =
        gpool_core::spec::parse_job_file("config/jobs.example.toml", &text).unwrap_or_else(|err| panic!("{err}"));
    assert!(!specs.is_empty());
    for mut spec in specs {
        let team = policy
            .sharing
            .teams
            .iter()
            .find(|team| team.name == spec.team)
            .unwrap_or_else(|| panic!("job {}: team {:?} is not in config/gpoold.toml", spec.name, spec.team));
        let member = team.members.first().map_or("someone", String::as_str);
        let caller = gpool_core::auth::Caller::user(member);
        if let Err(refusal) = policy.sharing.admit(&mut spec, &caller, "default") {
            panic!("job {}: config/gpoold.toml refuses it: {refusal:?}", spec.name);
        }
        assert!(
            policy.pool(&spec.pool).is_some(),
            "job {}: pool {:?} is not in config/gpoold.toml",
            spec.name,
            spec.pool
        );
        spec.validate().unwrap_or_else(|err| panic!("job {}: {err}", spec.name));
    }
}

/// A replay of 10 GPUs over 10 hours, 40% allocated, jobs waiting two
/// days on average: the first 5 hours idle with nothing waiting, the last
/// 5 at 80% with 3 jobs waiting.
fn low_allocation_long_waits(policy: &str) -> gpool_core::sim::Outcome {
    use gpool_core::sim::{Dist, Outcome, Series};
    Outcome {
        policy: policy.to_string(),
        gpus: 10,
        span_hours: 10.0,
        allocation: 0.4,
        queue_delay: Dist {
            n: 3,
            mean: 2.0 * 86400.0,
            ..Dist::default()
        },
        series: Series {
            bucket_secs: 3600,
            allocation: [[0.0; 5], [0.8; 5]].concat(),
            queued_jobs: [[0.0; 5], [3.0; 5]].concat(),
            ..Series::default()
        },
        ..Outcome::default()
    }
}

#[test]
fn a_note_says_where_the_idle_gpu_hours_fell_while_jobs_waited() {
    use super::notes::{idle_split, note};
    // 60 idle GPU-hours: 50 in hours with nothing waiting, 10 while jobs
    // waited that fitted nowhere free.
    let bursty = low_allocation_long_waits("fifo");
    let split = idle_split(&bursty).expect("idle GPUs");
    assert!((split.idle_gpu_hours - 60.0).abs() < 1e-9, "{split:?}");
    assert!((split.nothing_waiting - 50.0 / 60.0).abs() < 1e-9, "{split:?}");
    assert!((split.fitting_nowhere - 10.0 / 60.0).abs() < 1e-9, "{split:?}");
    assert_eq!(
        note(&bursty, 5.0).as_deref(),
        Some("note: fifo: 40.0% allocated while jobs waited 2.0d on average: demand came and went: 83% of the idle GPU-hours fell in time slices in which no job waited; 5.0h of the 10.0h replayed come after the last arrival, while the last jobs run")
    );

    // Jobs waited all along, and none fitted what was free.
    let mut stuck = low_allocation_long_waits("dedicated");
    stuck.series.queued_jobs = vec![2.0; 10];
    stuck.never_started = 2;
    assert_eq!(
        note(&stuck, 10.0).as_deref(),
        Some("note: dedicated: 40.0% allocated while jobs waited 2.0d on average: the waiting jobs did not fit the idle GPUs: 100% of the idle GPU-hours fell in time slices in which jobs waited, when none of them fitted the free GPUs of its team's partition; 2 jobs never started")
    );
    stuck.policy = "gpool".into();
    stuck.never_started = 0;
    assert!(note(&stuck, 10.0).is_some_and(
        |line| line.ends_with("none of them fitted the free GPUs of its pool (GPUs per node, nodes or model)")
    ));

    // For 8 hours a waiting job fitted half the GPUs: 40 of the 60 idle
    // GPU-hours, which the policy kept idle.
    stuck.allocation_while_startable = Some(0.5);
    stuck.hours_startable = 8.0;
    assert_eq!(
        note(&stuck, 10.0).as_deref(),
        Some("note: gpool: 40.0% allocated while jobs waited 2.0d on average: the policy held back jobs that fitted: 67% of the idle GPU-hours fell while a waiting job fitted the free GPUs of its pool and was not started")
    );

    // No note where allocation is high, or waits are short.
    let mut busy = low_allocation_long_waits("fifo");
    busy.allocation = 0.8;
    assert_eq!(note(&busy, 5.0), None);
    let mut quick = low_allocation_long_waits("fifo");
    quick.queue_delay.mean = 600.0;
    assert_eq!(note(&quick, 5.0), None);
}

/// `gpool sim`'s own arguments, parsed as the command line gives them.
#[derive(clap::Parser)]
struct SimLine {
    #[command(flatten)]
    sim: super::SimArgs,
}

/// A two-job trace on one node of 2 GPUs, in a directory of its own.
fn two_jobs(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("gpool-sim-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    std::fs::write(
        dir.join("trace.csv"),
        "submit,duration,gpus_per_node,nodes,team\n2026-11-23T10:00:00Z,100,1,1,a\n2026-11-23T10:00:10Z,100,1,1,a\n",
    )
    .expect("the trace");
    dir
}

fn sim_args(dir: &Path, extra: &[&str]) -> super::SimArgs {
    let trace = dir.join("trace.csv");
    let mut line = vec![
        "sim",
        "--trace",
        trace.to_str().unwrap(),
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
    ];
    line.extend_from_slice(extra);
    <SimLine as clap::Parser>::try_parse_from(line)
        .unwrap_or_else(|err| panic!("{err}"))
        .sim
}

/// A start the simulator moves onto a GPU another attempt holds (a test
/// hook of gpool-core) is counted by the checks of every build, and fails
/// `gpool sim` with exit code 3; the same replay unharmed exits 0.
#[test]
fn a_corrupted_placement_fails_the_replay_with_exit_3() {
    let dir = two_jobs("corrupt");
    let jobs_out = dir.join("jobs.csv");
    let extra = [
        "--compare",
        "fifo",
        "--no-savings",
        "--jobs-out",
        jobs_out.to_str().unwrap(),
    ];
    let clean = super::run_with(sim_args(&dir, &extra), true, &|_| {});
    assert_eq!(clean.map_err(|err| err.to_string()), Ok(0));
    let broken = super::run_with(sim_args(&dir, &extra), true, &|options| options.corrupt_start = Some(2));
    assert_eq!(broken.map_err(|err| err.to_string()), Ok(super::EXIT_INVARIANT_BROKEN));
    // Both attempts on GPU 0 of the one node: what the checks refused.
    let rows = std::fs::read_to_string(&jobs_out).expect("--jobs-out");
    let placements: Vec<&str> = rows.lines().skip(1).filter_map(|row| row.rsplit(',').next()).collect();
    assert!(placements.len() == 2 && placements[0] == placements[1], "{rows}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `--jobs-out` into a directory that does not exist is refused before
/// any replay, naming the flag and the file.
#[test]
fn an_unwritable_jobs_out_is_named() {
    let dir = two_jobs("unwritable");
    let path = dir.join("missing/jobs.csv");
    let err =
        super::run_with(sim_args(&dir, &["--jobs-out", path.to_str().unwrap()]), true, &|_| {}).expect_err("refused");
    assert_eq!(err.exit_code(), 2);
    assert!(
        err.to_string().starts_with("--jobs-out ") && err.to_string().contains("missing"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A long series is averaged down to at most the points a chart takes,
/// each over the same stretch of the replay; a short one is left as is.
#[test]
fn chart_points_average_a_long_series_down() {
    let values: Vec<f64> = (0..10_000).map(|i| f64::from(i % 2)).collect();
    let points = super::plot::points(&values, 60, 100.0, 1_000);
    assert_eq!(points.len(), 1_000);
    assert!(
        points.iter().all(|(_, v)| (*v - 50.0).abs() < 1e-9),
        "{:?}",
        &points[..3]
    );
    assert_eq!(points[1].0, 10.0 * 60.0 / 3600.0);
    let short = super::plot::points(&[0.5, 0.25], 3600, 1.0, 1_000);
    assert_eq!(short, [(0.0, 0.5), (1.0, 0.25)]);
}

/// The savings search that joins the policies' work queue (its first
/// scales replayed beside them) finds what the search run after them
/// finds: `sim::savings` on the pooled policy's mean wait.
#[test]
fn the_savings_search_beside_the_policies_finds_what_it_finds_after_them() {
    use gpool_core::sim;
    let dir = std::env::temp_dir().join(format!("gpool-sim-savings-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a temp dir");
    // Team a sends a burst that dedicated partitions of one GPU make wait.
    let mut trace = String::from("submit,duration,gpus_per_node,nodes,team\n");
    for i in 0..6 {
        trace += &format!("2026-11-23T10:00:0{i}Z,{},1,1,a\n", 600 + 300 * i);
    }
    trace += "2026-11-23T10:00:00Z,100,1,1,b\n2026-11-23T10:30:00Z,100,1,1,b\n";
    std::fs::write(dir.join("trace.csv"), trace).expect("the trace");
    let args = sim_args(&dir, &[]);
    let cluster = super::load_cluster(&args).expect("the cluster");
    let mut jobs = super::load_trace(&args, "trace.csv", &cluster).expect("the trace");
    let impossible = sim::impossible(&cluster, &jobs);
    super::apply_job_defaults(&args, &mut jobs).expect("defaults");
    let (policy, guarantees, cluster) = super::policy_and_guarantees(&args, cluster, &jobs).expect("a policy");
    let setups = super::setups(&args.compare, &cluster, &policy, &guarantees).expect("the setups");
    let pooled = super::pooled_for_savings(&args, &setups);
    assert_eq!(pooled.map(|index| setups[index].name.as_str()), Some("gpool"));
    let options = sim::Options {
        tick_secs: 60,
        bucket_secs: 60,
        ..sim::Options::default()
    };
    let bars = indicatif::MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::hidden());
    let (results, savings) = super::replay_all(
        (&setups, pooled),
        (&jobs, &impossible),
        (&cluster, &guarantees),
        &options,
        &bars,
    );
    let names: Vec<&str> = results.iter().map(|(outcome, _)| outcome.policy.as_str()).collect();
    assert_eq!(names, ["dedicated", "fifo", "gpool"]);
    let target = results[2].0.queue_delay.mean;
    let quiet = |_: f64| -> Box<dyn sim::Observer + Send> { Box::new(sim::Quiet) };
    let search_options = sim::Options {
        record: false,
        ..options
    };
    let after = sim::savings((&cluster, &guarantees), &jobs, target, (&search_options, 1), &quiet);
    assert!(after.tried.len() > 1, "{after:?}");
    assert_eq!(savings, Some(after));
    std::fs::remove_dir_all(&dir).ok();
}
