//! A request whose lock was taken over can no longer write: its phase rolls back as a whole, and
//! its unlock does not free the new holder's lock; a real server paused after its gateway call, and
//! continued while another holds the key it had, writes nothing. Nor does it call the gateway: a
//! driver paused past its lease makes no call when it wakes. And a lease lasts as long as its owner
//! said, whoever looks at it.

use std::time::Duration;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use nix::sys::signal::Signal;
use payments_service::audit::Actor;
use payments_service::db::schema::audit_records;
use payments_service::idempotency::{PhaseError, Reason, Transition, atomic_phase};
use payments_service::workers::{Outcome, Worker};
use reqwest::{RequestBuilder, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{
    GatewayControl, GatewayStats, KeyRowId, Lock, Process, TestApp, TestDatabase, audited_phase, new_key, payment_body,
    wait_until,
};

#[tokio::test]
async fn a_request_whose_lock_was_taken_over_commits_nothing() {
    let app = TestApp::spawn().await;
    let mut conn = app.db().await;
    let request = app.key_request();
    let key = &request.key;
    let mut first = request.claim(&app).await;
    let audits_before: i64 = audit_records::table.count().get_result(&mut conn).await.unwrap();
    // The first holder stalls past the lock timeout, and a retry takes the key over.
    app.run_sql("UPDATE idempotency_keys SET locked_until = now() - interval '1 second'").await;
    let second = request.claim(&app).await;
    let audits_before = audits_before + 1; // the retry's `taken_over`
    let held_by_second = app.key_row(key.as_str()).await.unwrap();

    // The first holder wakes up and tries to commit a phase: an audit record and a new point.
    let transition = Transition::Advance(payments_service::payments::CHARGE_CREATED);
    let result: Result<KeyRowId, _> =
        atomic_phase(&mut conn, app.routing(), &mut first, transition, audited_phase("", "")).await;

    assert!(matches!(result, Err(PhaseError::LockLost)), "{result:?}");
    let audits: i64 = audit_records::table.count().get_result(&mut conn).await.unwrap();
    assert_eq!(audits, audits_before, "the phase's own writes rolled back with it");
    let row = app.key_row(key.as_str()).await.unwrap();
    assert_eq!(row.recovery_point, "started");
    assert_eq!(row.lock_token, held_by_second.lock_token);

    // Its attempt to unlock is fenced too: the second holder keeps the key.
    let stalled = Reason { code: "lock_lost", detail: "stalled" };
    first.release(&mut conn, Actor::Api, stalled, &request.request_id).await.unwrap();
    assert_eq!(app.key_row(key.as_str()).await.unwrap().lock_token, held_by_second.lock_token);
    let done = Reason { code: "internal", detail: "done with it" };
    second.release(&mut conn, Actor::Api, done, &request.request_id).await.unwrap();
    assert!(app.key_row(key.as_str()).await.unwrap().lock_token.is_none());
}

#[tokio::test]
async fn a_taker_keeps_to_the_owners_lease_not_to_its_own_lock_timeout() {
    // A server with a long lock timeout claimed the key 40 s ago; its lease has 50 s to go.
    let app = TestApp::builder()
        .lock_timeout(Duration::from_secs(36))
        .workers(|w| w.completer_backoff = Duration::ZERO)
        .spawn()
        .await;
    let key = new_key();
    app.seed_key(&key, &payment_body(), "started", Lock::EndsIn(50)).await;
    app.run_sql("UPDATE idempotency_keys SET last_run_at = now() - interval '40 seconds'").await;

    // A worker and a retry whose own lock timeout (36 s) is shorter than that age leave it be.
    assert_eq!(app.workers().completer.run_once().await.unwrap(), Outcome::Idle);
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::CONFLICT);
    assert_eq!(app.gateway.stats().await.requests, 0);
}

/// Two `serve` processes on one database, charging at one gateway process, that honour a
/// request's `X-Fault-Inject`; their lease short enough for a test to wait out.
struct TwoServers {
    api_key: String,
    control: GatewayControl,
    first: Process,
    second: Process,
    _gateway: Process,
    database: TestDatabase,
}

