//! Each sbatch option as gpool's flag for it: what Slurm means by the
//! value, checked here, so that a line gpool cannot honour is refused with
//! its line rather than later with none.

use super::values;
use super::{Context, Directive, Mapped, Refusal, SbatchFlags};

/// The fields of `gpool submit` each kind of request sets; a group of
/// several is one request given in different ways (GPUs as a total, per
/// node or as a gres): a script may give it one way only.
const GPU_FIELDS: &[&str] = &["gpus", "gpus_per_node", "gres"];
const MEM_FIELDS: &[&str] = &["mem", "mem_per_gpu"];
const CPU_FIELDS: &[&str] = &["cpus_per_task", "cpus_per_gpu"];

/// The gpool flags of one directive: each with the fields it sets.
pub(super) type Flags = Vec<(&'static [&'static str], Vec<String>)>;

/// Reads directives one at a time, for what one depends on another
/// (`--mail-type` needs `--mail-user`, `-n` is checked against `-N`).
pub(super) struct Reader<'a> {
    file: &'a str,
    context: &'a Context<'a>,
    out: SbatchFlags,
    /// `--mail-type`'s events (gpool's words; empty: NONE) and its line.
    mail_type: Option<(Vec<String>, usize, String)>,
    mail_user: Option<String>,
    /// `-n`'s count, its line and how it was written.
    ntasks: Option<(u32, usize, String)>,
    nodes: u32,
    /// `--ntasks-per-node`'s count, where given.
    tasks_per_node: Option<u32>,
}

