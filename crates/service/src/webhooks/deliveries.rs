//! Deliveries: one per event and endpoint that takes it, made by the fan-out once the event's
//! transaction has committed, leased by any number of delivery workers (`SKIP LOCKED`), attempted
//! with no transaction open, and settled attempt by attempt: each attempt a row of the log, and the
//! delivery delivered, due again on the schedule, or failed. Every statement names its account, and
//! a worker takes its work one account at a time, as on Citus a row lock must stay within one
//! shard.

use std::time::Duration;

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Bool, Integer, Nullable, SmallInt, Text, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use crate::db::{self, StoreError};

/// What one fan-out did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FannedOut {
    /// Events handed over.
    pub events: usize,
    /// Deliveries made of them, one per event and endpoint that takes it.
    pub deliveries: usize,
}

#[derive(QueryableByName)]
struct FanOutRow {
    #[diesel(sql_type = BigInt)]
    events: i64,
    #[diesel(sql_type = BigInt)]
    deliveries: i64,
}

/// Hands up to `batch` of the events not yet fanned out, oldest first, to delivery: for each, one
/// delivery to every enabled endpoint of its account whose `enabled_events` take it, and a place in
/// the operator's sink's queue (see [`crate::outbox`]). Account by account: the accounts of the
/// oldest such events, read without locks, then each account's, marked fanned out and handed over
/// in one statement, so that each is handed over once however many workers run. The endpoints it
/// hands them to are locked `FOR SHARE` meanwhile: a delete of one waits for it (and then drops
/// what it made), or has deleted it already (and it is skipped).
pub async fn fan_out(conn: &mut AsyncPgConnection, batch: i64) -> Result<FannedOut, StoreError> {
    let accounts =
        diesel::sql_query("SELECT account_id FROM events WHERE fanned_out_at IS NULL ORDER BY created_at LIMIT $1")
            .bind::<BigInt, _>(batch);
    let mut done = FannedOut::default();
    for account_id in db::accounts_of(db::query(accounts.load(conn)).await?) {
        let left = batch - i64::try_from(done.events).unwrap_or(i64::MAX);
        if left <= 0 {
            break;
        }
        let fan_out = diesel::sql_query(
            "WITH due AS MATERIALIZED (
                 SELECT id FROM events
                 WHERE account_id = $1 AND fanned_out_at IS NULL
                 ORDER BY created_at
                 LIMIT $2
                 FOR UPDATE SKIP LOCKED
             ), fanned AS (
                 UPDATE events e SET fanned_out_at = now()
                 FROM due
                 WHERE e.account_id = $1 AND e.id = due.id
                 RETURNING e.account_id, e.id, e.event_type, e.body
             ), sink AS (
                 INSERT INTO staged_jobs (account_id, job_name, job_args)
                 SELECT account_id, event_type, body FROM fanned
             ), targets AS MATERIALIZED (
                 SELECT id, enabled_events FROM webhook_endpoints
                 WHERE account_id = $1 AND status = 'enabled'
                 FOR SHARE
             ), made AS (
                 INSERT INTO webhook_deliveries (account_id, id, event_id, endpoint_id)
                 SELECT f.account_id, gen_random_uuid(), f.id, w.id
                 FROM fanned f
                 JOIN targets w ON w.enabled_events @> ARRAY['*'] OR f.event_type = ANY (w.enabled_events)
                 RETURNING id
             )
             SELECT (SELECT count(*) FROM fanned) AS events, (SELECT count(*) FROM made) AS deliveries",
        )
        .bind::<SqlUuid, _>(account_id)
        .bind::<BigInt, _>(left);
        let row: FanOutRow = db::query(fan_out.get_result(conn)).await?;
        done.events += row.events as usize;
        done.deliveries += row.deliveries as usize;
    }
    Ok(done)
}

/// A delivery leased for an attempt, with what the attempt sends.
#[derive(Debug, Clone, QueryableByName)]
pub struct LeasedDelivery {
    #[diesel(sql_type = SqlUuid)]
    pub account_id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    pub id: Uuid,
    /// Attempts made, this one included: its number in the log, and the lease's fence.
    #[diesel(sql_type = Integer)]
    pub attempts: i32,
    #[diesel(sql_type = SqlUuid)]
    pub event_id: Uuid,
    #[diesel(sql_type = Text)]
    pub event_type: String,
    /// The event's JSON, exactly as kept: the same bytes on every attempt and to every endpoint.
    #[diesel(sql_type = Text)]
    pub body: String,
    #[diesel(sql_type = SqlUuid)]
    pub endpoint_id: Uuid,
    #[diesel(sql_type = Text)]
    pub url: String,
    #[diesel(sql_type = Text)]
    pub secret: String,
    /// The secret before a rotation, while it still signs.
    #[diesel(sql_type = Nullable<Text>)]
    pub previous_secret: Option<String>,
}

