//! Job specs as users write them (CLI flags, `[[job]]` tables in TOML files)
//! and their validation. Every rejection names the field and the reason.

use crate::model::{GpuModel, JobSpec, NvlinkNeed, Requirements};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::fmt;

mod export;
mod fields;
pub mod gpus;
mod job_file;
mod units;
mod validate;
use fields::*;
pub use job_file::parse_job_file;

pub use export::*;
pub use units::*;

/// Most GPUs per node and nodes per gang a spec may ask for.
pub const MAX_GPUS_PER_NODE: u32 = 1024;
pub const MAX_NODES: u32 = 1024;
const MAX_NAME_LEN: usize = 128;
/// A year: longer limits are surely typos, and keep time arithmetic safe.
pub const MAX_TIME_LIMIT_SECS: u64 = 365 * 24 * 3600;
const MAX_IDENT_LEN: usize = 64;
const MAX_CPUS_PER_GPU: u32 = 1024;
/// Limits that keep every spec (and so every Launch) far below the
/// largest message any gpool program takes, and within what Linux execs:
/// one argument or variable may be at most 128 KiB (MAX_ARG_STRLEN).
pub const MAX_ARG_BYTES: usize = 128 * 1024;
pub const MAX_ARGS: usize = 4096;
pub const MAX_COMMAND_BYTES: usize = 512 * 1024;
pub const MAX_ENV_VARS: usize = 1024;
pub const MAX_ENV_BYTES: usize = 512 * 1024;
pub const MAX_PATH_BYTES: usize = 4096;
pub const MAX_GPU_TYPES: usize = 64;

/// A rejected spec: the field and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct SpecError {
    pub field: String,
    pub reason: String,
}

/// `text`, where given, parsed by `parse`; its error names `field`.
fn optional<T>(
    field: &str,
    text: Option<&str>,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<Option<T>, SpecError> {
    text.map(parse).transpose().map_err(|reason| spec_error(field, reason))
}

pub fn spec_error(field: &str, reason: impl Into<String>) -> SpecError {
    SpecError {
        field: field.to_string(),
        reason: reason.into(),
    }
}

/// A job file that could not be used: which file, which line, what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct JobFileError {
    pub file: String,
    /// 1-based; `None` when the problem is the whole file.
    pub line: Option<usize>,
    pub message: String,
}

impl fmt::Display for JobFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{}: {}", self.file, line, self.message),
            None => write!(f, "{}: {}", self.file, self.message),
        }
    }
}

/// A command as a list of arguments, or one string run by `/bin/sh -c`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum CommandInput {
    Argv(Vec<String>),
    Shell(String),
}

