//! A spec checked from any source, field by field: every refusal names
//! its field and the reason.

use super::*;

impl JobSpec {
    fn validate_requirements(&self) -> Result<(), SpecError> {
        let requires = &self.requires;
        for (field, names) in [("nodelist", &requires.nodelist), ("exclude", &requires.exclude)] {
            if names.len() > MAX_REQUIREMENT_ITEMS {
                return Err(spec_error(
                    field,
                    format!("{} nodes, more than the limit of {MAX_REQUIREMENT_ITEMS}", names.len()),
                ));
            }
            for name in names {
                validate_ident(field, name)?;
            }
        }
        if requires.constraints.len() > MAX_REQUIREMENT_ITEMS {
            return Err(spec_error(
                "constraint",
                format!(
                    "{} labels, more than the limit of {MAX_REQUIREMENT_ITEMS}",
                    requires.constraints.len()
                ),
            ));
        }
        for (key, value) in &requires.constraints {
            if key.is_empty() || key.len() > 63 || value.len() > 253 {
                return Err(spec_error(
                    "constraint",
                    format!("{key:.63?} needs a key of 1 to 63 bytes and a value of at most 253"),
                ));
            }
        }
        if let Some(both) = requires.nodelist.iter().find(|n| requires.exclude.contains(n)) {
            return Err(spec_error(
                "exclude",
                format!("node {both} is in both nodelist and exclude"),
            ));
        }
        if !requires.nodelist.is_empty() && (requires.nodelist.len() as u64) < u64::from(self.nodes) {
            return Err(spec_error(
                "nodelist",
                format!(
                    "names {} nodes, fewer than the job's {} nodes",
                    requires.nodelist.len(),
                    self.nodes
                ),
            ));
        }
        Ok(())
    }

    /// An interactive job has one terminal: one node, on the host, its
    /// output in the spool, no array.
    fn validate_interactive(&self) -> Result<(), SpecError> {
        let clash = if self.nodes > 1 {
            Some("a gang on several nodes")
        } else if self.array.is_some() {
            Some("an array")
        } else if !self.image.is_empty() {
            Some("a container image")
        } else if self.discard_output || !self.stdout_path.is_empty() || !self.stderr_path.is_empty() {
            Some("output files of its own (its terminal is its output)")
        } else {
            None
        };
        match clash {
            Some(what) => Err(spec_error("pty", format!("an interactive job cannot have {what}"))),
            None => Ok(()),
        }
    }

    /// Checks a spec from any source (the controller validates every spec
    /// it receives, whatever the client checked).
    pub fn validate(&self) -> Result<(), SpecError> {
        validate_command(&self.command)?;
        self.validate_extras()?;
        validate_name(&self.name)?;
        if self.pty.is_some() {
            self.validate_interactive()?;
        }
        self.validate_shape()?;
        self.validate_limits()?;
        self.validate_env_vars()?;
        self.validate_outputs()?;
        validate_workdir(&self.workdir)
    }

