//! Configuration: each setting is an environment variable and a flag, declared once, here.
//!
//! | variable | default | meaning |
//! |---|---|---|
//! | `DATABASE_URL` | unset: embedded mode | PostgreSQL to use; unset starts a private cluster |
//! | `PAYMENTS_DATA_DIR` | `./.payments` | where embedded mode keeps its cluster |
//! | `PAYMENTS_DISTRIBUTE` | unset | `1`: migrate and distribute `DATABASE_URL` over Citus first |
//! | `PAYMENTS_CITUS_WORKERS` | unset | `serve`: a local Citus cluster of N workers instead of one PostgreSQL |
//! | `PAYMENTS_CITUS_STRAIGHT_TO_WORKERS` | `true` | on Citus, each account's statements go straight to its worker; `false`: through the coordinator |
//! | `GATEWAY_URL` | unset: in-process mock | base URL of the payment gateway |
//! | `PAYMENTS_MOCK_GATEWAY_BIND` | `127.0.0.1:8081`, else a free port | where `serve`'s in-process mock gateway listens |
//! | `PAYMENTS_BIND` | `127.0.0.1:8080` | listen address of `serve` |
//! | `PAYMENTS_METRICS_BIND` | `serve`: `127.0.0.1:9464`, else a free port; `worker`: none | where `GET /metrics` is served, never on the API's address |
//! | `PAYMENTS_LOCK_TIMEOUT_MS` | `90000` | age after which a key's lock is stale and may be taken over |
//! | `PAYMENTS_KEY_RETENTION_SECS` | `86400` | finished keys are reaped after this |
//! | `PAYMENTS_GATEWAY_TIMEOUT_MS` | `10000` | timeout of one gateway call |
//! | `PAYMENTS_AUTHORIZATION_TTL_SECS` | `604800` (7 days) | how long an authorization (`capture: false`) may wait for its capture before it lapses |
//! | `PAYMENTS_FAULT_INJECTION` | off | `1` honours the `X-Fault-Inject` header (tests only) |
//! | `PAYMENTS_GATEWAY_WEBHOOK_SECRETS` | unset: events refused (embedded mode makes its own) | the secrets the gateway's events are signed with, comma-separated |
//! | `PAYMENTS_GATEWAY_WEBHOOK_TOLERANCE_SECS` | `300` | how far an event's signed time may be from this clock, either way |
//! | `PAYMENTS_WEBHOOK_ALLOWED_NETWORKS` | embedded mode: `127.0.0.0/8,::1/128`; else none | internal networks (CIDRs) webhooks may reach |
//! | `PAYMENTS_WORKER_INTERVAL_MS` | `1000` | how often an idle worker looks for work (jittered) |
//! | `PAYMENTS_COMPLETER_BACKOFF_MS` | `5000` | the completer's first wait before re-driving a key; doubles per attempt |
//! | `PAYMENTS_COMPLETER_MAX_ATTEMPTS` | `8` | completer attempts after which a key needs attention |
//! | `PAYMENTS_WEBHOOK_URL` | unset: log events | where finished payments' events are POSTed |
//! | `PAYMENTS_WEBHOOK_TIMEOUT_MS` | `15000` | timeout of one event delivery (to an endpoint, or the sink) |
//! | `PAYMENTS_WEBHOOK_BACKOFF_MS` | `1000` | first wait before redelivering a failed event; doubles per attempt |
//! | `PAYMENTS_WEBHOOK_MAX_ATTEMPTS` | `10` | delivery attempts after which an event is dead-lettered |
//! | `PAYMENTS_EVENT_RETENTION_DAYS` | `30` | the reaper deletes events (`GET /v1/events`) older than this |
//! | `PAYMENTS_WEBHOOK_RETRY_SCHEDULE` | `5s,5m,30m,2h,5h,10h,10h` | waits between attempts to deliver an event to an endpoint |
//! | `PAYMENTS_WEBHOOK_DISABLE_AFTER_SECS` | `432000` (5 days) | an endpoint failing this long is disabled |
//! | `PAYMENTS_REQUEST_COUNTS_RETENTION_HOURS` | `2160` (90 days) | the reaper deletes per-account request counts older than this |
//! | `PAYMENTS_SETTLER_BACKOFF_MS` | `15000` | the settler's wait after looking up a pending refund the first time; doubles per look-up |
//! | `PAYMENTS_SETTLER_MAX_BACKOFF_MS` | `3600000` (an hour) | the settler's longest wait between two look-ups of a pending refund |
//! | `PAYMENTS_SETTLER_OVERDUE_ATTEMPTS` | `32` (about a day) | look-ups after which a refund still pending is overdue: logged as an error, counted |
//! | `PAYMENTS_LOG_FORMAT` | `text` | `text` (coloured only on a terminal) or `json` lines; in `cli.rs`, as every command logs |
//!
//! Flags and variables are parsed here and turned into typed values ([`Settings`], `Duration`s) at
//! the edge; tests build [`Settings`] in code instead of through the process environment.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use crate::db;
use crate::gateway::signature::WebhookSecret;
use crate::idempotency::{LEASE_MARGIN, MAX_PHASE_ATTEMPTS};
use crate::webhooks::network::{AllowedNetworks, Guard};
use crate::webhooks::schedule::{DEFAULT_RETRY_SCHEDULE, RetrySchedule};
use reqwest::Url;

