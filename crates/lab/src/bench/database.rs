//! What the benchmark reads from the service's database: statements run (`pg_stat_statements`),
//! on Citus the distributed executions they made, on one shard or on several (Citus's
//! `citus_stat_counters`: a claim or a phase delegated to its node is one), WAL written, payments and refunds made, and the outbox backlog (sampled during a load by
//! [`super::sampler`]) and watched as it drains after it.
//!
//! All of it goes through one connection of the benchmark's own, which counts the statements it
//! runs itself: `pg_stat_statements` sees those too, and they are taken off, so a figure per
//! request holds only what the service (its API and its workers) ran.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use diesel::QueryableByName;
use diesel::sql_types::{BigInt, Nullable, Text};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use tokio::sync::Mutex;
use tokio::time::Instant;

/// How long the outbox may take to empty after a scenario before the benchmark goes on without
/// it (and reports it as not drained).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);

/// The database counters at one moment.
#[derive(Debug, Clone, Copy)]
pub struct Counters {
    /// Statements run in the service's database, ours excepted; `None` without `pg_stat_statements`.
    pub statements: Option<u64>,
    /// WAL written by the whole cluster, in bytes: its current position (on Citus, the
    /// coordinator's).
    pub wal_bytes: u64,
    /// On Citus: distributed executions that ran on one shard, and on several (ours included).
    pub single_shard: Option<u64>,
    pub multi_shard: Option<u64>,
    pub payments: u64,
    pub refunds: u64,
}

/// One statement's running totals in `pg_stat_statements`, by its query id.
#[derive(Debug, Clone, QueryableByName)]
pub struct StatementTotals {
    #[diesel(sql_type = BigInt)]
    pub queryid: i64,
    #[diesel(sql_type = Text)]
    pub query: String,
    #[diesel(sql_type = BigInt)]
    pub calls: i64,
    /// Execution time, in milliseconds (planning apart).
    #[diesel(sql_type = diesel::sql_types::Double)]
    pub exec_ms: f64,
    #[diesel(sql_type = BigInt)]
    pub rows: i64,
}

/// The benchmark's connection to the service's database.
pub struct Probe {
    conn: Mutex<AsyncPgConnection>,
    /// Statements this probe has run (each one is a single statement).
    issued: AtomicU64,
    has_statements: bool,
    citus: bool,
}

#[derive(QueryableByName)]
struct Row {
    #[diesel(sql_type = Nullable<BigInt>)]
    statements: Option<i64>,
    #[diesel(sql_type = BigInt)]
    wal_bytes: i64,
    #[diesel(sql_type = Nullable<BigInt>)]
    single_shard: Option<i64>,
    #[diesel(sql_type = Nullable<BigInt>)]
    multi_shard: Option<i64>,
    #[diesel(sql_type = BigInt)]
    payments: i64,
    #[diesel(sql_type = BigInt)]
    refunds: i64,
}

#[derive(QueryableByName)]
struct Count {
    #[diesel(sql_type = BigInt)]
    count: i64,
}

#[derive(QueryableByName)]
struct Version {
    #[diesel(sql_type = Text)]
    server_version: String,
}

impl Probe {
    /// Connects, and makes `pg_stat_statements` available in the database if the server preloads
    /// it (without it, statement counts are left out).
    pub async fn connect(database_url: &str) -> anyhow::Result<Probe> {
        let mut conn = AsyncPgConnection::establish(database_url).await?;
        conn.batch_execute("SET application_name = 'payments bench'").await?;
        let has_statements = conn.batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").await.is_ok()
            && diesel::sql_query("SELECT count(*) AS count FROM pg_stat_statements")
                .get_result::<Count>(&mut conn)
                .await
                .is_ok();
        if !has_statements {
            tracing::warn!("pg_stat_statements is not available: statements per request are left out");
        }
        let citus = diesel::sql_query("SELECT count(*) AS count FROM pg_extension WHERE extname = 'citus'")
            .get_result::<Count>(&mut conn)
            .await?
            .count
            > 0;
        Ok(Probe { conn: Mutex::new(conn), issued: AtomicU64::new(0), has_statements, citus })
    }

    /// Gathers the tables' statistics, as autovacuum does within a new deployment's first minute
    /// or so. Until then the planner knows the tables only as empty, and may plan a look-up by a
    /// unique key with any index that shares its first column (`account_id`): a plan that reads
    /// every row of the account, and that each connection keeps until the statistics change.
    pub async fn analyze(&self) -> anyhow::Result<()> {
        let mut conn = self.conn.lock().await;
        let analyzed = conn.batch_execute("ANALYZE").await;
        self.issued.fetch_add(1, Ordering::Relaxed);
        Ok(analyzed?)
    }

