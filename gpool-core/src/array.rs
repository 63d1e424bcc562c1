//! Job arrays: one submission of many tasks that differ only by their index
//! (`--array 0-999:2%50`).
//!
//! An array is one job record: the template spec and an `ArrayProgress`.
//! Its tasks' ids are reserved at submit (`task_id`), and a task becomes a
//! job of its own only when it starts or a user acts on it alone, so a
//! 10,000-task array costs one record until its tasks run.

use crate::ids::{JobId, Timestamp};
use crate::spec::{spec_error, SpecError};
use serde::{Deserialize, Serialize};
use std::fmt;

/// Most tasks one array may have.
pub const MAX_ARRAY_TASKS: u32 = 100_000;
/// Highest task index.
pub const MAX_ARRAY_INDEX: u32 = 9_999_999;
/// Most ranges in one array expression.
pub const MAX_ARRAY_RANGES: usize = 1024;

/// `start-end:step`, `end` inclusive and a multiple of `step` past `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexRange {
    pub start: u32,
    pub end: u32,
    pub step: u32,
}

impl IndexRange {
    pub fn len(&self) -> u32 {
        (self.end - self.start) / self.step + 1
    }

    pub fn is_empty(&self) -> bool {
        false
    }
}

/// The task indices of an array and how many of its tasks may run at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArraySpec {
    /// In increasing order, not overlapping.
    pub ranges: Vec<IndexRange>,
    /// `%N`: at most N tasks run at once.
    #[serde(default)]
    pub max_parallel: Option<u32>,
}

impl ArraySpec {
    /// Parses `0-999`, `1,3,5-9`, `0-99:10` and any of them with `%50`.
    pub fn parse(text: &str) -> Result<ArraySpec, SpecError> {
        let bad = |reason: String| spec_error("array", reason);
        let (list, max_parallel) = match text.trim().split_once('%') {
            Some((list, max)) => {
                let max: u32 = max
                    .trim()
                    .parse()
                    .map_err(|_| bad(format!("{max:?} after % is not a number of tasks")))?;
                (list, Some(max))
            }
            None => (text.trim(), None),
        };
        let mut ranges = Vec::new();
        for item in list.split(',') {
            let item = item.trim();
            let number = |text: &str| {
                text.trim()
                    .parse::<u32>()
                    .map_err(|_| bad(format!("{item:?} is not an index, a range START-END or START-END:STEP")))
            };
            let (span, step) = match item.split_once(':') {
                Some((span, step)) => (span, number(step)?),
                None => (item, 1),
            };
            let (start, end) = match span.split_once('-') {
                Some((start, end)) => (number(start)?, number(end)?),
                None => {
                    let only = number(span)?;
                    (only, only)
                }
            };
            if step == 0 {
                return Err(bad(format!("{item:?}: the step must be at least 1")));
            }
            if end < start {
                return Err(bad(format!("{item:?}: the range ends before it starts")));
            }
            ranges.push(IndexRange {
                start,
                end: start + (end - start) / step * step,
                step,
            });
        }
        let spec = ArraySpec { ranges, max_parallel };
        spec.validate()?;
        Ok(spec)
    }

    /// Checks an array from any source (gpoold checks what it receives).
    pub fn validate(&self) -> Result<(), SpecError> {
        let bad = |reason: String| spec_error("array", reason);
        if self.ranges.is_empty() {
            return Err(bad("no task index".into()));
        }
        if self.ranges.len() > MAX_ARRAY_RANGES {
            return Err(bad(format!(
                "{} ranges, more than the limit of {MAX_ARRAY_RANGES}",
                self.ranges.len()
            )));
        }
        let mut previous_end: Option<u32> = None;
        let mut total: u64 = 0;
        for range in &self.ranges {
            if range.step == 0 || range.end < range.start || !(range.end - range.start).is_multiple_of(range.step) {
                return Err(bad(format!("{range} is not a range of indices")));
            }
            if range.end > MAX_ARRAY_INDEX {
                return Err(bad(format!(
                    "index {} is more than the highest, {MAX_ARRAY_INDEX}",
                    range.end
                )));
            }
            if previous_end.is_some_and(|end| range.start <= end) {
                return Err(bad(format!(
                    "{range} does not come after the indices before it (list them in increasing order, each once)"
                )));
            }
            previous_end = Some(range.end);
            total += u64::from(range.len());
        }
        if total > u64::from(MAX_ARRAY_TASKS) {
            return Err(bad(format!("{total} tasks, more than the limit of {MAX_ARRAY_TASKS}")));
        }
        if self.max_parallel == Some(0) {
            return Err(bad("%0 would never run a task; give at least %1".into()));
        }
        Ok(())
    }