pub const DEFAULT_DATA_DIR: &str = "./.payments";
pub const DEFAULT_BIND: &str = "127.0.0.1:8080";
pub const DEFAULT_GATEWAY_BIND: &str = "127.0.0.1:8081";
/// Where `serve` serves `GET /metrics` unless told: 9464 is the port Prometheus exporters of
/// OpenTelemetry use, so scrape configurations tend to know it; and a loopback address, because
/// the metrics show every tenant's volumes: an operator opens them to the monitoring network
/// knowingly (`0.0.0.0:9464` inside a container network, say).
pub const DEFAULT_METRICS_BIND: &str = "127.0.0.1:9464";
/// Long enough that a live request (whose gateway call is bounded by the gateway timeout) is never
/// taken for dead; short enough that a crashed request is picked up again within minutes.
pub const DEFAULT_LOCK_TIMEOUT_MS: u64 = 90_000;
/// A day, like Stripe: comfortably longer than any client's retry horizon.
pub const DEFAULT_KEY_RETENTION_SECS: u64 = 86_400;
/// Ten years: far past any need, and well within what the database can add to its clock when it
/// records a key's expiry (a longer retention would fail every finishing statement).
const MAX_KEY_RETENTION_SECS: u64 = 10 * 366 * 86_400;
pub const DEFAULT_GATEWAY_TIMEOUT_MS: u64 = 10_000;
/// A week: about as long as card networks hold an authorization.
pub const DEFAULT_AUTHORIZATION_TTL_SECS: u64 = 604_800;
/// Five minutes either way, as Stripe's libraries allow: a signed event older than that is a
/// replay to refuse, and a clock skew within it (one minute has refused valid events elsewhere)
/// is no reason to.
pub const DEFAULT_WEBHOOK_TOLERANCE_SECS: u64 = 300;
/// Idle workers look again this often: a second of latency for background work is plenty.
pub const DEFAULT_WORKER_INTERVAL_MS: u64 = 1_000;
/// Gives a client that got a 503 a few seconds to retry by itself before a worker steps in.
pub const DEFAULT_COMPLETER_BACKOFF_MS: u64 = 5_000;
/// With the backoff doubling from 5 s, eight attempts span about twenty-one minutes (5 s + 10 s +
/// ... + 640 s): long enough to ride out a gateway outage, short enough that an operator hears
/// about a stuck payment the same hour.
pub const DEFAULT_COMPLETER_MAX_ATTEMPTS: u32 = 8;
pub const DEFAULT_WEBHOOK_TIMEOUT_MS: u64 = 15_000;
pub const DEFAULT_WEBHOOK_BACKOFF_MS: u64 = 1_000;
/// Ten attempts with a doubling backoff span about seventeen minutes.
pub const DEFAULT_WEBHOOK_MAX_ATTEMPTS: u32 = 10;
/// Ninety days: `payments stats` can compare a client's retries this month with the two before,
/// and the table holds at most 2,160 rows per account (one per hour it sent requests in).
pub const DEFAULT_REQUEST_COUNTS_RETENTION_HOURS: u32 = 2_160;
/// A month, like Stripe's events: time to page through them, and to send failed deliveries again.
pub const DEFAULT_EVENT_RETENTION_DAYS: u32 = 30;
/// Five days: an endpoint that has answered nothing good for that long is gone, or forgotten.
pub const DEFAULT_WEBHOOK_DISABLE_AFTER_SECS: u64 = 432_000;
/// Ten years: far past any use, and far from overflowing a timestamp.
const MAX_EVENT_RETENTION_DAYS: i64 = 3_650;
/// Longer than a look-up can take with the default gateway timeout (10 s, plus 2.5 s for the lease's
/// statement), so the backoff, not the lease, decides when a refund is next looked up; short
/// enough that a refund that settles within seconds, as the mock's do (2 s), is seen settled by the
/// second look-up, a quarter minute after the first.
pub const DEFAULT_SETTLER_BACKOFF_MS: u64 = 15_000;
/// However long a refund stays pending (some take days), it is looked up at least hourly: 24
/// look-ups a day per refund is nothing to a gateway, and an hour's delay nothing next to days.
/// Gateway events, when they come, settle refunds sooner; this look-up is the backstop.
pub const DEFAULT_SETTLER_MAX_BACKOFF_MS: u64 = 3_600_000;
/// With the waits doubling from 15 s to an hour, the 32nd look-up comes about a day after the
/// refund was made (eight doubling waits, about an hour, then hourly): a refund its gateway has
/// left pending that long has a customer waiting on their money, and a person should look. The
/// settler keeps looking all the same.
pub const DEFAULT_SETTLER_OVERDUE_ATTEMPTS: u32 = 32;
/// A hundred years, "for ever" in practice: the cut-off (now minus the retention) must stay a
/// date PostgreSQL can hold.
const MAX_REQUEST_COUNTS_RETENTION_HOURS: i64 = 876_000;
/// A resumed request may ask the gateway who it is, look its charge up, and charge, between two
/// renewals of its lease.
const GATEWAY_CALLS_BETWEEN_RENEWALS: u32 = 3;

