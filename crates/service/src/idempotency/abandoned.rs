//! Keys whose requests nobody is driving any more: how a worker takes one over, and how it gives
//! up on one and hands it to an operator.

use std::time::Duration;

use chrono::{DateTime, Utc};
use diesel::sql_types::{BigInt, Integer, Jsonb, Nullable, Text, Timestamptz, Uuid as SqlUuid};
use diesel::{OptionalExtension, QueryableByName};
use diesel_async::{AsyncPgConnection, RunQueryDsl};
use uuid::Uuid;

use super::clock::since_boot;
use super::store::{Endpoint, Lease, Reason, Taken};
use super::{IdempotencyKey, KeyLock, RecoveryPoint};
use crate::db::{self, StoreError};
use crate::request_id::RequestId;

/// However many attempts a key has had, the completer never waits longer than this between two.
const MAX_BACKOFF: Duration = Duration::from_secs(3600);

/// A key a worker took over, with what it needs to drive the request without its client.
#[derive(Debug)]
pub struct Abandoned {
    pub lock: KeyLock,
    pub key: IdempotencyKey,
    /// The endpoint the key was used on: whose phases drive it.
    pub endpoint: &'static Endpoint,
    /// The validated request, as stored by the claim.
    pub params: serde_json::Value,
    /// Worker attempts on this key, this one included.
    pub attempts: u32,
}

#[derive(QueryableByName)]
struct AbandonedRow {
    #[diesel(sql_type = SqlUuid)]
    account_id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
    #[diesel(sql_type = Text)]
    idempotency_key: String,
    #[diesel(sql_type = Text)]
    recovery_point: String,
    #[diesel(sql_type = SqlUuid)]
    lock_token: Uuid,
    #[diesel(sql_type = Text)]
    request_path: String,
    #[diesel(sql_type = Jsonb)]
    request_params: serde_json::Value,
    #[diesel(sql_type = Integer)]
    completer_attempts: i32,
    #[diesel(sql_type = Timestamptz)]
    last_run_before: DateTime<Utc>,
    #[diesel(sql_type = Nullable<Timestamptz>)]
    nudged_before: Option<DateTime<Utc>>,
}

/// Which unfinished keys are due for a worker: unlocked or its lease over (by its owner's own
/// lock timeout, which it wrote on the row), not given up on, and untouched for its backoff
/// (`$2` doubled per earlier attempt, counted from the end of the last run, at most `$3`), or
/// nudged by a gateway event about it since a worker last took it (then at once: the gateway has
/// said what happened, and the look-up will find it).
const DUE: &str = "k.finished_at IS NULL AND k.needs_attention_at IS NULL
                   AND (k.locked_until IS NULL OR k.locked_until < now())
                   AND (k.last_run_at < now() - least($2 * power(2, least(k.completer_attempts, 30)), $3)
                                           * interval '1 millisecond'
                        OR k.nudged_at IS NOT NULL)";

/// The gateway that holds what the key `k` made, as recorded on it: a key makes one row, in its
/// endpoint's table (see [`Endpoint::made_in`]); none if it made nothing yet. `account` names the
/// key's account: on Citus, a statement that locks rows runs only where every table it reads is
/// bound to one account, and a correlation (`k.account_id`) does not bind them.
fn made_at(endpoints: &[&Endpoint], account: &str) -> String {
    let at_gateway: Vec<&Endpoint> = endpoints.iter().copied().filter(|endpoint| endpoint.at_gateway).collect();
    let tables = made_in(&at_gateway);
    let made: Vec<String> = tables
        .iter()
        .map(|table| {
            format!("(SELECT gateway FROM {table} WHERE account_id = {account} AND idempotency_key_id = k.id)")
        })
        .collect();
    format!("coalesce({})", made.join(", "))
}

/// The tables that hold what the keys of `endpoints` make, each once (a capture's and a cancel's
/// share one).
fn made_in(endpoints: &[&Endpoint]) -> Vec<&'static str> {
    let mut tables: Vec<&str> = endpoints.iter().map(|endpoint| endpoint.made_in).collect();
    tables.sort_unstable();
    tables.dedup();
    tables
}