impl TwoServers {
    async fn start() -> TwoServers {
        let database = TestDatabase::create().await;
        let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
        let (_, api_key) = payments_service::accounts::create(&mut conn, "paused").await.unwrap();
        let gateway = Process::gateway().await;
        let control = GatewayControl::new(&gateway.url);
        let env = [
            ("PAYMENTS_FAULT_INJECTION", "1"),
            ("PAYMENTS_GATEWAY_TIMEOUT_MS", "500"),
            ("PAYMENTS_LOCK_TIMEOUT_MS", "11000"),
        ];
        let first = Process::serve(&database.url, &gateway.url, &["--no-workers"], &env).await;
        let second = Process::serve(&database.url, &gateway.url, &["--no-workers"], &env).await;
        TwoServers { api_key, control, first, second, _gateway: gateway, database }
    }

    /// `POST <path>` of `body` under `key` at `server`, asking for `fault` if any.
    fn post(&self, server: &Process, path: &str, key: &str, body: &Value, fault: Option<&str>) -> RequestBuilder {
        let request = reqwest::Client::new().post(format!("{}{path}", server.url)).bearer_auth(&self.api_key);
        let request = request.header("Idempotency-Key", key).json(body);
        match fault {
            Some(fault) => request.header("X-Fault-Inject", fault),
            None => request,
        }
    }

    /// Waits until the first server has stopped itself at its pause, and its lease on the key it
    /// holds is over by the database's clock.
    async fn wait_until_the_first_is_paused_past_its_lease(&self) {
        wait_until(Duration::from_secs(10), "the first server is stopped", || async { self.first.is_stopped() }).await;
        wait_until(Duration::from_secs(15), "the first server's lease is over", || async {
            let mut conn = AsyncPgConnection::establish(&self.database.url).await.unwrap();
            let over = diesel::sql_query("SELECT FROM idempotency_keys WHERE locked_until < now()");
            over.execute(&mut conn).await.unwrap() == 1
        })
        .await;
    }

    /// Every row that a request's phases write, table by table: payments, refunds, audit records,
    /// the outbox's staged jobs and the key rows.
    async fn rows_written(&self) -> Vec<(&'static str, Vec<String>)> {
        #[derive(QueryableByName)]
        struct Row {
            #[diesel(sql_type = diesel::sql_types::Text)]
            row: String,
        }
        let mut conn = AsyncPgConnection::establish(&self.database.url).await.unwrap();
        let mut tables = Vec::new();
        for table in ["payments", "refunds", "audit_records", "events", "idempotency_keys"] {
            let rows: Vec<Row> = diesel::sql_query(format!("SELECT t::text AS row FROM {table} t ORDER BY 1"))
                .load(&mut conn)
                .await
                .unwrap();
            tables.push((table, rows.into_iter().map(|row| row.row).collect()));
        }
        tables
    }
}

#[tokio::test]
async fn a_driver_paused_past_its_lease_makes_no_gateway_call_when_it_wakes() {
    let servers = TwoServers::start().await;
    let (key, body) = (new_key(), payment_body());

    // The first server commits `started` and stops dead before its gateway call (a frozen VM).
    let stalled =
        tokio::spawn(servers.post(&servers.first, "/v1/payments", &key, &body, Some("pause=after_started")).send());
    // Its lease runs out; the retry, at the second server, takes the key over and charges.
    servers.wait_until_the_first_is_paused_past_its_lease().await;
    let retry = servers.post(&servers.second, "/v1/payments", &key, &body, None).send().await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    // The gateway forgets its keys (its own retention), so a second charge request would charge.
    servers.control.forget_keys().await;

    servers.first.signal(Signal::SIGCONT);
    let woken = stalled.await.unwrap().unwrap();

    assert_eq!(woken.status(), StatusCode::SERVICE_UNAVAILABLE, "it stops without calling");
    let stats = servers.control.stats().await;
    assert_eq!(stats, GatewayStats { charges: 1, declined: 0, requests: 1, look_ups: 1, faults: 0 });
}

