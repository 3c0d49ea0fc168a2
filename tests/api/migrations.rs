//! Migrations are online from 000013 on: applied to a populated database, none may rewrite a table
//! or hold a lock that blocks the service while it reads or writes rows. Every migration after
//! 000012 is applied, one at a time, to a database populated at 000012 (`populate.sql`), and
//! watched; the watch itself is held to the migrations before the rule, which it must condemn for
//! what "Upgrading" (docs/operating.md) says they do, and pass where they were harmless.
//!
//! How a migration is watched ([`watch`]); nothing is timed, so a slow or busy machine can neither
//! fail the test nor let a migration through:
//! - **Rewrites.** Every table and index that existed before keeps its data file
//!   (`pg_relation_filenode`). A rewrite (`ALTER COLUMN TYPE`, a volatile default, a column of a
//!   domain with a CHECK, `SET TABLESPACE`, `VACUUM FULL`) makes a new one, at any size.
//! - **Blocking locks.** While it runs, one session per table holds `ROW EXCLUSIVE` on it, the lock
//!   each INSERT, UPDATE and DELETE of the service takes. A lock that blocks the service's writes
//!   (`SHARE` and stronger; `ACCESS EXCLUSIVE` blocks its reads too) conflicts with it, so the
//!   migration has to wait for that session, in `pg_locks`: the lock is noted, and the session ends
//!   to let it through. (`CREATE INDEX CONCURRENTLY` waits for those sessions too, as for any
//!   transaction writing the table, but on their transactions: it blocks no one.)
//! - **Rows.** What it read and wrote of the tables that existed (`pg_stat_user_tables`, flushed by
//!   its session before it returns). A migration is one transaction (diesel's, or, for a
//!   `run_in_transaction = false` one, PostgreSQL's implicit transaction around a file sent as one
//!   query) and keeps every lock until it ends: one that took a blocking lock and touched a row
//!   kept the service waiting while it did. Every table holds rows when a migration is watched, so
//!   a scan of any is seen: a table that a migration creates needs rows in `populate.sql` once a
//!   later migration is watched, and the test says so until it has them.
//!
//! Not watched: how long a migration waits for its locks behind the service's own transactions
//! (requests queue behind a waiting `ACCESS EXCLUSIVE`; docs/operating.md says how to bound that),
//! and a backfill's row locks (an UPDATE of many rows in one migration holds each until it
//! commits).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use diesel::QueryableByName;
use diesel::connection::SimpleConnection;
use diesel::migration::{Migration, MigrationSource};
use diesel::pg::Pg;
use diesel::sql_types::{Array, BigInt, Integer, Nullable, Text, Uuid as SqlUuid};
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_migrations::MigrationHarness;
use payments_service::db::migrate::MIGRATIONS;
use uuid::Uuid;

use crate::helpers::TestDatabase;

/// The last migration that landed before every migration had to be online.
const LAST_BEFORE_THE_RULE: &str = "2026-11-22-000012_key_request_counts";

/// Fills the database at whichever migration it stands (see the file).
const POPULATE: &str = include_str!("migrations/populate.sql");

/// `pg_temp.populate`'s arguments: payments, accounts, events still in the outbox, share of the
/// keys reaped. Small, since no finding depends on a table's size, only on it holding rows.
const POPULATION: &str = "2000, 40, 100, 0.1";

#[tokio::test]
async fn every_migration_after_000012_is_online_on_a_populated_database() {
    let database = TestDatabase::empty().await;
    let (before, after) = names().into_iter().partition::<Vec<_>, _>(|name| name.as_str() <= LAST_BEFORE_THE_RULE);
    assert_eq!(before.last().map(String::as_str), Some(LAST_BEFORE_THE_RULE));
    migrate(&database.url, before).await;
    // With no migration after 000012 yet, this checks only that the database is populated; the
    // watch itself is proven by the next test, on the migrations before the rule.
    let mut offline = Vec::new();
    for (name, verdict) in watch_in_turn(&database.url, &after).await {
        println!("{name}: {}: {verdict}", verdict.summary());
        if !verdict.is_online() {
            offline.push(format!("{name}: {verdict}"));
        }
    }
    assert!(offline.is_empty(), "migrations that are not online:\n{}", offline.join("\n"));
}

