//! The Service Bus trigger end to end. No Service Bus emulator can run
//! here, so a local HTTP server (in this file) answers with the real
//! response bodies Azure sent the Azure SDK test suites
//! (`tests/data/servicebus/`), and records what hoist asked for.

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::Response;
use hoist::proto::ScaledObjectRef;
use hoist::secret::Secret;
use support::{Hoist, object};
use tonic::Code;

fn fixture(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/tests/data/servicebus/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

#[derive(Clone, Debug)]
struct Seen {
    path_and_query: String,
    authorization: String,
}

/// (status, body) answers for one path, used in turn, the last repeating.
type Answers = Vec<(u16, String)>;

/// A namespace that answers by path from recorded bodies.
#[derive(Clone, Default)]
struct FakeNamespace {
    answers: Arc<Mutex<HashMap<String, Answers>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl FakeNamespace {
    fn answer(&self, path: &str, answers: Answers) {
        self.answers
            .lock()
            .unwrap()
            .insert(path.to_string(), answers);
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    async fn start(&self) -> SocketAddr {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let app = Router::new().fallback(respond).with_state(self.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        addr
    }
}

async fn respond(
    State(namespace): State<FakeNamespace>,
    headers: HeaderMap,
    request: Request<Body>,
) -> Response {
    let uri = request.uri();
    namespace.seen.lock().unwrap().push(Seen {
        path_and_query: uri
            .path_and_query()
            .map(|p| p.to_string())
            .unwrap_or_default(),
        authorization: headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string(),
    });
    let mut answers = namespace.answers.lock().unwrap();
    let (status, body) = match answers.get_mut(uri.path()) {
        Some(list) if list.len() > 1 => list.remove(0),
        Some(list) => list[0].clone(),
        None => (
            404,
            "<Error><Code>404</Code><Detail>no such path in the test</Detail></Error>".into(),
        ),
    };
    let content_type = if body.starts_with("<Error") {
        "application/xml; charset=utf-8"
    } else {
        "application/atom+xml; type=entry; charset=utf-8"
    };
    let empty = body.is_empty();
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    // Azure's empty 401 carries no Content-Type at all.
    if !empty {
        response
            .headers_mut()
            .insert("content-type", content_type.parse().unwrap());
    }
    response
}

const KEY: &str = "c2VjcmV0LWtleS12YWx1ZQ==";

fn connection(addr: SocketAddr) -> String {
    format!(
        "Endpoint=sb://{addr}/;SharedAccessKeyName=hoist-reader;SharedAccessKey={KEY};UseDevelopmentEmulator=true"
    )
}

async fn count(hoist: &Hoist, object: &ScaledObjectRef) -> Result<f64, tonic::Status> {
    Ok(hoist.metric(object).await?.1)
}

fn queue(name: &str, connection: &str, extra: &[(&str, &str)]) -> ScaledObjectRef {
    let mut metadata = vec![
        ("scaler", "azure-servicebus"),
        ("queueName", name),
        ("connectionFromEnv", connection),
    ];
    metadata.extend_from_slice(extra);
    // A Kubernetes name, whatever the queue name (a regex) holds.
    let object_name: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    object(&format!("so-{}", object_name.trim_matches('-')), &metadata)
}

/// A namespace whose queue `orders` holds one active message (and a dead
/// letter and a scheduled one).
fn orders_namespace() -> FakeNamespace {
    let namespace = FakeNamespace::default();
    namespace.answer(
        "/orders",
        vec![(
            200,
            fixture("queue-runtime-properties.active1-dlq1-sched1.api2017-04.dotnet.xml"),
        )],
    );
    namespace
}

#[tokio::test]
async fn queues_and_subscriptions_are_read_with_a_signed_request() {
    let namespace = orders_namespace();
    namespace.answer(
        "/idle",
        vec![(
            200,
            fixture("queue-runtime-properties.zero.api2021-05.java.xml"),
        )],
    );
    namespace.answer(
        "/events/Subscriptions/billing",
        vec![(
            200,
            fixture("subscription-runtime-properties.active1-dlq1.api2017-04.dotnet.xml"),
        )],
    );
    let addr = namespace.start().await;
    let hoist = Hoist::start().await;
    let connection = connection(addr);

    let orders = queue("orders", &connection, &[]);
    let spec = hoist.spec(&orders).await;
    assert_eq!(spec.metric_name, "azure-servicebus-orders");
    assert_eq!(spec.target_size, 5);
    // ActiveMessageCount, not MessageCount (3) nor the dead letters.
    assert_eq!(count(&hoist, &orders).await.unwrap(), 1.0);
    assert!(
        hoist
            .client()
            .await
            .is_active(orders)
            .await
            .unwrap()
            .into_inner()
            .result
    );
    assert_eq!(
        count(&hoist, &queue("idle", &connection, &[]))
            .await
            .unwrap(),
        0.0
    );

    let billing = object(
        "billing",
        &[
            ("scaler", "azure-servicebus"),
            ("topicName", "events"),
            ("subscriptionName", "billing"),
            ("connectionFromEnv", &connection),
        ],
    );
    assert_eq!(count(&hoist, &billing).await.unwrap(), 1.0);

    let seen = namespace.seen();
    let first = seen
        .iter()
        .find(|s| s.path_and_query.starts_with("/orders"))
        .unwrap();
    assert_eq!(first.path_and_query, "/orders?api-version=2021-05");
    assert!(
        seen.iter()
            .any(|s| s.path_and_query == "/events/Subscriptions/billing?api-version=2021-05")
    );
    // The signature is the SAS over the namespace URL with the key's bytes.
    let expiry: u64 = first
        .authorization
        .split("&se=")
        .nth(1)
        .and_then(|rest| rest.split('&').next())
        .and_then(|se| se.parse().ok())
        .expect("an se= expiry");
    let expected = hoist::azure::sas::token(
        &format!("http://{addr}/"),
        "hoist-reader",
        &Secret::new(KEY),
        expiry,
    );
    assert_eq!(first.authorization, expected.expose());
}

/// A list page of `n` queues named `q0`..`q{n-1}` holding `count(i)`
/// active messages each, built from the recorded list feed.
fn page(n: usize, count: impl Fn(usize) -> i64) -> String {
    let recorded = fixture("subscriptions-list-feed.active1-dlq1.api2017-04.dotnet.xml");
    let start = recorded.find("<entry").unwrap();
    let end = recorded.rfind("</entry>").unwrap() + "</entry>".len();
    let entry = &recorded[start..end];
    let title_start = entry.find("<title").unwrap();
    let title_end = entry.find("</title>").unwrap() + "</title>".len();
    let active = "<d2p1:ActiveMessageCount>1</d2p1:ActiveMessageCount>";
    assert!(
        entry.contains(active),
        "the recorded entry holds one active message"
    );
    let entries: String = (0..n)
        .map(|i| {
            let titled = format!(
                "{}<title type=\"text\">q{i}</title>{}",
                &entry[..title_start],
                &entry[title_end..]
            );
            titled.replace(
                active,
                &format!(
                    "<d2p1:ActiveMessageCount>{}</d2p1:ActiveMessageCount>",
                    count(i)
                ),
            )
        })
        .collect();
    format!("{}{entries}{}", &recorded[..start], &recorded[end..])
}

#[tokio::test]
async fn regex_mode_pages_through_the_list_and_combines_the_matches() {
    let namespace = FakeNamespace::default();
    // 100 queues on the first page, 3 on the second: q0..q99 then q0..q2
    // again (names do not matter to paging).
    namespace.answer(
        "/$Resources/Queues",
        vec![
            (200, page(100, |i| i as i64)),
            (200, page(3, |_| 1000)),
            (200, page(100, |i| i as i64)),
            (200, page(3, |_| 1000)),
        ],
    );
    let addr = namespace.start().await;
    let hoist = Hoist::start().await;
    let connection = connection(addr);
    let by = |operation: &str| {
        queue(
            "q[0-4]",
            &connection,
            &[("useRegex", "true"), ("operation", operation)],
        )
    };
    // Matches: q0..q4 on page one (0+1+2+3+4), q0..q2 on page two (3 × 1000).
    assert_eq!(count(&hoist, &by("sum")).await.unwrap(), 3010.0);
    assert_eq!(count(&hoist, &by("max")).await.unwrap(), 1000.0);
    let spec = hoist.spec(&by("max")).await;
    assert_eq!(spec.metric_name, "azure-servicebus-queue-regex");
    let pages: Vec<String> = namespace
        .seen()
        .into_iter()
        .map(|s| s.path_and_query)
        .collect();
    assert_eq!(
        pages[..2],
        [
            "/$Resources/Queues?$skip=0&$top=100&api-version=2021-05".to_string(),
            "/$Resources/Queues?$skip=100&$top=100&api-version=2021-05".to_string(),
        ]
    );
    // Whole names only: `q1` matches q1, not q10..q19.
    namespace.answer(
        "/$Resources/Queues",
        vec![(200, page(20, |i| 100 + i as i64))],
    );
    let one = queue("q1", &connection, &[("useRegex", "true")]);
    assert_eq!(count(&hoist, &one).await.unwrap(), 101.0);
    let average = queue(
        "q1.",
        &connection,
        &[("useRegex", "true"), ("operation", "avg")],
    );
    // q10..q19: 110..119, KEDA's integer average.
    assert_eq!(count(&hoist, &average).await.unwrap(), 114.0);
}

#[tokio::test]
async fn every_failure_is_a_clear_error_never_a_zero() {
    let namespace = FakeNamespace::default();
    namespace.answer(
        "/missing",
        vec![(
            200,
            fixture("queue-not-found.200-empty-feed.api2021-05.python.xml"),
        )],
    );
    namespace.answer(
        "/events/Subscriptions/gone",
        vec![(
            404,
            fixture("subscription-not-found.404.api2021-05.java.xml"),
        )],
    );
    namespace.answer(
        "/locked",
        vec![(401, fixture("unauthorized.401.api2021-05.python.xml"))],
    );
    namespace.answer("/silent", vec![(401, String::new())]);
    let throttled = {
        let body = fixture("queue-runtime-properties.zero.api2021-05.java.xml");
        let start = body.find("<CountDetails").unwrap();
        let end = body.find("</CountDetails>").unwrap() + "</CountDetails>".len();
        format!("{}{}", &body[..start], &body[end..])
    };
    namespace.answer("/throttled", vec![(200, throttled)]);
    let addr = namespace.start().await;
    let hoist = Hoist::start().await;
    let connection = connection(addr);

    let cases: [(ScaledObjectRef, &str); 5] = [
        (queue("missing", &connection, &[]), "does not exist"),
        (
            object(
                "gone",
                &[
                    ("scaler", "azure-servicebus"),
                    ("topicName", "events"),
                    ("subscriptionName", "gone"),
                    ("connectionFromEnv", &connection),
                ],
            ),
            "was not found",
        ),
        (
            queue("locked", &connection, &[]),
            "claim is empty or token is invalid",
        ),
        (
            queue("silent", &connection, &[]),
            "no detail in the response",
        ),
        (queue("throttled", &connection, &[]), "CountDetails"),
    ];
    for (object, expected) in cases {
        let status = count(&hoist, &object).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{expected}");
        assert!(
            status.message().contains(expected),
            "{expected}: {}",
            status.message()
        );
        assert!(
            !status.message().contains(KEY),
            "the key leaked: {}",
            status.message()
        );
    }
    let locked = count(&hoist, &queue("locked", &connection, &[]))
        .await
        .unwrap_err();
    assert!(
        locked.message().contains("credentials refused"),
        "{}",
        locked.message()
    );

    let unusable = queue("orders", "none", &[]);
    let status = count(&hoist, &unusable).await.unwrap_err();
    assert!(
        status.message().contains("connection string"),
        "{}",
        status.message()
    );
}

#[tokio::test]
async fn busy_answers_are_retried_and_ready_signatures_are_sent_as_they_are() {
    let namespace = FakeNamespace::default();
    namespace.answer(
        "/orders",
        vec![
            (503, String::new()),
            (429, String::new()),
            (
                200,
                fixture("queue-runtime-properties.active1-dlq1-sched1.api2017-04.dotnet.xml"),
            ),
        ],
    );
    let addr = namespace.start().await;
    let hoist = Hoist::start().await;
    let signature = "SharedAccessSignature sr=x&sig=y&se=9999999999&skn=reader";
    let ready = format!(
        "Endpoint=sb://{addr}/;SharedAccessSignature={signature};UseDevelopmentEmulator=true"
    );
    let orders = queue("orders", &ready, &[("timeout", "5000")]);
    assert_eq!(count(&hoist, &orders).await.unwrap(), 1.0);
    let seen = namespace.seen();
    assert_eq!(seen.len(), 3, "two retries: {seen:?}");
    assert!(seen.iter().all(|s| s.authorization == signature));
}

#[tokio::test]
async fn workload_identity_without_the_pod_setup_says_what_is_missing() {
    let mut settings = hoist::config::Settings::default();
    // Profiles are lent only to callers hoist trusts (no cluster here).
    settings.grpc.trust_callers = true;
    settings.auth.insert(
        "orders-identity".into(),
        hoist::config::AuthProfile::new(
            &["default"],
            [(
                "podIdentity".to_string(),
                hoist::config::AuthValue::Literal("azure-workload".into()),
            )],
        ),
    );
    let hoist = Hoist::start_with(settings).await;
    let orders = object(
        "orders",
        &[
            ("scaler", "azure-servicebus"),
            ("queueName", "orders"),
            ("namespace", "orders-ns"),
            ("authRef", "orders-identity"),
            ("identityTenantId", "72f988bf-86f1-41af-91ab-2d7cd011db47"),
        ],
    );
    let status = count(&hoist, &orders).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert!(
        status
            .message()
            .contains("orders-ns.servicebus.windows.net"),
        "{}",
        status.message()
    );
    assert!(
        status.message().contains("workload identity"),
        "{}",
        status.message()
    );
}

#[tokio::test]
async fn regex_mode_over_a_topics_subscriptions() {
    let namespace = FakeNamespace::default();
    namespace.answer(
        "/events/Subscriptions",
        vec![(
            200,
            fixture("subscriptions-list-feed.active1-dlq1.api2017-04.dotnet.xml"),
        )],
    );
    let addr = namespace.start().await;
    let hoist = Hoist::start().await;
    let all = object(
        "all-subscriptions",
        &[
            ("scaler", "azure-servicebus"),
            ("topicName", "events"),
            ("subscriptionName", "[0-9a-f]{8}"),
            ("useRegex", "true"),
            ("connectionFromEnv", &connection(addr)),
        ],
    );
    let spec = hoist.spec(&all).await;
    assert_eq!(spec.metric_name, "azure-servicebus-topic-regex");
    // The recorded subscription `65cea5d4` holds one active message.
    assert_eq!(count(&hoist, &all).await.unwrap(), 1.0);
    let seen = namespace.seen();
    assert_eq!(
        seen[0].path_and_query,
        "/events/Subscriptions?$skip=0&$top=100&api-version=2021-05"
    );
}

/// Removing a `*FromEnv` key is an edit of the trigger, not a new value of
/// it: asked again under the same ScaledObject without
/// `connectionFromEnv`, the trigger gets INVALID_ARGUMENT naming the
/// missing connection (it used to get UNAVAILABLE: "tracked already with
/// other values of its `FromEnv` keys"), and the first one keeps counting.
#[tokio::test]
async fn a_from_env_key_removed_is_an_edit_and_its_error_names_the_key() {
    let namespace = orders_namespace();
    let addr = namespace.start().await;
    let hoist = Hoist::start().await;
    let with = queue("orders", &connection(addr), &[]);
    let first = count(&hoist, &with).await.unwrap();
    let without = object(
        &with.name,
        &[("scaler", "azure-servicebus"), ("queueName", "orders")],
    );
    for _ in 0..2 {
        let status = count(&hoist, &without).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{}", status.message());
        assert!(
            status.message().contains("`connection`")
                && status.message().contains("connectionFromEnv"),
            "{}",
            status.message()
        );
    }
    assert_eq!(count(&hoist, &with).await.unwrap(), first);
}
