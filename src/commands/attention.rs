//! `payments attention list|retry`: the operator's side of keys the completer gave up on.

use anyhow::Context;
use diesel::sql_types::{Text, Uuid as SqlUuid};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use payments_service::config::DatabaseArgs;
use payments_service::db::embedded::Sharing;
use payments_service::db::wake::Wake;
use payments_service::gateway::recordable_identity;
use payments_service::idempotency::{needing_attention, retry_needing_attention};
use uuid::Uuid;

use super::open_database;

/// Prints the keys that need attention, oldest first.
pub async fn list(database: DatabaseArgs) -> anyhow::Result<()> {
    let (url, embedded) = open_database(&database, Sharing::JoinRunning).await?;
    let keys = needing_attention(&mut AsyncPgConnection::establish(&url).await?).await?;
    if keys.is_empty() {
        println!("no key needs attention");
    }
    for key in keys {
        let made = key.made_id.map_or_else(|| "none".to_owned(), |id| id.to_string());
        println!(
            "{} account={} key={:?} at={} attempts={} since={} {} made={}\n    reason: {}",
            key.id,
            key.account_id,
            key.idempotency_key,
            key.recovery_point,
            key.completer_attempts,
            key.needs_attention_at.to_rfc3339(),
            key.request_path,
            made,
            key.attention_reason
        );
    }
    if let Some(embedded) = embedded {
        embedded.stop().await?;
    }
    Ok(())
}

/// Hands a key back to the workers, once its cause is fixed; with `gateway`, first records it as
/// the gateway that holds what the key made (a payment, a refund, a capture or a cancel, whose
/// recorded gateway is gone, or was recorded wrongly).
pub async fn retry(database: DatabaseArgs, key_id: &str, gateway: Option<&str>) -> anyhow::Result<()> {
    let key_id: Uuid = key_id.parse().context("KEY_ID is the key row's id, as `payments attention list` prints it")?;
    if let Some(gateway) = gateway {
        anyhow::ensure!(
            recordable_identity(gateway),
            "--gateway takes a gateway's identity as the reason names it: 1 to 255 visible ASCII characters"
        );
    }
    let (url, embedded) = open_database(&database, Sharing::JoinRunning).await?;
    let mut conn = payments_service::db::establish(&url).await?;
    // Both or neither: a gateway recorded for a key left on the list would be a correction no
    // worker acts on. The completer is woken when it commits.
    let done = conn
        .transaction::<_, anyhow::Error, _>(async |conn| {
            if let Some(gateway) = gateway {
                anyhow::ensure!(
                    record_gateway(conn, key_id, gateway).await?,
                    "no key {key_id} needs attention, unfinished and not being driven, with a pending payment, refund, \
                     capture or cancel"
                );
            }
            anyhow::ensure!(retry_needing_attention(conn, key_id).await?, "no key {key_id} needs attention");
            conn.batch_execute(&format!("NOTIFY {}", Wake::Completer.channel())).await?;
            Ok(())
        })
        .await;
    if let Some(embedded) = embedded {
        embedded.stop().await?;
    }
    done?;
    match gateway {
        Some(gateway) => println!("key {key_id} now records the gateway {gateway}, and is handed back to the workers"),
        None => println!("key {key_id} handed back to the workers"),
    }
    Ok(())
}

/// Records `gateway` as the one that holds what the key row `key_id` made: its pending payment;
/// or its pending refund, or its pending capture or cancel, and, with either, that one's payment
/// (whose next refunds and changes are then asked there too), each with an operator's audit
/// record. Only for a key that needs attention, is not finished and that nobody drives (its row
/// is locked first, so no phase commits meanwhile); whether it recorded anything.
async fn record_gateway(conn: &mut AsyncPgConnection, key_id: Uuid, gateway: &str) -> diesel::QueryResult<bool> {
    let recorded = diesel::sql_query(
        "WITH key AS (
             SELECT account_id, id FROM idempotency_keys
             WHERE id = $1 AND needs_attention_at IS NOT NULL AND recovery_point <> 'finished'
               AND (locked_until IS NULL OR locked_until < now())
             FOR UPDATE
         ), refund AS (
             SELECT r.account_id, r.id, r.payment_id, r.gateway FROM refunds r, key
             WHERE r.account_id = key.account_id AND r.idempotency_key_id = key.id AND r.status = 'pending'
             FOR UPDATE OF r
         ), change AS (
             SELECT c.account_id, c.id, c.payment_id, c.gateway FROM payment_changes c, key
             WHERE c.account_id = key.account_id AND c.idempotency_key_id = key.id AND c.status = 'pending'
             FOR UPDATE OF c
         ), payment AS (
             SELECT p.account_id, p.id, p.gateway FROM payments p, key
             WHERE p.account_id = key.account_id
               AND (p.idempotency_key_id = key.id AND p.status = 'pending'
                    OR p.id IN (SELECT payment_id FROM refund UNION ALL SELECT payment_id FROM change))
             FOR UPDATE OF p
         ), moved_refund AS (
             UPDATE refunds r SET gateway = $2, updated_at = now() FROM refund
             WHERE r.account_id = refund.account_id AND r.id = refund.id
             RETURNING r.account_id, r.id
         ), moved_change AS (
             UPDATE payment_changes c SET gateway = $2, updated_at = now() FROM change
             WHERE c.account_id = change.account_id AND c.id = change.id
             RETURNING c.account_id, c.id
         ), moved_payment AS (
             UPDATE payments p SET gateway = $2, updated_at = now() FROM payment
             WHERE p.account_id = payment.account_id AND p.id = payment.id
             RETURNING p.account_id, p.id
         )
         INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data)
         SELECT account_id, 'refund.gateway_changed', 'refund', id, 'operator',
                jsonb_build_object('from', gateway, 'to', $2::text)
         FROM refund WHERE EXISTS (SELECT FROM moved_refund)
         UNION ALL
         SELECT account_id, 'payment_change.gateway_changed', 'payment_change', id, 'operator',
                jsonb_build_object('from', gateway, 'to', $2::text)
         FROM change WHERE EXISTS (SELECT FROM moved_change)
         UNION ALL
         SELECT account_id, 'payment.gateway_changed', 'payment', id, 'operator',
                jsonb_build_object('from', gateway, 'to', $2::text)
         FROM payment WHERE EXISTS (SELECT FROM moved_payment)",
    )
    .bind::<SqlUuid, _>(key_id)
    .bind::<Text, _>(gateway)
    .execute(conn)
    .await?;
    Ok(recorded > 0)
}
