//! The scaler's view of interceptors running as their own Deployment: it
//! finds every replica (a headless Service name resolves to each pod, or a
//! static list), reads each one's counters with a bounded wait, and sums
//! them. A long poll per replica learns of cold starts as they begin.

use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::Protocol;
use super::counters::Load;
use super::report::{HoldsReport, MAX_WAIT, RoutesReport};
use super::selector::RouteSelector;
use crate::observe_error::ObserveError;
use crate::tls::{self, ClientTls};
use crate::token_file::TokenFile;

/// Reads taken this close together share one sweep of the replicas, so
/// many ScaledObjects cost one request per replica.
const SWEEP_REUSE: Duration = Duration::from_millis(500);
/// How often the replica list is resolved again for the cold start watch.
const REDISCOVER_EVERY: Duration = Duration::from_secs(5);

pub struct Fleet {
    endpoints: Vec<String>,
    read_timeout: Duration,
    /// `http` or `https` (with `interceptor.tls`).
    scheme: &'static str,
    /// Sweeps: one request per replica, bounded by `read_timeout`.
    client: reqwest::Client,
    /// Cold start watches: long polls of up to `MAX_WAIT`.
    watch_client: reqwest::Client,
    /// The latest sweep, failed ones too: when every replica is down, N
    /// triggers must not queue up N full timeouts one after another.
    last_sweep: tokio::sync::Mutex<Option<(Instant, SweepResult)>>,
    wakers: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// This hoist's credential for the interceptors' admin ports.
    token: Option<TokenFile>,
}

type SweepResult = Result<Arc<Sweep>, ObserveError>;

/// One read of every replica.
struct Sweep {
    reports: Vec<RoutesReport>,
    /// `address: reason` for each replica that did not answer in time.
    failures: Vec<String>,
}

impl Fleet {
    /// Reads the replicas over TLS with `tls`, else plain HTTP. Fails only
    /// when no HTTP client can be built.
    pub fn new(
        endpoints: Vec<String>,
        read_timeout: Duration,
        tls: Option<&ClientTls>,
    ) -> Result<Self, reqwest::Error> {
        let (builder, scheme) = tls::client_builder(tls);
        let client = builder
            .timeout(read_timeout)
            .connect_timeout(read_timeout)
            .build()?;
        let (builder, _) = tls::client_builder(tls);
        let watch_client = builder
            .connect_timeout(read_timeout)
            .timeout(MAX_WAIT + read_timeout)
            .build()?;
        Ok(Self {
            endpoints,
            read_timeout,
            scheme,
            client,
            watch_client,
            last_sweep: tokio::sync::Mutex::new(None),
            wakers: Mutex::new(HashMap::new()),
            token: None,
        })
    }

    /// Sends the token in `file` (read at every request) to the replicas'
    /// admin ports, which may ask for one (`admin.auth`).
    pub fn with_token(mut self, file: TokenFile) -> Self {
        self.token = Some(file);
        self
    }

    fn get(&self, client: &reqwest::Client, url: &str) -> reqwest::RequestBuilder {
        let request = client.get(url);
        match &self.token {
            Some(token) => token.authorize(request),
            None => request,
        }
    }

    /// The route's load summed over every replica that answered. Fails
    /// when none answered, or none knows the route.
    pub async fn load(
        &self,
        protocol: Protocol,
        route: &RouteSelector,
    ) -> Result<Load, ObserveError> {
        let sweep = self.sweep().await?;
        let mut total = Load::default();
        let mut found = BTreeSet::new();
        for report in &sweep.reports {
            for (name, route_report) in &report.routes {
                if route_report.protocol == protocol && route.selects(name, &route_report.hosts) {
                    total.add(&route_report.load);
                    found.insert(name.as_str());
                }
            }
        }
        if found.len() > 1 {
            return Err(ObserveError::Config(format!(
                "{route} is served by several routes ({}): select one with `route`",
                found.into_iter().collect::<Vec<_>>().join(", ")
            )));
        }
        let found = !found.is_empty();
        if !found {
            let known: BTreeSet<&str> = sweep
                .reports
                .iter()
                .flat_map(|report| report.routes.iter())
                .filter(|(_, report)| report.protocol == protocol)
                .map(|(name, _)| name.as_str())
                .collect();
            let unanswered = if sweep.failures.is_empty() {
                String::new()
            } else {
                format!("; {} replicas did not answer", sweep.failures.len())
            };
            return Err(ObserveError::Config(format!(
                "no interceptor knows {protocol} {route} (known {protocol} routes: {}){unanswered}",
                if known.is_empty() {
                    "none".to_string()
                } else {
                    known.into_iter().collect::<Vec<_>>().join(", ")
                }
            )));
        }
        Ok(total)
    }

    async fn sweep(&self) -> SweepResult {
        let mut last = self.last_sweep.lock().await;
        if let Some((at, sweep)) = last.as_ref()
            && at.elapsed() < SWEEP_REUSE
        {
            return sweep.clone();
        }
        let sweep = self.sweep_now().await;
        *last = Some((Instant::now(), sweep.clone()));
        sweep
    }

