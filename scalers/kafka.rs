//! `scaler: kafka`: consumer-group lag, with the keys, defaults,
//! validation and lag arithmetic of KEDA's built-in `kafka` scaler.
//!
//! One poll is one metadata request, one committed-offsets request for
//! every partition at once (an OffsetFetch naming the trigger's group), and
//! one latest-offsets request batched per leader broker, on a client kept
//! per broker set (cluster, TLS and credentials) and shared by every group
//! on it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use rdkafka::client::{ClientContext, OAuthToken};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

mod group_offsets;
mod gssapi_support;
mod kerberos;
use gssapi_support::Environment;
pub mod msk_iam;
use msk_iam::AwsCredentials;

use super::{Kind, Measurement, ObserveError, Query, Source, SourceTls, Trigger, metric_name};
use crate::metadata::{Absent, Key, MetadataError, Origin, Params, Place};
use crate::secret::{Secret, fingerprint};

pub static KIND: Kind = Kind {
    scalers: &["kafka"],
    keys: KEYS,
    parse,
};

/// KEDA's Kafka keys, with its defaults.
pub const KEYS: &[Key] = &[
    Key::required("bootstrapServers"),
    Key::required("consumerGroup"),
    Key::optional("topic", Described("every topic")),
    Key::optional("partitionLimitation", Described("every partition")),
    Key::optional("lagThreshold", Value("10")),
    Key::optional("activationLagThreshold", Value("0")),
    Key::optional("offsetResetPolicy", Value("latest")),
    Key::optional("allowIdleConsumers", Value("false")),
    Key::optional("excludePersistentLag", Value("false")),
    Key::optional("scaleToZeroOnInvalidOffset", Value("false")),
    Key::optional("limitToPartitionsWithLag", Value("false")),
    Key::optional("ensureEvenDistributionOfPartitions", Value("false")),
    Key::optional("fullMetadata", Value("true")),
    Key::optional("version", Absent::None),
    Key::optional("tls", Value("disable")).in_(Place::Both),
    Key::optional("unsafeSsl", Value("false")),
    Key::optional("ca", Absent::None).in_(Place::Auth),
    Key::optional("cert", Absent::None).in_(Place::Auth),
    Key::optional("key", Absent::None).in_(Place::Auth),
    Key::optional("keyPassword", Absent::None).in_(Place::Auth),
    Key::optional("sasl", Value("none")).in_(Place::Both),
    Key::optional("username", Absent::None).in_(Place::AuthOrEnv),
    Key::optional("password", Absent::None).in_(Place::AuthOrEnv),
    Key::optional("saslTokenProvider", Value("bearer")).in_(Place::Both),
    Key::optional("oauthTokenEndpointUri", Absent::None).in_(Place::Auth),
    Key::optional("scopes", Absent::None).in_(Place::Auth),
    Key::optional("oauthExtensions", Absent::None).in_(Place::Auth),
    Key::optional("awsRegion", Absent::None),
    Key::optional("podIdentity", Absent::None).in_(Place::Both),
    Key::optional("identityOwner", Value("pod")),
    Key::optional("awsRoleArn", Absent::None).in_(Place::Auth),
    Key::optional("awsAccessKeyID", Absent::None).in_(Place::Both),
    Key::optional("awsAccessKeyId", Absent::None).in_(Place::Auth),
    Key::optional("awsSecretAccessKey", Absent::None).in_(Place::AuthOrEnv),
    Key::optional("awsSessionToken", Absent::None).in_(Place::Auth),
    Key::optional("realm", Absent::None).in_(Place::Auth),
    Key::optional("keytab", Absent::None).in_(Place::Auth),
    Key::optional("kerberosConfig", Absent::None).in_(Place::Auth),
    Key::optional("kerberosServiceName", Value("kafka")).in_(Place::Auth),
    Key::optional("kerberosDisableFAST", Value("false")).in_(Place::Auth),
];

/// What librdkafka may take for one request before it gives up; the
/// driver's own timeout usually ends the wait sooner.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetResetPolicy {
    Latest,
    Earliest,
}

/// A SASL user and password (PLAIN, SCRAM; OAUTHBEARER's client ID and
/// secret). `Debug` masks the password.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Credentials {
    pub username: String,
    pub password: Secret,
}

/// How hoist authenticates to the brokers; each mechanism carries what it
/// needs and nothing else.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Sasl {
    None,
    Plaintext(Credentials),
    ScramSha256(Credentials),
    ScramSha512(Credentials),
    /// OAuth bearer tokens from an OIDC token endpoint (client credentials:
    /// the username and password are the client ID and secret).
    OAuthBearer {
        client: Credentials,
        token_endpoint: String,
        scopes: Vec<String>,
        extensions: BTreeMap<String, String>,
    },
    /// AWS MSK IAM: OAUTHBEARER tokens hoist signs (see `msk_iam`).
    AwsMskIam { region: String, credentials: AwsAuth },
    /// Kerberos through librdkafka's Cyrus SASL: a ticket from `kinit`
    /// with the keytab or the password (exactly one is set), using
    /// `kerberosConfig`.
    Gssapi {
        username: String,
        password: Secret,
        keytab: Secret,
        realm: String,
        service_name: String,
        kerberos_config: String,
        disable_fast: bool,
    },
}

/// Where AWS MSK IAM credentials come from, as KEDA's
/// `GetAwsAuthorization` (kedacore/keda pkg/scalers/aws/aws_common.go)
/// reads them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum AwsAuth {
    /// An access key from the auth profile or the trigger's env.
    Static(AwsCredentials),
    /// `podIdentity: aws` or `identityOwner: operator`: hoist's own
    /// credentials (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_SESSION_TOKEN` in its environment).
    Own,
    /// `awsRoleArn`: parsed as KEDA does; assuming a role is not
    /// implemented, which the first poll reports.
    Role(String),
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
}

use Absent::{Described, Value};
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
    let params = &params.declaring(KEYS);
    let (_, bootstrap_servers) = params
        .list(&["bootstrapServers"], &[Metadata, Env])
        .ok_or_else(|| MetadataError::missing("bootstrapServers", "list the brokers, host:port, comma-separated"))?;
    if bootstrap_servers.iter().any(|server| !crate::config::plain_address(server)) {
        return Err(MetadataError::invalid("bootstrapServers", crate::config::NOT_PLAIN_ADDRESS));
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

    let tls = parse_tls(params)?;
    let sasl = Sasl::parse(params, tls.enabled)?;

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
        tls,
        sasl,
    })
}

