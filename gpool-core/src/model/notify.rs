//! When a job may start (`--begin`) and whom gpoold tells of its start
//! and end (`--notify`), with what a pool allows.

use super::*;

/// Where and when gpoold says a job started or ended: a webhook
/// (`http://`, `https://`: a JSON POST) or a mailbox (`mail:ADDR`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Notify {
    pub to: String,
    pub on_start: bool,
    /// Every end, whatever its state.
    pub on_end: bool,
    /// Ends other than `completed` (implied by `on_end`).
    pub on_fail: bool,
}

#[cfg(test)]
mod notify_tests {
    use super::*;

    #[test]
    fn begin_times_parse_as_slurm_users_write_them() {
        let submitted = crate::ids::Timestamp(1_000_000);
        assert_eq!(Begin::parse("now+1h").unwrap().at(submitted).0, 1_000_000 + 3_600_000);
        assert_eq!(Begin::parse("90s").unwrap(), Begin::AfterSecs(90));
        assert_eq!(Begin::parse("now").unwrap(), Begin::AfterSecs(0));
        let day = Begin::parse("2026-11-28").unwrap();
        assert_eq!(
            day.at(submitted),
            Begin::parse("2026-11-28T00:00").unwrap().at(submitted)
        );
        assert_eq!(day, Begin::At(crate::ids::Timestamp(1_795_824_000_000)));
        assert!(Begin::parse("tomorrow").unwrap_err().contains("\"tomorrow\""));
        assert!(Begin::parse("10000y").unwrap_err().contains("more than a year"));
        assert!(Begin::AfterSecs(u64::MAX).check().is_err());
        assert!(Begin::At(crate::ids::Timestamp(i64::MAX)).check().is_err());
        assert!(day.check().is_ok());
    }

    /// A path that climbs out of an allowed prefix is checked where it
    /// lands; control characters never reach the log.
    #[test]
    fn a_webhook_is_checked_where_it_really_goes() {
        let to = |url: &str| Notify::parse(url, None).map(|notify| notify.to);
        assert_eq!(
            to("https://h.example/hooks/../metrics").unwrap(),
            "https://h.example/metrics"
        );
        assert_eq!(
            to("https://h.example/hooks/./a/b/..?x=1").unwrap(),
            "https://h.example/hooks/a/?x=1"
        );
        assert_eq!(to("https://h.example").unwrap(), "https://h.example");
        assert!(to("https://h.example/hooks/%2e%2e/metrics")
            .unwrap_err()
            .contains("encoded"));
        assert!(to("https://h.example/hooks\\..\\metrics")
            .unwrap_err()
            .contains("backslash"));
        assert!(to("https://h.example/hooks/\u{0}x")
            .unwrap_err()
            .contains("control character (U+0000)"));
        let rules = NotifyRules {
            webhooks: vec!["https://h.example/hooks/".into()],
            sendmail: None,
        };
        let climbing = Notify::parse("https://h.example/hooks/../metrics", None).unwrap();
        assert!(rules.admit(&climbing).is_err());
        let inside = Notify::parse("https://h.example/hooks/a/../b", None).unwrap();
        assert!(rules.admit(&inside).is_ok());
    }

    #[test]
    fn targets_and_events_parse_and_pools_admit_what_they_allow() {
        let hook = Notify::parse("https://hooks.example.com/x", Some("start,fail")).unwrap();
        assert!(hook.is_webhook() && hook.on_start && hook.on_fail && !hook.on_end);
        assert_eq!(hook.event(Change::Started), Some("start"));
        assert_eq!(hook.event(Change::Ended { completed: false }), Some("fail"));
        assert_eq!(hook.event(Change::Ended { completed: true }), None);
        let ends = Notify::parse("https://hooks.example.com/x", None).unwrap();
        assert_eq!(ends.event(Change::Ended { completed: true }), Some("end"));
        assert_eq!(ends.event(Change::Started), None);
        assert!(Notify::parse("mail:ops@example.com", None).unwrap().on_end);
        for bad in ["ftp://x", "mail:nobody", "mail:-oQ@x", "https://a b", ""] {
            assert!(Notify::parse(bad, None).is_err(), "{bad}");
        }
        assert!(Notify::parse("https://x", Some("later"))
            .unwrap_err()
            .contains("\"later\""));
        let rules = NotifyRules {
            webhooks: vec!["https://hooks.example.com/".into()],
            sendmail: None,
        };
        assert_eq!(rules.admit(&hook), Ok(()));
        let elsewhere = Notify::parse("http://169.254.169.254/latest", None).unwrap();
        assert!(rules
            .admit(&elsewhere)
            .unwrap_err()
            .contains("not under an allowed prefix"));
        let mail = Notify::parse("mail:ops@example.com", None).unwrap();
        assert!(rules.admit(&mail).unwrap_err().contains("[notify] sendmail"));
        assert!(NotifyRules::default()
            .admit(&hook)
            .unwrap_err()
            .contains("[notify] webhooks"));
        // Lookalikes of an allowed prefix are not under it.
        let loose = NotifyRules {
            webhooks: vec![
                "https://hooks.example.com".into(),
                "https://ci.example.com/hooks".into(),
            ],
            sendmail: None,
        };
        for (url, allowed) in [
            ("https://hooks.example.com/x", true),
            ("https://HOOKS.example.com", true),
            ("https://ci.example.com/hooks/gpool?x=1", true),
            ("https://hooks.example.com@10.0.0.5/", false),
            ("https://hooks.example.com.evil.net/", false),
            ("http://hooks.example.com/x", false),
            ("https://ci.example.com/hooksmith", false),
            ("https://hooks.example.com:8443/", false),
        ] {
            let target = Notify::parse(url, None).unwrap();
            assert_eq!(loose.admit(&target).is_ok(), allowed, "{url}");
        }
    }
}

