//! `scaler: redis | redis-cluster | redis-sentinel`: the length of a Redis
//! list (or set, sorted set, hash), with the keys, defaults and validation
//! of KEDA's built-in Redis scalers.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Weak};

use futures::FutureExt;
use futures::future::BoxFuture;
use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo};
use tokio::sync::Mutex;

use super::{SourceTls, Kind, Measurement, ObserveError, Query, Source, Trigger, metric_name};
use crate::metadata::{Absent, Key, MetadataError, Origin, Params, Place};
use crate::secret::{Secret, fingerprint};

pub static KIND: Kind = Kind {
    scalers: &["redis", "redis-cluster", "redis-sentinel"],
    keys: KEYS,
    parse,
};

/// KEDA's Redis keys, with its defaults.
pub const KEYS: &[Key] = &[
    Key::required("listName"),
    Key::optional("listLength", Value("5")),
    Key::optional("activationListLength", Value("0")),
    Key::optional("databaseIndex", Value("0")),
    Key::optional("address", Absent::None).in_(Place::Both),
    Key::optional("addresses", Absent::None).in_(Place::Both),
    Key::optional("host", Absent::None).in_(Place::Both),
    Key::optional("hosts", Absent::None).in_(Place::Both),
    Key::optional("port", Absent::None).in_(Place::Both),
    Key::optional("ports", Absent::None).in_(Place::Both),
    Key::optional("username", Absent::None).in_(Place::Both),
    Key::optional("password", Absent::None).in_(Place::Both),
    Key::optional("sentinelMaster", Absent::None).in_(Place::Both),
    Key::optional("sentinelUsername", Absent::None).in_(Place::Both),
    Key::optional("sentinelPassword", Absent::None).in_(Place::Both),
    Key::optional("enableTLS", Value("false")),
    Key::optional("unsafeSsl", Value("false")),
    Key::optional("tls", Value("disable")).in_(Place::Auth),
    Key::optional("ca", Absent::None).in_(Place::Auth),
    Key::optional("cert", Absent::None).in_(Place::Auth),
    Key::optional("key", Absent::None).in_(Place::Auth),
    Key::optional("keyPassword", Absent::None).in_(Place::Auth),
];

const DEFAULT_PORT: u16 = 6379;

/// Counts the key whatever its type, in one round trip, as KEDA does.
/// A missing key is an empty list.
const LENGTH_SCRIPT: &str = r"
local t = redis.call('TYPE', KEYS[1]).ok
if t == 'zset' then return redis.call('ZCARD', KEYS[1])
elseif t == 'set' then return redis.call('SCARD', KEYS[1])
elseif t == 'hash' then return redis.call('HLEN', KEYS[1])
elseif t == 'list' or t == 'none' then return redis.call('LLEN', KEYS[1])
else return redis.error_reply('key holds a ' .. t .. ', which has no length hoist can count')
end";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Standalone,
    Cluster,
    Sentinel,
}

/// The typed form of the metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisConfig {
    pub mode: Mode,
    pub list_name: String,
    pub list_length: i64,
    pub activation_list_length: i64,
    pub database_index: i64,
    /// `host:port` as given (or joined from `hosts` and `ports`).
    pub addresses: Vec<String>,
    pub hosts: Option<Vec<String>>,
    pub ports: Option<Vec<String>>,
    pub username: String,
    pub password: Secret,
    pub sentinel_username: String,
    pub sentinel_password: Secret,
    pub sentinel_master: String,
    pub tls: SourceTls,
}

use Absent::Value;
use Origin::{Auth, Env, Metadata};

