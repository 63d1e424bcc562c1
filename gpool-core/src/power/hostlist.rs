//! Node names as Slurm writes them: `cloud-h100-[1-16]`, `gpu[01-04,09]`.

/// The most names one pattern may stand for.
pub const MAX_NAMES: usize = 10_000;

/// The names `pattern` stands for: one bracket of numbers and ranges
/// (`[1-16]`, `[01-04,09]`, zero-padded as the range's first number is),
/// or a plain name.
pub fn expand(pattern: &str) -> Result<Vec<String>, String> {
    let Some((prefix, rest)) = pattern.split_once('[') else {
        return check_plain(pattern).map(|()| vec![pattern.to_string()]);
    };
    let (inside, suffix) = rest
        .split_once(']')
        .ok_or_else(|| format!("{pattern:?}: a '[' without its ']'"))?;
    if suffix.contains('[') || suffix.contains(']') || prefix.contains(']') {
        return Err(format!("{pattern:?}: one [range] per pattern"));
    }
    check_plain(prefix)?;
    check_plain(suffix)?;
    let mut names = Vec::new();
    for part in inside.split(',') {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        let width = if first.len() > 1 && first.starts_with('0') {
            first.len()
        } else {
            0
        };
        let number = |text: &str| {
            text.parse::<u64>()
                .map_err(|_| format!("{pattern:?}: {text:?} is not a number"))
        };
        let (from, to) = (number(first)?, number(last)?);
        if to < from {
            return Err(format!("{pattern:?}: the range {part} goes down"));
        }
        if to - from >= MAX_NAMES as u64 || names.len() + (to - from) as usize >= MAX_NAMES {
            return Err(format!("{pattern:?}: more than {MAX_NAMES} names"));
        }
        names.extend((from..=to).map(|n| format!("{prefix}{n:0width$}{suffix}")));
    }
    Ok(names)
}

fn check_plain(name: &str) -> Result<(), String> {
    if name
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        Ok(())
    } else {
        Err(format!("{name:?}: a node name takes letters, digits, '-', '_' and '.'"))
    }
}

#[cfg(test)]
mod tests {
    use super::expand;

    #[test]
    fn patterns_expand_as_slurms_do() {
        assert_eq!(
            expand("cloud-h100-[1-3]").unwrap(),
            ["cloud-h100-1", "cloud-h100-2", "cloud-h100-3"]
        );
        assert_eq!(
            expand("gpu[08-10,15]x").unwrap(),
            ["gpu08x", "gpu09x", "gpu10x", "gpu15x"]
        );
        assert_eq!(expand("solo").unwrap(), ["solo"]);
        assert!(expand("a[3-1]").unwrap_err().contains("goes down"));
        assert!(expand("a[1-2").unwrap_err().contains("without its ']'"));
        assert!(expand("a[1-100000]").unwrap_err().contains("more than"));
        assert!(expand("a b").unwrap_err().contains("node name"));
    }
}
