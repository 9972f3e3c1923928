//! One watched resource: its store, why its watch fails while it does,
//! whether its first list has completed, and the task following the
//! watch. Every watch hoist keeps is one: ScaledObjects, ScaledJobs,
//! TriggerAuthentications, ClusterTriggerAuthentications, Secrets.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub(super) struct Watched<K: kube::Resource + Clone + 'static>
where
    K::DynamicType: Eq + Hash + Clone,
{
    store: Store<K>,
    /// Why the watch is failing, while it is.
    error: Arc<Mutex<Option<String>>>,
    /// Whether the watch's first list has completed.
    listed: tokio::sync::watch::Sender<bool>,
    resource: &'static str,
}

impl<K> Watched<K>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Send + Sync,
{
    /// Watches `api` (`dyntype`'s objects) into a store, each object
    /// trimmed by `trim` first; `on_event` sees each event once the store
    /// holds it. `grant` completes the advice for a 403 (which RBAC rule
    /// grants the watch). Ends with `cancel`.
    pub(super) fn start(
        api: (Api<K>, K::DynamicType),
        names: (&'static str, &'static str),
        trim: impl FnMut(&mut K) + Send + 'static,
        cancel: &CancellationToken,
        on_event: impl Fn(&watcher::Event<K>) + Send + 'static,
    ) -> Self {
        Self::start_with(api, super::watch_config(), names, trim, cancel, on_event)
    }

    /// As [`Self::start`], with a watch of its own (a label or field
    /// selector).
    pub(super) fn start_with(
        (api, dyntype): (Api<K>, K::DynamicType),
        config: watcher::Config,
        (resource, grant): (&'static str, &'static str),
        trim: impl FnMut(&mut K) + Send + 'static,
        cancel: &CancellationToken,
        on_event: impl Fn(&watcher::Event<K>) + Send + 'static,
    ) -> Self {
        let writer = reflector::store::Writer::new(dyntype);
        let store = writer.as_reader();
        let error = Arc::new(Mutex::new(None));
        let listed = tokio::sync::watch::Sender::new(false);
        let stream = watcher(api, config).modify(trim).reflect(writer);
        let first_list = listed.clone();
        follow(
            stream,
            (resource, grant),
            error.clone(),
            cancel.clone(),
            move |event: &watcher::Event<K>| {
                if let watcher::Event::InitDone = event {
                    first_list.send_replace(true);
                }
                on_event(event);
            },
        );
        Self {
            store,
            error,
            listed,
            resource,
        }
    }
}

impl<K: kube::Resource + Clone + 'static> Watched<K>
where
    K::DynamicType: Eq + Hash + Clone,
{
    pub(super) fn store(&self) -> &Store<K> {
        &self.store
    }

    pub(super) fn resource(&self) -> &'static str {
        self.resource
    }

    /// Why the watch fails, while it does.
    pub(super) fn error(&self) -> Option<String> {
        self.error.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Whether its first list has completed (a later failure keeps the
    /// last state, as the API server last showed it).
    pub(super) fn listed(&self) -> bool {
        *self.listed.borrow()
    }

    /// Waits at most `timeout` for the first list.
    pub(super) async fn wait_listed(&self, timeout: Duration) {
        // Not the store's own `wait_until_ready`: of several tasks waiting
        // on it at once, only one was woken.
        let mut listed = self.listed.subscribe();
        let _ = tokio::time::timeout(timeout, listed.wait_for(|listed| *listed)).await;
    }

    /// Why the store cannot be trusted now: its watch fails, or has not
    /// listed yet.
    pub(super) fn unreadable(&self) -> Option<String> {
        match (self.error(), self.listed()) {
            (Some(reason), _) => Some(reason),
            (None, false) => Some("the first list has not finished".into()),
            (None, true) => None,
        }
    }
}

/// How long a failing watch waits before it lists again: doubling from
/// [`FIRST_RETRY`] to [`LAST_RETRY`], and back to the first only once the
/// API has answered (kube-runtime's own backoff starts over at every
/// `Init`, which opens each re-list, also one that is about to be refused:
/// a refused list was retried about once a second for good).
const FIRST_RETRY: Duration = Duration::from_secs(1);
const LAST_RETRY: Duration = Duration::from_secs(30);

/// True for the events only an answering API server produces: a listed
/// object, a completed list, a watch event. `Init` is not one of them.
fn shows_the_api_answering<K>(event: &watcher::Event<K>) -> bool {
    !matches!(event, watcher::Event::Init)
}

/// Drives a reflector's stream until `cancel`, keeping in `error` why the
/// watch of `resource` fails while it does; `grant` completes the advice
/// for a 403. One warning when an outage starts and one line when the
/// watch works again, however long it lasts and however often it is
/// retried in between.
pub(super) fn follow<S, K>(
    stream: S,
    (resource, grant): (&'static str, &'static str),
    error: Arc<Mutex<Option<String>>>,
    cancel: CancellationToken,
    on_event: impl Fn(&watcher::Event<K>) + Send + 'static,
) where
    S: futures::Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    K: Send + 'static,
{
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut retry = FIRST_RETRY;
        loop {
            let next = tokio::select! {
                _ = cancel.cancelled() => return,
                next = stream.next() => next,
            };
            let Some(event) = next else { return };
            match event {
                Ok(event) => {
                    on_event(&event);
                    if shows_the_api_answering(&event) {
                        retry = FIRST_RETRY;
                        let mut error = error.lock().unwrap_or_else(|e| e.into_inner());
                        if error.take().is_some() {
                            info!(resource, "watching again");
                        }
                    }
                }
                Err(failure) => {
                    let reason = describe_watch_error(resource, grant, &failure);
                    {
                        let mut error = error.lock().unwrap_or_else(|e| e.into_inner());
                        match error.as_deref() {
                            None => {
                                warn!(resource, error = %reason, retry_in = ?retry, "cannot watch")
                            }
                            Some(before) if before != reason => {
                                debug!(resource, error = %reason, "still cannot watch")
                            }
                            Some(_) => {}
                        }
                        *error = Some(reason);
                    }
                    tokio::select! {
                        _ = cancel.cancelled() => return,
                        _ = tokio::time::sleep(retry) => {}
                    }
                    retry = (retry * 2).min(LAST_RETRY);
                }
            }
        }
    });
}