#[tokio::test]
async fn the_watch_condemns_the_migrations_before_the_rule_for_what_they_did() {
    let database = TestDatabase::empty().await;
    let (before, watched): (Vec<_>, Vec<_>) = names()
        .into_iter()
        .filter(|name| name.as_str() <= LAST_BEFORE_THE_RULE)
        .partition(|name| name.as_str() < "2026-11-22-000006_workers");
    migrate(&database.url, before).await;
    let verdicts: Vec<(String, String)> = watch_in_turn(&database.url, &watched)
        .await
        .into_iter()
        .map(|(name, verdict)| (name, verdict.summary()))
        .collect();
    let expected = [
        // Columns with CHECKs (each checked by a scan), an UPDATE of every finished key, two indexes
        // built anew, all under ACCESS EXCLUSIVE.
        (
            "2026-11-22-000006_workers",
            "offline; locked idempotency_keys, staged_jobs; touched idempotency_keys, staged_jobs",
        ),
        // An UPDATE of every payment (created_seq), SET NOT NULL's scan, an index built.
        (
            "2026-11-22-000007_hardening",
            "offline; locked idempotency_keys, payments; touched idempotency_keys, payments",
        ),
        // Two indexes dropped (ACCESS EXCLUSIVE) and built again (a scan).
        ("2026-11-22-000008_hot_updates", "offline; locked idempotency_keys; touched idempotency_keys"),
        // Every column that became a domain: four tables rewritten.
        (
            "2026-11-22-000009_column_domains",
            "offline; rewrote audit_records, idempotency_keys, payments, staged_jobs; \
             locked audit_records, idempotency_keys, payments, staged_jobs; \
             touched audit_records, idempotency_keys, payments, staged_jobs",
        ),
        // Two foreign keys dropped: ACCESS EXCLUSIVE for a moment, no row read.
        ("2026-11-22-000010_audit_without_account_locks", "online; locked accounts, audit_records, staged_jobs"),
        // A column of a domain with a CHECK rewrites the audit trail; the backfill reads payments.
        (
            "2026-11-22-000011_request_ids_and_key_stories",
            "offline; rewrote audit_records; locked audit_records, idempotency_keys, payments; \
             touched audit_records, payments",
        ),
        // A new table.
        ("2026-11-22-000012_key_request_counts", "online"),
    ];
    let expected: Vec<(String, String)> = expected.iter().map(|(v, s)| (v.to_string(), s.to_string())).collect();
    assert_eq!(verdicts, expected);
}

/// The embedded migrations' names, in the order they apply (by version, as diesel orders them).
fn names() -> Vec<String> {
    let mut migrations = MigrationSource::<Pg>::migrations(&MIGRATIONS).unwrap();
    migrations.sort_by_key(|migration| migration.name().version().to_string());
    migrations.iter().map(|migration| migration.name().to_string()).collect()
}

/// Applies the migrations `names`, in turn, as `payments migrate` would.
async fn migrate(url: &str, names: Vec<String>) {
    let url = url.to_owned();
    tokio::task::spawn_blocking(move || {
        let mut conn = <AsyncConnectionWrapper<AsyncPgConnection> as diesel::Connection>::establish(&url).unwrap();
        // Makes diesel's table of applied migrations, if there is none yet.
        MigrationHarness::<Pg>::applied_migrations(&mut conn).unwrap();
        for name in &names {
            apply(&mut conn, name);
        }
        flush_statistics(&mut conn);
    })
    .await
    .unwrap();
}

