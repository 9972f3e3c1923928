//! `scaler: kafka`: consumer-group lag, with the keys, defaults,
//! validation and lag arithmetic of KEDA's built-in `kafka` scaler.
//!
//! One poll is one metadata request, one committed-offsets request for
//! every partition at once, and one latest-offsets request batched per
//! leader broker, on a client kept for the (cluster, group) pair.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use super::{SourceTls, Kind, Measurement, ObserveError, Query, Source, Trigger, metric_name};
use crate::metadata::{MetadataError, Origin, Params};
use crate::secret::{Secret, fingerprint};

pub static KIND: Kind = Kind {
    scalers: &["kafka"],
    parse,
};

/// What librdkafka may take for one request before it gives up; the
/// driver's own timeout usually ends the wait sooner.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetResetPolicy {
    Latest,
    Earliest,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sasl {
    None,
    Plaintext,
    ScramSha256,
    ScramSha512,
    /// OAuth bearer tokens from an OIDC token endpoint (client credentials).
    OAuthBearer {
        token_endpoint: String,
        scopes: Vec<String>,
        extensions: BTreeMap<String, String>,
    },
    /// Parsed as KEDA does; hoist reports it unsupported when connecting.
    AwsMskIam { region: String },
    /// Parsed as KEDA does; hoist reports it unsupported when connecting.
    Gssapi { realm: String, service_name: String },
}

impl Sasl {
    fn name(&self) -> &'static str {
        match self {
            Sasl::None => "none",
            Sasl::Plaintext => "plaintext",
            Sasl::ScramSha256 => "scram_sha256",
            Sasl::ScramSha512 => "scram_sha512",
            Sasl::OAuthBearer { .. } => "oauthbearer",
            Sasl::AwsMskIam { .. } => "oauthbearer (aws_msk_iam)",
            Sasl::Gssapi { .. } => "gssapi",
        }
    }
}

/// The typed form of the metadata (KEDA's `kafkaMetadata`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaConfig {
    pub bootstrap_servers: Vec<String>,
    pub consumer_group: String,
    /// Empty: every topic the group has committed offsets for.
    pub topic: String,
    pub partition_limitation: Option<Vec<i32>>,
    pub lag_threshold: i64,
    pub activation_lag_threshold: i64,
    pub offset_reset_policy: OffsetResetPolicy,
    pub allow_idle_consumers: bool,
    pub exclude_persistent_lag: bool,
    pub scale_to_zero_on_invalid_offset: bool,
    pub limit_to_partitions_with_lag: bool,
    pub ensure_even_distribution_of_partitions: bool,
    pub full_metadata: bool,
    pub version: Option<String>,
    pub tls: SourceTls,
    pub sasl: Sasl,
    pub username: String,
    pub password: Secret,
}

use Origin::{Auth, Env, Metadata};

fn enumeration<'a>(params: &Params<'a>, name: &str, order: &[Origin], allowed: &[&str]) -> Result<Option<&'a str>, MetadataError> {
    match params.find(&[name], order) {
        None => Ok(None),
        Some(found) if allowed.contains(&found.value) => Ok(Some(found.value)),
        Some(found) => Err(MetadataError::invalid(
            found.key,
            format!("`{}` must be one of {}", found.value, allowed.join(", ")),
        )),
    }
}

