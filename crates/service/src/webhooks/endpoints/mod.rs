//! An account's webhook endpoints: where its events go. Made by a keyed `POST` of the layer's
//! other shape ([`Create`]: claimed, written and finished in one transaction), read, changed and
//! deleted by plain requests, each change with its audit record in the same statement.

mod create;
pub mod request;
mod rotate;

use chrono::{DateTime, Utc};
use diesel::prelude::*;
use diesel::sql_types::{Array, Bool, Nullable, Text, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use serde::Serialize;
use uuid::Uuid;

pub use create::{Create, ENDPOINT};
use request::EndpointChanges;
pub use rotate::{ROTATE, RotateSecret};

use crate::db::schema::webhook_endpoints;
use crate::db::{self, StoreError};
use crate::webhooks::deliveries;

/// What an endpoint's id begins with where the API shows it: `we_` and the id's 32 hex digits.
pub const ENDPOINT_ID_PREFIX: &str = "we_";

/// A webhook endpoint, as its row holds it.
#[derive(Debug, Clone, Queryable, Selectable, QueryableByName)]
#[diesel(table_name = webhook_endpoints)]
pub struct WebhookEndpoint {
    pub account_id: Uuid,
    pub id: Uuid,
    pub url: String,
    pub enabled_events: Vec<Option<String>>,
    pub description: Option<String>,
    pub status: String,
    pub disabled_reason: Option<String>,
    pub idempotency_key_id: Uuid,
    pub created_at: DateTime<Utc>,
}

/// An endpoint as the API shows it. Its secret is shown by the answer that made it (and by a
/// rotation's) alone.
#[derive(Debug, Serialize)]
pub struct EndpointView<'a> {
    pub id: String,
    pub object: &'static str,
    pub url: &'a str,
    pub enabled_events: Vec<&'a str>,
    pub description: Option<&'a str>,
    pub status: &'a str,
    pub disabled_reason: Option<&'a str>,
    pub created_at: DateTime<Utc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<&'a str>,
}

impl<'a> From<&'a WebhookEndpoint> for EndpointView<'a> {
    fn from(endpoint: &'a WebhookEndpoint) -> Self {
        EndpointView {
            id: endpoint_id(endpoint.id),
            object: "webhook_endpoint",
            url: &endpoint.url,
            enabled_events: endpoint.enabled_events.iter().flatten().map(String::as_str).collect(),
            description: endpoint.description.as_deref(),
            status: &endpoint.status,
            disabled_reason: endpoint.disabled_reason.as_deref(),
            created_at: endpoint.created_at,
            secret: None,
        }
    }
}

/// A page of endpoints.
#[derive(Debug, Serialize)]
pub struct EndpointList<'a> {
    pub object: &'static str,
    pub data: Vec<EndpointView<'a>>,
    pub has_more: bool,
}

/// How many random bytes a secret is made of: 32, the HMAC-SHA256 key's own size.
const SECRET_BYTES: usize = 32;

/// A new signing secret: `whsec_` and the base64 of [`SECRET_BYTES`] from a CSPRNG.
fn new_secret() -> String {
    let mut bytes = vec![0; SECRET_BYTES];
    // The thread's generator is a CSPRNG, seeded from the operating system's.
    rand::RngCore::fill_bytes(&mut rand::rng(), &mut bytes);
    payments_wire::standard_webhooks::SigningSecret::from_bytes(bytes).expect("32 bytes make a secret").reveal()
}

/// The endpoint id `id` as the API shows it.
pub fn endpoint_id(id: Uuid) -> String {
    format!("{ENDPOINT_ID_PREFIX}{}", id.simple())
}

impl WebhookEndpoint {
    /// The account's endpoint `id`, if it has one.
    pub async fn find(conn: &mut AsyncPgConnection, account_id: Uuid, id: Uuid) -> QueryResult<Option<Self>> {
        webhook_endpoints::table
            .filter(webhook_endpoints::account_id.eq(account_id))
            .filter(webhook_endpoints::id.eq(id))
            .select(WebhookEndpoint::as_select())
            .get_result(conn)
            .await
            .optional()
    }

    /// The endpoint made under a key: by the key's row, or, once that is reaped, by the client's key.
    pub async fn find_by_key(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        key_id: Option<Uuid>,
        key: &str,
    ) -> QueryResult<Option<Self>> {
        let mine = webhook_endpoints::table.filter(webhook_endpoints::account_id.eq(account_id));
        let found = match key_id {
            Some(key_id) => mine.filter(webhook_endpoints::idempotency_key_id.eq(key_id)).into_boxed(),
            None => mine.filter(webhook_endpoints::idempotency_key.eq(key.to_owned())).into_boxed(),
        };
        found.select(WebhookEndpoint::as_select()).get_result(conn).await.optional()
    }

    /// Where the account's endpoint `id` stands in creation order, for paging past it.
    pub async fn position(conn: &mut AsyncPgConnection, account_id: Uuid, id: Uuid) -> QueryResult<Option<i64>> {
        webhook_endpoints::table
            .filter(webhook_endpoints::account_id.eq(account_id))
            .filter(webhook_endpoints::id.eq(id))
            .select(webhook_endpoints::created_seq)
            .get_result(conn)
            .await
            .optional()
    }