/// `tls: enable` and its material from the auth profile (KEDA's `parseTLS`).
fn parse_tls(params: &Params) -> Result<SourceTls, MetadataError> {
    let enabled = enumeration(params, "tls", &[Metadata, Auth], &["enable", "disable"])? == Some("enable");
    let unsafe_ssl = params.boolean(&["unsafeSsl"], &[Metadata], false)?;
    let tls = SourceTls::from_auth(params, enabled, unsafe_ssl);
    if enabled {
        if !tls.cert.is_empty() && tls.key.is_empty() {
            return Err(MetadataError::missing("key", "key must be provided with cert"));
        }
        if !tls.key.is_empty() && tls.cert.is_empty() {
            return Err(MetadataError::missing("cert", "cert must be provided with key"));
        }
    }
    Ok(tls)
}

impl Sasl {
    /// KEDA's `parseSASL` (with `parseOAuthParams` and `parseGSSAPIParams`).
    /// Credentials come from the auth profile, or, as a hoist extension,
    /// from metadata values KEDA resolved (`passwordFromEnv`).
    pub fn parse(params: &Params, tls_enabled: bool) -> Result<Self, MetadataError> {
        let name = enumeration(
            params,
            "sasl",
            &[Metadata, Auth],
            &["none", "plaintext", "scram_sha256", "scram_sha512", "oauthbearer", "gssapi"],
        )?;
        Ok(match name {
            None | Some("none") => Sasl::None,
            Some("plaintext") => Sasl::Plaintext(Credentials::parse(params)?),
            Some("scram_sha256") => Sasl::ScramSha256(Credentials::parse(params)?),
            Some("scram_sha512") => Sasl::ScramSha512(Credentials::parse(params)?),
            Some("oauthbearer") => Self::parse_oauthbearer(params, tls_enabled)?,
            Some(_) => Self::parse_gssapi(params)?,
        })
    }

    fn parse_oauthbearer(params: &Params, tls_enabled: bool) -> Result<Self, MetadataError> {
        if enumeration(params, "saslTokenProvider", &[Metadata, Auth], &["bearer", "aws_msk_iam"])? == Some("aws_msk_iam") {
            if !tls_enabled {
                return Err(MetadataError::invalid("tls", "TLS is required for AWS MSK authentication"));
            }
            let region = params.required(&["awsRegion"], &[Metadata], "no awsRegion given")?.value.to_string();
            return Ok(Sasl::AwsMskIam {
                region,
                credentials: aws_auth(params)?,
            });
        }
        let client = Credentials::parse(params)?;
        let token_endpoint = params
            .required(&["oauthTokenEndpointUri"], &[Auth], "no oauth token endpoint uri given")?
            .value
            .to_string();
        let auth = |name: &str| params.string(&[name], &[Auth]).unwrap_or_default();
        let scopes = auth("scopes").split(',').map(str::to_string).collect();
        let mut extensions = BTreeMap::new();
        let raw = auth("oauthExtensions");
        if !raw.is_empty() {
            for extension in raw.split(',') {
                let Some((key, value)) = extension.split_once('=').filter(|(_, v)| !v.contains('=')) else {
                    return Err(MetadataError::invalid("oauthExtensions", "each extension must be key=value"));
                };
                extensions.insert(key.to_string(), value.to_string());
            }
        }
        Ok(Sasl::OAuthBearer {
            client,
            token_endpoint,
            scopes,
            extensions,
        })
    }

    /// KEDA's `parseGSSAPIParams`.
    fn parse_gssapi(params: &Params) -> Result<Self, MetadataError> {
        let username = params.string(&["username"], &[Auth, Env]).unwrap_or_default();
        if username.is_empty() {
            return Err(MetadataError::missing("username", "no username given"));
        }
        let password = Secret::new(params.string(&["password"], &[Auth, Env]).unwrap_or_default());
        let keytab = Secret::new(params.string(&["keytab"], &[Auth]).unwrap_or_default());
        if password.is_empty() == keytab.is_empty() {
            return Err(MetadataError::invalid(
                "keytab",
                "exactly one of `password` or `keytab` must be given for GSSAPI",
            ));
        }
        let realm = params.required(&["realm"], &[Auth], "no realm given")?.value.to_string();
        let kerberos_config = params
            .required(&["kerberosConfig"], &[Auth], "no Kerberos configuration (kerberosConfig) given")?
            .value
            .to_string();
        Ok(Sasl::Gssapi {
            username,
            password,
            keytab,
            realm,
            service_name: params.string(&["kerberosServiceName"], &[Auth]).unwrap_or_default(),
            kerberos_config,
            disable_fast: params.boolean(&["kerberosDisableFAST"], &[Auth], false)?,
        })
    }

    /// librdkafka's `sasl.mechanism`.
    fn mechanism(&self) -> Option<&'static str> {
        match self {
            Sasl::None => None,
            Sasl::Plaintext(_) => Some("PLAIN"),
            Sasl::ScramSha256(_) => Some("SCRAM-SHA-256"),
            Sasl::ScramSha512(_) => Some("SCRAM-SHA-512"),
            Sasl::OAuthBearer { .. } | Sasl::AwsMskIam { .. } => Some("OAUTHBEARER"),
            Sasl::Gssapi { .. } => Some("GSSAPI"),
        }
    }
}

impl Credentials {
    /// `username` and `password`, both required.
    fn parse(params: &Params) -> Result<Self, MetadataError> {
        let username = params.string(&["username"], &[Auth, Env]).unwrap_or_default();
        if username.is_empty() {
            return Err(MetadataError::missing("username", "no username given"));
        }
        let password = params.string(&["password"], &[Auth, Env]).unwrap_or_default();
        if password.is_empty() {
            return Err(MetadataError::missing("password", "no password given"));
        }
        Ok(Self {
            username,
            password: Secret::new(password),
        })
    }
}