/// Where the database is. Not `Debug`: the URL may hold a password.
#[derive(Clone, Args)]
pub struct DatabaseArgs {
    /// PostgreSQL connection URL. Unset: embedded mode, a private cluster under --data-dir.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Where embedded mode keeps its PostgreSQL cluster (created on first run, kept across runs).
    #[arg(long, env = "PAYMENTS_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Before starting, apply the migrations to DATABASE_URL, the coordinator of a Citus
    /// cluster, and distribute every table not distributed yet (as `payments migrate
    /// --distribute` does); refuses to start on a database without the `citus` extension.
    #[arg(long, env = "PAYMENTS_DISTRIBUTE", value_parser = clap::builder::BoolishValueParser::new(), default_value_t = false)]
    pub distribute: bool,
    /// On Citus, send each account's statements straight to the worker that holds its shards, on
    /// a pool of this process's own per worker. `false` sends every one through the coordinator,
    /// which passes it on: one hop more each, and no pool to any worker (for workers whose
    /// `max_connections` has no room for them, or that the service cannot reach).
    #[arg(long, env = "PAYMENTS_CITUS_STRAIGHT_TO_WORKERS", value_parser = clap::builder::BoolishValueParser::new(), default_value_t = true, action = clap::ArgAction::Set)]
    pub straight_to_workers: bool,
}

/// `payments stats`.
#[derive(Clone, Args)]
pub struct StatsArgs {
    /// Over the last this many hours (the current one included). Counts reach the database within
    /// ten seconds of each request.
    #[arg(long, default_value_t = 24)]
    pub hours: i64,
    #[command(flatten)]
    pub database: DatabaseArgs,
}

/// The protocol's knobs. Not `Debug`: it holds the webhook secrets as given ([`Settings`] holds
/// them as [`WebhookSecret`]s, which never show).
#[derive(Clone, Args)]
pub struct ProtocolArgs {
    /// Internal networks (comma-separated CIDRs) that webhooks may reach; every other loopback,
    /// private, shared, link-local, unspecified, multicast or broadcast address is refused.
    /// Unset: none, but in embedded mode, where it is loopback (`127.0.0.0/8,::1/128`).
    #[arg(long, env = "PAYMENTS_WEBHOOK_ALLOWED_NETWORKS")]
    pub webhook_allowed_networks: Option<String>,
    /// Age in milliseconds after which a key's lock is stale and another request may take it over.
    #[arg(long, env = "PAYMENTS_LOCK_TIMEOUT_MS", default_value_t = DEFAULT_LOCK_TIMEOUT_MS)]
    pub lock_timeout_ms: u64,
    /// Seconds a finished key is kept (and replayed) before it is reaped.
    #[arg(long, env = "PAYMENTS_KEY_RETENTION_SECS", default_value_t = DEFAULT_KEY_RETENTION_SECS)]
    pub key_retention_secs: u64,
    /// Timeout in milliseconds of one gateway call.
    #[arg(long, env = "PAYMENTS_GATEWAY_TIMEOUT_MS", default_value_t = DEFAULT_GATEWAY_TIMEOUT_MS)]
    pub gateway_timeout_ms: u64,
    /// Seconds an authorization (a payment made with `capture: false`) waits for its capture before
    /// it lapses and is cancelled. Card networks hold an authorization for about a week; at most a
    /// year is taken (no network holds money longer).
    #[arg(long, env = "PAYMENTS_AUTHORIZATION_TTL_SECS", default_value_t = DEFAULT_AUTHORIZATION_TTL_SECS,
          value_parser = clap::value_parser!(u64).range(1..=31_536_000))]
    pub authorization_ttl_secs: u64,
    /// Honour the X-Fault-Inject request header (for tests; never in production).
    #[arg(long, env = "PAYMENTS_FAULT_INJECTION", value_parser = clap::builder::BoolishValueParser::new(),
          default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub fault_injection: bool,
    /// The secrets the gateway signs its events with, comma-separated (more than one while a
    /// secret is rolled: an event signed with any of them is accepted). Unset: every event is
    /// refused, except in embedded mode, which makes its own and gives it to its mock gateway.
    #[arg(long, env = "PAYMENTS_GATEWAY_WEBHOOK_SECRETS", hide_env_values = true, value_delimiter = ',')]
    pub gateway_webhook_secrets: Vec<String>,
    /// How far, in seconds, an event's signed timestamp may be from this process's clock, before
    /// or after, for the event to be accepted.
    #[arg(long, env = "PAYMENTS_GATEWAY_WEBHOOK_TOLERANCE_SECS", default_value_t = DEFAULT_WEBHOOK_TOLERANCE_SECS)]
    pub gateway_webhook_tolerance_secs: u64,
}