/// A delivery is due once its time has come, unless another worker holds it.
const DUE: &str =
    "d.status = 'pending' AND d.next_attempt_at <= now() AND (d.leased_until IS NULL OR d.leased_until <= now())";

/// Leases up to `batch` of the due deliveries to enabled endpoints, those due longest first, for
/// `lease`: no other worker takes them until it runs out (and then they are due again, as if the
/// attempt had failed with no answer). A delivery to a disabled endpoint stays where it is, and is
/// due again once the endpoint is enabled.
pub async fn lease_due(
    conn: &mut AsyncPgConnection,
    lease: Duration,
    batch: i64,
) -> Result<Vec<LeasedDelivery>, StoreError> {
    // Only deliveries to enabled endpoints: those to a disabled one stay due, and would otherwise
    // fill every batch's accounts with work no worker may do.
    let accounts = diesel::sql_query(format!(
        "SELECT d.account_id FROM webhook_deliveries d
         JOIN webhook_endpoints w ON w.account_id = d.account_id AND w.id = d.endpoint_id AND w.status = 'enabled'
         WHERE {DUE} ORDER BY d.next_attempt_at LIMIT $1"
    ))
    .bind::<BigInt, _>(batch);
    db::bounded(conn.transaction(async |conn| -> Result<Vec<LeasedDelivery>, StoreError> {
        let mut leased: Vec<LeasedDelivery> = Vec::new();
        for account_id in db::accounts_of(accounts.load(conn).await?) {
            let left = batch - i64::try_from(leased.len()).unwrap_or(i64::MAX);
            if left <= 0 {
                break;
            }
            let lease_account = diesel::sql_query(format!(
                "WITH due AS MATERIALIZED (
                     SELECT d.id FROM webhook_deliveries d
                     JOIN webhook_endpoints w ON w.account_id = $3 AND w.id = d.endpoint_id AND w.status = 'enabled'
                     WHERE d.account_id = $3 AND {DUE}
                     ORDER BY d.next_attempt_at
                     LIMIT $2
                     FOR UPDATE OF d SKIP LOCKED
                 ), leased AS (
                     UPDATE webhook_deliveries d
                     SET leased_until = now() + $1 * interval '1 millisecond', attempts = d.attempts + 1
                     FROM due
                     WHERE d.account_id = $3 AND d.id = due.id
                     RETURNING d.account_id, d.id, d.attempts, d.event_id, d.endpoint_id
                 )
                 SELECT l.account_id, l.id, l.attempts, l.event_id, e.event_type, e.body::text AS body, l.endpoint_id,
                        w.url, w.secret,
                        CASE WHEN w.previous_secret_expires_at > now() THEN w.previous_secret END AS previous_secret
                 FROM leased l
                 JOIN events e ON e.account_id = $3 AND e.id = l.event_id
                 JOIN webhook_endpoints w ON w.account_id = $3 AND w.id = l.endpoint_id"
            ))
            .bind::<BigInt, _>(millis(lease))
            .bind::<BigInt, _>(left)
            .bind::<SqlUuid, _>(account_id);
            leased.extend(lease_account.load::<LeasedDelivery>(conn).await?);
        }
        Ok(leased)
    }))
    .await
}

/// How an attempt went, as the log keeps it.
#[derive(Debug, Clone)]
pub struct AttemptRecord<'a> {
    pub status_code: Option<u16>,
    pub error: Option<&'a str>,
    /// The first 4 KiB of the answer, as text.
    pub response_body: String,
    pub duration: Duration,
}

/// What becomes of the delivery after an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Delivered: a 2xx.
    Delivered,
    /// Failed; due again after this long.
    RetryIn(Duration),
    /// Failed for the last time (the schedule ran out).
    Failed,
    /// The endpoint answered `410 Gone`: the delivery failed, and the endpoint is disabled at once.
    Gone,
}

/// The most of an answer the log keeps.
pub const LOGGED_ANSWER: usize = 4096;

