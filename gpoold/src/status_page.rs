//! The status page: `GET /status` on the metrics listener, one read-only
//! HTML page with inline CSS and SVG charts (no build step, no outside
//! assets). Callers are known as the API knows them: the owner of a
//! loopback socket, or a user token (`Authorization: Bearer`, or once
//! through `/status?token=...`, which sets an HttpOnly cookie).

use crate::reports::Reports;
use crate::security::{AuditEntry, Security};
use gpool_core::accounting::{allocation_series, Dimension, Report};
use gpool_core::auth::Caller;
use gpool_core::model::NodeState;
use gpool_core::{JobState, Timestamp};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

/// The allocation chart covers this much time...
const CHART_HOURS: i64 = 6;
/// ...in this many slices.
const CHART_SLICES: usize = 72;
const TOKEN_COOKIE: &str = "gpool_token";

/// What the page needs besides the state.
#[derive(Clone)]
pub struct StatusPage {
    pub security: Arc<Security>,
    pub reports: Reports,
}

/// An HTTP answer: status, extra headers, body.
pub struct Answer {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: String,
}

impl Answer {
    fn html(status: u16, body: String) -> Answer {
        Answer {
            status,
            headers: vec![("content-type", "text/html; charset=utf-8".into())],
            body,
        }
    }
}

impl StatusPage {
    /// Answers `GET /status[?token=...]` from a peer whose socket owner on
    /// this host is `local_uid` (loopback), with the request's
    /// `authorization` and `cookie` headers.
    pub async fn answer(
        &self,
        query: Option<&str>,
        local_uid: Option<u32>,
        authorization: Option<&str>,
        cookie: Option<&str>,
        peer: &str,
    ) -> Answer {
        let shared = &self.reports.state;
        // A token given once in the address becomes a cookie, and the
        // address loses it.
        if let Some(token) = query.and_then(|query| query_value(query, "token")) {
            return match crate::api::token_user(&self.security, shared, &token) {
                Ok(_) => Answer {
                    status: 303,
                    headers: vec![
                        ("location", "/status".into()),
                        (
                            "set-cookie",
                            format!("{TOKEN_COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/status"),
                        ),
                    ],
                    body: String::new(),
                },
                Err(reason) => self.refuse(peer, &reason),
            };
        }
        let identified = if let Some(uid) = local_uid {
            crate::api::local_user(shared, uid, "loopback uid")
        } else if let Some(header) = authorization {
            match header.strip_prefix("Bearer ") {
                Some(token) => crate::api::token_user(&self.security, shared, token),
                None => Err("the authorization header is not `Bearer TOKEN`".into()),
            }
        } else if let Some(token) = cookie.and_then(|cookie| cookie_value(cookie, TOKEN_COOKIE)) {
            crate::api::token_user(&self.security, shared, &token)
        } else {
            Err("no credential".into())
        };
        match identified {
            Ok((caller, _)) => match self.render(&caller).await {
                Ok(page) => Answer::html(200, page),
                Err(err) => Answer::html(
                    500,
                    page("gpool: error", &format!("<p>{}</p>", escape(&err.to_string()))),
                ),
            },
            Err(reason) => self.refuse(peer, &reason),
        }
    }

    fn refuse(&self, peer: &str, reason: &str) -> Answer {
        self.security.audit(&AuditEntry {
            at: crate::security::now_text(),
            caller: "",
            via: "status page",
            peer,
            action: "authenticate",
            object: "",
            outcome: format!("refused: {reason}"),
        });
        let body = format!(
            "<p>gpoold does not know who you are: {}.</p>\
             <p>Open this page on the controller host, or give a token from <code>gpool admin token create</code>:</p>\
             <form method=\"get\" action=\"/status\"><input name=\"token\" type=\"password\" size=\"60\"> <button>Show</button></form>",
            escape(reason)
        );
        Answer::html(401, page("gpool: who are you?", &body))
    }