/// The background workers' knobs.
#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// How often an idle worker looks for work, in milliseconds (each wait is jittered by ±50%).
    #[arg(long, env = "PAYMENTS_WORKER_INTERVAL_MS", default_value_t = DEFAULT_WORKER_INTERVAL_MS)]
    pub worker_interval_ms: u64,
    /// Milliseconds the completer waits after a key's last run before driving it; doubles with
    /// every attempt it makes.
    #[arg(long, env = "PAYMENTS_COMPLETER_BACKOFF_MS", default_value_t = DEFAULT_COMPLETER_BACKOFF_MS)]
    pub completer_backoff_ms: u64,
    /// Attempts after which the completer stops and marks the key as needing attention.
    #[arg(long, env = "PAYMENTS_COMPLETER_MAX_ATTEMPTS", default_value_t = DEFAULT_COMPLETER_MAX_ATTEMPTS,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub completer_max_attempts: u32,
    /// Where events of finished payments are POSTed. Unset: they are logged.
    #[arg(long, env = "PAYMENTS_WEBHOOK_URL")]
    pub webhook_url: Option<Url>,
    /// Timeout of one event delivery, in milliseconds.
    #[arg(long, env = "PAYMENTS_WEBHOOK_TIMEOUT_MS", default_value_t = DEFAULT_WEBHOOK_TIMEOUT_MS)]
    pub webhook_timeout_ms: u64,
    /// Milliseconds before a failed delivery is tried again; doubles with every attempt.
    #[arg(long, env = "PAYMENTS_WEBHOOK_BACKOFF_MS", default_value_t = DEFAULT_WEBHOOK_BACKOFF_MS)]
    pub webhook_backoff_ms: u64,
    /// Delivery attempts after which an event is dead-lettered.
    #[arg(long, env = "PAYMENTS_WEBHOOK_MAX_ATTEMPTS", default_value_t = DEFAULT_WEBHOOK_MAX_ATTEMPTS,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    pub webhook_max_attempts: u32,
    /// The waits between attempts to deliver an event to a merchant's endpoint (comma-separated
    /// durations): one attempt, then one after each wait, each within 20 % either way.
    #[arg(long, env = "PAYMENTS_WEBHOOK_RETRY_SCHEDULE", default_value = DEFAULT_RETRY_SCHEDULE,
          value_parser = RetrySchedule::parse)]
    pub webhook_retry_schedule: RetrySchedule,
    /// Seconds an endpoint may answer no 2xx while its deliveries keep failing before it is
    /// disabled (`failing`).
    #[arg(long, env = "PAYMENTS_WEBHOOK_DISABLE_AFTER_SECS", default_value_t = DEFAULT_WEBHOOK_DISABLE_AFTER_SECS)]
    pub webhook_disable_after_secs: u64,
    /// Days the events (`GET /v1/events`) are kept; the reaper deletes older ones.
    #[arg(long, env = "PAYMENTS_EVENT_RETENTION_DAYS", default_value_t = DEFAULT_EVENT_RETENTION_DAYS,
          value_parser = clap::value_parser!(u32).range(1..=MAX_EVENT_RETENTION_DAYS))]
    pub event_retention_days: u32,
    /// Hours the per-account request counts (`payments stats`) are kept; the reaper deletes older
    /// ones, so `payments stats --hours N` sees nothing older than this. At most a hundred years.
    #[arg(long, env = "PAYMENTS_REQUEST_COUNTS_RETENTION_HOURS",
          default_value_t = DEFAULT_REQUEST_COUNTS_RETENTION_HOURS,
          value_parser = clap::value_parser!(u32).range(1..=MAX_REQUEST_COUNTS_RETENTION_HOURS))]
    pub request_counts_retention_hours: u32,
    /// Milliseconds the settler waits after its first look-up of a refund the gateway left
    /// pending before the next; doubles with every look-up, up to the maximum. Never shorter than
    /// a look-up can take (the gateway timeout plus 2.5 s), so two workers never look one refund
    /// up at once.
    #[arg(long, env = "PAYMENTS_SETTLER_BACKOFF_MS", default_value_t = DEFAULT_SETTLER_BACKOFF_MS)]
    pub settler_backoff_ms: u64,
    /// The settler's longest wait, in milliseconds, between two look-ups of a pending refund.
    #[arg(long, env = "PAYMENTS_SETTLER_MAX_BACKOFF_MS", default_value_t = DEFAULT_SETTLER_MAX_BACKOFF_MS)]
    pub settler_max_backoff_ms: u64,
    /// Look-ups after which a refund the gateway still leaves pending is overdue: each further
    /// look-up logs an error and counts as `overdue` (settler_runs_total), for a person to look.
    #[arg(long, env = "PAYMENTS_SETTLER_OVERDUE_ATTEMPTS", default_value_t = DEFAULT_SETTLER_OVERDUE_ATTEMPTS,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub settler_overdue_attempts: u32,
}

