//! The store's tests: schema migration, records, sealing, readers.

use super::*;
use gpool_core::JobState;

fn job(id: u64, state: JobState) -> Job {
    let mut job = gpool_core::testing::job_builder(JobId(id)).build();
    job.state = state;
    job
}

fn cancelled_at(ms: i64) -> JobState {
    JobState::Cancelled {
        started_at: None,
        ended_at: Timestamp(ms),
        by: "alice".into(),
    }
}

#[test]
fn schema_1_moves_ended_jobs_and_environments_to_their_trees() {
    let dir = tempfile::tempdir().expect("a temp dir");
    {
        // A version 1 database: every job in `jobs`.
        let db = sled::open(dir.path().join("db")).expect("sled");
        let jobs = db.open_tree("jobs").expect("jobs");
        for mut job in [
            job(1, cancelled_at(5_000)),
            job(2, JobState::Pending),
            job(3, cancelled_at(2_000)),
        ] {
            // Version 1 records have the environment inline.
            std::sync::Arc::make_mut(&mut job.spec).env =
                vec![("HOME".to_string(), format!("/home/{}", job.id))].into();
            let mut value = serde_json::to_value(&job).expect("json");
            value["spec"]["env"] = serde_json::to_value(&job.spec.env).expect("json");
            let mut bytes = vec![RECORD_VERSION];
            serde_json::to_writer(&mut bytes, &value).expect("json");
            jobs.insert(job.id.0.to_be_bytes(), bytes).expect("insert");
        }
        db.open_tree("meta")
            .expect("meta")
            .insert(META_SCHEMA, &1u32.to_be_bytes())
            .expect("insert");
        db.flush().expect("flush");
    }
    let (store, loaded) = Store::open(dir.path()).expect("open");
    let ids: Vec<JobId> = loaded.jobs.iter().map(|job| job.id).collect();
    assert_eq!(ids, [JobId(2)]);
    assert_eq!(loaded.next_job_id, 4);
    assert_eq!(
        loaded.jobs[0].spec.env.to_vec(),
        [("HOME".to_string(), "/home/2".to_string())]
    );
    let ended = loaded.ended.get(JobId(1)).expect("read").expect("job 1");
    assert!(ended.spec.env.is_empty(), "the record was rewritten without it");
    let ended = loaded.ended.with_env(ended).expect("read");
    assert_eq!(ended.spec.env.to_vec(), [("HOME".to_string(), "/home/1".to_string())]);
    assert!(loaded.ended.get(JobId(2)).expect("read").is_none());
    let listed: Vec<JobId> = loaded.ended.from(JobId(0)).map(|job| job.expect("read").id).collect();
    assert_eq!(listed, [JobId(1), JobId(3)]);
    assert_eq!(
        loaded.ended.ended_before(Timestamp(5_000)).expect("read"),
        [(JobId(3), Timestamp(2_000))]
    );
    let schema = store.meta.get(META_SCHEMA).expect("read").expect("a schema");
    assert_eq!(schema.as_ref(), SCHEMA_VERSION.to_be_bytes());
    // The pending job's record is written again, referring to its
    // environment's set.
    let mut commit = store.begin();
    commit.job(&loaded.jobs[0]).expect("job");
    commit.finish().expect("commit");
    drop((store, loaded));
    // Opened again: nothing moves twice, the same jobs load.
    let (_, loaded) = Store::open(dir.path()).expect("open again");
    assert_eq!(loaded.jobs.len(), 1);
    assert_eq!(loaded.jobs[0].spec.env.len(), 1);
    assert_eq!(loaded.ended.from(JobId(0)).count(), 2);
}