/// KEDA's `redisMetadata` and `redisConnectionInfo`, key by key.
pub fn parse_config(mode: Mode, params: &Params) -> Result<RedisConfig, MetadataError> {
    let params = &params.declaring(KEYS);
    let list_length = params.number(&["listLength"], &[Metadata], 5_i64)?;
    let activation_list_length = params.number(&["activationListLength"], &[Metadata], 0_i64)?;
    let list_name = params
        .required(&["listName"], &[Metadata], "name the list (or set, sorted set, hash) to count")?
        .value
        .to_string();
    let database_index = params.number(&["databaseIndex"], &[Metadata], 0_i64)?;
    if database_index < 0 {
        return Err(MetadataError::invalid("databaseIndex", "must not be negative"));
    }

    let mut addresses = params
        .list(&["address", "addresses"], &[Metadata, Auth, Env])
        .map(|(_, items)| items)
        .unwrap_or_default();
    let hosts = params.list(&["host", "hosts"], &[Metadata, Env, Auth]);
    let ports = params.list(&["port", "ports"], &[Metadata, Env, Auth]);
    if let (Some((hosts_key, hosts)), Some((_, ports))) = (&hosts, &ports) {
        if hosts.len() != ports.len() {
            return Err(MetadataError::invalid(
                hosts_key.clone(),
                format!(
                    "{} hosts but {} ports: give one port per host",
                    hosts.len(),
                    ports.len()
                ),
            ));
        }
        addresses.extend(hosts.iter().zip(ports).map(|(h, p)| join_host_port(h, p)));
    }
    if addresses.first().is_none_or(|a| a.is_empty()) {
        let key = if mode == Mode::Standalone { "address" } else { "addresses" };
        return Err(MetadataError::missing(
            key,
            "no address given: set `address` (host:port, or a comma list for cluster and sentinel), or `host` and `port`",
        ));
    }
    // Standalone Redis uses the first address only, as KEDA does.
    let in_use = if mode == Mode::Standalone { &addresses[..1] } else { &addresses[..] };
    for address in in_use {
        split_host_port(address).map_err(|reason| MetadataError::invalid("address", reason))?;
    }

    let string = |names: &[&str], order: &[Origin]| params.string(names, order).unwrap_or_default();
    let username = string(&["username"], &[Metadata, Env, Auth]);
    let password = Secret::new(string(&["password"], &[Metadata, Env, Auth]));
    let sentinel_username = string(&["sentinelUsername"], &[Metadata, Auth, Env]);
    let sentinel_password = Secret::new(string(&["sentinelPassword"], &[Metadata, Auth, Env]));
    let sentinel_master = string(&["sentinelMaster"], &[Metadata, Auth, Env]);
    let unsafe_ssl = params.boolean(&["unsafeSsl"], &[Metadata], false)?;

    let metadata_tls = params.find(&["enableTLS"], &[Metadata]);
    let auth_tls = params.find(&["tls"], &[Auth]);
    let enable_tls = match (metadata_tls, auth_tls) {
        (Some(_), Some(_)) => {
            return Err(MetadataError::invalid(
                "enableTLS",
                "TLS is set both in metadata (`enableTLS`) and in the auth profile (`tls`); set it in one place",
            ));
        }
        (Some(found), None) => crate::metadata::parse_go_bool(found.value).ok_or_else(|| {
            MetadataError::invalid("enableTLS", format!("`{}` is not a boolean", found.value))
        })?,
        (None, Some(found)) => match found.value {
            "enable" => true,
            "disable" => false,
            other => {
                return Err(MetadataError::invalid(
                    "tls",
                    format!("`{other}` is not `enable` or `disable`"),
                ));
            }
        },
        (None, None) => false,
    };

    Ok(RedisConfig {
        mode,
        list_name,
        list_length,
        activation_list_length,
        database_index,
        addresses,
        hosts: hosts.map(|(_, items)| items),
        ports: ports.map(|(_, items)| items),
        username,
        password,
        sentinel_username,
        sentinel_password,
        sentinel_master,
        tls: SourceTls::from_auth(params, enable_tls, unsafe_ssl),
    })
}

fn parse(
    scaler: &'static str,
    params: &Params,
    _context: &super::Context,
) -> Result<Trigger, MetadataError> {
    let mode = match scaler {
        "redis-cluster" => Mode::Cluster,
        "redis-sentinel" => Mode::Sentinel,
        _ => Mode::Standalone,
    };
    let config = parse_config(mode, params)?;
    let connection = connection_key(scaler, &config);
    Ok(Trigger {
        scaler,
        metric_name: metric_name(&format!("redis-{}", config.list_name)),
        target: config.list_length as f64,
        target_key: "listLength",
        polling_interval: None,
        activation_target: config.activation_list_length as f64,
        query: Query {
            key: format!("{connection}|list={}", config.list_name).into(),
            description: describe(scaler, &config).into(),
            endpoints: endpoints(&config),
            source: Arc::new(RedisSource {
                list_name: config.list_name.as_str().into(),
                shared: shared(connection, config),
            }),
        },
        route: None,
    })
}