pub fn parse_config(params: &Params) -> Result<KafkaConfig, MetadataError> {
    let (_, bootstrap_servers) = params
        .list(&["bootstrapServers"], &[Metadata, Env])
        .ok_or_else(|| MetadataError::missing("bootstrapServers", "list the brokers, host:port, comma-separated"))?;
    if bootstrap_servers.iter().any(|server| !super::plain_address(server)) {
        return Err(MetadataError::invalid("bootstrapServers", super::NOT_PLAIN_ADDRESS));
    }
    let consumer_group = params
        .required(&["consumerGroup"], &[Metadata, Env], "name the consumer group whose lag to measure")?
        .value
        .to_string();
    let topic = params.string(&["topic"], &[Metadata, Env]).unwrap_or_default();

    let lag_threshold = params.number(&["lagThreshold"], &[Metadata], 10_i64)?;
    if lag_threshold <= 0 {
        return Err(MetadataError::invalid("lagThreshold", "must be a positive number"));
    }
    let activation_lag_threshold = params.number(&["activationLagThreshold"], &[Metadata], 0_i64)?;
    if activation_lag_threshold < 0 {
        return Err(MetadataError::invalid("activationLagThreshold", "must not be negative"));
    }
    let offset_reset_policy = match enumeration(params, "offsetResetPolicy", &[Metadata], &["latest", "earliest"])? {
        Some("earliest") => OffsetResetPolicy::Earliest,
        _ => OffsetResetPolicy::Latest,
    };
    let flag = |name: &str, default: bool| params.boolean(&[name], &[Metadata], default);
    let allow_idle_consumers = flag("allowIdleConsumers", false)?;
    let exclude_persistent_lag = flag("excludePersistentLag", false)?;
    let scale_to_zero_on_invalid_offset = flag("scaleToZeroOnInvalidOffset", false)?;
    let limit_to_partitions_with_lag = flag("limitToPartitionsWithLag", false)?;
    let ensure_even_distribution_of_partitions = flag("ensureEvenDistributionOfPartitions", false)?;
    let full_metadata = flag("fullMetadata", true)?;

    let mut partition_limitation = match params.find(&["partitionLimitation"], &[Metadata]) {
        Some(found) => Some(parse_partition_limitation(found.value)?),
        None => None,
    };
    if topic.is_empty() {
        partition_limitation = None;
    }
    if allow_idle_consumers && limit_to_partitions_with_lag {
        return Err(MetadataError::invalid(
            "limitToPartitionsWithLag",
            "cannot be set together with allowIdleConsumers",
        ));
    }
    if topic.is_empty() && limit_to_partitions_with_lag {
        return Err(MetadataError::missing("topic", "limitToPartitionsWithLag needs a topic"));
    }
    if limit_to_partitions_with_lag && ensure_even_distribution_of_partitions {
        return Err(MetadataError::invalid(
            "ensureEvenDistributionOfPartitions",
            "cannot be set together with limitToPartitionsWithLag",
        ));
    }
    if topic.is_empty() && ensure_even_distribution_of_partitions {
        return Err(MetadataError::missing("topic", "ensureEvenDistributionOfPartitions needs a topic"));
    }
    if !full_metadata && topic.is_empty() {
        return Err(MetadataError::missing("topic", "fullMetadata false needs a topic"));
    }
    let version = params.string(&["version"], &[Metadata]);
    if let Some(version) = &version {
        parse_kafka_version(version).map_err(|reason| MetadataError::invalid("version", reason))?;
    }

    // TLS.
    let enable_tls = enumeration(params, "tls", &[Metadata, Auth], &["enable", "disable"])? == Some("enable");
    let unsafe_ssl = flag("unsafeSsl", false)?;
    let auth = |name: &str| params.string(&[name], &[Auth]).unwrap_or_default();
    let ca = auth("ca");
    let cert = auth("cert");
    let key = Secret::new(auth("key"));
    let key_password = Secret::new(auth("keyPassword"));
    if enable_tls {
        if !cert.is_empty() && key.is_empty() {
            return Err(MetadataError::missing("key", "key must be provided with cert"));
        }
        if !key.is_empty() && cert.is_empty() {
            return Err(MetadataError::missing("cert", "cert must be provided with key"));
        }
    }

    // SASL. Credentials come from the auth profile, or, as a hoist
    // extension, from metadata values KEDA resolved (`passwordFromEnv`).
    let username = params.string(&["username"], &[Auth, Env]).unwrap_or_default();
    let password = Secret::new(params.string(&["password"], &[Auth, Env]).unwrap_or_default());
    let sasl_name = enumeration(
        params,
        "sasl",
        &[Metadata, Auth],
        &["none", "plaintext", "scram_sha256", "scram_sha512", "oauthbearer", "gssapi"],
    )?;
    let need_credentials = || -> Result<(), MetadataError> {
        if username.is_empty() {
            return Err(MetadataError::missing("username", "no username given"));
        }
        if password.is_empty() {
            return Err(MetadataError::missing("password", "no password given"));
        }
        Ok(())
    };
    let sasl = match sasl_name {
        None | Some("none") => Sasl::None,
        Some("plaintext") => {
            need_credentials()?;
            Sasl::Plaintext
        }
        Some("scram_sha256") => {
            need_credentials()?;
            Sasl::ScramSha256
        }
        Some("scram_sha512") => {
            need_credentials()?;
            Sasl::ScramSha512
        }
        Some("oauthbearer") => {
            match enumeration(params, "saslTokenProvider", &[Metadata, Auth], &["bearer", "aws_msk_iam"])? {
                Some("aws_msk_iam") => {
                    if !enable_tls {
                        return Err(MetadataError::invalid("tls", "TLS is required for AWS MSK authentication"));
                    }
                    let region = params
                        .required(&["awsRegion"], &[Metadata], "no awsRegion given")?
                        .value
                        .to_string();
                    Sasl::AwsMskIam { region }
                }
                _ => {
                    need_credentials()?;
                    let token_endpoint = params
                        .required(&["oauthTokenEndpointUri"], &[Auth], "no oauth token endpoint uri given")?
                        .value
                        .to_string();
                    let scopes = auth("scopes").split(',').map(str::to_string).collect();
                    let mut extensions = BTreeMap::new();
                    let raw = auth("oauthExtensions");
                    if !raw.is_empty() {
                        for extension in raw.split(',') {
                            let Some((key, value)) = extension.split_once('=').filter(|(_, v)| !v.contains('=')) else {
                                return Err(MetadataError::invalid(
                                    "oauthExtensions",
                                    "each extension must be key=value",
                                ));
                            };
                            extensions.insert(key.to_string(), value.to_string());
                        }
                    }
                    Sasl::OAuthBearer {
                        token_endpoint,
                        scopes,
                        extensions,
                    }
                }
            }
        }
        Some(_) => {
            // gssapi
            if username.is_empty() {
                return Err(MetadataError::missing("username", "no username given"));
            }
            let keytab = auth("keytab");
            if password.is_empty() == keytab.is_empty() {
                return Err(MetadataError::invalid(
                    "keytab",
                    "exactly one of `password` or `keytab` must be given for GSSAPI",
                ));
            }
            let realm = params.required(&["realm"], &[Auth], "no realm given")?.value.to_string();
            params.required(&["kerberosConfig"], &[Auth], "no Kerberos configuration (kerberosConfig) given")?;
            params.boolean(&["kerberosDisableFAST"], &[Auth], false)?;
            Sasl::Gssapi {
                realm,
                service_name: auth("kerberosServiceName"),
            }
        }
    };

    Ok(KafkaConfig {
        bootstrap_servers,
        consumer_group,
        topic,
        partition_limitation,
        lag_threshold,
        activation_lag_threshold,
        offset_reset_policy,
        allow_idle_consumers,
        exclude_persistent_lag,
        scale_to_zero_on_invalid_offset,
        limit_to_partitions_with_lag,
        ensure_even_distribution_of_partitions,
        full_metadata,
        version,
        tls: SourceTls {
            enabled: enable_tls,
            unsafe_ssl,
            ca,
            cert,
            key,
            key_password,
        },
        sasl,
        username,
        password,
    })
}