/// Why the watch of `resource` fails; `grant` completes the advice for a
/// 403 (which RBAC rule grants it).
fn describe_watch_error(resource: &str, grant: &str, error: &watcher::Error) -> String {
    let status = match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => Some(status),
        watcher::Error::WatchError(status) => Some(status),
        _ => None,
    };
    match status {
        Some(status) if status.code == 403 => format!(
            "listing {resource} is forbidden (403): grant hoist's ServiceAccount list/watch on {resource}{grant} ({})",
            status.message
        ),
        Some(status) => format!(
            "listing {resource}: the API server answered {} {}: {}",
            status.code, status.reason, status.message
        ),
        None => format!("listing {resource}: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use kube::api::DynamicObject;

    use super::*;

    type WatchError = Arc<Mutex<Option<String>>>;

    /// `follow` of the ScaledObject watch over `stream`: where it keeps
    /// the error, and what stops it.
    fn followed<S>(stream: S) -> (WatchError, CancellationToken)
    where
        S: futures::Stream<Item = Result<watcher::Event<DynamicObject>, watcher::Error>>
            + Send
            + 'static,
    {
        let error = Arc::new(Mutex::new(None));
        let cancel = CancellationToken::new();
        follow(
            stream,
            ("scaledobjects.keda.sh", ""),
            error.clone(),
            cancel.clone(),
            |_| {},
        );
        (error, cancel)
    }

    /// kube-runtime's watcher against an API server that refuses every
    /// list: `Init` (it opens each re-list), then the refusal, for good.
    /// hoist took that `Init` for recovery and reset its backoff: a list
    /// about once a second, and two log lines each time.
    #[tokio::test(start_paused = true)]
    async fn a_refused_list_backs_off_and_an_init_is_no_recovery() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let lists = Arc::new(AtomicUsize::new(0));
        let counted = lists.clone();
        let refusing = futures::stream::unfold(0u64, move |n| {
            let counted = counted.clone();
            async move {
                let item = if n % 2 == 0 {
                    counted.fetch_add(1, Ordering::SeqCst);
                    Ok(watcher::Event::<DynamicObject>::Init)
                } else {
                    Err(watcher::Error::NoResourceVersion)
                };
                Some((item, n + 1))
            }
        });
        let (error, cancel) = followed(refusing);
        tokio::time::sleep(Duration::from_secs(60)).await;
        // Lists at 0, 1, 3, 7, 15 and 31 s (waits doubling from 1 s), the
        // next at 61 s: six in the first minute, where it was sixty.
        let tried = lists.load(Ordering::SeqCst);
        assert_eq!(tried, 6, "lists in a minute of refusals");
        assert!(
            error.lock().unwrap().is_some(),
            "the refusal stays reported across the Init of every retry"
        );
        cancel.cancel();
    }

    /// A list that completes is the API answering again: the error clears
    /// (for `/status`) and the next failure waits the first retry again.
    #[tokio::test(start_paused = true)]
    async fn a_completed_list_clears_the_error() {
        let events = futures::stream::iter(vec![
            Ok(watcher::Event::<DynamicObject>::Init),
            Err(watcher::Error::NoResourceVersion),
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitDone),
        ])
        .chain(futures::stream::pending());
        let (error, cancel) = followed(events);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(error.lock().unwrap().is_some(), "refused, then waiting");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(*error.lock().unwrap(), None, "listed again");
        cancel.cancel();
    }
}