/// Records an attempt of `delivery` (the log's row) and what becomes of it, and what it says of the
/// endpoint, in one statement: a success clears the endpoint's failing streak; a failure starts it,
/// or, once it has lasted `disable_after`, disables the endpoint (`failing`); a `410` disables it
/// (`gone`). Only the lease's holder settles it (`attempts` is the fence): a worker whose lease ran
/// out and was taken over writes nothing.
pub async fn settle(
    conn: &mut AsyncPgConnection,
    delivery: &LeasedDelivery,
    record: &AttemptRecord<'_>,
    next: Next,
    disable_after: Duration,
) -> Result<(), StoreError> {
    let (status, retry_in) = match next {
        Next::Delivered => ("delivered", Duration::ZERO),
        Next::RetryIn(after) => ("pending", after),
        Next::Failed | Next::Gone => ("failed", Duration::ZERO),
    };
    let endpoint = match next {
        Next::Delivered => ENDPOINT_DELIVERED,
        Next::Gone => ENDPOINT_GONE,
        Next::RetryIn(_) | Next::Failed => ENDPOINT_FAILED,
    };
    let sql = format!(
        "WITH settled AS (
             UPDATE webhook_deliveries
             SET status = $4, leased_until = NULL,
                 next_attempt_at = CASE WHEN $4 = 'pending' THEN now() + $5 * interval '1 millisecond' END,
                 ended_at = CASE WHEN $4 <> 'pending' THEN now() END
             WHERE account_id = $1 AND id = $2 AND attempts = $3 AND status = 'pending'
             RETURNING account_id, id, endpoint_id, event_id, next_attempt_at
         ), logged AS (
             INSERT INTO webhook_attempts (account_id, delivery_id, endpoint_id, event_id, event_type, attempt,
                                           status_code, error, response_body, duration_ms, next_attempt_at)
             SELECT account_id, id, endpoint_id, event_id, $6, $3, $7, $8, $9, $10, next_attempt_at FROM settled
         ), endpoint AS ({endpoint})
         SELECT count(*) AS settled FROM settled"
    );
    let settle = diesel::sql_query(sql)
        .bind::<SqlUuid, _>(delivery.account_id)
        .bind::<SqlUuid, _>(delivery.id)
        .bind::<Integer, _>(delivery.attempts)
        .bind::<Text, _>(status)
        .bind::<BigInt, _>(millis(retry_in))
        .bind::<Text, _>(&delivery.event_type)
        .bind::<Nullable<SmallInt>, _>(record.status_code.map(|code| code as i16))
        .bind::<Nullable<Text>, _>(record.error.map(|error| error.chars().take(1000).collect::<String>()))
        .bind::<Text, _>(&record.response_body)
        .bind::<Integer, _>(i32::try_from(record.duration.as_millis()).unwrap_or(i32::MAX))
        .bind::<BigInt, _>(i64::try_from(disable_after.as_secs()).unwrap_or(i64::MAX));
    db::query(settle.execute(conn)).await?;
    Ok(())
}

/// A success: the endpoint's failing streak, if any, is over.
const ENDPOINT_DELIVERED: &str = "
    UPDATE webhook_endpoints w SET failing_since = NULL
    FROM settled s
    WHERE w.account_id = $1 AND w.id = s.endpoint_id AND w.failing_since IS NOT NULL";

/// A failure: the streak starts, or, past `$11` seconds, disables the endpoint, with its record.
const ENDPOINT_FAILED: &str = "
    UPDATE webhook_endpoints w
    SET failing_since = coalesce(w.failing_since, now()),
        status = CASE WHEN w.failing_since <= now() - $11 * interval '1 second' THEN 'disabled' ELSE w.status END,
        disabled_reason = CASE WHEN w.failing_since <= now() - $11 * interval '1 second' THEN 'failing' END,
        updated_at = now()
    FROM settled s
    WHERE w.account_id = $1 AND w.id = s.endpoint_id AND w.status = 'enabled'
      AND (w.failing_since IS NULL OR w.failing_since <= now() - $11 * interval '1 second')
    RETURNING w.account_id, w.id, w.status";

/// `410 Gone`: the endpoint is disabled at once.
const ENDPOINT_GONE: &str = "
    UPDATE webhook_endpoints w
    SET status = 'disabled', disabled_reason = 'gone', failing_since = coalesce(w.failing_since, now()),
        updated_at = now()
    FROM settled s
    WHERE w.account_id = $1 AND w.id = s.endpoint_id AND w.status = 'enabled'
    RETURNING w.account_id, w.id, w.status";

