//! A Slurm batch script's `#SBATCH` lines, read as gpool submit flags: the
//! same leading comment block as `#GPOOL` lines, each of sbatch's options
//! mapped to gpool's flag for it, and every line gpool cannot honour
//! refused with its file, line and reason (never dropped silently).

use std::fmt;

mod map;
mod values;

pub use values::local_to_utc;

/// The environment variable that lists directives to pass over,
/// comma-separated (`--mail-type,--comment`): the operator's list.
pub const IGNORE_VAR: &str = "GPOOL_SBATCH_IGNORE";

/// Directives passed over always: they change sbatch's own messages or
/// the job's record, never where or how the job runs.
pub const ALWAYS_IGNORED: &[&str] = &["--comment", "--parsable", "--quiet", "--verbose", "--wckey"];

/// What the `#SBATCH` lines of a script ask, as gpool flags.
#[derive(Debug, Default)]
pub struct SbatchFlags {
    /// In the script's order; one sbatch option's flags replace its own
    /// earlier ones, as sbatch takes the last.
    pub flags: Vec<Mapped>,
    /// One line for each directive passed over, naming it and why.
    pub ignored: Vec<String>,
}

/// One directive's gpool flags, and the `gpool submit` fields they set: a
/// later layer (`#GPOOL` lines, the command line) that sets any of them
/// drops these.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapped {
    pub line: usize,
    /// sbatch's long name of the option (`--gres`).
    pub option: &'static str,
    pub fields: &'static [&'static str],
    pub words: Vec<String>,
}

/// A directive gpool cannot honour.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub file: String,
    pub line: usize,
    /// As written (`--gres=nvme:1`, `-n 4`).
    pub directive: String,
    pub reason: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}:{}: #SBATCH {}: {}",
            self.file, self.line, self.directive, self.reason
        )
    }
}

/// What the reading takes from outside the script.
pub struct Context<'a> {
    /// Directive names to pass over (`GPOOL_SBATCH_IGNORE`), as written.
    pub ignore: Vec<String>,
    /// The submitting shell's directory (`--chdir` is relative to it).
    pub cwd: &'a str,
    /// Slurm's dates are local time: this gives their UTC seconds.
    pub local_to_utc: &'a dyn Fn(time::PrimitiveDateTime) -> Option<i64>,
}

impl Context<'_> {
    /// Whether `option` (a long name, or a word no option of gpool's table
    /// has) is on the operator's list or the built-in one.
    fn ignored(&self, option: &str) -> Option<&'static str> {
        if ALWAYS_IGNORED.contains(&option) {
            return Some("it changes nothing of where or how a gpool job runs");
        }
        let listed = self.ignore.iter().any(|name| {
            let name = name.trim();
            name == option || Opt::by_word(name).is_some_and(|opt| opt.long == option)
        });
        listed.then_some("listed in GPOOL_SBATCH_IGNORE")
    }
}

/// How an option takes its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Arg {
    None,
    Required,
    /// Only as `--opt=value` (`--exclusive=user`).
    OptionalEq,
}

/// One of sbatch's options that gpool reads.
#[derive(Debug)]
struct Opt {
    long: &'static str,
    short: Option<char>,
    arg: Arg,
}

const fn opt(long: &'static str, short: Option<char>, arg: Arg) -> Opt {
    Opt { long, short, arg }
}

const OPTIONS: &[Opt] = &[
    opt("--job-name", Some('J'), Arg::Required),
    opt("--output", Some('o'), Arg::Required),
    opt("--error", Some('e'), Arg::Required),
    opt("--time", Some('t'), Arg::Required),
    opt("--nodes", Some('N'), Arg::Required),
    opt("--gres", None, Arg::Required),
    opt("--gpus", Some('G'), Arg::Required),
    opt("--gpus-per-node", None, Arg::Required),
    opt("--gpus-per-task", None, Arg::Required),
    opt("--array", Some('a'), Arg::Required),
    opt("--partition", Some('p'), Arg::Required),
    opt("--account", Some('A'), Arg::Required),
    opt("--qos", Some('q'), Arg::Required),
    opt("--cpus-per-task", Some('c'), Arg::Required),
    opt("--cpus-per-gpu", None, Arg::Required),
    opt("--mem", None, Arg::Required),
    opt("--mem-per-gpu", None, Arg::Required),
    opt("--chdir", Some('D'), Arg::Required),
    opt("--begin", Some('b'), Arg::Required),
    opt("--dependency", Some('d'), Arg::Required),
    opt("--exclusive", None, Arg::OptionalEq),
    opt("--nodelist", Some('w'), Arg::Required),
    opt("--exclude", Some('x'), Arg::Required),
    opt("--constraint", Some('C'), Arg::Required),
    opt("--requeue", None, Arg::None),
    opt("--no-requeue", None, Arg::None),
    opt("--signal", None, Arg::Required),
    opt("--mail-type", None, Arg::Required),
    opt("--mail-user", None, Arg::Required),
    opt("--hold", Some('H'), Arg::None),
    opt("--export", None, Arg::Required),
    opt("--ntasks", Some('n'), Arg::Required),
    opt("--ntasks-per-node", None, Arg::Required),
    opt("--comment", None, Arg::Required),
    opt("--parsable", None, Arg::None),
    opt("--quiet", Some('Q'), Arg::None),
    opt("--verbose", Some('v'), Arg::None),
];