/// Which keys a worker can drive, from the gateway its process reaches (the parameter `gateway`
/// names; none if it does not know which): those past their gateway call, whose last phase needs
/// no gateway, and those made at that gateway (see [`made_at`]), or at none yet. A key made at
/// another gateway waits for a process that reaches it: taken here, its look-up would be answered
/// by a gateway that knows nothing of it, and each such take would spend one of its attempts and
/// add to its backoff.
fn drivable(endpoints: &[&Endpoint], account: &str, gateway: &str) -> String {
    let made_at = made_at(endpoints, account);
    format!("(k.recovery_point <> 'started' OR coalesce({made_at}, {gateway}) IS NOT DISTINCT FROM {gateway})")
}

/// Which unfinished keys nobody has run for `$2` milliseconds: not given up on, unlocked or its
/// lease over, and neither taken by a worker nor retried by a client since.
const UNTAKEN: &str = "k.finished_at IS NULL AND k.needs_attention_at IS NULL
                       AND (k.locked_until IS NULL OR k.locked_until < now())
                       AND k.last_run_at < now() - $2 * interval '1 millisecond'";

/// The due keys whose accounts one run looks at, those that have waited longest.
const KEYS_A_RUN: i64 = 8;

/// How long a key that a worker cannot drive may go untaken before the worker gives up on it for
/// a person (see [`give_up_on_stranded`]). A process that reaches the key's gateway takes it at
/// least every `MAX_BACKOFF` (an hour), its longest wait between two attempts, until it gives up
/// on the key itself: a key untaken for twice that has no such process running.
pub const STRANDED_AFTER: Duration = Duration::from_secs(2 * MAX_BACKOFF.as_secs());