/// KEDA's `GetAwsAuthorization` for `aws_msk_iam`, key by key.
fn aws_auth(params: &Params) -> Result<AwsAuth, MetadataError> {
    let pod_identity = params.string(&["podIdentity"], &[Auth, Metadata]).unwrap_or_default();
    let role = params.string(&["awsRoleArn"], &[Auth]).filter(|r| !r.is_empty());
    if pod_identity == "aws" {
        return Ok(role.map_or(AwsAuth::Own, AwsAuth::Role));
    }
    match params.string(&["identityOwner"], &[Metadata]).as_deref() {
        Some("operator") => return Ok(AwsAuth::Own),
        None | Some("" | "pod") => {}
        Some(other) => {
            return Err(MetadataError::invalid(
                "identityOwner",
                format!("`{other}` is not `pod` or `operator`"),
            ));
        }
    }
    if let Some(role) = role {
        return Ok(AwsAuth::Role(role));
    }
    let no_secret = || MetadataError::missing("awsSecretAccessKey", "awsSecretAccessKey not found");
    let from_auth = params.string(&["awsAccessKeyID", "awsAccessKeyId"], &[Auth]).filter(|k| !k.is_empty());
    let (access_key_id, secret, session_token) = match from_auth {
        Some(access_key_id) => (
            access_key_id,
            params.string(&["awsSecretAccessKey"], &[Auth]),
            params.string(&["awsSessionToken"], &[Auth]).filter(|t| !t.is_empty()),
        ),
        None => {
            let access_key_id = params
                .string(&["awsAccessKeyID"], &[Metadata, Env])
                .filter(|k| !k.is_empty())
                .ok_or_else(|| MetadataError::missing("awsAccessKeyID", "awsAccessKeyID not found"))?;
            (access_key_id, params.string(&["awsSecretAccessKey"], &[Env]), None)
        }
    };
    let secret = secret.filter(|s| !s.is_empty()).ok_or_else(no_secret)?;
    Ok(AwsAuth::Static(AwsCredentials {
        access_key_id,
        secret_access_key: Secret::new(secret),
        session_token: session_token.map(Secret::new),
    }))
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
    context: &super::Context,
) -> Result<Trigger, MetadataError> {
    let config = parse_config(params)?;
    refuse_unsupported(&config, &Environment::current())?;
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
            key: query_key(&config).into(),
            description: describe(&config).into(),
            endpoints: config.bootstrap_servers.clone(),
            source: Arc::new(KafkaSource::new(config, context.kafka.clone())),
        },
        route: None,
    })
}

/// A trigger this process cannot serve is refused when it is declared
/// (the reason reaches KEDA and the ScaledObject's events), not at every
/// poll with an opaque SASL error.
fn refuse_unsupported(config: &KafkaConfig, environment: &Environment) -> Result<(), MetadataError> {
    if let Sasl::Gssapi { .. } = config.sasl
        && let Some(reason) = environment.gssapi_unsupported()
    {
        return Err(MetadataError::invalid("sasl", reason));
    }
    Ok(())
}

/// Committed offsets: topic → partition → offset.
pub type Offsets = HashMap<String, HashMap<i32, i64>>;

/// Where each partition's log ends (and, where asked, starts): topic →
/// partition → ends.
pub type Ends = HashMap<String, HashMap<i32, PartitionEnds>>;

/// A partition's high watermark, and its log start offset when it was
/// asked for (`offsetResetPolicy: earliest` for a partition the group never
/// committed; KEDA's `partitionOffsets`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionEnds {
    pub latest: i64,
    pub earliest: Option<i64>,
}

impl PartitionEnds {
    pub fn latest(latest: i64) -> Self {
        Self { latest, earliest: None }
    }
}

/// The committed offsets each partition had at the previous poll, for
/// `excludePersistentLag`.
pub type PreviousOffsets = HashMap<(String, i32), i64>;

/// A lag as KEDA's scaler returns it: the value reported for scaling, and
/// the lag counting persistent lag, which decides activity. They differ
/// only with `excludePersistentLag`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Lag {
    pub value: i64,
    pub with_persistent: i64,
}

impl Lag {
    fn both(lag: i64) -> Self {
        Self {
            value: lag,
            with_persistent: lag,
        }
    }
}

impl std::ops::AddAssign for Lag {
    fn add_assign(&mut self, other: Self) {
        self.value += other.value;
        self.with_persistent += other.with_persistent;
    }
}

impl From<Lag> for Measurement {
    fn from(lag: Lag) -> Self {
        Measurement {
            value: lag.value as f64,
            activity: lag.with_persistent as f64,
        }
    }
}

/// No committed offset (Kafka's `-1`).
pub const INVALID_OFFSET: i64 = -1;

/// The partitions a topic's lag is read from (`partitionLimitation`).
pub fn active_partitions(c: &KafkaConfig, ids: impl IntoIterator<Item = i32>) -> Vec<i32> {
    ids.into_iter()
        .filter(|id| c.partition_limitation.as_ref().is_none_or(|only| only.contains(id)))
        .collect()
}

/// KEDA 2.21's `getLagForPartition`, and one difference: with
/// `excludePersistentLag`, a partition that had no committed offset at
/// the previous poll either is persistent lag too (KEDA never excludes it:
/// kedacore/keda#5274, #5906). `previous` remembers committed offsets
/// between polls: a partition whose committed offset did not move since
/// the last poll counts as 0 lag (but still as activity).
pub fn lag_for_partition(
    c: &KafkaConfig,
    topic: &str,
    partition: i32,
    consumer_offset: i64,
    ends: &Ends,
    previous: &mut PreviousOffsets,
) -> Lag {
    let ends = ends.get(topic).and_then(|partitions| partitions.get(&partition));
    let lag = if consumer_offset == INVALID_OFFSET {
        match (c.offset_reset_policy, c.scale_to_zero_on_invalid_offset, ends) {
            (_, true, _) => return Lag::default(),
            // KEDA keeps one consumer for a partition nobody committed to.
            (OffsetResetPolicy::Latest, false, _) => 1,
            (OffsetResetPolicy::Earliest, false, None) => return Lag::default(),
            // What a consumer starting from the log start can fetch, not
            // what retention deleted (kedacore/keda#7936); retention can
            // move the start past the end sampled before it.
            (OffsetResetPolicy::Earliest, false, Some(ends)) => match ends.earliest {
                Some(earliest) => (ends.latest - earliest).max(0),
                None => ends.latest,
            },
        }
    } else {
        let Some(ends) = ends else {
            return Lag::default();
        };
        ends.latest - consumer_offset
    };
    if c.exclude_persistent_lag {
        let key = (topic.to_string(), partition);
        if previous.get(&key) == Some(&consumer_offset) {
            return Lag {
                value: 0,
                with_persistent: lag,
            };
        }
        previous.insert(key, consumer_offset);
    }
    Lag::both(lag)
}

