//! Requests rejected before the protocol starts: each answer is a problem, and nothing is written.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{Lock, TestApp, new_key, payment_body};

const PROBLEMS: &str = "https://payments.example/problems/";

/// Asserts a problem answer of `status` and `kind`, and that nothing at all was written; returns
/// the problem.
async fn assert_rejected(app: &TestApp, response: reqwest::Response, status: StatusCode, kind: &str) -> Value {
    assert_eq!(response.status(), status);
    assert_eq!(response.headers()["content-type"], "application/problem+json");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], format!("{PROBLEMS}{kind}"), "{problem}");
    assert_eq!(problem["status"], status.as_u16());
    assert!(problem["title"].is_string() && problem["detail"].is_string());
    assert_eq!(app.row_counts().await, (0, 0, 0, 0), "a rejected request writes nothing");
    assert_eq!(app.gateway.stats().await.requests, 0, "a rejected request never reaches the gateway");
    problem
}

#[tokio::test]
async fn a_missing_or_invalid_idempotency_key_is_400() {
    let app = TestApp::spawn().await;
    let body = payment_body().to_string();
    let json = ("Content-Type", "application/json");

    let missing = app.post_payment_raw(Some(&app.api_key), &[json], body.clone()).await;
    assert_rejected(&app, missing, StatusCode::BAD_REQUEST, "missing-idempotency-key").await;

    let too_long = "k".repeat(256);
    for key in ["", "\"\"", too_long.as_str(), "tab\there", "\"unterminated", "\"a\";b=1"] {
        let response = app.post_payment_raw(Some(&app.api_key), &[json, ("Idempotency-Key", key)], body.clone()).await;
        assert_rejected(&app, response, StatusCode::BAD_REQUEST, "invalid-idempotency-key").await;
    }
    // Two keys are none: a retry that carried only the second would otherwise pay again.
    let twice = [json, ("Idempotency-Key", "first"), ("Idempotency-Key", "second")];
    let response = app.post_payment_raw(Some(&app.api_key), &twice, body.clone()).await;
    let problem = assert_rejected(&app, response, StatusCode::BAD_REQUEST, "invalid-idempotency-key").await;
    assert!(problem["detail"].as_str().unwrap().contains("more than once"), "{problem}");
    let non_ascii = reqwest::header::HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap();
    let response = app
        .http
        .post(format!("{}/v1/payments", app.address))
        .bearer_auth(&app.api_key)
        .header("Idempotency-Key", non_ascii)
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_rejected(&app, response, StatusCode::BAD_REQUEST, "invalid-idempotency-key").await;
}

