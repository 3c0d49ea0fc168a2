//! The key row's life: claimed, moved from phase to phase under a fenced lock, finished, released.

use std::time::Duration;

use diesel::pg::Pg;
use diesel::prelude::*;
use diesel::query_builder::{AstPass, Query, QueryFragment, QueryId};
use diesel::sql_types::{BigInt, Bool, Bytea, Jsonb, Nullable, SmallInt, Text, Untyped, Uuid as SqlUuid};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::{Fingerprint, IdempotencyKey, RecoveryPoint};
use crate::audit::Actor;
use crate::db::schema::idempotency_keys;
use crate::db::{self, Prepare, StoreError};

/// A request about to claim its key.
pub struct NewKey<'a> {
    pub account_id: Uuid,
    pub key: &'a IdempotencyKey,
    pub method: &'a str,
    pub path: &'a str,
    pub fingerprint: Fingerprint,
    /// The validated request, stored so that a worker can re-drive it without its client.
    pub params: &'a serde_json::Value,
}

/// What the claim found, in the order the protocol checks it.
#[derive(Debug)]
pub enum Claim {
    /// The key was used with another request body, method or path (422).
    Mismatch,
    /// The key's request finished: replay its stored response.
    Replay(StoredResponse),
    /// Another request holds the key and its lock is not stale (409).
    InFlight,
    /// We hold the key: a new one, an unlocked one, or one whose lock was stale.
    Acquired(KeyLock),
}

/// A final response, stored with its key and replayed byte for byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub body: Vec<u8>,
}

/// Proof that this request holds a key, and the token that fences every write it makes.
#[derive(Debug, Clone)]
pub struct KeyLock {
    pub account_id: Uuid,
    pub key_id: Uuid,
    token: Uuid,
    recovery_point: RecoveryPoint,
    resumed: bool,
}

/// How a phase leaves the key row, applied in the phase's own transaction.
#[derive(Debug, Clone)]
pub enum Transition {
    /// Same recovery point; the lease is renewed (a phase that is safe to re-run).
    Stay,
    /// On to the next recovery point.
    Advance(RecoveryPoint),
    /// Done: store the response, release the lock.
    Finish(StoredResponse),
}

/// Claims `new.key` in one statement, which is race-free without any check-then-insert:
/// - `existing` reads the key's row, if any (one unique-index probe);
/// - `inserted` creates the row, locked by us, when there was none. If a concurrent request
///   inserted it first, `ON CONFLICT DO NOTHING` leaves us with no row at all and we run the
///   statement again, which then sees that request's row;
/// - `taken` locks an existing row for us if it is the same request, unfinished, and unlocked or
///   stale. Its conditions are re-checked on the row's latest version under the row lock, so of
///   two requests racing for a stale lock exactly one takes it;
/// - a replay never writes: a finished key skips `taken` altogether.
pub async fn claim(
    conn: &mut AsyncPgConnection,
    new: &NewKey<'_>,
    lock_timeout: Duration,
) -> Result<Claim, StoreError> {
    let token = Uuid::new_v4();
    let query = ClaimQuery { new, key_id: Uuid::now_v7(), token, lock_timeout_ms: millis(lock_timeout) };
    // One retry covers the one race (both inserting a new key); two more are a safety margin.
    for _ in 0..3 {
        let Some(row) = db::query(async { query.get_result::<ClaimRow>(conn).await.optional() }).await? else {
            continue;
        };
        return Ok(match row {
            ClaimRow { claimed: true, id, recovery_point, fresh, .. } => {
                Claim::Acquired(KeyLock::new(new.account_id, id, token, recovery_point, !fresh))
            }
            ClaimRow { same_request: false, .. } => Claim::Mismatch,
            ClaimRow { response_status: Some(status), response_body: Some(body), .. } => {
                Claim::Replay(StoredResponse { status: status as u16, body })
            }
            ClaimRow { .. } => Claim::InFlight,
        });
    }
    Err(StoreError::Unavailable("the key claim kept racing with concurrent inserts".into()))
}

