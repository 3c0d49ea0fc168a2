//! The end of a key's life.

use std::time::Duration;

use diesel::sql_types::BigInt;
use diesel_async::{AsyncPgConnection, RunQueryDsl};

use crate::db::{self, StoreError};

/// Deletes up to `batch` keys that finished more than `retention` ago, oldest first, with an
/// audit record for each, in one statement; returns how many. The partial index on finished keys
/// by age serves the scan, and `SKIP LOCKED` lets reapers run side by side. A payment outlives
/// its key, and keeps the key's id (for the key's story).
pub async fn reap_finished(conn: &mut AsyncPgConnection, retention: Duration, batch: i64) -> Result<usize, StoreError> {
    let retention_secs = i64::try_from(retention.as_secs()).unwrap_or(i64::MAX);
    db::query(
        diesel::sql_query(
            "WITH reaped AS (
             DELETE FROM idempotency_keys k
             USING (SELECT account_id, id FROM idempotency_keys
                    WHERE finished_at < now() - $1 * interval '1 second'
                    ORDER BY finished_at
                    LIMIT $2
                    FOR UPDATE SKIP LOCKED) old
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
