//! Each account's requests by how their key was taken in, tallied in memory and added to
//! `key_request_counts` now and then: per-account figures have no place in Prometheus (a label
//! per account is unbounded), and a replay must not write to the database.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use diesel::sql_types::{Array, BigInt, Uuid as SqlUuid};
use diesel_async::RunQueryDsl;
use tokio::sync::watch;
use uuid::Uuid;

use super::KeyOutcome;
use crate::db::{self, Pool, StoreError};

/// How often a process adds its tallies to the database: what a crash can lose of them.
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(10);

/// Counts per [`KeyOutcome`], in the order of [`KeyOutcome::ALL`], which is the order of the
/// table's columns.
type Counts = [i64; 6];

fn column(outcome: KeyOutcome) -> usize {
    KeyOutcome::ALL.iter().position(|known| *known == outcome).expect("every outcome is in ALL")
}

/// The tallies since the last flush.
#[derive(Debug, Default)]
pub(super) struct Tally(Mutex<HashMap<Uuid, Counts>>);

impl Tally {
    pub(super) fn count(&self, account_id: Uuid, outcome: KeyOutcome) {
        let mut tallies = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        tallies.entry(account_id).or_default()[column(outcome)] += 1;
    }

    /// Adds the tallies to the current hour's rows, in one statement; kept for the next flush if
    /// the database cannot take them now.
    pub(super) async fn flush(&self, pool: &Pool) -> Result<(), StoreError> {
        let taken = std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner));
        if taken.is_empty() {
            return Ok(());
        }
        match write(pool, &taken).await {
            Ok(()) => Ok(()),
            Err(error) => {
                let mut tallies = self.0.lock().unwrap_or_else(PoisonError::into_inner);
                for (account_id, counts) in taken {
                    let kept = tallies.entry(account_id).or_default();
                    kept.iter_mut().zip(counts).for_each(|(kept, count)| *kept += count);
                }
                Err(error)
            }
        }
    }
}

async fn write(pool: &Pool, tallies: &HashMap<Uuid, Counts>) -> Result<(), StoreError> {
    let accounts: Vec<Uuid> = tallies.keys().copied().collect();
    let column = |n: usize| -> Vec<i64> { accounts.iter().map(|account| tallies[account][n]).collect() };
    let add = diesel::sql_query(
        "INSERT INTO key_request_counts AS c
             (account_id, hour, created, resumed, replayed, in_flight, key_reused, expired)
         SELECT account_id, date_trunc('hour', now(), 'UTC'), created, resumed, replayed, in_flight, key_reused, expired
         FROM unnest($1::uuid[], $2::int8[], $3::int8[], $4::int8[], $5::int8[], $6::int8[], $7::int8[])
              AS t (account_id, created, resumed, replayed, in_flight, key_reused, expired)
         -- Every process locks rows in the same order, so that two flushing at once never deadlock.
         ORDER BY account_id
         ON CONFLICT (account_id, hour) DO UPDATE SET
             created = c.created + excluded.created, resumed = c.resumed + excluded.resumed,
             replayed = c.replayed + excluded.replayed, in_flight = c.in_flight + excluded.in_flight,
             key_reused = c.key_reused + excluded.key_reused, expired = c.expired + excluded.expired",
    )
    .bind::<Array<SqlUuid>, _>(&accounts)
    .bind::<Array<BigInt>, _>(column(0))
    .bind::<Array<BigInt>, _>(column(1))
    .bind::<Array<BigInt>, _>(column(2))
    .bind::<Array<BigInt>, _>(column(3))
    .bind::<Array<BigInt>, _>(column(4))
    .bind::<Array<BigInt>, _>(column(5));
    let mut conn = db::connect(pool).await?;
    db::query(add.execute(&mut conn)).await?;
    Ok(())
}

/// Flushes every [`FLUSH_INTERVAL`] until `stop` turns true, and once more then.
pub async fn flush_until_stopped(metrics: &super::Metrics, pool: &Pool, mut stop: watch::Receiver<bool>) {
    loop {
        let stopping = tokio::select! {
            _ = tokio::time::sleep(FLUSH_INTERVAL) => false,
            _ = stop.wait_for(|stop| *stop) => true,
        };
        if let Err(error) = metrics.flush_tally(pool).await {
            tracing::warn!(%error, "could not add the per-account request counts to the database; kept for later");
        }
        if stopping {
            return;
        }
    }
}

