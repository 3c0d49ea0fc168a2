//! A request whose lock was taken over can no longer write: its phase rolls back as a whole, and
//! its unlock does not free the new holder's lock.

use diesel::prelude::*;
use diesel_async::RunQueryDsl;
use payments::audit::Actor;
use payments::db::schema::audit_records;
use payments::idempotency::{PhaseError, RecoveryPoint, Transition, atomic_phase};

use crate::helpers::{TestApp, an_audit_record};

#[tokio::test]
async fn a_request_whose_lock_was_taken_over_commits_nothing() {
    let app = TestApp::spawn().await;
    let mut conn = app.db().await;
    let request = app.key_request();
    let key = &request.key;
    let mut first = request.claim(&app).await;
    // The first holder stalls past the lock timeout, and a retry takes the key over.
    app.run_sql("UPDATE idempotency_keys SET locked_at = now() - interval '61 seconds'").await;
    let second = request.claim(&app).await;
    let held_by_second = app.key_row(key.as_str()).await.unwrap();

    // The first holder wakes up and tries to commit a phase: an audit record and a new point.
    let result = atomic_phase(&mut conn, &mut first, async |conn| {
        let record = an_audit_record(app.account_id);
        record.insert(conn).await?;
        Ok((Transition::Advance(RecoveryPoint::ChargeCreated), ()))
    })
    .await;

    assert!(matches!(result, Err(PhaseError::LockLost)), "{result:?}");
    let audits: i64 = audit_records::table.count().get_result(&mut conn).await.unwrap();
    assert_eq!(audits, 0, "the phase's own writes rolled back with it");
    let row = app.key_row(key.as_str()).await.unwrap();
    assert_eq!(row.recovery_point, "started");
    assert_eq!(row.lock_token, held_by_second.lock_token);

    // Its attempt to unlock is fenced too: the second holder keeps the key.
    first.release(&mut conn, Actor::Api, "stalled").await.unwrap();
    assert_eq!(app.key_row(key.as_str()).await.unwrap().lock_token, held_by_second.lock_token);
    second.release(&mut conn, Actor::Api, "done with it").await.unwrap();
    assert!(app.key_row(key.as_str()).await.unwrap().lock_token.is_none());
}
