//! A key as it stands now, for the key's story (`GET /v1/idempotency_keys?key=`).

use chrono::{DateTime, Utc};
use diesel::dsl;
use diesel::expression::SqlLiteral;
use diesel::prelude::*;
use diesel::sql_types::Bool;
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::IdempotencyKey;
#[cfg(doc)]
use super::RecoveryPoint;
use crate::db::schema::{idempotency_keys, key_resources};

/// A key row, as its story shows it: never its request's params, its stored body, or the text of
/// the error it was given up on.
#[derive(Debug, Queryable, Selectable)]
#[diesel(table_name = idempotency_keys, check_for_backend(diesel::pg::Pg))]
pub struct KeyRecord {
    pub id: Uuid,
    pub account_id: Uuid,
    /// The endpoint the key is bound to.
    pub request_path: String,
    /// Where the key stands: [`RecoveryPoint::STARTED`], its endpoint's points, or
    /// [`RecoveryPoint::FINISHED`].
    pub recovery_point: String,
    /// When the holder's lease ends; none while nobody holds the key.
    pub locked_until: Option<DateTime<Utc>>,
    /// Whether the lease has not ended yet, by the database's clock: the one that set
    /// `locked_until` and that every claim judges it by.
    #[diesel(select_expression = dsl::sql::<Bool>("coalesce(locked_until > now(), false)"))]
    #[diesel(select_expression_type = SqlLiteral<Bool>)]
    pub locked: bool,
    /// How many times the completer took the key over.
    pub completer_attempts: i32,
    pub needs_attention_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub last_run_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// When the finished key expires, as recorded when it finished (none before that was recorded).
    pub expires_at: Option<DateTime<Utc>>,
    /// The stored answer's HTTP status, once finished.
    pub response_status: Option<i16>,
}

impl KeyRecord {
    /// The account's key row for `key`, if it has one (a key never used, or reaped, has none).
    pub async fn find(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        key: &IdempotencyKey,
    ) -> QueryResult<Option<KeyRecord>> {
        idempotency_keys::table
            .filter(idempotency_keys::account_id.eq(account_id))
            .filter(idempotency_keys::idempotency_key.eq(key.as_str()))
            .select(KeyRecord::as_select())
            .get_result(conn)
            .await
            .optional()
    }

    /// The endpoint the account's `key` was used on, once its row is reaped: as `key_resources`
    /// recorded when it finished; none if it made nothing (a refusal) or was never used.
    pub async fn path_of_reaped(
        conn: &mut AsyncPgConnection,
        account_id: Uuid,
        key: &IdempotencyKey,
    ) -> QueryResult<Option<String>> {
        key_resources::table
            .filter(key_resources::account_id.eq(account_id))
            .filter(key_resources::idempotency_key.eq(key.as_str()))
            .select(key_resources::request_path)
            .get_result(conn)
            .await
            .optional()
    }
}