#[test]
fn a_job_record_leaves_out_default_fields_and_reads_records_that_wrote_them() {
    let plain = job(1, JobState::Pending);
    let bytes = encode(&plain);
    let text = std::str::from_utf8(&bytes[1..]).expect("utf-8");
    for left_out in [
        "gpu_types",
        "project",
        "workload_type",
        "time_limit_secs",
        "priority",
        "pool",
        "requeue",
        "discard_output",
        "qos",
        "checkpoint_signal",
        "grace_secs",
        "image",
        "mem_bytes",
        "cpus_per_gpu",
        "n_attempts",
        "last_nodes",
        "n_preemptions",
        "lost_gpu_secs",
    ] {
        assert!(!text.contains(&format!("\"{left_out}\"")), "{left_out} in {text}");
    }
    assert_eq!(decode::<Job>("jobs", b"1", &bytes).expect("decode"), plain);

    // A record written before defaults were left out has every field.
    let older = br#"{"id":1,"spec":{"name":"job","command":["true"],"gpus_per_node":1,"nodes":1,
        "gpu_types":[],"team":"default","project":"","workload_type":"","time_limit_secs":null,
        "workdir":"","priority":0,"pool":"","requeue":true,"discard_output":false,"qos":"",
        "checkpoint_signal":null,"grace_secs":null,"image":"","mem_bytes":null,"cpus_per_gpu":null},
        "user":"alice","submitted_at":0,"state":"Pending","n_attempts":0,"last_nodes":[],
        "n_preemptions":0,"lost_gpu_secs":0}"#;
    let older = [&[RECORD_VERSION][..], older].concat();
    assert_eq!(decode::<Job>("jobs", b"1", &older).expect("decode"), plain);

    // Every field away from its default is written and read back.
    let mut full = job(2, JobState::Pending);
    full.n_attempts = 2;
    full.last_nodes = ["n1".to_string()].into_iter().collect();
    full.n_preemptions = 1;
    full.lost_gpu_secs = 30;
    let spec = std::sync::Arc::make_mut(&mut full.spec);
    spec.gpu_types = vec![gpool_core::GpuModel::new("h100")];
    spec.project = "p".into();
    spec.workload_type = "train".into();
    spec.time_limit_secs = Some(60);
    spec.priority = -3;
    spec.pool = "batch".into();
    spec.requeue = false;
    spec.discard_output = true;
    spec.qos = "high".into();
    spec.checkpoint_signal = Some(10);
    spec.grace_secs = Some(5);
    spec.image = "img".into();
    spec.mem_bytes = Some(1 << 30);
    spec.cpus_per_gpu = Some(4);
    assert_eq!(decode::<Job>("jobs", b"2", &encode(&full)).expect("decode"), full);
}

#[test]
fn a_job_record_moves_when_it_ends_and_is_removed_with_its_index() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (store, _) = Store::open(dir.path()).expect("open");
    let mut records = Records::default();
    records.job(&job(7, JobState::Pending), NO_ENV_SET);
    store.commit(records).expect("commit");
    let mut records = Records::default();
    records.job(&job(7, cancelled_at(9_000)), NO_ENV_SET);
    store.commit(records).expect("commit");
    assert!(store.jobs.get(7u64.to_be_bytes()).expect("read").is_none());
    let ended = store.ended_jobs();
    assert_eq!(ended.before(JobId(8)).expect("read").map(|job| job.id), Some(JobId(7)));
    assert_eq!(ended.ended_before(Timestamp(9_001)).expect("read").len(), 1);
    let mut records = Records::default();
    records.remove_job(JobId(7), Timestamp(9_000));
    store.commit(records).expect("commit");
    assert!(ended.get(JobId(7)).expect("read").is_none());
    assert!(ended.ended_before(Timestamp(i64::MAX)).expect("read").is_empty());
}

/// Ended jobs 1..=n, job `id` with `ID=id` in its environment, ended at
/// `1000 * id` ms, written as the state task writes them.
fn ended_jobs_1_to(store: &Store, n: u64) {
    ended_jobs_from_to(store, 1, n);
}

fn ended_jobs_from_to(store: &Store, first: u64, n: u64) {
    let mut commit = store.begin();
    for id in first..=n {
        let mut job = job(id, JobState::Pending);
        Arc::make_mut(&mut job.spec).env = vec![("ID".to_string(), id.to_string())].into();
        job.state = cancelled_at(1000 * id as i64);
        commit.job(&job).expect("job");
    }
    commit.finish().expect("commit");
}

fn ids(jobs: impl Iterator<Item = Result<Job, Error>>) -> Vec<u64> {
    jobs.map(|job| job.expect("read").id.0).collect()
}

