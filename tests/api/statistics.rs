//! A fresh deployment plans its probes from real statistics as soon as its tables grow: the
//! analyzer analyzes them (autovacuum, which would in the end, is off here), and the plans each
//! connection keeps then probe every table through the index made for the probe.

use diesel::QueryableByName;
use diesel::sql_types::Text;
use diesel_async::{RunQueryDsl, SimpleAsyncConnection};
use payments_service::db::statistics::{MIN_ROWS, analyze_grown_tables, grown_tables};
use payments_service::workers::{Outcome, Worker};

use crate::helpers::{TestApp, plan_nodes};

/// Payments (and their key rows) a fresh deployment makes in its first second or so.
const PAYMENTS: i64 = 500;

#[derive(QueryableByName, Debug)]
struct Analyzed {
    #[diesel(sql_type = Text)]
    table_name: String,
}

/// Which of the probed tables have been analyzed.
async fn analyzed(app: &TestApp) -> Vec<String> {
    let tables: Vec<Analyzed> = diesel::sql_query(
        "SELECT relname::text AS table_name FROM pg_stat_user_tables
         WHERE relname IN ('idempotency_keys', 'payments', 'refunds') AND last_analyze IS NOT NULL ORDER BY 1",
    )
    .load(&mut app.db().await)
    .await
    .unwrap();
    tables.into_iter().map(|table| table.table_name).collect()
}

/// The index a generic plan of `probe` (a statement on one table, `$1` its account and `$2` what
/// it looks for, of type `param`) reads, as a connection keeps it from its sixth run on.
async fn index_of_generic_plan(app: &TestApp, probe: &str, param: &str, value: &str) -> Vec<String> {
    let mut conn = app.db().await;
    conn.batch_execute(&format!("SET plan_cache_mode = force_generic_plan; PREPARE probe(uuid, {param}) AS {probe}"))
        .await
        .unwrap();
    let plan = plan_nodes(&mut conn, &format!("EXECUTE probe('{}', '{value}')", app.account_id)).await;
    plan.into_iter().filter_map(|node| node.index).collect()
}

#[tokio::test]
async fn a_fresh_database_is_analyzed_as_it_grows_and_each_probe_then_uses_its_own_index() {
    let app = TestApp::spawn().await;
    let mut conn = app.db().await;
    // As a fresh deployment's first seconds leave it: tables never analyzed, holding some hundred
    // payments of one account, each with its key row; the statistics flushed, as a session's are
    // within a second. Autovacuum is kept out of it, so that what analyzes them is the analyzer.
    conn.batch_execute(&format!(
        "ALTER TABLE idempotency_keys SET (autovacuum_enabled = false);
         ALTER TABLE payments SET (autovacuum_enabled = false);
         ALTER TABLE refunds SET (autovacuum_enabled = false);
         INSERT INTO idempotency_keys (id, account_id, idempotency_key, request_method, request_path,
                                       request_fingerprint, request_params)
         SELECT gen_random_uuid(), '{account}', 'key-' || i, 'POST', '/v1/payments', sha256(i::text::bytea), '{{}}'
         FROM generate_series(1, {PAYMENTS}) i;
         INSERT INTO payments (id, account_id, idempotency_key_id, idempotency_key, amount, currency, gateway)
         SELECT gen_random_uuid(), account_id, id, idempotency_key, 1000, 'usd', 'mock' FROM idempotency_keys;
         SELECT pg_stat_force_next_flush();",
        account = app.account_id
    ))
    .await
    .unwrap();
    assert_eq!(analyzed(&app).await, Vec::<String>::new(), "never analyzed, as a fresh database");

    let analyzer = app.workers().analyzer;
    assert_eq!(analyzer.run_once().await.unwrap(), Outcome::Idle);
    // The two tables that grew; refunds, still empty, is too small for any plan to matter.
    assert_eq!(analyzed(&app).await, ["idempotency_keys", "payments"]);

    let payment_by_id = index_of_generic_plan(
        &app,
        "SELECT 1 FROM payments WHERE account_id = $1 AND id = $2",
        "uuid",
        "00000000-0000-4000-8000-000000000000",
    )
    .await;
    assert_eq!(payment_by_id, ["payments_pkey"], "a phase's look-up of its payment");
    let payment_by_key = index_of_generic_plan(
        &app,
        "SELECT resource_id FROM key_resources WHERE account_id = $1 AND idempotency_key = $2",
        "text",
        "key-1",
    )
    .await;
    assert_eq!(payment_by_key[0], "key_resources_pkey", "the claim's look-up of what a key made: {payment_by_key:?}");
    let key_by_id = index_of_generic_plan(
        &app,
        "SELECT 1 FROM idempotency_keys WHERE account_id = $1 AND id = $2",
        "uuid",
        "00000000-0000-4000-8000-000000000000",
    )
    .await;
    assert_eq!(key_by_id, ["idempotency_keys_pkey"], "the fence");
    let key_by_key = index_of_generic_plan(
        &app,
        "SELECT 1 FROM idempotency_keys WHERE account_id = $1 AND idempotency_key = $2",
        "text",
        "key-1",
    )
    .await;
    assert_eq!(key_by_key, ["idempotency_keys_account_id_idempotency_key_key"], "the claim");

    // Ten times as many payments later, with no analysis since, a connection's new plan is as right:
    // the planner scales the statistics by the table's size.
    conn.batch_execute(&format!(
        "INSERT INTO payments (id, account_id, idempotency_key, amount, currency, gateway)
         SELECT gen_random_uuid(), '{}', 'later-' || i, 1000, 'usd', 'mock' FROM generate_series(1, {}) i",
        app.account_id,
        10 * PAYMENTS
    ))
    .await
    .unwrap();
    let payment_by_id = index_of_generic_plan(
        &app,
        "SELECT 1 FROM payments WHERE account_id = $1 AND id = $2",
        "uuid",
        "00000000-0000-4000-8000-000000000000",
    )
    .await;
    assert_eq!(payment_by_id, ["payments_pkey"], "a phase's look-up, planned at 5,500 payments");
}

