//! KEDA's CRDs (tests/data/keda-crds) as schemas to check objects against:
//! types, enums, patterns, required fields, and no field the structural
//! schema does not declare (the API server would drop it).

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::{json, parse, root};

/// The KEDA kinds hoist's files hold, and the CRD file of each.
pub const KINDS: [(&str, &str); 4] = [
    ("ScaledObject", "scaledobjects.yaml"),
    ("ScaledJob", "scaledjobs.yaml"),
    ("TriggerAuthentication", "triggerauthentications.yaml"),
    (
        "ClusterTriggerAuthentication",
        "clustertriggerauthentications.yaml",
    ),
];

/// group/version → schema of the CRD in tests/data/keda-crds/`file`.
fn keda_schemas(file: &str) -> BTreeMap<String, Value> {
    let path = format!("tests/data/keda-crds/{file}");
    let text = std::fs::read_to_string(root().join(&path)).unwrap();
    let crd = json(&parse(&path, &text)[0]);
    let group = crd["spec"]["group"].as_str().unwrap();
    crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                format!("{group}/{}", v["name"].as_str().unwrap()),
                v["schema"]["openAPIV3Schema"].clone(),
            )
        })
        .collect()
}

/// kind → (group/version → schema) of every KEDA kind.
fn all_schemas() -> BTreeMap<&'static str, BTreeMap<String, Value>> {
    KINDS
        .iter()
        .map(|(kind, file)| (*kind, keda_schemas(file)))
        .collect()
}

/// The KEDA kinds the shipped files and the docs hold: one of each.
pub fn kinds_shown() -> BTreeSet<String> {
    [
        "ClusterTriggerAuthentication",
        "ScaledObject",
        "TriggerAuthentication",
    ]
    .map(String::from)
    .into()
}

/// KEDA's schemas: every kind's at KEDA's version here, and the
/// ScaledObject's of KEDA 2.16, the oldest KEDA the docs address.
pub struct Keda {
    schemas: BTreeMap<&'static str, BTreeMap<String, Value>>,
    older_scaled_object: BTreeMap<String, Value>,
}

impl Keda {
    pub fn load() -> Self {
        Self {
            schemas: all_schemas(),
            older_scaled_object: keda_schemas("scaledobjects-v2.16.0.yaml"),
        }
    }

    /// Whether `kind` is one of KEDA's.
    pub fn serves(&self, kind: &str) -> bool {
        self.schemas.contains_key(kind)
    }

    /// What the API server would refuse or drop of a KEDA `object`, at
    /// both KEDA versions for a ScaledObject.
    pub fn errors(&self, object: &Value) -> Vec<String> {
        let kind = object["kind"].as_str().unwrap_or_default();
        let version = object["apiVersion"].as_str().unwrap_or_default();
        let Some(schema) = self.schemas.get(kind).and_then(|v| v.get(version)) else {
            return vec![format!("KEDA serves no {version} {kind}")];
        };
        let mut errors = crd_errors(object, schema);
        if kind == "ScaledObject" {
            let older = crd_errors(object, &self.older_scaled_object[version]);
            errors.extend(older.into_iter().map(|e| format!("(KEDA 2.16) {e}")));
        }
        errors
    }
}

/// What the API server would refuse or drop of `object`.
fn crd_errors(object: &Value, schema: &Value) -> Vec<String> {
    let mut errors = Vec::new();
    // metadata is the API server's, not the CRD's.
    let mut object = object.clone();
    object.as_object_mut().unwrap().remove("metadata");
    check_schema("", &object, schema, &mut errors);
    errors
}

/// Validates `value` against a CRD's structural schema.
fn check_schema(path: &str, value: &Value, schema: &Value, errors: &mut Vec<String>) {
    if schema["x-kubernetes-int-or-string"] == true {
        if !(value.is_string() || value.is_i64() || value.is_u64()) {
            errors.push(format!("{path}: not an int or string"));
        }
        return;
    }
    let ty = schema["type"].as_str().unwrap_or_default();
    let type_ok = match ty {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "boolean" => value.is_boolean(),
        _ => true,
    };
    if !type_ok {
        errors.push(format!("{path}: `{value}` is not of type {ty}"));
        return;
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        errors.push(format!("{path}: `{value}` is not one of {allowed:?}"));
    }
    if let Some(pattern) = schema["pattern"].as_str()
        && let Some(text) = value.as_str()
        && !regex::Regex::new(pattern).unwrap().is_match(text)
    {
        errors.push(format!("{path}: `{text}` does not match {pattern}"));
    }
    match value {
        Value::Object(map) => {
            for required in schema["required"].as_array().into_iter().flatten() {
                if !map.contains_key(required.as_str().unwrap()) {
                    errors.push(format!("{path}: `{required}` is required"));
                }
            }
            let preserve = schema["x-kubernetes-preserve-unknown-fields"] == true;
            for (key, item) in map {
                let child = format!("{path}.{key}");
                if let Some(declared) = schema["properties"].get(key) {
                    check_schema(&child, item, declared, errors);
                } else if let Some(additional) = schema.get("additionalProperties") {
                    if additional.is_object() {
                        check_schema(&child, item, additional, errors);
                    }
                } else if !(preserve || path.ends_with(".metadata")) {
                    errors.push(format!(
                        "{child}: not in the schema (the API server drops it)"
                    ));
                }
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                check_schema(&format!("{path}[{i}]"), item, &schema["items"], errors);
            }
        }
        _ => {}
    }
}
