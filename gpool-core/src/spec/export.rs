//! What a job takes from the submitting shell: its variables (`--export`)
//! and a batch script's `#GPOOL` lines.

use super::*;

/// Which of the submitting shell's variables a job gets (`--export`, as
/// sbatch's): all of them but `EXPORT_DENIED` (the default), none, or the
/// names listed (each `NAME`, or `NAME=VALUE` to set one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Export {
    pub all: bool,
    /// Named variables: with a value to set, or `None` to take the shell's.
    pub named: Vec<(String, Option<String>)>,
}

impl Default for Export {
    fn default() -> Export {
        Export {
            all: true,
            named: Vec::new(),
        }
    }
}

/// Variables never exported: gpool's own and the GPU choice (set for each
/// attempt), and those that belong to the submitting terminal or session.
pub const EXPORT_DENIED: &[&str] = &[
    "GPOOL_*",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "SSH_*",
    "DISPLAY",
    "XAUTHORITY",
    "DBUS_SESSION_BUS_ADDRESS",
    "XDG_RUNTIME_DIR",
    "XDG_SESSION_*",
    "TMUX",
    "TMUX_PANE",
    "STY",
    "WINDOW",
    "TERM",
    "TERMCAP",
    "COLUMNS",
    "LINES",
    "PWD",
    "OLDPWD",
    "SHLVL",
    "_",
    // Secrets: a job that needs one names it (--export ALL,NAME).
    "*TOKEN*",
    "*SECRET*",
    "*PASSWORD*",
    "*PASSWD*",
    "*CREDENTIAL*",
    "*_KEY",
    "AWS_*",
    "KRB5CCNAME",
];

pub(super) fn export_denied(name: &str) -> bool {
    EXPORT_DENIED
        .iter()
        .any(|pattern| match (pattern.strip_prefix('*'), pattern.strip_suffix('*')) {
            (Some(_), Some(_)) => name.contains(&pattern[1..pattern.len() - 1]),
            (Some(suffix), None) => name.ends_with(suffix),
            (None, Some(prefix)) => name.starts_with(prefix),
            (None, None) => name == *pattern,
        })
}

impl Export {
    /// `ALL`, `NONE`, or a comma list of names and `NAME=VALUE`s, which may
    /// start with `ALL` (everything, and these) or `NONE` (only these).
    pub fn parse(text: &str) -> Result<Export, SpecError> {
        let mut export = Export {
            all: false,
            named: Vec::new(),
        };
        for (position, item) in text.split(',').map(str::trim).enumerate() {
            match item {
                "ALL" if position == 0 => export.all = true,
                "NONE" if position == 0 => {}
                "" => return Err(spec_error("export", format!("{text:?} has an empty item"))),
                _ => {
                    let (name, value) = match item.split_once('=') {
                        Some((name, value)) => (name, Some(value.to_string())),
                        None => (item, None),
                    };
                    validate_env(name, value.as_deref().unwrap_or(""))
                        .map_err(|err| spec_error("export", format!("{name:?}: {}", err.reason)))?;
                    export.named.push((name.to_string(), value));
                }
            }
        }
        Ok(export)
    }

    /// The variables a job gets from a shell whose environment is `vars`.
    /// Variables gpool could not set (names it refuses) are left out.
    pub fn apply(&self, vars: impl IntoIterator<Item = (String, String)>) -> BTreeMap<String, String> {
        let vars: BTreeMap<String, String> = vars.into_iter().collect();
        let mut exported: BTreeMap<String, String> = if self.all {
            vars.iter()
                .filter(|(name, value)| !export_denied(name) && validate_env(name, value).is_ok())
                .map(|(name, value)| (name.clone(), value.clone()))
                .collect()
        } else {
            BTreeMap::new()
        };
        for (name, value) in &self.named {
            match value.as_ref().or_else(|| vars.get(name)) {
                Some(value) => exported.insert(name.clone(), value.clone()),
                None => exported.remove(name),
            };
        }
        exported
    }
}

/// The flags a batch script gives itself on `#GPOOL` lines, as sbatch reads
/// `#SBATCH`: from the top of the script (after a `#!` line), until the
/// first line that is neither blank nor a comment. Words split on blanks;
/// single and double quotes group them.
pub fn script_directives(text: &str) -> Result<Vec<String>, String> {
    let mut flags = Vec::new();
    for (line_idx, line) in text.lines().enumerate() {
        let line = line.trim();
        if line_idx == 0 && line.starts_with("#!") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("#GPOOL") {
            if !rest.is_empty() && !rest.starts_with(char::is_whitespace) {
                continue;
            }
            flags.extend(split_words(rest).map_err(|reason| format!("line {}: {reason}", line_idx + 1))?);
        } else if !(line.is_empty() || line.starts_with('#')) {
            break;
        }
    }
    Ok(flags)
}

pub(super) fn split_words(text: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    for c in text.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
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
