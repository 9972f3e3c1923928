//! `hoist decide`: one engine evaluation from a saved state, for asking
//! "why did it do that" and for replaying a state.

use serde::{Deserialize, Serialize};

use crate::engine::{self, Decision, Millis, Reading, Rules, State};
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
    let decision = engine::decide(&mut input.state, &input.rules, &input.readings, input.now);
    Ok(DecideOutput {
        decision,
        state: input.state,
    })
}