/// One or several strings (`gpu_type = "h100"` or `["h100", "a100"]`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A job as written by a user, before defaults and validation. The TOML
/// `[[job]]` table has exactly these fields; CLI flags fill the same struct.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpecInput {
    pub name: Option<String>,
    pub command: Option<CommandInput>,
    pub gpus: Option<i64>,
    pub nodes: Option<i64>,
    pub gpu_type: Option<OneOrMany>,
    pub team: Option<String>,
    pub project: Option<String>,
    pub workload_type: Option<String>,
    /// `30`, `90s`, `2h`, `1h30m`, `2:00:00`, `1-12:00:00`.
    pub time: Option<String>,
    pub env: Option<BTreeMap<String, String>>,
    pub workdir: Option<String>,
    pub priority: Option<i32>,
    pub pool: Option<String>,
    /// `false`: fail instead of requeueing when the node is lost.
    pub requeue: Option<bool>,
    /// Send stdout and stderr to /dev/null instead of the spool.
    pub discard_output: Option<bool>,
    pub qos: Option<String>,
    /// `USR1`, `SIGUSR1` or a number: sent when the job is preempted.
    pub checkpoint_signal: Option<String>,
    /// Between the checkpoint signal and the kill (a duration).
    pub grace: Option<String>,
    /// An OCI image to run the command in.
    pub image: Option<String>,
    /// Memory limit per node: `64G`, `512M`, `1T` or bytes; or per GPU.
    pub mem: Option<String>,
    pub mem_per_gpu: Option<String>,
    /// The most its stdout or stderr may hold on a node: `1G`, `100M`.
    pub max_output: Option<String>,
    /// A batch script's text (`gpool submit SCRIPT`, never a job file).
    #[serde(skip)]
    pub script: Option<crate::model::BatchScript>,
    /// Not before: `now+1h`, `30m`, `2026-11-28`, `2026-11-28T16:00` (UTC).
    pub begin: Option<String>,
    /// The reservation it runs in: only its nodes, only while it is open.
    pub reservation: Option<String>,
    /// Where to say it started or ended: `https://...` (a JSON POST) or
    /// `mail:ADDR`.
    pub notify: Option<String>,
    /// When: `start`, `end`, `fail`, `all` (comma-separated; default `end`).
    pub notify_on: Option<String>,
    /// CPUs per GPU (a CPU quota).
    pub cpus_per_gpu: Option<i64>,
    /// Its nodes run nothing else: it takes every GPU of each.
    pub exclusive: Option<bool>,
    /// `afterok:ID[:ID],afterany:NAME,afternotok:ID,singleton`; in a job
    /// file, NAME is an earlier `[[job]]` of the same file.
    pub dependency: Option<String>,
    /// Task indices of a job array: `0-999`, `1,3,5-9`, `0-99:10`, with
    /// `%N` to run at most N at once.
    pub array: Option<String>,
    /// Files for stdout and stderr instead of the node's spool: patterns
    /// with `%j` job id, `%A` array id, `%a` task index, `%n` node, `%t`
    /// rank, `%u` user, `%x` job name.
    pub stdout: Option<String>,
    pub stderr: Option<String>,
    /// Each GPU has at least this much memory: `40G`, `80G` (decimal units,
    /// as GPU makers count: `80G` takes an 80 GB H100).
    pub min_gpu_memory: Option<String>,
    /// `required`: only GPUs all joined by NVLink; `preferred`: those first;
    /// `any` (default).
    pub nvlink: Option<String>,
    /// Node labels that must all match: `key=value[,key=value]`.
    pub constraint: Option<OneOrMany>,
    /// Only these nodes (`n1,n2`).
    pub nodelist: Option<OneOrMany>,
    /// Never these nodes.
    pub exclude: Option<OneOrMany>,
    /// A fraction of one GPU: this much of its memory (`20G`), or this
    /// part of it (`0.25`), and at most this much of its compute (`30%`).
    pub gpu_mem: Option<String>,
    pub gpu_fraction: Option<String>,
    pub gpu_share: Option<String>,
}

impl JobSpecInput {
    /// Fills defaults and validates. An empty team or pool is left for the
    /// controller to resolve (the user's default team, the default pool).
    pub fn into_spec(self) -> Result<JobSpec, SpecError> {
        self.into_spec_among(&|_| None)
    }