/// `payments serve`.
#[derive(Clone, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Base URL of the payment gateway. Unset: an in-process mock gateway.
    #[arg(long, env = "GATEWAY_URL")]
    pub gateway_url: Option<Url>,
    /// Where the in-process mock gateway listens (without GATEWAY_URL); if it is taken, `serve`
    /// refuses to start. Unset: 127.0.0.1:8081, or a free port, announced, if that is taken.
    #[arg(long, env = "PAYMENTS_MOCK_GATEWAY_BIND")]
    pub mock_gateway_bind: Option<String>,
    /// With DATABASE_URL and no GATEWAY_URL: charge through an in-process mock gateway that no
    /// other process on the database can reach, knowingly. Its unfinished payments can then be
    /// finished only by this process while it lives; every other process refuses to touch them.
    #[arg(long)]
    pub private_mock_gateway: bool,
    /// Address to listen on (port 0 picks a free port; the chosen address is printed).
    #[arg(long, env = "PAYMENTS_BIND", default_value = DEFAULT_BIND)]
    pub bind: String,
    /// Where `GET /metrics` is served: never on the API's address, as the metrics show every
    /// tenant's volumes. If it is taken, `serve` refuses to start. Unset: 127.0.0.1:9464, or a
    /// free port, announced, if that is taken. The address is printed (`metrics: http://...`).
    #[arg(long, env = "PAYMENTS_METRICS_BIND")]
    pub metrics_bind: Option<String>,
    #[command(flatten)]
    pub protocol: ProtocolArgs,
    #[command(flatten)]
    pub workers: WorkerArgs,
    /// Serve the API only; run the workers elsewhere (`payments worker`).
    #[arg(long)]
    pub no_workers: bool,
    /// Instead of one embedded PostgreSQL, a local Citus cluster under --data-dir: a coordinator
    /// and this many workers, the schema distributed over them. Needs the citus extension
    /// installed for PostgreSQL; not with DATABASE_URL.
    #[arg(long, env = "PAYMENTS_CITUS_WORKERS", value_parser = clap::value_parser!(u16).range(1..=16))]
    pub citus_workers: Option<u16>,
}

/// `payments worker`.
#[derive(Clone, Args)]
pub struct WorkerCommandArgs {
    #[command(flatten)]
    pub database: DatabaseArgs,
    /// Base URL of the payment gateway (the completer reconciles and charges through it).
    /// Unset, in embedded mode: the in-process mock of the `serve` that runs the cluster.
    #[arg(long, env = "GATEWAY_URL")]
    pub gateway_url: Option<Url>,
    /// Serve `GET /metrics` at this address (such as `0.0.0.0:9091`; port 0 picks a free port,
    /// and the address is printed); if it is taken, the worker refuses to start. Unset: no listener.
    #[arg(long, env = "PAYMENTS_METRICS_BIND")]
    pub metrics_bind: Option<String>,
    #[command(flatten)]
    pub protocol: ProtocolArgs,
    #[command(flatten)]
    pub workers: WorkerArgs,
}