    async fn render(&self, caller: &Caller) -> Result<String, crate::error::Error> {
        let now = crate::wall_clock();
        let snapshot = Snapshot::take(&self.reports.state, now);
        // The allocation chart is the whole pool's; costs are what the
        // caller may see, as `gpool report`.
        let chart_since = Timestamp(now.0 - CHART_HOURS * 3_600_000);
        let chart_records = self.reports.records(chart_since, now, now, |_| true).await?;
        let allocation = allocation_series(&chart_records, chart_since, now, CHART_SLICES);
        let (since, until) = self.reports.window(0, 0, now)?;
        let cost = self
            .reports
            .report(caller, since, until, &[Dimension::Team], now)
            .await?;
        let mut html = String::new();
        let _ = write!(
            html,
            "<p class=\"who\">{} as {}{} · {}</p>",
            escape(&now.to_string()),
            escape(&caller.user),
            if caller.admin { " (admin)" } else { "" },
            snapshot.summary()
        );
        html.push_str("<section><h2>Allocation, last 6 hours</h2>");
        html.push_str(&allocation_chart(&allocation, snapshot.total_gpus));
        html.push_str("</section><section><h2>Queue per team</h2>");
        html.push_str(&snapshot.queue_html());
        html.push_str("</section><section><h2>Cost this period</h2>");
        html.push_str(&cost_html(&cost));
        html.push_str("</section><section><h2>Nodes and GPUs</h2>");
        html.push_str(&snapshot.nodes_html());
        html.push_str("</section>");
        if !snapshot.power_groups.is_empty() {
            html.push_str("<section><h2>Sleeping and cloud nodes</h2>");
            html.push_str(&snapshot.power_html());
            html.push_str("</section>");
        }
        Ok(page("gpool status", &html))
    }
}

/// Each power group's nodes by power state, and how it stands.
fn power_groups(state: &crate::state::State, now: Timestamp) -> Vec<(String, BTreeMap<&'static str, usize>, String)> {
    use gpool_core::power::PowerState;
    let book = &state.power;
    book.groups
        .iter()
        .enumerate()
        .map(|(index, group)| {
            let mut counts = BTreeMap::new();
            for node in book.nodes.values().filter(|node| node.group == index) {
                *counts.entry(node.state.as_str()).or_insert(0) += 1;
            }
            let awake = book
                .nodes
                .values()
                .filter(|node| node.group == index && node.state != PowerState::PoweredDown)
                .count();
            let cost = awake as f64 * f64::from(group.gpus) * group.price_per_gpu_hour;
            let currency = &state.accounting.pricing.currency;
            let mut standing = format!("{awake} awake, {cost:.2} {currency} an hour");
            if let Some(paused) = book.paused(index, now) {
                standing = format!("{standing}; {paused}");
            }
            (group.name.clone(), counts, standing)
        })
        .collect()
}

impl Snapshot {
    fn power_html(&self) -> String {
        let mut rows = String::new();
        for (name, counts, standing) in &self.power_groups {
            let states: Vec<String> = counts.iter().map(|(state, n)| format!("{n} {state}")).collect();
            let _ = write!(
                rows,
                "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(name),
                escape(&states.join(", ")),
                escape(standing)
            );
        }
        format!("<table><tr><th>group</th><th>nodes</th><th>standing</th></tr>{rows}</table>")
    }
}

/// One team's line in the queue table.
#[derive(Default)]
struct TeamQueue {
    pending_jobs: u64,
    pending_gpus: u64,
    running_jobs: u64,
    running_gpus: u64,
    guaranteed_gpus: u32,
}

/// One GPU's cell.
struct GpuCell {
    index: u32,
    model: String,
    job: Option<u64>,
    utilization_pct: Option<u32>,
    temperature_c: Option<u32>,
    power_w: Option<u32>,
    /// Why it is out of service, when it is.
    out_of_service: Option<String>,
    /// Shared by fractions: how many, the memory they hold and its usable.
    shared: Option<(u32, u64, u64)>,
}