/// `1,2,5-7` → `[1, 2, 5, 6, 7]`.
pub fn parse_partition_limitation(text: &str) -> Result<Vec<i32>, MetadataError> {
    let invalid = |part: &str| {
        MetadataError::invalid(
            "partitionLimitation",
            format!("`{part}` is not a partition number or a range like 5-7"),
        )
    };
    let mut partitions = Vec::new();
    for part in text.split(',').map(str::trim) {
        if part.contains('-') {
            let bounds: Vec<&str> = part.split('-').collect();
            let [start, end] = bounds[..] else {
                return Err(invalid(part));
            };
            let start: i32 = start.trim().parse().map_err(|_| invalid(part))?;
            let end: i32 = end.trim().parse().map_err(|_| invalid(part))?;
            if end.saturating_sub(start) > 100_000 {
                return Err(invalid(part));
            }
            partitions.extend(start..=end);
        } else {
            partitions.push(part.parse().map_err(|_| invalid(part))?);
        }
    }
    Ok(partitions)
}

/// Sarama's `ParseKafkaVersion`: `a.b.c` (or `0.a.b.c` for old releases).
fn parse_kafka_version(text: &str) -> Result<(), String> {
    let parts: Vec<&str> = text.split('.').collect();
    let numeric = parts.iter().all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()));
    let shaped = match parts.first() {
        Some(&"0") => parts.len() == 4,
        _ => parts.len() == 3,
    };
    if numeric && shaped {
        Ok(())
    } else {
        Err(format!("`{text}` is not a Kafka version like 2.8.0"))
    }
}

