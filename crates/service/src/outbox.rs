//! The operator's sink (`PAYMENTS_WEBHOOK_URL`): every kept event is handed to it, at least once.
//! The fan-out takes the events not yet handed over (see
//! [`crate::webhooks::deliveries::fan_out`]), once each, after their transactions commit, and
//! queues each for the sink in the same statement. The outbox worker
//! delivers them at least once: it leases a batch of due ones in one statement (so no two workers
//! deliver one at the same time), delivers them with no transaction open, then deletes the
//! delivered ones in one statement, and reschedules a failed one with backoff or, after too many
//! failures, dead-letters it. Each settlement writes its audit records in the same statement. A
//! worker that dies mid-delivery leaves its lease to run out, and the event is delivered again,
//! with the same id.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{Array, BigInt, Integer, Jsonb, Text, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use crate::db::{self, StoreError};

/// An event leased for delivery.
#[derive(Debug, QueryableByName)]
pub struct LeasedEvent {
    #[diesel(sql_type = SqlUuid)]
    pub account_id: Uuid,
    #[diesel(sql_type = BigInt)]
    pub job_id: i64,
    /// The event as delivered: `{"id", "type", "data": {"object": ...}}`.
    #[diesel(sql_type = Jsonb)]
    pub event: serde_json::Value,
    /// Delivery attempts, this one included. Also the lease's fence: only the holder of this
    /// attempt may reschedule or dead-letter the event.
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
}

impl LeasedEvent {
    /// The event's id, which receivers de-duplicate on.
    pub fn id(&self) -> &str {
        self.event["id"].as_str().unwrap_or_default()
    }
}

/// Leases up to `batch` of the events that have been due longest, for `lease`: no other worker
/// sees them until the lease runs out (and then they are due again, as if their delivery had
/// failed).
///
/// The lease is its own column, `leased_until`, which no index covers: taking it changes no
/// indexed column, so it is a HOT update (a new row version on the same page, no index entry),
/// where moving `run_at` would write an entry in each of the outbox's three indexes. An event
/// stays where it was in the due index while leased; the walk passes over those leased by other
/// workers, at most a batch each.
///
/// The lease walks the due index in order, and stops at its `batch`th event: the plan is fixed,
/// not left to the planner. A queue's statistics are out of date by nature (mostly they say the
/// table is empty, as it was when last analyzed), and with them the planner reads every due
/// event, and every delivered one not yet vacuumed away, through a bitmap, for each batch: a
/// backlog then drains in a time that grows with its square (figures in docs/performance.md). An
/// index scan also marks the entries of delivered events dead as it passes them, so the next
/// batch skips them.
pub async fn lease_due_events(
    conn: &mut AsyncPgConnection,
    lease: Duration,
    batch: i64,
) -> Result<Vec<LeasedEvent>, StoreError> {
    let in_index_order = diesel::sql_query(
        "SELECT set_config('enable_seqscan', 'off', true), set_config('enable_bitmapscan', 'off', true)",
    );
    // Account by account, as on Citus a row lock must stay within one account's shard: the
    // accounts of the first due events, read without locks, then each account's due events.
    let accounts =
        diesel::sql_query(format!("SELECT account_id FROM staged_jobs WHERE {DUE} ORDER BY run_at LIMIT $1"))
            .bind::<BigInt, _>(batch);
    // The settings last for the transaction only (`set_config(.., true)` is `SET LOCAL`).
    db::bounded(conn.transaction(async |conn| -> Result<Vec<LeasedEvent>, StoreError> {
        in_index_order.execute(conn).await?;
        let mut leased: Vec<LeasedEvent> = Vec::new();
        for account_id in db::accounts_of(accounts.load(conn).await?) {
            let left = batch - i64::try_from(leased.len()).unwrap_or(i64::MAX);
            if left <= 0 {
                break;
            }
            leased.extend(lease_account(account_id, lease, left).load::<LeasedEvent>(conn).await?);
        }
        Ok(leased)
    }))
    .await
}

/// An outbox event is due once its time has come, unless it is dead or leased.
const DUE: &str = "dead_at IS NULL AND run_at <= now() AND (leased_until IS NULL OR leased_until <= now())";