impl<'a> Reader<'a> {
    pub(super) fn new(file: &'a str, context: &'a Context<'a>) -> Reader<'a> {
        Reader {
            file,
            context,
            out: SbatchFlags::default(),
            mail_type: None,
            mail_user: None,
            ntasks: None,
            nodes: 1,
            tasks_per_node: None,
        }
    }

    fn refusal(&self, line: usize, directive: &str, reason: String) -> Refusal {
        Refusal {
            file: self.file.to_string(),
            line,
            directive: directive.to_string(),
            reason,
        }
    }

    /// Takes one directive: maps it, passes it over, or refuses it.
    pub(super) fn take(&mut self, directive: Directive) -> Result<(), Refusal> {
        if let Some(why) = self.context.ignored(&directive.name) {
            self.out.ignored.push(format!(
                "{}:{}: #SBATCH {} passed over: {why}",
                self.file, directive.line, directive.written
            ));
            return Ok(());
        }
        let refuse = |reason: String| self.refusal(directive.line, &directive.written, reason);
        let Some(opt) = directive.opt else {
            return Err(refuse(unknown_reason(&directive.name)));
        };
        let value = directive.value.as_deref().unwrap_or_default().trim();
        let flags = match opt.long {
            "--mail-type" => {
                self.mail_type = Some((
                    values::mail_events(value).map_err(refuse)?,
                    directive.line,
                    directive.written,
                ));
                return Ok(());
            }
            "--mail-user" => {
                self.mail_user = Some(values::mail_user(value).map_err(refuse)?);
                return Ok(());
            }
            "--ntasks" => {
                let count = values::count(value).map_err(refuse)?;
                self.ntasks = Some((count, directive.line, directive.written));
                return Ok(());
            }
            "--nodes" => {
                self.nodes = values::nodes(value).map_err(refuse)?;
                vec![(&["nodes"][..], vec![format!("--nodes={}", self.nodes)])]
            }
            "--ntasks-per-node" => {
                let per_node = values::count(value).map_err(refuse)?;
                self.tasks_per_node = Some(per_node);
                vec![(&["ntasks_per_node"][..], vec![format!("--ntasks-per-node={per_node}")])]
            }
            _ => map_option(opt.long, directive.value.as_deref(), self.context).map_err(refuse)?,
        };
        self.push(opt.long, (directive.line, &directive.written), flags)
    }

    /// Adds a directive's flags: in place of the same option's earlier
    /// ones; refused where another option already made the same request.
    fn push(&mut self, option: &'static str, (line, written): (usize, &str), flags: Flags) -> Result<(), Refusal> {
        for (fields, words) in flags {
            let earlier = self.out.flags.iter().position(|mapped| mapped.fields == fields);
            if let Some(earlier_idx) = earlier {
                let other = &self.out.flags[earlier_idx];
                if fields.len() > 1 && other.option != option {
                    return Err(self.refusal(
                        line,
                        written,
                        format!(
                            "line {} asks for the same with {}: give it once, one way",
                            other.line, other.option
                        ),
                    ));
                }
                self.out.flags.remove(earlier_idx);
            }
            self.out.flags.push(Mapped {
                line,
                option,
                fields,
                words,
            });
        }
        Ok(())
    }

    /// What depends on several lines: `-n` against `-N`, `--mail-type`
    /// with `--mail-user`.
    pub(super) fn finish(mut self) -> Result<SbatchFlags, Refusal> {
        if let Some((ntasks, line, written)) = self.ntasks.take() {
            // -n spreads evenly over -N nodes, as the same tasks on each.
            let per_node = self.tasks_per_node.unwrap_or(ntasks / self.nodes.max(1)).max(1);
            if ntasks != self.nodes * per_node {
                return Err(self.refusal(
                    line,
                    &written,
                    format!(
                        "gpool runs the same number of tasks on each node, and {ntasks} tasks do not make {per_node} on each of {} node(s): give -n as -N times --ntasks-per-node",
                        self.nodes
                    ),
                ));
            }
            if self.tasks_per_node.is_none() && per_node > 1 {
                let flags = vec![(&["ntasks_per_node"][..], vec![format!("--ntasks-per-node={per_node}")])];
                self.push("--ntasks", (line, &written), flags)?;
            }
        }
        let Some((events, line, written)) = self.mail_type.take() else {
            return Ok(self.out);
        };
        if events.is_empty() {
            return Ok(self.out);
        }
        let Some(user) = self.mail_user.take() else {
            return Err(self.refusal(
                line,
                &written,
                "Slurm mails the submitting user; gpool mails an address: add --mail-user=NAME@HOST".into(),
            ));
        };
        let flags = vec![
            (&["notify"][..], vec![format!("--notify=mail:{user}")]),
            (&["notify_on"][..], vec![format!("--notify-on={}", events.join(","))]),
        ];
        self.push("--mail-type", (line, &written), flags)?;
        Ok(self.out)
    }
}

/// Why an option gpool does not read is refused.
fn unknown_reason(name: &str) -> String {
    let why = match name {
        "--mem-per-cpu" => "gpool limits memory per node (--mem) or per GPU (--mem-per-gpu)",
        "--time-min" => "gpool does not shorten a job's limit to start it sooner",
        "--reservation" => "write it as `#GPOOL --reservation NAME` (gpool's reservations are its own)",
        "--container-image" => "write it as `#GPOOL --image IMAGE`",
        "--tasks-per-node" => "gpool runs one task per node",
        _ => "gpool has no equivalent it can honour",
    };
    format!(
        "{name}: {why}; remove the line, or pass it over by listing it in {}",
        super::IGNORE_VAR
    )
}

/// The gpool flags of an option whose meaning is its value alone.
fn map_option(long: &str, value: Option<&str>, context: &Context<'_>) -> Result<Flags, String> {
    let text = value.unwrap_or_default().trim();
    let one =
        |fields: &'static [&'static str], flag: &str, value: String| vec![(fields, vec![format!("{flag}={value}")])];
    Ok(match long {
        "--job-name" => one(&["name"], "--name", values::not_empty(text)?),
        "--output" => one(&["stdout"], "--stdout", values::output_pattern(text)?),
        "--error" => one(&["stderr"], "--stderr", values::output_pattern(text)?),
        "--time" => one(&["time"], "--time", values::time_limit(text)?),
        "--gres" => one(GPU_FIELDS, "--gres", values::gres(text)?),
        "--gpus" => one(GPU_FIELDS, "--gpus", values::gpus(text)?),
        "--gpus-per-node" | "--gpus-per-task" => one(GPU_FIELDS, "--gpus-per-node", values::gpus(text)?),
        "--array" => one(&["array"], "--array", values::array(text)?),
        "--partition" => one(&["pool"], "--pool", values::single("partition", text)?),
        "--account" => one(&["team"], "--team", values::not_empty(text)?),
        "--qos" => one(&["qos"], "--qos", values::single("QoS", text)?),
        "--cpus-per-task" => one(CPU_FIELDS, "--cpus-per-task", values::count(text)?.to_string()),
        "--cpus-per-gpu" => one(CPU_FIELDS, "--cpus-per-gpu", values::count(text)?.to_string()),
        "--mem" => one(MEM_FIELDS, "--mem", values::memory(text)?),
        "--mem-per-gpu" => one(MEM_FIELDS, "--mem-per-gpu", values::memory(text)?),
        "--chdir" => one(&["workdir"], "--workdir", values::workdir(text, context.cwd)?),
        "--begin" => one(&["begin"], "--begin", values::begin(text, context.local_to_utc)?),
        "--dependency" => one(&["dependency"], "--dependency", values::dependency(text)?),
        "--nodelist" => one(&["nodelist"], "--nodelist", values::hostlist(text)?),
        "--exclude" => one(&["exclude"], "--exclude", values::hostlist(text)?),
        "--constraint" => one(&["constraint"], "--constraint", values::constraint(text)?),
        "--export" => one(&["export"], "--export", values::export(text)?),
        "--signal" => values::signal(text)?,
        "--exclusive" => match value {
            None => vec![(&["exclusive"][..], vec!["--exclusive".to_string()])],
            Some(kind) => return Err(format!(
                "--exclusive={kind}: gpool's --exclusive takes whole nodes for the job; it has no sharing by user, MCS label or topology"
            )),
        },
        "--hold" => vec![(&["hold"][..], vec!["--hold".to_string()])],
        "--requeue" => vec![(&["no_requeue"][..], Vec::new())],
        "--no-requeue" => vec![(&["no_requeue"][..], vec!["--no-requeue".to_string()])],
        other => return Err(unknown_reason(other)),
    })
}
