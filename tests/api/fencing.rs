//! A request whose lock was taken over can no longer write: its phase rolls back as a whole, and
//! its unlock does not free the new holder's lock. Nor does it call the gateway: a driver paused
//! past its lease makes no call when it wakes. And a lease lasts as long as its owner said, whoever
//! looks at it.

use std::time::Duration;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use payments::audit::Actor;
use payments::db::schema::audit_records;
use payments::idempotency::{PhaseError, Reason, RecoveryPoint, Transition, atomic_phase};
use payments::workers::{Outcome, Worker};
use reqwest::StatusCode;

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
    let transition = Transition::Advance(RecoveryPoint::ChargeCreated);
    let result: Result<KeyRowId, _> = atomic_phase(&mut conn, &mut first, transition, audited_phase("", "")).await;

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

#[tokio::test]
async fn a_driver_paused_past_its_lease_makes_no_gateway_call_when_it_wakes() {
    let database = TestDatabase::create().await;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let (_, api_key) = payments::accounts::create(&mut conn, "paused").await.unwrap();
    let gateway = Process::gateway().await;
    let control = GatewayControl::new(&gateway.url);
    let env = [
        ("PAYMENTS_FAULT_INJECTION", "1"),
        ("PAYMENTS_GATEWAY_TIMEOUT_MS", "500"),
        ("PAYMENTS_LOCK_TIMEOUT_MS", "11000"),
    ];
    let first = Process::serve(&database.url, &gateway.url, &["--no-workers"], &env).await;
    let second = Process::serve(&database.url, &gateway.url, &["--no-workers"], &env).await;
    let key = new_key();
    let pay = |server: &str, fault: Option<&'static str>| {
        let mut request = reqwest::Client::new()
            .post(format!("{server}/v1/payments"))
            .bearer_auth(&api_key)
            .header("Idempotency-Key", &key)
            .json(&payment_body());
        if let Some(fault) = fault {
            request = request.header("X-Fault-Inject", fault);
        }
        request.send()
    };

    // The first server commits `started` and stops dead before its gateway call (a frozen VM).
    let stalled = tokio::spawn(pay(&first.url, Some("pause=after_started")));
    wait_until(Duration::from_secs(10), "the first server is stopped", || async { first.is_stopped() }).await;
    // Its lease runs out; the retry, at the second server, takes the key over and charges.
    wait_until(Duration::from_secs(15), "the first server's lease is over", || async {
        let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
        diesel::sql_query("SELECT FROM idempotency_keys WHERE locked_until < now()").execute(&mut conn).await.unwrap()
            == 1
    })
    .await;
    let retry = pay(&second.url, None).await.unwrap();
    assert_eq!(retry.status(), StatusCode::CREATED);
    // The gateway forgets its keys (its own retention), so a second charge request would charge.
    control.forget_keys().await;

    first.signal(nix::sys::signal::Signal::SIGCONT);
    let woken = stalled.await.unwrap().unwrap();

    assert_eq!(woken.status(), StatusCode::SERVICE_UNAVAILABLE, "it stops without calling");
    assert_eq!(control.stats().await, GatewayStats { charges: 1, declined: 0, requests: 1, look_ups: 1, faults: 0 });
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

    let transition = Transition::Advance(RecoveryPoint::ChargeCreated);
    let _: KeyRowId = atomic_phase(&mut conn, &mut lock, transition, audited_phase("", "")).await.unwrap();

    let renewed = "SELECT locked_until > now() + interval '50 seconds' AND locked_until <= now() + interval '60 seconds' \
                   FROM idempotency_keys";
    assert!(app.database_says(renewed).await, "the phase renewed it by its lock timeout, from the database's now()");
    let row = app.key_row(request.key.as_str()).await.unwrap();
    assert_eq!((row.recovery_point.as_str(), row.lock_token.is_some()), ("charge_created", true), "still held");
}
