//! The results line: every measuring subcommand prints one JSON object on
//! standard output, which `scripts/bench.sh` collects and `report` reads.

use serde_json::{Value, json};

pub(crate) fn emit(result: Value) {
    println!("{result}");
}

/// The value at quantile `q` of sorted values (the nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// Median, max, min and the samples themselves, sorted, as a results line
/// holds a latency.
pub(crate) fn summary(values: &mut [f64]) -> Value {
    values.sort_by(f64::total_cmp);
    json!({
        "median": quantile(values, 0.5),
        "max": values.last().copied().unwrap_or(f64::NAN),
        "min": values.first().copied().unwrap_or(f64::NAN),
        "samples": values,
    })
}
