//! Environments stored once: shared sets, keys taken by other content,
//! sets no job refers to, entries of the older schema, dropped batches.

use super::*;

type Env = Arc<[(String, String)]>;

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

/// Submits `jobs` as the state task writes them: record and environment.
fn submit(store: &Store, jobs: &[Job]) {
    let mut commit = store.begin();
    for job in jobs {
        commit.records.job(job);
        commit.job_env(job).expect("env");
    }
    commit.finish().expect("commit");
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
        submit(&store, &[pending(3, &b), pending(4, &a)]);
        assert_eq!(store.env_sets.tree.len(), 2);
        for entry in store.envs.iter() {
            assert_eq!(entry.expect("read").1.len(), 9, "a reference, not the environment");
        }
    }
    let (_, loaded) = Store::open(dir.path()).expect("open again");
    assert_eq!(loaded_env(&loaded, 1), a);
    assert_eq!(loaded_env(&loaded, 3), b);
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
    let stored = store.envs.get(1u64.to_be_bytes()).expect("read").expect("entry");
    assert_eq!(&stored[..], &reference(taken.wrapping_add(1))[..]);
    drop(store);
    let (store, loaded) = Store::open(dir.path()).expect("open again");
    assert_eq!(loaded_env(&loaded, 1), a);
    // The other content had no job: the open removed it.
    assert_eq!(store.env_sets.tree.len(), 1);
}

#[test]
fn sets_no_job_refers_to_go_at_open_and_after_enough_new_ones() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let kept = env("kept");
    let (store, _) = Store::open(dir.path()).expect("open");
    submit(&store, &[pending(1, &kept)]);
    let gone: Vec<Job> = (2..2 + COLLECT_AFTER as u64)
        .map(|id| pending(id, &env(&id.to_string())))
        .collect();
    submit(&store, &gone);
    assert_eq!(store.env_sets.tree.len(), 1 + COLLECT_AFTER);
    let mut records = Records::default();
    for job in &gone {
        records.remove_job(job.id, Timestamp(1));
    }
    store.commit(records).expect("commit");
    store.collect_env_sets_if_due().expect("collect");
    assert_eq!(store.env_sets.tree.len(), 1);
    // An environment whose set went is written again when a job has it.
    submit(&store, &[pending(900, &gone[0].spec.env)]);
    assert_eq!(store.env_sets.tree.len(), 2);
    let mut records = Records::default();
    records.remove_job(JobId(900), Timestamp(1));
    store.commit(records).expect("commit");
    drop(store);
    let (store, loaded) = Store::open(dir.path()).expect("open again");
    assert_eq!(store.env_sets.tree.len(), 1);
    assert_eq!(loaded_env(&loaded, 1), kept);
}

#[test]
fn an_environment_stored_whole_by_an_older_schema_still_loads() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let a = env("a");
    {
        let (store, _) = Store::open(dir.path()).expect("open");
        let mut records = Records::default();
        records.job(&pending(1, &a));
        store.commit(records).expect("commit");
        store.envs.insert(1u64.to_be_bytes(), encode(&a)).expect("insert");
        submit(&store, &[pending(2, &a)]);
    }
    let (_, loaded) = Store::open(dir.path()).expect("open again");
    assert_eq!(loaded_env(&loaded, 1), a);
    assert_eq!(loaded_env(&loaded, 2), a);
}

#[test]
fn a_batch_dropped_unwritten_leaves_its_sets_unknown() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let a = env("a");
    let (store, _) = Store::open(dir.path()).expect("open");
    let mut commit = store.begin();
    commit.job_env(&pending(1, &a)).expect("env");
    drop(commit);
    // Had the set stayed known, this batch would refer to a set sled
    // never got.
    submit(&store, &[pending(2, &a)]);
    drop(store);
    let (_, loaded) = Store::open(dir.path()).expect("open again");
    assert_eq!(loaded_env(&loaded, 2), a);
    assert!(loaded.jobs.iter().all(|job| job.id != JobId(1)));
}