#[tokio::test]
async fn a_malformed_body_is_400_and_leaves_the_key_unspent() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let malformed = [
        "{".to_string(),
        "[]".to_string(),
        json!({ "amount": 1000, "currency": "usd" }).to_string(),
        json!({ "amount": 1000, "currency": "usd", "source": "tok_visa", "ammount": 1 }).to_string(),
        json!({ "amount": "1000", "currency": "usd", "source": "tok_visa" }).to_string(),
        json!({ "amount": 10.5, "currency": "usd", "source": "tok_visa" }).to_string(),
        // A fraction too small for an f64 to keep is a fraction all the same.
        r#"{"amount": 0.99999999999999999, "currency": "usd", "source": "tok_visa"}"#.to_string(),
        r#"{"amount": 99999998.999999999, "currency": "usd", "source": "tok_visa"}"#.to_string(),
        // A metadata key sent twice, as a field sent twice: which one was meant?
        r#"{"amount": 1000, "currency": "usd", "source": "tok_visa", "metadata": {"a": "1", "a": "2"}}"#.to_string(),
        json!({ "amount": 1000, "currency": "usd", "source": "tok_visa", "metadata": { "k": 1 } }).to_string(),
    ];
    for body in malformed {
        let response = app.post_payment_with(&key, body, &[]).await;
        assert_rejected(&app, response, StatusCode::BAD_REQUEST, "malformed-body").await;
    }
    // What was sent is named by its kind, not echoed back.
    let large = json!({ "amount": { "x": "A".repeat(5000) }, "currency": "usd", "source": "tok_visa" });
    let problem = assert_rejected(
        &app,
        app.post_payment_with(&key, large.to_string(), &[]).await,
        StatusCode::BAD_REQUEST,
        "malformed-body",
    )
    .await;
    assert!(problem["detail"].as_str().unwrap().len() < 300, "{problem}");
    let breaking_a_rule = [
        json!({ "amount": 0, "currency": "usd", "source": "tok_visa" }).to_string(),
        json!({ "amount": 100_000_000, "currency": "usd", "source": "tok_visa" }).to_string(),
        json!({ "amount": 1000, "currency": "dollars", "source": "tok_visa" }).to_string(),
        json!({ "amount": 1000, "currency": "usd", "source": "tok visa" }).to_string(),
        json!({ "amount": 1000, "currency": "usd", "source": "tok_visa", "description": "x".repeat(501) }).to_string(),
        json!({ "amount": 1000, "currency": "usd", "source": "tok_visa", "description": "a\u{0}b" }).to_string(),
        json!({ "amount": 1000, "currency": "usd", "source": "tok_visa", "metadata": { "k\u{0}": "v" } }).to_string(),
    ];
    for body in breaking_a_rule {
        let response = app.post_payment_with(&key, body, &[]).await;
        assert_rejected(&app, response, StatusCode::BAD_REQUEST, "invalid-request").await;
    }

    // The key was never spent: the same key with a valid body is a new payment, not a 422.
    let response = app.post_payment(&key, &payment_body()).await;
    assert_eq!(response.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn a_currency_that_is_not_chargeable_iso_4217_is_400_naming_the_field() {
    let app = TestApp::spawn().await;
    let key = new_key();
    // Not ISO 4217 at all; gold; the testing code: the last two have no minor units.
    for currency in ["xyz", "XAU", "xts"] {
        let body = json!({ "amount": 1000, "currency": currency, "source": "tok_visa" });
        let response = app.post_payment(&key, &body).await;
        let problem = assert_rejected(&app, response, StatusCode::BAD_REQUEST, "invalid-request").await;
        assert!(problem["detail"].as_str().unwrap().starts_with("currency "), "{problem}");
    }
    // A yen has no minor units, so its largest amount is a hundred times smaller than a dollar's.
    let too_much = json!({ "amount": 1_000_000, "currency": "jpy", "source": "tok_visa" });
    let problem =
        assert_rejected(&app, app.post_payment(&key, &too_much).await, StatusCode::BAD_REQUEST, "invalid-request")
            .await;
    assert!(problem["detail"].as_str().unwrap().contains("999999"), "{problem}");

    // The key was never spent, and the largest yen amount is charged.
    let response = app.post_payment(&key, &json!({ "amount": 999_999, "currency": "JPY", "source": "tok_visa" })).await;
    assert_eq!(response.status(), StatusCode::CREATED);
    let payment: Value = response.json().await.unwrap();
    assert_eq!((payment["amount"].as_i64(), payment["currency"].as_str()), (Some(999_999), Some("jpy")));
}

#[tokio::test]
async fn a_request_without_a_valid_api_key_is_401() {
    let app = TestApp::spawn().await;
    let headers = [("Idempotency-Key", "k"), ("Content-Type", "application/json")];
    for api_key in [None, Some("sk_nope"), Some("")] {
        let response = app.post_payment_raw(api_key, &headers, payment_body().to_string()).await;
        assert_eq!(response.headers()["www-authenticate"], "Bearer");
        assert_rejected(&app, response, StatusCode::UNAUTHORIZED, "unauthorized").await;
    }
    let basic = app
        .http
        .post(format!("{}/v1/payments", app.address))
        .basic_auth(&app.api_key, None::<&str>)
        .body(payment_body().to_string())
        .send()
        .await
        .unwrap();
    assert_rejected(&app, basic, StatusCode::UNAUTHORIZED, "unauthorized").await;
    let list = app.get_as("sk_nope", "/v1/payments").await;
    assert_eq!(list.status(), StatusCode::UNAUTHORIZED);

    // Whatever else is wrong with the request: the key is asked about first (an unknown one needs
    // the database, and must not lose to a check that answers at once).
    let json = ("Content-Type", "application/json");
    let wrong_otherwise: [(&[(&str, &str)], &str); 6] = [
        (&[json], "{\"amount\": 1000}"),
        (&[json, ("Idempotency-Key", "k")], "{"),
        (&[("Content-Type", "text/plain"), ("Idempotency-Key", "k")], "{}"),
        (&[json, ("Content-Type", "text/plain"), ("Idempotency-Key", "k")], "{}"),
        (&[json, ("Idempotency-Key", "k"), ("X-Fault-Inject", "boom")], "{}"),
        (&[json, ("Idempotency-Key", "")], "{}"),
    ];
    for (headers, body) in wrong_otherwise {
        let response = app.post_payment_raw(Some("sk_nope"), headers, body.to_owned()).await;
        assert_rejected(&app, response, StatusCode::UNAUTHORIZED, "unauthorized").await;
    }
    // Two keys, the valid one first, are no one key.
    let twice = app
        .http
        .get(format!("{}/v1/payments", app.address))
        .header("Authorization", format!("Bearer {}", app.api_key))
        .header("Authorization", "Bearer sk_nope")
        .send()
        .await
        .unwrap();
    assert_eq!(twice.status(), StatusCode::UNAUTHORIZED);
    for path in [
        "/v1/payments/not-a-uuid",
        "/v1/payments?limit=0",
        "/v1/payments?unknown=1",
        "/v1/refunds",
        "/v1/refunds/not-a-uuid",
        "/v1/idempotency_keys",
    ] {
        assert_eq!(app.get_as("sk_nope", path).await.status(), StatusCode::UNAUTHORIZED, "{path}");
    }
}

#[tokio::test]
async fn an_oversized_or_non_json_body_is_refused() {
    let app = TestApp::spawn().await;
    let huge = json!({ "amount": 1000, "currency": "usd", "source": "tok_visa", "description": "x".repeat(20_000) });
    let response = app.post_payment(&new_key(), &huge).await;
    assert_rejected(&app, response, StatusCode::PAYLOAD_TOO_LARGE, "payload-too-large").await;

    for headers in [&[("Idempotency-Key", "k"), ("Content-Type", "text/plain")][..], &[("Idempotency-Key", "k")]] {
        let response = app.post_payment_raw(Some(&app.api_key), headers, payment_body().to_string()).await;
        assert_rejected(&app, response, StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported-media-type").await;
    }
}

#[tokio::test]
async fn a_content_type_sent_twice_is_400_wherever_a_body_is_read() {
    let secret = "whsec_validation";
    let app = TestApp::builder().webhook_secrets(&[secret]).spawn().await;
    let payment = payment_body().to_string();
    let refund = json!({ "payment": uuid::Uuid::new_v4() }).to_string();
    let event = json!({ "id": "evt_twice", "object": "event", "type": "charge.succeeded",
                        "created": chrono::Utc::now().timestamp(), "data": { "object": { "id": "ch_1" } },
                        "request": { "idempotency_key": "payments:nobody:nothing" } })
    .to_string();
    let signature = |body: &str| {
        let at = chrono::Utc::now().timestamp();
        payments_service::gateway::signature::sign(
            &[payments_service::gateway::signature::WebhookSecret::new(secret)],
            at,
            body.as_bytes(),
        )
    };
    let post = |path: &str, body: &str, types: &[&str]| {
        let mut request = app.http.post(format!("{}{path}", app.address)).body(body.to_owned());
        if path.starts_with("/v1/") {
            request = request.bearer_auth(&app.api_key).header("Idempotency-Key", "k");
        } else {
            request = request.header("Gateway-Signature", signature(body));
        }
        for content_type in types {
            request = request.header("Content-Type", *content_type);
        }
        request.send()
    };
    // Either one first: actix's extractors read the first alone, so the JSON one first was a
    // payment, a refund's refusal stored under the key, an event applied.
    for types in [["application/json", "text/plain"], ["text/plain", "application/json"]] {
        for (path, body) in [("/v1/payments", &payment), ("/v1/refunds", &refund), ("/webhooks/gateway", &event)] {
            let response = post(path, body, &types).await.unwrap();
            let problem = assert_rejected(&app, response, StatusCode::BAD_REQUEST, "invalid-request").await;
            assert!(problem["detail"].as_str().unwrap().contains("Content-Type"), "{path} {types:?}: {problem}");
            assert!(app.database_says("SELECT count(*) = 0 FROM gateway_events").await, "{path} {types:?}");
        }
    }
    // Sent once, each is taken: the key was never spent, and the event is read.
    let response = post("/v1/payments", &payment, &["application/json"]).await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let response = post("/webhooks/gateway", &event, &["application/json"]).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
}

/// Everything the service has written and asked the gateway, as a test compares it before and
/// after requests that must change nothing: (keys, payments, audit records, staged jobs), refunds,
/// captures and cancels, events recorded, and the gateway's requests.
async fn everything_written(app: &TestApp) -> ((i64, i64, i64, i64), Vec<bool>, u64) {
    let mut tables = Vec::new();
    for table in ["refunds", "payment_changes", "gateway_events"] {
        tables.push(app.database_says(&format!("SELECT count(*) = 0 FROM {table}")).await);
    }
    (app.row_counts().await, tables, app.gateway.stats().await.requests)
}

/// A body is a JSON object. serde's derived structs take an array too, read by position: `[]`
/// captured all of an authorization, `[300]` captured 300, `[]` cancelled, `["<payment id>"]`
/// refunded all of a payment and `[500, "usd", "tok_visa"]` charged. Each is `400 malformed-body`
/// now, as any other body that is not an object, and changes nothing. A signed event that is an
/// array, or whose parts are, is no event the gateway sent: kept for a person as any unreadable
/// one, and never applied.
#[tokio::test]
async fn a_body_that_is_not_a_json_object_is_refused_on_every_post_and_changes_nothing() {
    let secret = "whsec_objects";
    let app = TestApp::builder().webhook_secrets(&[secret]).spawn().await;
    let authorization = json!({ "amount": 1000, "currency": "usd", "source": "tok_visa", "capture": false });
    let authorized: Value = app.post_payment(&new_key(), &authorization).await.json().await.unwrap();
    let authorized = authorized["id"].as_str().unwrap().to_owned();
    let paid_key = new_key();
    let paid: Value = app.post_payment(&paid_key, &payment_body()).await.json().await.unwrap();
    let paid_id = paid["id"].as_str().unwrap();
    let before = everything_written(&app).await;

    let capture = format!("/v1/payments/{authorized}/capture");
    let cancel = format!("/v1/payments/{authorized}/cancel");
    let positional = [
        (capture.as_str(), "[]".to_owned()),
        (capture.as_str(), "[300]".to_owned()),
        (cancel.as_str(), "[]".to_owned()),
        ("/v1/refunds", format!(r#"["{paid_id}"]"#)),
        ("/v1/payments", r#"[500,"usd","tok_visa"]"#.to_owned()),
    ];
    let not_objects = ["[]", "500", r#""usd""#, "null", "true"];
    let every_path = [capture.as_str(), cancel.as_str(), "/v1/refunds", "/v1/payments"];
    let others = every_path.iter().flat_map(|path| not_objects.map(|body| (*path, body.to_owned())));
    for (path, body) in positional.into_iter().chain(others) {
        let response = app
            .http
            .post(format!("{}{path}", app.address))
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", new_key())
            .header("Content-Type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{path} {body}");
        assert_eq!(response.headers()["content-type"], "application/problem+json");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["type"], format!("{PROBLEMS}malformed-body"), "{path} {body}: {problem}");
        assert!(problem["detail"].as_str().unwrap().contains("a JSON object"), "{path} {body}: {problem}");
        assert_eq!(everything_written(&app).await, before, "{path} {body}: nothing written, the gateway not asked");
    }
    let still: Value = app.get(&format!("/v1/payments/{authorized}")).await.json().await.unwrap();
    assert_eq!((&still["status"], &still["amount_captured"]), (&json!("requires_capture"), &json!(0)));

    // An event about the paid payment's charge, as an array read by position, and with each of
    // its parts as one: each verifies, and none is applied.
    let downstream = app.downstream_key(app.key_row(&paid_key).await.unwrap().id);
    let charge = &paid["gateway_charge_id"];
    let now = chrono::Utc::now().timestamp();
    let event = |data: Value, request: Value| {
        json!({ "id": format!("evt_{}", uuid::Uuid::new_v4().simple()), "object": "event",
                "type": "charge.succeeded", "created": now, "data": data, "request": request })
    };
    let events = [
        json!(["evt_positional", "charge.succeeded", now, [[charge]], [downstream]]),
        event(json!([{ "id": charge, "object": "charge" }]), json!({ "idempotency_key": downstream })),
        event(json!({ "object": [charge] }), json!({ "idempotency_key": downstream })),
        event(json!({ "object": { "id": charge, "object": "charge" } }), json!([downstream])),
    ];
    for event in events {
        let body = event.to_string();
        let signature = payments_service::gateway::signature::sign(
            &[payments_service::gateway::signature::WebhookSecret::new(secret)],
            now,
            body.as_bytes(),
        );
        let response = app.post_event(body.as_bytes(), Some(&signature)).await;
        assert_eq!(response.status(), StatusCode::OK, "{body}");
        assert_eq!(response.json::<Value>().await.unwrap()["outcome"], "unrecognized", "{body}");
        let kept = format!("SELECT count(*) = 1 FROM unreadable_gateway_events WHERE body = '{body}'::bytea");
        assert!(app.database_says(&kept).await, "kept for a person: {body}");
        assert!(app.database_says("SELECT count(*) = 0 FROM gateway_events").await, "never applied: {body}");
    }
}

#[tokio::test]
async fn a_key_reused_with_another_payload_is_422_and_changes_nothing() {
    let app = TestApp::spawn().await;
    let key = new_key();
    let first = app.post_payment(&key, &payment_body()).await.bytes().await.unwrap();
    let stored = app.key_row(&key).await.unwrap();

    let other = json!({ "amount": 2000, "currency": "usd", "source": "tok_visa", "description": "Order #42" });
    let response = app.post_payment(&key, &other).await;

    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], format!("{PROBLEMS}idempotency-key-reused"));
    assert_eq!(app.gateway.stats().await.requests, 1);
    let after = app.key_row(&key).await.unwrap();
    assert_eq!(after.response_body, stored.response_body);
    assert_eq!(after.request_params, stored.request_params);
    // The original is still what the key replays.
    let replay = app.post_payment(&key, &payment_body()).await.bytes().await.unwrap();
    assert_eq!(replay, first);
}

#[tokio::test]
async fn a_key_used_on_another_endpoint_is_422() {
    let app = TestApp::spawn().await;
    let key = new_key();
    app.seed_key(&key, &payment_body(), "started", Lock::Free).await;
    // Same body, but the key belongs to another endpoint's request.
    app.run_sql(&format!("UPDATE idempotency_keys SET request_path = '/v1/refunds' WHERE idempotency_key = '{key}'"))
        .await;

    let response = app.post_payment(&key, &payment_body()).await;

    assert_eq!(response.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(app.gateway.stats().await.requests, 0);
}

#[tokio::test]
async fn a_malformed_fault_header_is_400_whether_or_not_fault_injection_is_on() {
    for app in [TestApp::spawn().await, TestApp::builder().fault_injection().spawn().await] {
        for value in ["crash=everywhere", "AAA"] {
            let response =
                app.post_payment_with(&new_key(), payment_body().to_string(), &[("X-Fault-Inject", value)]).await;
            assert_rejected(&app, response, StatusCode::BAD_REQUEST, "invalid-request").await;
        }
        // Nor two faults, a valid one first.
        let twice = [("X-Fault-Inject", "crash=after_started"), ("X-Fault-Inject", "AAA")];
        let response = app.post_payment_with(&new_key(), payment_body().to_string(), &twice).await;
        assert_rejected(&app, response, StatusCode::BAD_REQUEST, "invalid-request").await;
    }
}

#[tokio::test]
async fn a_valid_fault_header_is_ignored_unless_fault_injection_is_on() {
    let app = TestApp::spawn().await;
    let response = app
        .post_payment_with(&new_key(), payment_body().to_string(), &[("X-Fault-Inject", "crash=after_started")])
        .await;
    assert_eq!(response.status(), StatusCode::CREATED, "the process must not crash");
}

#[tokio::test]
async fn unknown_routes_and_methods_are_problems() {
    let app = TestApp::spawn().await;
    let response = app.get("/v1/disputes").await;
    assert_eq!(response.status(), StatusCode::NOT_FOUND);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], format!("{PROBLEMS}route-not-found"));

    let response = app.http.delete(format!("{}/v1/payments", app.address)).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(response.headers()["allow"], "POST, GET");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], format!("{PROBLEMS}method-not-allowed"));
}