/// KEDA's `getTotalLag` after the offsets are in.
pub fn total_lag(c: &KafkaConfig, committed: &Offsets, ends: &Ends, previous: &mut PreviousOffsets) -> Lag {
    let mut total = Lag::default();
    let (mut partitions, mut partitions_with_lag) = (0_i64, 0_i64);
    for (topic, offsets) in ends {
        for &partition in offsets.keys() {
            let consumer_offset = committed
                .get(topic)
                .and_then(|p| p.get(&partition))
                .copied()
                .unwrap_or(INVALID_OFFSET);
            let lag = lag_for_partition(c, topic, partition, consumer_offset, ends, previous);
            if lag.value > 0 {
                partitions_with_lag += 1;
            }
            total += lag;
        }
        partitions += offsets.len() as i64;
    }
    if !c.allow_idle_consumers || c.limit_to_partitions_with_lag || c.ensure_even_distribution_of_partitions {
        let mut upper_bound = partitions;
        if c.ensure_even_distribution_of_partitions {
            total.value = next_factor(total.value, partitions, c.lag_threshold) * c.lag_threshold;
        }
        if c.limit_to_partitions_with_lag {
            upper_bound = partitions_with_lag;
        }
        // KEDA compares with integer division: a lag just above the cap
        // (by less than one threshold) is left as it is.
        if total.value / c.lag_threshold > upper_bound {
            total.value = upper_bound * c.lag_threshold;
        }
    }
    total
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

/// What tells two clients apart: the broker set, that is the cluster and
/// how hoist connects and authenticates to it. Not the group: the client
/// joins none, and asks each group's offsets by name (`group_offsets`).
/// Holds secrets: it is a map key, never printed.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct ClientKey {
    bootstrap_servers: Vec<String>,
    tls: SourceTls,
    sasl: Sasl,
}

impl ClientKey {
    pub fn of(c: &KafkaConfig) -> Self {
        Self {
            bootstrap_servers: c.bootstrap_servers.clone(),
            tls: c.tls.clone(),
            sasl: c.sasl.clone(),
        }
    }

    /// The key in words for the query key: secrets only as a fingerprint
    /// (`Secret`'s `Debug` masks them in `sasl`).
    fn identity(&self) -> String {
        format!(
            "{}|tls={}/{}|ca={}|cert={}|sasl={:?}|secrets={:x}",
            self.bootstrap_servers.join(","),
            self.tls.enabled,
            self.tls.unsafe_ssl,
            self.tls.ca,
            self.tls.cert,
            self.sasl,
            fingerprint(&self.secrets()),
        )
    }

    /// Every secret that tells two connections apart.
    fn secrets(&self) -> Vec<&Secret> {
        let mut secrets = vec![&self.tls.key, &self.tls.key_password];
        match &self.sasl {
            Sasl::None => {}
            Sasl::Plaintext(credentials) | Sasl::ScramSha256(credentials) | Sasl::ScramSha512(credentials) => {
                secrets.push(&credentials.password)
            }
            Sasl::OAuthBearer { client, .. } => secrets.push(&client.password),
            Sasl::AwsMskIam { credentials, .. } => {
                if let AwsAuth::Static(credentials) = credentials {
                    secrets.push(&credentials.secret_access_key);
                    secrets.extend(&credentials.session_token);
                }
            }
            Sasl::Gssapi { password, keytab, .. } => secrets.extend([password, keytab]),
        }
        secrets
    }
}

/// The Kafka clients of one hoist, shared by every trigger with the same
/// `ClientKey`: 1,000 triggers of 100 groups on one cluster hold one
/// client. Handed to triggers in `scalers::Context`; a client lives as
/// long as a trigger holds it.
#[derive(Clone, Default)]
pub struct ClientPool(Arc<Mutex<HashMap<ClientKey, Weak<Client>>>>);

impl ClientPool {
    fn client(&self, c: &KafkaConfig) -> Result<Arc<Client>, ObserveError> {
        let key = ClientKey::of(c);
        let mut pool = self.0.lock().unwrap_or_else(|e| e.into_inner());
        pool.retain(|_, client| client.strong_count() > 0);
        if let Some(client) = pool.get(&key).and_then(Weak::upgrade) {
            return Ok(client);
        }
        let client = Arc::new(create_client(c)?);
        pool.insert(key, Arc::downgrade(&client));
        Ok(client)
    }

    /// Clients some trigger still holds.
    pub fn live(&self) -> usize {
        let pool = self.0.lock().unwrap_or_else(|e| e.into_inner());
        pool.values().filter(|client| client.strong_count() > 0).count()
    }
}

impl std::fmt::Debug for ClientPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientPool").field("live", &self.live()).finish()
    }
}

fn query_key(c: &KafkaConfig) -> String {
    format!(
        "kafka|{}|group={}|topic={}|partitions={:?}|threshold={}|reset={:?}|idle={}|persistent={}|zero={}|withlag={}|even={}",
        ClientKey::of(c).identity(),
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

/// The client's context: librdkafka's log lines go to tracing, and for
/// AWS MSK IAM it signs the OAUTHBEARER tokens librdkafka asks for (when
/// the client is polled: `KafkaSource::measure` polls before each read).
pub struct KafkaContext {
    msk: Option<MskIam>,
}

struct MskIam {
    region: String,
    credentials: AwsAuth,
    lifetime: Duration,
    /// Tokens made so far, for tests and logs.
    issued: std::sync::atomic::AtomicU64,
}

impl KafkaContext {
    fn new(c: &KafkaConfig) -> Self {
        let msk = match &c.sasl {
            Sasl::AwsMskIam { region, credentials } => Some(MskIam {
                region: region.clone(),
                credentials: credentials.clone(),
                lifetime: msk_iam::TOKEN_LIFETIME,
                issued: Default::default(),
            }),
            _ => None,
        };
        Self { msk }
    }

    /// How many MSK IAM tokens this client has made.
    pub fn tokens_issued(&self) -> u64 {
        self.msk.as_ref().map_or(0, |m| m.issued.load(std::sync::atomic::Ordering::Relaxed))
    }
}

impl MskIam {
    fn credentials(&self) -> Result<AwsCredentials, String> {
        match &self.credentials {
            AwsAuth::Static(credentials) => Ok(credentials.clone()),
            AwsAuth::Own => {
                let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
                let (Some(access_key_id), Some(secret)) = (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) else {
                    return Err("hoist's own AWS credentials are used (podIdentity aws or identityOwner operator) but AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY are not set in its environment".into());
                };
                Ok(AwsCredentials {
                    access_key_id,
                    secret_access_key: Secret::new(secret),
                    session_token: var("AWS_SESSION_TOKEN").map(Secret::new),
                })
            }
            AwsAuth::Role(_) => Err(
                "`awsRoleArn`: assuming an AWS role is not supported by hoist; give an access key (awsAccessKeyID, awsSecretAccessKey) or hoist's own credentials".into(),
            ),
        }
    }
}

impl ClientContext for KafkaContext {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;

    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        use RDKafkaLogLevel::*;
        // librdkafka reports a failed broker connection as an error; the
        // poll's own failure already says so, so these are warnings.
        match level {
            Emerg | Alert | Critical => tracing::error!(target: "librdkafka", facility, "{message}"),
            Error | Warning => tracing::warn!(target: "librdkafka", facility, "{message}"),
            Notice | Info => tracing::info!(target: "librdkafka", facility, "{message}"),
            Debug => tracing::debug!(target: "librdkafka", facility, "{message}"),
        }
    }

    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        // Connection trouble shows up in the poll's own error too.
        tracing::debug!(target: "librdkafka", %error, "{reason}");
    }

    fn generate_oauth_token(&self, _config: Option<&str>) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        let msk = self.msk.as_ref().ok_or("no OAUTHBEARER token provider configured")?;
        let credentials = msk.credentials()?;
        let token = msk_iam::token(&msk.region, &credentials, std::time::SystemTime::now(), msk.lifetime)?;
        msk.issued.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tracing::debug!(region = %msk.region, "signed a new AWS MSK IAM token");
        Ok(OAuthToken {
            token: token.value.expose().to_string(),
            principal_name: credentials.access_key_id,
            lifetime_ms: msk_iam::unix_ms(token.expires_at),
        })
    }
}