impl KeyLock {
    pub(super) fn new(
        account_id: Uuid,
        key_id: Uuid,
        token: Uuid,
        recovery_point: RecoveryPoint,
        resumed: bool,
    ) -> Self {
        KeyLock { account_id, key_id, token, recovery_point, resumed }
    }

    /// Whether an earlier run drove this key before (a retry, or a worker taking it over), so
    /// that the gateway may have charged for it already.
    pub fn resumed(&self) -> bool {
        self.resumed
    }

    /// The recovery point this request resumes at, or has reached.
    pub fn recovery_point(&self) -> RecoveryPoint {
        self.recovery_point
    }

    /// Applies a phase's transition to the key row, fenced by our token. Returns false when the
    /// token no longer matches: the lock went stale and another request took the key over, and
    /// the caller must roll back everything the phase wrote.
    pub(super) async fn apply(
        &self,
        conn: &mut AsyncPgConnection,
        transition: &Transition,
    ) -> Result<bool, diesel::result::Error> {
        use idempotency_keys::dsl as k;
        let ours = idempotency_keys::table
            .filter(k::account_id.eq(self.account_id))
            .filter(k::id.eq(self.key_id))
            .filter(k::lock_token.eq(self.token));
        let now = diesel::dsl::now.into_sql::<diesel::sql_types::Timestamptz>().nullable();
        let updated = match transition {
            Transition::Stay => diesel::update(ours).set(k::locked_at.eq(now)).prepared().execute(conn).await?,
            Transition::Advance(point) => {
                let changes = (k::recovery_point.eq(point), k::locked_at.eq(now));
                diesel::update(ours).set(changes).prepared().execute(conn).await?
            }
            Transition::Finish(response) => {
                let changes = (
                    k::recovery_point.eq(RecoveryPoint::Finished),
                    k::finished_at.eq(now),
                    k::response_status.eq(response.status as i16),
                    k::response_body.eq(&response.body),
                    k::locked_at.eq(None::<chrono::DateTime<chrono::Utc>>),
                    k::lock_token.eq(None::<Uuid>),
                    // A key a worker gave up on may still be finished by its client's retry.
                    k::needs_attention_at.eq(None::<chrono::DateTime<chrono::Utc>>),
                    k::attention_reason.eq(None::<String>),
                );
                diesel::update(ours).set(changes).prepared().execute(conn).await?
            }
        };
        Ok(updated == 1)
    }

    pub(super) fn advance_to(&mut self, transition: &Transition) {
        match transition {
            Transition::Stay => {}
            Transition::Advance(point) => self.recovery_point = *point,
            Transition::Finish(_) => self.recovery_point = RecoveryPoint::Finished,
        }
    }

    /// Unlocks the key at its current recovery point, so that a retry can resume at once, and
    /// records who gave it up and why, in one statement. The key's last run ends now, so a
    /// worker's backoff counts from here. Fenced: it does nothing if another request has taken the
    /// key over meanwhile.
    pub async fn release(&self, conn: &mut AsyncPgConnection, actor: Actor, reason: &str) -> Result<(), StoreError> {
        let release = diesel::sql_query(
            "WITH released AS (
                 UPDATE idempotency_keys SET locked_at = NULL, lock_token = NULL, last_run_at = now()
                 WHERE account_id = $1 AND id = $2 AND lock_token = $3
                 RETURNING account_id, id, recovery_point
             )
             INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data)
             SELECT account_id, 'idempotency_key.released', 'idempotency_key', id, $4,
                    jsonb_build_object('recovery_point', recovery_point, 'reason', $5::text)
             FROM released",
        )
        .bind::<SqlUuid, _>(self.account_id)
        .bind::<SqlUuid, _>(self.key_id)
        .bind::<SqlUuid, _>(self.token)
        .bind::<Text, _>(actor.as_str())
        .bind::<Text, _>(reason.chars().take(1000).collect::<String>());
        db::query(release.execute(conn)).await?;
        Ok(())
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// The columns the claim returns: enough to classify, never the stored params.
#[derive(QueryableByName)]
struct ClaimRow {
    #[diesel(sql_type = Bool)]
    claimed: bool,
    /// Claimed by inserting it: no earlier run can have reached the gateway.
    #[diesel(sql_type = Bool)]
    fresh: bool,
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
    #[diesel(sql_type = Bool)]
    same_request: bool,
    #[diesel(sql_type = Text)]
    recovery_point: RecoveryPoint,
    #[diesel(sql_type = Nullable<SmallInt>)]
    response_status: Option<i16>,
    #[diesel(sql_type = Nullable<Bytea>)]
    response_body: Option<Vec<u8>>,
}