fn apply(conn: &mut AsyncConnectionWrapper<AsyncPgConnection>, name: &str) {
    let migrations = MigrationSource::<Pg>::migrations(&MIGRATIONS).unwrap();
    let migration: &dyn Migration<Pg> = migrations
        .iter()
        .find(|migration| migration.name().to_string() == name)
        .map(|migration| &**migration)
        .unwrap_or_else(|| panic!("no migration {name}"));
    conn.run_migration(migration).unwrap_or_else(|error| panic!("applying {name}: {error}"));
}

/// Makes the session's statistics visible to others before the statement returns (PostgreSQL
/// flushes them, forced, before it says it is ready for the next one).
fn flush_statistics(conn: &mut AsyncConnectionWrapper<AsyncPgConnection>) {
    SimpleConnection::batch_execute(conn, "SELECT pg_stat_force_next_flush()").unwrap();
}

/// Watches each migration of `names` applied in turn, each on a database whose tables all hold
/// rows.
async fn watch_in_turn(url: &str, names: &[String]) -> Vec<(String, Verdict)> {
    let mut verdicts = Vec::new();
    for name in names {
        populate_empty_tables(url).await;
        verdicts.push((name.to_owned(), watch(url, name).await));
    }
    if names.is_empty() {
        // Nothing to watch (no migration after 000012 yet): the database still has to fill.
        populate_empty_tables(url).await;
    }
    verdicts
}

#[derive(QueryableByName)]
struct Table {
    #[diesel(sql_type = Text)]
    table_name: String,
}

/// Gives rows to every table that has none (all of them, the first time), with `populate.sql`.
async fn populate_empty_tables(url: &str) {
    let mut conn = AsyncPgConnection::establish(url).await.unwrap();
    let empty = empty_tables(&mut conn).await;
    if empty.is_empty() {
        // The look for empty tables read a row of each: counted now, not in the next watch.
        conn.batch_execute("SELECT pg_stat_force_next_flush()").await.unwrap();
        return;
    }
    conn.batch_execute(POPULATE).await.unwrap();
    diesel::sql_query(format!("SELECT pg_temp.populate({POPULATION}, $1)"))
        .bind::<Array<Text>, _>(&empty)
        .execute(&mut conn)
        .await
        .unwrap_or_else(|error| panic!("populating {empty:?}: {error}"));
    conn.batch_execute("VACUUM ANALYZE").await.unwrap();
    let still = empty_tables(&mut conn).await;
    assert!(
        still.is_empty(),
        "populate.sql gives no row to {still:?}: add them there, or a later migration's scan of them goes unseen"
    );
    conn.batch_execute("SELECT pg_stat_force_next_flush()").await.unwrap();
}

async fn empty_tables(conn: &mut AsyncPgConnection) -> Vec<String> {
    let tables: Vec<Table> = diesel::sql_query(
        "SELECT relname::text AS table_name FROM pg_class
         WHERE relnamespace = 'public'::regnamespace AND relkind = 'r' AND relname <> '__diesel_schema_migrations'",
    )
    .load(conn)
    .await
    .unwrap();
    let mut empty = Vec::new();
    for Table { table_name } in tables {
        let sql = format!("SELECT '{table_name}' AS table_name WHERE NOT EXISTS (SELECT FROM {table_name})");
        if !diesel::sql_query(sql).load::<Table>(conn).await.unwrap().is_empty() {
            empty.push(table_name);
        }
    }
    empty
}

/// What a migration did to the tables and indexes that existed before it.
#[derive(Debug, Default)]
struct Verdict {
    /// (table, relation) of each table or index with a new data file.
    rewritten: BTreeSet<(String, String)>,
    /// Each table locked against the service's writes, with the lock first asked for.
    locked: BTreeMap<String, String>,
    /// Rows read or written, by table.
    touched: BTreeMap<String, i64>,
}

impl Verdict {
    fn is_online(&self) -> bool {
        self.rewritten.is_empty() && (self.locked.is_empty() || self.touched.is_empty())
    }

