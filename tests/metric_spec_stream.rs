//! `StreamMetricSpec` (KEDA 2.21's fifth RPC): the spec at once, again
//! when hoist alone moves a trigger's target (a reload changing a config
//! route's `concurrent_requests`), never empty, equal to `GetMetricSpec`,
//! ended cleanly at shutdown. A real hoist on loopback reloading a real
//! config file; the tonic client is the one KEDA's generated Go client
//! talks to on the wire (same proto).

mod support;

use std::path::Path;
use std::time::Duration;

use hoist::proto::{GetMetricSpecResponse, ScaledObjectRef};
use tonic::{Code, Streaming};

use support::{Hoist, object};

/// A reload is read within a few seconds (the file is checked every 2 s).
const PATIENCE: Duration = Duration::from_secs(15);

/// hoist's config with one HTTP route whose triggers' target is `target`
/// (none: the route sets no target), and `cold_start` as an unrelated
/// setting a reload can change.
fn config(target: Option<u32>, cold_start: &str) -> String {
    let target = target
        .map(|target| format!("concurrent_requests = {target}\n"))
        .unwrap_or_default();
    format!(
        "[interceptor]\nhttp_listen = \"127.0.0.1:0\"\n\n\
         [[interceptor.http_routes]]\nname = \"shop\"\nhost = \"shop.example\"\n\
         upstream = \"127.0.0.1:1\"\ncold_start_timeout = \"{cold_start}\"\n{target}"
    )
}

async fn start(file: &Path, content: &str) -> Hoist {
    std::fs::write(file, content).unwrap();
    Hoist::start_from_file(file).await
}

/// KEDA's call for an `http` trigger naming the config route.
fn shop(extra: &[(&str, &str)]) -> ScaledObjectRef {
    let mut metadata = vec![("scaler", "http"), ("route", "shop")];
    metadata.extend_from_slice(extra);
    object("storefront", &metadata)
}

async fn open(hoist: &Hoist, object: &ScaledObjectRef) -> Streaming<GetMetricSpecResponse> {
    hoist
        .client()
        .await
        .stream_metric_spec(object.clone())
        .await
        .expect("the stream opens")
        .into_inner()
}

/// The stream's next message, which must come within `PATIENCE`: its one
/// spec's (name, target).
async fn next_spec(stream: &mut Streaming<GetMetricSpecResponse>) -> (String, f64) {
    let message = tokio::time::timeout(PATIENCE, stream.message())
        .await
        .expect("a spec within the patience")
        .expect("no stream error")
        .expect("the stream is open");
    assert_eq!(message.metric_specs.len(), 1, "never an empty spec");
    let spec = &message.metric_specs[0];
    assert_eq!(spec.target_size, spec.target_size_float.ceil() as i64);
    (spec.metric_name.clone(), spec.target_size_float)
}

#[tokio::test]
async fn the_spec_streams_at_once_and_again_when_a_reload_moves_the_routes_target() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hoist.toml");
    let hoist = start(&file, &config(Some(20), "60s")).await;
    let follows_the_route = shop(&[]);
    let sets_its_own = shop(&[("concurrentRequests", "7")]);

    let mut stream = open(&hoist, &follows_the_route).await;
    let (name, target) = next_spec(&mut stream).await;
    assert_eq!(target, 20.0, "the route's target, at once");
    assert_eq!(hoist.spec(&follows_the_route).await.target_size_float, 20.0);
    let mut own_stream = open(&hoist, &sets_its_own).await;
    assert_eq!(next_spec(&mut own_stream).await.1, 7.0);

    // A reload that leaves the spec alone sends nothing: the next message
    // is the target's change, not a repeat.
    std::fs::write(&file, config(Some(20), "45s")).unwrap();
    support::eventually(PATIENCE, "the first reload applied", || async {
        hoist
            .get("/metrics")
            .await
            .1
            .contains("hoist_config_reloads_total{result=\"applied\"} 1")
    })
    .await;
    std::fs::write(&file, config(Some(35), "45s")).unwrap();
    assert_eq!(next_spec(&mut stream).await, (name.clone(), 35.0));
    assert_eq!(
        hoist.spec(&follows_the_route).await.target_size_float,
        35.0,
        "GetMetricSpec answers what was streamed"
    );
    assert_eq!(
        hoist.spec(&sets_its_own).await.target_size_float,
        7.0,
        "a trigger's own concurrentRequests wins over its route's"
    );

    // Without a target on the route, the trigger's default (10).
    std::fs::write(&file, config(None, "45s")).unwrap();
    assert_eq!(next_spec(&mut stream).await, (name, 10.0));

    hoist.stop().await.unwrap();
    let end = tokio::time::timeout(PATIENCE, stream.message())
        .await
        .expect("the stream ends at shutdown");
    assert!(
        matches!(end, Ok(None)),
        "shutdown ends the stream with OK: {end:?}"
    );
}

#[tokio::test]
async fn a_reload_that_refuses_the_trigger_ends_its_stream_with_the_reason_get_metric_spec_gives() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hoist.toml");
    let hoist = start(&file, &config(Some(20), "60s")).await;
    let trigger = shop(&[]);
    let mut stream = open(&hoist, &trigger).await;
    assert_eq!(next_spec(&mut stream).await.1, 20.0);

    // The route renamed: the trigger names a route hoist no longer has.
    std::fs::write(
        &file,
        config(Some(20), "60s").replace("\"shop\"", "\"store\""),
    )
    .unwrap();
    let ended = tokio::time::timeout(PATIENCE, stream.message())
        .await
        .expect("the stream ends within the patience")
        .expect_err("an error, not a spec and not OK");
    let refused = hoist.spec_refused(&trigger).await;
    assert_eq!(ended.code(), refused.code());
    assert_ne!(ended.code(), Code::Ok);
    assert!(
        ended.message().contains("shop"),
        "the reason names the route: {}",
        ended.message()
    );
}

#[test]
fn a_route_target_below_one_is_refused_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hoist.toml");
    for bad in ["0", "0.5", "-3", "nan"] {
        let content = config(Some(20), "60s").replace("= 20", &format!("= {bad}"));
        std::fs::write(&file, content).unwrap();
        let error = hoist::config::Settings::load(Some(&file), Vec::new(), &Default::default())
            .expect_err("a target below 1 is refused")
            .to_string();
        assert!(
            error.contains("interceptor.http_routes[shop].concurrent_requests")
                && error.contains("at least 1"),
            "{bad}: {error}"
        );
    }
}