    /// PostgreSQL's version, as the server reports it.
    pub async fn server_version(&self) -> anyhow::Result<String> {
        let mut conn = self.conn.lock().await;
        let sql = "SELECT current_setting('server_version') AS server_version";
        let version = diesel::sql_query(sql).get_result::<Version>(&mut *conn).await;
        self.issued.fetch_add(1, Ordering::Relaxed);
        Ok(version?.server_version)
    }

    /// The counters now.
    pub async fn counters(&self) -> anyhow::Result<Counters> {
        let statements = match self.has_statements {
            // Statements in this database only; the server records a statement when it ends, so
            // this one is not in its own sum, and every earlier one of ours is.
            true => {
                "(SELECT sum(calls) FROM pg_stat_statements \
                   WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()))::bigint"
            }
            false => "NULL::bigint",
        };
        let executions = match self.citus {
            true => {
                "(SELECT query_execution_single_shard FROM citus_stat_counters WHERE name = current_database()) \
                     AS single_shard, \
                 (SELECT query_execution_multi_shard FROM citus_stat_counters WHERE name = current_database()) \
                     AS multi_shard"
            }
            false => "NULL::bigint AS single_shard, NULL::bigint AS multi_shard",
        };
        let sql = format!(
            "SELECT {statements} AS statements, {executions}, \
                    pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint AS wal_bytes, \
                    (SELECT count(*) FROM payments) AS payments, \
                    (SELECT count(*) FROM refunds) AS refunds"
        );
        let mut conn = self.conn.lock().await;
        let ours = self.issued.fetch_add(1, Ordering::Relaxed);
        let row = diesel::sql_query(sql).get_result::<Row>(&mut *conn).await?;
        Ok(Counters {
            statements: row.statements.map(|all| (all as u64).saturating_sub(ours)),
            wal_bytes: row.wal_bytes as u64,
            single_shard: row.single_shard.map(|n| n as u64),
            multi_shard: row.multi_shard.map(|n| n as u64),
            payments: row.payments as u64,
            refunds: row.refunds as u64,
        })
    }

    /// Every statement's totals in this database so far (none without `pg_stat_statements`): the
    /// difference of two readings is what ran between them, statement by statement.
    pub async fn statement_totals(&self) -> anyhow::Result<Vec<StatementTotals>> {
        if !self.has_statements {
            return Ok(Vec::new());
        }
        let mut conn = self.conn.lock().await;
        let sql = "SELECT queryid, query, calls, total_exec_time AS exec_ms, rows FROM pg_stat_statements \
                   WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND queryid IS NOT NULL";
        let totals = diesel::sql_query(sql).load::<StatementTotals>(&mut *conn).await;
        self.issued.fetch_add(1, Ordering::Relaxed);
        Ok(totals?)
    }

    /// Whether every staged event has been fanned out and delivered (dead letters aside): cheaper
    /// than counting, as it stops at the first row.
    pub async fn outbox_is_empty(&self) -> anyhow::Result<bool> {
        let mut conn = self.conn.lock().await;
        let sql = "SELECT count(*) AS count FROM (
                       (SELECT 1 FROM events WHERE fanned_out_at IS NULL LIMIT 1)
                       UNION ALL (SELECT 1 FROM staged_jobs WHERE dead_at IS NULL LIMIT 1)
                   ) AS due";
        let count = diesel::sql_query(sql).get_result::<Count>(&mut *conn).await;
        self.issued.fetch_add(1, Ordering::Relaxed);
        Ok(count?.count == 0)
    }

    /// Events staged and not yet delivered (dead letters aside): waiting for the fan-out, or in
    /// the sink's queue.
    pub async fn outbox_backlog(&self) -> anyhow::Result<u64> {
        let mut conn = self.conn.lock().await;
        let sql = "SELECT (SELECT count(*) FROM events WHERE fanned_out_at IS NULL)
                        + (SELECT count(*) FROM staged_jobs WHERE dead_at IS NULL) AS count";
        let count = diesel::sql_query(sql).get_result::<Count>(&mut *conn).await;
        self.issued.fetch_add(1, Ordering::Relaxed);
        Ok(count?.count as u64)
    }
}

/// Waits for the outbox to empty, and says how long that took; `None` if it did not within
/// [`DRAIN_TIMEOUT`], or there is no database to look at.
pub async fn drain(probe: Option<&Probe>) -> anyhow::Result<Option<Duration>> {
    let Some(probe) = probe else { return Ok(None) };
    let start = Instant::now();
    while start.elapsed() < DRAIN_TIMEOUT {
        if probe.outbox_is_empty().await? {
            return Ok(Some(start.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(None)
}
