//! The answers of POST /v1/payments, and what each leaves stored.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{GatewayStats, TestApp, new_key, payment_body};

#[tokio::test]
async fn a_new_payment_is_charged_once_answered_201_and_stored() {
    let app = TestApp::spawn().await;
    let key = new_key();

    let response = app.post_payment(&key, &payment_body()).await;

    assert_eq!(response.status(), StatusCode::CREATED);
    assert_eq!(response.headers()["content-type"], "application/json");
    assert!(response.headers().get("Idempotent-Replayed").is_none());
    let payment: Value = response.json().await.unwrap();
    assert_eq!(payment["object"], "payment");
    assert_eq!(payment["status"], "succeeded");
    assert_eq!(payment["amount"], 1000);
    assert_eq!(payment["currency"], "usd");
    assert_eq!(payment["description"], "Order #42");
    assert_eq!(payment["metadata"], json!({}));
    assert!(payment["gateway_charge_id"].as_str().unwrap().starts_with("ch_"));
    assert!(payment["failure_code"].is_null());

    let row = app.key_row(&key).await.unwrap();
    assert_eq!(row.recovery_point, "finished");
    assert!(row.locked_until.is_none() && row.lock_token.is_none());
    assert_eq!(row.response_status, Some(201));
    assert_eq!(
        app.gateway.stats().await,
        GatewayStats { charges: 1, declined: 0, requests: 1, look_ups: 0, faults: 0 }
    );
    // One key, one payment, an audit record for the claim and one per phase, one staged event.
    assert_eq!(app.row_counts().await, (1, 1, 4, 1));

    let fetched: Value =
        app.get(&format!("/v1/payments/{}", payment["id"].as_str().unwrap())).await.json().await.unwrap();
    assert_eq!(fetched, payment);
}

#[tokio::test]
async fn a_declined_card_is_answered_402_with_the_failed_payment_and_stored() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let body = json!({ "amount": 500, "currency": "eur", "source": "tok_chargeDeclined" });

    let response = app.post_payment(&key, &body).await;

    assert_eq!(response.status(), StatusCode::PAYMENT_REQUIRED);
    assert_eq!(response.headers()["content-type"], "application/problem+json");
    let body = response.text().await.unwrap();
    let problem: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(problem["type"], "https://payments.example/problems/card-declined");
    let fetched = app.get(&format!("/v1/payments/{}", problem["payment"]["id"].as_str().unwrap())).await;
    let fetched = fetched.text().await.unwrap();
    assert!(body.ends_with(&format!(r#""payment":{fetched}}}"#)), "the embedded payment reads as the payment itself");
    assert_eq!(problem["status"], 402);
    assert_eq!(problem["payment"]["status"], "failed");
    assert_eq!(problem["payment"]["failure_code"], "card_declined");
    assert!(problem["payment"]["gateway_charge_id"].is_null());
    let row = app.key_row(&key).await.unwrap();
    assert_eq!((row.recovery_point.as_str(), row.response_status), ("finished", Some(402)));
    assert_eq!(
        app.gateway.stats().await,
        GatewayStats { charges: 0, declined: 1, requests: 1, look_ups: 0, faults: 0 }
    );
}

#[tokio::test]
async fn a_source_the_gateway_does_not_know_is_the_clients_402_stored() {
    let app = TestApp::spawn().await;
    let key = new_key();
    // Passes our validation, but the gateway knows no such token: a definitive 400 from it.
    let body = json!({ "amount": 500, "currency": "usd", "source": "card_1234" });

    let response = app.post_payment(&key, &body).await;

    assert_eq!(response.status(), StatusCode::PAYMENT_REQUIRED);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "https://payments.example/problems/unknown-source");
    assert_eq!(problem["payment"]["status"], "failed");
    assert_eq!(problem["payment"]["failure_code"], "unknown_source");
    assert_eq!(app.key_row(&key).await.unwrap().response_status, Some(402));
    let retry = app.post_payment(&key, &body).await;
    assert_eq!(
        (retry.status(), &retry.headers()["Idempotent-Replayed"]),
        (StatusCode::PAYMENT_REQUIRED, &"true".parse().unwrap())
    );
    assert_eq!(app.gateway.stats().await.charges, 0);
}

#[tokio::test]
async fn payments_are_listed_in_the_order_the_database_made_them_whatever_the_servers_clocks() {
    let app = TestApp::spawn().await;
    let earlier = app.post_payment(&new_key(), &payment_body()).await;
    assert_eq!(earlier.status(), StatusCode::CREATED);
    let earlier: Value = earlier.json().await.unwrap();
    // A payment made later by a server whose clock is a minute behind: its id sorts before.
    let behind = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    let behind = behind.duration_since(std::time::UNIX_EPOCH).unwrap();
    let later =
        uuid::Uuid::new_v7(uuid::Timestamp::from_unix(uuid::NoContext, behind.as_secs(), behind.subsec_nanos()));
    app.run_sql(&format!(
        "INSERT INTO payments (id, account_id, idempotency_key, amount, currency, status, gateway_charge_id)
         VALUES ('{later}', '{}', 'made-later', 700, 'usd', 'succeeded', 'ch_later')",
        app.account_id
    ))
    .await;

    let newest: Value = app.get("/v1/payments?limit=1").await.json().await.unwrap();
    assert_eq!(newest["data"][0]["id"], later.to_string(), "a client polling for new payments sees it");
    let next: Value = app.get(&format!("/v1/payments?limit=1&starting_after={later}")).await.json().await.unwrap();
    assert_eq!(next["data"][0]["id"], earlier["id"]);
    assert_eq!(next["has_more"], false);
}

#[tokio::test]
async fn a_cursor_that_names_no_payment_of_yours_is_a_404() {
    let app = TestApp::spawn().await;
    let other = app.create_account("other").await;
    let headers = [("Idempotency-Key", "theirs"), ("Content-Type", "application/json")];
    let theirs = app.post_payment_raw(Some(&other), &headers, payment_body().to_string()).await;
    let theirs: Value = theirs.json().await.unwrap();

    for cursor in [uuid::Uuid::now_v7().to_string(), theirs["id"].as_str().unwrap().to_owned()] {
        let response = app.get(&format!("/v1/payments?starting_after={cursor}")).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{cursor}");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["type"], "https://payments.example/problems/payment-not-found");
    }
}

#[tokio::test]
async fn payments_are_listed_newest_first_with_a_cursor() {
    let app = TestApp::spawn().await;
    let mut ids = Vec::new();
    for amount in [100, 200, 300] {
        let body = json!({ "amount": amount, "currency": "usd", "source": "tok_visa" });
        let payment: Value = app.post_payment(&new_key(), &body).await.json().await.unwrap();
        ids.push(payment["id"].as_str().unwrap().to_owned());
    }

    let first: Value = app.get("/v1/payments?limit=2").await.json().await.unwrap();
    assert_eq!(first["object"], "list");
    assert_eq!(first["has_more"], true);
    let amounts: Vec<i64> = first["data"].as_array().unwrap().iter().map(|p| p["amount"].as_i64().unwrap()).collect();
    assert_eq!(amounts, [300, 200]);

    let next: Value = app.get(&format!("/v1/payments?limit=2&starting_after={}", ids[1])).await.json().await.unwrap();
    assert_eq!(next["has_more"], false);
    assert_eq!(next["data"].as_array().unwrap().len(), 1);
    assert_eq!(next["data"][0]["id"], ids[0].as_str());

    let default: Value = app.get("/v1/payments").await.json().await.unwrap();
    assert_eq!(default["data"].as_array().unwrap().len(), 3);

    for bad in ["limit=0", "limit=101", "limit=ten", "starting_after=nope", "colour=blue"] {
        let response = app.get(&format!("/v1/payments?{bad}")).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(response.headers()["content-type"], "application/problem+json");
    }
}

#[tokio::test]
async fn accounts_are_isolated_and_a_shared_key_means_two_requests() {
    let app = TestApp::spawn().await;
    let other = app.create_account("other").await;
    let key = new_key();

    let mine: Value = app.post_payment(&key, &payment_body()).await.json().await.unwrap();
    let response = app
        .post_payment_raw(
            Some(&other),
            &[("Idempotency-Key", &key), ("Content-Type", "application/json")],
            payment_body().to_string(),
        )
        .await;
    assert_eq!(response.status(), StatusCode::CREATED, "the same key in another account is a new request");
    assert!(response.headers().get("Idempotent-Replayed").is_none());
    let theirs: Value = response.json().await.unwrap();
    assert_ne!(mine["id"], theirs["id"]);
    assert_eq!(app.gateway.stats().await.charges, 2);

    let path = format!("/v1/payments/{}", mine["id"].as_str().unwrap());
    let response = app.get_as(&other, &path).await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "https://payments.example/problems/payment-not-found");
    let listed: Value = app.get_as(&other, "/v1/payments").await.json().await.unwrap();
    assert_eq!(listed["data"].as_array().unwrap().len(), 1);
    assert_eq!(listed["data"][0]["id"], theirs["id"]);
}