impl ConsumerContext for KafkaContext {}

type Client = BaseConsumer<KafkaContext>;

fn create_client(c: &KafkaConfig) -> Result<Client, ObserveError> {
    client_config(c)?
        .create_with_context(KafkaContext::new(c))
        .map_err(|e| ObserveError::Config(e.to_string()))
}

/// Serves what librdkafka queued for the application: log lines, and the
/// OAUTHBEARER token refreshes of AWS MSK IAM (signed here, at startup and
/// before each token's end). The client subscribes to nothing, so no
/// message is ever taken.
fn serve_events(client: &Client) {
    for _ in 0..64 {
        if client.poll(Duration::ZERO).is_none() {
            break;
        }
    }
}

fn client_config(c: &KafkaConfig) -> Result<ClientConfig, ObserveError> {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", c.bootstrap_servers.join(","))
        // No `group.id`: the client is shared by the groups of its broker
        // set, and one would make it a group member's, with a coordinator
        // connection of its own.
        .set("client.id", "hoist")
        .set("enable.auto.commit", "false")
        // KEDA reads the high watermark (Sarama's ListOffsets v1 carries
        // no isolation level: kedacore/keda pkg/scalers/kafka_scaler.go,
        // `getProducerOffsets`), not the last stable offset librdkafka's
        // default `read_committed` asks for: open transactions count.
        .set("isolation.level", "read_uncommitted")
        .set("socket.timeout.ms", "10000")
        .set("reconnect.backoff.max.ms", "5000")
        .set("log_level", "3");
    let mechanism = c.sasl.mechanism();
    let protocol = match (c.tls.enabled, mechanism.is_some()) {
        (false, false) => "plaintext",
        (true, false) => "ssl",
        (false, true) => "sasl_plaintext",
        (true, true) => "sasl_ssl",
    };
    config.set("security.protocol", protocol);
    if let Some(mechanism) = mechanism {
        config.set("sasl.mechanism", mechanism);
    }
    match &c.sasl {
        Sasl::Plaintext(credentials) | Sasl::ScramSha256(credentials) | Sasl::ScramSha512(credentials) => {
            config
                .set("sasl.username", &credentials.username)
                .set("sasl.password", credentials.password.expose());
        }
        Sasl::OAuthBearer {
            client,
            token_endpoint,
            scopes,
            extensions,
        } => {
            // librdkafka's own OIDC client-credentials flow, as KEDA's
            // `OAuthBearerTokenProvider` (kedacore/keda
            // pkg/scalers/kafka/kafka_scaler_oauth_token_provider.go): the
            // username and password are the client ID and secret; the
            // token is fetched and refreshed on librdkafka's background
            // thread.
            config
                .set("sasl.oauthbearer.method", "oidc")
                .set("sasl.oauthbearer.client.id", &client.username)
                .set("sasl.oauthbearer.client.secret", client.password.expose())
                .set("sasl.oauthbearer.token.endpoint.url", token_endpoint);
            let scopes: Vec<&str> = scopes.iter().map(|s| s.trim()).filter(|s| !s.is_empty()).collect();
            if !scopes.is_empty() {
                config.set("sasl.oauthbearer.scope", scopes.join(" "));
            }
            if !extensions.is_empty() {
                let pairs: Vec<String> = extensions.iter().map(|(k, v)| format!("{k}={v}")).collect();
                config.set("sasl.oauthbearer.extensions", pairs.join(","));
            }
        }
        Sasl::Gssapi {
            username,
            password,
            keytab,
            realm,
            service_name,
            kerberos_config,
            disable_fast: _,
        } => {
            let principal = if username.contains('@') {
                username.clone()
            } else {
                format!("{username}@{realm}")
            };
            let files = kerberos::files(kerberos_config, keytab, password)?;
            config
                .set("sasl.kerberos.service.name", if service_name.is_empty() { "kafka" } else { service_name })
                .set("sasl.kerberos.principal", &principal)
                .set("sasl.kerberos.kinit.cmd", files.kinit_command(&principal)?);
            if let Some(keytab) = &files.keytab {
                config.set("sasl.kerberos.keytab", keytab.display().to_string());
            }
        }
        Sasl::None | Sasl::AwsMskIam { .. } => {}
    }
    if c.tls.enabled {
        if !c.tls.ca.is_empty() {
            config.set("ssl.ca.pem", &c.tls.ca);
        }
        if !c.tls.cert.is_empty() {
            // Decrypted here rather than by OpenSSL (`ssl.key.password`), so
            // Kafka and Redis take the same keys and refuse the same ones.
            config
                .set("ssl.certificate.pem", &c.tls.cert)
                .set("ssl.key.pem", c.tls.client_key()?.expose());
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
    classify(error.rdkafka_error_code(), error.to_string())
}

fn group_offsets_error(error: group_offsets::GroupOffsetsError) -> ObserveError {
    classify(error.code(), format!("committed offsets: {error}"))
}

fn classify(code: Option<rdkafka::types::RDKafkaErrorCode>, message: String) -> ObserveError {
    use rdkafka::types::RDKafkaErrorCode as Code;
    match code {
        Some(Code::SaslAuthenticationFailed | Code::TopicAuthorizationFailed | Code::GroupAuthorizationFailed) => {
            ObserveError::Auth(message)
        }
        Some(Code::UnknownTopicOrPartition | Code::UnknownTopic) => ObserveError::Query(message),
        _ => ObserveError::Connect(message),
    }
}

/// One poll: metadata, committed offsets, latest offsets, and the log
/// start of the partitions the group never committed to when
/// `offsetResetPolicy` is earliest (as KEDA 2.21: kedacore/keda#7936).
///
/// Without a topic KEDA lists the group's committed offsets, then
/// describes only those topics (kedacore/keda pkg/scalers/kafka_scaler.go,
/// `getTopicPartitions`). That listing (OffsetFetch without topics) is not
/// asked: librdkafka's mock cluster, which some tests use, cannot answer
/// it, so hoist asks the group's offsets for the partitions
/// of every topic the cluster lists and keeps the topics with a commit: a
/// group with none has no lag (KEDA would describe every topic:
/// kedacore/keda#8114). A topic the cluster reports an error for cannot
/// be asked and does not fail the poll (KEDA would not describe it unless
/// the group committed to it); a topic hidden by a Describe ACL is skipped
/// by both (the broker leaves it out of the listing too). With a topic,
/// its error fails the poll, as in KEDA.
fn read_offsets(c: &KafkaConfig, client: &Client) -> Result<(Offsets, Ends), ObserveError> {
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
            if topic.is_none() {
                continue;
            }
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
        return Ok((Offsets::new(), Ends::new()));
    }
    let answered = group_offsets::committed(client.client(), &c.consumer_group, &wanted, REQUEST_TIMEOUT)
        .map_err(group_offsets_error)?;
    let mut committed = Offsets::new();
    for ((topic, partition), offset) in answered {
        committed.entry(topic).or_default().insert(partition, offset.unwrap_or(INVALID_OFFSET));
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
            return Ok((committed, Ends::new()));
        }
    }
    let partitions = wanted.elements().into_iter().map(|e| (e.topic().to_string(), e.partition()));
    let mut ends: Ends = Ends::new();
    for (topic, partition, latest) in list_offsets(client, partitions, Offset::End)? {
        ends.entry(topic).or_default().insert(partition, PartitionEnds::latest(latest));
    }
    if c.offset_reset_policy == OffsetResetPolicy::Earliest && !c.scale_to_zero_on_invalid_offset {
        let uncommitted: Vec<(String, i32)> = ends
            .iter()
            .flat_map(|(topic, partitions)| partitions.keys().map(move |p| (topic.clone(), *p)))
            .filter(|(topic, p)| committed.get(topic).and_then(|o| o.get(p)).is_none_or(|o| *o == INVALID_OFFSET))
            .collect();
        if !uncommitted.is_empty() {
            // As KEDA: without the log start, the partition's whole log
            // counts, and the poll goes on.
            match list_offsets(client, uncommitted, Offset::Beginning) {
                Ok(starts) => {
                    for (topic, partition, earliest) in starts {
                        if let Some(ends) = ends.get_mut(&topic).and_then(|p| p.get_mut(&partition)) {
                            ends.earliest = Some(earliest);
                        }
                    }
                }
                Err(error) => tracing::warn!(group = %c.consumer_group, %error, "cannot read log start offsets; counting whole logs as lag"),
            }
        }
    }
    Ok((committed, ends))
}

