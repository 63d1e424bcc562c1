//! sbatch's values in gpool's forms: output patterns, time limits, GPU
//! requests, memory, host lists, begin times, dependencies and the rest;
//! each refused with the reason where gpool cannot honour it.

use gpool_core::spec::gpus::GpuRequest;

/// The most node names a host list may expand to (gpool's cap on
/// `--nodelist` and `--exclude`).
const MAX_HOSTS: usize = gpool_core::spec::MAX_REQUIREMENT_ITEMS;

pub fn not_empty(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Err("the value is empty".into());
    }
    Ok(text.to_string())
}

/// One name where Slurm takes a list (partitions, QoS).
pub fn single(what: &str, text: &str) -> Result<String, String> {
    if text.contains(',') {
        return Err(format!(
            "a list of {what}s: gpool runs a job in the one it names; give one"
        ));
    }
    not_empty(text)
}

/// A count of at least 1.
pub fn count(text: &str) -> Result<u32, String> {
    text.parse::<u32>()
        .ok()
        .filter(|count| *count >= 1)
        .ok_or_else(|| format!("{text:?} is not a count of at least 1"))
}

/// `-N N`, or `N-N` (a range gpool cannot take: a gang has one size).
pub fn nodes(text: &str) -> Result<u32, String> {
    match text.split_once('-') {
        Some((low, high)) if low == high => count(low),
        Some(_) => Err(format!(
            "{text:?} is a range of node counts; a gpool gang has one size: give one count"
        )),
        None if text.contains(',') => Err(format!("{text:?} is a list of node counts; give one count")),
        None => count(text),
    }
}

/// Slurm's `-o/-e` pattern in gpool's letters: `%N` (node name) is
/// gpool's `%n`; Slurm's `%n` (node index) and `%t` (task rank) are
/// gpool's `%t`, its gang rank (one task per node).
pub fn output_pattern(text: &str) -> Result<String, String> {
    if text.is_empty() {
        return Err("the file name is empty".into());
    }
    if text.contains('\\') {
        return Err("a backslash turns Slurm's % patterns off; gpool always fills them in: remove it".into());
    }
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let letter = match chars.next() {
            Some(letter @ ('j' | 'A' | 'a' | 'x' | 'u' | '%')) => letter,
            Some('N') => 'n',
            Some('n' | 't') => 't',
            Some('J' | 's') => return Err("%J and %s name a job step; a gpool job has no steps: use %j".into()),
            Some('b') => return Err("%b (the task index modulo 10) has no gpool equivalent: use %a".into()),
            Some(digit) if digit.is_ascii_digit() => {
                return Err(format!(
                    "%{digit}...: gpool does not pad pattern numbers with zeros; write the letter alone (%a)"
                ))
            }
            Some(other) => {
                return Err(format!(
                    "%{other} is not one of the pattern letters gpool fills in (%j %A %a %x %u %N %n %t %%)"
                ))
            }
            None => return Err("ends with a lone %: write %% for a percent sign".into()),
        };
        out.push('%');
        out.push(letter);
    }
    Ok(out)
}

/// Slurm's time forms (`MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`,
/// `D-HH:MM:SS`), which gpool's `--time` takes as they are.
pub fn time_limit(text: &str) -> Result<String, String> {
    let unlimited = ["unlimited", "infinite", "0"].contains(&text.to_ascii_lowercase().as_str());
    if unlimited {
        return Err("gpool has no unlimited time limit: give one, or remove the line".into());
    }
    gpool_core::spec::parse_duration(text)?;
    Ok(text.to_string())
}

/// `gpu`, `gpu:N` or `gpu:TYPE:N` (TYPE is gpool's GPU model).
pub fn gres(text: &str) -> Result<String, String> {
    if text.contains(',') {
        return Err("gpool schedules GPUs only: give one gpu:N or gpu:TYPE:N".into());
    }
    if text.contains('(') {
        return Err("gpool places GPUs by its own topology: remove the (S:...) socket binding".into());
    }
    GpuRequest::parse_gres(text)?;
    Ok(text.to_string())
}