/// Leases up to `batch` of the account's due events, those due longest first. `due` is
/// materialized: taken once. As a subquery joined to the table, the planner may rescan it for
/// each row of the table, and each rescan locks another batch.
fn lease_account(
    account_id: Uuid,
    lease: Duration,
    batch: i64,
) -> diesel::query_builder::BoxedSqlQuery<'static, diesel::pg::Pg, diesel::query_builder::SqlQuery> {
    diesel::sql_query(format!(
        "WITH due AS MATERIALIZED (
             SELECT account_id, id FROM staged_jobs
             WHERE account_id = $3 AND {DUE}
             ORDER BY run_at
             LIMIT $2
             FOR UPDATE SKIP LOCKED
         )
         UPDATE staged_jobs j
         SET leased_until = now() + $1 * interval '1 millisecond', attempts = j.attempts + 1
         FROM due
         WHERE j.account_id = $3 AND j.id = due.id
         RETURNING j.account_id, j.id AS job_id, j.job_args AS event, j.attempts"
    ))
    .into_boxed()
    .bind::<BigInt, _>(millis(lease))
    .bind::<BigInt, _>(batch)
    .bind::<SqlUuid, _>(account_id)
}

/// Deletes delivered events, each with its audit record, in one statement.
pub async fn settle_delivered(conn: &mut AsyncPgConnection, events: &[&LeasedEvent]) -> Result<(), StoreError> {
    if events.is_empty() {
        return Ok(());
    }
    let settle = diesel::sql_query(
        "WITH settled AS (
             DELETE FROM staged_jobs j
             USING unnest($1::uuid[], $2::bigint[], $3::int[]) AS delivered (account_id, id, attempts)
             WHERE j.account_id = delivered.account_id AND j.id = delivered.id
             RETURNING j.account_id, j.job_args, delivered.attempts
         )
         INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data)
         SELECT account_id, 'event.delivered', 'event', replace(job_args->>'id', 'evt_', '')::uuid, 'outbox',
                jsonb_build_object('type', job_args->>'type', 'attempts', attempts)
         FROM settled",
    )
    .bind::<Array<SqlUuid>, _>(events.iter().map(|event| event.account_id).collect::<Vec<_>>())
    .bind::<Array<BigInt>, _>(events.iter().map(|event| event.job_id).collect::<Vec<_>>())
    .bind::<Array<Integer>, _>(events.iter().map(|event| event.attempts).collect::<Vec<_>>());
    db::query(settle.execute(conn)).await?;
    Ok(())
}

/// How a failed delivery ends.
#[derive(Debug)]
pub enum Settlement<'a> {
    /// Failed; due again after `retry_in`.
    Failed { error: &'a str, retry_in: Duration },
    /// Failed for the last time: kept, dead, for an operator.
    DeadLettered { error: &'a str },
}

/// Records how a failed delivery ended, with its audit record, in one statement.
pub async fn settle_failed(
    conn: &mut AsyncPgConnection,
    event: &LeasedEvent,
    settlement: Settlement<'_>,
) -> Result<(), StoreError> {
    let (change, action, error, retry_in) = match settlement {
        Settlement::Failed { error, retry_in } => (
            "UPDATE staged_jobs SET run_at = now() + $5 * interval '1 millisecond', leased_until = NULL, last_error = $4
             WHERE account_id = $1 AND id = $2 AND attempts = $3",
            "event.delivery_failed",
            error,
            retry_in,
        ),
        Settlement::DeadLettered { error } => (
            "UPDATE staged_jobs SET dead_at = now(), leased_until = NULL, last_error = $4
             WHERE account_id = $1 AND id = $2 AND attempts = $3",
            "event.dead_lettered",
            error,
            Duration::ZERO,
        ),
    };
    // Each statement uses the parameters it needs; the audit record names the event and how it went.
    let sql = format!(
        "WITH settled AS ({change} RETURNING account_id, job_args)
         INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data)
         SELECT account_id, '{action}', 'event', replace(job_args->>'id', 'evt_', '')::uuid, 'outbox',
                jsonb_build_object('type', job_args->>'type', 'attempts', $3::int, 'error', nullif($4::text, ''),
                                   'retry_in_ms', nullif($5::bigint, 0))
         FROM settled"
    );
    let settle = diesel::sql_query(sql)
        .bind::<SqlUuid, _>(event.account_id)
        .bind::<BigInt, _>(event.job_id)
        .bind::<Integer, _>(event.attempts)
        .bind::<Text, _>(error.chars().take(1000).collect::<String>())
        .bind::<BigInt, _>(millis(retry_in));
    db::query(settle.execute(conn)).await?;
    Ok(())
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}
