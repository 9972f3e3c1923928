//! The little of KEDA's ScaledObject status hoist keeps, and what it reads
//! there: whether KEDA failed to set a ScaledObject up (kedacore/keda#5787).
//!
//! KEDA reconciles a ScaledObject by asking each external scaler for its
//! metric spec. If hoist cannot be reached then (hoist installed with the
//! ScaledObjects, a rollout of hoist, a network policy), KEDA marks the
//! ScaledObject `Ready=False` with reason `ScaledObjectCheckFailed` and
//! makes no HPA. KEDA 2.20 tries again on controller-runtime's per-object
//! backoff (5 ms doubling to 1000 s): measured with the real operator, a
//! ScaledObject hoist missed for 15 s got its HPA 5.8 s after hoist
//! answered; after a longer outage the wait is as long as the outage, up to
//! about 17 minutes, and nothing scales meanwhile. hoist sees the
//! condition in the watch it already has and says so: an Event on the
//! ScaledObject, a gauge, `/status`.
//!
//! Who writes this: KEDA's operator, through the API server, into objects
//! hoist only watches; the message is KEDA's (it quotes the scaler's
//! error, never a credential) and is cut short before hoist repeats it.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::DynamicObject;
use serde_json::{Map, Value};

/// KEDA's reason for a ScaledObject it could not set up
/// (`controllers/keda/scaledobject_controller.go`).
const CHECK_FAILED: &str = "ScaledObjectCheckFailed";

/// How much of KEDA's message hoist keeps and repeats.
const MESSAGE_LIMIT: usize = 400;

/// The status fields hoist keeps from a ScaledObject or ScaledJob: the HPA
/// KEDA made and the `Ready` condition. The rest (`lastActiveTime`, health,
/// the other conditions, rewritten on every poll of an active object) is
/// dropped from the store.
pub(super) fn keep_readiness(status: Value) -> Option<Value> {
    let mut kept = Map::new();
    if let Some(hpa) = status.get("hpaName").filter(|name| name.is_string()) {
        kept.insert("hpaName".into(), hpa.clone());
    }
    let ready = status
        .get("conditions")
        .and_then(Value::as_array)
        .and_then(|conditions| {
            conditions
                .iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))
        });
    if let Some(ready) = ready {
        let mut condition = Map::new();
        for field in ["type", "status", "reason"] {
            if let Some(value) = ready.get(field).filter(|v| v.is_string()) {
                condition.insert(field.into(), value.clone());
            }
        }
        if let Some(message) = ready.get("message").and_then(Value::as_str) {
            condition.insert("message".into(), Value::String(cut(message)));
        }
        kept.insert(
            "conditions".into(),
            Value::Array(vec![Value::Object(condition)]),
        );
    }
    (!kept.is_empty()).then_some(Value::Object(kept))
}

fn cut(message: &str) -> String {
    match message.char_indices().nth(MESSAGE_LIMIT) {
        Some((end, _)) => format!("{}…", &message[..end]),
        None => message.to_string(),
    }
}

/// A ScaledObject that calls hoist and that KEDA could not set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreconciled {
    pub namespace: String,
    pub name: String,
    pub uid: Option<String>,
    /// KEDA's own message, cut short.
    pub message: String,
}

impl Unreconciled {
    /// The ScaledObject, for an Event on it.
    pub fn reference(&self) -> ObjectReference {
        super::object::scaled_object_reference(&self.namespace, &self.name, self.uid.clone(), None)
    }
}