/// Everything that changes the connection, secrets fingerprinted:
/// pollers with equal keys share one. With the list it keys the query.
fn connection_key(scaler: &str, c: &RedisConfig) -> String {
    format!(
        "{scaler}|{}|db={}|user={}|sentinel={}/{}|tls={}/{}|ca={}|cert={}|secrets={:x}",
        c.addresses.join(","),
        c.database_index,
        c.username,
        c.sentinel_master,
        c.sentinel_username,
        c.tls.enabled,
        c.tls.unsafe_ssl,
        c.tls.ca,
        c.tls.cert,
        fingerprint(&[&c.password, &c.sentinel_password, &c.tls.key, &c.tls.key_password]),
    )
}

fn describe(scaler: &str, c: &RedisConfig) -> String {
    match c.mode {
        Mode::Standalone => format!(
            "{scaler} list `{}` on {} db {}",
            c.list_name, c.addresses[0], c.database_index
        ),
        Mode::Cluster => format!("{scaler} list `{}` on {}", c.list_name, c.addresses.join(",")),
        Mode::Sentinel => format!(
            "{scaler} list `{}` on master `{}` via {}",
            c.list_name,
            c.sentinel_master,
            c.addresses.join(",")
        ),
    }
}

/// The addresses hoist will dial, as `host:port`.
fn endpoints(c: &RedisConfig) -> Vec<String> {
    let in_use = if c.mode == Mode::Standalone { &c.addresses[..1] } else { &c.addresses[..] };
    in_use
        .iter()
        .filter_map(|address| split_host_port(address).ok())
        .map(|(host, port)| join_host_port(&host, &port.to_string()))
        .collect()
}

/// `net.JoinHostPort`: brackets around IPv6 hosts.
fn join_host_port(host: &str, port: &str) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// `host:port`, `[v6]:port`, or a bare host (port 6379). An empty host
/// means this machine, as in Go's dialer.
fn split_host_port(address: &str) -> Result<(String, u16), String> {
    if !crate::config::plain_address(address) {
        return Err(crate::config::NOT_PLAIN_ADDRESS.to_string());
    }
    let (host, port) = if let Some(rest) = address.strip_prefix('[') {
        let (host, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("`{address}` has `[` without `]`"))?;
        match after.strip_prefix(':') {
            Some(port) => (host, Some(port)),
            None if after.is_empty() => (host, None),
            None => return Err(format!("`{address}` is not host:port")),
        }
    } else if address.parse::<IpAddr>().is_ok() {
        (address, None)
    } else {
        match address.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (address, None),
        }
    };
    let port = match port {
        None => DEFAULT_PORT,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("`{port}` in `{address}` is not a port number"))?,
    };
    let host = if host.is_empty() { "localhost" } else { host };
    Ok((host.to_string(), port))
}

/// A connection to one Redis deployment. Both kinds multiplex: clones
/// share one socket and concurrent commands pipeline on it, and a command
/// whose caller gave up (the driver's timeout) leaves it usable.
#[derive(Clone)]
enum Connection {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Connection {
    /// Plain `EVAL`, as KEDA sends (kedacore/keda pkg/scalers/redis_scaler.go,
    /// `createRedisScalerWithClient` and `createClusteredRedisScaler`:
    /// `client.Eval`): an ACL user granted `+eval` alone must be able to
    /// scale, so no `EVALSHA` first and no `SCRIPT LOAD` after.
    async fn length(&mut self, key: &str) -> redis::RedisResult<i64> {
        let mut eval = redis::cmd("EVAL");
        eval.arg(LENGTH_SCRIPT).arg(1).arg(key);
        match self {
            Connection::Single(c) => eval.query_async(c).await,
            Connection::Cluster(c) => eval.query_async(c).await,
        }
    }
}

/// The connection every poller of one Redis deployment (same addresses,
/// database, credentials and TLS) shares: one socket per server however
/// many lists are watched, instead of one per poller.
struct Shared {
    /// How to connect: the first source's settings (every source with this
    /// connection key has the same; their lists are their own).
    config: RedisConfig,
    /// The current connection and its generation; dialled on first use and
    /// again after a failure.
    current: Mutex<Option<(u64, Connection)>>,
    generation: AtomicU64,
}

static SHARED: LazyLock<std::sync::Mutex<SharedRegistry>> = LazyLock::new(Default::default);

#[derive(Default)]
struct SharedRegistry {
    by_key: HashMap<String, Weak<Shared>>,
    /// Dead entries are swept when the map reaches this size.
    sweep_at: usize,
}

/// The shared connection for `key`; it closes when the last source using
/// it is dropped.
fn shared(key: String, config: RedisConfig) -> Arc<Shared> {
    let mut registry = SHARED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(existing) = registry.by_key.get(&key).and_then(Weak::upgrade) {
        return existing;
    }
    if registry.by_key.len() >= registry.sweep_at {
        registry.by_key.retain(|_, shared| shared.strong_count() > 0);
        registry.sweep_at = (registry.by_key.len() * 2).max(64);
    }
    let shared = Arc::new(Shared {
        config,
        current: Mutex::new(None),
        generation: AtomicU64::new(0),
    });
    registry.by_key.insert(key, Arc::downgrade(&shared));
    shared
}

/// One list on a shared connection: a source holds its list's name, the
/// connection holds the settings (a copy per source was most of what a
/// tracked Redis trigger held).
pub struct RedisSource {
    list_name: Box<str>,
    shared: Arc<Shared>,
}

impl RedisSource {
    fn config(&self) -> &RedisConfig {
        &self.shared.config
    }

