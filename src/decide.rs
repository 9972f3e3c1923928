//! `hoist decide`: one engine evaluation from a saved state, for asking
//! "why did it do that" and for replaying a state.

use serde::{Deserialize, Serialize};

use crate::engine::{self, Decision, Millis, Reading, Rules, State, hpa};
use crate::metadata::MetadataError;

/// Everything one evaluation needs.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DecideInput {
    #[serde(default)]
    pub rules: Rules,
    #[serde(default)]
    pub state: State,
    pub readings: Vec<Reading>,
    /// Wall-clock milliseconds since the Unix epoch.
    pub now: Millis,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DecideOutput {
    pub decision: Decision,
    pub state: State,
}

#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    #[error("input is not a decide document: at `{path}`: {reason}")]
    Input { path: String, reason: String },
    /// The cause follows in the error chain.
    #[error("invalid rules")]
    Rules(#[from] MetadataError),
}

pub fn decide(input: &str) -> Result<DecideOutput, DecideError> {
    let mut document = serde_json::Deserializer::from_str(input);
    let mut input: DecideInput =
        serde_path_to_error::deserialize(&mut document).map_err(|error| DecideError::Input {
            path: error.path().to_string(),
            reason: error.inner().to_string(),
        })?;
    input.rules.validate()?;
    for (index, reading) in input.readings.iter().enumerate() {
        check_reading(reading).map_err(|(field, reason)| DecideError::Input {
            path: format!("readings[{index}].{field}"),
            reason: reason.into(),
        })?;
    }
    let decision = engine::decide(&mut input.state, &input.rules, &input.readings, input.now);
    Ok(DecideOutput {
        decision,
        state: input.state,
    })
}

/// The numbers a reading must hold for the HPA's arithmetic; the field and
/// the reason otherwise. (The engine itself takes any reading: a value it
/// cannot use is a failed reading, never a zero.)
fn check_reading(reading: &Reading) -> Result<(), (&'static str, &'static str)> {
    if hpa::milli(reading.target).is_none_or(|target| target <= 0) {
        return Err(("target", "must be a number of at least 0.001"));
    }
    if !reading.activation_target.is_finite() {
        return Err(("activationTarget", "must be a finite number"));
    }
    let numbers = [
        ("value", reading.value.value()),
        ("activity", reading.activity),
    ];
    for (field, number) in numbers {
        if number.is_some_and(|n| !n.is_finite() || n < 0.0) {
            return Err((field, "must be a finite number of at least 0"));
        }
    }
    Ok(())
}
