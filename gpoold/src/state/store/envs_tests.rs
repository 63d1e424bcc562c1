//! Environments stored once: shared sets, keys taken by other content,
//! sets no job refers to, the older schemas' entries, dropped batches.

use super::*;

fn env(value: &str) -> Env {
    vec![
        ("HOME".to_string(), "/home/alice".to_string()),
        ("SHELL_ID".to_string(), value.to_string()),
    ]
    .into()
}

fn pending(id: u64, env: &Env) -> Job {
    let mut job = gpool_core::testing::job_builder(JobId(id)).build();
    Arc::make_mut(&mut job.spec).env = env.clone();
    job
}

/// Submits `jobs` as the state task writes them.
fn submit(store: &Store, jobs: &[Job]) {
    let mut commit = store.begin();
    for job in jobs {
        commit.job(job).expect("job");
    }
    commit.finish().expect("commit");
}

/// The set job `id`'s record in `jobs` refers to.
fn set_of(store: &Store, id: u64) -> Option<u64> {
    env_set_of(&store.jobs.get(id.to_be_bytes()).expect("read").expect("a record"))
}

fn loaded_env(loaded: &Loaded, id: u64) -> Env {
    let job = loaded.jobs.iter().find(|job| job.id == JobId(id)).expect("loaded");
    job.spec.env.clone()
}

#[test]
fn alike_environments_are_stored_once_and_load_back_shared() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (a, b) = (env("a"), env("b"));
    {
        let (store, _) = Store::open(dir.path()).expect("open");
        submit(&store, &[pending(1, &a), pending(2, &a)]);
        submit(&store, &[pending(3, &b), pending(4, &a), pending(5, &Env::default())]);
        assert_eq!(store.env_sets.tree.len(), 2);
        assert_eq!(set_of(&store, 1), set_of(&store, 4));
        assert_ne!(set_of(&store, 1), set_of(&store, 3));
        assert_eq!(set_of(&store, 5), None, "no environment, no set");
        assert!(store.envs.is_empty());
    }
    let (_, loaded) = Store::open(dir.path()).expect("open again");
    assert_eq!(loaded_env(&loaded, 1), a);
    assert_eq!(loaded_env(&loaded, 3), b);
    assert!(loaded_env(&loaded, 5).is_empty());
    assert!(Arc::ptr_eq(&loaded_env(&loaded, 1), &loaded_env(&loaded, 4)));
    // Jobs 1 and 2 are alike, environment and all: one spec.
    assert!(Arc::ptr_eq(&loaded.jobs[0].spec, &loaded.jobs[1].spec));
    assert!(!Arc::ptr_eq(&loaded.jobs[1].spec, &loaded.jobs[2].spec));
}

#[test]
fn a_set_whose_key_other_content_holds_moves_to_the_next_key() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let a = env("a");
    let (store, _) = Store::open(dir.path()).expect("open");
    let taken = content_key(&encode(&a));
    store
        .env_sets
        .tree
        .insert(taken.to_be_bytes(), encode(&env("other")))
        .expect("insert");
    submit(&store, &[pending(1, &a)]);
    assert_eq!(set_of(&store, 1), Some(taken.wrapping_add(1)));
    drop(store);
    let (store, loaded) = Store::open(dir.path()).expect("open again");
    assert_eq!(loaded_env(&loaded, 1), a);
    // The other content had no job: the first commit after open removes it.
    assert_eq!(store.env_sets.tree.len(), 2);
    store.collect_env_sets_if_due().expect("collect");
    assert_eq!(store.env_sets.tree.len(), 1);
}

/// Ends `jobs` and removes their records, as retention does.
fn end_and_forget(store: &Store, jobs: &[Job]) {
    let mut commit = store.begin();
    for job in jobs {
        let mut ended = job.clone();
        ended.state = gpool_core::JobState::Cancelled {
            started_at: None,
            ended_at: Timestamp(1),
            by: "alice".into(),
        };
        commit.job(&ended).expect("job");
    }
    commit.finish().expect("commit");
    let mut records = Records::default();
    for job in jobs {
        records.remove_job(job.id, Timestamp(1));
    }
    store.commit(records).expect("commit");
}

#[test]
fn sets_no_job_refers_to_go_after_enough_new_ones_and_once_after_open() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let kept = env("kept");
    let (store, _) = Store::open(dir.path()).expect("open");
    // The collection due after open: nothing to remove yet.
    store.collect_env_sets_if_due().expect("collect");
    submit(&store, &[pending(1, &kept)]);
    let gone: Vec<Job> = (2..2 + COLLECT_AFTER as u64)
        .map(|id| pending(id, &env(&id.to_string())))
        .collect();
    submit(&store, &gone[..1]);
    end_and_forget(&store, &gone[..1]);
    // Not due: the set of a job that ended and went stays for now.
    store.collect_env_sets_if_due().expect("collect");
    assert_eq!(store.env_sets.tree.len(), 2);
    submit(&store, &gone[1..]);
    assert_eq!(store.env_sets.tree.len(), 1 + COLLECT_AFTER);
    end_and_forget(&store, &gone[1..]);
    store.collect_env_sets_if_due().expect("collect");
    assert_eq!(store.env_sets.tree.len(), 1);
    // An environment whose set went is written again when a job has it.
    submit(&store, &[pending(900, &gone[0].spec.env)]);
    assert_eq!(store.env_sets.tree.len(), 2);
    end_and_forget(&store, &[pending(900, &gone[0].spec.env)]);
    drop(store);
    let (store, loaded) = Store::open(dir.path()).expect("open again");
    assert_eq!(store.env_sets.tree.len(), 2, "not at open: at the first commit after");
    store.collect_env_sets_if_due().expect("collect");
    assert_eq!(store.env_sets.tree.len(), 1);
    assert_eq!(loaded_env(&loaded, 1), kept);
}