fn parse(
    scaler: &'static str,
    params: &Params,
    _context: &super::Context,
) -> Result<Trigger, MetadataError> {
    let config = parse_config(params)?;
    let name = if config.topic.is_empty() {
        format!("kafka-{}-topics", config.consumer_group)
    } else {
        format!("kafka-{}", config.topic)
    };
    Ok(Trigger {
        scaler,
        metric_name: metric_name(&name),
        target: config.lag_threshold as f64,
        target_key: "lagThreshold",
        polling_interval: None,
        activation_target: config.activation_lag_threshold as f64,
        query: Query {
            key: query_key(&config),
            description: describe(&config),
            endpoints: config.bootstrap_servers.clone(),
            source: Arc::new(KafkaSource::new(config)),
        },
    })
}

/// Committed or latest offsets: topic → partition → offset.
pub type Offsets = HashMap<String, HashMap<i32, i64>>;

/// No committed offset (Kafka's `-1`).
pub const INVALID_OFFSET: i64 = -1;

/// The partitions a topic's lag is read from (`partitionLimitation`).
pub fn active_partitions(c: &KafkaConfig, ids: impl IntoIterator<Item = i32>) -> Vec<i32> {
    ids.into_iter()
        .filter(|id| c.partition_limitation.as_ref().is_none_or(|only| only.contains(id)))
        .collect()
}

/// KEDA's `getLagForPartition`: (lag, lag counting persistent lag).
/// `previous` remembers committed offsets between polls for
/// `excludePersistentLag`: a partition whose committed offset did not move
/// since the last poll counts as 0 lag (but still as activity).
pub fn lag_for_partition(
    c: &KafkaConfig,
    topic: &str,
    partition: i32,
    consumer_offset: i64,
    latest: &Offsets,
    previous: &mut HashMap<(String, i32), i64>,
) -> (i64, i64) {
    if consumer_offset == INVALID_OFFSET {
        if c.offset_reset_policy == OffsetResetPolicy::Latest {
            let lag = if c.scale_to_zero_on_invalid_offset { 0 } else { 1 };
            return (lag, lag);
        }
        if c.scale_to_zero_on_invalid_offset {
            return (0, 0);
        }
    }
    let Some(&latest_offset) = latest.get(topic).and_then(|partitions| partitions.get(&partition)) else {
        return (0, 0);
    };
    if consumer_offset == INVALID_OFFSET {
        // earliest: everything in the partition is lag.
        return (latest_offset, latest_offset);
    }
    let lag = latest_offset - consumer_offset;
    if c.exclude_persistent_lag {
        let key = (topic.to_string(), partition);
        if previous.get(&key) == Some(&consumer_offset) {
            return (0, lag);
        }
        previous.insert(key, consumer_offset);
    }
    (lag, lag)
}

