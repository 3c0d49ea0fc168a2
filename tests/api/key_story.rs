//! `GET /v1/idempotency_keys?key=`: a key's whole story, at each recovery point, for its own
//! account only.

use std::time::Duration;

use payments_service::story::TRAIL_LIMIT;
use payments_service::workers::Worker;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Lock, TestApp, TestDatabase, new_key, payment_body};

/// The story of `key`, which must exist.
async fn story(app: &TestApp, key: &str) -> Value {
    let response = app.key_story(key).await;
    assert_eq!(response.status(), StatusCode::OK);
    response.json().await.unwrap()
}

/// The trail of a payment whose first request's answer was lost (`error_after`) and whose retry
/// finished it: released, then resumed, its charge found and adopted.
pub(crate) const ERROR_AFTER_TRAIL: [&str; 6] = [
    "idempotency_key.claimed",
    "payment.created",
    "idempotency_key.released",
    "idempotency_key.resumed",
    "payment.charge_recorded",
    "payment.finished",
];

/// The trail's actions, in order.
pub(crate) fn actions(story: &Value) -> Vec<&str> {
    story["trail"].as_array().unwrap().iter().map(|entry| entry["action"].as_str().unwrap()).collect()
}

#[tokio::test]
async fn a_finished_key_tells_every_phase_with_the_request_that_committed_it() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let response = app.post_payment(&key, &payment_body()).await;
    let request_id = response.headers()["request-id"].to_str().unwrap().to_owned();
    let payment: Value = response.json().await.unwrap();

    let story = story(&app, &key).await;

    assert_eq!(story["object"], "idempotency_key");
    assert_eq!(story["key"], key);
    assert_eq!(story["recovery_point"], "finished");
    assert_eq!(story["locked"], false);
    assert!(story["locked_until"].is_null() && story["finished_at"].is_string() && story["created_at"].is_string());
    assert!(story["expires_at"].as_str() > story["finished_at"].as_str(), "{story}");
    assert_eq!(story["trail_has_more"], false);
    assert_eq!(story["response_status"], 201);
    assert_eq!(story["needs_attention"], false);
    assert_eq!(story["reaped"], false);
    let mut shown = payment.clone();
    shown.as_object_mut().unwrap().remove("failure_message");
    assert_eq!(story["payment"], shown, "the payment as the API shows it, but for the gateway's words");
    assert_eq!(
        actions(&story),
        ["idempotency_key.claimed", "payment.created", "payment.charge_recorded", "payment.finished"]
    );
    let trail = story["trail"].as_array().unwrap();
    assert!(trail.iter().all(|entry| entry["request_id"] == request_id && entry["actor"] == "api"), "{story}");
    let points: Vec<&Value> = trail[1..].iter().map(|entry| &entry["data"]["recovery_point"]).collect();
    assert_eq!(points, ["started", "charge_created", "finished"]);
    assert_eq!(trail[2]["data"]["answered_by"], "charge");
}

#[tokio::test]
async fn the_error_after_walkthrough_shows_release_resumption_and_adoption() {
    let app = TestApp::spawn().await;
    let key = new_key();
    app.gateway.fault("error_after", 1).await;
    let first = app.post_payment(&key, &payment_body()).await;
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);

    let unknown = story(&app, &key).await;
    assert_eq!(unknown["recovery_point"], "started");
    assert_eq!(unknown["locked"], false);
    assert_eq!(unknown["payment"]["status"], "pending");
    assert!(unknown["response_status"].is_null());
    let released = &unknown["trail"][2];
    assert_eq!(released["action"], "idempotency_key.released");
    assert_eq!(released["data"]["reason_code"], "unknown_outcome", "{released}");
    assert!(released["data"].get("reason").is_none(), "the error's own text is for operators");
    assert!(unknown["trail"][1]["data"].get("gateway").is_none(), "so is the gateway's identity");

    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::CREATED);
    let story = story(&app, &key).await;
    assert_eq!(actions(&story), ERROR_AFTER_TRAIL);
    assert_eq!(story["trail"][4]["data"]["answered_by"], "look_up", "the charge was found and adopted");
    assert_eq!(app.gateway.stats().await.charges, 1);
}

#[tokio::test]
async fn a_key_held_at_charge_created_is_locked_until_its_lease_ends() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let key_id = app.seed_key(&key, &payment_body(), "charge_created", Lock::Live).await;
    app.seed_payment(key_id, &key, "succeeded", Some("ch_seeded")).await;

    let story = story(&app, &key).await;

    assert_eq!(story["recovery_point"], "charge_created");
    assert_eq!(story["locked"], true);
    assert!(story["locked_until"].is_string());
    assert_eq!(story["payment"]["gateway_charge_id"], "ch_seeded");
    assert!(story["response_status"].is_null());
}

