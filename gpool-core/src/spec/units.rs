//! Durations, sizes and signals as users write them.

/// A signal by Linux number, or by name with or without `SIG` (any case),
/// of the signals gpool sends to jobs (for checkpoints and `cancel
/// --signal`): those the attempt's supervisor outlives.
pub fn parse_signal(text: &str) -> Result<i32, String> {
    const NAMES: [(&str, i32); 10] = [
        ("HUP", 1),
        ("INT", 2),
        ("QUIT", 3),
        ("USR1", 10),
        ("USR2", 12),
        ("ALRM", 14),
        ("TERM", 15),
        ("CONT", 18),
        ("URG", 23),
        ("WINCH", 28),
    ];
    let trimmed = text.trim();
    if let Ok(number) = trimmed.parse::<i32>() {
        return if NAMES.iter().any(|(_, known)| *known == number) {
            Ok(number)
        } else {
            Err(format!(
                "{number} is not one of the signals gpool sends (HUP 1, INT 2, QUIT 3, USR1 10, USR2 12, ALRM 14, TERM 15, CONT 18, URG 23, WINCH 28)"
            ))
        };
    }
    let upper = trimmed.to_ascii_uppercase();
    let name = upper.strip_prefix("SIG").unwrap_or(&upper);
    NAMES
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, number)| *number)
        .ok_or_else(|| {
            format!(
                "{text:?} is not a signal name (USR1, USR2, TERM, INT, HUP, QUIT, ALRM, CONT, URG, WINCH) or number"
            )
        })
}

/// `64G`, `512M`, `1T`, `4096K` (powers of 1024) or plain bytes; at
/// least 1 MiB.
/// Seconds in the form users write durations: `13h`, `1h30m`, `2d4h`,
/// `90s` as `1m30s`, `0s`.
pub fn format_duration(secs: u64) -> String {
    if secs == 0 {
        return "0s".into();
    }
    let parts = [
        (secs / 86_400, "d"),
        (secs / 3600 % 24, "h"),
        (secs / 60 % 60, "m"),
        (secs % 60, "s"),
    ];
    parts
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, unit)| format!("{n}{unit}"))
        .collect()
}

pub fn parse_size(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (digits, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let shift = match unit.to_ascii_uppercase().trim_end_matches(['B', 'I']) {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("{text:?} is not a size such as 64G, 512M or bytes")),
    };
    let bytes = digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(1u64 << shift))
        .ok_or_else(|| format!("{text:?} is not a size such as 64G, 512M or bytes"))?;
    if bytes < 1 << 20 {
        return Err(format!("{text:?} is less than 1M"));
    }
    Ok(bytes)
}

/// A time limit in seconds. Accepts Slurm's forms (`MM`, `MM:SS`,
/// `HH:MM:SS`, `D-HH`, `D-HH:MM`, `D-HH:MM:SS`) and suffixed ones (`90s`,
/// `30m`, `2h`, `1d`, `1h30m`).
pub fn parse_duration(text: &str) -> Result<u64, String> {
    let text = text.trim();
    if text.is_empty() {
        return Err("is empty; give a duration such as 30m, 2h or 1-12:00:00".into());
    }
    if text.starts_with('-') {
        return Err(format!("{text:?} is negative"));
    }
    let seconds = if text.chars().all(|c| c.is_ascii_digit() || c == ':' || c == '-') {
        parse_slurm_duration(text)
    } else {
        humantime::parse_duration(text).ok().map(|d| d.as_secs())
    };
    match seconds {
        Some(0) => Err(format!("{text:?} is zero; a time limit must be more than zero")),
        Some(seconds) => Ok(seconds),
        None => Err(format!(
            "{text:?} is not a duration; use forms like 30 (minutes), 90s, 2h, 1h30m, 2:00:00 or 1-12:00:00"
        )),
    }
}

pub(super) fn parse_slurm_duration(text: &str) -> Option<u64> {
    let (days, rest) = match text.split_once('-') {
        Some((days, rest)) => (Some(days.parse::<u64>().ok()?), rest),
        None => (None, text),
    };
    let parts: Vec<u64> = rest
        .split(':')
        .map(|part| part.parse::<u64>().ok())
        .collect::<Option<_>>()?;
    let (hours, minutes, seconds) = match (days.is_some(), parts.as_slice()) {
        (false, [m]) => (0, *m, 0),
        (false, [m, s]) => (0, *m, *s),
        (false, [h, m, s]) => (*h, *m, *s),
        (true, [h]) => (*h, 0, 0),
        (true, [h, m]) => (*h, *m, 0),
        (true, [h, m, s]) => (*h, *m, *s),
        _ => return None,
    };
    let total = days.unwrap_or(0).checked_mul(86_400)?;
    total
        .checked_add(hours.checked_mul(3_600)?)?
        .checked_add(minutes.checked_mul(60)?)?
        .checked_add(seconds)
}

/// A job's memory limit per node: `mem` (per node, as Slurm's `--mem`) or
/// `mem_per_gpu` times its GPUs per node (`--mem-per-gpu`), not both.
pub fn memory_per_node(
    mem: Option<&str>,
    per_gpu: Option<&str>,
    gpus_per_node: i64,
) -> Result<Option<u64>, super::SpecError> {
    let size = |field: &str, text: &str| parse_size(text).map_err(|reason| super::spec_error(field, reason));
    match (mem, per_gpu) {
        (Some(_), Some(_)) => Err(super::spec_error("mem_per_gpu", "give mem or mem_per_gpu, not both")),
        (Some(text), None) => size("mem", text).map(Some),
        (None, Some(text)) => {
            let per_gpu = size("mem_per_gpu", text)?;
            Ok(Some(per_gpu.saturating_mul(gpus_per_node.max(1) as u64)))
        }
        (None, None) => Ok(None),
    }
}