    /// How many tasks.
    pub fn len(&self) -> u32 {
        self.ranges.iter().map(IndexRange::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// The index of the task at `position` (0 for the first task).
    pub fn index_at(&self, position: u32) -> Option<u32> {
        let mut left = position;
        for range in &self.ranges {
            if left < range.len() {
                return Some(range.start + left * range.step);
            }
            left -= range.len();
        }
        None
    }

    /// The tasks at positions `from..to` as ranges (each within one of
    /// this array's ranges, with its step).
    pub fn ranges_between(&self, from: u32, to: u32) -> Vec<IndexRange> {
        let mut pieces = Vec::new();
        let mut first = 0;
        for range in &self.ranges {
            let (start, end) = (from.max(first), to.min(first + range.len()));
            if start < end {
                pieces.push(IndexRange {
                    start: range.start + (start - first) * range.step,
                    end: range.start + (end - 1 - first) * range.step,
                    step: if end - start == 1 { 1 } else { range.step },
                });
            }
            first += range.len();
            if first >= to {
                break;
            }
        }
        pieces
    }

    /// The position of the task with `index`, if the array has one.
    pub fn position_of(&self, index: u32) -> Option<u32> {
        let mut before = 0;
        for range in &self.ranges {
            if (range.start..=range.end).contains(&index) && (index - range.start).is_multiple_of(range.step) {
                return Some(before + (index - range.start) / range.step);
            }
            before += range.len();
        }
        None
    }
}

impl fmt::Display for IndexRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.end > self.start, self.step) {
            (false, _) => write!(f, "{}", self.start),
            (true, 1) => write!(f, "{}-{}", self.start, self.end),
            (true, step) => write!(f, "{}-{}:{step}", self.start, self.end),
        }
    }
}

impl fmt::Display for ArraySpec {
    /// As `parse` takes it: `0-999:2%50`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (n, range) in self.ranges.iter().enumerate() {
            if n > 0 {
                f.write_str(",")?;
            }
            write!(f, "{range}")?;
        }
        if let Some(max) = self.max_parallel {
            write!(f, "%{max}")?;
        }
        Ok(())
    }
}

/// The id of the task at `position` of the array `array`: reserved at
/// submit, whether or not the task is a job yet.
pub fn task_id(array: JobId, position: u32) -> JobId {
    JobId(array.0 + 1 + u64::from(position))
}

/// The ids reserved for the `n_tasks` tasks of the array `array` (none for
/// a job that is no array).
pub fn task_ids(array: JobId, n_tasks: u32) -> std::ops::Range<JobId> {
    task_id(array, 0)..task_id(array, n_tasks)
}

/// `123_4` for a task, `123` for anything else.
pub fn display_id(id: JobId, task: Option<&ArrayTask>) -> String {
    match task {
        Some(task) => format!("{}_{}", task.array, task.index),
        None => id.to_string(),
    }
}

/// What an array record keeps of its tasks.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayProgress {
    /// Tasks that are jobs of their own (started, or acted on alone).
    pub materialized: u32,
    /// Of those, the ones that ended, and the ones that ended other than
    /// completed.
    pub ended: u32,
    pub not_completed: u32,
    /// The lowest position whose task is not a job yet.
    pub next_position: u32,
    /// When its first task started.
    #[serde(default)]
    pub first_started_at: Option<Timestamp>,
}

impl ArrayProgress {
    /// Every task became a job and ended.
    pub fn all_ended(&self, tasks: u32) -> bool {
        self.materialized == tasks && self.ended == tasks
    }
}

/// A task's place in its array.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayTask {
    pub array: JobId,
    pub index: u32,
}