/// KEDA's `getTotalLag` after the offsets are in: (reported lag, lag
/// counting persistent lag for activation).
pub fn total_lag(
    c: &KafkaConfig,
    committed: &Offsets,
    latest: &Offsets,
    previous: &mut HashMap<(String, i32), i64>,
) -> (i64, i64) {
    let (mut total, mut with_persistent) = (0_i64, 0_i64);
    let (mut partitions, mut partitions_with_lag) = (0_i64, 0_i64);
    for (topic, offsets) in latest {
        for &partition in offsets.keys() {
            let consumer_offset = committed
                .get(topic)
                .and_then(|p| p.get(&partition))
                .copied()
                .unwrap_or(INVALID_OFFSET);
            let (lag, lag_with_persistent) = lag_for_partition(c, topic, partition, consumer_offset, latest, previous);
            total += lag;
            with_persistent += lag_with_persistent;
            if lag > 0 {
                partitions_with_lag += 1;
            }
        }
        partitions += offsets.len() as i64;
    }
    if !c.allow_idle_consumers || c.limit_to_partitions_with_lag || c.ensure_even_distribution_of_partitions {
        let mut upper_bound = partitions;
        if c.ensure_even_distribution_of_partitions {
            total = next_factor(total, partitions, c.lag_threshold) * c.lag_threshold;
        }
        if c.limit_to_partitions_with_lag {
            upper_bound = partitions_with_lag;
        }
        // KEDA compares with integer division: a lag just above the cap
        // (by less than one threshold) is left as it is.
        if total / c.lag_threshold > upper_bound {
            total = upper_bound * c.lag_threshold;
        }
    }
    (total, with_persistent)
}

/// The smallest factor of the partition count whose consumers can take
/// the lag (`ensureEvenDistributionOfPartitions`).
pub fn next_factor(total_lag: i64, partitions: i64, lag_threshold: i64) -> i64 {
    factors(partitions)
        .into_iter()
        .find(|factor| factor * lag_threshold >= total_lag)
        .unwrap_or(partitions)
}

fn factors(n: i64) -> Vec<i64> {
    if n < 1 {
        return Vec::new();
    }
    let mut found: Vec<i64> = (1..)
        .take_while(|i| i * i <= n)
        .filter(|i| n % i == 0)
        .flat_map(|i| [i, n / i])
        .collect();
    found.sort_unstable();
    found.dedup();
    found
}

/// The connection part of the identity: which cluster, as whom.
fn cluster_key(c: &KafkaConfig) -> String {
    format!(
        "{}|tls={}/{}|ca={}|cert={}|sasl={:?}|user={}|secrets={:x}",
        c.bootstrap_servers.join(","),
        c.tls.enabled,
        c.tls.unsafe_ssl,
        c.tls.ca,
        c.tls.cert,
        c.sasl,
        c.username,
        fingerprint(&[&c.password, &c.tls.key, &c.tls.key_password]),
    )
}

fn query_key(c: &KafkaConfig) -> String {
    format!(
        "kafka|{}|group={}|topic={}|partitions={:?}|threshold={}|reset={:?}|idle={}|persistent={}|zero={}|withlag={}|even={}",
        cluster_key(c),
        c.consumer_group,
        c.topic,
        c.partition_limitation,
        c.lag_threshold,
        c.offset_reset_policy,
        c.allow_idle_consumers,
        c.exclude_persistent_lag,
        c.scale_to_zero_on_invalid_offset,
        c.limit_to_partitions_with_lag,
        c.ensure_even_distribution_of_partitions,
    )
}