/// What happened to a job, as `--notify` tells of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Started,
    Ended { completed: bool },
}

impl Notify {
    /// The event to send for `change`, if the job asked for one: `start`,
    /// `end` (every end), or `fail` (an end other than completed, where
    /// only failures were asked for).
    pub fn event(&self, change: Change) -> Option<&'static str> {
        match change {
            Change::Started => self.on_start.then_some("start"),
            Change::Ended { .. } if self.on_end => Some("end"),
            Change::Ended { completed } => (self.on_fail && !completed).then_some("fail"),
        }
    }

    /// The most bytes of a `--notify` target.
    pub const MAX_TARGET_BYTES: usize = 2048;

    /// `--notify TO --notify-on start,end,fail` (`all`: the three; the
    /// default: `end`).
    pub fn parse(to: &str, on: Option<&str>) -> Result<Notify, String> {
        let to = to.trim();
        let is_mail = to.strip_prefix("mail:").is_some_and(|addr| {
            let addr = addr.trim();
            addr.contains('@') && !addr.starts_with('-') && !addr.chars().any(|c| c.is_whitespace() || c == ',')
        });
        let is_web = (to.starts_with("http://") || to.starts_with("https://")) && !to.chars().any(char::is_whitespace);
        if !is_mail && !is_web {
            return Err(format!(
                "{to:?} is neither a webhook (http://... or https://...) nor a mailbox (mail:user@example.com)"
            ));
        }
        if to.len() > Self::MAX_TARGET_BYTES {
            return Err(format!("longer than {} bytes", Self::MAX_TARGET_BYTES));
        }
        if let Some(control) = to.chars().find(|c| c.is_control()) {
            return Err(format!(
                "{to:?} holds a control character (U+{:04X})",
                u32::from(control)
            ));
        }
        let to = if is_web { normalized_url(to)? } else { to.to_string() };
        let mut notify = Notify {
            to,
            on_start: false,
            on_end: false,
            on_fail: false,
        };
        for word in on.unwrap_or("end").split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word.to_ascii_lowercase().as_str() {
                "start" | "begin" => notify.on_start = true,
                "end" => notify.on_end = true,
                "fail" => notify.on_fail = true,
                "all" => (notify.on_start, notify.on_end, notify.on_fail) = (true, true, true),
                other => return Err(format!("notify_on: {other:?} is not start, end, fail or all")),
            }
        }
        if !(notify.on_start || notify.on_end || notify.on_fail) {
            return Err("notify_on: name start, end, fail or all".into());
        }
        Ok(notify)
    }

    /// A webhook (else a mailbox).
    pub fn is_webhook(&self) -> bool {
        !self.to.starts_with("mail:")
    }
}

/// A webhook URL with its path's `.` and `..` segments resolved (RFC 3986),
/// so that the pool's allowed prefixes are checked against where the post
/// really goes (`/hooks/../metrics` is `/metrics`). Encoded dots and
/// backslashes, which a receiver might resolve otherwise, are refused.
fn normalized_url(url: &str) -> Result<String, String> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| format!("{url:?} has no scheme"))?;
    let path_at = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(path_at);
    let query_at = tail.find(['?', '#']).unwrap_or(tail.len());
    let (path, query) = tail.split_at(query_at);
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2e") || lower.contains("%2f") || path.contains('\\') {
        return Err(format!(
            "{url:?}: its path holds an encoded '.' or '/', or a backslash; write the path plainly"
        ));
    }
    let mut segments: Vec<&str> = Vec::new();
    let parts: Vec<&str> = path.split('/').skip(1).collect();
    for (index, part) in parts.iter().enumerate() {
        let last = index + 1 == parts.len();
        match *part {
            "." if last => segments.push(""),
            "." => {}
            ".." => {
                segments.pop();
                if last {
                    segments.push("");
                }
            }
            other => segments.push(other),
        }
    }
    let path = if path.is_empty() {
        String::new()
    } else {
        format!("/{}", segments.join("/"))
    };
    Ok(format!("{scheme}://{authority}{path}{query}"))
}

/// When a job may start at the earliest (`--begin`): a moment, or a time
/// after its submission (resolved by gpoold, whose clock it is).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Begin {
    At(crate::ids::Timestamp),
    AfterSecs(u64),
}