/// `N` or `TYPE:N`.
pub fn gpus(text: &str) -> Result<String, String> {
    if text.contains(',') {
        return Err("GPUs of several types: gpool gives a job one kind of GPU; give one TYPE:N".into());
    }
    GpuRequest::parse(text)?;
    Ok(text.to_string())
}

/// `0-9`, `1,3,5-9`, `0-99:10`, with `%N`: as gpool's `--array`.
pub fn array(text: &str) -> Result<String, String> {
    gpool_core::array::ArraySpec::parse(text).map_err(|err| err.reason)?;
    Ok(text.to_string())
}

/// `--mem`: Slurm's default unit is megabytes; `0` (all of a node's
/// memory) has no gpool form.
pub fn memory(text: &str) -> Result<String, String> {
    let digits = text.chars().take_while(char::is_ascii_digit).count();
    if not_empty(text)?.chars().all(|c| c == '0') {
        return Err("0 asks for all of a node's memory; gpool needs a size (or --exclusive)".into());
    }
    let size = if digits == text.len() {
        format!("{text}M")
    } else {
        text.to_string()
    };
    gpool_core::spec::parse_size(&size)?;
    Ok(size)
}

/// `-D`: relative to the directory sbatch runs in.
pub fn workdir(text: &str, cwd: &str) -> Result<String, String> {
    let dir = std::path::Path::new(not_empty(text)?.as_str()).to_path_buf();
    if dir.is_absolute() {
        return Ok(text.to_string());
    }
    Ok(std::path::Path::new(cwd).join(dir).display().to_string())
}

/// `afterok:ID[:ID]`, `afterany`, `afternotok` and `singleton`,
/// comma-separated (all must hold).
pub fn dependency(text: &str) -> Result<String, String> {
    if text.contains('?') {
        return Err("'?' waits for any one dependency; gpool waits for all of them (','): rewrite it with ','".into());
    }
    for item in text.split(',') {
        let kind = item.split(':').next().unwrap_or_default();
        if matches!(kind, "after" | "aftercorr" | "afterburstbuffer") {
            return Err(format!(
                "{kind}: gpool waits for a job to end (afterok, afterany, afternotok) or for singleton, never for a job's start or its array's matching task"
            ));
        }
        if item.contains('+') {
            return Err(format!("{item}: gpool has no delay after a dependency (+TIME)"));
        }
    }
    gpool_core::deps::parse_dependencies(text, &|_| None).map_err(|err| err.reason)?;
    Ok(text.to_string())
}

/// A Slurm host list (`n[1-4,7],gpu-[01-02]`), written out name by name.
pub fn hostlist(text: &str) -> Result<String, String> {
    if text.contains('/') {
        return Err("a file of node names: list the names on the line".into());
    }
    let mut names = Vec::new();
    for item in top_level_items(text) {
        expand_host(&item, &mut names)?;
        if names.len() > MAX_HOSTS {
            return Err(format!("more than {MAX_HOSTS} nodes"));
        }
    }
    if names.is_empty() {
        return Err("names no node".into());
    }
    Ok(names.join(","))
}

/// `a,b[1-2,4],c` into `a`, `b[1-2,4]`, `c`.
fn top_level_items(text: &str) -> Vec<String> {
    let (mut items, mut item, mut depth) = (Vec::new(), String::new(), 0usize);
    for c in text.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut item));
                continue;
            }
            _ => {}
        }
        item.push(c);
    }
    items.push(item);
    items
        .into_iter()
        .map(|item| item.trim().to_string())
        .filter(|item| !item.is_empty())
        .collect()
}