    /// The account's endpoints, newest first, made before the one at `before`, one more than
    /// `limit` to tell whether more follow.
    pub async fn list(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        before: Option<i64>,
        limit: i64,
    ) -> QueryResult<Vec<Self>> {
        webhook_endpoints::table
            .filter(webhook_endpoints::account_id.eq(account_id))
            .filter(webhook_endpoints::created_seq.lt(before.unwrap_or(i64::MAX)))
            .order(webhook_endpoints::created_seq.desc())
            .limit(limit + 1)
            .select(WebhookEndpoint::as_select())
            .load(conn)
            .await
    }

    /// Applies `changes` to the account's endpoint `id`, with an audit record naming what was
    /// sent (never a secret), in one statement; the endpoint as it is now, or none if there is no
    /// such endpoint. A status sent clears the reason the service had disabled it for; enabling
    /// it, or a new URL, ends its failing streak, which starts again from its next failure.
    pub async fn update(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        id: Uuid,
        changes: &EndpointChanges,
        request_id: &str,
    ) -> QueryResult<Option<Self>> {
        let events: Option<Vec<&str>> =
            changes.enabled_events.as_ref().map(|events| events.iter().map(String::as_str).collect());
        diesel::sql_query(
            "WITH changed AS (
                 UPDATE webhook_endpoints
                 SET url = coalesce($3, url), enabled_events = coalesce($4, enabled_events),
                     description = CASE WHEN $5 THEN $6 ELSE description END,
                     status = coalesce($7, status),
                     disabled_reason = CASE WHEN $7 IS NULL THEN disabled_reason END,
                     failing_since = CASE WHEN $7 = 'enabled' OR $3 IS NOT NULL THEN NULL ELSE failing_since END,
                     updated_at = now()
                 WHERE account_id = $1 AND id = $2
                 RETURNING *
             ), audited AS (
                 INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data, request_id)
                 SELECT account_id, 'webhook_endpoint.updated', 'webhook_endpoint', id, 'api',
                        jsonb_strip_nulls(jsonb_build_object('url', $3, 'enabled_events', $4, 'status', $7))
                        || CASE WHEN $5 THEN jsonb_build_object('description', $6) ELSE '{}' END,
                        $8
                 FROM changed
             )
             SELECT account_id, id, url, enabled_events, description, status, disabled_reason, idempotency_key_id,
                    created_at
             FROM changed",
        )
        .bind::<SqlUuid, _>(account_id)
        .bind::<SqlUuid, _>(id)
        .bind::<Nullable<Text>, _>(changes.url.as_deref())
        .bind::<Nullable<Array<Text>>, _>(events)
        .bind::<Bool, _>(changes.description.is_some())
        .bind::<Nullable<Text>, _>(changes.description.clone().flatten())
        .bind::<Nullable<Text>, _>(changes.status.map(|status| status.as_str()))
        .bind::<Text, _>(request_id)
        .get_result(conn)
        .await
        .optional()
    }

    /// Deletes the account's endpoint `id`, with its audit record and its deliveries that no worker
    /// holds, in one statement; whether there was one. A delivery a worker holds may be on its way:
    /// see [`WebhookEndpoint::wait_for_attempts`].
    pub async fn delete(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        id: Uuid,
        request_id: &str,
    ) -> QueryResult<bool> {
        let deleted = diesel::sql_query(
            "WITH deleted AS (
                 DELETE FROM webhook_endpoints WHERE account_id = $1 AND id = $2 RETURNING account_id, id, url
             ), dropped AS (
                 DELETE FROM webhook_deliveries
                 WHERE account_id = $1 AND endpoint_id IN (SELECT id FROM deleted)
                   AND (leased_until IS NULL OR leased_until <= now())
             )
             INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data, request_id)
             SELECT account_id, 'webhook_endpoint.deleted', 'webhook_endpoint', id, 'api',
                    jsonb_build_object('url', url), $3
             FROM deleted",
        )
        .bind::<SqlUuid, _>(account_id)
        .bind::<SqlUuid, _>(id)
        .bind::<Text, _>(request_id)
        .execute(conn)
        .await?;
        Ok(deleted == 1)
    }

    /// Waits, once the endpoint `id` is deleted, until no worker holds a delivery to it, then
    /// drops those deliveries too: an attempt begun before the delete has ended (a worker sends
    /// only while its lease outlasts the attempt), and none can begin, since a worker leases
    /// deliveries to existing, enabled endpoints alone. So nothing is sent to the endpoint once
    /// its delete is answered. Every lease ends, so the wait does; a connection is taken for each
    /// look, not held between them.
    pub async fn wait_for_attempts(pool: &db::Pool, account_id: Uuid, id: Uuid) -> Result<(), StoreError> {
        while deliveries::any_leased(&mut *db::connect(pool).await?, account_id, id).await? {
            tokio::time::sleep(ATTEMPT_POLL).await;
        }
        let drop = diesel::sql_query("DELETE FROM webhook_deliveries WHERE account_id = $1 AND endpoint_id = $2")
            .bind::<SqlUuid, _>(account_id)
            .bind::<SqlUuid, _>(id);
        db::query(drop.execute(&mut *db::connect(pool).await?)).await?;
        Ok(())
    }
}

/// How often a delete looks again for attempts still on their way.
const ATTEMPT_POLL: std::time::Duration = std::time::Duration::from_millis(50);
