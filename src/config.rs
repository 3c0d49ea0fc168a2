//! Configuration: each setting is an environment variable and a flag, declared once, here.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `DATABASE_URL` | unset: embedded mode | PostgreSQL to use; unset starts a private cluster |
//! | `PAYMENTS_DATA_DIR` | `./.payments` | where embedded mode keeps its cluster |
//! | `GATEWAY_URL` | unset: in-process mock | base URL of the payment gateway |
//! | `PAYMENTS_BIND` | `127.0.0.1:8080` | listen address of `serve` |
//! | `PAYMENTS_LOCK_TIMEOUT_MS` | `90000` | age after which a key's lock is stale and may be taken over |
//! | `PAYMENTS_KEY_RETENTION_SECS` | `86400` | finished keys are reaped after this |
//! | `PAYMENTS_GATEWAY_TIMEOUT_MS` | `10000` | timeout of one gateway call |
//! | `PAYMENTS_FAULT_INJECTION` | off | `1` honours the `X-Fault-Inject` header (tests only) |
//!
//! Flags and variables are parsed here and turned into typed values ([`Settings`], `Duration`s) at
//! the edge; tests build [`Settings`] in code instead of through the process environment.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use reqwest::Url;

pub const DEFAULT_DATA_DIR: &str = "./.payments";
pub const DEFAULT_BIND: &str = "127.0.0.1:8080";
pub const DEFAULT_GATEWAY_BIND: &str = "127.0.0.1:8081";
/// Long enough that a live request (whose gateway call is bounded by the gateway timeout) is never
/// taken for dead; short enough that a crashed request is picked up again within minutes.
pub const DEFAULT_LOCK_TIMEOUT_MS: u64 = 90_000;
/// A day, like Stripe: comfortably longer than any client's retry horizon.
pub const DEFAULT_KEY_RETENTION_SECS: u64 = 86_400;
pub const DEFAULT_GATEWAY_TIMEOUT_MS: u64 = 10_000;

/// Where the database is. Not `Debug`: the URL may hold a password.
#[derive(Clone, Args)]
pub struct DatabaseArgs {
    /// PostgreSQL connection URL. Unset: embedded mode, a private cluster under --data-dir.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Where embedded mode keeps its PostgreSQL cluster (created on first run, kept across runs).
    #[arg(long, env = "PAYMENTS_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
}

/// The protocol's knobs.
#[derive(Debug, Clone, Args)]
pub struct ProtocolArgs {
    /// Age in milliseconds after which a key's lock is stale and another request may take it over.
    #[arg(long, env = "PAYMENTS_LOCK_TIMEOUT_MS", default_value_t = DEFAULT_LOCK_TIMEOUT_MS)]
    pub lock_timeout_ms: u64,
    /// Seconds a finished key is kept (and replayed) before it is reaped.
    #[arg(long, env = "PAYMENTS_KEY_RETENTION_SECS", default_value_t = DEFAULT_KEY_RETENTION_SECS)]
    pub key_retention_secs: u64,
    /// Timeout in milliseconds of one gateway call.
    #[arg(long, env = "PAYMENTS_GATEWAY_TIMEOUT_MS", default_value_t = DEFAULT_GATEWAY_TIMEOUT_MS)]
    pub gateway_timeout_ms: u64,
    /// Honour the X-Fault-Inject request header (for tests; never in production).
    #[arg(long, env = "PAYMENTS_FAULT_INJECTION", value_parser = clap::builder::BoolishValueParser::new(),
          default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub fault_injection: bool,
}

/// `payments serve`.
#[derive(Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Base URL of the payment gateway. Unset: an in-process mock gateway.
    #[arg(long, env = "GATEWAY_URL")]
    pub gateway_url: Option<Url>,
    /// Address to listen on (port 0 picks a free port; the chosen address is printed).
    #[arg(long, env = "PAYMENTS_BIND", default_value = DEFAULT_BIND)]
    pub bind: String,
    #[command(flatten)]
    pub protocol: ProtocolArgs,
}

/// `payments gateway`.
#[derive(Debug, Clone, Args)]
pub struct GatewayArgs {
    /// Address to listen on.
    #[arg(long, default_value = DEFAULT_GATEWAY_BIND)]
    pub bind: String,
    /// Start in `random` fault mode: each charge request fails with this probability (0 to 1).
    #[arg(long, value_parser = parse_rate)]
    pub fault_rate: Option<f64>,
}

/// `payments migrate`.
#[derive(Clone, Args)]
pub struct MigrateArgs {
    /// PostgreSQL connection URL.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
}

/// `payments accounts create`.
#[derive(Clone, Args)]
pub struct CreateAccountArgs {
    /// The account's name (1 to 100 characters).
    pub name: String,
    #[command(flatten)]
    pub database: DatabaseArgs,
}

/// The protocol's settings, as the code uses them.
#[derive(Debug, Clone)]
pub struct Settings {
    pub lock_timeout: Duration,
    pub key_retention: Duration,
    pub gateway_timeout: Duration,
    pub fault_injection: bool,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            lock_timeout: Duration::from_millis(DEFAULT_LOCK_TIMEOUT_MS),
            key_retention: Duration::from_secs(DEFAULT_KEY_RETENTION_SECS),
            gateway_timeout: Duration::from_millis(DEFAULT_GATEWAY_TIMEOUT_MS),
            fault_injection: false,
        }
    }
}

impl ProtocolArgs {
    pub fn settings(&self) -> Settings {
        Settings {
            lock_timeout: Duration::from_millis(self.lock_timeout_ms),
            key_retention: Duration::from_secs(self.key_retention_secs),
            gateway_timeout: Duration::from_millis(self.gateway_timeout_ms),
            fault_injection: self.fault_injection,
        }
    }
}

fn parse_rate(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(rate) if (0.0..=1.0).contains(&rate) => Ok(rate),
        _ => Err(format!("{value:?} is not a probability from 0 to 1")),
    }
}