/// `payments gateway`. Its `Debug` never shows a secret.
#[derive(Clone, Args)]
pub struct GatewayArgs {
    /// Address to listen on.
    #[arg(long, default_value = DEFAULT_GATEWAY_BIND)]
    pub bind: String,
    /// Start in `random` fault mode: each charge request fails with this probability (0 to 1).
    #[arg(long, value_parser = parse_rate)]
    pub fault_rate: Option<f64>,
    /// Serve the `/_control/*` endpoints (inject faults, misdeliver events, forget keys, stats).
    /// Off by default: whoever reaches them can make the gateway misbehave.
    #[arg(long)]
    pub control: bool,
    /// Send the gateway's events here (`http://127.0.0.1:8080/webhooks/gateway`, a `serve`'s),
    /// each retried until acknowledged. Needs a webhook secret. Unset: no events.
    #[arg(long, env = "PAYMENTS_GATEWAY_EVENTS_URL")]
    pub events_url: Option<Url>,
    /// A secret to sign the events with; given more than once (or comma-separated), each event is
    /// signed under every one, as while a secret is rolled. The same variable as the service's,
    /// so that one setting configures both sides. Never printed.
    #[arg(
        long = "webhook-secret",
        env = "PAYMENTS_GATEWAY_WEBHOOK_SECRETS",
        hide_env_values = true,
        value_delimiter = ','
    )]
    pub webhook_secrets: Vec<String>,
}

impl fmt::Debug for GatewayArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GatewayArgs")
            .field("bind", &self.bind)
            .field("fault_rate", &self.fault_rate)
            .field("control", &self.control)
            .field("events_url", &self.events_url)
            .field("webhook_secrets", &webhook_secrets(&self.webhook_secrets))
            .finish()
    }
}

/// `payments migrate`.
#[derive(Clone, Args)]
pub struct MigrateArgs {
    /// PostgreSQL connection URL.
    #[arg(long, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: String,
    /// Then distribute every table not distributed yet over the Citus cluster the database is
    /// the coordinator of: by `account_id`, colocated; `accounts` a reference table. Refuses,
    /// changing nothing, if the database has no `citus` extension.
    #[arg(long, env = "PAYMENTS_DISTRIBUTE", value_parser = clap::builder::BoolishValueParser::new(), default_value_t = false)]
    pub distribute: bool,
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
    /// The internal networks webhooks may reach (`PAYMENTS_WEBHOOK_ALLOWED_NETWORKS`): an
    /// endpoint's URL at any other internal address is refused, and never sent to.
    pub webhook_networks: AllowedNetworks,
    pub lock_timeout: Duration,
    pub key_retention: Duration,
    pub gateway_timeout: Duration,
    pub authorization_ttl: Duration,
    pub fault_injection: bool,
    /// The secrets the gateway's events may be signed with (never printed: see [`WebhookSecret`]).
    pub gateway_webhook_secrets: Vec<WebhookSecret>,
    pub gateway_webhook_tolerance: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            webhook_networks: AllowedNetworks::default(),
            lock_timeout: Duration::from_millis(DEFAULT_LOCK_TIMEOUT_MS),
            key_retention: Duration::from_secs(DEFAULT_KEY_RETENTION_SECS),
            gateway_timeout: Duration::from_millis(DEFAULT_GATEWAY_TIMEOUT_MS),
            authorization_ttl: Duration::from_secs(DEFAULT_AUTHORIZATION_TTL_SECS),
            fault_injection: false,
            gateway_webhook_secrets: Vec::new(),
            gateway_webhook_tolerance: Duration::from_secs(DEFAULT_WEBHOOK_TOLERANCE_SECS),
        }
    }
}

impl ProtocolArgs {
    /// The settings, after checking that they keep the protocol's promises.
    pub fn settings(&self) -> anyhow::Result<Settings> {
        let webhook_networks = match &self.webhook_allowed_networks {
            Some(list) => AllowedNetworks::parse(list)
                .map_err(|error| anyhow::anyhow!("PAYMENTS_WEBHOOK_ALLOWED_NETWORKS: {error}"))?,
            None => AllowedNetworks::default(),
        };
        let settings = Settings {
            webhook_networks,
            lock_timeout: Duration::from_millis(self.lock_timeout_ms),
            key_retention: Duration::from_secs(self.key_retention_secs),
            gateway_timeout: Duration::from_millis(self.gateway_timeout_ms),
            authorization_ttl: Duration::from_secs(self.authorization_ttl_secs),
            fault_injection: self.fault_injection,
            gateway_webhook_secrets: webhook_secrets(&self.gateway_webhook_secrets),
            gateway_webhook_tolerance: Duration::from_secs(self.gateway_webhook_tolerance_secs),
        };
        settings.check()?;
        Ok(settings)
    }
}