/// ListOffsets for each partition at `position` (`End`: the high
/// watermark; `Beginning`: the log start), batched per leader by
/// librdkafka.
fn list_offsets(
    client: &Client,
    partitions: impl IntoIterator<Item = (String, i32)>,
    position: Offset,
) -> Result<Vec<(String, i32, i64)>, ObserveError> {
    let mut asked = TopicPartitionList::new();
    for (topic, partition) in partitions {
        asked.add_partition_offset(&topic, partition, position)
            .map_err(|e| ObserveError::Query(e.to_string()))?;
    }
    let answered = client.offsets_for_times(asked, REQUEST_TIMEOUT).map_err(kafka_error)?;
    let mut offsets = Vec::with_capacity(answered.count());
    for element in answered.elements() {
        element.error().map_err(kafka_error)?;
        if let Offset::Offset(offset) = element.offset() {
            offsets.push((element.topic().to_string(), element.partition(), offset));
        }
    }
    Ok(offsets)
}

pub struct KafkaSource {
    config: Arc<KafkaConfig>,
    /// One poll at a time: a poll the driver gave up on still holds this
    /// until librdkafka returns, so failed polls cannot pile up threads.
    busy: Arc<tokio::sync::Mutex<()>>,
    /// Where the client comes from, on the first poll.
    pool: ClientPool,
    client: Mutex<Option<Arc<Client>>>,
    previous: Arc<Mutex<PreviousOffsets>>,
}