fn describe(c: &KafkaConfig) -> String {
    let topic = if c.topic.is_empty() {
        "every topic".to_string()
    } else {
        format!("topic `{}`", c.topic)
    };
    format!(
        "kafka group `{}` on {topic} at {}",
        c.consumer_group,
        c.bootstrap_servers.join(",")
    )
}

/// Clients shared by every source on the same cluster, credentials and
/// group: librdkafka fetches committed offsets for its own `group.id`.
fn pooled_client(c: &KafkaConfig) -> Result<Arc<BaseConsumer>, ObserveError> {
    static POOL: OnceLock<Mutex<HashMap<String, Weak<BaseConsumer>>>> = OnceLock::new();
    let key = format!("{}|group={}", cluster_key(c), c.consumer_group);
    let mut pool = POOL.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
    pool.retain(|_, client| client.strong_count() > 0);
    if let Some(client) = pool.get(&key).and_then(Weak::upgrade) {
        return Ok(client);
    }
    let client = Arc::new(client_config(c)?.create::<BaseConsumer>().map_err(|e| ObserveError::Config(e.to_string()))?);
    pool.insert(key, Arc::downgrade(&client));
    Ok(client)
}

fn client_config(c: &KafkaConfig) -> Result<ClientConfig, ObserveError> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", c.bootstrap_servers.join(","))
        .set("group.id", &c.consumer_group)
        .set("client.id", "hoist")
        .set("enable.auto.commit", "false")
        .set("socket.timeout.ms", "10000")
        .set("reconnect.backoff.max.ms", "5000")
        .set("log_level", "3");
    let mechanism = match &c.sasl {
        Sasl::None => None,
        Sasl::Plaintext => Some("PLAIN"),
        Sasl::ScramSha256 => Some("SCRAM-SHA-256"),
        Sasl::ScramSha512 => Some("SCRAM-SHA-512"),
        unsupported => {
            return Err(ObserveError::Config(format!(
                "sasl `{}` is not supported by hoist yet; use plaintext, scram_sha256 or scram_sha512",
                unsupported.name()
            )));
        }
    };
    let protocol = match (c.tls.enabled, mechanism.is_some()) {
        (false, false) => "plaintext",
        (true, false) => "ssl",
        (false, true) => "sasl_plaintext",
        (true, true) => "sasl_ssl",
    };
    config.set("security.protocol", protocol);
    if let Some(mechanism) = mechanism {
        config
            .set("sasl.mechanism", mechanism)
            .set("sasl.username", &c.username)
            .set("sasl.password", c.password.expose());
    }
    if c.tls.enabled {
        if !c.tls.ca.is_empty() {
            config.set("ssl.ca.pem", &c.tls.ca);
        }
        if !c.tls.cert.is_empty() {
            config.set("ssl.certificate.pem", &c.tls.cert).set("ssl.key.pem", c.tls.key.expose());
            if !c.tls.key_password.is_empty() {
                config.set("ssl.key.password", c.tls.key_password.expose());
            }
        }
        if c.tls.unsafe_ssl {
            config
                .set("enable.ssl.certificate.verification", "false")
                .set("ssl.endpoint.identification.algorithm", "none");
        }
    }
    Ok(config)
}

fn kafka_error(error: rdkafka::error::KafkaError) -> ObserveError {
    use rdkafka::types::RDKafkaErrorCode as Code;
    let message = error.to_string();
    match error.rdkafka_error_code() {
        Some(Code::SaslAuthenticationFailed | Code::TopicAuthorizationFailed | Code::GroupAuthorizationFailed) => {
            ObserveError::Auth(message)
        }
        Some(Code::UnknownTopicOrPartition | Code::UnknownTopic) => ObserveError::Query(message),
        _ => ObserveError::Connect(message),
    }
}

