//! A key's expiry is one fact, recorded by the database when the key finishes (the finishing
//! process's retention after its `now()`): processes with other retention settings, their
//! in-memory replays and the reaper all go by it.

use std::time::Duration;

use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use diesel_migrations::MigrationHarness;
use payments_service::db::migrate::MIGRATIONS;
use payments_service::workers::{Outcome, Worker};
use reqwest::StatusCode;
use serde_json::Value;

use crate::helpers::{TestApp, TestDatabase, new_key, payment_body, wait_until};

/// A process that keeps keys two seconds, and one beside it on the same database that keeps them
/// a day (the default).
async fn short_and_long() -> (TestApp, TestApp) {
    let short = TestApp::builder().key_retention(Duration::from_secs(2)).spawn().await;
    let long = TestApp::builder().spawn_beside(&short).await;
    (short, long)
}

#[tokio::test]
async fn once_the_finishing_processs_retention_is_over_no_process_replays_the_key() {
    let (short, long) = short_and_long().await;
    let key = new_key();
    let payment: Value = short.post_payment(&key, &payment_body()).await.json().await.unwrap();
    // The other process replays it from the database, and keeps the answer in memory too.
    let replay = long.post_payment(&key, &payment_body()).await;
    assert_eq!(replay.headers()["Idempotent-Replayed"], "true");
    assert!(short.remembers_the_answer_of(&key) && long.remembers_the_answer_of(&key));

    wait_until(Duration::from_secs(10), "the key expired", || short.key_has_expired(&key)).await;

    for (app, name) in [(&long, "the process with the longer retention"), (&short, "the finishing process")] {
        assert!(!app.remembers_the_answer_of(&key), "{name} keeps nothing in memory past the key's expiry");
        let late = app.post_payment(&key, &payment_body()).await;
        assert_eq!(late.status(), StatusCode::GONE, "{name}");
        let problem: Value = late.json().await.unwrap();
        assert_eq!(problem["type"], "https://payments.example/problems/idempotency-key-expired");
        assert_eq!(problem["payment"]["id"], payment["id"], "{name}");
    }
    assert!(short.key_row(&key).await.is_some(), "not reaped yet: the claim itself answers an expired key");
    assert_eq!(short.gateway.stats().await.charges, 1);
}

#[tokio::test]
async fn the_reaper_goes_by_each_keys_recorded_expiry_not_by_its_own_retention() {
    let (short, long) = short_and_long().await;
    let (brief, kept) = (new_key(), new_key());
    assert_eq!(short.post_payment(&brief, &payment_body()).await.status(), StatusCode::CREATED);
    assert_eq!(long.post_payment(&kept, &payment_body()).await.status(), StatusCode::CREATED);
    // Until `brief` has expired, and `kept` finished longer ago than the short retention.
    wait_until(Duration::from_secs(10), "the key kept briefly expired", || short.key_has_expired(&brief)).await;
    let finished_long_ago = format!(
        "SELECT finished_at < now() - interval '2 seconds' FROM idempotency_keys WHERE idempotency_key = '{kept}'"
    );
    wait_until(Duration::from_secs(10), "the other key outlived the short retention", || {
        long.database_says(&finished_long_ago)
    })
    .await;

    // The reaper of the process that keeps keys a day reaps the one kept briefly...
    assert_eq!(long.workers().reaper.run_once().await.unwrap(), Outcome::Idle);
    assert!(long.key_row(&brief).await.is_none(), "reaped at its expiry, long before a day");
    // ... and the reaper of the one that keeps keys two seconds leaves the one kept a day.
    short.workers().reaper.run_once().await.unwrap();
    assert!(short.key_row(&kept).await.is_some(), "kept for the day its finishing process said");
    let retry = short.post_payment(&kept, &payment_body()).await;
    assert_eq!(retry.headers()["Idempotent-Replayed"], "true");
}