/// `object` if it is a ScaledObject with a trigger for this hoist
/// (`external` or `external-push` with hoist's `scaler` key, and a
/// `scalerAddress` on `grpc_port` when that is known) that KEDA marks
/// `Ready=False/ScaledObjectCheckFailed` and has made no HPA for. With an
/// HPA, KEDA's adapter asks hoist again on the HPA's next sync by itself.
/// The port keeps apart hoists that watch one cluster for different
/// ScaledObjects (another install, a test's other hoists): each speaks
/// only of those KEDA calls it for. Replicas of one hoist each speak.
pub fn unreconciled(object: &DynamicObject, grpc_port: Option<u16>) -> Option<Unreconciled> {
    let on_our_port = |trigger: &Value| {
        let Some(port) = grpc_port else {
            return true;
        };
        trigger
            .pointer("/metadata/scalerAddress")
            .and_then(Value::as_str)
            .and_then(|address| address.rsplit_once(':'))
            .and_then(|(_, written)| written.parse::<u16>().ok())
            == Some(port)
    };
    let calls_hoist = object
        .data
        .pointer("/spec/triggers")
        .and_then(Value::as_array)?
        .iter()
        .any(|trigger| {
            matches!(
                trigger.get("type").and_then(Value::as_str),
                Some("external" | "external-push")
            ) && trigger.pointer("/metadata/scaler").is_some()
                && on_our_port(trigger)
        });
    let status = object.data.get("status")?;
    let no_hpa = status
        .get("hpaName")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty);
    let ready = status.pointer("/conditions/0")?;
    let field = |name: &str| ready.get(name).and_then(Value::as_str).unwrap_or_default();
    let failed =
        field("type") == "Ready" && field("status") == "False" && field("reason") == CHECK_FAILED;
    (calls_hoist && no_hpa && failed).then(|| Unreconciled {
        namespace: object.metadata.namespace.clone().unwrap_or_default(),
        name: object.metadata.name.clone().unwrap_or_default(),
        uid: object.metadata.uid.clone(),
        message: field("message").to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A ScaledObject as KEDA 2.20 leaves it when hoist cannot be reached:
    /// the status fields as the real operator wrote them in
    /// tests/controlplane.rs.
    fn object(triggers: Value, status: Value) -> DynamicObject {
        let mut object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "keda.sh/v1alpha1",
            "kind": "ScaledObject",
            "metadata": {"name": "worker", "namespace": "jobs", "uid": "u-1"},
            "spec": {"scaleTargetRef": {"name": "worker"}, "triggers": triggers},
        }))
        .unwrap();
        if let Some(kept) = keep_readiness(status) {
            object.data["status"] = kept;
        }
        object
    }

    fn hoist_trigger() -> Value {
        json!([{"type": "external", "metadata": {"scalerAddress": "hoist:9090", "scaler": "redis"}}])
    }

    fn failed(hpa: Option<&str>) -> Value {
        let mut status = json!({
            "conditions": [
                {"type": "Ready", "status": "False", "reason": "ScaledObjectCheckFailed",
                 "message": "failed to ensure HPA is correctly created for ScaledObject: connection refused"},
                {"type": "Active", "status": "Unknown"},
                {"type": "Fallback", "status": "Unknown"},
            ],
            "lastActiveTime": "2026-11-28T09:00:00Z",
        });
        if let Some(hpa) = hpa {
            status["hpaName"] = json!(hpa);
        }
        status
    }

    fn unreconciled_any(object: &DynamicObject) -> Option<Unreconciled> {
        unreconciled(object, None)
    }

    #[test]
    fn only_the_hoist_on_the_trigger_s_port_speaks_of_it() {
        let object = object(hoist_trigger(), failed(None));
        assert!(unreconciled(&object, Some(9090)).is_some());
        assert_eq!(unreconciled(&object, Some(9091)), None);
    }

    #[test]
    fn keda_failing_to_set_up_a_hoist_scaledobject_is_seen() {
        let found = unreconciled_any(&object(hoist_trigger(), failed(None))).unwrap();
        assert_eq!(
            (found.namespace.as_str(), found.name.as_str()),
            ("jobs", "worker")
        );
        assert!(found.message.ends_with("connection refused"));
    }

    #[test]
    fn with_an_hpa_another_scaler_or_a_ready_object_there_is_nothing_to_say() {
        assert_eq!(
            unreconciled_any(&object(hoist_trigger(), failed(Some("keda-hpa-worker")))),
            None
        );
        let keda_redis =
            json!([{"type": "redis", "metadata": {"address": "redis:6379", "listName": "jobs"}}]);
        assert_eq!(unreconciled_any(&object(keda_redis, failed(None))), None);
        let another_external =
            json!([{"type": "external", "metadata": {"scalerAddress": "other:9090"}}]);
        assert_eq!(
            unreconciled_any(&object(another_external, failed(None))),
            None
        );
        let mut ready = failed(None);
        ready["conditions"][0]["status"] = json!("True");
        ready["conditions"][0]["reason"] = json!("ScaledObjectReady");
        assert_eq!(unreconciled_any(&object(hoist_trigger(), ready)), None);
        assert_eq!(unreconciled_any(&object(hoist_trigger(), json!({}))), None);
    }

    #[test]
    fn the_store_keeps_only_the_hpa_and_a_short_ready_condition() {
        let mut status = failed(Some("keda-hpa-worker"));
        status["conditions"][0]["message"] = json!("x".repeat(5000));
        let kept = keep_readiness(status).unwrap();
        assert_eq!(kept["hpaName"], "keda-hpa-worker");
        let conditions = kept["conditions"].as_array().unwrap();
        assert_eq!(conditions.len(), 1);
        assert_eq!(conditions[0]["type"], "Ready");
        assert_eq!(
            conditions[0]["message"].as_str().unwrap().chars().count(),
            MESSAGE_LIMIT + 1
        );
        assert!(kept.get("lastActiveTime").is_none());
        assert_eq!(keep_readiness(json!({"lastActiveTime": "x"})), None);
    }
}