impl Begin {
    /// The longest wait after submission `--begin` takes: a year.
    pub const MAX_AFTER_SECS: u64 = 366 * 24 * 3600;
    /// The latest moment any gpool time may be: 9999-12-31T23:59:59Z
    /// (later ones have no RFC 3339 form).
    pub const LATEST_MS: i64 = 253_402_300_799_000;

    /// Refuses a time past what gpool can show (as from the wire).
    pub fn check(&self) -> Result<(), String> {
        match self {
            Begin::AfterSecs(secs) if *secs > Self::MAX_AFTER_SECS => {
                Err(format!("{secs} seconds after submission is more than a year"))
            }
            Begin::At(at) if !(0..=Self::LATEST_MS).contains(&at.0) => {
                Err(format!("{} ms since 1970 is not a moment from 1970 to 9999", at.0))
            }
            _ => Ok(()),
        }
    }

    /// `now+1h`, `1h30m` (after submission), `2026-11-28` (its midnight)
    /// or `2026-11-28T16:00[:00][Z]`, in UTC.
    pub fn parse(text: &str) -> Result<Begin, String> {
        let trimmed = text.trim();
        let relative = trimmed.strip_prefix("now+").unwrap_or(trimmed);
        if trimmed == "now" {
            return Ok(Begin::AfterSecs(0));
        }
        if let Ok(after) = humantime::parse_duration(relative) {
            if after.as_secs() > Self::MAX_AFTER_SECS {
                return Err(format!("{text:?} is more than a year from now"));
            }
            return Ok(Begin::AfterSecs(after.as_secs()));
        }
        let written = match trimmed.len() {
            10 => format!("{trimmed}T00:00:00Z"),
            16 => format!("{trimmed}:00"),
            _ => trimmed.to_string(),
        };
        let at = humantime::parse_rfc3339_weak(&written).map_err(|_| {
            format!("{text:?} is neither a time from now (now+1h, 30m) nor a date or time (2026-11-28, 2026-11-28T16:00, UTC)")
        })?;
        let ms = at
            .duration_since(std::time::UNIX_EPOCH)
            .map_err(|_| format!("{text:?} is before 1970"))?;
        Ok(Begin::At(crate::ids::Timestamp(
            ms.as_millis().min(i64::MAX as u128) as i64
        )))
    }

    /// The moment it stands for, for a job submitted at `submitted_at`.
    pub fn at(&self, submitted_at: crate::ids::Timestamp) -> crate::ids::Timestamp {
        match self {
            Begin::At(at) => *at,
            Begin::AfterSecs(secs) => crate::ids::Timestamp(
                submitted_at
                    .0
                    .saturating_add((*secs).min(i64::MAX as u64 / 1000) as i64 * 1000),
            ),
        }
    }
}

/// What `--notify` may name in a pool (`[notify]` of gpoold.toml): a
/// webhook under one of `webhooks` (gpoold posts from inside the
/// network: each allowed prefix is the operator's choice), a mailbox where
/// a sendmail program is set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NotifyRules {
    pub webhooks: Vec<String>,
    pub sendmail: Option<String>,
}

impl NotifyRules {
    /// Why `notify` is refused here, if it is.
    pub fn admit(&self, notify: &Notify) -> Result<(), String> {
        if !notify.is_webhook() {
            return match self.sendmail {
                Some(_) => Ok(()),
                None => Err("this pool sends no mail: an admin sets [notify] sendmail in gpoold.toml".into()),
            };
        }
        if self.webhooks.iter().any(|prefix| under_prefix(&notify.to, prefix)) {
            return Ok(());
        }
        Err(match self.webhooks.as_slice() {
            [] => "this pool posts to no webhook: an admin lists the allowed URL prefixes in [notify] webhooks of gpoold.toml".to_string(),
            allowed => format!("{:?} is not under an allowed prefix ({})", notify.to, allowed.join(", ")),
        })
    }
}

/// An http(s) URL's scheme, host (and port, lower-cased) and the rest;
/// `None` for another scheme, or a user name before the host (which would
/// make `https://allowed.example@elsewhere/` look allowed).
fn url_parts(url: &str) -> Option<(&str, String, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    if scheme != "http" && scheme != "https" {
        return None;
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, path) = rest.split_at(end);
    if authority.is_empty() || authority.contains(['@', '\\']) {
        return None;
    }
    Some((scheme, authority.to_ascii_lowercase(), path))
}

/// `url` is on the prefix's scheme and host, and under its path (at a
/// path boundary: `/hooks` takes `/hooks/x`, not `/hooksmith`).
fn under_prefix(url: &str, prefix: &str) -> bool {
    let Some((scheme, host, path)) = url_parts(url) else {
        return false;
    };
    // `https://` alone: any host of that scheme.
    if let Some(any_of) = prefix.strip_suffix("://") {
        return scheme == any_of;
    }
    let Some((prefix_scheme, prefix_host, prefix_path)) = url_parts(prefix) else {
        return false;
    };
    let Some(rest) = path.strip_prefix(prefix_path) else {
        return false;
    };
    scheme == prefix_scheme
        && host == prefix_host
        && (prefix_path.is_empty()
            || prefix_path.ends_with('/')
            || rest.is_empty()
            || rest.starts_with(['/', '?', '#']))
}