/// One item of a host list: `name`, or `prefix[1-4,07]suffix`.
fn expand_host(item: &str, names: &mut Vec<String>) -> Result<(), String> {
    let Some((prefix, rest)) = item.split_once('[') else {
        names.push(item.to_string());
        return Ok(());
    };
    let (ranges, suffix) = rest
        .split_once(']')
        .ok_or_else(|| format!("{item:?}: a '[' is not closed"))?;
    if suffix.contains('[') {
        return Err(format!("{item:?}: gpool reads one [...] range in a name"));
    }
    for range in ranges.split(',') {
        let (low, high) = range.split_once('-').unwrap_or((range, range));
        let bad = || format!("{item:?}: {range:?} is not a number or a range of numbers");
        let (first, last) = (
            low.parse::<u64>().map_err(|_| bad())?,
            high.parse::<u64>().map_err(|_| bad())?,
        );
        if last < first || last - first > MAX_HOSTS as u64 {
            return Err(bad());
        }
        for number in first..=last {
            names.push(format!("{prefix}{number:0width$}{suffix}", width = low.len()));
        }
    }
    Ok(())
}

/// Slurm's node features (`a100&ib`, `rack1,fast`: all of them) as gpool
/// node labels: a feature `F` is the label `F=true`; `key=value` stays.
pub fn constraint(text: &str) -> Result<String, String> {
    if let Some(c) = text
        .chars()
        .find(|c| matches!(c, '|' | '[' | ']' | '*' | '(' | ')' | '!'))
    {
        return Err(format!(
            "{c:?}: gpool's constraints are node labels that must all match (& or ,); it has no OR, counts or groups"
        ));
    }
    let labels: Vec<String> = text
        .split(['&', ','])
        .map(str::trim)
        .filter(|feature| !feature.is_empty())
        .map(|feature| match feature.contains('=') {
            true => feature.to_string(),
            false => format!("{feature}=true"),
        })
        .collect();
    if labels.is_empty() {
        return Err("names no feature".into());
    }
    Ok(labels.join(","))
}

/// `ALL`, `NONE`, `NIL` (as NONE) or `[ALL,]NAME[=VALUE],...`.
pub fn export(text: &str) -> Result<String, String> {
    let text = if text.eq_ignore_ascii_case("NIL") { "NONE" } else { text };
    gpool_core::spec::Export::parse(text).map_err(|err| err.reason)?;
    Ok(text.to_string())
}

/// `[B:]SIG[@TIME]`: gpool's checkpoint signal, with TIME (Slurm's
/// default 60 s) as its grace before the kill.
pub fn signal(text: &str) -> Result<super::map::Flags, String> {
    if let Some((flag, _)) = text.split_once(':') {
        return Err(format!(
            "{flag}: gpool signals the job's whole process group, never the batch shell alone: write --signal=SIG[@TIME]"
        ));
    }
    let (signal, seconds) = text.split_once('@').unwrap_or((text, "60"));
    gpool_core::spec::parse_signal(signal)?;
    let seconds: u64 = seconds
        .parse()
        .map_err(|_| format!("{seconds:?} is not a number of seconds"))?;
    Ok(vec![
        (
            &["checkpoint_signal"][..],
            vec![format!("--checkpoint-signal={signal}")],
        ),
        (&["grace"][..], vec![format!("--grace={seconds}s")]),
    ])
}

/// `--mail-type` in gpool's events (none for NONE).
pub fn mail_events(text: &str) -> Result<Vec<String>, String> {
    let mut events = Vec::new();
    for word in text.split(',').map(str::trim) {
        let event = match word.to_ascii_uppercase().as_str() {
            "NONE" => continue,
            "BEGIN" => "start",
            "END" => "end",
            "FAIL" => "fail",
            "ALL" => "all",
            other => {
                return Err(format!(
                    "{other}: gpool says when a job starts, ends or fails (BEGIN, END, FAIL, ALL), nothing else"
                ))
            }
        };
        events.push(event.to_string());
    }
    Ok(events)
}

