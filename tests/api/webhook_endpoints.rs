//! Webhook endpoints: made by a keyed `POST` of the layer's other shape (claimed, written and
//! finished in one statement, its secret shown by that answer and its replay alone), read, listed,
//! changed and deleted, each refusal with its problem type and nothing stored, another account's
//! never found.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, new_key, record_statements, statements};

async fn create(app: &TestApp, key: &str, body: &Value) -> reqwest::Response {
    let url = format!("{}/v1/webhook_endpoints", app.address);
    let request = app.http.post(url).bearer_auth(&app.api_key).header("Idempotency-Key", key);
    request.json(body).send().await.unwrap()
}

async fn update_as(app: &TestApp, api_key: &str, id: &str, body: &Value) -> reqwest::Response {
    let url = format!("{}/v1/webhook_endpoints/{id}", app.address);
    app.http.post(url).bearer_auth(api_key).json(body).send().await.unwrap()
}

async fn delete_as(app: &TestApp, api_key: &str, id: &str) -> reqwest::Response {
    let url = format!("{}/v1/webhook_endpoints/{id}", app.address);
    app.http.delete(url).bearer_auth(api_key).send().await.unwrap()
}

async fn json_of(response: reqwest::Response, status: StatusCode) -> Value {
    let got = response.status();
    let body: Value = response.json().await.unwrap();
    assert_eq!(got, status, "{body}");
    body
}

fn problem_type(problem: &Value) -> &str {
    problem["type"].as_str().unwrap().rsplit('/').next().unwrap()
}

fn endpoint_body() -> Value {
    json!({ "url": "http://127.0.0.1:9/hooks", "enabled_events": ["payment.succeeded", "refund.succeeded"] })
}

/// Rows that a refusal must not have written: key rows and endpoints.
async fn stored(app: &TestApp) -> (bool, bool) {
    (
        app.database_says("EXISTS (SELECT FROM idempotency_keys)").await,
        app.database_says("EXISTS (SELECT FROM webhook_endpoints)").await,
    )
}

#[tokio::test]
async fn an_endpoint_is_made_once_per_key_and_its_secret_shown_by_that_answer_alone() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let body = json!({ "url": "http://127.0.0.1:9/hooks", "enabled_events": ["refund.failed", "payment.succeeded"],
                       "description": "the shop" });

    let first = create(&app, &key, &body).await;
    assert_eq!(first.status(), StatusCode::CREATED);
    let first_bytes = first.bytes().await.unwrap();
    let made: Value = serde_json::from_slice(&first_bytes).unwrap();
    let id = made["id"].as_str().unwrap();
    assert!(id.starts_with("we_") && id.len() == 35, "{id}");
    assert_eq!(made["object"], "webhook_endpoint");
    assert_eq!(made["url"], "http://127.0.0.1:9/hooks");
    assert_eq!(made["enabled_events"], json!(["payment.succeeded", "refund.failed"]), "sorted, as stored");
    assert_eq!(made["description"], "the shop");
    assert_eq!(made["status"], "enabled");
    assert_eq!(made["disabled_reason"], Value::Null);
    let secret = made["secret"].as_str().unwrap();
    let bytes = payments_wire::standard_webhooks::SigningSecret::parse(secret).unwrap();
    assert_eq!(bytes.as_bytes().len(), 32);

    // The replay is the same answer, byte for byte, the same secret in it; another body is a 422.
    let replay = create(&app, &key, &body).await;
    assert_eq!(replay.headers()["idempotent-replayed"], "true");
    assert_eq!(replay.bytes().await.unwrap(), first_bytes);
    let other = json!({ "url": "http://127.0.0.1:9/other", "enabled_events": ["*"] });
    let reused = json_of(create(&app, &key, &other).await, StatusCode::UNPROCESSABLE_ENTITY).await;
    assert_eq!(problem_type(&reused), "idempotency-key-reused");
    assert!(app.database_says("(SELECT count(*) = 1 FROM webhook_endpoints)").await);

    // Every other read shows the endpoint as made, without its secret.
    let read = json_of(app.get(&format!("/v1/webhook_endpoints/{id}")).await, StatusCode::OK).await;
    let mut shown = made.clone();
    shown.as_object_mut().unwrap().remove("secret");
    assert_eq!(read, shown);
    let listed = json_of(app.get("/v1/webhook_endpoints").await, StatusCode::OK).await;
    assert_eq!(listed["data"], json!([shown]));
    let story = app.key_story(&key).await.text().await.unwrap();
    assert!(story.contains(id) && !story.contains("whsec_"), "{story}");
    let trail = app.audit_trail().await;
    assert!(trail.contains(&("webhook_endpoint.created".to_owned(), "api".to_owned())), "{trail:?}");
}