struct NodeLine {
    name: String,
    state: NodeState,
    drain_reason: Option<String>,
    gpus: Vec<GpuCell>,
}

/// What the page shows of the state, copied under one read lock.
struct Snapshot {
    teams: BTreeMap<String, TeamQueue>,
    nodes: Vec<NodeLine>,
    total_gpus: u64,
    allocated_gpus: u64,
    out_of_service_gpus: u64,
    /// Each `[[power]]` group: its name, nodes by power state, and how it
    /// stands (paused, what its awake nodes cost an hour).
    power_groups: Vec<(String, BTreeMap<&'static str, usize>, String)>,
}

impl Snapshot {
    fn take(shared: &crate::state::SharedState, now: Timestamp) -> Snapshot {
        let state = shared.read().unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut teams: BTreeMap<String, TeamQueue> = BTreeMap::new();
        for usage in state.usage_report(now) {
            teams.entry(usage.team).or_default().guaranteed_gpus = usage.guaranteed_gpus;
        }
        for job in state.active_jobs() {
            let team = teams.entry(job.spec.team.to_string()).or_default();
            match &job.state {
                JobState::Pending => {
                    // An array's record stands for its tasks not yet jobs.
                    let waiting = match (&job.spec.array, &job.array) {
                        (Some(spec), Some(progress)) => u64::from(spec.len().saturating_sub(progress.materialized)),
                        _ => 1,
                    };
                    team.pending_jobs += waiting;
                    team.pending_gpus += waiting * job.spec.total_gpus();
                }
                JobState::Running { placement, .. } => {
                    team.running_jobs += 1;
                    team.running_gpus += placement.iter().map(|part| part.gpu_indices.len() as u64).sum::<u64>();
                }
                _ => {}
            }
        }
        let holders = state.gpu_holders();
        let shares = state.gpu_shares();
        let mut snapshot = Snapshot {
            teams,
            nodes: Vec::new(),
            total_gpus: 0,
            allocated_gpus: 0,
            out_of_service_gpus: 0,
            power_groups: power_groups(&state, now),
        };
        for node in state.nodes.values() {
            let samples = state.gpu_samples.get(&node.name);
            let gpus: Vec<GpuCell> = node
                .gpus
                .iter()
                .map(|gpu| {
                    let sample = samples
                        .and_then(|samples| samples.iter().find(|s| s.index == gpu.mig_parent.unwrap_or(gpu.index)));
                    GpuCell {
                        index: gpu.index,
                        model: gpu.model.to_string(),
                        job: holders.get(&(node.name.as_str(), gpu.index)).map(|id| id.0),
                        utilization_pct: sample.map(|s| s.utilization_pct),
                        temperature_c: sample.map(|s| s.temperature_c).filter(|t| *t > 0),
                        power_w: sample.map(|s| s.power_w).filter(|p| *p > 0),
                        out_of_service: node.gpus_out.get(&gpu.index).map(|out| out.reason.clone()),
                        shared: (shares.get(&(node.name.as_str(), gpu.index)))
                            .map(|shared| (shared.jobs, shared.used_mib, shared.usable_mib)),
                    }
                })
                .collect();
            let busy = gpus.iter().filter(|gpu| gpu.job.is_some()).count();
            let node_state = node.state(busy);
            snapshot.total_gpus += gpus.len() as u64;
            snapshot.allocated_gpus += busy as u64;
            snapshot.out_of_service_gpus += if node_state == NodeState::Up {
                gpus.iter()
                    .filter(|gpu| gpu.job.is_none() && gpu.out_of_service.is_some())
                    .count() as u64
            } else {
                (gpus.len() - busy) as u64
            };
            snapshot.nodes.push(NodeLine {
                name: node.name.clone(),
                state: node_state,
                drain_reason: node.drain_reason.clone(),
                gpus,
            });
        }
        snapshot
    }

