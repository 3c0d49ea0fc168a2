//! `payments attention list|retry`: the operator's side of keys the completer gave up on.

use anyhow::Context;
use diesel_async::{AsyncConnection, AsyncPgConnection};
use uuid::Uuid;

use super::open_database;
use crate::config::DatabaseArgs;
use crate::db::embedded::Sharing;
use crate::idempotency::{needing_attention, retry_needing_attention};

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

/// Hands a key back to the workers, once its cause is fixed.
pub async fn retry(database: DatabaseArgs, key_id: &str) -> anyhow::Result<()> {
    let key_id: Uuid = key_id.parse().context("KEY_ID is the key row's id, as `payments attention list` prints it")?;
    let (url, embedded) = open_database(&database, Sharing::JoinRunning).await?;
    let retried = retry_needing_attention(&mut AsyncPgConnection::establish(&url).await?, key_id).await?;
    if let Some(embedded) = embedded {
        embedded.stop().await?;
    }
    anyhow::ensure!(retried, "no key {key_id} needs attention");
    println!("key {key_id} handed back to the workers");
    Ok(())
}
