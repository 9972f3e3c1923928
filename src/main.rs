/// jemalloc, not glibc's malloc: after a flood of connections glibc kept
/// its high point for good (145 → 206 MiB over four waves of 5,000),
/// where jemalloc gives it back within seconds (to 40-45 MiB); measured
/// by `hoist-load flood`, see docs/BENCHMARKS.md.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's compiled-in options (`_RJEM_MALLOC_CONF` in the environment
/// still overrides them). It purges freed pages only on allocator activity
/// unless a background thread does it: without one an idle hoist after a
/// flood kept most of it (163 → 116 MiB after four waves). Freed pages go
/// back after 1 s instead of 10: with 100,000 pollers each polling every
/// 10 s, the 10 s default kept 260 MiB resident, 1 s 218 MiB.
#[allow(non_upper_case_globals)]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static malloc_conf: &[u8; 60] =
    b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};

use hoist::auth_profiles::AuthProfiles;
use hoist::config::{LogFormat, Overrides, Settings};
use hoist::reload::ConfigSource;

/// hoist: a KEDA external scaler with Azure Container Apps' scaling
/// behaviour. Point a ScaledObject trigger of type `external` or
/// `external-push` at it and pick the trigger with the `scaler` key.
#[derive(Parser)]
#[command(name = "hoist", version, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the KEDA ExternalScaler gRPC API (with gRPC health and
    /// reflection) and the admin HTTP listener (/healthz, /readyz, /metrics).
    Serve(ConfigArgs),
    /// Run only the interceptor: the HTTP and TCP proxies of the config's
    /// [[interceptor.*_routes]], and the admin listener whose
    /// /interceptor/routes the scaler reads (`interceptor.endpoints`).
    Interceptor(ConfigArgs),
    /// Validate the configuration and print the effective result, with
    /// credentials masked. Exits non-zero when something is wrong.
    CheckConfig(ConfigArgs),
    /// Measure one trigger once and print what hoist would report to KEDA.
    Probe(ProbeArgs),
    /// Show every ScaledObject a running hoist tracks: readings and their
    /// age, activity, current and desired replicas, the reason, and the
    /// time left in cooldown or stabilization.
    Status(StatusArgs),
    /// Replay a metric trace through the scaling engine and print the
    /// timeline (time, readings, active, replicas, reason).
    Simulate(SimulateArgs),
    /// Run one engine evaluation on a saved state and print the decision
    /// and the new state as JSON.
    Decide(DecideArgs),
}

#[derive(Args)]
struct StatusArgs {
    /// The admin address of the running hoist.
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:9091")]
    admin: String,
    /// Print the raw JSON of `/status` instead of a table.
    #[arg(long)]
    json: bool,
    /// A Kubernetes ServiceAccount token to present (`Authorization:
    /// Bearer`) when the admin port wants an authenticated caller
    /// (admin.auth); a missing file sends none. In a hoist pod:
    /// `kubectl exec deploy/hoist -- hoist status`.
    #[arg(long, value_name = "FILE", default_value = hoist::config::DEFAULT_TOKEN_FILE)]
    token_file: PathBuf,
}

#[derive(Args)]
struct SimulateArgs {
    /// The rules file (TOML, or JSON by extension): `[rules]` with
    /// ScaledObject keys and one `[[triggers]]` (name, target,
    /// activationTarget) per trace column. See docs/examples/.
    #[arg(long, value_name = "RULES")]
    rules: PathBuf,
    /// The trace: CSV with a `time` column (seconds) and one column per
    /// trigger; an empty cell or `error` is a failed reading.
    #[arg(long, value_name = "TRACE.csv")]
    trace: PathBuf,
    /// Also draw readings and replicas over time into this SVG file.
    #[arg(long, value_name = "OUT.svg")]
    svg: Option<PathBuf>,
}

#[derive(Args)]
struct DecideArgs {
    /// A JSON document: `rules`, `state` (as printed by a previous decide),
    /// `readings` (trigger, target, activationTarget, value or error, at)
    /// and `now` (Unix milliseconds). `-` reads standard input.
    #[arg(long, value_name = "STATE.json")]
    input: PathBuf,
}

/// Where settings come from: built-in defaults < `--config` file <
/// `HOIST_*` environment variables < these flags.
#[derive(Args, Clone)]
struct ConfigArgs {
    /// A TOML configuration file (see docs/configuration.md).
    /// `serve` and `interceptor` read it again on SIGHUP and when its
    /// content changes (see docs/configuration.md: reloading the configuration).
    #[arg(long, short = 'c', value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address for the gRPC ExternalScaler API [default: 0.0.0.0:9090].
    #[arg(long, value_name = "ADDR")]
    grpc_listen: Option<SocketAddr>,
    /// Address for the admin HTTP listener [default: 0.0.0.0:9091].
    #[arg(long, value_name = "ADDR")]
    admin_listen: Option<SocketAddr>,
    /// Log format [default: text].
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
    /// Log filter, e.g. `info` or `hoist=debug,info` [default: info].
    /// `RUST_LOG`, when set, wins.
    #[arg(long, value_name = "FILTER")]
    log_level: Option<String>,
}