impl Settings {
    /// The longest a live request can go between two renewals of its lease, at the worst: the
    /// rest of the `started` transaction, the gateway calls of a resumed request (asking the
    /// gateway who it is, when that is in doubt; the look-up; the charge), a wait for a
    /// connection, and the `charge_created` phase run up to its attempts, each bounded by the
    /// database operation timeout; plus the margin a driver keeps before a gateway call. With a
    /// shorter lease, a live request would be refused its gateway calls (it never makes one its
    /// lease might not outlast) and another driver could take it over mid-way.
    pub fn min_lock_timeout(&self) -> Duration {
        db::OPERATION_TIMEOUT * MAX_PHASE_ATTEMPTS
            + db::CHECKOUT_TIMEOUT
            + self.gateway_timeout * GATEWAY_CALLS_BETWEEN_RENEWALS
            + LEASE_MARGIN
    }

    /// The guard every webhook URL and delivery goes through: see [`Guard`].
    pub fn webhook_guard(&self) -> Guard {
        Guard::new(self.webhook_networks.clone())
    }

    /// Refuses settings under which a live request could be taken for dead (and its key driven by
    /// two requests at once), or a key reaped while its request may still be running.
    pub fn check(&self) -> anyhow::Result<()> {
        let min_lock_timeout = self.min_lock_timeout();
        if self.lock_timeout < min_lock_timeout {
            anyhow::bail!(
                "PAYMENTS_LOCK_TIMEOUT_MS ({} ms) must be at least {} ms with PAYMENTS_GATEWAY_TIMEOUT_MS at {} ms: \
                 between two renewals of its lease a request may make {GATEWAY_CALLS_BETWEEN_RENEWALS} gateway calls \
                 ({} ms), wait {} ms for a connection and run a phase {MAX_PHASE_ATTEMPTS} times ({} ms each at most), \
                 with {} ms to spare, and its lease must not end meanwhile. Raise the lock timeout, or lower the \
                 gateway timeout.",
                self.lock_timeout.as_millis(),
                min_lock_timeout.as_millis(),
                self.gateway_timeout.as_millis(),
                (self.gateway_timeout * GATEWAY_CALLS_BETWEEN_RENEWALS).as_millis(),
                db::CHECKOUT_TIMEOUT.as_millis(),
                db::OPERATION_TIMEOUT.as_millis(),
                LEASE_MARGIN.as_millis(),
            );
        }
        if self.key_retention > Duration::from_secs(MAX_KEY_RETENTION_SECS) {
            anyhow::bail!(
                "PAYMENTS_KEY_RETENTION_SECS ({} s) must be at most {MAX_KEY_RETENTION_SECS} s (ten years): each key's \
                 expiry is recorded as a time. Lower the retention.",
                self.key_retention.as_secs()
            );
        }
        if self.key_retention < self.lock_timeout {
            anyhow::bail!(
                "PAYMENTS_KEY_RETENTION_SECS ({} s) must not be shorter than PAYMENTS_LOCK_TIMEOUT_MS ({} ms): \
                 a client told to wait out a lock must still find its answer when it comes back. Raise the \
                 retention.",
                self.key_retention.as_secs(),
                self.lock_timeout.as_millis()
            );
        }
        Ok(())
    }
}

/// The workers' settings, as the code uses them.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    pub interval: Duration,
    pub completer_backoff: Duration,
    pub completer_max_attempts: u32,
    pub webhook_url: Option<Url>,
    pub webhook_timeout: Duration,
    pub webhook_backoff: Duration,
    pub webhook_max_attempts: u32,
    /// The waits between attempts to deliver an event to a merchant's endpoint.
    pub webhook_retry_schedule: RetrySchedule,
    /// How long an endpoint may fail before it is disabled.
    pub webhook_disable_after: Duration,
    /// How long events are kept.
    pub event_retention: Duration,
    /// How long the per-account request counts are kept.
    pub request_counts_retention: Duration,
    /// The settler's first wait between two look-ups of a pending refund; doubles per look-up.
    pub settler_backoff: Duration,
    /// The settler's longest wait between two look-ups.
    pub settler_max_backoff: Duration,
    /// Look-ups after which a refund still pending is overdue.
    pub settler_overdue_attempts: u32,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        WorkerSettings {
            interval: Duration::from_millis(DEFAULT_WORKER_INTERVAL_MS),
            completer_backoff: Duration::from_millis(DEFAULT_COMPLETER_BACKOFF_MS),
            completer_max_attempts: DEFAULT_COMPLETER_MAX_ATTEMPTS,
            webhook_url: None,
            webhook_timeout: Duration::from_millis(DEFAULT_WEBHOOK_TIMEOUT_MS),
            webhook_backoff: Duration::from_millis(DEFAULT_WEBHOOK_BACKOFF_MS),
            webhook_max_attempts: DEFAULT_WEBHOOK_MAX_ATTEMPTS,
            webhook_retry_schedule: RetrySchedule::default(),
            webhook_disable_after: Duration::from_secs(DEFAULT_WEBHOOK_DISABLE_AFTER_SECS),
            event_retention: hours(DEFAULT_EVENT_RETENTION_DAYS * 24),
            request_counts_retention: hours(DEFAULT_REQUEST_COUNTS_RETENTION_HOURS),
            settler_backoff: Duration::from_millis(DEFAULT_SETTLER_BACKOFF_MS),
            settler_max_backoff: Duration::from_millis(DEFAULT_SETTLER_MAX_BACKOFF_MS),
            settler_overdue_attempts: DEFAULT_SETTLER_OVERDUE_ATTEMPTS,
        }
    }
}