/// Takes over the due key (see [`DUE`]) that has waited longest among those a worker whose
/// process reaches `gateway` can drive (see [`drivable`]), if there is one, leasing it for
/// `lease`. Two steps: the accounts with such keys, read without locks, then, account by account,
/// the take itself, `FOR UPDATE SKIP LOCKED` within the account: concurrent workers take
/// different keys, and none takes a key while a request is committing a phase on it. A row lock
/// stays within one account's rows, as it must on Citus, where each account's rows are on one
/// shard and a lock across shards is refused. The take and its audit record are one statement;
/// `run` is the id of the worker's run, which every record it writes about the key carries.
pub async fn claim_abandoned(
    conn: &mut AsyncPgConnection,
    endpoints: &[&'static Endpoint],
    gateway: Option<&str>,
    lease: Duration,
    backoff: Duration,
    run: &RequestId,
) -> Result<Option<Abandoned>, StoreError> {
    let drivable = drivable(endpoints, "k.account_id", "$4");
    let accounts = diesel::sql_query(format!(
        "SELECT account_id FROM idempotency_keys k WHERE {DUE} AND {drivable} ORDER BY last_run_at LIMIT $1"
    ))
    .bind::<BigInt, _>(KEYS_A_RUN)
    .bind::<BigInt, _>(millis(backoff))
    .bind::<BigInt, _>(millis(MAX_BACKOFF))
    .bind::<Nullable<Text>, _>(gateway);
    for account_id in db::accounts_of(db::query(accounts.load(conn)).await?) {
        if let Some(abandoned) = take_abandoned(conn, endpoints, account_id, gateway, lease, backoff, run).await? {
            return Ok(Some(abandoned));
        }
    }
    Ok(None)
}

/// Takes over the account's due key that has waited longest among those a worker at `gateway`
/// can drive, if another worker has not. It returns what the take changed besides the lock (the
/// key's last run and nudge, as they were), for a worker that must hand the key back.
async fn take_abandoned(
    conn: &mut AsyncPgConnection,
    endpoints: &[&'static Endpoint],
    account_id: Uuid,
    gateway: Option<&str>,
    lease: Duration,
    backoff: Duration,
    run: &RequestId,
) -> Result<Option<Abandoned>, StoreError> {
    // The lock token is made here: Citus runs no volatile function in a distributed `UPDATE`.
    let token = Uuid::new_v4();
    let drivable = drivable(endpoints, "$5", "$4");
    let claim = diesel::sql_query(format!(
        "WITH claimed AS (
             UPDATE idempotency_keys taken
             SET locked_until = now() + $1 * interval '1 millisecond', lock_token = $6,
                 last_run_at = now(),
                 completer_attempts = taken.completer_attempts + 1, nudged_at = NULL
             FROM (SELECT k.account_id, k.id, k.last_run_at, k.nudged_at FROM idempotency_keys k
                   WHERE k.account_id = $5 AND {DUE} AND {drivable}
                   ORDER BY k.last_run_at
                   LIMIT 1
                   FOR UPDATE SKIP LOCKED) due
             WHERE taken.account_id = $5 AND taken.id = due.id
             RETURNING taken.account_id, taken.id, taken.idempotency_key, taken.recovery_point, taken.lock_token,
                       taken.request_path, taken.request_params, taken.completer_attempts,
                       due.last_run_at AS last_run_before, due.nudged_at AS nudged_before
         ), audited AS (
             INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data, request_id)
             SELECT account_id, 'idempotency_key.taken_over', 'idempotency_key', id, 'completer',
                    jsonb_build_object('attempt', completer_attempts, 'recovery_point', recovery_point), $7
             FROM claimed
         )
         SELECT * FROM claimed"
    ))
    .bind::<BigInt, _>(millis(lease))
    .bind::<BigInt, _>(millis(backoff))
    .bind::<BigInt, _>(millis(MAX_BACKOFF))
    .bind::<Nullable<Text>, _>(gateway)
    .bind::<SqlUuid, _>(account_id)
    .bind::<SqlUuid, _>(token)
    .bind::<Text, _>(run.as_str());
    let sent = since_boot();
    let row: Option<AbandonedRow> = db::query(db::first_row(claim.load(conn))).await?;
    let Some(row) = row else { return Ok(None) };
    let lease = Lease { token: row.lock_token, length: lease, sent };
    let taken = Taken { last_run_at: row.last_run_before, nudged_at: row.nudged_before };
    let endpoint = endpoints.iter().find(|endpoint| endpoint.path == row.request_path);
    let Some((endpoint, point)) = endpoint.and_then(|endpoint| Some((*endpoint, endpoint.point(&row.recovery_point)?)))
    else {
        // A key no registered endpoint drives, or at a point its endpoint does not declare: a bug,
        // which no worker can drive. It waits for a person.
        let lock = KeyLock::new(row.account_id, row.id, RecoveryPoint::STARTED, true, lease);
        let detail = format!("a key of {} at {:?}, which no endpoint drives", row.request_path, row.recovery_point);
        let reason = Reason { code: "internal", detail: &detail };
        lock.release(conn, crate::audit::Actor::Completer, reason, run).await?;
        mark_needs_attention(conn, &lock, reason, run).await?;
        return Err(StoreError::Query(diesel::result::Error::QueryBuilderError(detail.into())));
    };
    Ok(Some(Abandoned {
        lock: KeyLock::new(row.account_id, row.id, point, true, lease).taken_over(taken),
        key: IdempotencyKey::from_stored(row.idempotency_key),
        endpoint,
        params: row.request_params,
        attempts: row.completer_attempts.unsigned_abs(),
    }))
}