#[tokio::test]
async fn a_key_the_completer_gave_up_on_says_why() {
    let app = TestApp::builder()
        .workers(|w| {
            w.completer_backoff = Duration::ZERO;
            w.completer_max_attempts = 1;
        })
        .spawn()
        .await;
    let key = new_key();
    app.seed_key(&key, &payment_body(), "charge_created", Lock::Free).await;

    // At `charge_created` without a payment: the completer cannot finish it.
    app.workers().completer.run_once().await.unwrap();
    let story = story(&app, &key).await;

    assert_eq!(story["needs_attention"], true);
    assert_eq!(story["attention_reason"], "internal", "{story}");
    assert!(!story.to_string().contains("without a payment"), "the error's text is for operators");
    assert_eq!(story["completer_attempts"], 1);
    let trail = actions(&story);
    assert_eq!(trail, ["idempotency_key.taken_over", "idempotency_key.released", "idempotency_key.needs_attention"]);
    let runs: Vec<&Value> = story["trail"].as_array().unwrap().iter().map(|entry| &entry["request_id"]).collect();
    assert!(runs.iter().all(|run| *run == runs[0] && run.is_string()), "one completer run wrote them all");
}

#[tokio::test]
async fn a_reaped_key_still_tells_its_story_through_its_payment() {
    let app = TestApp::builder().key_retention(Duration::ZERO).spawn().await;
    let key = new_key();
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::CREATED);
    app.workers().reaper.run_once().await.unwrap();
    assert!(app.key_row(&key).await.is_none());

    let story = story(&app, &key).await;

    assert_eq!(story["reaped"], true);
    assert_eq!(story["recovery_point"], "finished");
    assert_eq!(story["response_status"], 201);
    assert_eq!(story["payment"]["status"], "succeeded");
    assert_eq!(actions(&story).last(), Some(&"idempotency_key.reaped"));
    assert_eq!(actions(&story).len(), 5);
}