/// Sends again every delivery to the account's endpoint `endpoint_id` that ended `failed` in
/// `[since, until)`: due at once, from the start of the schedule. Returns how many.
pub async fn recover(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    endpoint_id: Uuid,
    since: chrono::DateTime<chrono::Utc>,
    until: Option<chrono::DateTime<chrono::Utc>>,
) -> Result<usize, StoreError> {
    let recover = diesel::sql_query(
        "UPDATE webhook_deliveries
         SET status = 'pending', attempts = 0, next_attempt_at = now(), ended_at = NULL, leased_until = NULL
         WHERE account_id = $1 AND endpoint_id = $2 AND status = 'failed'
           AND ended_at >= $3 AND ($4::timestamptz IS NULL OR ended_at < $4)",
    )
    .bind::<SqlUuid, _>(account_id)
    .bind::<SqlUuid, _>(endpoint_id)
    .bind::<diesel::sql_types::Timestamptz, _>(since)
    .bind::<Nullable<diesel::sql_types::Timestamptz>, _>(until);
    db::query(recover.execute(conn)).await
}

/// Whether any delivery to the account's endpoint `endpoint_id` is leased by a worker now: an
/// attempt to it may be on its way.
pub async fn any_leased(conn: &mut AsyncPgConnection, account_id: Uuid, endpoint_id: Uuid) -> Result<bool, StoreError> {
    #[derive(QueryableByName)]
    struct Leased {
        #[diesel(sql_type = Bool)]
        leased: bool,
    }
    let leased = diesel::sql_query(
        "SELECT EXISTS (SELECT FROM webhook_deliveries
                        WHERE account_id = $1 AND endpoint_id = $2 AND leased_until > now()) AS leased",
    )
    .bind::<SqlUuid, _>(account_id)
    .bind::<SqlUuid, _>(endpoint_id);
    Ok(db::query(leased.get_result::<Leased>(conn)).await?.leased)
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// One attempt, as the log shows it, with where its delivery stands now.
#[derive(Debug, QueryableByName)]
pub struct LoggedAttempt {
    #[diesel(sql_type = BigInt)]
    pub id: i64,
    #[diesel(sql_type = SqlUuid)]
    pub event_id: Uuid,
    #[diesel(sql_type = Text)]
    pub event_type: String,
    #[diesel(sql_type = Integer)]
    pub attempt: i32,
    #[diesel(sql_type = Nullable<SmallInt>)]
    pub status_code: Option<i16>,
    #[diesel(sql_type = Nullable<Text>)]
    pub error: Option<String>,
    #[diesel(sql_type = Text)]
    pub response_body: String,
    #[diesel(sql_type = Integer)]
    pub duration_ms: i32,
    #[diesel(sql_type = diesel::sql_types::Timestamptz)]
    pub attempted_at: chrono::DateTime<chrono::Utc>,
    #[diesel(sql_type = Nullable<diesel::sql_types::Timestamptz>)]
    pub next_attempt_at: Option<chrono::DateTime<chrono::Utc>>,
    #[diesel(sql_type = Nullable<Text>)]
    pub delivery_status: Option<String>,
}

/// The attempts to the account's endpoint `endpoint_id`, newest first, made before the one
/// numbered `before`, one more than `limit` to tell whether more follow.
pub async fn attempts(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    endpoint_id: Uuid,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<LoggedAttempt>, StoreError> {
    let attempts = diesel::sql_query(
        "SELECT a.id, a.event_id, a.event_type, a.attempt, a.status_code, a.error, a.response_body, a.duration_ms,
                a.attempted_at, a.next_attempt_at, d.status AS delivery_status
         FROM webhook_attempts a
         LEFT JOIN webhook_deliveries d ON d.account_id = $1 AND d.id = a.delivery_id
         WHERE a.account_id = $1 AND a.endpoint_id = $2 AND a.id < $3
         ORDER BY a.id DESC
         LIMIT $4",
    )
    .bind::<SqlUuid, _>(account_id)
    .bind::<SqlUuid, _>(endpoint_id)
    .bind::<BigInt, _>(before.unwrap_or(i64::MAX))
    .bind::<BigInt, _>(limit + 1);
    db::query(attempts.load(conn)).await
}
