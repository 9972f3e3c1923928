//! `hoist simulate`: replays a metric trace through the engine and shows
//! what it would have done, as a table and optionally as an SVG chart.

use std::fmt::Write as _;
use std::path::Path;

use serde::Deserialize;

use crate::engine::{self, Decision, Observation, Rules};
use crate::metadata::MetadataError;

#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: {reason}")]
    Scenario { path: String, reason: String },
    /// The cause follows in the error chain.
    #[error("invalid rules")]
    Rules(#[from] MetadataError),
    #[error("trace line {line}: {reason}")]
    Trace { line: usize, reason: String },
}

/// The rules file: engine rules (ScaledObject key names) and the triggers
/// the trace's columns stand for.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Scenario {
    #[serde(default)]
    pub rules: Rules,
    pub triggers: Vec<TriggerSpec>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TriggerSpec {
    /// The trace column holding this trigger's values.
    pub name: String,
    /// Target value per replica (`listLength`, `messageCount`, ...).
    pub target: f64,
    #[serde(default)]
    pub activation_target: f64,
}

/// One trace row: seconds since the start, then each trigger's reading in
/// scenario order.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub seconds: f64,
    pub readings: Vec<Observation>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub sample: Sample,
    pub decision: Decision,
}

/// Reads a scenario from TOML (or JSON when the file ends in `.json`).
pub fn load_scenario(path: &Path) -> Result<Scenario, SimulateError> {
    let text = read(path)?;
    let shown = path.display().to_string();
    let scenario: Scenario = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).map_err(|e| SimulateError::Scenario {
            path: shown.clone(),
            reason: e.to_string(),
        })?
    } else {
        toml::from_str(&text).map_err(|e| SimulateError::Scenario {
            path: shown.clone(),
            reason: e.to_string(),
        })?
    };
    if scenario.triggers.is_empty() {
        return Err(SimulateError::Scenario {
            path: shown,
            reason: "no [[triggers]]: name at least one trace column and its target".into(),
        });
    }
    if let Some(bad) = scenario
        .triggers
        .iter()
        .find(|t| t.target <= 0.0 || !t.target.is_finite())
    {
        return Err(SimulateError::Scenario {
            path: shown,
            reason: format!("trigger `{}`: target must be above 0", bad.name),
        });
    }
    scenario.rules.validate()?;
    Ok(scenario)
}