#[test]
fn the_oldest_ended_jobs_move_to_a_history_file_and_read_back_the_same() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (store, _) = Store::open_sealing(dir.path(), 16).expect("open");
    ended_jobs_1_to(&store, 40);
    let ended = store.ended_jobs();
    let before: Vec<Job> = ended.from(JobId(0)).map(|job| job.expect("read")).collect();
    // 40 is more than twice 16: the 16 that ended first move, once.
    assert_eq!(store.sealer().seal_due().expect("seal"), (16, 0));
    assert_eq!(store.ended.len(), 24);
    assert_eq!(store.ended_by_time.len(), 24);
    assert!(store.ended.get(16u64.to_be_bytes()).expect("read").is_none());
    let after: Vec<Job> = ended.from(JobId(0)).map(|job| job.expect("read")).collect();
    assert_eq!(after, before);
    assert_eq!(ids(ended.from(JobId(15))), (15..=40).collect::<Vec<_>>());
    let sealed = ended.get(JobId(7)).expect("read").expect("job 7");
    assert_eq!(sealed, before[6]);
    let env = ended.with_env(sealed).expect("read").spec.env.to_vec();
    assert_eq!(env, [("ID".to_string(), "7".to_string())]);
    assert_eq!(
        ended.before(JobId(17)).expect("read").map(|job| job.id),
        Some(JobId(16))
    );
    assert_eq!(
        ended.before(JobId(16)).expect("read").map(|job| job.id),
        Some(JobId(15))
    );
    assert_eq!(ended.before(JobId(1)).expect("read"), None);
    // Sealed, then brought back and written again (an ended array whose
    // task ends): its record refers to its environment's set again, and
    // the next seal keeps the environment.
    let mut again = ended.with_env(before[2].clone()).expect("read");
    Arc::make_mut(&mut again.spec).name = "again".into();
    let mut commit = store.begin();
    commit.job(&again).expect("job");
    commit.finish().expect("commit");
    ended_jobs_from_to(&store, 41, 60);
    // 45 in sled: job 3 (ended first) and 17..=31 move.
    assert_eq!(store.sealer().seal_due().expect("seal"), (16, 0));
    let job_3 = ended.get(JobId(3)).expect("read").expect("job 3");
    assert_eq!(job_3.spec.name, "again");
    let env = ended.with_env(job_3).expect("read").spec.env.to_vec();
    assert_eq!(env, [("ID".to_string(), "3".to_string())]);
    // Retention: a file goes once all its jobs are past it, and not
    // while one of them is still needed.
    let keep = |needed: u64| {
        move |ids: std::ops::RangeInclusive<JobId>| {
            ids.contains(&JobId(needed))
                .then_some(JobId(needed))
                .into_iter()
                .collect()
        }
    };
    assert_eq!(
        ended.remove_files_before(Timestamp(16_000), keep(0)).expect("remove"),
        0
    );
    assert_eq!(
        ended.remove_files_before(Timestamp(16_001), keep(7)).expect("remove"),
        0
    );
    assert_eq!(
        ended.remove_files_before(Timestamp(16_001), keep(0)).expect("remove"),
        16
    );
    // Job 3 is in the later file too, as written again.
    assert_eq!(
        ids(ended.from(JobId(0))),
        [3].into_iter().chain(17..=60).collect::<Vec<_>>()
    );
    assert!(ended.get(JobId(7)).expect("read").is_none());
}

#[test]
fn a_seal_a_crash_cut_short_is_finished_at_open_and_a_record_written_again_stays() {
    let dir = tempfile::tempdir().expect("a temp dir");
    {
        let (store, _) = Store::open_sealing(dir.path(), 16).expect("open");
        ended_jobs_1_to(&store, 20);
        // The file is written and published; the crash comes before
        // anything leaves sled.
        let records: Vec<Record> = (1..=8u64)
            .map(|id| {
                let key = id.to_be_bytes();
                let value = store.ended.get(key).expect("read").expect("ended");
                let set = env_set_of(&value).expect("an environment");
                Record {
                    key: key.to_vec(),
                    at: 1000 * id as i64,
                    value: value.to_vec(),
                    extra: Some(
                        set_value(&store.env_sets.tree, "ended", &key, set)
                            .expect("set")
                            .to_vec(),
                    ),
                }
            })
            .collect();
        store.job_files.seal(records.into_iter().map(Ok)).expect("seal");
        // Job 3 is written again before the removal: that one stays.
        let mut again = job(3, cancelled_at(3000));
        Arc::make_mut(&mut again.spec).name = "again".into();
        let mut write = Records::default();
        write.job(&again, NO_ENV_SET);
        store.commit(write).expect("commit");
        store.db.flush().expect("flush");
    }
    let (store, loaded) = Store::open_sealing(dir.path(), 16).expect("open again");
    assert_eq!(store.ended.len(), 13, "jobs 3 and 9..=20 are left in sled");
    assert_eq!(store.ended_by_time.len(), 13);
    assert_eq!(ids(loaded.ended.from(JobId(0))), (1..=20).collect::<Vec<_>>());
    let job_3 = loaded.ended.get(JobId(3)).expect("read").expect("job 3");
    assert_eq!(job_3.spec.name, "again");
    let job_5 = loaded.ended.get(JobId(5)).expect("read").expect("job 5");
    assert_ne!(job_5.spec.name, "again");
}