impl KafkaSource {
    pub fn new(config: KafkaConfig, pool: ClientPool) -> Self {
        Self {
            config: Arc::new(config),
            busy: Arc::new(tokio::sync::Mutex::new(())),
            pool,
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
                    let client = self.pool.client(&self.config)?;
                    *slot = Some(client.clone());
                    client
                }
            }
        };
        let config = self.config.clone();
        let previous = self.previous.clone();
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            serve_events(&client);
            let (committed, ends) = read_offsets(&config, &client)?;
            let mut previous = previous.lock().unwrap_or_else(|e| e.into_inner());
            Ok(total_lag(&config, &committed, &ends, &mut previous).into())
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

        assert_eq!(settings.get("isolation.level"), Some("read_uncommitted"), "KEDA reads the high watermark");
    }

    /// In an image without kinit (the FROM-scratch one), a gssapi
    /// trigger is refused when declared, naming `sasl` and why; other
    /// mechanisms need nothing from the environment.
    #[test]
    fn gssapi_is_refused_where_the_environment_cannot_serve_it() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = Environment {
            path: None,
            sasl_path: None,
            temp_dir: dir.path().to_path_buf(),
        };
        let base = [("bootstrapServers", "127.0.0.1:1"), ("consumerGroup", "g"), ("topic", "t")];
        let gssapi = config(
            &base,
            &[
                ("sasl", "gssapi"),
                ("username", "hoist"),
                ("password", "p"),
                ("realm", "EXAMPLE.COM"),
                ("kerberosConfig", "[libdefaults]\n"),
            ],
        );
        match refuse_unsupported(&gssapi, &scratch) {
            Err(MetadataError::Invalid { key, reason }) => {
                assert_eq!(key, "sasl");
                assert!(reason.contains("no `kinit` on PATH"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        let scram = config(&base, &[("sasl", "scram_sha512"), ("username", "u"), ("password", "p")]);
        refuse_unsupported(&scram, &scratch).unwrap();
    }

    /// Each SASL mechanism KEDA offers makes a client this librdkafka
    /// build accepts (OAUTHBEARER's OIDC needs curl, GSSAPI Cyrus SASL).
    #[test]
    fn oauthbearer_msk_iam_and_gssapi_make_clients_librdkafka_accepts() {
        let base = [("bootstrapServers", "127.0.0.1:1"), ("consumerGroup", "g"), ("topic", "t")];
        let bearer = config(
            &base,
            &[
                ("sasl", "oauthbearer"),
                ("username", "client-id"),
                ("password", "client-secret"),
                ("oauthTokenEndpointUri", "http://127.0.0.1:1/token"),
                ("scopes", "kafka, read"),
                ("oauthExtensions", "logicalCluster=lkc-1,identityPoolId=pool-2"),
            ],
        );
        let settings = client_config(&bearer).unwrap();
        assert_eq!(settings.get("sasl.mechanism"), Some("OAUTHBEARER"));
        assert_eq!(settings.get("sasl.oauthbearer.method"), Some("oidc"));
        assert_eq!(settings.get("sasl.oauthbearer.client.id"), Some("client-id"));
        assert_eq!(settings.get("sasl.oauthbearer.scope"), Some("kafka read"));
        assert_eq!(
            settings.get("sasl.oauthbearer.extensions"),
            Some("identityPoolId=pool-2,logicalCluster=lkc-1")
        );
        create_client(&bearer).unwrap_or_else(|e| panic!("oidc: {e}"));

        let msk = config(
            &[("bootstrapServers", "127.0.0.1:1"), ("consumerGroup", "g"), ("awsRegion", "eu-west-1")],
            &[
                ("sasl", "oauthbearer"),
                ("saslTokenProvider", "aws_msk_iam"),
                ("tls", "enable"),
                ("awsAccessKeyID", "AKIDEXAMPLE"),
                ("awsSecretAccessKey", "secret"),
            ],
        );
        let settings = client_config(&msk).unwrap();
        assert_eq!(settings.get("sasl.mechanism"), Some("OAUTHBEARER"));
        assert_eq!(settings.get("security.protocol"), Some("sasl_ssl"));
        assert_eq!(settings.get("sasl.oauthbearer.method"), None, "hoist signs the tokens");
        create_client(&msk).unwrap();

        for credential in [("keytab", "keytab bytes"), ("password", "kerberos-password")] {
            let gssapi = config(
                &base,
                &[
                    ("sasl", "gssapi"),
                    ("username", "hoist"),
                    credential,
                    ("realm", "EXAMPLE.COM"),
                    // A KDC on a closed loopback port: kinit fails at once.
                    (
                        "kerberosConfig",
                        "[libdefaults]\n default_realm = EXAMPLE.COM\n dns_lookup_kdc = false\n[realms]\n EXAMPLE.COM = {\n  kdc = 127.0.0.1:1\n }\n",
                    ),
                ],
            );
            let settings = client_config(&gssapi).unwrap();
            assert_eq!(settings.get("sasl.mechanism"), Some("GSSAPI"));
            assert_eq!(settings.get("sasl.kerberos.principal"), Some("hoist@EXAMPLE.COM"));
            assert_eq!(settings.get("sasl.kerberos.service.name"), Some("kafka"));
            let kinit = settings.get("sasl.kerberos.kinit.cmd").unwrap();
            assert!(kinit.contains("KRB5_CONFIG="), "{kinit}");
            assert!(!kinit.contains("kerberos-password"), "the password is read from a file: {kinit}");
            create_client(&gssapi).unwrap_or_else(|e| panic!("gssapi with {}: {e}", credential.0));
        }
        let injected = config(
            &base,
            &[
                ("sasl", "gssapi"),
                ("username", "x'; rm -rf /; '"),
                ("password", "p"),
                ("realm", "R"),
                ("kerberosConfig", "c"),
            ],
        );
        let err = client_config(&injected).err().unwrap();
        assert!(err.to_string().contains("`username`"), "{err}");
    }

    #[test]
    fn aws_credentials_are_read_as_keda_reads_them() {
        let msk = |metadata: &[(&str, &str)], auth: &[(&str, &str)]| {
            let mut all = vec![("bootstrapServers", "b:1"), ("consumerGroup", "g"), ("awsRegion", "eu-west-1")];
            all.extend_from_slice(metadata);
            let mut auth_all = vec![("sasl", "oauthbearer"), ("saslTokenProvider", "aws_msk_iam"), ("tls", "enable")];
            auth_all.extend_from_slice(auth);
            let metadata: HashMap<String, String> = all.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            let auth: AuthParams = auth_all.iter().map(|(k, v)| (k.to_lowercase(), v.to_string())).collect();
            parse_config(&Params::new(&metadata, &auth)).map(|c| match c.sasl {
                Sasl::AwsMskIam { credentials, .. } => credentials,
                other => panic!("{other:?}"),
            })
        };
        let stat = msk(&[], &[("awsAccessKeyId", "AK"), ("awsSecretAccessKey", "S"), ("awsSessionToken", "T")]).unwrap();
        assert_eq!(
            stat,
            AwsAuth::Static(AwsCredentials {
                access_key_id: "AK".into(),
                secret_access_key: Secret::new("S"),
                session_token: Some(Secret::new("T")),
            })
        );
        let from_env = msk(&[("awsAccessKeyIDFromEnv", "AK"), ("awsSecretAccessKeyFromEnv", "S")], &[]).unwrap();
        assert!(matches!(from_env, AwsAuth::Static(c) if c.access_key_id == "AK" && c.session_token.is_none()));
        assert_eq!(msk(&[], &[("awsRoleArn", "arn:aws:iam::1:role/r")]).unwrap(), AwsAuth::Role("arn:aws:iam::1:role/r".into()));
        assert_eq!(msk(&[], &[("podIdentity", "aws")]).unwrap(), AwsAuth::Own);
        assert_eq!(msk(&[("identityOwner", "operator")], &[]).unwrap(), AwsAuth::Own);
        let err = msk(&[], &[("awsAccessKeyID", "AK")]).unwrap_err();
        assert!(err.to_string().contains("`awsSecretAccessKey`"), "{err}");
        let err = msk(&[], &[]).unwrap_err();
        assert!(err.to_string().contains("`awsAccessKeyID`"), "{err}");
    }

    /// GSSAPI up to the KDC: librdkafka runs hoist's `kinit` command at
    /// start, which reads `kerberosConfig` and asks the realm's KDC (a UDP
    /// socket of this test) for a ticket for the principal.
    #[test]
    fn gssapi_runs_kinit_against_the_kdc_of_kerberos_config() {
        if std::process::Command::new("kinit").arg("-V").output().is_err() {
            panic!("kinit is missing: scripts/deps.sh installs krb5-user");
        }
        let kdc = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        kdc.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let krb5_conf = format!(
            "[libdefaults]\n default_realm = HOIST.TEST\n dns_lookup_kdc = false\n dns_lookup_realm = false\n[realms]\n HOIST.TEST = {{\n  kdc = {}\n }}\n",
            kdc.local_addr().unwrap()
        );
        let c = config(
            &[("bootstrapServers", "127.0.0.1:1"), ("consumerGroup", "g"), ("topic", "t")],
            &[
                ("sasl", "gssapi"),
                ("username", "scaler"),
                ("password", "kerberos-password"),
                ("realm", "HOIST.TEST"),
                ("kerberosConfig", &krb5_conf),
            ],
        );
        let client = create_client(&c).unwrap();
        let mut request = [0u8; 2048];
        let (length, _) = kdc.recv_from(&mut request).expect("an AS-REQ from kinit");
        let request = String::from_utf8_lossy(&request[..length]);
        assert!(request.contains("scaler"), "the principal's name");
        assert!(request.contains("HOIST.TEST"), "the realm");
        assert!(request.contains("krbtgt"), "a ticket-granting ticket is asked for");
        // Closing the KDC first makes kinit's retries fail at once, so the
        // client (which waits for kinit when dropped) closes quickly.
        drop(kdc);
        drop(client);
    }

    /// The mock cluster speaks no SASL, so this stops at what hoist owns:
    /// librdkafka asks hoist for a token when the client starts and again
    /// before the token ends, and the token reaches no log line.
    #[test]
    fn msk_iam_tokens_are_made_on_demand_refreshed_before_their_end_and_never_logged() {
        use std::io::Write;

        #[derive(Clone, Default)]
        struct Captured(Arc<Mutex<Vec<u8>>>);
        impl Write for Captured {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || writer.clone())
            .finish();
        let _guard = tracing::subscriber::set_default(subscriber);

        let secret = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYEXAMPLEKEY";
        let c = config(
            &[("bootstrapServers", "127.0.0.1:1"), ("consumerGroup", "g"), ("awsRegion", "eu-west-1")],
            &[
                ("sasl", "oauthbearer"),
                ("saslTokenProvider", "aws_msk_iam"),
                ("tls", "enable"),
                ("awsAccessKeyID", "AKIDEXAMPLE"),
                ("awsSecretAccessKey", secret),
            ],
        );
        let mut settings = client_config(&c).unwrap();
        // Every librdkafka debug line about security and brokers, to show
        // the token is not among them.
        settings.set("debug", "security,broker,protocol").set_log_level(RDKafkaLogLevel::Debug);
        let mut context = KafkaContext::new(&c);
        // A short-lived token: librdkafka asks for the next one at 80 % of
        // its life, on its one-second timer.
        context.msk.as_mut().unwrap().lifetime = Duration::from_secs(2);
        let client: Client = settings.create_with_context(context).unwrap();
        assert_eq!(client.context().tokens_issued(), 0, "made when asked, not before");
        serve_events(&client);
        assert_eq!(client.context().tokens_issued(), 1, "asked for at start");
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while client.context().tokens_issued() < 2 && std::time::Instant::now() < deadline {
            // Waits up to 100 ms for librdkafka's next event.
            let _ = client.poll(Duration::from_millis(100));
        }
        assert!(client.context().tokens_issued() >= 2, "refreshed before its end");

        // The token of this second, to look for in the logs.
        let token = msk_iam::token(
            "eu-west-1",
            &AwsCredentials {
                access_key_id: "AKIDEXAMPLE".into(),
                secret_access_key: Secret::new(secret),
                session_token: None,
            },
            std::time::SystemTime::now(),
            Duration::from_secs(2),
        )
        .unwrap();
        drop(client);
        let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        assert!(logs.contains("signed a new AWS MSK IAM token"), "{logs}");
        assert!(logs.contains("librdkafka"), "librdkafka's lines were captured: {logs}");
        // Any token carries this prefix (base64 of the fixed URL start).
        let prefix = &token.value.expose()[..40];
        assert!(!logs.contains(prefix), "a token reached the logs");
        assert!(!logs.contains(secret), "the secret key reached the logs");
    }

    /// The pool's key tells credentials apart without printing them: the
    /// same cluster, mechanism and group with another password is another
    /// client, and the query key carries only a fingerprint.
    #[test]
    fn client_keys_tell_credentials_apart_and_never_show_them() {
        let base = [("bootstrapServers", "127.0.0.1:1"), ("consumerGroup", "g"), ("topic", "t")];
        let scram = |password: &str| config(&base, &[("sasl", "scram_sha512"), ("username", "u"), ("password", password)]);
        assert!(ClientKey::of(&scram("one-password")) == ClientKey::of(&scram("one-password")));
        assert!(ClientKey::of(&scram("one-password")) != ClientKey::of(&scram("another-password")));
        let key = query_key(&scram("one-password"));
        assert!(!key.contains("one-password"), "{key}");
        assert_ne!(key, query_key(&scram("another-password")));
        match scram("p").sasl {
            Sasl::ScramSha512(Credentials { username, .. }) => assert_eq!(username, "u"),
            other => panic!("{other:?}"),
        }
        assert_eq!(config(&base, &[("username", "ignored")]).sasl, Sasl::None, "no credentials without a mechanism");
    }

    /// The two places hoist's lag differs from KEDA 2.21's: a partition
    /// never committed is persistent lag when it stays so, and `earliest`
    /// counts from the log start.
    #[test]
    fn never_committed_partitions_are_persistent_lag_and_earliest_counts_from_the_log_start() {
        let base = [("bootstrapServers", "b:1"), ("consumerGroup", "g"), ("topic", "t")];
        let ends: Ends = [(
            "t".to_string(),
            [(0, PartitionEnds { latest: 10, earliest: Some(7) }), (1, PartitionEnds::latest(10))].into(),
        )]
        .into();
        let mut previous = PreviousOffsets::new();
        let persistent = config(&[base[0], base[1], base[2], ("excludePersistentLag", "true")], &[]);
        let first = lag_for_partition(&persistent, "t", 0, INVALID_OFFSET, &ends, &mut previous);
        assert_eq!(first, Lag { value: 1, with_persistent: 1 });
        let second = lag_for_partition(&persistent, "t", 0, INVALID_OFFSET, &ends, &mut previous);
        assert_eq!(second, Lag { value: 0, with_persistent: 1 });

        let earliest = config(&[base[0], base[1], base[2], ("offsetResetPolicy", "earliest")], &[]);
        let retained = lag_for_partition(&earliest, "t", 0, INVALID_OFFSET, &ends, &mut previous);
        assert_eq!(retained.value, 3, "10 - 7");
        let whole = lag_for_partition(&earliest, "t", 1, INVALID_OFFSET, &ends, &mut previous);
        assert_eq!(whole.value, 10, "no log start read: the whole log, as KEDA");
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