    /// Whether it is online, and which tables it rewrote, locked and touched.
    fn summary(&self) -> String {
        let mut parts = vec![if self.is_online() { "online" } else { "offline" }.to_owned()];
        let rewritten: BTreeSet<&str> = self.rewritten.iter().map(|(table, _)| table.as_str()).collect();
        for (what, tables) in [
            ("rewrote", rewritten.into_iter().collect::<Vec<_>>()),
            ("locked", self.locked.keys().map(String::as_str).collect()),
            ("touched", self.touched.keys().map(String::as_str).collect()),
        ] {
            if !tables.is_empty() {
                parts.push(format!("{what} {}", tables.join(", ")));
            }
        }
        parts.join("; ")
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if !self.rewritten.is_empty() {
            let relations: Vec<&str> = self.rewritten.iter().map(|(_, relation)| relation.as_str()).collect();
            write!(f, "rewrote {}; ", relations.join(", "))?;
        }
        let locks: Vec<String> = self.locked.iter().map(|(table, mode)| format!("{table} ({mode})")).collect();
        let rows: Vec<String> = self.touched.iter().map(|(table, rows)| format!("{rows} of {table}")).collect();
        write!(
            f,
            "locked {} against the service's writes; read or wrote rows: {}",
            if locks.is_empty() { "nothing".to_owned() } else { locks.join(", ") },
            if rows.is_empty() { "none".to_owned() } else { rows.join(", ") }
        )
    }
}

#[derive(QueryableByName)]
struct Relation {
    #[diesel(sql_type = BigInt)]
    oid: i64,
    #[diesel(sql_type = Text)]
    table_name: String,
    #[diesel(sql_type = Text)]
    relation: String,
    #[diesel(sql_type = Nullable<BigInt>)]
    filenode: Option<i64>,
}

/// The tables and indexes of the schema, each with its table and data file.
async fn relations(conn: &mut AsyncPgConnection) -> Vec<Relation> {
    diesel::sql_query(
        "SELECT c.oid::bigint AS oid, coalesce(t.relname, c.relname)::text AS table_name, c.relname::text AS relation,
                pg_relation_filenode(c.oid)::bigint AS filenode
         FROM pg_class c LEFT JOIN pg_index i ON i.indexrelid = c.oid LEFT JOIN pg_class t ON t.oid = i.indrelid
         WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'i', 'm')",
    )
    .load(conn)
    .await
    .unwrap()
}

#[derive(QueryableByName)]
struct Rows {
    #[diesel(sql_type = Text)]
    table_name: String,
    #[diesel(sql_type = BigInt)]
    rows: i64,
}

/// Rows read (by scans and index look-ups) and written, by table, since the statistics began.
async fn rows(conn: &mut AsyncPgConnection) -> BTreeMap<String, i64> {
    let rows: Vec<Rows> = diesel::sql_query(
        "SELECT relname::text AS table_name,
                (seq_tup_read + coalesce(idx_tup_fetch, 0) + n_tup_ins + n_tup_upd + n_tup_del)::bigint AS rows
         FROM pg_stat_user_tables WHERE schemaname = 'public'",
    )
    .load(conn)
    .await
    .unwrap();
    rows.into_iter().map(|Rows { table_name, rows }| (table_name, rows)).collect()
}

#[derive(QueryableByName)]
struct Wait {
    #[diesel(sql_type = Text)]
    mode: String,
    #[diesel(sql_type = Nullable<Text>)]
    table_name: Option<String>,
    #[diesel(sql_type = Array<Integer>)]
    blockers: Vec<i32>,
}

/// What the session `pid` is waiting for, and for whom.
async fn waits(conn: &mut AsyncPgConnection, pid: i32) -> Vec<Wait> {
    diesel::sql_query(
        "SELECT l.mode, c.relname::text AS table_name, pg_blocking_pids(l.pid) AS blockers
         FROM pg_locks l LEFT JOIN pg_class c ON l.locktype = 'relation' AND c.oid = l.relation
         WHERE l.pid = $1 AND NOT l.granted",
    )
    .bind::<Integer, _>(pid)
    .load(conn)
    .await
    .unwrap()
}