#[test]
fn old_accounting_records_move_to_history_files_and_leave_a_file_at_a_time() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (store, _) = Store::open_sealing(dir.path(), 16).expect("open");
    let accounting = store.accounting();
    let record = |n: u64| {
        let mut record = AttemptRecord {
            job: JobId(n),
            display_id: n.to_string(),
            attempt: 1,
            epoch: gpool_core::Epoch(n),
            user: "alice".into(),
            team: "ml".into(),
            project: "p".into(),
            workload_type: "training".into(),
            qos: String::new(),
            pool: "default".into(),
            gpus: Default::default(),
            nodes: vec!["n1".into()],
            started_at: Timestamp(0),
            ended_at: Timestamp(0),
            burst: false,
            end: "completed".into(),
            lost_gpu_secs: 0.0,
            gpu_use: Default::default(),
            share_milli: None,
        };
        record.ended_at = Timestamp(n as i64 * 10);
        record
    };
    let mut records = Records::default();
    for n in 1..=50 {
        records.attempt(&record(n));
    }
    store.commit(records).expect("commit");
    let all = accounting.read(Timestamp(0), Timestamp(1), |_| true).expect("read");
    // Twice 16 are due twice: 50, then 34.
    assert_eq!(store.sealer().seal_due().expect("seal"), (0, 32));
    assert_eq!(store.attempts.len(), 18);
    assert_eq!(
        accounting.read(Timestamp(0), Timestamp(1), |_| true).expect("read"),
        all
    );
    let window = accounting.read(Timestamp(155), Timestamp(1), |_| true).expect("read");
    assert_eq!(
        window.iter().map(|record| record.job.0).collect::<Vec<_>>(),
        (16..=50).collect::<Vec<_>>()
    );
    // Records 1..=16 ended at 10..=160: their file goes with them.
    assert_eq!(accounting.remove_ended_before(Timestamp(165)).expect("remove"), 16);
    assert_eq!(
        accounting.read(Timestamp(0), Timestamp(1), |_| true).expect("read"),
        all[16..]
    );
}

/// Records of `n` pending jobs from id 1, and the next job id after them.
fn batch_of(n: u64) -> Records {
    let mut records = Records::default();
    for id in 1..=n {
        records.job(&job(id, JobState::Pending), NO_ENV_SET);
    }
    records.next_job_id(n + 1);
    records
}

#[test]
fn a_batch_larger_than_one_transaction_is_written_whole_and_leaves_no_log() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let n = 2 * MAX_AT_ONCE as u64 + 5;
    {
        let (store, _) = Store::open(dir.path()).expect("open");
        // As the state task adds them: spilled to the log as they come.
        let mut commit = store.begin();
        for records in batch_of(n).entries.chunks(7) {
            commit.records.entries.extend_from_slice(records);
            commit.spill_if_full().expect("spill");
            assert!(
                commit.records.entries.len() <= MAX_AT_ONCE,
                "never more than a part held"
            );
        }
        assert!(store.redo_path.exists(), "the log is started once a part is full");
        commit.finish().expect("commit");
        assert!(
            !store.redo_path.exists(),
            "the redo log is gone once the batch is written"
        );
        assert!(store.redo.is_empty());
    }
    let (_, loaded) = Store::open(dir.path()).expect("open again");
    assert_eq!(loaded.jobs.len() as u64, n);
    assert_eq!(loaded.next_job_id, n + 1);
}

#[test]
fn a_batch_of_one_transaction_needs_no_log() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (store, _) = Store::open(dir.path()).expect("open");
    let mut commit = store.begin();
    commit.records = batch_of(MAX_AT_ONCE as u64 - 1);
    commit.spill_if_full().expect("spill");
    assert!(!store.redo_path.exists());
    commit.finish().expect("commit");
    assert_eq!(store.jobs.len(), MAX_AT_ONCE - 1);
}

/// A crash's leftovers: the log of a batch of `n` jobs written (with
/// its whole mark or not), marked to be applied in `meta` or not, and
/// the first part applied where it was marked.
fn crash_with_a_log(dir: &Path, n: u64, whole: bool, marked: bool) {
    let entries = batch_of(n).entries;
    let parts: Vec<&[Entry]> = entries.chunks(MAX_AT_ONCE).collect();
    let (store, _) = Store::open(dir).expect("open");
    let mut log = RedoWriter::create(&store.redo_path).expect("create");
    for part in &parts {
        log.part(&encode_part(part)).expect("part");
    }
    if whole {
        log.finish().expect("finish");
    } else {
        drop(log);
    }
    if marked {
        store.meta.insert(META_REDO_LOG, &[]).expect("mark");
        store.apply(parts[0]).expect("apply");
    }
    store.db.flush().expect("flush");
}