#[tokio::test]
async fn an_unknown_or_malformed_payment_id_is_404() {
    let app = TestApp::spawn().await;
    for id in ["01930000-0000-7000-8000-000000000000", "not-a-uuid"] {
        let response = app.get(&format!("/v1/payments/{id}")).await;
        assert_eq!(response.status(), StatusCode::NOT_FOUND, "{id}");
        assert_eq!(response.headers()["content-type"], "application/problem+json");
    }
}

#[tokio::test]
async fn health_and_readiness_answer() {
    let app = TestApp::spawn().await;
    let health = app.http.get(format!("{}/healthz", app.address)).send().await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    let ready = app.http.get(format!("{}/readyz", app.address)).send().await.unwrap();
    assert_eq!(ready.status(), StatusCode::OK);
}

#[tokio::test]
async fn api_keys_are_remembered_for_a_stated_while_and_unknown_ones_never() {
    let app = TestApp::spawn().await;
    // An unknown key is refused, and asked about again next time: it works once its account exists.
    assert_eq!(app.get_as("sk_not_yet", "/v1/payments").await.status(), StatusCode::UNAUTHORIZED);
    app.run_sql(
        "INSERT INTO accounts (id, name, api_key_hash) VALUES (gen_random_uuid(), 'later', sha256('sk_not_yet'))",
    )
    .await;
    assert_eq!(app.get_as("sk_not_yet", "/v1/payments").await.status(), StatusCode::OK);

    // A known key keeps working in this process for up to a minute after it is replaced: the
    // revocation delay docs/performance.md states.
    app.run_sql("UPDATE accounts SET api_key_hash = sha256('sk_replaced') WHERE name = 'later'").await;
    assert_eq!(app.get_as("sk_not_yet", "/v1/payments").await.status(), StatusCode::OK);
    assert_eq!(payments_service::accounts::API_KEY_CACHE_TTL, std::time::Duration::from_secs(60));
}