#[tokio::test]
async fn an_unversioned_path_is_404_naming_its_versioned_twin_for_any_method() {
    let app = TestApp::spawn().await;
    let id = uuid::Uuid::new_v4();
    let named = [
        (reqwest::Method::POST, "/payments".to_string(), "/v1/payments".to_string()),
        (reqwest::Method::GET, format!("/payments/{id}"), format!("/v1/payments/{id}")),
        (reqwest::Method::GET, "/refunds".to_string(), "/v1/refunds".to_string()),
        (reqwest::Method::DELETE, "/refunds/abc".to_string(), "/v1/refunds/abc".to_string()),
        (reqwest::Method::GET, "/idempotency_keys?key=k".to_string(), "/v1/idempotency_keys".to_string()),
        // A path too long to repeat is named by its route.
        (reqwest::Method::GET, format!("/payments/{}", "a".repeat(200)), "/v1/payments/{id}".to_string()),
    ];
    for (method, path, twin) in named {
        let response = app
            .http
            .request(method.clone(), format!("{}{path}", app.address))
            .bearer_auth(&app.api_key)
            .header("Idempotency-Key", "k")
            .json(&payment_body())
            .send()
            .await
            .unwrap();
        let problem = assert_rejected(&app, response, StatusCode::NOT_FOUND, "route-not-found").await;
        let detail = problem["detail"].as_str().unwrap();
        assert!(detail.ends_with(&format!(" {twin}?")), "{method} {path}: {problem}");
    }
    // A path with no versioned twin is the plain not-found problem.
    for path in ["/disputes", "/payments/abc/refunds", "/v1/v1/payments", "/gateway"] {
        let response = app.get(path).await;
        let problem = assert_rejected(&app, response, StatusCode::NOT_FOUND, "route-not-found").await;
        assert!(!problem["detail"].as_str().unwrap().contains("/v1"), "{path}: {problem}");
    }
}