pub fn mail_user(text: &str) -> Result<String, String> {
    if !text.contains('@') || text.contains(',') {
        return Err(format!("{text:?}: gpool mails one address, NAME@HOST"));
    }
    Ok(text.to_string())
}

/// `--begin`: `now`, `now+N[seconds|minutes|hours|days|weeks]`,
/// `YYYY-MM-DD[THH:MM[:SS]]` in local time (as Slurm reads it), into
/// gpool's form (seconds after submission, or UTC).
pub fn begin(text: &str, local_to_utc: &dyn Fn(time::PrimitiveDateTime) -> Option<i64>) -> Result<String, String> {
    if text == "now" {
        return Ok("now".into());
    }
    if let Some(after) = text.strip_prefix("now+") {
        let digits = after.chars().take_while(char::is_ascii_digit).count();
        let (number, unit) = after.split_at(digits);
        let scale = match unit.to_ascii_lowercase().as_str() {
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1,
            "m" | "min" | "mins" | "minute" | "minutes" => 60,
            "h" | "hour" | "hours" => 3600,
            "d" | "day" | "days" => 86_400,
            "w" | "week" | "weeks" => 604_800,
            _ => {
                return Err(format!(
                    "{unit:?} is not a unit of time (seconds, minutes, hours, days, weeks)"
                ))
            }
        };
        let number: u64 = number
            .parse()
            .map_err(|_| format!("{text:?}: give now+N with a unit"))?;
        return Ok(format!("now+{}s", number.saturating_mul(scale)));
    }
    let at = local_date_time(text).ok_or_else(|| {
        format!(
            "{text:?}: gpool reads now, now+N[unit] and YYYY-MM-DD[THH:MM[:SS]]; write the time in one of those forms"
        )
    })?;
    let secs = local_to_utc(at).ok_or_else(|| format!("{text:?} is no moment in this machine's time zone"))?;
    let utc = time::OffsetDateTime::from_unix_timestamp(secs).map_err(|err| format!("{text:?}: {err}"))?;
    Ok(format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        utc.year(),
        u8::from(utc.month()),
        utc.day(),
        utc.hour(),
        utc.minute(),
        utc.second()
    ))
}

/// `YYYY-MM-DD[THH:MM[:SS]]`.
fn local_date_time(text: &str) -> Option<time::PrimitiveDateTime> {
    let (date, clock) = text.split_once('T').unwrap_or((text, "00:00:00"));
    let date: Vec<&str> = date.split('-').collect();
    let clock: Vec<&str> = clock.split(':').collect();
    let ([year, month, day], 2..=3) = (date.as_slice(), clock.len()) else {
        return None;
    };
    let month = time::Month::try_from(month.parse::<u8>().ok()?).ok()?;
    let date = time::Date::from_calendar_date(year.parse().ok()?, month, day.parse().ok()?).ok()?;
    let number = |idx: usize| clock.get(idx).map_or(Some(0), |part| part.parse::<u8>().ok());
    let clock = time::Time::from_hms(number(0)?, number(1)?, number(2)?).ok()?;
    Some(time::PrimitiveDateTime::new(date, clock))
}

/// This machine's local time as UTC seconds (mktime, which knows the time
/// zone and its daylight saving).
pub fn local_to_utc(at: time::PrimitiveDateTime) -> Option<i64> {
    // SAFETY: tm is a plain C struct, all zeroes is a valid value of it;
    // mktime reads and normalizes only the struct it is given.
    let mut tm: nix::libc::tm = unsafe { std::mem::zeroed() };
    tm.tm_year = at.year() - 1900;
    tm.tm_mon = i32::from(u8::from(at.month())) - 1;
    tm.tm_mday = i32::from(at.day());
    tm.tm_hour = i32::from(at.hour());
    tm.tm_min = i32::from(at.minute());
    tm.tm_sec = i32::from(at.second());
    tm.tm_isdst = -1;
    // SAFETY: as above.
    let secs = unsafe { nix::libc::mktime(&mut tm) };
    (secs != -1).then_some(secs)
}
