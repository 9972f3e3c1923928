//! Outside changes of scale targets, seen at once: a metadata-only watch
//! of Deployments and StatefulSets (a change of `spec.replicas`, by the
//! HPA, `kubectl scale` or a rollout, moves `metadata.generation`). The
//! engine reads `/scale` at most once per interval; without this, after a
//! manual scale the HPA's next sync would take an answer computed from the
//! old count. Work follows changes: one small event per changed target,
//! whatever the number of ScaledObjects.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use kube::api::Api;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// A scale target whose desired count may have changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TargetChange {
    pub namespace: String,
    /// `Deployment` or `StatefulSet`.
    pub kind: &'static str,
    pub name: String,
}

/// Starts the watches; changes go to `changes`. A watch the API refuses
/// (no RBAC for it) is logged once: engines then read at their interval.
pub(super) fn start(
    client: &kube::Client,
    changes: broadcast::Sender<TargetChange>,
    cancel: &CancellationToken,
) {
    watch::<Deployment>(
        client,
        ("Deployment", "deployments.apps"),
        changes.clone(),
        cancel.clone(),
    );
    watch::<StatefulSet>(
        client,
        ("StatefulSet", "statefulsets.apps"),
        changes,
        cancel.clone(),
    );
}

/// `(kind, resource)`: the kind a change names, the resource a refusal does.
fn watch<K>(
    client: &kube::Client,
    (kind, resource): (&'static str, &'static str),
    changes: broadcast::Sender<TargetChange>,
    cancel: CancellationToken,
) where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    // `PartialObjectMeta` makes every request metadata-only.
    let api: Api<PartialObjectMeta<K>> = Api::all(client.clone());
    let stream = watcher::watcher(api, super::watch_config());
    // Generations last seen: only a spec change is news.
    let generations: Mutex<HashMap<(String, String), i64>> = Mutex::new(HashMap::new());
    super::watched::follow(
        stream,
        (
            resource,
            " (without it, engines read their count once per interval instead of seeing outside changes at once)",
        ),
        // Nobody reads why: engines fall back to reading once per interval.
        Arc::new(Mutex::new(None)),
        cancel,
        move |event| {
            if let Some(change) = changed(kind, event, &generations) {
                let _ = changes.send(change);
            }
        },
    );
}

/// The target an event changed, when its generation moved (or it is new
/// after the first list, or gone).
fn changed<K>(
    kind: &'static str,
    event: &watcher::Event<PartialObjectMeta<K>>,
    generations: &Mutex<HashMap<(String, String), i64>>,
) -> Option<TargetChange> {
    let (meta, deleted) = match event {
        watcher::Event::Apply(object) => (&object.metadata, false),
        watcher::Event::InitApply(object) => (&object.metadata, false),
        watcher::Event::Delete(object) => (&object.metadata, true),
        watcher::Event::Init | watcher::Event::InitDone => return None,
    };
    let key = (meta.namespace.clone()?, meta.name.clone()?);
    let mut generations = generations.lock().unwrap_or_else(|e| e.into_inner());
    let moved = if deleted {
        generations.remove(&key).is_some()
    } else {
        let generation = meta.generation.unwrap_or_default();
        let before = generations.insert(key.clone(), generation);
        // The first list only learns what is there.
        before.is_some_and(|before| before != generation)
            || (before.is_none() && matches!(event, watcher::Event::Apply(_)))
    };
    moved.then_some(TargetChange {
        namespace: key.0,
        kind,
        name: key.1,
    })
}
