//! `payments attention list|retry`: the operator's side of keys the completer gave up on.

use anyhow::Context;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use uuid::Uuid;

use super::open_database;
use crate::config::DatabaseArgs;
use crate::db::embedded::Sharing;
use crate::gateway::recordable_identity;
use crate::idempotency::{needing_attention, retry_needing_attention};
use crate::payments::Payment;
use crate::refunds::Refund;

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
/// the gateway that holds what the key made (a recorded one that is gone, or was recorded wrongly).
pub async fn retry(database: DatabaseArgs, key_id: &str, gateway: Option<&str>) -> anyhow::Result<()> {
    let key_id: Uuid = key_id.parse().context("KEY_ID is the key row's id, as `payments attention list` prints it")?;
    if let Some(gateway) = gateway {
        anyhow::ensure!(
            recordable_identity(gateway),
            "--gateway takes a gateway's identity as the reason names it: 1 to 255 visible ASCII characters"
        );
    }
    let (url, embedded) = open_database(&database, Sharing::JoinRunning).await?;
    let mut conn = AsyncPgConnection::establish(&url).await?;
    // Both or neither: a gateway recorded for a key left on the list would be a correction no
    // worker acts on.
    let done = conn
        .transaction::<_, anyhow::Error, _>(async |conn| {
            if let Some(gateway) = gateway {
                let moved = Payment::move_to_gateway(conn, key_id, gateway).await?
                    || Refund::move_to_gateway(conn, key_id, gateway).await?;
                anyhow::ensure!(moved, "no key {key_id} needs attention with a pending payment or refund");
            }
            anyhow::ensure!(retry_needing_attention(conn, key_id).await?, "no key {key_id} needs attention");
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
