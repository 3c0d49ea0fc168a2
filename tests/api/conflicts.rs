//! Serialization failures and deadlocks inside a phase are run again, not surfaced.

use diesel::prelude::*;
use diesel_async::RunQueryDsl;
use payments_service::db::StoreError;
use payments_service::db::schema::audit_records;
use payments_service::idempotency::{KeyLock, PhaseError, Transition, atomic_phase};

use crate::helpers::{KeyRowId, TestApp, audited_phase};

/// The server-side errors a phase may hit, raised for real (same SQLSTATE, same message).
const CONFLICTS: [(&str, &str); 2] = [
    ("serialization_failure", "could not serialize access due to concurrent update"),
    ("deadlock_detected", "deadlock detected"),
];

/// A phase that writes an audit record, then fails with `conflict` on its first `failures` runs.
async fn phase_failing(
    app: &TestApp,
    lock: &mut KeyLock,
    conflict: (&str, &str),
    failures: usize,
) -> (Result<KeyRowId, PhaseError>, usize) {
    // A sequence counts the runs: its values are not rolled back with them.
    app.run_sql("CREATE SEQUENCE phase_runs").await;
    app.run_sql(&format!(
        "CREATE FUNCTION raise_on_first_runs() RETURNS int LANGUAGE plpgsql AS $$
         BEGIN
             IF nextval('phase_runs') <= {} THEN
                 RAISE EXCEPTION '{}' USING ERRCODE = '{}';
             END IF;
             RETURN 1;
         END $$",
        failures.min(1000),
        conflict.1,
        conflict.0
    ))
    .await;
    // Raised after the audit record is written, so that a failed run has something to roll back.
    let writes = audited_phase(", raised AS (SELECT raise_on_first_runs() FROM audited)", ", raised");
    let transition = Transition::Advance(payments_service::payments::CHARGE_CREATED);
    let result = atomic_phase(&mut app.db().await, app.routing(), lock, transition, writes).await;
    let runs: i64 = diesel::select(diesel::dsl::sql::<diesel::sql_types::BigInt>("last_value FROM phase_runs"))
        .get_result(&mut app.db().await)
        .await
        .unwrap();
    (result, runs as usize)
}

#[tokio::test]
async fn a_phase_that_conflicts_once_runs_again_and_commits_once() {
    for conflict in CONFLICTS {
        let app = TestApp::spawn().await;
        let request = app.key_request();
        let mut lock = request.claim(&app).await;

        let (result, runs) = phase_failing(&app, &mut lock, conflict, 1).await;

        assert_eq!(result.expect("committed").id, lock.key_id, "{conflict:?}");
        assert_eq!(runs, 2);
        let audits: i64 = audit_records::table.count().get_result(&mut app.db().await).await.unwrap();
        assert_eq!(audits, 2, "the claim's record and the phase's, once: the failed run's writes rolled back");
        assert_eq!(lock.recovery_point(), payments_service::payments::CHARGE_CREATED);
        let row = app.key_row(request.key.as_str()).await.unwrap();
        assert_eq!(row.recovery_point, "charge_created", "committed once, by the run that succeeded");
    }
}

#[tokio::test]
async fn a_phase_that_keeps_conflicting_gives_up_as_a_conflict_not_an_internal_error() {
    let app = TestApp::spawn().await;
    let mut lock = app.key_request().claim(&app).await;

    let (result, runs) = phase_failing(&app, &mut lock, CONFLICTS[0], usize::MAX).await;

    assert_eq!(runs, 3);
    let Err(PhaseError::Store(error @ StoreError::Conflict(_))) = result else { panic!("{result:?}") };
    let response = actix_web::ResponseError::error_response(&payments_service::http::ApiError::from(error));
    assert_eq!(response.status().as_u16(), 503, "transient, so never a 500");
    assert!(response.headers().contains_key("retry-after"));
    let body = actix_web::body::to_bytes(response.into_body()).await.unwrap();
    let problem: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(problem["type"], "https://payments.example/problems/transaction-conflict", "{problem}");
}