#[tokio::test]
async fn the_analyzer_analyzes_a_table_once_it_has_rows_enough_and_then_leaves_it_to_autovacuum() {
    let app = TestApp::spawn().await;
    let mut conn = app.db().await;
    let payments = |count: i64| {
        format!(
            "INSERT INTO payments (id, account_id, idempotency_key, amount, currency, gateway)
             SELECT gen_random_uuid(), '{}', 'key-' || gen_random_uuid(), 1000, 'usd', 'mock'
             FROM generate_series(1, {count});
             SELECT pg_stat_force_next_flush();",
            app.account_id
        )
    };
    conn.batch_execute("ALTER TABLE payments SET (autovacuum_enabled = false)").await.unwrap();
    let mut analyzer_conn = app.db().await;

    conn.batch_execute(&payments(MIN_ROWS - 1)).await.unwrap();
    assert!(analyze_grown_tables(&mut analyzer_conn).await.unwrap().is_empty(), "too small to matter");
    conn.batch_execute(&payments(1)).await.unwrap();
    assert_eq!(analyze_grown_tables(&mut analyzer_conn).await.unwrap(), ["payments"]);
    assert!(analyze_grown_tables(&mut analyzer_conn).await.unwrap().is_empty(), "analyzed already");

    // Its statistics now come from real rows: however it grows, the planner scales them.
    conn.batch_execute(&payments(10 * MIN_ROWS)).await.unwrap();
    assert!(analyze_grown_tables(&mut analyzer_conn).await.unwrap().is_empty(), "left to autovacuum");
}

#[tokio::test]
async fn a_table_the_role_does_not_own_is_left_to_autovacuum() {
    let app = TestApp::spawn().await;
    hundred_payments(&app).await;
    let mut conn = app.db().await;
    // Roles belong to the cluster, which the tests share.
    let mut not_owner = app.db().await;
    not_owner
        .batch_execute(
            "DO $$ BEGIN CREATE ROLE payments_test_not_owner; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
             SET ROLE payments_test_not_owner",
        )
        .await
        .unwrap();
    assert!(analyze_grown_tables(&mut not_owner).await.unwrap().is_empty(), "it could not analyze it");
    assert_eq!(analyze_grown_tables(&mut conn).await.unwrap(), ["payments"], "its owner does");
}

/// A hundred payments in a table autovacuum leaves alone, counted by the statistics collector.
async fn hundred_payments(app: &TestApp) {
    app.db()
        .await
        .batch_execute(&format!(
            "ALTER TABLE payments SET (autovacuum_enabled = false);
             INSERT INTO payments (id, account_id, idempotency_key, amount, currency, gateway)
             SELECT gen_random_uuid(), '{}', 'key-' || i, 1000, 'usd', 'mock' FROM generate_series(1, {MIN_ROWS}) i;
             SELECT pg_stat_force_next_flush();",
            app.account_id
        ))
        .await
        .unwrap();
}

#[tokio::test]
async fn a_table_another_session_holds_is_not_reported_analyzed_and_is_analyzed_once_let_go() {
    let app = TestApp::spawn().await;
    hundred_payments(&app).await;
    // What another process's ANALYZE, a VACUUM or an index built concurrently holds.
    let mut holder = app.db().await;
    holder.batch_execute("BEGIN; LOCK TABLE payments IN SHARE UPDATE EXCLUSIVE MODE").await.unwrap();
    let mut conn = app.db().await;

    assert!(analyze_grown_tables(&mut conn).await.unwrap().is_empty(), "skipped, so not analyzed");
    assert_eq!(analyzed(&app).await, Vec::<String>::new());
    holder.batch_execute("COMMIT").await.unwrap();
    assert_eq!(analyze_grown_tables(&mut conn).await.unwrap(), ["payments"], "the next run");
    assert_eq!(analyzed(&app).await, ["payments"]);
}

#[tokio::test]
async fn a_member_of_the_owner_that_does_not_inherit_its_rights_leaves_the_table_to_autovacuum() {
    let app = TestApp::spawn().await;
    hundred_payments(&app).await;
    // Roles belong to the cluster, which the tests share.
    let mut conn = app.db().await;
    conn.batch_execute(
        "DO $$ BEGIN
             CREATE ROLE payments_test_owner;
             CREATE ROLE payments_test_inheriting IN ROLE payments_test_owner;
             CREATE ROLE payments_test_noinherit NOINHERIT IN ROLE payments_test_owner;
         EXCEPTION WHEN duplicate_object THEN NULL; END $$;
         ALTER TABLE payments OWNER TO payments_test_owner",
    )
    .await
    .unwrap();
    let grown_for = async |role: &str| {
        let mut conn = app.db().await;
        conn.batch_execute(&format!("SET ROLE {role}")).await.unwrap();
        grown_tables(&mut conn).await.unwrap()
    };
    // ANALYZE would only warn that it skipped it, run after run.
    assert!(grown_for("payments_test_noinherit").await.is_empty(), "it could not analyze it");
    assert_eq!(grown_for("payments_test_inheriting").await, ["payments"], "it has the owner's rights");
}
