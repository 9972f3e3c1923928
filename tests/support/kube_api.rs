//! A stand-in for the Kubernetes API server on loopback. No real API server
//! can run on these machines (none is packaged for the registries they
//! reach), so this serves the few paths hoist uses, with the JSON shapes of
//! the real API: cluster-wide lists and watches of ScaledObjects,
//! TriggerAuthentications, ClusterTriggerAuthentications
//! (`keda.sh/v1alpha1`) and Secrets (`v1`, `data` base64-encoded), the
//! `/scale` subresource (`autoscaling/v1` Scale)
//! of Deployments, StatefulSets and a custom resource, API discovery for
//! that resource, `events.k8s.io/v1` Events, and `authentication.k8s.io/v1`
//! TokenReviews of a table of valid tokens. Failures are switched on
//! per test: the API down (503), RBAC refusals (403).

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::BroadcastStream;

/// A resource served with list and watch: (path segments of its
/// cluster-wide list, apiVersion, kind, namespaced).
const COLLECTIONS: [(&[&str], &str, &str, bool); 7] = [
    (
        &["apis", "apps", "v1", "deployments"],
        "apps/v1",
        "Deployment",
        true,
    ),
    (
        &["apis", "apps", "v1", "statefulsets"],
        "apps/v1",
        "StatefulSet",
        true,
    ),
    (
        &["apis", "keda.sh", "v1alpha1", "scaledobjects"],
        "keda.sh/v1alpha1",
        "ScaledObject",
        true,
    ),
    (
        &["apis", "keda.sh", "v1alpha1", "scaledjobs"],
        "keda.sh/v1alpha1",
        "ScaledJob",
        true,
    ),
    (
        &["apis", "keda.sh", "v1alpha1", "triggerauthentications"],
        "keda.sh/v1alpha1",
        "TriggerAuthentication",
        true,
    ),
    (
        &[
            "apis",
            "keda.sh",
            "v1alpha1",
            "clustertriggerauthentications",
        ],
        "keda.sh/v1alpha1",
        "ClusterTriggerAuthentication",
        false,
    ),
    (&["api", "v1", "secrets"], "v1", "Secret", true),
];

/// The plural (last path segment) that names a collection.
fn plural(segments: &[&str]) -> String {
    segments[segments.len() - 1].to_string()
}

#[derive(Default)]
struct ApiState {
    resource_version: u64,
    /// Objects by plural, then (namespace, name); cluster-scoped ones have
    /// an empty namespace.
    objects: BTreeMap<String, BTreeMap<(String, String), Value>>,
    /// Watch events so far: (resourceVersion, plural, JSON line).
    history: Vec<(u64, String, String)>,
    /// Scales by (plural, namespace, name): (spec, status).
    scales: BTreeMap<(String, String, String), (i64, i64)>,
    /// Custom kinds discovery serves: (group/version) → [(kind, plural)].
    kinds: BTreeMap<String, Vec<(String, String)>>,
    events: Vec<Value>,
    scale_reads: u64,
    down: bool,
    /// Requests wait unanswered while set.
    hung: bool,
    /// Requests arriving while set are never answered.
    swallowing: bool,
    /// TokenReview: valid tokens → (user, audiences they were issued for).
    tokens: BTreeMap<String, (String, Vec<String>)>,
    token_reviews: u64,
    forbid_scale: bool,
    /// Plurals whose list and watch answer 403.
    forbidden: BTreeSet<String>,
    /// ScaledObjects created so far (their creation times follow).
    created: u64,
}

/// The fake API server and a kubeconfig pointing at it.
pub struct FakeApi {
    pub addr: SocketAddr,
    state: Arc<Mutex<ApiState>>,
    live: broadcast::Sender<(u64, String, String)>,
    dir: tempfile::TempDir,
}