#[test]
fn a_batch_cut_short_is_finished_at_open_once_marked_and_dropped_before() {
    let n = MAX_AT_ONCE as u64 + 3;
    assert_eq!(
        decode_part(&encode_part(&batch_of(n).entries[..3])).expect("decode"),
        batch_of(n).entries[..3]
    );
    for (whole, marked, expected) in [(true, true, n), (true, false, 0), (false, false, 0)] {
        let dir = tempfile::tempdir().expect("a temp dir");
        crash_with_a_log(dir.path(), n, whole, marked);
        let (store, loaded) = Store::open(dir.path()).expect("open again");
        let case = format!("whole log: {whole}, marked: {marked}");
        assert_eq!(loaded.jobs.len() as u64, expected, "{case}");
        assert_eq!(loaded.next_job_id, expected + 1, "{case}");
        assert!(!store.redo_path.exists(), "{case}");
        assert!(!store.meta.contains_key(META_REDO_LOG).expect("meta"), "{case}");
    }
}

#[test]
fn a_marked_log_damaged_since_it_was_synced_is_refused_naming_it() {
    let dir = tempfile::tempdir().expect("a temp dir");
    crash_with_a_log(dir.path(), MAX_AT_ONCE as u64 + 3, false, true);
    let err = Store::open(dir.path())
        .err()
        .expect("a half-applied batch is not dropped")
        .to_string();
    assert!(err.contains("redo.log") && err.contains("partly applied"), "{err}");
}

#[test]
fn a_batch_cut_short_with_its_log_in_the_redo_tree_is_finished_at_open() {
    let n = MAX_AT_ONCE as u64 + 3;
    let entries = batch_of(n).entries;
    let parts: Vec<&[Entry]> = entries.chunks(MAX_AT_ONCE).collect();
    for whole in [true, false] {
        let dir = tempfile::tempdir().expect("a temp dir");
        {
            // As an earlier gpoold's crash leaves it.
            let (store, _) = Store::open(dir.path()).expect("open");
            for (n, part) in parts.iter().enumerate() {
                store
                    .redo
                    .insert((n as u64).to_be_bytes(), encode_part(part))
                    .expect("insert");
            }
            if whole {
                store
                    .redo
                    .insert(REDO_WHOLE, &(parts.len() as u64).to_be_bytes())
                    .expect("insert");
                store.apply(parts[0]).expect("apply");
            }
            store.db.flush().expect("flush");
        }
        let (store, loaded) = Store::open(dir.path()).expect("open again");
        let expected = if whole { n } else { 0 };
        assert_eq!(loaded.jobs.len() as u64, expected, "whole log: {whole}");
        assert_eq!(loaded.next_job_id, expected + 1, "whole log: {whole}");
        assert!(store.redo.is_empty());
    }
}

/// A part of a redo log whose last record lacks its last bytes.
fn part_cut_short() -> Vec<u8> {
    let mut part = encode_part(&batch_of(2).entries);
    part.truncate(part.len() - 3);
    part
}

#[test]
fn a_whole_redo_log_with_a_record_that_does_not_decode_names_the_file() {
    let dir = tempfile::tempdir().expect("a temp dir");
    {
        let (store, _) = Store::open(dir.path()).expect("open");
        let part = part_cut_short();
        let mut log = RedoWriter::create(&store.redo_path).expect("create");
        log.part(&part).expect("part");
        log.finish().expect("finish");
        store.meta.insert(META_REDO_LOG, &[]).expect("mark");
        store.db.flush().expect("flush");
    }
    let err = Store::open(dir.path())
        .err()
        .expect("a damaged log is refused")
        .to_string();
    assert!(
        err.contains("redo.log") && err.contains("part 0") && err.contains("cut short"),
        "{err}"
    );
}

#[test]
fn a_damaged_redo_log_names_its_part() {
    let dir = tempfile::tempdir().expect("a temp dir");
    {
        let (store, _) = Store::open(dir.path()).expect("open");
        let part = part_cut_short();
        store.redo.insert(0u64.to_be_bytes(), part).expect("insert");
        store.redo.insert(REDO_WHOLE, &2u64.to_be_bytes()).expect("insert");
        store.db.flush().expect("flush");
    }
    let err = Store::open(dir.path())
        .err()
        .expect("a damaged log is refused")
        .to_string();
    assert!(err.contains("redo") && err.contains("cut short"), "{err}");
}