/// One poll: metadata, committed offsets, latest offsets.
fn read_offsets(c: &KafkaConfig, client: &BaseConsumer) -> Result<(Offsets, Offsets), ObserveError> {
    let topic = (!c.topic.is_empty()).then_some(c.topic.as_str());
    let metadata = client.fetch_metadata(topic, REQUEST_TIMEOUT).map_err(kafka_error)?;
    if metadata.brokers().is_empty() {
        return Err(ObserveError::Connect("no broker answered the metadata request".into()));
    }
    let mut partitions: BTreeMap<String, Vec<i32>> = BTreeMap::new();
    for described in metadata.topics() {
        if topic.is_none() && described.name().starts_with("__") {
            continue; // internal topics (__consumer_offsets, ...)
        }
        if let Some(error) = described.error() {
            let error = rdkafka::types::RDKafkaErrorCode::from(error);
            return Err(ObserveError::Query(format!("topic `{}`: {error}", described.name())));
        }
        let active = active_partitions(c, described.partitions().iter().map(|p| p.id()));
        if topic.is_some() && active.is_empty() {
            return Err(ObserveError::Query(format!(
                "expected at least one active partition within the topic `{}`",
                described.name()
            )));
        }
        partitions.insert(described.name().to_string(), active);
    }
    if let Some(topic) = topic
        && !partitions.contains_key(topic)
    {
        return Err(ObserveError::Query(format!("topic `{topic}` does not exist")));
    }

    let mut wanted = TopicPartitionList::new();
    for (name, ids) in &partitions {
        for id in ids {
            wanted.add_partition(name, *id);
        }
    }
    if wanted.count() == 0 {
        return Ok((Offsets::new(), Offsets::new()));
    }
    let committed_list = client.committed_offsets(wanted.clone(), REQUEST_TIMEOUT).map_err(kafka_error)?;
    let mut committed = Offsets::new();
    for element in committed_list.elements() {
        let offset = match element.offset() {
            Offset::Offset(offset) => offset,
            _ => INVALID_OFFSET,
        };
        committed.entry(element.topic().to_string()).or_default().insert(element.partition(), offset);
    }
    if topic.is_none() {
        // Without a topic: only the topics the group has committed to.
        committed.retain(|_, offsets| offsets.values().any(|o| *o != INVALID_OFFSET));
        wanted = TopicPartitionList::new();
        for (name, offsets) in &committed {
            for id in offsets.keys() {
                wanted.add_partition(name, *id);
            }
        }
        if wanted.count() == 0 {
            return Ok((committed, Offsets::new()));
        }
    }
    let mut ends = TopicPartitionList::new();
    for element in wanted.elements() {
        ends.add_partition_offset(element.topic(), element.partition(), Offset::End)
            .map_err(|e| ObserveError::Query(e.to_string()))?;
    }
    let latest_list = client.offsets_for_times(ends, REQUEST_TIMEOUT).map_err(kafka_error)?;
    let mut latest = Offsets::new();
    for element in latest_list.elements() {
        element.error().map_err(kafka_error)?;
        if let Offset::Offset(offset) = element.offset() {
            latest.entry(element.topic().to_string()).or_default().insert(element.partition(), offset);
        }
    }
    Ok((committed, latest))
}

pub struct KafkaSource {
    config: Arc<KafkaConfig>,
    /// One poll at a time: a poll the driver gave up on still holds this
    /// until librdkafka returns, so failed polls cannot pile up threads.
    busy: Arc<tokio::sync::Mutex<()>>,
    client: Mutex<Option<Arc<BaseConsumer>>>,
    previous: Arc<Mutex<HashMap<(String, i32), i64>>>,
}

impl KafkaSource {
    pub fn new(config: KafkaConfig) -> Self {
        Self {
            config: Arc::new(config),
            busy: Arc::new(tokio::sync::Mutex::new(())),
            client: Mutex::new(None),
            previous: Arc::new(Mutex::new(HashMap::new())),
        }
    }