/// The claim statement. A type of its own (rather than `sql_query`) so that diesel prepares it
/// once per connection: its SQL never changes, and its static query id says so.
#[derive(Clone, Copy)]
struct ClaimQuery<'a> {
    new: &'a NewKey<'a>,
    key_id: Uuid,
    token: Uuid,
    lock_timeout_ms: i64,
}

/// Everything after the parameters, which are bound once, by name, in the `input` row.
const CLAIM_SQL: &str = "
), existing AS (
    SELECT k.* FROM idempotency_keys k, input i
    WHERE k.account_id = i.account_id AND k.idempotency_key = i.idempotency_key
), inserted AS (
    INSERT INTO idempotency_keys (id, account_id, idempotency_key, request_method, request_path,
                                  request_fingerprint, request_params, locked_at, lock_token)
    SELECT i.key_id, i.account_id, i.idempotency_key, i.method, i.path,
           i.fingerprint, i.params, now(), i.token
    FROM input i
    WHERE NOT EXISTS (SELECT FROM existing)
    ON CONFLICT (account_id, idempotency_key) DO NOTHING
    RETURNING *
), taken AS (
    UPDATE idempotency_keys k
    SET locked_at = now(), lock_token = i.token, last_run_at = now()
    FROM input i
    WHERE EXISTS (SELECT FROM existing WHERE recovery_point <> 'finished')
      AND k.account_id = i.account_id AND k.idempotency_key = i.idempotency_key
      AND k.request_fingerprint = i.fingerprint
      AND k.request_method = i.method AND k.request_path = i.path
      AND k.recovery_point <> 'finished'
      AND (k.locked_at IS NULL OR k.locked_at < now() - i.lock_timeout_ms * interval '1 millisecond')
    RETURNING k.*
)
SELECT true AS claimed, true AS fresh, id, true AS same_request, recovery_point, response_status, response_body
FROM inserted
UNION ALL
SELECT true, false, id, true, recovery_point, response_status, response_body
FROM taken
UNION ALL
SELECT false, false, e.id,
       e.request_fingerprint = i.fingerprint AND e.request_method = i.method AND e.request_path = i.path,
       e.recovery_point, e.response_status, e.response_body
FROM existing e, input i
WHERE NOT EXISTS (SELECT FROM taken)";

impl QueryFragment<Pg> for ClaimQuery<'_> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, Pg>) -> QueryResult<()> {
        let new = self.new;
        out.push_sql(
            "WITH input (account_id, idempotency_key, key_id, method, path, fingerprint, params, \
             token, lock_timeout_ms) AS (VALUES (",
        );
        out.push_bind_param::<SqlUuid, _>(&new.account_id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(new.key.as_str())?;
        out.push_sql(", ");
        out.push_bind_param::<SqlUuid, _>(&self.key_id)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(new.method)?;
        out.push_sql(", ");
        out.push_bind_param::<Text, _>(new.path)?;
        out.push_sql(", ");
        out.push_bind_param::<Bytea, _>(new.fingerprint.as_bytes())?;
        out.push_sql(", ");
        out.push_bind_param::<Jsonb, _>(new.params)?;
        out.push_sql(", ");
        out.push_bind_param::<SqlUuid, _>(&self.token)?;
        out.push_sql(", ");
        out.push_bind_param::<BigInt, _>(&self.lock_timeout_ms)?;
        out.push_sql(")");
        out.push_sql(CLAIM_SQL);
        Ok(())
    }
}

impl QueryId for ClaimQuery<'_> {
    type QueryId = ClaimQuery<'static>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl Query for ClaimQuery<'_> {
    type SqlType = Untyped;
}