/// Gives up on a key: it stays unfinished, no worker drives it again, and it waits on the
/// operator's list. Only while nobody holds it (its client may have come back meanwhile).
pub async fn mark_needs_attention(
    conn: &mut AsyncPgConnection,
    key: &KeyLock,
    reason: Reason<'_>,
    run: &RequestId,
) -> Result<bool, StoreError> {
    let mark = diesel::sql_query(
        "WITH marked AS (
             UPDATE idempotency_keys SET needs_attention_at = now(), attention_reason = $3
             WHERE account_id = $1 AND id = $2 AND recovery_point <> 'finished' AND locked_until IS NULL
               AND needs_attention_at IS NULL
             RETURNING account_id, id, completer_attempts
         )
         INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data, request_id)
         SELECT account_id, 'idempotency_key.needs_attention', 'idempotency_key', id, 'completer',
                jsonb_build_object('attempts', completer_attempts, 'reason_code', $5::text, 'reason', $3::text), $4
         FROM marked",
    )
    .bind::<SqlUuid, _>(key.account_id)
    .bind::<SqlUuid, _>(key.key_id)
    .bind::<Text, _>(truncate(reason.detail, 1000))
    .bind::<Text, _>(run.as_str())
    .bind::<Text, _>(reason.code);
    Ok(db::query(mark.execute(conn)).await? == 1)
}

/// Gives up on the keys made at another gateway than `gateway`, the one this worker's process
/// reaches, that no worker has taken for [`STRANDED_AFTER`] (nor a client retried): they wait for
/// a process that reaches their gateway (see [`drivable`]), and none is running. Each is put on
/// the operator's list, its reason naming both gateways (and `code`), with an audit record, as a
/// key the completer gave up on. Account by account, as [`claim_abandoned`]; the keys given up on.
pub async fn give_up_on_stranded(
    conn: &mut AsyncPgConnection,
    endpoints: &[&Endpoint],
    gateway: &str,
    code: &str,
    run: &RequestId,
) -> Result<Vec<Uuid>, StoreError> {
    let accounts = diesel::sql_query(format!(
        "SELECT account_id FROM idempotency_keys k WHERE {UNTAKEN} AND NOT {} ORDER BY last_run_at LIMIT $1",
        drivable(endpoints, "k.account_id", "$3")
    ))
    .bind::<BigInt, _>(KEYS_A_RUN)
    .bind::<BigInt, _>(millis(STRANDED_AFTER))
    .bind::<Text, _>(gateway);
    let mut given_up = Vec::new();
    for account_id in db::accounts_of(db::query(accounts.load(conn)).await?) {
        let (made_at, drivable) = (made_at(endpoints, "$1"), drivable(endpoints, "$1", "$3"));
        let give_up = diesel::sql_query(format!(
            "WITH stranded AS (
                 SELECT k.account_id, k.id,
                        format('the request was made at the gateway %s, and no process that reaches it has run '
                               'the key since %s (this one reaches %s): only that gateway may settle it',
                               {made_at}, k.last_run_at, $3::text) AS reason
                 FROM idempotency_keys k
                 WHERE k.account_id = $1 AND {UNTAKEN} AND NOT {drivable}
                 FOR UPDATE SKIP LOCKED
             ), marked AS (
                 UPDATE idempotency_keys k SET needs_attention_at = now(), attention_reason = s.reason
                 FROM stranded s
                 WHERE k.account_id = $1 AND k.id = s.id
                 RETURNING k.account_id, k.id, k.completer_attempts, k.attention_reason
             ), audited AS (
                 INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data, request_id)
                 SELECT account_id, 'idempotency_key.needs_attention', 'idempotency_key', id, 'completer',
                        jsonb_build_object('attempts', completer_attempts, 'reason_code', $4::text,
                                           'reason', attention_reason), $5
                 FROM marked
             )
             SELECT id FROM marked"
        ))
        .bind::<SqlUuid, _>(account_id)
        .bind::<BigInt, _>(millis(STRANDED_AFTER))
        .bind::<Text, _>(gateway)
        .bind::<Text, _>(code)
        .bind::<Text, _>(run.as_str());
        let marked: Vec<KeyId> = db::query(give_up.load(conn)).await?;
        given_up.extend(marked.into_iter().map(|key| key.id));
    }
    Ok(given_up)
}

#[derive(QueryableByName)]
struct KeyId {
    #[diesel(sql_type = SqlUuid)]
    id: Uuid,
}