#[derive(Args)]
struct ProbeArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// One trigger metadata entry, as in the ScaledObject: `-m scaler=redis
    /// -m address=redis:6379 -m listName=jobs`. Repeat for each key.
    #[arg(long = "metadata", short = 'm', value_name = "KEY=VALUE", value_parser = key_value, required = true)]
    metadata: Vec<(String, String)>,
}

fn key_value(entry: &str) -> Result<(String, String), String> {
    entry
        .split_once('=')
        .map(|(key, value)| (key.to_string(), value.to_string()))
        .ok_or_else(|| format!("`{entry}` is not KEY=VALUE"))
}

impl ConfigArgs {
    /// Where the settings come from, to load them now and again at a reload.
    fn source(&self) -> ConfigSource {
        let overrides = Overrides {
            grpc_listen: self.grpc_listen,
            admin_listen: self.admin_listen,
            log_format: self.log_format,
            log_level: self.log_level.clone(),
        };
        ConfigSource::new(self.config.clone(), std::env::vars(), overrides)
    }

    fn load(&self) -> anyhow::Result<Settings> {
        load(&self.source())
    }
}

fn load(source: &ConfigSource) -> anyhow::Result<Settings> {
    source.load().context("configuration")
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    // rustls needs a process-wide crypto provider for TLS to Redis.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match cli.command {
        Command::Serve(args) => {
            let source = args.source();
            let settings = load(&source)?;
            hoist::logging::init(&settings.log);
            open_files_limit();
            let profiles = AuthProfiles::from_settings(&settings);
            for problem in profiles.problems() {
                tracing::warn!(%problem, "auth profile cannot be resolved yet");
            }
            profiles.warn_open_to_all();
            let server = hoist::server::Server::bind(settings).await?;
            server.reload_from(source).run(termination()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Interceptor(args) => {
            let source = args.source();
            let settings = load(&source)?;
            hoist::logging::init(&settings.log);
            open_files_limit();
            let server = hoist::server::Server::bind_interceptor(settings).await?;
            server.reload_from(source).run(termination()).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::CheckConfig(args) => {
            let settings = args.load()?;
            print!("{}", toml::to_string_pretty(&settings.masked())?);
            let profiles = AuthProfiles::from_settings(&settings);
            for open in profiles.open_to_all() {
                eprintln!(
                    "warning: auth profile `{open}` has namespaces = [\"*\"]: a ScaledObject in any namespace can use its credentials"
                );
            }
            let problems = profiles.problems();
            for problem in &problems {
                eprintln!("error: {problem}");
            }
            if problems.is_empty() {
                eprintln!("configuration is valid");
                Ok(ExitCode::SUCCESS)
            } else {
                Ok(ExitCode::FAILURE)
            }
        }
        Command::Status(args) => {
            let url = format!("{}/status", args.admin.trim_end_matches('/'));
            let token = hoist::token_file::TokenFile::new(args.token_file);
            let response = token
                .authorize(reqwest::Client::new().get(&url))
                .send()
                .await
                .with_context(|| format!("cannot reach {url}"))?;
            if !response.status().is_success() {
                // The admin port says why (e.g. which credential it wants).
                let code = response.status();
                let why = response.text().await.unwrap_or_default();
                bail!("{url} answered {code}: {}", why.trim());
            }
            if args.json {
                println!("{}", response.text().await?);
            } else {
                let status: hoist::status::Status = response.json().await?;
                print!("{}", hoist::status::table(&status));
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Simulate(args) => {
            let scenario = hoist::simulate::load_scenario(&args.rules)?;
            let trace = hoist::simulate::read(&args.trace)?;
            let samples = hoist::simulate::parse_trace(&trace, &scenario)?;
            let steps = hoist::simulate::simulate(&scenario, &samples);
            print!("{}", hoist::simulate::timeline(&scenario, &steps));
            if let Some(path) = args.svg {
                std::fs::write(&path, hoist::simulate::svg(&scenario, &steps))
                    .with_context(|| format!("cannot write {}", path.display()))?;
                eprintln!("wrote {}", path.display());
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Decide(args) => {
            let input = if args.input.as_os_str() == "-" {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)?;
                text
            } else {
                std::fs::read_to_string(&args.input)
                    .with_context(|| format!("cannot read {}", args.input.display()))?
            };
            let output = hoist::decide::decide(&input)?;
            println!("{}", serde_json::to_string_pretty(&output)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Probe(args) => {
            let settings = args.config.load()?;
            let mut metadata = HashMap::new();
            for (key, value) in args.metadata {
                if metadata.insert(key.clone(), value).is_some() {
                    bail!("metadata key `{key}` given twice");
                }
            }
            let report = hoist::probe::probe(&metadata, &settings).await?;
            println!("{report}");
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Raises the open files limit as far as allowed: every connection takes
/// a descriptor, and a limit reached stops every listener at once.
fn open_files_limit() {
    let limit = hoist::listen::raise_descriptor_limit();
    tracing::info!(open_files_limit = limit, "descriptor limit");
}

/// Resolves on SIGTERM (Kubernetes) or SIGINT (Ctrl-C).
async fn termination() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = term => {}
    }
}