impl Opt {
    /// The option a name stands for: `--gres`, `-G`.
    fn by_word(name: &str) -> Option<&'static Opt> {
        let mut chars = name.chars();
        match (chars.next(), chars.next(), chars.next()) {
            (Some('-'), Some('-'), _) => OPTIONS.iter().find(|opt| opt.long == name),
            (Some('-'), Some(short), None) => OPTIONS.iter().find(|opt| opt.short == Some(short)),
            _ => None,
        }
    }
}

/// One option of an `#SBATCH` line and its value.
#[derive(Debug)]
struct Directive {
    line: usize,
    written: String,
    /// sbatch's long name where gpool knows the option, else as written.
    name: String,
    opt: Option<&'static Opt>,
    value: Option<String>,
}

/// Reads the `#SBATCH` lines of `text` (the script `file`): from its top
/// (after a `#!` line) until the first line that is neither blank nor a
/// comment, as sbatch does.
pub fn read(file: &str, text: &str, context: &Context<'_>) -> Result<SbatchFlags, Refusal> {
    let mut reader = map::Reader::new(file, context);
    for (line_idx, line) in text.lines().enumerate() {
        let line = line.trim();
        if line_idx == 0 && line.starts_with("#!") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("#SBATCH") {
            if !rest.is_empty() && !rest.starts_with(char::is_whitespace) {
                continue;
            }
            for directive in directives(file, line_idx + 1, rest)? {
                reader.take(directive)?;
            }
        } else if !(line.is_empty() || line.starts_with('#')) {
            break;
        }
    }
    reader.finish()
}

/// The options of one `#SBATCH` line (`rest` follows `#SBATCH`).
fn directives(file: &str, line: usize, rest: &str) -> Result<Vec<Directive>, Refusal> {
    let refuse = |directive: &str, reason: String| Refusal {
        file: file.to_string(),
        line,
        directive: directive.to_string(),
        reason,
    };
    let words = split_words(rest).map_err(|reason| refuse(rest.trim(), reason))?;
    let mut words = words.into_iter().peekable();
    let mut found = Vec::new();
    while let Some(word) = words.next() {
        let (name, attached) = split_option(&word).ok_or_else(|| {
            refuse(
                &word,
                "is not an option: a value without its option, or a word the line should not hold".into(),
            )
        })?;
        let opt = Opt::by_word(&name);
        let arg = opt.map_or(Arg::OptionalEq, |opt| opt.arg);
        let long = opt.map_or(name.clone(), |opt| opt.long.to_string());
        let value = match (arg, attached) {
            (Arg::None, Some(_)) => return Err(refuse(&word, format!("{long} takes no value"))),
            (_, Some(value)) => Some(value),
            (Arg::Required, None) => Some(
                words
                    .next()
                    .ok_or_else(|| refuse(&word, format!("{long} lacks its value")))?,
            ),
            // An unknown option takes the next word as its value unless
            // that is an option itself.
            (Arg::OptionalEq, None) if opt.is_none() => words.next_if(|next| !next.starts_with('-')),
            _ => None,
        };
        let written = match (&value, word.contains('=') || word.len() > 2 && !word.starts_with("--")) {
            (Some(value), false) => format!("{word} {value}"),
            _ => word.clone(),
        };
        found.push(Directive {
            line,
            written,
            name: long,
            opt,
            value,
        });
    }
    Ok(found)
}

/// `--name=value` into `--name` and the value; `-Xvalue` into `-X` and
/// the value; `None` for a word that is no option.
fn split_option(word: &str) -> Option<(String, Option<String>)> {
    if let Some(long) = word.strip_prefix("--").filter(|long| !long.is_empty()) {
        return Some(match long.split_once('=') {
            Some((name, value)) => (format!("--{name}"), Some(value.to_string())),
            None => (word.to_string(), None),
        });
    }
    let mut chars = word.strip_prefix('-')?.chars();
    let short = chars.next()?;
    let rest: String = chars.collect();
    Some((format!("-{short}"), (!rest.is_empty()).then_some(rest)))
}

/// Words split on blanks; single and double quotes group them; an unquoted
/// `#` at the start of a word begins a comment.
fn split_words(text: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '#') if word.is_none() => break,
            (None, '"' | '\'') => {
                quote = Some(c);
                word.get_or_insert_with(String::new);
            }
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    if let Some(q) = quote {
        return Err(format!("a {q} quote is not closed"));
    }
    words.extend(word);
    Ok(words)
}

/// The gpool flags of `sbatch` that still apply under the later layers:
/// those whose fields `later_fields` (set by `#GPOOL` lines or the command
/// line) does not name.
pub fn under_later_layers(sbatch: &SbatchFlags, later_fields: &[String]) -> Vec<String> {
    sbatch
        .flags
        .iter()
        .filter(|mapped| {
            !mapped
                .fields
                .iter()
                .any(|field| later_fields.iter().any(|set| set == field))
        })
        .flat_map(|mapped| mapped.words.iter().cloned())
        .collect()
}

#[cfg(test)]
mod tests;