pub fn read(path: &Path) -> Result<String, SimulateError> {
    std::fs::read_to_string(path).map_err(|source| SimulateError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// Parses a CSV trace: a `time` column (seconds, non-decreasing), then one
/// column per trigger. An empty cell or `error` is a failed reading.
pub fn parse_trace(csv_text: &str, scenario: &Scenario) -> Result<Vec<Sample>, SimulateError> {
    let mut reader = csv::ReaderBuilder::new()
        .trim(csv::Trim::All)
        .from_reader(csv_text.as_bytes());
    let header = reader
        .headers()
        .map_err(|e| SimulateError::Trace {
            line: 1,
            reason: e.to_string(),
        })?
        .clone();
    if header.get(0) != Some("time") {
        return Err(SimulateError::Trace {
            line: 1,
            reason: "the first column must be `time` (seconds)".into(),
        });
    }
    let columns: Vec<usize> = scenario
        .triggers
        .iter()
        .map(|trigger| {
            header
                .iter()
                .position(|name| name == trigger.name)
                .ok_or_else(|| SimulateError::Trace {
                    line: 1,
                    reason: format!("no column for trigger `{}`", trigger.name),
                })
        })
        .collect::<Result<_, _>>()?;
    let mut samples: Vec<Sample> = Vec::new();
    for (index, record) in reader.records().enumerate() {
        let line = index + 2;
        let record = record.map_err(|e| SimulateError::Trace {
            line,
            reason: e.to_string(),
        })?;
        let seconds: f64 = record
            .get(0)
            .and_then(|t| t.parse().ok())
            .filter(|t: &f64| t.is_finite() && *t >= 0.0)
            .ok_or_else(|| SimulateError::Trace {
                line,
                reason: format!(
                    "`{}` is not a time in seconds",
                    record.get(0).unwrap_or_default()
                ),
            })?;
        if samples.last().is_some_and(|last| last.seconds > seconds) {
            return Err(SimulateError::Trace {
                line,
                reason: "time goes backwards".into(),
            });
        }
        let readings = columns
            .iter()
            .zip(&scenario.triggers)
            .map(
                |(&column, trigger)| match record.get(column).unwrap_or_default() {
                    "" | "error" => Ok(Observation::Error("failed reading in the trace".into())),
                    cell => cell
                        .parse::<f64>()
                        .ok()
                        .filter(|v| v.is_finite())
                        .map(Observation::Value)
                        .ok_or_else(|| SimulateError::Trace {
                            line,
                            reason: format!("`{cell}` is not a number for `{}`", trigger.name),
                        }),
                },
            )
            .collect::<Result<_, _>>()?;
        samples.push(Sample { seconds, readings });
    }
    Ok(samples)
}

/// Runs the engine on each sample in turn (each row is one poll).
pub fn simulate(scenario: &Scenario, samples: &[Sample]) -> Vec<Step> {
    let mut state = engine::State::default();
    samples
        .iter()
        .map(|sample| {
            let now = (sample.seconds * 1000.0).round() as u64;
            let readings: Vec<engine::Reading> = scenario
                .triggers
                .iter()
                .zip(&sample.readings)
                .map(|(trigger, value)| engine::Reading {
                    trigger: trigger.name.clone(),
                    target: trigger.target,
                    activation_target: trigger.activation_target,
                    value: value.clone(),
                    activity: None,
                    at: now,
                })
                .collect();
            let decision = engine::decide(&mut state, &scenario.rules, &readings, now);
            Step {
                sample: sample.clone(),
                decision,
            }
        })
        .collect()
}

/// The timeline as a table: one line per sample.
pub fn timeline(scenario: &Scenario, steps: &[Step]) -> String {
    let mut out = String::new();
    let _ = write!(out, "{:>8}", "time");
    for trigger in &scenario.triggers {
        let _ = write!(out, "  {:>10}", trigger.name);
    }
    let _ = writeln!(
        out,
        "  {:<6}  {:>8}  {:<19}  message",
        "active", "replicas", "reason"
    );
    for step in steps {
        let _ = write!(out, "{:>8}", step.sample.seconds);
        for reading in &step.sample.readings {
            match reading {
                Observation::Value(value) => {
                    let _ = write!(out, "  {value:>10}");
                }
                Observation::Error(_) => {
                    let _ = write!(out, "  {:>10}", "error");
                }
            }
        }
        let decision = &step.decision;
        let _ = writeln!(
            out,
            "  {:<6}  {:>8}  {:<19}  {}",
            if decision.active { "yes" } else { "no" },
            decision.replicas,
            format!("{:?}", decision.reason),
            decision.message
        );
    }
    out
}

const COLOURS: [&str; 6] = [
    "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// Readings (thin lines, left axis) and replicas (thick steps, right axis)
/// over time. Hand-written SVG: the chart is a few paths and labels, and
/// plotting crates need a font engine to lay out text.
pub fn svg(scenario: &Scenario, steps: &[Step]) -> String {
    let (width, height) = (960.0, 420.0);
    let (left, right, top, bottom) = (70.0, 70.0, 40.0, 50.0);
    let plot_w = width - left - right;
    let plot_h = height - top - bottom;
    let t_end = steps.last().map_or(1.0, |s| s.sample.seconds).max(1.0);
    let v_max = steps
        .iter()
        .flat_map(|s| s.sample.readings.iter().filter_map(Observation::value))
        .fold(1.0_f64, f64::max);
    let r_max = f64::from(scenario.rules.max_replica_count.max(1));
    let x = |t: f64| left + t / t_end * plot_w;
    let yv = |v: f64| top + plot_h - v / v_max * plot_h;
    let yr = |r: f64| top + plot_h - r / r_max * plot_h;

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        out,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">hoist simulate: readings and replicas over time</text>"#,
        width / 2.0
    );
    // Grid and axes.
    for i in 0..=5 {
        let fraction = f64::from(i) / 5.0;
        let y = top + plot_h - fraction * plot_h;
        let _ = writeln!(
            out,
            r##"<line x1="{left}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e5e5e5"/>"##,
            left + plot_w
        );
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#555">{}</text>"##,
            left - 6.0,
            y + 4.0,
            trim(fraction * v_max)
        );
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" fill="#d62728">{}</text>"##,
            left + plot_w + 6.0,
            y + 4.0,
            trim(fraction * r_max)
        );
        let t = fraction * t_end;
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#555">{}</text>"##,
            x(t),
            top + plot_h + 18.0,
            clock(t)
        );
    }
    let _ = writeln!(
        out,
        r##"<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#999"/>"##
    );
    let _ = writeln!(
        out,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="#555">time</text>"##,
        left + plot_w / 2.0,
        height - 10.0
    );
    // Readings.
    for (index, trigger) in scenario.triggers.iter().enumerate() {
        let colour = COLOURS[index % COLOURS.len()];
        let points: Vec<String> = steps
            .iter()
            .filter_map(|s| {
                s.sample.readings[index]
                    .value()
                    .map(|v| format!("{:.1},{:.1}", x(s.sample.seconds), yv(v)))
            })
            .collect();
        let _ = writeln!(
            out,
            r#"<polyline points="{}" fill="none" stroke="{colour}" stroke-width="1.5"/>"#,
            points.join(" ")
        );
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" fill="{colour}">{} (target {})</text>"#,
            left + 10.0,
            top + 16.0 + 16.0 * index as f64,
            escape(&trigger.name),
            trim(trigger.target)
        );
    }
    // Failed readings: red ticks along the time axis.
    let failures: Vec<f64> = steps
        .iter()
        .filter(|s| s.sample.readings.iter().any(Observation::is_error))
        .map(|s| x(s.sample.seconds))
        .collect();
    for px in &failures {
        let _ = writeln!(
            out,
            r##"<line x1="{px:.1}" y1="{:.1}" x2="{px:.1}" y2="{:.1}" stroke="#d62728" stroke-width="2"/>"##,
            top + plot_h - 8.0,
            top + plot_h
        );
    }
    if !failures.is_empty() {
        let _ = writeln!(
            out,
            r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#d62728">| failed reading</text>"##,
            left + plot_w - 10.0,
            top + 32.0
        );
    }
    // Replicas as steps.
    let mut path = String::new();
    for (index, step) in steps.iter().enumerate() {
        let (px, py) = (
            x(step.sample.seconds),
            yr(f64::from(step.decision.replicas)),
        );
        if index == 0 {
            let _ = write!(path, "M{px:.1},{py:.1}");
        } else {
            let _ = write!(path, " H{px:.1} V{py:.1}");
        }
    }
    let _ = writeln!(
        out,
        r##"<path d="{path}" fill="none" stroke="#d62728" stroke-width="3"/>"##
    );
    let _ = writeln!(
        out,
        r##"<text x="{:.1}" y="{:.1}" text-anchor="end" fill="#d62728">replicas (max {})</text>"##,
        left + plot_w - 10.0,
        top + 16.0,
        scenario.rules.max_replica_count
    );
    out.push_str("</svg>\n");
    out
}

fn trim(value: f64) -> String {
    let rounded = (value * 10.0).round() / 10.0;
    if rounded.fract() == 0.0 {
        format!("{}", rounded as i64)
    } else {
        format!("{rounded}")
    }
}

fn clock(seconds: f64) -> String {
    let s = seconds.round() as u64;
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