    async fn measure(&self) -> Result<Measurement, ObserveError> {
        let permit = self.busy.clone().lock_owned().await;
        let client = {
            let mut slot = self.client.lock().unwrap_or_else(|e| e.into_inner());
            match slot.as_ref() {
                Some(client) => client.clone(),
                None => {
                    let client = pooled_client(&self.config)?;
                    *slot = Some(client.clone());
                    client
                }
            }
        };
        let config = self.config.clone();
        let previous = self.previous.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let (committed, latest) = read_offsets(&config, &client)?;
            let mut previous = previous.lock().unwrap_or_else(|e| e.into_inner());
            let (lag, with_persistent) = total_lag(&config, &committed, &latest, &mut previous);
            Ok(Measurement {
                value: lag as f64,
                activity: with_persistent as f64,
            })
        })
        .await
        .map_err(|error| ObserveError::Query(format!("offset reader stopped: {error}")))?
    }
}

impl Source for KafkaSource {
    fn observe(&self) -> BoxFuture<'_, Result<Measurement, ObserveError>> {
        self.measure().boxed()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::metadata::AuthParams;

    fn config(metadata: &[(&str, &str)], auth: &[(&str, &str)]) -> KafkaConfig {
        let metadata: HashMap<String, String> = metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let auth: AuthParams = auth.iter().map(|(k, v)| (k.to_lowercase(), v.to_string())).collect();
        parse_config(&Params::new(&metadata, &auth)).unwrap()
    }

    /// librdkafka checks its configuration when a client is created, so
    /// creating one proves this build supports the mechanism (SCRAM and
    /// TLS need OpenSSL compiled in).
    #[test]
    fn sasl_and_tls_settings_make_clients_librdkafka_accepts() {
        let key = rcgen::KeyPair::generate().unwrap();
        let ca = rcgen::CertificateParams::new(vec!["kafka".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap()
            .pem();
        let base = [("bootstrapServers", "127.0.0.1:1"), ("consumerGroup", "g"), ("topic", "t")];
        for (sasl, mechanism) in [("plaintext", "PLAIN"), ("scram_sha256", "SCRAM-SHA-256"), ("scram_sha512", "SCRAM-SHA-512")] {
            for tls in ["enable", "disable"] {
                let c = config(
                    &base,
                    &[("sasl", sasl), ("username", "u"), ("password", "p"), ("tls", tls), ("ca", &ca)],
                );
                let settings = client_config(&c).unwrap();
                assert_eq!(settings.get("sasl.mechanism"), Some(mechanism));
                let protocol = if tls == "enable" { "sasl_ssl" } else { "sasl_plaintext" };
                assert_eq!(settings.get("security.protocol"), Some(protocol));
                settings
                    .create::<BaseConsumer>()
                    .unwrap_or_else(|e| panic!("{sasl} with tls {tls}: {e}"));
            }
        }
        let unsafe_tls = config(&[base[0], base[1], ("tls", "enable"), ("unsafeSsl", "true")], &[]);
        let settings = client_config(&unsafe_tls).unwrap();
        assert_eq!(settings.get("security.protocol"), Some("ssl"));
        assert_eq!(settings.get("enable.ssl.certificate.verification"), Some("false"));
        settings.create::<BaseConsumer>().unwrap();

        let gssapi = config(
            &base,
            &[("sasl", "gssapi"), ("username", "u"), ("password", "p"), ("realm", "R"), ("kerberosConfig", "x")],
        );
        let err = client_config(&gssapi).err().unwrap();
        assert!(err.to_string().contains("not supported"), "{err}");
    }

    #[test]
    fn addresses_shaped_like_urls_are_refused_without_being_shown() {
        let metadata: HashMap<String, String> = [
            ("bootstrapServers", "kafka://user:hunter2@broker:9092"),
            ("consumerGroup", "g"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let err = parse_config(&Params::new(&metadata, &AuthParams::new())).err().unwrap();
        assert!(err.to_string().contains("`bootstrapServers`"), "{err}");
        assert!(!err.to_string().contains("hunter2"), "{err}");
    }
}