    fn summary(&self) -> String {
        format!(
            "{} GPUs on {} nodes: {} allocated, {} out of service",
            self.total_gpus,
            self.nodes.len(),
            self.allocated_gpus,
            self.out_of_service_gpus
        )
    }

    fn queue_html(&self) -> String {
        if self.teams.is_empty() {
            return "<p>No team has work queued or running.</p>".into();
        }
        let widest = self
            .teams
            .values()
            .map(|team| (team.running_gpus + team.pending_gpus).max(u64::from(team.guaranteed_gpus)))
            .max()
            .unwrap_or(1)
            .max(1) as f64;
        let mut rows = String::new();
        for (name, team) in &self.teams {
            let scale = |gpus: f64| gpus / widest * 300.0;
            let (run_w, pend_w) = (scale(team.running_gpus as f64), scale(team.pending_gpus as f64));
            let guarantee_x = scale(f64::from(team.guaranteed_gpus));
            let _ = write!(
                rows,
                "<tr><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td>\
                 <td><svg width=\"310\" height=\"16\" role=\"img\" aria-label=\"{} running, {} pending GPUs\">\
                 <rect x=\"0\" y=\"2\" width=\"{run_w:.1}\" height=\"12\" class=\"run\"/>\
                 <rect x=\"{run_w:.1}\" y=\"2\" width=\"{pend_w:.1}\" height=\"12\" class=\"pend\"/>\
                 <line x1=\"{guarantee_x:.1}\" x2=\"{guarantee_x:.1}\" y1=\"0\" y2=\"16\" class=\"mark\"/></svg></td></tr>",
                escape(name),
                team.running_jobs,
                team.running_gpus,
                team.pending_jobs,
                team.pending_gpus,
                team.guaranteed_gpus,
                team.running_gpus,
                team.pending_gpus,
            );
        }
        format!(
            "<table><tr><th>team</th><th>running jobs</th><th>GPUs</th><th>pending jobs</th><th>GPUs asked</th><th>guaranteed</th>\
             <th><span class=\"key run\"></span> running <span class=\"key pend\"></span> pending | guarantee</th></tr>{rows}</table>"
        )
    }

