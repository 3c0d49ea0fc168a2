//! The end of a key's life.

use std::time::Duration;

use diesel::sql_types::{BigInt, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use crate::db::{self, StoreError};

/// Which finished keys have expired: by the expiry their finishing statement recorded
/// (`expires_at`), or, for keys finished before expiries were recorded, `$1` seconds after they
/// finished. A finished key flagged for a person (a gateway event disagreed with it) is kept until
/// the flag is cleared.
const EXPIRED: &str = "finished_at IS NOT NULL AND needs_attention_at IS NULL
                       AND (expires_at <= now() OR (expires_at IS NULL AND finished_at < now() - $1 * interval '1 second'))";

/// Deletes up to `batch` expired keys (see [`EXPIRED`]), with an audit record for each; returns
/// how many. Account by account, as on Citus a row lock must stay within one shard: the accounts
/// with expired keys first, read without locks, then each account's expired keys, soonest expired
/// first, until `batch` are gone. A payment outlives its key, and keeps the key's id (for the
/// key's story).
pub async fn reap_finished(conn: &mut AsyncPgConnection, retention: Duration, batch: i64) -> Result<usize, StoreError> {
    let retention_secs = i64::try_from(retention.as_secs()).unwrap_or(i64::MAX);
    let accounts = diesel::sql_query(format!("SELECT account_id FROM idempotency_keys WHERE {EXPIRED} LIMIT $2"))
        .bind::<BigInt, _>(retention_secs)
        .bind::<BigInt, _>(batch);
    let mut reaped = 0;
    for account_id in db::accounts_of(db::query(accounts.load(conn)).await?) {
        let left = batch - i64::try_from(reaped).unwrap_or(i64::MAX);
        if left <= 0 {
            break;
        }
        reaped += reap_account(conn, account_id, retention_secs, left).await?;
    }
    Ok(reaped)
}

/// Deletes up to `batch` of the account's expired keys, in one statement, keeping what each made
/// (its `resource_id`) in `key_resources`, where a late retry of the key finds it. One partial
/// index on `(expires_at, finished_at)` of finished keys serves the scan. `SKIP LOCKED` lets
/// reapers run side by side.
async fn reap_account(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    retention_secs: i64,
    batch: i64,
) -> Result<usize, StoreError> {
    db::query(
        diesel::sql_query(format!(
            "WITH expired AS (
                 SELECT account_id, id FROM idempotency_keys
                 WHERE account_id = $3 AND {EXPIRED}
                 ORDER BY expires_at NULLS LAST, finished_at
                 LIMIT $2
                 FOR UPDATE SKIP LOCKED
             ), reaped AS (
                 DELETE FROM idempotency_keys k
                 USING expired old
                 WHERE k.account_id = $3 AND k.id = old.id
                 RETURNING k.account_id, k.id, k.idempotency_key, k.response_status, k.request_method,
                           k.request_path, k.resource_id
             ), kept AS (
                 INSERT INTO key_resources (account_id, idempotency_key, request_method, request_path, resource_id)
                 SELECT account_id, idempotency_key, request_method, request_path, resource_id
                 FROM reaped
                 WHERE resource_id IS NOT NULL
                 ON CONFLICT (account_id, idempotency_key) DO NOTHING
             )
             INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data)
             SELECT account_id, 'idempotency_key.reaped', 'idempotency_key', id, 'reaper',
                    jsonb_build_object('idempotency_key', idempotency_key, 'response_status', response_status)
             FROM reaped"
        ))
        .bind::<BigInt, _>(retention_secs)
        .bind::<BigInt, _>(batch)
        .bind::<SqlUuid, _>(account_id)
        .execute(conn),
    )
    .await
}
