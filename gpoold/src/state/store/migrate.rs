//! Migration from an older schema, at open (`Store::check_schema`).

use super::*;

impl Store {
    /// From schema `found` to this one, as one batch; the schema says so
    /// once that is on disk. To 2: ended jobs move from `jobs` to `ended`.
    /// To 3: each job's environment moves out of its record to `envs`. To
    /// 4 and 5: nothing moves. To 6: every job's record is written again,
    /// referring to its environment's set, and `envs` is emptied.
    pub(super) fn migrate(&self, found: u32) -> Result<(), Error> {
        let mut commit = self.begin();
        let (mut n_moved, mut n_rewritten) = (0, 0);
        for (tree, name) in [(&self.jobs, "jobs"), (&self.ended, "ended")] {
            for entry in tree.iter() {
                let (key, value) = entry?;
                // Written by this schema (a migration cut short): as is.
                if value.first() == Some(&JOB_RECORD) {
                    continue;
                }
                let job = match self.job_before_schema_6(found, name, &key, &value) {
                    Ok(job) => job,
                    // An ended job that does not read is left as it was:
                    // the upgrade is no stricter than a read of it.
                    Err(err) if name == "ended" => {
                        tracing::warn!("schema {found} -> {SCHEMA_VERSION}: {err}; left as it was");
                        continue;
                    }
                    Err(err) => return Err(err),
                };
                if found < 2 && job.state.is_finished() {
                    n_moved += 1;
                }
                commit.job(&job)?;
                commit.spill_if_full()?;
                n_rewritten += 1;
            }
        }
        commit.finish()?;
        self.db.flush()?;
        // Every record refers to its set now: the old entries can go.
        self.envs.clear()?;
        self.meta.insert(META_SCHEMA, &SCHEMA_VERSION.to_be_bytes())?;
        self.db.flush()?;
        tracing::info!(
            "schema {found} -> {SCHEMA_VERSION}: {n_rewritten} job records written again, {n_moved} of them ended jobs moved to their own tree"
        );
        Ok(())
    }

    /// A job's record as schema `found` wrote it, with its environment:
    /// inline before schema 3; since, its `envs` entry (the environment or
    /// a reference to its set) or, sealed once and written again since,
    /// its history file's.
    fn job_before_schema_6(&self, found: u32, tree: &'static str, key: &[u8], value: &[u8]) -> Result<Job, Error> {
        let mut job: Job = decode(tree, key, value)?;
        if found < 3 {
            return Ok(job);
        }
        let env = match self.envs.get(key)? {
            Some(value) => Some(resolve(&self.env_sets.tree, key, value)?),
            None => self
                .job_files
                .get(key)?
                .and_then(|record| record.extra)
                .map(sled::IVec::from),
        };
        if let Some(env) = env {
            let env: Vec<(String, String)> = decode("envs", key, &env)?;
            Arc::make_mut(&mut job.spec).env = env.into();
        }
        Ok(job)
    }
}