/// A key on the operator's list.
#[derive(Debug, QueryableByName)]
pub struct NeedsAttention {
    #[diesel(sql_type = SqlUuid)]
    pub id: Uuid,
    #[diesel(sql_type = SqlUuid)]
    pub account_id: Uuid,
    #[diesel(sql_type = Text)]
    pub idempotency_key: String,
    #[diesel(sql_type = Text)]
    pub recovery_point: String,
    #[diesel(sql_type = Integer)]
    pub completer_attempts: i32,
    #[diesel(sql_type = Timestamptz)]
    pub needs_attention_at: DateTime<Utc>,
    #[diesel(sql_type = Text)]
    pub attention_reason: String,
    /// The endpoint the key is bound to (`/v1/payments`, `/v1/refunds`).
    #[diesel(sql_type = Text)]
    pub request_path: String,
    /// The payment or refund the key made, if any yet.
    #[diesel(sql_type = Nullable<SqlUuid>)]
    pub made_id: Option<Uuid>,
}

/// The keys workers gave up on, oldest first, with what each made, if anything (a row of its
/// endpoint's table, one of `endpoints`'; see [`Endpoint::made_in`]).
pub async fn needing_attention(
    conn: &mut AsyncPgConnection,
    endpoints: &[&Endpoint],
) -> Result<Vec<NeedsAttention>, StoreError> {
    let tables = made_in(endpoints);
    let joins: Vec<String> = (tables.iter().enumerate())
        .map(|(n, table)| {
            format!("LEFT JOIN {table} m{n} ON m{n}.account_id = k.account_id AND m{n}.idempotency_key_id = k.id")
        })
        .collect();
    let made: Vec<String> = (0..tables.len()).map(|n| format!("m{n}.id")).collect();
    let list = format!(
        "SELECT k.id, k.account_id, k.idempotency_key, k.recovery_point, k.completer_attempts,
                k.needs_attention_at, k.attention_reason, k.request_path, coalesce({made}) AS made_id
         FROM idempotency_keys k
         {joins}
         WHERE k.needs_attention_at IS NOT NULL
         ORDER BY k.needs_attention_at",
        made = made.join(", "),
        joins = joins.join("\n         "),
    );
    db::query(diesel::sql_query(list).load(conn)).await
}

/// The account of the key row `key_id`, if it is on the list: what an operator's answer to it
/// names first, since an operator names a key by its row's id alone. It locks nothing, so on Citus
/// it may ask every shard (a row lock is refused in a statement that spans shards); every
/// statement that then locks or writes names the account, and runs on its shard alone.
pub async fn account_needing_attention(conn: &mut AsyncPgConnection, key_id: Uuid) -> Result<Option<Uuid>, StoreError> {
    let account =
        diesel::sql_query("SELECT account_id FROM idempotency_keys WHERE id = $1 AND needs_attention_at IS NOT NULL")
            .bind::<SqlUuid, _>(key_id);
    let account: Option<db::AccountRow> = db::query(async { account.get_result(conn).await.optional() }).await?;
    Ok(account.map(|row| row.account_id))
}

/// An operator's answer to a key on the list, once its cause is fixed: let the workers try it
/// again, from the start of their backoff. (Safe at any time: a resumed key reconciles with the
/// gateway before it charges.)
pub async fn retry_needing_attention(
    conn: &mut AsyncPgConnection,
    account_id: Uuid,
    key_id: Uuid,
) -> Result<bool, StoreError> {
    let reset = diesel::sql_query(
        "WITH reset AS (
             UPDATE idempotency_keys
             SET needs_attention_at = NULL, attention_reason = NULL, completer_attempts = 0
             WHERE account_id = $1 AND id = $2 AND needs_attention_at IS NOT NULL
             RETURNING account_id, id
         )
         INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data)
         SELECT account_id, 'idempotency_key.retried', 'idempotency_key', id, 'operator', '{}'
         FROM reset",
    )
    .bind::<SqlUuid, _>(account_id)
    .bind::<SqlUuid, _>(key_id);
    Ok(db::query(reset.execute(conn)).await? == 1)
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

fn truncate(text: &str, max_chars: usize) -> String {
    text.chars().take(max_chars).collect()
}
