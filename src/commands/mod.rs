//! One module per subcommand; `main` only dispatches.

pub mod accounts;
pub mod attention;
pub mod bench;
pub mod chaos;
pub mod gateway;
pub mod listen;
pub mod migrate;
pub mod model;
pub mod pay;
pub mod refund;
pub mod send;
pub mod serve;
pub mod stats;
pub mod worker;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use reqwest::Url;

use payments_service::config::DatabaseArgs;
use payments_service::db::delegate::Routing;
use payments_service::postgres::embedded::{EmbeddedDatabase, Sharing};
use payments_service::startup::{METRICS_AT, MetricsServer, bind_usual_or_free};
use payments_service::state::AppState;

/// Where `serve` or `worker` will serve its metrics: bound before anything slow starts, so that a
/// taken address is refused at once.
pub struct MetricsListener {
    listener: TcpListener,
    /// The usual address, if it was taken and the listener moved off it.
    moved_off: Option<&'static str>,
}

impl MetricsListener {
    /// At `asked` (`PAYMENTS_METRICS_BIND`): if it is taken, the process refuses to start.
    pub fn at(asked: &str) -> anyhow::Result<MetricsListener> {
        let listener = TcpListener::bind(asked).with_context(|| {
            format!(
                "cannot serve metrics on {asked} (PAYMENTS_METRICS_BIND): free it, or choose another address (port 0 \
                 picks a free one)"
            )
        })?;
        Ok(MetricsListener { listener, moved_off: None })
    }

    /// At `asked` if set; else at `usual`, or at a free port, announced, if that is taken, as the
    /// in-process mock gateway does: `serve`s side by side on one machine (tests, a second
    /// checkout) all start, and each says where its metrics are.
    pub fn at_or_usual(asked: Option<&str>, usual: &'static str) -> anyhow::Result<MetricsListener> {
        if let Some(asked) = asked {
            return MetricsListener::at(asked);
        }
        let (listener, moved) =
            bind_usual_or_free(usual).with_context(|| format!("cannot serve metrics on {usual}"))?;
        if moved {
            let addr = listener.local_addr()?;
            tracing::warn!(taken = usual, %addr, "the metrics' usual address is taken: serving them on a free port");
        }
        Ok(MetricsListener { listener, moved_off: moved.then_some(usual) })
    }

    /// Serves `GET /metrics` on it, and prints the `metrics:` line.
    pub fn serve(self, state: Arc<AppState>) -> anyhow::Result<MetricsServer> {
        let server = MetricsServer::start(state, self.listener)?;
        match self.moved_off {
            Some(usual) => println!("{METRICS_AT} http://{}/metrics ({usual} is taken)", server.addr()),
            None => println!("{METRICS_AT} http://{}/metrics", server.addr()),
        }
        Ok(server)
    }
}

/// All outbox workers on a shared database share one outbox: one without a webhook consumes events
/// by logging them, including events that a worker with a webhook was meant to deliver.
pub fn warn_if_events_are_only_logged(settings: &payments_service::config::WorkerSettings) {
    if settings.webhook_url.is_none() {
        tracing::warn!(
            "PAYMENTS_WEBHOOK_URL is unset: this process's outbox logs the events it takes and drops them; give \
             every process that runs workers on this database the same PAYMENTS_WEBHOOK_URL"
        );
    }
}

/// Where an embedded `serve` tells the workers that join its cluster which gateway it charges
/// through.
fn gateway_file(data_dir: &Path) -> PathBuf {
    data_dir.join("gateway-url")
}

/// Tells the processes that join this embedded cluster which gateway it charges through.
pub fn advertise_gateway(data_dir: &Path, url: &Url) -> anyhow::Result<()> {
    let file = gateway_file(data_dir);
    std::fs::write(&file, url.as_str()).with_context(|| format!("cannot write {}", file.display()))
}

/// Withdraws the notice when `serve` stops (a crashed `serve` leaves it: a worker that reads it
/// then finds no gateway there, or one with another identity, which it never asks to charge a
/// payment of the old one).
pub fn withdraw_gateway(data_dir: &Path) {
    let _ = std::fs::remove_file(gateway_file(data_dir));
}