    async fn measure(&self) -> Result<Measurement, ObserveError> {
        let (generation, mut connection) = {
            let mut current = self.shared.current.lock().await;
            match current.as_ref() {
                Some(found) => found.clone(),
                None => {
                    let connection = self.connect().await?;
                    let generation = self.shared.generation.fetch_add(1, Ordering::Relaxed);
                    *current = Some((generation, connection.clone()));
                    (generation, connection)
                }
            }
        };
        match connection.length(&self.list_name).await {
            Ok(length) => Ok(Measurement::of(length as f64)),
            Err(error) => {
                // The next poll of anyone sharing it dials again, unless
                // someone already has.
                let mut current = self.shared.current.lock().await;
                if current.as_ref().is_some_and(|(g, _)| *g == generation) {
                    *current = None;
                }
                Err(classify(error))
            }
        }
    }

    async fn connect(&self) -> Result<Connection, ObserveError> {
        let c = self.config();
        if c.tls.enabled {
            // rustls needs one process-wide crypto provider; installing it
            // twice is harmless.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        match c.mode {
            Mode::Standalone => {
                let info = self.node_info(&c.addresses[0], c.database_index)?;
                let client = match self.certificates()? {
                    Some(certs) => redis::Client::build_with_tls(info, certs),
                    None => redis::Client::open(info),
                }
                .map_err(classify)?;
                let connection = client
                    .get_multiplexed_async_connection()
                    .await
                    .map_err(classify)?;
                Ok(Connection::Single(connection))
            }
            Mode::Cluster => {
                let nodes = c
                    .addresses
                    .iter()
                    .map(|a| self.node_info(a, 0))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut builder = redis::cluster::ClusterClientBuilder::new(nodes);
                if let Some(certs) = self.certificates()? {
                    builder = builder.certs(certs);
                }
                let client = builder.build().map_err(classify)?;
                let connection = client.get_async_connection().await.map_err(classify)?;
                Ok(Connection::Cluster(connection))
            }
            Mode::Sentinel => {
                if c.sentinel_master.is_empty() {
                    return Err(ObserveError::Config(
                        "`sentinelMaster` is empty: name the master the sentinels watch".into(),
                    ));
                }
                let sentinels = c
                    .addresses
                    .iter()
                    .map(|a| self.address(a))
                    .collect::<Result<Vec<_>, _>>()?;
                let mut builder = redis::sentinel::SentinelClientBuilder::new(
                    sentinels,
                    &c.sentinel_master,
                    redis::sentinel::SentinelServerType::Master,
                )
                .map_err(classify)?
                .set_client_to_redis_db(c.database_index);
                if c.tls.enabled {
                    let mode = tls_mode(c.tls.unsafe_ssl);
                    builder = builder
                        .set_client_to_redis_tls_mode(mode)
                        .set_client_to_sentinel_tls_mode(mode);
                    if let Some(certs) = self.certificates()? {
                        builder = builder
                            .set_client_to_redis_certificates(certs.clone())
                            .set_client_to_sentinel_certificates(certs);
                    }
                }
                if !c.username.is_empty() {
                    builder = builder.set_client_to_redis_username(&c.username);
                }
                if !c.password.is_empty() {
                    builder = builder.set_client_to_redis_password(c.password.expose());
                }
                if !c.sentinel_username.is_empty() {
                    builder = builder.set_client_to_sentinel_username(&c.sentinel_username);
                }
                if !c.sentinel_password.is_empty() {
                    builder = builder.set_client_to_sentinel_password(c.sentinel_password.expose());
                }
                let mut client = builder.build().map_err(classify)?;
                let connection = client.get_async_connection().await.map_err(classify)?;
                Ok(Connection::Single(connection))
            }
        }
    }