/// A session standing for the service's writers: it holds `ROW EXCLUSIVE` on one table until
/// the migration asks for a lock that conflicts, or waits for its transaction.
struct Writer {
    pid: i32,
    conn: Option<AsyncPgConnection>,
}

impl Writer {
    async fn hold(url: &str, table: &str) -> Writer {
        let mut conn = AsyncPgConnection::establish(url).await.unwrap();
        let pid = backend_pid(&mut conn).await;
        conn.batch_execute(&format!("BEGIN; LOCK TABLE {table} IN ROW EXCLUSIVE MODE")).await.unwrap();
        Writer { pid, conn: Some(conn) }
    }

    async fn let_go(&mut self) {
        if let Some(mut conn) = self.conn.take() {
            conn.batch_execute("COMMIT").await.unwrap();
        }
    }
}

async fn backend_pid(conn: &mut AsyncPgConnection) -> i32 {
    diesel::select(diesel::dsl::sql::<Integer>("pg_backend_pid()")).get_result(conn).await.unwrap()
}

/// The locks a transaction may hold that block the service's writes (`ROW EXCLUSIVE`).
const BLOCKING: [&str; 4] = ["ShareLock", "ShareRowExclusiveLock", "ExclusiveLock", "AccessExclusiveLock"];

/// Applies the migration `name` as `payments migrate` would, and says what it did.
async fn watch(url: &str, name: &str) -> Verdict {
    let mut observer = AsyncPgConnection::establish(url).await.unwrap();
    let before = relations(&mut observer).await;
    let rows_before = rows(&mut observer).await;
    let tables: BTreeSet<String> = before
        .iter()
        .filter(|r| r.relation == r.table_name && r.table_name != "__diesel_schema_migrations")
        .map(|r| r.table_name.clone())
        .collect();
    let mut writers = Vec::new();
    for table in &tables {
        writers.push(Writer::hold(url, table).await);
    }

    let (pid_sender, pid) = tokio::sync::oneshot::channel();
    let (url_owned, name_owned) = (url.to_owned(), name.to_owned());
    let mut migration = tokio::task::spawn_blocking(move || {
        let mut conn =
            <AsyncConnectionWrapper<AsyncPgConnection> as diesel::Connection>::establish(&url_owned).unwrap();
        let pid: i32 =
            diesel::RunQueryDsl::get_result(diesel::select(diesel::dsl::sql::<Integer>("pg_backend_pid()")), &mut conn)
                .unwrap();
        pid_sender.send(pid).unwrap();
        apply(&mut conn, &name_owned);
        flush_statistics(&mut conn);
    });
    let pid = pid.await.unwrap();

    let mut verdict = Verdict::default();
    // A safety net, not a measure: a migration waits here only for as long as it runs.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        tokio::select! {
            applied = &mut migration => {
                applied.unwrap();
                break;
            }
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
        assert!(tokio::time::Instant::now() < deadline, "{name} still running after 2 minutes");
        for wait in waits(&mut observer, pid).await {
            if let Some(table) = wait.table_name.filter(|table| tables.contains(table))
                && BLOCKING.contains(&wait.mode.as_str())
            {
                verdict.locked.entry(table).or_insert(wait.mode);
            }
            for writer in writers.iter_mut().filter(|writer| wait.blockers.contains(&writer.pid)) {
                writer.let_go().await;
            }
        }
    }
    drop(writers);

    let after: BTreeMap<i64, Option<i64>> =
        relations(&mut observer).await.into_iter().map(|r| (r.oid, r.filenode)).collect();
    for relation in before {
        if after.get(&relation.oid).is_some_and(|filenode| *filenode != relation.filenode) {
            verdict.rewritten.insert((relation.table_name, relation.relation));
        }
    }
    for (table, rows) in rows(&mut observer).await {
        let touched = rows - rows_before.get(&table).copied().unwrap_or(0);
        if tables.contains(&table) && touched > 0 {
            verdict.touched.insert(table, touched);
        }
    }
    verdict
}

