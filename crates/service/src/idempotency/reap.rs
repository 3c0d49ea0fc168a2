//! The end of a key's life.

use std::time::Duration;

use diesel::sql_types::BigInt;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::db::{self, StoreError};

/// Deletes finished keys whose expiry has come, with an audit record for each, in one statement;
/// returns how many. A key's expiry is the one its finishing statement recorded (`expires_at`),
/// whatever the reaper's own retention: up to `batch` of those, soonest expired first. Keys
/// finished before expiries were recorded have none, and expire `retention` (the reaper's own)
/// after they finished, as before: up to `batch` of those too.
///
/// One partial index on `(expires_at, finished_at)` of finished keys serves both scans: a range
/// of its leading column, and its null `expires_at` entries by `finished_at` (which are none once
/// the keys finished before the upgrade are gone). `SKIP LOCKED` lets reapers run side by side. A
/// payment outlives its key, and keeps the key's id (for the key's story). A finished key flagged
/// for a person (a gateway event disagreed with it) is kept until the flag is cleared.
pub async fn reap_finished(conn: &mut AsyncPgConnection, retention: Duration, batch: i64) -> Result<usize, StoreError> {
    let retention_secs = i64::try_from(retention.as_secs()).unwrap_or(i64::MAX);
    db::query(
        diesel::sql_query(
            "WITH expired AS (
             SELECT account_id, id FROM idempotency_keys
             WHERE finished_at IS NOT NULL AND expires_at <= now() AND needs_attention_at IS NULL
             ORDER BY expires_at
             LIMIT $2
             FOR UPDATE SKIP LOCKED
         ), expired_unrecorded AS (
             SELECT account_id, id FROM idempotency_keys
             WHERE finished_at IS NOT NULL AND expires_at IS NULL AND needs_attention_at IS NULL
               AND finished_at < now() - $1 * interval '1 second'
             LIMIT $2
             FOR UPDATE SKIP LOCKED
         ), reaped AS (
             DELETE FROM idempotency_keys k
             USING (SELECT * FROM expired UNION ALL SELECT * FROM expired_unrecorded) old
             WHERE k.account_id = old.account_id AND k.id = old.id
             RETURNING k.account_id, k.id, k.idempotency_key, k.response_status
         )
         INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data)
         SELECT account_id, 'idempotency_key.reaped', 'idempotency_key', id, 'reaper',
                jsonb_build_object('idempotency_key', idempotency_key, 'response_status', response_status)
         FROM reaped",
        )
        .bind::<BigInt, _>(retention_secs)
        .bind::<BigInt, _>(batch)
        .execute(conn),
    )
    .await
}