impl WorkerArgs {
    pub fn settings(&self) -> WorkerSettings {
        WorkerSettings {
            interval: Duration::from_millis(self.worker_interval_ms),
            completer_backoff: Duration::from_millis(self.completer_backoff_ms),
            completer_max_attempts: self.completer_max_attempts,
            webhook_url: self.webhook_url.clone(),
            webhook_timeout: Duration::from_millis(self.webhook_timeout_ms),
            webhook_backoff: Duration::from_millis(self.webhook_backoff_ms),
            webhook_max_attempts: self.webhook_max_attempts,
            webhook_retry_schedule: self.webhook_retry_schedule.clone(),
            webhook_disable_after: Duration::from_secs(self.webhook_disable_after_secs),
            event_retention: hours(self.event_retention_days * 24),
            request_counts_retention: hours(self.request_counts_retention_hours),
            settler_backoff: Duration::from_millis(self.settler_backoff_ms),
            settler_max_backoff: Duration::from_millis(self.settler_max_backoff_ms),
            settler_overdue_attempts: self.settler_overdue_attempts,
        }
    }
}

/// The secrets in `values` (each as given, or comma-separated), without the spaces around them;
/// empty ones are no secrets. The same reading on both sides, the gateway that signs and the
/// service that verifies, so that one value configures both.
pub fn webhook_secrets(values: &[String]) -> Vec<WebhookSecret> {
    values.iter().map(|secret| secret.trim()).filter(|secret| !secret.is_empty()).map(WebhookSecret::new).collect()
}

fn hours(hours: u32) -> Duration {
    Duration::from_secs(u64::from(hours) * 3_600)
}

fn parse_rate(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(rate) if (0.0..=1.0).contains(&rate) => Ok(rate),
        _ => Err(format!("{value:?} is not a probability from 0 to 1")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_pass_the_check() {
        Settings::default().check().unwrap();
    }

    #[test]
    fn a_lock_timeout_shorter_than_the_worst_gap_between_renewals_is_refused() {
        // Three 10 s gateway calls, a 1 s checkout, three 2.5 s phase attempts and 1 s to spare.
        let settings = Settings { lock_timeout: Duration::from_millis(39_499), ..Settings::default() };
        let error = settings.check().unwrap_err().to_string();
        assert!(error.contains("at least 39500 ms"), "{error}");
        Settings { lock_timeout: Duration::from_millis(39_500), ..Settings::default() }.check().unwrap();
        // With a short gateway timeout, the database's share decides: 3 s + 1 s + 7.5 s + 1 s.
        let fast_gateway = Settings { gateway_timeout: Duration::from_secs(1), ..Settings::default() };
        assert_eq!(fast_gateway.min_lock_timeout(), Duration::from_millis(12_500));
    }

    #[test]
    fn a_retention_past_what_the_database_can_record_is_refused() {
        let settings = Settings { key_retention: Duration::from_secs(u64::MAX), ..Settings::default() };
        assert!(settings.check().unwrap_err().to_string().contains("at most"));
        Settings { key_retention: Duration::from_secs(MAX_KEY_RETENTION_SECS), ..Settings::default() }.check().unwrap();
    }

    #[test]
    fn a_retention_shorter_than_the_lock_timeout_is_refused() {
        let settings = Settings { key_retention: Duration::from_secs(60), ..Settings::default() };
        assert!(settings.check().unwrap_err().to_string().contains("PAYMENTS_KEY_RETENTION_SECS"));
    }
}