#[derive(QueryableByName, Debug, PartialEq)]
struct KeyOfPayment {
    #[diesel(sql_type = Text)]
    idempotency_key: String,
    #[diesel(sql_type = Nullable<SqlUuid>)]
    idempotency_key_id: Option<Uuid>,
}

/// Before 000007 a retry after a key was reaped made a key row of its own, which answered 410 and
/// was reaped in turn: a client key can have several reaping records. 000011 gives a payment whose
/// key row was reaped the id of the first, whatever order the records lie in on disk; one with
/// only a 410's record is left without.
#[tokio::test]
async fn the_000011_backfill_gives_a_payment_the_key_row_that_made_it() {
    let database = TestDatabase::empty().await;
    let (before, _): (Vec<_>, Vec<_>) = names().into_iter().partition(|name| name.as_str() < "2026-11-22-000011");
    migrate(&database.url, before).await;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let account = Uuid::new_v4();
    // The key rows: the one that made the payment, and a later one that answered 410.
    let key_rows: BTreeMap<(&str, i32), Uuid> =
        [("in-order", 201), ("in-order", 410), ("reversed", 201), ("reversed", 410), ("only-410", 410)]
            .into_iter()
            .map(|row| (row, Uuid::new_v4()))
            .collect();
    let made = |key: &str| key_rows[&(key, 201)];
    let answered_410 = |key: &str| key_rows[&(key, 410)];
    let reaped = |id: i64, key: &str, key_row: Uuid, status: i32| {
        format!(
            "({id}, '{account}', 'idempotency_key.reaped', 'idempotency_key', '{key_row}', 'reaper', \
             jsonb_build_object('idempotency_key', '{key}', 'response_status', {status}))"
        )
    };
    // Key `in-order`'s records lie on disk in the order they were written, `reversed`'s the other
    // way round, so that whichever way the backfill's join reads them, a pick by position is wrong
    // for one of them.
    let records = [
        reaped(1, "in-order", made("in-order"), 201),
        reaped(3, "in-order", answered_410("in-order"), 410),
        reaped(4, "reversed", answered_410("reversed"), 410),
        reaped(2, "reversed", made("reversed"), 201),
        reaped(5, "only-410", answered_410("only-410"), 410),
    ];
    conn.batch_execute(&format!(
        "INSERT INTO accounts (id, name, api_key_hash) VALUES ('{account}', 'a', sha256('a'));
         INSERT INTO payments (id, account_id, idempotency_key, amount, currency)
         SELECT gen_random_uuid(), '{account}', key, 1000, 'usd' FROM unnest(ARRAY['in-order', 'reversed', 'only-410']) key;
         INSERT INTO audit_records (id, account_id, action, resource_type, resource_id, actor, data)
         OVERRIDING SYSTEM VALUE VALUES {};
         ANALYZE",
        records.join(", ")
    ))
    .await
    .unwrap();

    migrate(&database.url, vec!["2026-11-22-000011_request_ids_and_key_stories".to_owned()]).await;

    let keys: Vec<KeyOfPayment> =
        diesel::sql_query("SELECT idempotency_key::text, idempotency_key_id FROM payments ORDER BY idempotency_key")
            .load(&mut conn)
            .await
            .unwrap();
    let expected = [("in-order", Some(made("in-order"))), ("only-410", None), ("reversed", Some(made("reversed")))];
    let expected: Vec<KeyOfPayment> = expected
        .into_iter()
        .map(|(key, id)| KeyOfPayment { idempotency_key: key.to_owned(), idempotency_key_id: id })
        .collect();
    assert_eq!(keys, expected);
}

#[derive(QueryableByName, Debug, PartialEq)]
struct Made {
    #[diesel(sql_type = Text)]
    request_path: String,
    #[diesel(sql_type = BigInt)]
    keys: i64,
}