#[tokio::test]
async fn an_endpoint_is_claimed_written_and_finished_in_one_statement_or_not_at_all() {
    record_statements();
    let app = TestApp::spawn().await;
    let database = app.database.name.clone();
    // Authenticated once, beforehand.
    json_of(app.get("/v1/webhook_endpoints").await, StatusCode::OK).await;
    let before = statements(&database).executed.len();

    let key = new_key();
    assert_eq!(create(&app, &key, &endpoint_body()).await.status(), StatusCode::CREATED);
    let ran = statements(&database).executed;
    assert_eq!(ran.len() - before, 1, "{:#?}", &ran[before..]);
    assert!(
        app.database_says("(SELECT recovery_point = 'finished' AND locked_until IS NULL FROM idempotency_keys)").await
    );

    // A statement that cannot write the endpoint (a check that refuses every new row, for the
    // test) writes nothing: no key is left behind, and the retry makes the endpoint.
    app.run_sql("ALTER TABLE webhook_endpoints ADD CONSTRAINT refuse_all CHECK (false) NOT VALID").await;
    let refused = new_key();
    assert_eq!(create(&app, &refused, &endpoint_body()).await.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let key_left = format!("EXISTS (SELECT FROM idempotency_keys WHERE idempotency_key = '{refused}')");
    assert!(!app.database_says(&key_left).await, "nothing of the request is stored");
    app.run_sql("ALTER TABLE webhook_endpoints DROP CONSTRAINT refuse_all").await;
    assert_eq!(create(&app, &refused, &endpoint_body()).await.status(), StatusCode::CREATED);
    assert!(app.database_says("(SELECT count(*) = 2 FROM webhook_endpoints)").await);
}

#[tokio::test]
async fn every_refusal_has_its_problem_type_and_stores_nothing() {
    let app = TestApp::spawn().await;
    let long = "d".repeat(501);
    let refusals = [
        (json!({ "url": "ftp://shop.example/", "enabled_events": ["*"] }), "invalid-webhook-url"),
        (json!({ "url": "https://user:pw@shop.example/", "enabled_events": ["*"] }), "invalid-webhook-url"),
        (json!({ "url": "not a url", "enabled_events": ["*"] }), "invalid-webhook-url"),
        (json!({ "url": "http://127.0.0.2/", "enabled_events": ["*"] }), "webhook-url-not-allowed"),
        (json!({ "url": "http://[::ffff:127.0.0.2]/", "enabled_events": ["*"] }), "webhook-url-not-allowed"),
        (json!({ "url": "http://0x7f.0.0.2/", "enabled_events": ["*"] }), "webhook-url-not-allowed"),
        (json!({ "url": "http://127.0.0.1/", "enabled_events": ["payment.paid"] }), "unknown-event-type"),
        (json!({ "url": "http://127.0.0.1/", "enabled_events": [] }), "invalid-request"),
        (json!({ "url": "http://127.0.0.1/", "enabled_events": ["*", "payment.failed"] }), "invalid-request"),
        (json!({ "url": "http://127.0.0.1/", "enabled_events": ["*"], "description": long }), "invalid-request"),
        (json!({ "url": "http://127.0.0.1/", "enabled_events": ["*"], "description": "a\u{0}b" }), "invalid-request"),
        (json!({ "url": "http://127.0.0.1/", "enabled_events": ["*"], "secret": "whsec_mine" }), "malformed-body"),
        (json!({ "url": "http://127.0.0.1/", "enabled_events": ["*"], "description": null }), "malformed-body"),
        (json!({ "enabled_events": ["*"] }), "malformed-body"),
        (json!(["http://127.0.0.1/", ["*"]]), "malformed-body"),
    ];
    for (body, expected) in refusals {
        let problem = json_of(create(&app, &new_key(), &body).await, StatusCode::BAD_REQUEST).await;
        assert_eq!(problem_type(&problem), expected, "{body}");
    }
    assert_eq!(stored(&app).await, (false, false));
}

#[tokio::test]
async fn an_update_sets_what_it_sends_and_a_status_sent_clears_the_reason() {
    let app = TestApp::spawn().await;
    let made = json_of(
        create(
            &app,
            &new_key(),
            &json!({ "url": "http://127.0.0.1:9/a", "enabled_events": ["*"],
                                                          "description": "first" }),
        )
        .await,
        StatusCode::CREATED,
    )
    .await;
    let id = made["id"].as_str().unwrap();
    let api_key = app.api_key.clone();

    let changed = json!({ "url": "https://shop.example/b", "enabled_events": ["payment.failed"], "description": null });
    let updated = json_of(update_as(&app, &api_key, id, &changed).await, StatusCode::OK).await;
    assert_eq!(updated["url"], "https://shop.example/b");
    assert_eq!(updated["enabled_events"], json!(["payment.failed"]));
    assert_eq!(updated["description"], Value::Null);
    assert!(updated.get("secret").is_none());

    // Disabled by the service (it answered 410), then enabled again by its account.
    app.run_sql("UPDATE webhook_endpoints SET status = 'disabled', disabled_reason = 'gone'").await;
    let shown = json_of(app.get(&format!("/v1/webhook_endpoints/{id}")).await, StatusCode::OK).await;
    assert_eq!((shown["status"].as_str(), shown["disabled_reason"].as_str()), (Some("disabled"), Some("gone")));
    let enabled = json_of(update_as(&app, &api_key, id, &json!({ "status": "enabled" })).await, StatusCode::OK).await;
    assert_eq!((enabled["status"].as_str(), enabled["disabled_reason"].as_str()), (Some("enabled"), None));
    let disabled = json_of(update_as(&app, &api_key, id, &json!({ "status": "disabled" })).await, StatusCode::OK).await;
    assert_eq!((disabled["status"].as_str(), disabled["disabled_reason"].as_str()), (Some("disabled"), None));

    // A refused update changes nothing.
    for (body, expected) in [
        (json!({ "url": "http://127.0.0.2/" }), "webhook-url-not-allowed"),
        (json!({ "url": "gopher://shop.example/" }), "invalid-webhook-url"),
        (json!({ "enabled_events": ["charge.succeeded"] }), "unknown-event-type"),
        (json!({ "status": "paused" }), "malformed-body"),
        (json!({ "secret": "whsec_mine" }), "malformed-body"),
        (json!({ "url": null }), "malformed-body"),
        (json!({ "description": "a\u{0}b" }), "invalid-request"),
    ] {
        let problem = json_of(update_as(&app, &api_key, id, &body).await, StatusCode::BAD_REQUEST).await;
        assert_eq!(problem_type(&problem), expected, "{body}");
    }
    let now = json_of(app.get(&format!("/v1/webhook_endpoints/{id}")).await, StatusCode::OK).await;
    assert_eq!(now, disabled);
}

#[tokio::test]
async fn a_deleted_endpoint_is_gone_and_another_accounts_is_never_found() {
    let app = TestApp::spawn().await;
    let made = json_of(create(&app, &new_key(), &endpoint_body()).await, StatusCode::CREATED).await;
    let id = made["id"].as_str().unwrap();
    let other = app.create_account("other").await;

    let listed: Value = app.get_as(&other, "/v1/webhook_endpoints").await.json().await.unwrap();
    assert_eq!(listed["data"], json!([]));
    let not_found = [
        app.get_as(&other, &format!("/v1/webhook_endpoints/{id}")).await,
        app.get_as(&other, &format!("/v1/webhook_endpoints?starting_after={id}")).await,
        update_as(&app, &other, id, &json!({ "status": "disabled" })).await,
        delete_as(&app, &other, id).await,
    ];
    for response in not_found {
        assert_eq!(problem_type(&json_of(response, StatusCode::NOT_FOUND).await), "webhook-endpoint-not-found");
    }
    let bare = &id["we_".len()..];
    assert_eq!(app.get(&format!("/v1/webhook_endpoints/{bare}")).await.status(), StatusCode::NOT_FOUND);

    let deleted = json_of(delete_as(&app, &app.api_key, id).await, StatusCode::OK).await;
    assert_eq!(deleted, json!({ "id": id, "object": "webhook_endpoint", "deleted": true }));
    assert_eq!(app.get(&format!("/v1/webhook_endpoints/{id}")).await.status(), StatusCode::NOT_FOUND);
    assert_eq!(delete_as(&app, &app.api_key, id).await.status(), StatusCode::NOT_FOUND);
    let trail = app.audit_trail().await;
    assert!(trail.contains(&("webhook_endpoint.deleted".to_owned(), "api".to_owned())), "{trail:?}");
}

#[tokio::test]
async fn endpoints_are_listed_newest_first_past_a_cursor() {
    let app = TestApp::spawn().await;
    let mut ids = Vec::new();
    for n in 0..3 {
        let body = json!({ "url": format!("http://127.0.0.1:9/{n}"), "enabled_events": ["*"] });
        ids.push(json_of(create(&app, &new_key(), &body).await, StatusCode::CREATED).await["id"].clone());
    }
    ids.reverse();

    let first = json_of(app.get("/v1/webhook_endpoints?limit=2").await, StatusCode::OK).await;
    assert_eq!(first["has_more"], true);
    let shown: Vec<&Value> = first["data"].as_array().unwrap().iter().map(|e| &e["id"]).collect();
    assert_eq!(shown, [&ids[0], &ids[1]]);
    let after = ids[1].as_str().unwrap();
    let rest =
        json_of(app.get(&format!("/v1/webhook_endpoints?limit=2&starting_after={after}")).await, StatusCode::OK).await;
    assert_eq!(rest["has_more"], false);
    assert_eq!(rest["data"][0]["id"], ids[2]);
}

#[tokio::test]
async fn a_retry_after_its_key_was_reaped_is_410_naming_the_endpoint_without_its_secret() {
    let app = TestApp::builder().key_retention(Duration::from_secs(1)).spawn().await;
    let key = new_key();
    let made = json_of(create(&app, &key, &endpoint_body()).await, StatusCode::CREATED).await;
    app.wait_until_reaped(&key).await;

    let late = create(&app, &key, &endpoint_body()).await;
    assert_eq!(late.status(), StatusCode::GONE);
    let text = late.text().await.unwrap();
    assert!(text.contains(made["id"].as_str().unwrap()) && !text.contains("whsec_"), "{text}");
    assert!(app.database_says("(SELECT count(*) = 1 FROM webhook_endpoints)").await, "nothing made again");
}