impl FakeApi {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(ApiState::default()));
        let live = broadcast::channel(1024).0;
        let (shared, sender) = (state.clone(), live.clone());
        let app = axum::Router::new().fallback(move |method: Method, uri: Uri, body: Bytes| {
            let (state, live) = (shared.clone(), sender.clone());
            async move {
                // Swallowed: a request that never gets an answer at all.
                if state.lock().unwrap().swallowing {
                    return std::future::pending().await;
                }
                // A hung API server: the request waits, unanswered, for
                // as long as the hang lasts.
                while state.lock().unwrap().hung {
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                handle(&state, &live, method, uri, body)
            }
        });
        tokio::spawn(async move { axum::serve(listener, app).await });
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: http://{addr}\n\
             contexts:\n- name: fake\n  context:\n    cluster: fake\n    user: fake\n    namespace: default\n\
             current-context: fake\nusers:\n- name: fake\n  user:\n    token: fake-token\n"
        );
        std::fs::write(dir.path().join("kubeconfig"), kubeconfig).unwrap();
        Self {
            addr,
            state,
            live,
            dir,
        }
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.path().join("kubeconfig")
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ApiState> {
        self.state.lock().unwrap()
    }

    /// Creates or replaces a ScaledObject from its `spec`. A new one is
    /// created a second after the one before (`creationTimestamp`).
    pub fn put_scaled_object(&self, namespace: &str, name: &str, spec: Value) {
        let existing = self
            .lock()
            .objects
            .get("scaledobjects")
            .and_then(|objects| objects.get(&(namespace.to_string(), name.to_string())))
            .map(|object| object["metadata"]["creationTimestamp"].clone());
        let created = existing.unwrap_or_else(|| {
            let mut state = self.lock();
            state.created += 1;
            let seconds = state.created;
            json!(format!(
                "2026-01-{:02}T{:02}:{:02}:{:02}Z",
                1 + seconds / 86_400,
                seconds / 3600 % 24,
                seconds / 60 % 60,
                seconds % 60
            ))
        });
        self.put_scaled_object_created(namespace, name, spec, created.as_str().unwrap_or_default());
    }

    /// Creates or replaces a ScaledObject with its own creation time
    /// (RFC 3339, as the API writes it).
    pub fn put_scaled_object_created(
        &self,
        namespace: &str,
        name: &str,
        spec: Value,
        created: &str,
    ) {
        self.put_object(
            "scaledobjects",
            namespace,
            name,
            json!({"metadata": {"generation": 1, "creationTimestamp": created}, "spec": spec}),
        );
    }

    /// Deletes a ScaledObject (a `DELETED` watch event).
    pub fn delete_scaled_object(&self, namespace: &str, name: &str) {
        self.delete_object("scaledobjects", namespace, name);
    }

    /// Creates or replaces a TriggerAuthentication from its `spec`.
    pub fn put_trigger_authentication(&self, namespace: &str, name: &str, spec: Value) {
        self.put_object(
            "triggerauthentications",
            namespace,
            name,
            json!({"spec": spec}),
        );
    }

    /// Creates or replaces a ClusterTriggerAuthentication from its `spec`.
    pub fn put_cluster_trigger_authentication(&self, name: &str, spec: Value) {
        self.put_object(
            "clustertriggerauthentications",
            "",
            name,
            json!({"spec": spec}),
        );
    }

    /// Creates or replaces an Opaque Secret; the API stores and serves
    /// `data` base64-encoded (a stored Secret never has `stringData`).
    pub fn put_secret(&self, namespace: &str, name: &str, data: &[(&str, &str)]) {
        use base64::Engine;
        let encoded: serde_json::Map<String, Value> = data
            .iter()
            .map(|(key, value)| {
                let value = base64::engine::general_purpose::STANDARD.encode(value);
                (key.to_string(), Value::String(value))
            })
            .collect();
        self.put_object(
            "secrets",
            namespace,
            name,
            json!({"type": "Opaque", "data": encoded}),
        );
    }

    /// Creates or replaces any served object (`plural`: `scaledobjects`,
    /// `triggerauthentications`, `clustertriggerauthentications`,
    /// `secrets`; `namespace` empty for a cluster-scoped one). `body`
    /// holds the fields besides apiVersion and kind; its `metadata` is
    /// completed with name, namespace, uid and a new resourceVersion.
    pub fn put_object(&self, plural: &str, namespace: &str, name: &str, body: Value) {
        let (_, api_version, kind, _) = collection(plural);
        let mut state = self.lock();
        state.resource_version += 1;
        let version = state.resource_version;
        let key = (namespace.to_string(), name.to_string());
        let event = if state
            .objects
            .get(plural)
            .is_some_and(|o| o.contains_key(&key))
        {
            "MODIFIED"
        } else {
            "ADDED"
        };
        let mut object = body;
        object["apiVersion"] = json!(api_version);
        object["kind"] = json!(kind);
        let metadata = &mut object["metadata"];
        if metadata.is_null() {
            *metadata = json!({});
        }
        metadata["name"] = json!(name);
        if !namespace.is_empty() {
            metadata["namespace"] = json!(namespace);
        }
        metadata["uid"] = json!(format!("uid-{plural}-{namespace}-{name}"));
        metadata["resourceVersion"] = json!(version.to_string());
        if plural == "scaledobjects" {
            // The uid the ScaledObject tests have always seen.
            metadata["uid"] = json!(format!("uid-{namespace}-{name}"));
        }
        state
            .objects
            .entry(plural.to_string())
            .or_default()
            .insert(key, object.clone());
        Self::record(&mut state, &self.live, plural, version, event, object);
    }

    /// Deletes an object put before; a DELETED event goes to watches.
    pub fn delete_object(&self, plural: &str, namespace: &str, name: &str) {
        let mut state = self.lock();
        let key = (namespace.to_string(), name.to_string());
        let Some(mut object) = state.objects.get_mut(plural).and_then(|o| o.remove(&key)) else {
            return;
        };
        state.resource_version += 1;
        let version = state.resource_version;
        object["metadata"]["resourceVersion"] = json!(version.to_string());
        Self::record(&mut state, &self.live, plural, version, "DELETED", object);
    }

    fn record(
        state: &mut ApiState,
        live: &broadcast::Sender<(u64, String, String)>,
        plural: &str,
        version: u64,
        event: &str,
        object: Value,
    ) {
        let line = json!({"type": event, "object": object}).to_string() + "\n";
        state
            .history
            .push((version, plural.to_string(), line.clone()));
        let _ = live.send((version, plural.to_string(), line));
    }

    /// Sets a target's `/scale`: `plural` is `deployments`,
    /// `statefulsets` or a custom resource's plural.
    pub fn set_scale(&self, plural: &str, namespace: &str, name: &str, spec: i64, status: i64) {
        let before = self.lock().scales.insert(
            (plural.to_string(), namespace.to_string(), name.to_string()),
            (spec, status),
        );
        // Deployments and StatefulSets are objects too: a new
        // `spec.replicas` moves their `metadata.generation`, as the API's.
        if matches!(plural, "deployments" | "statefulsets") {
            let generation = {
                let state = self.lock();
                let old = state
                    .objects
                    .get(plural)
                    .and_then(|objects| objects.get(&(namespace.to_string(), name.to_string())))
                    .and_then(|object| object["metadata"]["generation"].as_i64())
                    .unwrap_or(0);
                if before.is_some_and(|(old_spec, _)| old_spec == spec) {
                    old.max(1)
                } else {
                    old + 1
                }
            };
            self.put_object(
                plural,
                namespace,
                name,
                json!({
                    "metadata": {"generation": generation},
                    "spec": {"replicas": spec},
                    "status": {"replicas": status},
                }),
            );
        }
    }

    /// Serves a custom kind with a scale subresource in discovery.
    pub fn add_kind(&self, group_version: &str, kind: &str, plural: &str) {
        self.lock()
            .kinds
            .entry(group_version.to_string())
            .or_default()
            .push((kind.to_string(), plural.to_string()));
    }

    pub fn set_down(&self, down: bool) {
        self.lock().down = down;
    }

    /// Requests arriving from now until `swallow(false)` are never
    /// answered, not even after (a connection the server lost track of).
    pub fn swallow(&self, swallowing: bool) {
        self.lock().swallowing = swallowing;
    }

    /// Every request waits, unanswered, until `set_hung(false)`.
    pub fn set_hung(&self, hung: bool) {
        self.lock().hung = hung;
    }

    /// A target's `/scale` as set last: (`spec.replicas`, `status.replicas`).
    pub fn scale(&self, plural: &str, namespace: &str, name: &str) -> Option<(i64, i64)> {
        self.lock()
            .scales
            .get(&(plural.to_string(), namespace.to_string(), name.to_string()))
            .copied()
    }

    pub fn forbid_scale(&self, forbid: bool) {
        self.lock().forbid_scale = forbid;
    }

    /// ScaledObjects' list and watch answer 403.
    pub fn forbid_list(&self, forbid: bool) {
        self.forbid("scaledobjects", forbid);
    }

    /// `plural`'s list and watch answer 403, as without RBAC for it.
    pub fn forbid(&self, plural: &str, forbid: bool) {
        let mut state = self.lock();
        if forbid {
            state.forbidden.insert(plural.to_string());
        } else {
            state.forbidden.remove(plural);
        }
    }

    /// Events posted so far (created or patched).
    pub fn events(&self) -> Vec<Value> {
        self.lock().events.clone()
    }

    /// A token TokenReview accepts as `user`'s, issued for `audiences`
    /// (empty: the API server's own, as the default mounted token).
    pub fn add_token(&self, token: &str, user: &str, audiences: &[&str]) {
        let audiences = if audiences.is_empty() {
            vec![API_AUDIENCE.to_string()]
        } else {
            audiences.iter().map(|a| a.to_string()).collect()
        };
        self.lock()
            .tokens
            .insert(token.to_string(), (user.to_string(), audiences));
    }

    /// TokenReviews asked for so far.
    pub fn token_reviews(&self) -> u64 {
        self.lock().token_reviews
    }

    pub fn scale_reads(&self) -> u64 {
        self.lock().scale_reads
    }
}