#[test]
fn schema_5_entries_move_into_the_records_and_envs_is_emptied() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let (a, b) = (env("a"), env("b"));
    {
        let (store, _) = Store::open(dir.path()).expect("open");
        // As schema 5 wrote them: records without a header; job 1's
        // environment whole (as schemas 3 and 4 wrote it), job 2's a
        // reference to a set; job 3 has none.
        for id in 1..=3u64 {
            let job = pending(id, &Env::default());
            store.jobs.insert(id.to_be_bytes(), encode(&job)).expect("insert");
        }
        store.envs.insert(1u64.to_be_bytes(), encode(&a)).expect("insert");
        let set = content_key(&encode(&b));
        store
            .env_sets
            .tree
            .insert(set.to_be_bytes(), encode(&b))
            .expect("insert");
        let mut reference = vec![b'@'];
        reference.extend_from_slice(&set.to_be_bytes());
        store.envs.insert(2u64.to_be_bytes(), reference).expect("insert");
        store.meta.insert(META_SCHEMA, &5u32.to_be_bytes()).expect("insert");
        store.db.flush().expect("flush");
    }
    let (store, loaded) = Store::open(dir.path()).expect("open again");
    assert_eq!(loaded_env(&loaded, 1), a);
    assert_eq!(loaded_env(&loaded, 2), b);
    assert!(loaded_env(&loaded, 3).is_empty());
    assert!(store.envs.is_empty());
    assert_eq!(set_of(&store, 2), Some(content_key(&encode(&b))));
    assert!(set_of(&store, 1).is_some());
    assert_eq!(set_of(&store, 3), None);
    let schema = store.meta.get(META_SCHEMA).expect("read").expect("a schema");
    assert_eq!(schema.as_ref(), SCHEMA_VERSION.to_be_bytes());
}

#[test]
fn a_batch_dropped_unwritten_leaves_its_sets_unknown() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let a = env("a");
    let (store, _) = Store::open(dir.path()).expect("open");
    let mut commit = store.begin();
    commit.job(&pending(1, &a)).expect("job");
    drop(commit);
    // Had the set stayed known, this batch would refer to a set sled
    // never got.
    submit(&store, &[pending(2, &a)]);
    drop(store);
    let (_, loaded) = Store::open(dir.path()).expect("open again");
    assert_eq!(loaded_env(&loaded, 2), a);
    assert!(loaded.jobs.iter().all(|job| job.id != JobId(1)));
}

#[test]
fn schema_5_takes_a_sealed_jobs_environment_from_its_file_and_leaves_a_damaged_record() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let a = env("a");
    {
        let (store, _) = Store::open(dir.path()).expect("open");
        // Job 7 ended, was sealed with its environment, and was written
        // again since: schema 5 had no `envs` entry left for it.
        let mut job = pending(7, &Env::default());
        job.state = gpool_core::JobState::Cancelled {
            started_at: None,
            ended_at: Timestamp(7_000),
            by: "alice".into(),
        };
        let record = Record {
            key: 7u64.to_be_bytes().to_vec(),
            at: 7_000,
            value: encode(&job),
            extra: Some(encode(&a)),
        };
        store.job_files.seal([Ok(record)].into_iter()).expect("seal");
        Arc::make_mut(&mut job.spec).name = "again".into();
        store.ended.insert(7u64.to_be_bytes(), encode(&job)).expect("insert");
        // Job 5's record is damaged: left as it was, as a read finds it.
        store
            .ended
            .insert(5u64.to_be_bytes(), &[RECORD_VERSION, b'{'][..])
            .expect("insert");
        store.meta.insert(META_SCHEMA, &5u32.to_be_bytes()).expect("insert");
        store.db.flush().expect("flush");
    }
    let (store, loaded) = Store::open(dir.path()).expect("open again");
    let ended = loaded.ended.get(JobId(7)).expect("read").expect("job 7");
    assert_eq!(ended.spec.name, "again");
    assert_eq!(loaded.ended.with_env(ended).expect("read").spec.env, a);
    let record = store.ended.get(7u64.to_be_bytes()).expect("read").expect("job 7");
    assert_eq!(env_set_of(&record), Some(content_key(&encode(&a))));
    let damaged = store.ended.get(5u64.to_be_bytes()).expect("read").expect("job 5");
    assert_eq!(&damaged[..], &[RECORD_VERSION, b'{'][..]);
    assert!(loaded.ended.get(JobId(5)).is_err());
}