/// One account's requests over a span of hours, as `payments stats` shows them.
#[derive(Debug, diesel::QueryableByName)]
pub struct AccountRequests {
    #[diesel(sql_type = SqlUuid)]
    pub account_id: Uuid,
    #[diesel(sql_type = diesel::sql_types::Nullable<diesel::sql_types::Text>)]
    pub name: Option<String>,
    #[diesel(sql_type = BigInt)]
    pub created: i64,
    #[diesel(sql_type = BigInt)]
    pub resumed: i64,
    #[diesel(sql_type = BigInt)]
    pub replayed: i64,
    #[diesel(sql_type = BigInt)]
    pub in_flight: i64,
    #[diesel(sql_type = BigInt)]
    pub key_reused: i64,
    #[diesel(sql_type = BigInt)]
    pub expired: i64,
}

impl AccountRequests {
    pub fn total(&self) -> i64 {
        self.created + self.duplicates()
    }

    /// Requests with a key the account had used before: every one but a new key's.
    pub fn duplicates(&self) -> i64 {
        self.resumed + self.replayed + self.in_flight + self.key_reused + self.expired
    }
}

/// Deletes up to `batch` hourly rows that lie wholly outside `retention` (those `payments stats
/// --hours N` with N the retention in hours no longer reads), oldest first; returns how many.
/// Account by account, as on Citus a row lock must stay within one shard: the accounts with such
/// rows first, read without locks, then each account's, in one statement each. The index on
/// `hour` serves the scan, and `SKIP LOCKED` lets reapers run side by side (and never waits on a
/// flush, which only writes the current hour).
pub async fn reap_request_counts(
    conn: &mut diesel_async::AsyncPgConnection,
    retention: Duration,
    batch: i64,
) -> Result<usize, StoreError> {
    let retention_secs = i64::try_from(retention.as_secs()).unwrap_or(i64::MAX);
    let accounts = diesel::sql_query(
        "SELECT account_id FROM key_request_counts WHERE hour <= now() - $1 * interval '1 second'
         ORDER BY hour LIMIT $2",
    )
    .bind::<BigInt, _>(retention_secs)
    .bind::<BigInt, _>(batch);
    let mut reaped = 0;
    for account_id in db::accounts_of(db::query(accounts.load(conn)).await?) {
        let left = batch - i64::try_from(reaped).unwrap_or(i64::MAX);
        if left <= 0 {
            break;
        }
        reaped += db::query(
            diesel::sql_query(
                "DELETE FROM key_request_counts c
                 USING (SELECT account_id, hour FROM key_request_counts
                        WHERE account_id = $3 AND hour <= now() - $1 * interval '1 second'
                        ORDER BY hour
                        LIMIT $2
                        FOR UPDATE SKIP LOCKED) old
                 WHERE c.account_id = $3 AND c.hour = old.hour",
            )
            .bind::<BigInt, _>(retention_secs)
            .bind::<BigInt, _>(left)
            .bind::<diesel::sql_types::Uuid, _>(account_id)
            .execute(conn),
        )
        .await?;
    }
    Ok(reaped)
}

/// Each account's requests in the last `hours` hours (the current one included), the accounts
/// that repeat themselves most first.
pub async fn per_account(
    conn: &mut diesel_async::AsyncPgConnection,
    hours: i64,
) -> diesel::QueryResult<Vec<AccountRequests>> {
    diesel::sql_query(
        "SELECT c.account_id, a.name,
                sum(created)::int8 AS created, sum(resumed)::int8 AS resumed, sum(replayed)::int8 AS replayed,
                sum(in_flight)::int8 AS in_flight, sum(key_reused)::int8 AS key_reused, sum(expired)::int8 AS expired
         FROM key_request_counts c LEFT JOIN accounts a ON a.id = c.account_id
         WHERE c.hour > now() - $1 * interval '1 hour'
         GROUP BY c.account_id, a.name
         ORDER BY sum(resumed + replayed + in_flight + key_reused + expired)::float8
                  / sum(created + resumed + replayed + in_flight + key_reused + expired) DESC, c.account_id",
    )
    .bind::<BigInt, _>(hours)
    .load(conn)
    .await
}