/// The served collection named by `plural`; a test naming another is wrong.
fn collection(plural: &str) -> (&'static [&'static str], &'static str, &'static str, bool) {
    COLLECTIONS
        .into_iter()
        .find(|(segments, ..)| segments[segments.len() - 1] == plural)
        .unwrap_or_else(|| panic!("the fake API serves no `{plural}`"))
}

/// The audience of tokens issued without one (the API server's own).
const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";

/// `authentication.k8s.io/v1` TokenReview, as the API server answers it:
/// `201 Created` with the request echoed and a `status`; an unknown token
/// or one for none of `spec.audiences` is `authenticated` false (left out)
/// with an `error`.
fn token_review(state: &mut ApiState, body: &Bytes) -> Response {
    state.token_reviews += 1;
    let Ok(mut review) = serde_json::from_slice::<Value>(body) else {
        return status(StatusCode::BAD_REQUEST, "BadRequest", "not a TokenReview");
    };
    let token = review["spec"]["token"].as_str().unwrap_or("");
    let wanted: Vec<String> = match review["spec"]["audiences"].as_array() {
        Some(list) if !list.is_empty() => list
            .iter()
            .filter_map(|a| a.as_str().map(String::from))
            .collect(),
        _ => vec![API_AUDIENCE.to_string()],
    };
    let answer = match state.tokens.get(token) {
        Some((user, issued)) => {
            let common: Vec<&String> = wanted.iter().filter(|a| issued.contains(a)).collect();
            if common.is_empty() {
                json!({"user": {}, "error": "[invalid bearer token, token audiences are invalid]"})
            } else {
                let (namespace, name) = user
                    .strip_prefix("system:serviceaccount:")
                    .and_then(|rest| rest.split_once(':'))
                    .unwrap_or(("", ""));
                json!({
                    "authenticated": true,
                    "user": {
                        "username": user,
                        "uid": format!("uid-{namespace}-{name}"),
                        "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{namespace}"), "system:authenticated"],
                    },
                    "audiences": common,
                })
            }
        }
        None => {
            json!({"user": {}, "error": "[invalid bearer token, square/go-jose: error in cryptographic primitive]"})
        }
    };
    review["status"] = answer;
    review["metadata"] = json!({"creationTimestamp": null});
    (StatusCode::CREATED, axum::Json(review)).into_response()
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    (code, axum::Json(body)).into_response()
}