    /// As `into_spec`, with `name_of` resolving dependency names (the
    /// earlier jobs of the same file).
    pub fn into_spec_among(
        self,
        name_of: &dyn Fn(&str) -> Option<crate::deps::DepTarget>,
    ) -> Result<JobSpec, SpecError> {
        let gpu_share = self.share_ask()?;
        let (dependencies, singleton) = match self.dependency.as_deref() {
            Some(text) => crate::deps::parse_dependencies(text, name_of)?,
            None => (Vec::new(), false),
        };
        let command = match self.command {
            Some(CommandInput::Argv(argv)) => argv,
            Some(CommandInput::Shell(line)) => vec!["/bin/sh".into(), "-c".into(), line],
            None => Vec::new(),
        };
        let name = match self.name {
            Some(name) => name,
            None => default_name(&command),
        };
        let time_limit_secs = optional("time", self.time.as_deref(), parse_duration)?;
        let spec = JobSpec {
            name,
            command,
            gpus_per_node: count_field("gpus", self.gpus.unwrap_or(1), MAX_GPUS_PER_NODE)?,
            nodes: count_field("nodes", self.nodes.unwrap_or(1), MAX_NODES)?,
            gpu_types: match self.gpu_type {
                None => Vec::new(),
                Some(OneOrMany::One(one)) => split_list(&one),
                Some(OneOrMany::Many(many)) => many.iter().map(|m| GpuModel::new(m)).collect(),
            },
            team: self.team.unwrap_or_default().into(),
            project: self.project.unwrap_or_default(),
            workload_type: self.workload_type.unwrap_or_default(),
            time_limit_secs,
            env: self.env.unwrap_or_default().into_iter().collect(),
            workdir: self.workdir.unwrap_or_default(),
            priority: self.priority.unwrap_or(0),
            pool: self.pool.unwrap_or_default().into(),
            requeue: self.requeue.unwrap_or(true),
            discard_output: self.discard_output.unwrap_or(false),
            qos: self.qos.unwrap_or_default().into(),
            checkpoint_signal: optional("checkpoint_signal", self.checkpoint_signal.as_deref(), parse_signal)?,
            grace_secs: optional("grace", self.grace.as_deref(), parse_duration)?,
            image: self.image.unwrap_or_default(),
            mem_bytes: memory_per_node(self.mem.as_deref(), self.mem_per_gpu.as_deref(), self.gpus.unwrap_or(1))?,
            max_output_bytes: optional("max_output", self.max_output.as_deref(), parse_size)?,
            script: self.script,
            reservation: reservation_of(self.reservation)?,
            begin: optional("begin", self.begin.as_deref(), crate::model::Begin::parse)?,
            notify: notify_of(self.notify.as_deref(), self.notify_on.as_deref())?,
            cpus_per_gpu: match self.cpus_per_gpu {
                Some(cpus) => Some(count_field("cpus_per_gpu", cpus, MAX_CPUS_PER_GPU)?),
                None => None,
            },
            dependencies,
            singleton,
            exclusive: self.exclusive.unwrap_or(false),
            pty: None,
            hold: false,
            tasks_per_node: 0,
            array: match self.array.as_deref() {
                Some(text) => Some(Box::new(crate::array::ArraySpec::parse(text)?)),
                None => None,
            },
            stdout_path: self.stdout.unwrap_or_default(),
            stderr_path: self.stderr.unwrap_or_default(),
            requires: requirements_of(
                (self.min_gpu_memory.as_deref(), self.nvlink.as_deref()),
                self.constraint,
                (self.nodelist, self.exclude),
            )?,
            gpu_share,
        };
        spec.validate()?;
        Ok(spec)
    }

    /// `gpu_mem` or `gpu_fraction` (not both), with `gpu_share`.
    fn share_ask(&self) -> Result<Option<crate::share::ShareAsk>, SpecError> {
        use crate::share::ShareAsk;
        let compute_pct = optional("gpu_share", self.gpu_share.as_deref(), ShareAsk::parse_compute)?.unwrap_or(0);
        let ask = match (self.gpu_mem.as_deref(), self.gpu_fraction.as_deref()) {
            (Some(_), Some(_)) => return Err(spec_error("gpu_fraction", "give --gpu-mem or --gpu-fraction, not both")),
            (Some(memory), None) => ShareAsk {
                memory_mib: parse_size(memory).map_err(|reason| spec_error("gpu_mem", reason))? >> 20,
                ..ShareAsk::default()
            },
            (None, Some(fraction)) => ShareAsk {
                fraction_milli: ShareAsk::parse_fraction(fraction)
                    .map_err(|reason| spec_error("gpu_fraction", reason))?,
                ..ShareAsk::default()
            },
            (None, None) if compute_pct > 0 => {
                return Err(spec_error(
                    "gpu_share",
                    "a compute share goes with --gpu-mem or --gpu-fraction",
                ))
            }
            (None, None) => return Ok(None),
        };
        Ok(Some(ShareAsk { compute_pct, ..ask }))
    }
}

/// `h100,a100-80gb` into models; empty items are dropped (and then refused
/// by validation if nothing is left).
/// A list given as one comma-separated string or as an array.
fn names(list: Option<OneOrMany>) -> Vec<String> {
    let items = match list {
        None => Vec::new(),
        Some(OneOrMany::One(one)) => vec![one],
        Some(OneOrMany::Many(many)) => many,
    };
    items
        .iter()
        .flat_map(|item| item.split(','))
        .map(str::trim)
        .filter(|name| !name.is_empty())
        .map(str::to_string)
        .collect()
}

fn parse_constraints(pairs: &[String]) -> Result<BTreeMap<String, String>, SpecError> {
    pairs
        .iter()
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => Ok((key.trim().to_string(), value.trim().to_string())),
            _ => Err(spec_error(
                "constraint",
                format!("{pair:?} is not key=value (a node label)"),
            )),
        })
        .collect()
}