/// Expands `-o/-e` patterns: `%j` the job's own id (a task's own), `%a`
/// task index (0 outside arrays), `%A` array id (the job's own outside
/// arrays), `%n` node, `%t` rank, `%u` user, `%x` job
/// name, `%%` a percent sign. Unknown `%` sequences stay as written.
pub fn expand_output_pattern(pattern: &str, fields: &OutputFields<'_>) -> String {
    let mut out = String::with_capacity(pattern.len() + 16);
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('j') => out.push_str(&fields.job.to_string()),
            Some('A') => out.push_str(&fields.array.unwrap_or(fields.job).to_string()),
            Some('a') => match fields.task_index {
                Some(index) => out.push_str(&index.to_string()),
                None => out.push('0'),
            },
            Some('n') => out.push_str(fields.node),
            Some('t') => out.push_str(&fields.rank.to_string()),
            Some('u') => out.push_str(fields.user),
            Some('x') => out.push_str(fields.name),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The first `%` field of `pattern` that `expand_output_pattern` does not
/// know (a lone `%` at the end counts as one), if any.
pub fn unknown_pattern_field(pattern: &str) -> Option<String> {
    let mut chars = pattern.chars();
    while let Some(c) = chars.next() {
        if c == '%' {
            match chars.next() {
                Some('j' | 'A' | 'a' | 'n' | 't' | 'u' | 'x' | '%') => {}
                Some(other) => return Some(other.to_string()),
                None => return Some(String::new()),
            }
        }
    }
    None
}

/// What `expand_output_pattern` fills in.
pub struct OutputFields<'a> {
    pub job: u64,
    pub array: Option<u64>,
    pub task_index: Option<u32>,
    pub node: &'a str,
    pub rank: u32,
    pub user: &'a str,
    pub name: &'a str,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn parses_the_forms_slurm_users_type() {
        let spec = ArraySpec::parse("0-999%50").unwrap();
        assert_eq!(spec.len(), 1000);
        assert_eq!(spec.max_parallel, Some(50));
        assert_eq!(spec.to_string(), "0-999%50");
        let spec = ArraySpec::parse("1,3,5-9").unwrap();
        assert_eq!(spec.len(), 7);
        assert_eq!(spec.to_string(), "1,3,5-9");
        let spec = ArraySpec::parse("0-10:3").unwrap();
        assert_eq!(spec.to_string(), "0-9:3");
        assert_eq!(
            (0..4).map(|p| spec.index_at(p).unwrap()).collect::<Vec<_>>(),
            [0, 3, 6, 9]
        );
        assert_eq!(spec.index_at(4), None);
        assert_eq!(spec.position_of(6), Some(2));
        assert_eq!(spec.position_of(7), None);
    }

    #[test]
    fn refusals_name_the_field_and_reason() {
        for (text, words) in [
            ("", "is not an index"),
            ("5-1", "ends before it starts"),
            ("0-9:0", "step must be at least 1"),
            ("0-9%0", "%0 would never run"),
            ("5,1", "increasing order"),
            ("0-5,5-9", "increasing order"),
            ("0-100000", "100001 tasks, more than the limit"),
            ("x", "\"x\" is not an index"),
            ("1%x", "after % is not a number"),
            ("10000000", "more than the highest"),
        ] {
            let err = ArraySpec::parse(text).unwrap_err();
            assert_eq!(err.field, "array", "{text}");
            assert!(err.reason.contains(words), "{text}: {}", err.reason);
        }
    }

    #[test]
    fn ranges_between_positions_keep_their_steps() {
        let spec = ArraySpec::parse("1,3,10-20:5,30-33").unwrap();
        // Positions: 1 3 10 15 20 30 31 32 33.
        let text = |from, to| {
            let ranges = spec.ranges_between(from, to);
            ArraySpec {
                ranges,
                max_parallel: None,
            }
            .to_string()
        };
        assert_eq!(text(0, 9), "1,3,10-20:5,30-33");
        assert_eq!(text(1, 4), "3,10-15:5");
        assert_eq!(text(4, 7), "20,30-31");
        assert_eq!(text(8, 9), "33");
        assert_eq!(text(3, 3), "");
    }

    #[test]
    fn output_patterns_expand() {
        let fields = OutputFields {
            job: 17,
            array: Some(12),
            task_index: Some(4),
            node: "n1",
            rank: 2,
            user: "ana",
            name: "train",
        };
        assert_eq!(
            expand_output_pattern("/shared/%u/%x-%A_%a.%j.%n.%t.%%.%q.log%", &fields),
            "/shared/ana/train-12_4.17.n1.2.%.%q.log%"
        );
        // Submit refuses such patterns, naming the field.
        assert_eq!(unknown_pattern_field("%x-%j.out"), None);
        assert_eq!(unknown_pattern_field("100%%.log"), None);
        assert_eq!(unknown_pattern_field("%x-%q.out").as_deref(), Some("q"));
        assert_eq!(unknown_pattern_field("run%").as_deref(), Some(""));
    }

    proptest! {
        #[test]
        fn positions_and_indices_agree(
            starts in proptest::collection::vec((0u32..50, 0u32..20, 1u32..4), 1..6),
        ) {
            // Build increasing ranges from gaps, lengths and steps.
            let mut ranges = Vec::new();
            let mut next = 0;
            for (gap, span, step) in starts {
                let start = next + gap;
                let end = start + span / step * step;
                // One index is written without its step.
                let step = if end == start { 1 } else { step };
                ranges.push(IndexRange { start, end, step });
                next = end + 1;
            }
            let spec = ArraySpec { ranges, max_parallel: None };
            prop_assert!(spec.validate().is_ok());
            let reparsed = ArraySpec::parse(&spec.to_string()).unwrap();
            prop_assert_eq!(&reparsed, &spec);
            let mut last = None;
            for position in 0..spec.len() {
                let index = spec.index_at(position).unwrap();
                prop_assert!(last.is_none_or(|last| index > last));
                prop_assert_eq!(spec.position_of(index), Some(position));
                last = Some(index);
            }
            prop_assert_eq!(spec.index_at(spec.len()), None);
            // Any split into pieces lists the same indices, in order.
            let half = spec.len() / 2;
            let pieces: Vec<u32> = [spec.ranges_between(0, half), spec.ranges_between(half, spec.len())]
                .concat()
                .iter()
                .flat_map(|range| (range.start..=range.end).step_by(range.step as usize))
                .collect();
            let all: Vec<u32> = (0..spec.len()).filter_map(|p| spec.index_at(p)).collect();
            prop_assert_eq!(pieces, all);
        }
    }
}