    /// Its start time, reservation, notification target and batch script.
    fn validate_extras(&self) -> Result<(), SpecError> {
        if let Some(begin) = &self.begin {
            begin.check().map_err(|reason| spec_error("begin", reason))?;
        }
        if !self.reservation.is_empty() && !name_ok_for_reservation(&self.reservation) {
            return Err(spec_error(
                "reservation",
                format!("{:?} is not a reservation's name", self.reservation),
            ));
        }
        if let Some(notify) = &self.notify {
            // As it came over the wire: the target as --notify takes it.
            let parsed =
                crate::model::Notify::parse(&notify.to, Some("all")).map_err(|reason| spec_error("notify", reason))?;
            // The pool's prefixes are checked against where it really goes.
            if parsed.to != notify.to {
                return Err(spec_error(
                    "notify",
                    format!("{:?} is not in its plain form: send {:?}", notify.to, parsed.to),
                ));
            }
        }
        if let Some(script) = &self.script {
            if script.at as usize >= self.command.len() {
                return Err(spec_error("script", "names no word of the command"));
            }
            if script.text.len() > crate::model::MAX_SCRIPT_BYTES {
                return Err(spec_error(
                    "script",
                    format!(
                        "{} bytes, more than {} MiB",
                        script.text.len(),
                        crate::model::MAX_SCRIPT_BYTES >> 20
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Its GPUs, nodes, dependencies, models, requirements and names.
    fn validate_shape(&self) -> Result<(), SpecError> {
        if !(1..=MAX_GPUS_PER_NODE).contains(&self.gpus_per_node) {
            return Err(spec_error(
                "gpus",
                format!("must be 1 to {MAX_GPUS_PER_NODE}, got {}", self.gpus_per_node),
            ));
        }
        if !(1..=MAX_NODES).contains(&self.nodes) {
            return Err(spec_error(
                "nodes",
                format!("must be 1 to {MAX_NODES}, got {}", self.nodes),
            ));
        }
        if self.dependencies.len() > crate::deps::MAX_DEPENDENCIES {
            return Err(spec_error(
                "dependency",
                format!(
                    "{} jobs, more than the limit of {}",
                    self.dependencies.len(),
                    crate::deps::MAX_DEPENDENCIES
                ),
            ));
        }
        if self.gpu_types.len() > MAX_GPU_TYPES {
            return Err(spec_error(
                "gpu_type",
                format!(
                    "{} models, more than the limit of {MAX_GPU_TYPES}",
                    self.gpu_types.len()
                ),
            ));
        }
        for model in &self.gpu_types {
            validate_ident("gpu_type", model.as_str())?;
        }
        self.validate_requirements()?;
        self.validate_share()?;
        for (field, value) in [
            ("team", self.team.as_str()),
            ("project", self.project.as_str()),
            ("workload_type", self.workload_type.as_str()),
            ("pool", self.pool.as_str()),
        ] {
            if !value.is_empty() {
                validate_ident(field, value)?;
            }
        }
        Ok(())
    }

    /// A fraction of a GPU is one GPU on one node, asked one way.
    fn validate_share(&self) -> Result<(), SpecError> {
        let Some(ask) = &self.gpu_share else {
            return Ok(());
        };
        let field = if ask.memory_mib > 0 { "gpu_mem" } else { "gpu_fraction" };
        let whole = if self.nodes > 1 || self.gpus_per_node > 1 {
            Some("a gang or a job of several GPUs")
        } else if self.requires.nvlink == crate::model::NvlinkNeed::Required {
            Some("an --nvlink job")
        } else if self.exclusive {
            Some("an --exclusive job")
        } else {
            None
        };
        if let Some(what) = whole {
            return Err(spec_error(
                field,
                format!("a fraction is of one GPU on one node: {what} asks for whole GPUs"),
            ));
        }
        if (ask.memory_mib > 0) == (ask.fraction_milli > 0) {
            return Err(spec_error(field, "give --gpu-mem or --gpu-fraction, one of the two"));
        }
        if ask.fraction_milli >= 1000 || ask.compute_pct > 100 {
            return Err(spec_error(
                field,
                "a fraction is below 1 and a compute share at most 100%",
            ));
        }
        Ok(())
    }

    /// Its time limit, grace and checkpoint signal.
    fn validate_limits(&self) -> Result<(), SpecError> {
        if self.time_limit_secs == Some(0) {
            return Err(spec_error("time", "must be more than zero"));
        }
        if let Some(limit) = self.time_limit_secs.filter(|limit| *limit > MAX_TIME_LIMIT_SECS) {
            return Err(spec_error(
                "time",
                format!("{} is more than the longest time limit, 365d", format_duration(limit)),
            ));
        }
        if let Some(grace) = self.grace_secs.filter(|grace| *grace > MAX_TIME_LIMIT_SECS) {
            return Err(spec_error(
                "grace",
                format!("{} is more than the longest grace, 365d", format_duration(grace)),
            ));
        }
        if let Some(signal) = self.checkpoint_signal {
            parse_signal(&signal.to_string()).map_err(|reason| spec_error("checkpoint_signal", reason))?;
        }
        Ok(())
    }

    /// Its environment: how many variables, how large, and each one.
    fn validate_env_vars(&self) -> Result<(), SpecError> {
        if self.env.len() > MAX_ENV_VARS {
            return Err(spec_error(
                "env",
                format!("{} variables, more than the limit of {MAX_ENV_VARS}", self.env.len()),
            ));
        }
        let env_bytes: usize = self.env.iter().map(|(name, value)| name.len() + value.len() + 2).sum();
        if env_bytes > MAX_ENV_BYTES {
            return Err(spec_error(
                "env",
                format!("{env_bytes} bytes in all, more than the limit of {MAX_ENV_BYTES}"),
            ));
        }
        for (name, value) in self.env.iter() {
            validate_env(name, value)?;
        }
        Ok(())
    }

    /// Its image, array and output files.
    fn validate_outputs(&self) -> Result<(), SpecError> {
        validate_image(&self.image)?;
        if let Some(array) = &self.array {
            array.validate()?;
            if self.singleton {
                return Err(spec_error(
                    "dependency",
                    "singleton does not go with an array (use %1 to run one task at a time)",
                ));
            }
        }
        for (field, path) in [("stdout", &self.stdout_path), ("stderr", &self.stderr_path)] {
            validate_output_path(field, path)?;
            // A container's runtime runs as the node's agent user, not the
            // job's: it may not open files the job names.
            if !self.image.is_empty() && !path.is_empty() {
                return Err(spec_error(
                    field,
                    "a container job's output stays in the spool (gpool logs); -o/-e are for jobs on the host",
                ));
            }
            if self.discard_output && !path.is_empty() {
                return Err(spec_error(field, "a file is named, and the output is to be discarded"));
            }
        }
        Ok(())
    }
}
