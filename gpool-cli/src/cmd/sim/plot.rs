//! `gpool sim --plot DIR`: SVG charts of a replay (plotters).

use gpool_core::sim::Outcome;
use plotters::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// The most points of a line of allocation.svg and queue.svg...
const MAX_LINE_POINTS: usize = 1000;
/// ...and of a team's panel in teams.svg (a third of the width).
const MAX_PANEL_POINTS: usize = 400;

/// The points of `values` (time-slice means, `bucket_secs` each) at
/// hours since the first submit, scaled by `scale`: neighbouring slices
/// averaged so that there are at most `max_points`, each a slice of the
/// replay's own span.
pub(super) fn points(values: &[f64], bucket_secs: u64, scale: f64, max_points: usize) -> Vec<(f64, f64)> {
    let per_point = values.len().div_ceil(max_points.max(1)).max(1);
    let hours = bucket_secs as f64 * per_point as f64 / 3600.0;
    values
        .chunks(per_point)
        .enumerate()
        .map(|(i, chunk)| (i as f64 * hours, chunk.iter().sum::<f64>() / chunk.len() as f64 * scale))
        .collect()
}

/// Writes allocation.svg, queue.svg and teams.svg into `dir`.
pub fn write_all(dir: &Path, outcomes: &[&Outcome], guarantees: &BTreeMap<String, u32>) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|err| err.to_string())?;
    let lines = |pick: &dyn Fn(&Outcome) -> &[f64], scale: f64| -> Vec<(String, Vec<(f64, f64)>)> {
        outcomes
            .iter()
            .map(|o| {
                let points = points(pick(o), o.series.bucket_secs, scale, MAX_LINE_POINTS);
                (o.policy.clone(), points)
            })
            .collect()
    };
    line_chart(
        &dir.join("allocation.svg"),
        "GPUs allocated (% of all, per time slice)",
        "% allocated",
        &lines(&|o| &o.series.allocation, 100.0),
        Some(100.0),
    )?;
    line_chart(
        &dir.join("queue.svg"),
        "Jobs waiting",
        "jobs",
        &lines(&|o| &o.series.queued_jobs, 1.0),
        None,
    )?;
    teams_chart(&dir.join("teams.svg"), outcomes, guarantees)
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn line_chart(
    path: &Path,
    title: &str,
    y_label: &str,
    series: &[(String, Vec<(f64, f64)>)],
    y_max: Option<f64>,
) -> Result<(), String> {
    let x_max = series
        .iter()
        .flat_map(|(_, points)| points.last().map(|p| p.0))
        .fold(1.0, f64::max);
    let y_max = y_max.unwrap_or_else(|| {
        series
            .iter()
            .flat_map(|(_, points)| points.iter().map(|p| p.1))
            .fold(1.0, f64::max)
            * 1.05
    });
    let root = SVGBackend::new(path, (1200, 450)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("hours since the first submit")
        .y_desc(y_label)
        .draw()
        .map_err(err)?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(1)))
            .map_err(err)?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

/// One small chart per team: the GPUs it held under each policy, and its
/// guarantee (dashed).
fn teams_chart(path: &Path, outcomes: &[&Outcome], guarantees: &BTreeMap<String, u32>) -> Result<(), String> {
    let Some(first) = outcomes.first() else {
        return Ok(());
    };
    let teams: Vec<&String> = first.series.team_gpus.keys().collect();
    let columns = 3;
    let rows = teams.len().div_ceil(columns).max(1);
    let root = SVGBackend::new(path, (1200, 260 * rows as u32 + 40)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let root = root
        .titled(
            "GPUs each team held (time-slice means) against its guarantee (dashed)",
            ("sans-serif", 22),
        )
        .map_err(err)?;
    let panels = root.split_evenly((rows, columns));
    for (panel, team) in panels.iter().zip(&teams) {
        let guarantee = f64::from(guarantees.get(*team).copied().unwrap_or(0));
        let series: Vec<(String, Vec<(f64, f64)>)> = outcomes
            .iter()
            .map(|o| {
                let points = o.series.team_gpus.get(*team).map_or_else(Vec::new, |values| {
                    points(values, o.series.bucket_secs, 1.0, MAX_PANEL_POINTS)
                });
                (o.policy.clone(), points)
            })
            .collect();
        let x_max = series
            .iter()
            .flat_map(|(_, p)| p.last().map(|p| p.0))
            .fold(1.0, f64::max);
        let y_max = series
            .iter()
            .flat_map(|(_, p)| p.iter().map(|p| p.1))
            .fold(guarantee, f64::max)
            .max(1.0)
            * 1.1;
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("{team} (guarantee {guarantee:.0})"), ("sans-serif", 15))
            .margin(6)
            .x_label_area_size(22)
            .y_label_area_size(40)
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)
            .map_err(err)?;
        chart.configure_mesh().x_labels(5).y_labels(4).draw().map_err(err)?;
        for (i, (_, points)) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(1)))
                .map_err(err)?;
        }
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, guarantee), (x_max, guarantee)],
                6,
                4,
                BLACK.stroke_width(1),
            ))
            .map_err(err)?;
    }
    // The policies' colours, once for all panels.
    for (i, o) in outcomes.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let style = ("sans-serif", 15).into_font().color(&color);
        root.draw(&Text::new(format!("— {}", o.policy), (12 + 140 * i as i32, 0), style))
            .map_err(err)?;
    }
    root.present().map_err(err)
}