/// GPU memory in MiB from `40G`, `80GB`, `1.5T`, `24576M`: decimal units,
/// as GPU makers name their cards (an "80GB" H100 has 81,559 MiB, more
/// than 80 GB but less than 80 GiB).
pub fn parse_gpu_memory(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let bad = || format!("{text:?} is not a GPU memory size such as 40G or 80G");
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale = match unit.trim().to_ascii_uppercase().trim_end_matches('B') {
        "M" => 1e6,
        "G" | "" => 1e9,
        "T" => 1e12,
        _ => return Err(bad()),
    };
    let value: f64 = number.parse().map_err(|_| bad())?;
    let mib = (value * scale / (1024.0 * 1024.0)).ceil();
    if !(1.0..=1e9).contains(&mib) {
        return Err(bad());
    }
    Ok(mib as u64)
}

fn split_list(text: &str) -> Vec<GpuModel> {
    text.split(',')
        .map(GpuModel::new)
        .filter(|model| !model.as_str().is_empty())
        .collect()
}

fn default_name(command: &[String]) -> String {
    let program = match command {
        [shell, flag, line] if shell == "/bin/sh" && flag == "-c" => line.split_whitespace().next().unwrap_or("job"),
        [first, ..] => first.as_str(),
        [] => "job",
    };
    let base = program.rsplit('/').next().unwrap_or(program);
    base.chars().take(MAX_NAME_LEN).collect()
}

fn count_field(field: &str, value: i64, max: u32) -> Result<u32, SpecError> {
    if value < 1 {
        return Err(spec_error(field, format!("must be at least 1, got {value}")));
    }
    u32::try_from(value)
        .ok()
        .filter(|count| *count <= max)
        .ok_or_else(|| spec_error(field, format!("must be at most {max}, got {value}")))
}

/// Most names in `--nodelist`, `--exclude` or `--constraint`.
pub const MAX_REQUIREMENT_ITEMS: usize = 256;

/// `--reservation`: a name as `[[reservation]]` gives them, or none.
fn reservation_of(name: Option<String>) -> Result<String, SpecError> {
    match name {
        Some(name) if !name_ok_for_reservation(&name) => Err(spec_error(
            "reservation",
            format!("{name:?} is not a reservation's name"),
        )),
        name => Ok(name.unwrap_or_default()),
    }
}

/// `--notify` and `--notify-on` (which needs `--notify`).
fn notify_of(to: Option<&str>, on: Option<&str>) -> Result<Option<crate::model::Notify>, SpecError> {
    match (to, on) {
        (Some(to), on) => Ok(Some(
            crate::model::Notify::parse(to, on).map_err(|reason| spec_error("notify", reason))?,
        )),
        (None, Some(_)) => Err(spec_error("notify_on", "give --notify too: where to say it")),
        (None, None) => Ok(None),
    }
}

/// `--min-gpu-memory`, `--nvlink`, `--constraint`, `--nodelist` and
/// `--exclude`, checked in that order.
fn requirements_of(
    (min_gpu_memory, nvlink): (Option<&str>, Option<&str>),
    constraint: Option<OneOrMany>,
    (nodelist, exclude): (Option<OneOrMany>, Option<OneOrMany>),
) -> Result<Requirements, SpecError> {
    Ok(Requirements {
        min_gpu_memory_mib: match min_gpu_memory {
            Some(text) => parse_gpu_memory(text).map_err(|reason| spec_error("min_gpu_memory", reason))?,
            None => 0,
        },
        nvlink: match nvlink {
            Some(text) => NvlinkNeed::parse(text.trim()).map_err(|reason| spec_error("nvlink", reason))?,
            None => NvlinkNeed::Any,
        },
        constraints: parse_constraints(&names(constraint))?,
        nodelist: names(nodelist),
        exclude: names(exclude),
    })
}

/// `K=V` as given to `--env`.
pub fn parse_env_assignment(text: &str) -> Result<(String, String), SpecError> {
    match text.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_string(), value.to_string())),
        _ => Err(spec_error("env", format!("{text:?} is not of the form NAME=VALUE"))),
    }
}

#[cfg(test)]
mod tests;