    async fn sweep_now(&self) -> SweepResult {
        let addresses = self.discover().await?;
        let reads = addresses.iter().map(|address| self.read(*address));
        let results = futures::future::join_all(reads).await;
        let mut reports: Vec<RoutesReport> = Vec::new();
        let mut failures = Vec::new();
        for (address, result) in addresses.iter().zip(results) {
            match result {
                // One replica can have several addresses (a dual-stack
                // headless Service lists its IPv4 and IPv6): count it once.
                Ok(report) if reports.iter().any(|seen| seen.instance == report.instance) => {}
                Ok(report) => reports.push(report),
                Err(reason) => failures.push(format!("{address}: {reason}")),
            }
        }
        if reports.is_empty() {
            return Err(ObserveError::Connect(format!(
                "no interceptor answered within {:?}: {}",
                self.read_timeout,
                failures.join("; ")
            )));
        }
        if !failures.is_empty() {
            // The others' counts still stand: a stuck replica must not stall
            // scaling. Its own traffic is missing from this reading.
            warn!(failed = %failures.join("; "), answered = reports.len(), "some interceptor replicas did not answer; summing the others");
        }
        Ok(Arc::new(Sweep { reports, failures }))
    }

    /// Every replica address the endpoints resolve to now.
    async fn discover(&self) -> Result<Vec<SocketAddr>, ObserveError> {
        let mut addresses = BTreeSet::new();
        let mut problems = Vec::new();
        for endpoint in &self.endpoints {
            match tokio::time::timeout(
                self.read_timeout,
                tokio::net::lookup_host(endpoint.as_str()),
            )
            .await
            {
                Ok(Ok(found)) => addresses.extend(found),
                Ok(Err(error)) => problems.push(format!("{endpoint}: {error}")),
                Err(_) => problems.push(format!("{endpoint}: name lookup timed out")),
            }
        }
        if addresses.is_empty() {
            return Err(ObserveError::Connect(format!(
                "no interceptor address found (interceptor.endpoints): {}",
                problems.join("; ")
            )));
        }
        Ok(addresses.into_iter().collect())
    }

    async fn read(&self, address: SocketAddr) -> Result<RoutesReport, String> {
        let response = self
            .get(
                &self.client,
                &format!("{}://{address}/interceptor/routes", self.scheme),
            )
            .send()
            .await
            .map_err(|error| super::describe(&error))?;
        if !response.status().is_success() {
            return Err(format!("answered {}", response.status()));
        }
        response
            .json()
            .await
            .map_err(|error| super::describe(&error))
    }

    /// Ticks when a cold start begins for the route this key names
    /// (`route:<name>` or `host:<host>`).
    pub fn wakeups(&self, key: &str) -> watch::Receiver<u64> {
        let mut wakers = self
            .wakers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        wakers
            .entry(key.to_string())
            .or_insert_with(|| watch::Sender::new(0))
            .subscribe()
    }

    fn wake(&self, name: &str, hosts: &[String]) {
        let wakers = self
            .wakers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let keys = std::iter::once(format!("route:{name}"))
            .chain(hosts.iter().map(|host| format!("host:{host}")));
        for key in keys {
            if let Some(waker) = wakers.get(&key) {
                waker.send_modify(|generation| *generation += 1);
            }
        }
    }

    /// Keeps one long poll open per replica until `shutdown`, and wakes the
    /// pollers of routes whose cold start begins.
    pub async fn watch_cold_starts(self: Arc<Self>, shutdown: CancellationToken) {
        let mut watchers: HashMap<SocketAddr, JoinHandle<()>> = HashMap::new();
        loop {
            if let Ok(addresses) = self.discover().await {
                let addresses: BTreeSet<SocketAddr> = addresses.into_iter().collect();
                watchers.retain(|address, task| {
                    let keep = addresses.contains(address) && !task.is_finished();
                    if !keep {
                        task.abort();
                    }
                    keep
                });
                for address in addresses {
                    watchers.entry(address).or_insert_with(|| {
                        debug!(%address, "watching an interceptor for cold starts");
                        tokio::spawn(self.clone().watch_replica(address, shutdown.clone()))
                    });
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = tokio::time::sleep(REDISCOVER_EVERY) => {}
            }
        }
        for task in watchers.into_values() {
            task.abort();
        }
    }

    async fn watch_replica(self: Arc<Self>, address: SocketAddr, shutdown: CancellationToken) {
        let mut seen: Option<HoldsReport> = None;
        loop {
            let mut url = format!(
                "{}://{address}/interceptor/holds?wait={}",
                self.scheme,
                MAX_WAIT.as_secs()
            );
            if let Some(seen) = &seen {
                let generation = seen.generation();
                url.push_str(&format!(
                    "&instance={}&generation={generation}",
                    seen.instance
                ));
            }
            let answer = tokio::select! {
                _ = shutdown.cancelled() => return,
                answer = self.get(&self.watch_client, &url).send() => answer,
            };
            let report: HoldsReport = match answer {
                Ok(response) if response.status().is_success() => match response.json().await {
                    Ok(report) => report,
                    Err(error) => {
                        debug!(%address, error = %super::describe(&error), "unreadable cold start report");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                },
                Ok(response) => {
                    debug!(%address, status = %response.status(), "cold start watch refused");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
                Err(error) => {
                    debug!(%address, error = %super::describe(&error), "cold start watch failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            let restarted = seen
                .as_ref()
                .is_some_and(|seen| seen.instance != report.instance);
            if restarted {
                info!(%address, "interceptor replica restarted");
            }
            let mut woke = false;
            for (name, route) in &report.routes {
                let before = seen
                    .as_ref()
                    .filter(|seen| seen.instance == report.instance)
                    .and_then(|seen| seen.routes.get(name));
                let began = match before {
                    Some(before) => route.cold_starts > before.cold_starts,
                    // First contact: only a cold start under way is news.
                    None => route.held > 0,
                };
                if began {
                    if !woke {
                        // The next read must not reuse a sweep from before.
                        *self.last_sweep.lock().await = None;
                        woke = true;
                    }
                    debug!(%address, route = %name, "cold start began");
                    self.wake(name, &route.hosts);
                }
            }
            seen = Some(report);
        }
    }
}