    fn nodes_html(&self) -> String {
        if self.nodes.is_empty() {
            return "<p>No node has registered.</p>".into();
        }
        let mut rows = String::new();
        for node in &self.nodes {
            let state = match node.state {
                NodeState::Up => "up",
                NodeState::Draining => "draining",
                NodeState::Drained => "drained",
                NodeState::Down => "down",
            };
            let mut cells = String::new();
            for gpu in &node.gpus {
                let class = match (gpu.job, node.state) {
                    (Some(_), _) => "gpu busy",
                    (None, NodeState::Up) if gpu.out_of_service.is_none() => "gpu free",
                    (None, _) => "gpu out",
                };
                let mut title = format!("GPU {} ({})", gpu.index, gpu.model);
                if let Some(reason) = &gpu.out_of_service {
                    let _ = write!(title, ", out of service: {reason}");
                }
                match (gpu.shared, gpu.job) {
                    (Some((n, used, usable)), _) => {
                        let _ = write!(title, ": {n} fractions hold {} of {} GiB", used >> 10, usable >> 10);
                    }
                    (None, Some(job)) => {
                        let _ = write!(title, ": job {job}");
                    }
                    (None, None) => {}
                }
                if let Some(temperature) = gpu.temperature_c {
                    let _ = write!(title, ", {temperature} °C");
                }
                if let Some(power) = gpu.power_w {
                    let _ = write!(title, ", {power} W");
                }
                let use_text = gpu
                    .utilization_pct
                    .map_or_else(|| "–".to_string(), |pct| format!("{pct}%"));
                let _ = write!(
                    cells,
                    "<span class=\"{class}\" title=\"{}\">{}<br><small>{}</small></span>",
                    escape(&title),
                    gpu.index,
                    use_text
                );
            }
            let _ = write!(
                rows,
                "<tr><td>{}</td><td class=\"state {state}\">{state}</td><td>{cells}</td><td>{}</td></tr>",
                escape(&node.name),
                escape(node.drain_reason.as_deref().unwrap_or(""))
            );
        }
        format!(
            "<table><tr><th>node</th><th>state</th><th>GPUs (index, utilisation; <span class=\"key busy\"></span> allocated <span class=\"key free\"></span> free <span class=\"key out\"></span> out of service)</th><th>reason</th></tr>{rows}</table>"
        )
    }
}

/// The allocated GPUs over time as an SVG area under the pool's size.
fn allocation_chart(series: &[f64], total_gpus: u64) -> String {
    let (width, height, left, bottom) = (720.0, 180.0, 40.0, 20.0);
    let top = series.iter().copied().fold(total_gpus as f64, f64::max).max(1.0);
    let plot_w = width - left;
    let plot_h = height - bottom - 10.0;
    let x = |i: usize| left + plot_w * i as f64 / series.len().max(1) as f64;
    let y = |gpus: f64| 10.0 + plot_h * (1.0 - gpus / top);
    let mut points = format!("{left:.1},{:.1}", y(0.0));
    for (i, gpus) in series.iter().enumerate() {
        let _ = write!(points, " {:.1},{:.1} {:.1},{:.1}", x(i), y(*gpus), x(i + 1), y(*gpus));
    }
    let _ = write!(points, " {:.1},{:.1}", x(series.len()), y(0.0));
    let now_value = series.last().copied().unwrap_or(0.0);
    format!(
        "<svg width=\"{width}\" height=\"{height}\" role=\"img\" aria-label=\"GPUs allocated over the last {CHART_HOURS} hours, {now_value:.1} of {total_gpus} now\">\
         <polygon points=\"{points}\" class=\"area\"/>\
         <line x1=\"{left}\" x2=\"{width}\" y1=\"{ty:.1}\" y2=\"{ty:.1}\" class=\"total\"/>\
         <text x=\"{lx}\" y=\"{tyl:.1}\" class=\"axis\" text-anchor=\"end\">{total_gpus}</text>\
         <text x=\"{lx}\" y=\"{zy:.1}\" class=\"axis\" text-anchor=\"end\">0</text>\
         <text x=\"{left}\" y=\"{height}\" class=\"axis\">−{CHART_HOURS}h</text>\
         <text x=\"{mid:.1}\" y=\"{height}\" class=\"axis\" text-anchor=\"middle\">−{half}h</text>\
         <text x=\"{width}\" y=\"{height}\" class=\"axis\" text-anchor=\"end\">now</text></svg>\
         <p class=\"note\">GPUs allocated (mean of each 5 minutes); the line is the pool's {total_gpus} GPUs.</p>",
        ty = y(total_gpus as f64),
        tyl = y(total_gpus as f64) + 4.0,
        zy = y(0.0),
        lx = left - 4.0,
        mid = left + plot_w / 2.0,
        half = CHART_HOURS / 2,
    )
}

/// This period's GPU-hours and cost by team, with bars.
fn cost_html(report: &Report) -> String {
    if report.rows.is_empty() {
        return "<p>No GPU time this period that you may see.</p>".into();
    }
    let widest = report
        .rows
        .iter()
        .map(|row| row.gpu_seconds)
        .fold(0.0, f64::max)
        .max(1.0);
    let money = |cost: Option<f64>| match cost {
        None => "–".to_string(),
        Some(cost) if cost > 0.0 && cost < 0.005 => "&lt;0.01".to_string(),
        Some(cost) => format!("{cost:.2}"),
    };
    let mut rows = String::new();
    for row in &report.rows {
        let bar = row.gpu_seconds / widest * 300.0;
        let _ = write!(
            rows,
            "<tr><td>{}</td><td class=\"num\">{:.3}</td><td class=\"num\">{:.3}</td><td class=\"num\">{}</td>\
             <td><svg width=\"310\" height=\"16\" role=\"img\"><rect x=\"0\" y=\"2\" width=\"{bar:.1}\" height=\"12\" class=\"run\"/></svg></td></tr>",
            escape(&row.key.join(" ")),
            row.gpu_seconds / 3600.0,
            row.idle_gpu_seconds / 3600.0,
            money(row.cost)
        );
    }
    format!(
        "<p class=\"note\">Since {} ({}).</p><table><tr><th>team</th><th>GPU-hours</th><th>idle GPU-hours</th><th>cost</th><th></th></tr>{rows}\
         <tr class=\"total\"><td>total</td><td class=\"num\">{:.3}</td><td class=\"num\">{:.3}</td><td class=\"num\">{}</td><td></td></tr></table>",
        escape(&report.since.to_string()),
        escape(&report.currency),
        report.total.gpu_seconds / 3600.0,
        report.total.idle_gpu_seconds / 3600.0,
        money(report.total.cost)
    )
}

/// A whole page around `body`: refreshed every 30 s, styles inline.
fn page(title: &str, body: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"30\">\
         <title>{title}</title><style>{STYLE}</style></head><body><h1>{title}</h1>{body}</body></html>",
        title = escape(title)
    )
}

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:24px;color:#222;max-width:1100px}\
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:20px 0 6px}\
table{border-collapse:collapse}td,th{padding:3px 8px;text-align:left;border-bottom:1px solid #eee;vertical-align:middle}\
th{font-weight:600;color:#555}.num{text-align:right;font-variant-numeric:tabular-nums}\
.who,.note{color:#666;margin:2px 0}.area{fill:#4c8bf5;fill-opacity:.6;stroke:#2a62c9}\
.total{stroke:#c33;stroke-dasharray:4 3}tr.total td{font-weight:600}.axis{font-size:11px;fill:#666}\
.run{fill:#4c8bf5}.pend{fill:#f5a04c}.mark{stroke:#c33;stroke-width:2}\
.gpu{display:inline-block;width:34px;margin:1px;padding:2px 0;text-align:center;border-radius:3px;font-size:12px;line-height:1.1}\
.gpu.busy{background:#4c8bf5;color:#fff}.gpu.free{background:#e3ecfb}.gpu.out{background:#d55;color:#fff}\
.key{display:inline-block;width:10px;height:10px;margin:0 2px 0 8px}.key.busy,.key.run{background:#4c8bf5}\
.key.free{background:#e3ecfb}.key.out{background:#d55}.key.pend{background:#f5a04c}\
.state.down,.state.drained{color:#c33;font-weight:600}.state.draining{color:#b70}";

/// Text made safe inside HTML elements and attributes.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A value of `name` in a query string (tokens need no percent-decoding:
/// they are letters, digits, '_' and '.').
fn query_value(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|pair| {
        let (key, value) = pair.split_once('=')?;
        (key == name && !value.is_empty()).then(|| value.to_string())
    })
}

fn cookie_value(header: &str, name: &str) -> Option<String> {
    header.split(';').find_map(|pair| {
        let (key, value) = pair.trim().split_once('=')?;
        (key == name && !value.is_empty()).then(|| value.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_from_users_cannot_become_markup() {
        assert_eq!(escape("<b a=\"1\">&'"), "&lt;b a=&quot;1&quot;&gt;&amp;&#39;");
    }

    #[test]
    fn tokens_are_found_in_queries_and_cookies() {
        assert_eq!(query_value("a=1&token=gp_x.y", "token").as_deref(), Some("gp_x.y"));
        assert_eq!(query_value("token=", "token"), None);
        assert_eq!(
            cookie_value("x=1; gpool_token=abc", TOKEN_COOKIE).as_deref(),
            Some("abc")
        );
    }

    #[test]
    fn the_chart_names_the_pool_size_and_ends_now() {
        let svg = allocation_chart(&[0.0, 2.0, 4.0], 8);
        assert!(svg.contains(">8</text>") && svg.contains(">now</text>"), "{svg}");
        assert!(svg.contains("4.0 of 8 now"), "{svg}");
    }
}