#[tokio::test]
async fn a_key_finished_before_expiries_were_recorded_is_replayed_from_the_database_until_reaped() {
    let app = TestApp::spawn().await;
    let beside = TestApp::builder().spawn_beside(&app).await;
    let key = new_key();
    let first = app.post_payment(&key, &payment_body()).await.bytes().await.unwrap();
    // As a key finished before migration 000015 (or by a process of the version before) is.
    app.run_sql("UPDATE idempotency_keys SET expires_at = NULL").await;

    let replay = beside.post_payment(&key, &payment_body()).await;

    assert_eq!(replay.headers()["Idempotent-Replayed"], "true");
    assert_eq!(replay.bytes().await.unwrap(), first);
    assert!(!beside.remembers_the_answer_of(&key), "without a recorded expiry, no process keeps it in memory");
    // The reaper's own retention (a day) applies to it, counted from when it finished.
    beside.workers().reaper.run_once().await.unwrap();
    assert!(app.key_row(&key).await.is_some());
    app.run_sql("UPDATE idempotency_keys SET finished_at = now() - interval '25 hours'").await;
    beside.workers().reaper.run_once().await.unwrap();
    assert!(app.key_row(&key).await.is_none());
}

/// Reverts the migrations from `000015` on, so that a test can apply them to a database as it was.
fn revert_to_before_expiries(url: &str) {
    let mut conn = <AsyncConnectionWrapper<AsyncPgConnection> as diesel::Connection>::establish(url).unwrap();
    while conn.applied_migrations().unwrap().iter().any(|version| version.to_string().as_str() >= "20261123000015") {
        conn.revert_last_migration(MIGRATIONS).unwrap();
    }
}

fn migrate(url: &str) -> Result<(), String> {
    let mut conn = <AsyncConnectionWrapper<AsyncPgConnection> as diesel::Connection>::establish(url).unwrap();
    conn.run_pending_migrations(MIGRATIONS).map(|_| ()).map_err(|error| error.to_string())
}

#[tokio::test]
async fn recording_expiries_rewrites_no_table_and_gives_up_rather_than_queue_requests() {
    let database = TestDatabase::create().await;
    let url = database.url.clone();
    tokio::task::spawn_blocking(move || revert_to_before_expiries(&url)).await.unwrap();
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let (account, _) = payments_service::accounts::create(&mut conn, "populated").await.unwrap();
    conn.batch_execute(&format!(
        "INSERT INTO idempotency_keys (id, account_id, idempotency_key, request_method, request_path,
                                       request_fingerprint, request_params, recovery_point, response_status,
                                       response_body, finished_at)
         SELECT gen_random_uuid(), '{}', 'k-' || i, 'POST', '/v1/payments', decode(repeat('00', 32), 'hex'), '{{}}',
                'finished', 201, '{{}}'::bytea, now()
         FROM generate_series(1, 10000) i",
        account.id
    ))
    .await
    .unwrap();
    let filenode = "SELECT pg_relation_filenode('idempotency_keys') AS n";
    #[derive(diesel::QueryableByName, PartialEq, Debug)]
    struct Filenode {
        #[diesel(sql_type = diesel::sql_types::Oid)]
        n: u32,
    }
    let before: Filenode = diesel::sql_query(filenode).get_result(&mut conn).await.unwrap();

    // A long transaction that has read the table: the migration waits for it only so long, and
    // then gives up (while it waits, every request on the table would wait behind it).
    let mut reader = AsyncPgConnection::establish(&database.url).await.unwrap();
    reader.batch_execute("BEGIN; SELECT count(*) FROM idempotency_keys").await.unwrap();
    let url = database.url.clone();
    let migration = tokio::task::spawn_blocking(move || migrate(&url));
    let blocked = tokio::time::timeout(Duration::from_secs(60), migration).await;
    reader.batch_execute("COMMIT").await.unwrap();
    let blocked = blocked.expect("the migration waited behind the transaction instead of giving up").unwrap();
    assert!(blocked.as_ref().is_err_and(|error| error.contains("lock timeout")), "{blocked:?}");

    let url = database.url.clone();
    tokio::task::spawn_blocking(move || migrate(&url)).await.unwrap().unwrap();
    let after: Filenode = diesel::sql_query(filenode).get_result(&mut conn).await.unwrap();
    assert_eq!(before, after, "the table was not rewritten");
    let index_is_valid = "SELECT indisvalid FROM pg_index WHERE indexrelid = 'idempotency_keys_expiry_idx'::regclass";
    assert!(TestApp::database_says_on(&mut conn, index_is_valid).await);
}