/// The same against the real binary and the real mock gateway, each a process of its own: an
/// array read by position captures, cancels, refunds and charges nothing, and writes nothing.
#[tokio::test]
async fn a_real_serve_refuses_a_body_read_by_position_and_the_gateway_hears_nothing() {
    use diesel_async::{AsyncConnection, AsyncPgConnection};

    use crate::helpers::{GatewayControl, Process, TestDatabase};

    let database = TestDatabase::create().await;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let (_, api_key) = payments_service::accounts::create(&mut conn, "positional").await.unwrap();
    let gateway = Process::gateway().await;
    let serve = Process::serve(&database.url, &gateway.url, &["--no-workers"], &[]).await;
    let http = reqwest::Client::new();
    let post = |path: String, body: String| {
        http.post(format!("{}{path}", serve.url))
            .bearer_auth(&api_key)
            .header("Idempotency-Key", new_key())
            .header("Content-Type", "application/json")
            .body(body)
            .send()
    };
    let authorization = json!({ "amount": 1000, "currency": "usd", "source": "tok_visa", "capture": false });
    let authorized: Value = post("/v1/payments".into(), authorization.to_string()).await.unwrap().json().await.unwrap();
    let id = authorized["id"].as_str().unwrap();
    let control = GatewayControl::new(&gateway.url);
    let before = control.all_stats().await;

    for (path, body) in [
        (format!("/v1/payments/{id}/capture"), "[]".to_owned()),
        (format!("/v1/payments/{id}/capture"), "[300]".to_owned()),
        (format!("/v1/payments/{id}/cancel"), "[]".to_owned()),
        ("/v1/refunds".to_owned(), format!(r#"["{id}"]"#)),
        ("/v1/payments".to_owned(), r#"[500,"usd","tok_visa"]"#.to_owned()),
    ] {
        let response = post(path.clone(), body.clone()).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{path} {body}");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["type"], "https://payments.example/problems/malformed-body", "{path} {body}: {problem}");
    }

    assert_eq!(control.all_stats().await, before, "the gateway heard nothing");
    let nothing_new = "(SELECT count(*) FROM payments) = 1 AND (SELECT count(*) FROM idempotency_keys) = 1 \
                       AND NOT EXISTS (SELECT FROM refunds) AND NOT EXISTS (SELECT FROM payment_changes)";
    assert!(TestApp::database_says_on(&mut conn, nothing_new).await, "nothing written");
}