fn handle(
    state: &Mutex<ApiState>,
    live: &broadcast::Sender<(u64, String, String)>,
    method: Method,
    uri: Uri,
    body: Bytes,
) -> Response {
    let mut guard = state.lock().unwrap();
    if guard.down {
        return status(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        );
    }
    let query = uri.query().unwrap_or("");
    let segments: Vec<&str> = uri.path().trim_matches('/').split('/').collect();
    match (method.clone(), segments.as_slice()) {
        (Method::GET, segments) if COLLECTIONS.iter().any(|(path, ..)| *path == segments) => {
            let plural = plural(segments);
            let (_, api_version, kind, _) = collection(&plural);
            if guard.forbidden.contains(&plural) {
                let group = if api_version == "v1" { "" } else { "keda.sh" };
                return status(
                    StatusCode::FORBIDDEN,
                    "Forbidden",
                    &format!(
                        "{plural}{} is forbidden: User \"system:serviceaccount:keda:hoist\" cannot list resource \"{plural}\" in API group \"{group}\" at the cluster scope",
                        if group.is_empty() {
                            String::new()
                        } else {
                            format!(".{group}")
                        }
                    ),
                );
            }
            if query
                .split('&')
                .any(|pair| pair == "watch=true" || pair == "watch=1")
            {
                let from: u64 = query
                    .split('&')
                    .find_map(|pair| pair.strip_prefix("resourceVersion="))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                // Subscribe before replaying, under the lock: no gap, and
                // replayed events are filtered out of the live ones.
                let receiver = live.subscribe();
                let replay: Vec<(u64, String)> = guard
                    .history
                    .iter()
                    .filter(|(version, of, _)| *version > from && *of == plural)
                    .map(|(version, _, line)| (*version, line.clone()))
                    .collect();
                let last = replay.last().map_or(from, |(version, _)| *version);
                drop(guard);
                let replayed = tokio_stream::iter(replay.into_iter().map(|(_, line)| line));
                let live_lines =
                    BroadcastStream::new(receiver).filter_map(move |event| match event {
                        Ok((version, of, line)) if version > last && of == plural => Some(line),
                        _ => None,
                    });
                // `timeoutSeconds`: the API server ends the watch then.
                let ends = query
                    .split('&')
                    .find_map(|pair| pair.strip_prefix("timeoutSeconds="))
                    .and_then(|seconds| seconds.parse().ok())
                    .map(std::time::Duration::from_secs);
                let end = async move {
                    match ends {
                        Some(after) => tokio::time::sleep(after).await,
                        None => std::future::pending().await,
                    }
                };
                let stream = futures::StreamExt::take_until(replayed.chain(live_lines), end)
                    .map(|line| Ok::<_, std::convert::Infallible>(Bytes::from(line)));
                return Response::builder()
                    .header("content-type", "application/json")
                    .body(Body::from_stream(stream))
                    .unwrap();
            }
            let items: Vec<Value> = guard
                .objects
                .get(&plural)
                .map(|objects| objects.values().cloned().collect())
                .unwrap_or_default();
            axum::Json(json!({
                "apiVersion": api_version,
                "kind": format!("{kind}List"),
                "metadata": {"resourceVersion": guard.resource_version.to_string()},
                "items": items,
            }))
            .into_response()
        }
        (
            Method::GET,
            [
                "apis",
                group,
                version,
                "namespaces",
                namespace,
                plural,
                name,
                "scale",
            ],
        ) => {
            guard.scale_reads += 1;
            if guard.forbid_scale {
                return status(
                    StatusCode::FORBIDDEN,
                    "Forbidden",
                    &format!(
                        "{plural}.{group} \"{name}\" is forbidden: User \"system:serviceaccount:keda:hoist\" cannot get resource \"{plural}/scale\" in API group \"{group}\" in the namespace \"{namespace}\""
                    ),
                );
            }
            let key = (plural.to_string(), namespace.to_string(), name.to_string());
            match guard.scales.get(&key) {
                Some((spec, current)) => axum::Json(json!({
                    "kind": "Scale",
                    "apiVersion": "autoscaling/v1",
                    "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
                    "spec": {"replicas": spec},
                    "status": {"replicas": current, "selector": format!("app={name}")},
                }))
                .into_response(),
                None => status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    &format!("{plural}.{group} \"{name}\" not found ({version})"),
                ),
            }
        }
        (Method::GET, ["apis", group, version]) => {
            let group_version = format!("{group}/{version}");
            let Some(kinds) = guard.kinds.get(&group_version) else {
                return status(
                    StatusCode::NOT_FOUND,
                    "NotFound",
                    "the server could not find the requested resource",
                );
            };
            let mut resources = Vec::new();
            for (kind, plural) in kinds {
                resources.push(json!({
                    "name": plural, "singularName": kind.to_lowercase(), "namespaced": true,
                    "kind": kind, "verbs": ["get", "list", "watch", "patch", "update"],
                }));
                resources.push(json!({
                    "name": format!("{plural}/scale"), "singularName": "", "namespaced": true,
                    "group": "autoscaling", "version": "v1", "kind": "Scale",
                    "verbs": ["get", "patch", "update"],
                }));
            }
            axum::Json(json!({
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": group_version,
                "resources": resources,
            }))
            .into_response()
        }
        (Method::POST, ["apis", "authentication.k8s.io", "v1", "tokenreviews"]) => {
            token_review(&mut guard, &body)
        }
        (Method::POST, ["apis", "events.k8s.io", "v1", "namespaces", _, "events"])
        | (Method::PATCH, ["apis", "events.k8s.io", "v1", "namespaces", _, "events", _]) => {
            let mut event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            guard.resource_version += 1;
            event["metadata"]["resourceVersion"] = json!(guard.resource_version.to_string());
            guard.events.push(event.clone());
            let code = if method == Method::POST {
                StatusCode::CREATED
            } else {
                StatusCode::OK
            };
            (code, axum::Json(event)).into_response()
        }
        _ => status(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        ),
    }
}

/// `spec` with the triggers KEDA sends `calls` for (`external-push`, each
/// call's metadata), as the ScaledObject that makes those calls has them.
pub fn with_triggers(mut spec: Value, calls: &[&hoist::proto::ScaledObjectRef]) -> Value {
    let triggers: Vec<Value> = calls
        .iter()
        .map(|call| json!({"type": "external-push", "metadata": call.scaler_metadata}))
        .collect();
    spec["triggers"] = json!(triggers);
    spec
}
