//! `payments attention list|retry`: the operator's side of keys the completer gave up on.

use anyhow::Context;
use diesel::sql_types::{Nullable, Text, Uuid as SqlUuid};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use payments_service::config::DatabaseArgs;
use payments_service::db::wake::Wake;
use payments_service::endpoints;
use payments_service::gateway::recordable_identity;
use payments_service::idempotency::{account_needing_attention, needing_attention, retry_needing_attention};
use payments_service::postgres::embedded::Sharing;
use uuid::Uuid;

use super::open_database;

/// Prints the keys that need attention, oldest first.
pub async fn list(database: DatabaseArgs) -> anyhow::Result<()> {
    let (url, embedded) = open_database(&database, Sharing::JoinRunning).await?;
    let keys = needing_attention(&mut AsyncPgConnection::establish(&url).await?, &endpoints::all()).await?;
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
    let done = hand_back(&mut conn, key_id, gateway).await;
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

/// Hands the key row `key_id` back to the workers, recording `gateway` first if given. The key's
/// account is read first, without a lock; then every statement names it, so that on Citus each
/// locks and writes on the account's shard alone (a row lock is refused in a statement that spans
/// shards).
async fn hand_back(conn: &mut AsyncPgConnection, key_id: Uuid, gateway: Option<&str>) -> anyhow::Result<()> {
    let account_id = account_needing_attention(conn, key_id).await?;
    let account_id = account_id.with_context(|| format!("no key {key_id} needs attention"))?;
    // Both or neither: a gateway recorded for a key left on the list would be a correction no
    // worker acts on. The completer is woken when it commits.
    conn.transaction::<_, anyhow::Error, _>(async |conn| {
        if let Some(gateway) = gateway {
            anyhow::ensure!(
                record_gateway(conn, account_id, key_id, gateway).await?,
                "no key {key_id} needs attention, unfinished and not being driven, with a pending payment, refund, \
                 capture or cancel"
            );
        }
        anyhow::ensure!(retry_needing_attention(conn, account_id, key_id).await?, "no key {key_id} needs attention");
        conn.batch_execute(&format!("NOTIFY {}", Wake::Completer.channel())).await?;
        Ok(())
    })
    .await
}

/// Records `gateway` as the one that holds what the key row `key_id` made: its pending payment;
/// or its pending refund, or its pending capture or cancel, and, with either, that one's payment
/// (whose next refunds and changes are then asked there too), each with an operator's audit
/// record. Only for a key that needs attention, is not finished and that nobody drives (its row
/// is locked first, so no phase commits meanwhile); whether it recorded anything. Its rows are
/// locked one statement at a time: Citus 13 fails a statement that locks the rows of two of its
/// parts and then writes (it reads one part's result in the wrong format: `invalid input syntax
/// for type uuid: "PGCOPY"`).
async fn record_gateway(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    key_id: Uuid,
    gateway: &str,
) -> diesel::QueryResult<bool> {
    let key = diesel::sql_query(
        "SELECT id FROM idempotency_keys
         WHERE account_id = $1 AND id = $2 AND needs_attention_at IS NOT NULL AND recovery_point <> 'finished'
           AND (locked_until IS NULL OR locked_until < now())
         FOR UPDATE",
    );
    if key.bind::<SqlUuid, _>(account_id).bind::<SqlUuid, _>(key_id).execute(conn).await? == 0 {
        return Ok(false);
    }
    let refund = pending_made_by(conn, Resource::Refund, account_id, key_id).await?;
    let change = pending_made_by(conn, Resource::PaymentChange, account_id, key_id).await?;
    let payment = diesel::sql_query(
        "SELECT id, NULL::uuid AS payment_id, gateway FROM payments
         WHERE account_id = $1 AND (idempotency_key_id = $2 AND status = 'pending' OR id = $3)
         FOR UPDATE",
    );
    let payment: Option<Held> = payment
        .bind::<SqlUuid, _>(account_id)
        .bind::<SqlUuid, _>(key_id)
        .bind::<Nullable<SqlUuid>, _>(refund.as_ref().or(change.as_ref()).and_then(|made| made.payment_id))
        .get_result(conn)
        .await
        .optional()?;
    let held = [(&refund, Resource::Refund), (&change, Resource::PaymentChange), (&payment, Resource::Payment)];
    for (row, resource) in held {
        if let Some(row) = row {
            record_gateway_on(conn, resource, account_id, row, gateway).await?;
        }
    }
    Ok(refund.is_some() || change.is_some() || payment.is_some())
}

/// What [`record_gateway`] records a gateway on: the table, and the name its audit records use.
#[derive(Clone, Copy)]
enum Resource {
    Refund,
    PaymentChange,
    Payment,
}

impl Resource {
    /// Its table, and its name in audit records.
    fn names(self) -> (&'static str, &'static str) {
        match self {
            Resource::Refund => ("refunds", "refund"),
            Resource::PaymentChange => ("payment_changes", "payment_change"),
            Resource::Payment => ("payments", "payment"),
        }
    }
}

/// The pending refund or change (a `resource`) the key row `key_id` made, locked.
async fn pending_made_by(
    conn: &mut AsyncPgConnection,
    resource: Resource,
    account_id: Uuid,
    key_id: Uuid,
) -> diesel::QueryResult<Option<Held>> {
    let (table, _) = resource.names();
    let sql = format!(
        "SELECT id, payment_id, gateway FROM {table}
         WHERE account_id = $1 AND idempotency_key_id = $2 AND status = 'pending'
         FOR UPDATE"
    );
    diesel::sql_query(sql).bind::<SqlUuid, _>(account_id).bind::<SqlUuid, _>(key_id).get_result(conn).await.optional()
}

/// Records `gateway` on the `resource` row `row` holds, with an operator's audit record that says
/// what it was.
async fn record_gateway_on(
    conn: &mut AsyncPgConnection,
    resource: Resource,
    account_id: Uuid,
    row: &Held,
    gateway: &str,
) -> diesel::QueryResult<()> {
    let (table, name) = resource.names();
    let sql = format!(
        "WITH moved AS (
             UPDATE {table} SET gateway = $3, updated_at = now() WHERE account_id = $1 AND id = $2
             RETURNING account_id, id
         )
         INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data)
         SELECT account_id, '{name}.gateway_changed', '{name}', id, 'operator',
                jsonb_build_object('from', $4::text, 'to', $3::text)
         FROM moved"
    );
    diesel::sql_query(sql)
        .bind::<SqlUuid, _>(account_id)
        .bind::<SqlUuid, _>(row.id)
        .bind::<Text, _>(gateway)
        .bind::<Nullable<Text>, _>(&row.gateway)
        .execute(conn)
        .await?;
    Ok(())
}

/// A row [`record_gateway`] holds: its id, the payment of a refund or a change, and the gateway
/// it records.
#[derive(QueryableByName)]
struct Held {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
    #[diesel(sql_type = Nullable<SqlUuid>)]
    payment_id: Option<Uuid>,
    #[diesel(sql_type = Nullable<Text>)]
    gateway: Option<String>,
}