    fn address(&self, address: &str) -> Result<ConnectionAddr, ObserveError> {
        let (host, port) = split_host_port(address).map_err(ObserveError::Config)?;
        Ok(if self.config().tls.enabled {
            ConnectionAddr::TcpTls {
                host,
                port,
                insecure: self.config().tls.unsafe_ssl,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host, port)
        })
    }

    fn node_info(&self, address: &str, db: i64) -> Result<ConnectionInfo, ObserveError> {
        let mut redis = RedisConnectionInfo::default().set_db(db);
        if !self.config().username.is_empty() {
            redis = redis.set_username(&self.config().username);
        }
        if !self.config().password.is_empty() {
            redis = redis.set_password(self.config().password.expose());
        }
        let info = self
            .address(address)?
            .into_connection_info()
            .map_err(classify)?;
        Ok(info.set_redis_settings(redis))
    }

    /// Client certificate and CA from the auth profile, when TLS is on.
    fn certificates(&self) -> Result<Option<redis::TlsCertificates>, ObserveError> {
        let c = self.config();
        if !c.tls.enabled || (c.tls.ca.is_empty() && c.tls.cert.is_empty()) {
            return Ok(None);
        }
        let client_tls = match (c.tls.cert.is_empty(), c.tls.key.is_empty()) {
            (true, _) => None,
            (false, true) => {
                return Err(ObserveError::Config(
                    "`cert` is set but `key` is empty: a client certificate needs its key".into(),
                ));
            }
            (false, false) => Some(redis::ClientTlsConfig {
                client_cert: c.tls.cert.as_bytes().to_vec(),
                client_key: c.tls.client_key()?.expose().as_bytes().to_vec(),
            }),
        };
        let root_cert = (!c.tls.ca.is_empty()).then(|| c.tls.ca.as_bytes().to_vec());
        Ok(Some(redis::TlsCertificates {
            client_tls,
            root_cert,
        }))
    }
}

fn tls_mode(unsafe_ssl: bool) -> redis::TlsMode {
    if unsafe_ssl {
        redis::TlsMode::Insecure
    } else {
        redis::TlsMode::Secure
    }
}

/// Sorts a Redis error into what went wrong. Redis' own messages carry no
/// credentials, so they are kept for the user.
fn classify(error: redis::RedisError) -> ObserveError {
    use redis::ErrorKind;
    let message = error.to_string();
    match error.kind() {
        ErrorKind::AuthenticationFailed => ObserveError::Auth(message),
        ErrorKind::Io | ErrorKind::ClusterConnectionNotFound => ObserveError::Connect(message),
        ErrorKind::InvalidClientConfig => ObserveError::Config(message),
        _ if error.is_connection_refusal() || error.is_io_error() || error.is_timeout() => {
            ObserveError::Connect(message)
        }
        _ if message.contains("WRONGPASS") || message.contains("NOAUTH") => ObserveError::Auth(message),
        _ => ObserveError::Query(message),
    }
}

impl Source for RedisSource {
    fn observe(&self) -> BoxFuture<'_, Result<Measurement, ObserveError>> {
        self.measure().boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_port_forms() {
        assert_eq!(split_host_port("a:1").unwrap(), ("a".into(), 1));
        assert_eq!(split_host_port("none").unwrap(), ("none".into(), 6379));
        assert_eq!(split_host_port(":7001").unwrap(), ("localhost".into(), 7001));
        assert_eq!(split_host_port("[::1]:7").unwrap(), ("::1".into(), 7));
        assert_eq!(split_host_port("::1").unwrap(), ("::1".into(), 6379));
        assert!(split_host_port("a:port").unwrap_err().contains("`port`"));
        let leaked = split_host_port("redis://:hunter2@host:6379").unwrap_err();
        assert!(!leaked.contains("hunter2"), "{leaked}");
        assert!(split_host_port("a:0").is_err());
        assert_eq!(join_host_port("::1", "7"), "[::1]:7");
    }
}