/// Sends `body` to `path` at the first server, which stops itself at `pause`, after its gateway
/// call and before it records the answer. Once its lease is over, the retry at the second server
/// takes the key over and stops at the same point, holding the key. The first is continued, and
/// must write nothing; then the second, which finishes the request. Returns the first's answer.
async fn woken_after_a_take_over(servers: &TwoServers, path: &str, body: &Value, pause: &str) -> reqwest::Response {
    let key = new_key();
    let first = tokio::spawn(servers.post(&servers.first, path, &key, body, Some(pause)).send());
    servers.wait_until_the_first_is_paused_past_its_lease().await;
    let second = tokio::spawn(servers.post(&servers.second, path, &key, body, Some(pause)).send());
    wait_until(Duration::from_secs(10), "the second server is stopped", || async { servers.second.is_stopped() }).await;
    let before = servers.rows_written().await;

    servers.first.signal(Signal::SIGCONT);
    let woken = first.await.unwrap().unwrap();

    // Its phases carry the lock token it no longer holds; nothing else would stop their writes,
    // since the second has recorded nothing yet.
    for ((table, rows), (_, rows_before)) in servers.rows_written().await.iter().zip(&before) {
        assert_eq!(rows, rows_before, "{table} once the first server woke");
    }
    servers.second.signal(Signal::SIGCONT);
    assert_eq!(second.await.unwrap().unwrap().status(), StatusCode::CREATED, "the second finishes the request");
    woken
}

#[tokio::test]
async fn a_server_paused_after_the_charge_writes_nothing_once_its_key_was_taken_over() {
    let servers = TwoServers::start().await;

    let woken = woken_after_a_take_over(&servers, "/v1/payments", &payment_body(), "pause=after_charge").await;

    assert_eq!(woken.status(), StatusCode::CONFLICT, "its lock was taken over");
    assert_eq!(servers.control.stats().await.charges, 1);
}

#[tokio::test]
async fn a_server_paused_after_the_refund_writes_nothing_once_its_key_was_taken_over() {
    let servers = TwoServers::start().await;
    let paid = servers.post(&servers.second, "/v1/payments", &new_key(), &payment_body(), None).send().await.unwrap();
    let payment: Value = paid.json().await.unwrap();
    let body = json!({ "payment": payment["id"], "amount": 400 });

    let woken = woken_after_a_take_over(&servers, "/v1/refunds", &body, "pause=after_refund").await;

    assert_eq!(woken.status(), StatusCode::CONFLICT, "its lock was taken over");
    let stats = servers.control.all_stats().await;
    assert_eq!((stats["refunds"].as_u64(), stats["refunded_amount"].as_u64()), (Some(1), Some(400)));
}

#[tokio::test]
async fn each_phase_renews_the_lease_for_the_owners_lock_timeout() {
    // The database's clock an hour ahead of the app's: a lease counted from the app's clock would
    // have ended long ago by the database's.
    let database = TestDatabase::with_clock_ahead("1 hour").await;
    let app = TestApp::builder().lock_timeout(Duration::from_secs(60)).spawn_on(database).await;
    let mut conn = app.db().await;
    let request = app.key_request();
    let mut lock = request.claim(&app).await;
    // The lease is nearly over when the phase commits.
    app.run_sql("UPDATE idempotency_keys SET locked_until = now() + interval '1 second'").await;

    let transition = Transition::Advance(payments_service::payments::CHARGE_CREATED);
    let _: KeyRowId =
        atomic_phase(&mut conn, app.routing(), &mut lock, transition, audited_phase("", "")).await.unwrap();

    let renewed = "SELECT locked_until > now() + interval '50 seconds' AND locked_until <= now() + interval '60 seconds' \
                   FROM idempotency_keys";
    assert!(app.database_says(renewed).await, "the phase renewed it by its lock timeout, from the database's now()");
    let row = app.key_row(request.key.as_str()).await.unwrap();
    assert_eq!((row.recovery_point.as_str(), row.lock_token.is_some()), ("charge_created", true), "still held");
}