/// 000033 moves what each key made from the view that named every endpoint's table into
/// `key_resources`: every payment, refund and change, under its key and its endpoint, as the view
/// showed it, so that a late retry of a key reaped before the upgrade is answered as before.
#[tokio::test]
async fn the_000033_backfill_records_what_every_key_made_under_its_endpoint() {
    let database = TestDatabase::empty().await;
    let (before, _): (Vec<_>, Vec<_>) = names().into_iter().partition(|name| name.as_str() < "2026-12-07-000033");
    migrate(&database.url, before).await;
    populate_empty_tables(&database.url).await;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let by_endpoint = "SELECT request_path::text, count(*) AS keys FROM {table} GROUP BY 1 ORDER BY 1";
    let view: Vec<Made> =
        diesel::sql_query(by_endpoint.replace("{table}", "made_by_keys")).load(&mut conn).await.unwrap();
    assert_eq!(view.len(), 3, "the view shows keys of payments, refunds and changes: {view:?}");

    migrate(&database.url, vec!["2026-12-07-000033_key_resources".to_owned()]).await;

    let table: Vec<Made> =
        diesel::sql_query(by_endpoint.replace("{table}", "key_resources")).load(&mut conn).await.unwrap();
    assert_eq!(table, view);
    let astray: Vec<Made> = diesel::sql_query(
        "SELECT k.request_path::text, count(*) AS keys FROM key_resources k
         WHERE NOT EXISTS (SELECT FROM payments p WHERE p.account_id = k.account_id AND p.id = k.resource_id
                               AND p.idempotency_key = k.idempotency_key AND k.request_path = '/v1/payments')
           AND NOT EXISTS (SELECT FROM refunds r WHERE r.account_id = k.account_id AND r.id = k.resource_id
                               AND r.idempotency_key = k.idempotency_key AND k.request_path = '/v1/refunds')
           AND NOT EXISTS (SELECT FROM payment_changes c WHERE c.account_id = k.account_id AND c.id = k.resource_id
                               AND c.idempotency_key = k.idempotency_key
                               AND k.request_path = '/v1/payments/{id}/' || c.kind)
         GROUP BY 1",
    )
    .load(&mut conn)
    .await
    .unwrap();
    assert_eq!(astray, [], "each row names what its key made, on its endpoint");
}

/// The guide's advice (docs/operating.md) for a migration that needs a lock for a moment: with
/// `lock_timeout` in `DATABASE_URL`, one that cannot get its lock (a long transaction holds the
/// table) gives up instead of waiting, with every request on that table queued behind it; run
/// again, it applies.
#[tokio::test]
async fn a_lock_timeout_in_database_url_stops_a_migration_queueing_behind_a_transaction() {
    let database = TestDatabase::empty().await;
    let (before, _): (Vec<_>, Vec<_>) = names().into_iter().partition(|name| name.as_str() < "2026-11-22-000011");
    migrate(&database.url, before).await;
    // A long transaction that has read the audit trail: 000011 needs ACCESS EXCLUSIVE on it.
    let mut reader = AsyncPgConnection::establish(&database.url).await.unwrap();
    reader.batch_execute("BEGIN; SELECT count(*) FROM audit_records").await.unwrap();
    // DATABASE_URL in either of its forms.
    let socket_dir = TestDatabase::socket_path().parent().unwrap().to_string_lossy().replace('/', "%2F");
    let urls = [
        format!("{} options='-c lock_timeout=100'", database.url),
        format!("postgresql://postgres@{socket_dir}:5432/{}?options=-c%20lock_timeout%3D100", database.name),
    ];

    for url in &urls {
        let error = payments_service::db::migrate::run_pending(url).await.unwrap_err();
        assert!(error.to_string().contains("lock timeout"), "{url}: {error}");
    }

    reader.batch_execute("COMMIT").await.unwrap();
    payments_service::db::migrate::run_pending(&urls[1]).await.unwrap();
}
