//! Human tables and the stable JSON schema of `--output json`.
//!
//! JSON job object: id, name, state, user, team, project, workload_type,
//! pool, gpus (per node), gpus_total, nodes, gpu_types, priority,
//! time_limit_secs, command, workdir, submitted_at, started_at, ended_at
//! (RFC 3339 UTC to the millisecond, or null), exit_code (or null), end_reason, reasons (why
//! pending), attempt, placement ([{node, gpus}]), qos, burst (the running
//! attempt may be preempted), n_preemptions, lost_gpu_secs, requeue_cause
//! (preempted, node_lost, gpu_fault, node_fault, requeued; or null), preempted_at
//! and last_checkpoint_at (RFC 3339 or null), estimated_start (the job
//! holding the backfill reservation; else null), redacted (another user's
//! job: command and workdir are empty), image (empty: on the host),
//! mem_bytes, cpus_per_gpu, exclusive, max_output_bytes, begin, reservation and notify
//! ({to, on}) (or null), reason_codes (one stable
//! snake_case code per reason), node_list, array_job_id and array_task_id
//! (an array's task; else null), array (an array's record: indices,
//! max_parallel, tasks, waiting_indices, waiting, running, ended,
//! not_completed; else null), stdout_path and stderr_path (-o/-e
//! patterns; else null), gpu_use ({samples, mean_utilization_pct,
//! peak_utilization_pct, peak_memory_used_mib, idle}, or null),
//! stragglers ([{node, index, utilization_pct, median_pct, since}]),
//! events ([{at, text}]: stragglers flagged and back in step), warnings
//! (texts: nodes that did not enforce the limits it asked for).
//! JSON node object: name, state, gpus_total, gpus_free (0 unless the node
//! takes work), drained_by and drained_at (an operator's drain; else null),
//! gpu_model, labels, enforces (the limits it enforces: cpu, devices,
//! memory, pids),
//! drain_reason, gpus ([{index, model, memory_mib, uuid, job_id}]).

use gpool_proto::convert::state_name;
use gpool_proto::pb;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, UNIX_EPOCH};

mod job_table;
mod jobs;
mod nodes;
mod reasons;
mod show;

pub use job_table::*;
pub use jobs::*;
pub use nodes::*;
pub use reasons::*;
pub use show::*;

pub fn rfc3339(unix_ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(unix_ms.max(0) as u64);
    humantime::format_rfc3339_seconds(at).to_string()
}

/// RFC 3339 to the millisecond (JSON: accounting needs better than a
/// second).
pub fn rfc3339_ms(unix_ms: i64) -> String {
    let at = UNIX_EPOCH + Duration::from_millis(unix_ms.max(0) as u64);
    humantime::format_rfc3339_millis(at).to_string()
}

pub fn print_json<T: Serialize>(value: &T) {
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    // A closed stdout (a pipe into `head`) is not an error worth reporting.
    let _ = serde_json::to_writer(&mut out, value);
    let _ = writeln!(out);
    let _ = out.flush();
}

/// Prints a JSON array one element at a time.
pub struct JsonArrayPrinter {
    out: std::io::BufWriter<std::io::StdoutLock<'static>>,
    n_items: usize,
}

impl JsonArrayPrinter {
    pub fn new() -> JsonArrayPrinter {
        let mut out = std::io::BufWriter::with_capacity(256 * 1024, std::io::stdout().lock());
        let _ = out.write_all(b"[");
        JsonArrayPrinter { out, n_items: 0 }
    }

    pub fn push<T: Serialize>(&mut self, item: &T) {
        if self.n_items > 0 {
            let _ = self.out.write_all(b",");
        }
        // A closed stdout (a pipe into `head`) is not an error worth reporting.
        let _ = serde_json::to_writer(&mut self.out, item);
        self.n_items += 1;
    }

    pub fn finish(mut self) {
        let _ = self.out.write_all(b"]\n");
        let _ = self.out.flush();
    }
}

/// Prints rows as left-aligned columns (comfy-table): on a terminal, long
/// cells wrap to its width; into a pipe, lines stay whole.
pub fn print_table(header: &[&str], rows: Vec<Vec<String>>) {
    let mut table = comfy_table::Table::new();
    table
        .load_preset(comfy_table::presets::NOTHING)
        .set_header(header.iter().copied());
    if std::io::stdout().is_terminal() {
        table.set_content_arrangement(comfy_table::ContentArrangement::Dynamic);
    }
    for row in rows {
        table.add_row(row);
    }
    for column in table.column_iter_mut() {
        column.set_padding((0, 2));
    }
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    for line in table.lines() {
        if writeln!(out, "{}", line.trim_end()).is_err() {
            return;
        }
    }
    let _ = out.flush();
}