/// The gateway of the `serve` that runs this embedded cluster.
pub fn advertised_gateway(data_dir: &Path) -> anyhow::Result<Url> {
    let file = gateway_file(data_dir);
    let url = std::fs::read_to_string(&file).with_context(|| {
        format!(
            "no embedded `payments serve` runs under {} ({} is missing): start one, or set GATEWAY_URL",
            data_dir.display(),
            file.display()
        )
    })?;
    Ok(url.trim().parse()?)
}

/// The database to use: `DATABASE_URL`, or the embedded cluster (started if need be), with the
/// demo account in it.
pub async fn open_database(
    args: &DatabaseArgs,
    sharing: Sharing,
) -> anyhow::Result<(String, Option<EmbeddedDatabase>)> {
    match &args.database_url {
        Some(url) if args.distribute => {
            for (table, how) in payments_service::db::distribute::migrate_and_distribute(url).await? {
                tracing::info!(%table, how, "distributed");
            }
            Ok((url.clone(), None))
        }
        Some(url) => Ok((url.clone(), None)),
        None if args.distribute => anyhow::bail!(
            "PAYMENTS_DISTRIBUTE needs DATABASE_URL, the coordinator of a Citus cluster: the embedded PostgreSQL has \
             no Citus"
        ),
        None => {
            let embedded = EmbeddedDatabase::open(&args.data_dir, sharing).await?;
            let mut conn = AsyncPgConnection::establish(&embedded.url).await?;
            payments_service::accounts::ensure_demo(&mut conn).await?;
            Ok((embedded.url.clone(), Some(embedded)))
        }
    }
}

/// How the process's statements reach `database_url`: on Citus, each account's straight to the
/// worker that holds its shards, unless `PAYMENTS_CITUS_STRAIGHT_TO_WORKERS` is false.
pub fn routing(args: &DatabaseArgs, database_url: &str, pool_size: u32) -> Routing {
    let routing = Routing::new(database_url, pool_size);
    if args.straight_to_workers { routing } else { routing.through_coordinator() }
}

/// How long a process waits, at start, to learn whether its database role can write: longer than
/// a connection and two catalog reads take on a loaded machine, short enough not to hold up a start
/// whose database is down (which is not refused: `/readyz` and the 503s report it until it is back).
const ROLE_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// Refuses to start as a database role that could not write (on Citus, one that does not own the
/// tables: see `payments_service::db::ownership`), with the reason and the fix, rather than start
/// and fail every write. A database that cannot be asked now is not refused.
pub async fn refuse_a_role_that_cannot_write(database_url: &str) -> anyhow::Result<()> {
    let asked = tokio::time::timeout(ROLE_CHECK_TIMEOUT, async {
        let mut conn = payments_service::db::establish(database_url).await.map_err(|error| error.to_string())?;
        payments_service::db::ownership::not_owner(&mut conn).await.map_err(|error| error.to_string())
    })
    .await
    .unwrap_or_else(|_| Err(format!("no answer within {ROLE_CHECK_TIMEOUT:?}")));
    match asked {
        Ok(None) => Ok(()),
        Ok(Some(refusal)) => Err(refusal.into()),
        Err(error) => {
            tracing::warn!(%error, "could not ask the database whether this role can write; starting anyway");
            Ok(())
        }
    }
}

/// `10s`, `1500ms`, `2m`; a bare number is seconds.
fn parse_duration(value: &str) -> Result<Duration, String> {
    let split = value.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(value.len());
    let (number, unit) = value.split_at(split);
    let number: f64 = number.parse().map_err(|_| format!("{value:?} is not a duration such as 10s or 500ms"))?;
    let seconds = match unit {
        "" | "s" => number,
        "ms" => number / 1000.0,
        "m" => number * 60.0,
        _ => return Err(format!("{value:?}: the unit is ms, s or m")),
    };
    match Duration::try_from_secs_f64(seconds) {
        Ok(duration) if !duration.is_zero() => Ok(duration),
        _ => Err(format!("{value:?} is not a positive duration that this machine can count")),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_take_a_unit_or_mean_seconds() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("ten").is_err());
        assert!(parse_duration("10h").is_err());
        assert!(parse_duration("0.0000000001").is_err());
        assert!(parse_duration("99999999999999999999999").is_err());
    }
}