#[tokio::test]
async fn a_key_is_its_accounts_alone() {
    let app = TestApp::spawn().await;
    let other = app.create_account("other").await;
    let key = new_key();
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::CREATED);

    let response = app.key_story_as(&other, &key).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "https://payments.example/problems/idempotency-key-not-found");
    assert_eq!(app.key_story(&key).await.status(), StatusCode::OK);
    assert_eq!(app.key_story_as("sk_nobody", &key).await.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_key_is_named_exactly_and_must_be_a_valid_key() {
    let app = TestApp::spawn().await;
    let key = " \"quoted and spaced\" ";
    let quoted = "\" \\\"quoted and spaced\\\" \"";
    let headers = [("Idempotency-Key", quoted), ("Content-Type", "application/json")];
    let response = app.post_payment_raw(Some(&app.api_key), &headers, payment_body().to_string()).await;
    assert_eq!(response.status(), StatusCode::CREATED);

    assert_eq!(story(&app, key).await["key"], key, "the key as meant, URL-encoded in the query");
    for invalid in ["", &"k".repeat(256), "tab\there"] {
        assert_eq!(app.key_story(invalid).await.status(), StatusCode::BAD_REQUEST, "{invalid:?}");
    }
    let no_key = app.get("/v1/idempotency_keys").await;
    assert_eq!(no_key.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_long_trail_is_read_a_page_at_a_time() {
    let app = TestApp::spawn().await;
    let key = new_key();
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::CREATED);
    // A client that kept retrying through an outage: 123 more runs released and resumed.
    let key_id = app.key_row(&key).await.unwrap().id;
    app.run_sql(&format!(
        "INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data)
         SELECT '{}', CASE WHEN i % 2 = 1 THEN 'idempotency_key.released' ELSE 'idempotency_key.resumed' END,
                'idempotency_key', '{key_id}', 'api', '{{\"recovery_point\": \"started\"}}'
         FROM generate_series(1, 246) i",
        app.account_id
    ))
    .await;

    let (mut read, mut pages, mut after) = (Vec::new(), Vec::new(), 0);
    loop {
        let page = app.get(&format!("/v1/idempotency_keys?key={key}&trail_after={after}")).await;
        assert_eq!(page.status(), StatusCode::OK);
        let page: Value = page.json().await.unwrap();
        assert_eq!(page["response_status"], 201, "every page tells where the key stands");
        let trail = page["trail"].as_array().unwrap();
        pages.push(trail.len());
        read.extend(trail.iter().map(|entry| entry["action"].as_str().unwrap().to_owned()));
        if page["trail_has_more"] != true {
            break;
        }
        after += trail.len();
    }

    let limit = TRAIL_LIMIT as usize;
    assert_eq!(pages, [limit, limit, 250 - 2 * limit], "at most {limit} records an answer");
    let whole: Vec<String> = app.audit_trail().await.into_iter().map(|(action, _)| action).collect();
    assert_eq!(read, whole, "the pages, in order, are the whole trail");
    let past_the_end: Value =
        app.get(&format!("/v1/idempotency_keys?key={key}&trail_after=1000")).await.json().await.unwrap();
    assert_eq!(past_the_end["trail"], json!([]));
    assert_eq!(past_the_end["trail_has_more"], false);
    for invalid in ["-1", "x", "4294967296", ""] {
        let response = app.get(&format!("/v1/idempotency_keys?key={key}&trail_after={invalid}")).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "trail_after={invalid}");
    }

    // Reaped, its story still sums up the whole trail on every page (the claim and the finish
    // are on the first, the reaping on the last).
    app.run_sql("UPDATE idempotency_keys SET expires_at = now()").await;
    app.workers().reaper.run_once().await.unwrap();
    let last: Value = app.get(&format!("/v1/idempotency_keys?key={key}&trail_after=200")).await.json().await.unwrap();
    assert_eq!(last["reaped"], true);
    assert_eq!(last["response_status"], 201);
    assert!(last["created_at"].is_string() && last["finished_at"].is_string(), "{last}");
    assert_eq!(actions(&last).last(), Some(&"idempotency_key.reaped"));
}

#[tokio::test]
async fn whether_a_key_is_locked_is_the_databases_call_not_the_apps_clock() {
    // A database whose clock is an hour ahead of the app's (say, after a failover to a host whose
    // clock differs).
    let app = TestApp::builder().spawn_on(TestDatabase::with_clock_ahead("1 hour").await).await;
    let (ran_out, held) = (new_key(), new_key());
    app.seed_key(&ran_out, &payment_body(), "started", Lock::Free).await;
    app.seed_key(&held, &payment_body(), "started", Lock::Free).await;
    // Leases as the database sets them: one that ran out a minute ago by its clock (and ends in
    // 59 minutes by the app's), one with a minute left.
    for (key, end) in [(&ran_out, "- interval '1 minute'"), (&held, "+ interval '1 minute'")] {
        app.run_sql(&format!(
            "UPDATE idempotency_keys SET locked_until = now() {end}, lock_token = gen_random_uuid()
             WHERE idempotency_key = '{key}'"
        ))
        .await;
    }

    assert_eq!(story(&app, &ran_out).await["locked"], false, "its lease ran out: nobody holds it");
    assert_eq!(story(&app, &held).await["locked"], true);
}

#[tokio::test]
async fn a_declined_payments_story_shows_its_code_never_the_gateways_words() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let body = json!({ "amount": 500, "currency": "usd", "source": "tok_chargeDeclined" });
    let declined = app.post_payment(&key, &body).await;
    assert_eq!(declined.status(), StatusCode::PAYMENT_REQUIRED);
    let declined: Value = declined.json().await.unwrap();
    let words = declined["payment"]["failure_message"].as_str().expect("the API shows the gateway's message");

    let story = story(&app, &key).await;

    assert_eq!(story["payment"]["status"], "failed");
    assert_eq!(story["payment"]["failure_code"], declined["payment"]["failure_code"]);
    assert!(story["payment"].get("failure_message").is_none(), "{story}");
    assert!(!story.to_string().contains(words), "{story}");
}

#[tokio::test]
async fn a_record_written_late_in_a_long_transaction_is_told_after_what_was_written_meanwhile() {
    use diesel_async::{AsyncConnection, RunQueryDsl};
    let app = TestApp::spawn().await;
    let (account, resource) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    let account_row = format!(
        "INSERT INTO accounts (id, name, api_key_hash) VALUES ('{account}', 'late', sha256('{account}'::text::bytea))"
    );
    app.run_sql(&account_row).await;
    let record = |action: &str| {
        format!(
            "INSERT INTO audit_records (account_id, action, resource_type, resource_id, actor, data)
             VALUES ('{account}', '{action}', 'payment', '{resource}', 'gateway', '{{}}')"
        )
    };
    // A transaction (a gateway event's, say) begins, another writes meanwhile, then it writes.
    let mut long = app.db().await;
    long.transaction::<_, diesel::result::Error, _>(async |long| {
        diesel::sql_query("SELECT 1").execute(long).await?;
        app.run_sql(&record("payment.written_meanwhile")).await;
        diesel::sql_query(record("payment.written_late")).execute(long).await?;
        Ok(())
    })
    .await
    .unwrap();

    let trail =
        payments_service::audit::trail(&mut app.db().await, account, &[("payment", resource)], 0, 10).await.unwrap();
    let actions: Vec<&str> = trail.iter().map(|entry| entry.action.as_str()).collect();
    assert_eq!(actions, ["payment.written_meanwhile", "payment.written_late"]);
}
