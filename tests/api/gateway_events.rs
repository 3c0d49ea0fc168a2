//! The gateway's events, received: verified on their raw bytes before anything reads them,
//! applied exactly once by the database, and allowed to change only what they may.

use std::time::Duration;

use diesel::prelude::*;
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl, SimpleAsyncConnection};
use payments_service::db::schema::refunds;
use payments_service::gateway::signature::{WebhookSecret, sign};
use payments_service::idempotency::needing_attention;
use payments_service::workers::{Outcome, Worker};
use reqwest::StatusCode;
use serde_json::{Value, json};
use uuid::Uuid;

use crate::helpers::{
    GatewayControl, Lock, OpenTransaction, Process, TestApp, TestDatabase, new_key, payment_body, wait_until,
};

const SECRET: &str = "whsec_test_current";

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// An event as the gateway sends it: about `object`, caused by the request with `downstream_key`.
fn event(kind: &str, object: Value, downstream_key: &str) -> Vec<u8> {
    let event = json!({ "id": format!("evt_{}", Uuid::new_v4().simple()), "object": "event", "type": kind,
                        "created": now(), "data": { "object": object },
                        "request": { "idempotency_key": downstream_key } });
    serde_json::to_vec(&event).unwrap()
}

fn signed(body: &[u8], secrets: &[&str], at: i64) -> String {
    let secrets: Vec<WebhookSecret> = secrets.iter().map(|secret| WebhookSecret::new(*secret)).collect();
    sign(&secrets, at, body)
}

async fn app() -> TestApp {
    TestApp::builder().webhook_secrets(&["whsec_test_previous", SECRET]).spawn().await
}

/// How many events the app recorded, and how many audit records it has.
async fn written(app: &TestApp) -> (bool, (i64, i64, i64, i64)) {
    (app.database_says("SELECT count(*) = 0 FROM gateway_events").await, app.row_counts().await)
}

/// A paid payment, the downstream key it was charged under, and the charge's id.
async fn charged(app: &TestApp) -> (Value, String) {
    let key = new_key();
    let payment: Value = app.post_payment(&key, &payment_body()).await.json().await.unwrap();
    let key_id = app.key_row(&key).await.unwrap().id;
    (payment, app.downstream_key(key_id))
}

#[tokio::test]
async fn only_a_whole_signature_over_the_exact_bytes_within_the_tolerance_is_accepted() {
    let app = app().await;
    let (payment, downstream) = charged(&app).await;
    let body =
        event("charge.succeeded", json!({ "id": payment["gateway_charge_id"], "object": "charge" }), &downstream);
    let before = written(&app).await;
    let at = now();
    let good = signed(&body, &[SECRET], at);
    let hex = good.split("v1=").nth(1).unwrap().to_owned();
    let mut changed = body.clone();
    let last = changed.len() - 2;
    changed[last] ^= 0x01;

    let refused: Vec<(String, Vec<u8>, Option<String>)> = vec![
        ("forged".into(), body.clone(), Some(signed(&body, &["whsec_someone_else"], at))),
        ("no header".into(), body.clone(), None),
        ("a v1= with no hex".into(), body.clone(), Some(format!("t={at},v1="))),
        ("half a signature".into(), body.clone(), Some(format!("t={at},v1={}", &hex[..32]))),
        ("a v1, alone".into(), body.clone(), Some(format!("t={at},v1,"))),
        ("just too old".into(), body.clone(), Some(signed(&body, &[SECRET], now() - 305))),
        ("just too new".into(), body.clone(), Some(signed(&body, &[SECRET], now() + 305))),
        ("a byte changed after signing".into(), changed, Some(good.clone())),
    ];
    for (case, body, header) in refused {
        let response = app.post_event(&body, header.as_deref()).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{case}");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["type"], "https://payments.example/problems/invalid-signature", "{case}");
    }
    // Two signature headers are none, even if one of them holds: the `v1`s belong in one header.
    for headers in [[good.as_str(), "t=1,v1=00"], ["t=1,v1=00", good.as_str()]] {
        let mut request = app.http.post(format!("{}/webhooks/gateway", app.address)).body(body.clone());
        for header in headers {
            request = request.header("Gateway-Signature", header);
        }
        let response = request.header("Content-Type", "application/json").send().await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{headers:?}");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["type"], "https://payments.example/problems/invalid-signature", "{headers:?}");
        assert!(problem["detail"].as_str().unwrap().contains("more than once"), "{problem}");
    }
    assert_eq!(written(&app).await, before, "a refused event writes nothing");
    let huge = vec![b' '; 64 * 1024 + 1];
    let response = app.post_event(&huge, Some(&signed(&huge, &[SECRET], now()))).await;
    assert_eq!(response.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(response.headers()["content-type"], "application/problem+json");

    // Rotation: the gateway signs with its old and its new secret; only the last matches ours... and
    // only the first does, for an app that still has the old one.
    let rotated = signed(&body, &["whsec_retired", SECRET], now());
    assert_eq!(app.post_event(&body, Some(&rotated)).await.status(), StatusCode::OK, "only the last v1 valid");
    for at in [now() - 295, now() + 295] {
        let body = event("charge.succeeded", json!({ "id": payment["gateway_charge_id"] }), &downstream);
        let response = app.post_event(&body, Some(&signed(&body, &["whsec_test_previous"], at))).await;
        assert_eq!(response.status(), StatusCode::OK, "just inside the tolerance, either way");
    }
    assert!(app.database_says("SELECT count(*) = 3 FROM gateway_events WHERE outcome = 'applied'").await);

    assert!(app.database_says("SELECT count(*) = 3 FROM gateway_events").await);
}

/// What gateways really send is read: a failure named by either field, or both, as a string or
/// as a number; `created` in seconds, with a fraction, or in milliseconds. Each was a `400` the
/// gateway sent again for ever.
#[tokio::test]
async fn events_are_read_as_real_gateways_write_them() {
    let app = app().await;
    let (payment, downstream) = charged(&app).await;
    let at = now();
    for created in [json!(at), json!(at as f64 + 0.75), json!(at * 1000 + 999)] {
        let mut body: Value = serde_json::from_slice(&event(
            "charge.succeeded",
            json!({ "id": payment["gateway_charge_id"] }),
            &downstream,
        ))
        .unwrap();
        body["created"] = created.clone();
        let body = serde_json::to_vec(&body).unwrap();
        let response = app.post_event(&body, Some(&signed(&body, &[SECRET], now()))).await;
        assert_eq!(response.json::<Value>().await.unwrap()["outcome"], "applied", "created {created}");
    }
    let stamped = format!("SELECT count(*) = 3 FROM gateway_events WHERE created_at = to_timestamp({at})");
    assert!(app.database_says(&stamped).await, "each read as the same second");

    for (failure, recorded) in [
        (json!({ "failure_code": "expired_card", "failure_reason": "expired_or_canceled_card" }), "expired_card"),
        (json!({ "failure_reason": "lost_or_stolen_card" }), "lost_or_stolen_card"),
        (json!({ "failure_code": 51 }), "51"),
    ] {
        let payment = app.paid(1000, "tok_refundFails").await;
        let key = new_key();
        let refund: Value =
            app.post_refund(&key, &json!({ "payment": payment["id"], "amount": 300 })).await.json().await.unwrap();
        assert_eq!(refund["status"], "pending");
        app.gateway.settle_refunds().await;
        let downstream = app.downstream_key(app.key_row(&key).await.unwrap().id);
        let mut failed = app.gateway.refunds_for(&downstream).await.remove(0);
        let object = failed.as_object_mut().unwrap();
        object.remove("failure_reason");
        object.remove("failure_code");
        object.extend(failure.as_object().unwrap().clone());
        let body = event("refund.failed", failed, &downstream);
        let response = app.post_event(&body, Some(&signed(&body, &[SECRET], now()))).await;
        assert_eq!(response.json::<Value>().await.unwrap()["outcome"], "applied", "{failure}");
        let now_refund: Value =
            app.get(&format!("/v1/refunds/{}", refund["id"].as_str().unwrap())).await.json().await.unwrap();
        assert_eq!((&now_refund["status"], &now_refund["failure_code"]), (&json!("failed"), &json!(recorded)));
    }
}

/// An event that verifies but cannot be read is the gateway's, and no retry of it would make it
/// readable: it is answered `200 unrecognized`, kept raw (up to 16 KiB) for a person, counted,
/// and the key it names, if one of ours, is flagged, and stays flagged when the key finishes.
#[tokio::test]
async fn a_verified_event_that_cannot_be_read_is_kept_for_a_person_and_acknowledged() {
    let app = app().await;
    // A payment whose charge's answer was lost: its key waits at `started`.
    let key = new_key();
    app.gateway.fault("error_after", 1).await;
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    let downstream = app.downstream_key(app.key_row(&key).await.unwrap().id);
    let charge = app.gateway.charges_for(&downstream).await.remove(0);
    let stamped = |created: Value| {
        let mut body: Value = serde_json::from_slice(&event("charge.succeeded", charge.clone(), &downstream)).unwrap();
        body["created"] = created;
        serde_json::to_vec(&body).unwrap()
    };
    let mut long = stamped(json!("yesterday"));
    long.extend(vec![b' '; 20 * 1024]);
    let unreadable = [
        ("a created time that is not a number", stamped(json!("yesterday"))),
        ("a created time before 1970", stamped(json!(-1))),
        ("a created time past 9999 even in milliseconds", stamped(json!(9_000_000_000_000_000_i64))),
        ("no object", br#"{"id":"evt_1","type":"charge.succeeded","created":1}"#.to_vec()),
        ("not JSON", b"charge succeeded".to_vec()),
        ("a body longer than is kept", long),
    ];
    let app = &app;
    let counted = |kind: &'static str| async move {
        app.metrics().await.count("gateway_events_total", &[("type", kind), ("outcome", "unrecognized")])
    };
    let before = (counted("charge.succeeded").await, counted("other").await);
    for (case, body) in &unreadable {
        let response = app.post_event(body, Some(&signed(body, &[SECRET], now()))).await;
        assert_eq!(response.status(), StatusCode::OK, "{case}");
        assert_eq!(response.json::<Value>().await.unwrap()["outcome"], "unrecognized", "{case}");
    }

    // Every one kept, raw; those that name our key under its account.
    let kept = |condition: String| async move {
        app.database_says(&format!("SELECT count(*) = 1 FROM unreadable_gateway_events WHERE {condition}")).await
    };
    for (case, body) in &unreadable[..3] {
        let raw = hex::encode(body);
        assert!(
            kept(format!("body = '\\x{raw}' AND account_id = '{}' AND reason <> ''", app.account_id)).await,
            "{case}"
        );
    }
    assert!(kept("account_id IS NULL AND body = 'charge succeeded' AND body_bytes = 16".into()).await);
    assert!(kept(format!("octet_length(body) = 16384 AND body_bytes = {}", unreadable[5].1.len())).await);
    let after = (counted("charge.succeeded").await, counted("other").await);
    assert_eq!((after.0 - before.0, after.1 - before.1), (5.0, 1.0), "counted by the type each names");
    assert!(app.database_says("SELECT count(*) = 0 FROM gateway_events").await, "nothing applied");

    // The key it names needs a person, with a reason that says why, in its story too; the
    // client's retry finishes it, and it stays flagged.
    let attention = needing_attention(&mut app.db().await, &payments_service::endpoints::all()).await.unwrap();
    assert_eq!(attention.len(), 1);
    assert!(
        attention[0].attention_reason.starts_with("gateway_unreadable_event: "),
        "{}",
        attention[0].attention_reason
    );
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::CREATED);
    let story: Value = app.key_story(&key).await.json().await.unwrap();
    assert_eq!(
        (&story["needs_attention"], &story["attention_reason"]),
        (&json!(true), &json!("gateway_unreadable_event"))
    );

    // A key a worker gave up on takes the gateway's reason instead, which its finish keeps.
    let given_up = new_key();
    let given_up_id = app.seed_key(&given_up, &payment_body(), "started", Lock::Free).await;
    app.run_sql(&format!(
        "UPDATE idempotency_keys SET needs_attention_at = now(), attention_reason = 'the gateway keeps failing'
         WHERE id = '{given_up_id}'"
    ))
    .await;
    let mut about_it: Value = serde_json::from_slice(&stamped(json!(-1))).unwrap();
    about_it["request"]["idempotency_key"] = json!(app.downstream_key(given_up_id));
    let about_it = serde_json::to_vec(&about_it).unwrap();
    let response = app.post_event(&about_it, Some(&signed(&about_it, &[SECRET], now()))).await;
    assert_eq!(response.json::<Value>().await.unwrap()["outcome"], "unrecognized");
    let reason = format!(
        "SELECT attention_reason LIKE 'gateway_unreadable_event: %' FROM idempotency_keys WHERE id = '{given_up_id}'"
    );
    assert!(app.database_says(&reason).await);
}

#[tokio::test]
async fn a_charge_event_that_disagrees_flags_the_key_and_moves_no_money() {
    let app = app().await;
    let key = new_key();
    let declined = json!({ "amount": 1000, "currency": "usd", "source": "tok_chargeDeclined" });
    assert_eq!(app.post_payment(&key, &declined).await.status(), StatusCode::PAYMENT_REQUIRED);
    let downstream = app.downstream_key(app.key_row(&key).await.unwrap().id);

    let body = event("charge.succeeded", json!({ "id": "ch_we_never_heard_of", "object": "charge" }), &downstream);
    let response = app.post_event(&body, Some(&signed(&body, &[SECRET], now()))).await;

    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.json::<Value>().await.unwrap()["outcome"], "disagreement");
    let story: Value = app.key_story(&key).await.json().await.unwrap();
    assert_eq!(
        (story["needs_attention"].as_bool(), story["attention_reason"].as_str()),
        (Some(true), Some("gateway_disagreement"))
    );
    assert_eq!(story["payment"]["status"], "failed", "no money moved");
    assert_eq!(
        app.metrics().await.count("gateway_events_total", &[("type", "charge.succeeded"), ("outcome", "disagreement")]),
        1.0
    );
    // It stays for a person: the reaper keeps a flagged key past its expiry.
    app.run_sql(&format!("UPDATE idempotency_keys SET finished_at = now() - interval '2 hours', expires_at = now() - interval '1 hour' WHERE idempotency_key = '{key}'")).await;
    app.workers().reaper.run_once().await.unwrap();
    assert!(app.key_row(&key).await.is_some());
}

#[tokio::test]
async fn an_event_about_an_unfinished_key_makes_it_due_for_the_completer_at_once() {
    let app = TestApp::builder()
        .webhook_secrets(&[SECRET])
        .workers(|w| w.completer_backoff = Duration::from_secs(3600))
        .spawn()
        .await;
    let key = new_key();
    app.gateway.fault("error_after", 1).await;
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    let workers = app.workers();
    assert_eq!(workers.completer.run_once().await.unwrap(), Outcome::Idle, "its backoff is an hour");
    let key_id = app.key_row(&key).await.unwrap().id;
    let charge = app.gateway.charges_for(&app.downstream_key(key_id)).await.remove(0);

    let body = event("charge.succeeded", charge, &app.downstream_key(key_id));
    let response = app.post_event(&body, Some(&signed(&body, &[SECRET], now()))).await;

    assert_eq!(response.json::<Value>().await.unwrap()["outcome"], "nudged");
    assert_eq!(app.key_row(&key).await.unwrap().recovery_point, "started", "the phases alone move a key");
    assert_eq!(workers.completer.run_once().await.unwrap(), Outcome::Worked, "due at once");
    assert_eq!(app.key_row(&key).await.unwrap().recovery_point, "finished");
    assert_eq!(app.gateway.stats().await.charges, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_event_fifty_times_at_once_over_two_servers_is_applied_once() {
    fifty_times_at_once_over_two_servers(TestDatabase::create().await).await;
}

/// The same event, settling a refund, delivered fifty times at once over two servers on
/// `database` (migrated): applied once, its effects once.
pub async fn fifty_times_at_once_over_two_servers(database: TestDatabase) {
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let (_, api_key) = payments_service::accounts::create(&mut conn, "events").await.unwrap();
    let gateway = Process::gateway().await;
    let env = [("PAYMENTS_GATEWAY_WEBHOOK_SECRETS", SECRET)];
    let servers = [
        Process::serve(&database.url, &gateway.url, &["--no-workers"], &env).await,
        Process::serve(&database.url, &gateway.url, &["--no-workers"], &env).await,
    ];
    let http = reqwest::Client::new();
    let post = |path: &str, body: Value| {
        http.post(format!("{}{path}", servers[0].url))
            .bearer_auth(&api_key)
            .header("Idempotency-Key", new_key())
            .json(&body)
            .send()
    };
    // A pending refund, settled by an event: the kind of event whose application moves money.
    let payment: Value =
        post("/v1/payments", json!({ "amount": 1000, "currency": "usd", "source": "tok_refundPending" }))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    let refund: Value =
        post("/v1/refunds", json!({ "payment": payment["id"], "amount": 600 })).await.unwrap().json().await.unwrap();
    assert_eq!(refund["status"], "pending");
    let control = GatewayControl::new(&gateway.url);
    control.settle_refunds().await;
    let (account_id, key_id): (Uuid, Uuid) = refunds::table
        .filter(refunds::id.eq(Uuid::parse_str(refund["id"].as_str().unwrap()).unwrap()))
        .select((refunds::account_id, refunds::idempotency_key_id))
        .get_result(&mut conn)
        .await
        .unwrap();
    let downstream = payments_service::gateway::downstream_key(account_id, key_id);
    let settled = control.refunds_for(&downstream).await.remove(0);
    assert_eq!(settled["status"], "succeeded");
    let body = event("refund.succeeded", settled, &downstream);
    let signature = signed(&body, &[SECRET], now());

    // Each delivery sent again while it is answered `503` (a wait for the first delivery's row
    // outlasted the lock timeout on a loaded machine, and the service failed closed, committing
    // nothing), as the gateway does: what must hold is what the deliveries end with, however long
    // each waited.
    let mut deliveries = tokio::task::JoinSet::new();
    for i in 0..50 {
        let request = http
            .post(format!("{}/webhooks/gateway", servers[i % 2].url))
            .header("Gateway-Signature", &signature)
            .body(body.clone());
        deliveries.spawn(async move {
            for _ in 0..30 {
                let response = request.try_clone().unwrap().send().await.unwrap();
                if response.status() == StatusCode::SERVICE_UNAVAILABLE {
                    continue;
                }
                assert_eq!(response.status(), StatusCode::OK);
                return response.json::<Value>().await.unwrap()["outcome"].as_str().unwrap().to_owned();
            }
            panic!("a delivery answered 503 thirty times");
        });
    }
    let outcomes = deliveries.join_all().await;

    assert_eq!(outcomes.iter().filter(|outcome| *outcome == "applied").count(), 1, "{outcomes:?}");
    assert_eq!(outcomes.iter().filter(|outcome| *outcome == "duplicate").count(), 49, "{outcomes:?}");
    for (sql, expected) in [
        ("SELECT count(*) AS n FROM gateway_events", 1),
        ("SELECT count(*) AS n FROM audit_records WHERE action = 'refund.settled'", 1),
        ("SELECT count(*) AS n FROM events WHERE event_type = 'refund.succeeded'", 1),
        ("SELECT amount_refunded AS n FROM payments", 600),
    ] {
        assert_eq!(diesel::sql_query(sql).get_result::<Count>(&mut conn).await.unwrap().n, expected, "{sql}");
    }
}

#[derive(diesel::QueryableByName)]
struct Count {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    n: i64,
}

#[tokio::test]
async fn refund_events_out_of_order_settle_forward_only() {
    let app = TestApp::builder()
        .webhook_secrets(&[SECRET])
        .workers(|w| w.completer_backoff = Duration::from_secs(3600))
        .spawn()
        .await;
    let payment = app.paid(1000, "tok_refundFails").await;
    let key = new_key();
    let body = json!({ "payment": payment["id"], "amount": 500 });
    app.gateway.fault("error_after", 1).await;
    assert_eq!(app.post_refund(&key, &body).await.status(), StatusCode::SERVICE_UNAVAILABLE);
    app.gateway.settle_refunds().await;
    let downstream = app.downstream_key(app.key_row(&key).await.unwrap().id);
    let failed = app.gateway.refunds_for(&downstream).await.remove(0);
    assert_eq!(failed["status"], "failed");

    // `refund.failed` overtakes the phase that records the gateway's refund: matched by our
    // downstream key, it only wakes the key; no money moves yet.
    let early = event("refund.failed", failed.clone(), &downstream);
    let response = app.post_event(&early, Some(&signed(&early, &[SECRET], now()))).await;
    assert_eq!(response.json::<Value>().await.unwrap()["outcome"], "nudged");
    let id = payment["id"].as_str().unwrap();
    assert!(app.database_says(&format!("SELECT amount_refund_pending = 500 FROM payments WHERE id = '{id}'")).await);
    assert_eq!(app.workers().completer.run_once().await.unwrap(), Outcome::Worked);
    let refund: Value = app.post_refund(&key, &body).await.json().await.unwrap();
    assert_eq!(refund["status"], "failed", "the look-up the event woke recorded the failure");
    assert!(
        app.database_says(&format!(
            "SELECT amount_refund_pending = 0 AND amount_refunded = 0 FROM payments WHERE id = '{id}'"
        ))
        .await
    );

    // A `refund.succeeded` after `failed` is older than what we know (no refund comes back from
    // `failed`): stale and ignored, whatever the gateway's clock wrote in `created`, behind ours
    // or ahead of it.
    for skew in [-60, 60] {
        let stale = {
            let mut stale: Value =
                serde_json::from_slice(&event("refund.succeeded", failed.clone(), &downstream)).unwrap();
            stale["created"] = json!(now() + skew);
            serde_json::to_vec(&stale).unwrap()
        };
        let response = app.post_event(&stale, Some(&signed(&stale, &[SECRET], now()))).await;
        assert_eq!(response.json::<Value>().await.unwrap()["outcome"], "stale", "created {skew} s from now");
    }
    let now_refund: Value =
        app.get(&format!("/v1/refunds/{}", refund["id"].as_str().unwrap())).await.json().await.unwrap();
    assert_eq!(now_refund["status"], "failed", "never settled backwards");
    assert!(app.database_says(&format!("SELECT amount_refunded = 0 FROM payments WHERE id = '{id}'")).await);
    assert!(
        app.database_says(&format!(
            "SELECT needs_attention_at IS NULL FROM idempotency_keys WHERE idempotency_key = '{key}'"
        ))
        .await,
        "a stale event flags nothing"
    );
    // The events are in the key's story, by their own ids.
    let story: Value = app.key_story(&key).await.json().await.unwrap();
    let received: Vec<&str> = story["trail"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|entry| entry["action"] == "gateway_event.received")
        .map(|entry| entry["data"]["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(received, ["nudged", "stale", "stale"]);
}

/// A refund event that comes while the refund's key is not finished, the gateway's answer
/// recorded as `pending`, only wakes the key: the key's `finished` then hands the refund to the
/// settler due at once (not after its first backoff), whose look-up records what the event said.
#[tokio::test]
async fn a_refund_event_before_its_key_finishes_makes_the_refund_due_for_the_settler_at_once() {
    let app = app().await;
    let payment = app.paid(1000, "tok_refundPending").await;
    let (key, body) = (new_key(), json!({ "payment": payment["id"], "amount": 400 }));
    // The refund's `finished` (which stages its event) cannot commit. The run that made the
    // refund records its answer with it, so nothing of that commits; the retry, which took the
    // refund up, records it alone, and the key stays at `refund_created`, `pending` recorded.
    let mut holder = app.db().await;
    for point in ["started", "refund_created"] {
        holder.batch_execute("BEGIN; LOCK TABLE events IN EXCLUSIVE MODE").await.unwrap();
        assert_eq!(app.post_refund(&key, &body).await.status(), StatusCode::SERVICE_UNAVAILABLE);
        holder.batch_execute("ROLLBACK").await.unwrap();
        assert_eq!(app.key_row(&key).await.unwrap().recovery_point, point);
    }

    // The gateway settles the refund, and says so.
    app.gateway.settle_refunds().await;
    let downstream = app.downstream_key(app.key_row(&key).await.unwrap().id);
    let settled = app.gateway.refunds_for(&downstream).await.remove(0);
    assert_eq!(settled["status"], "succeeded");
    let early = event("refund.succeeded", settled, &downstream);
    let response = app.post_event(&early, Some(&signed(&early, &[SECRET], now()))).await;
    assert_eq!(response.json::<Value>().await.unwrap()["outcome"], "nudged");

    let refund: Value = app.post_refund(&key, &body).await.json().await.unwrap();
    assert_eq!(refund["status"], "pending", "finished with what its key recorded");
    let id = refund["id"].as_str().unwrap();
    assert!(app.database_says(&format!("SELECT settle_at <= now() FROM refunds WHERE id = '{id}'")).await);
    assert_eq!(app.workers().settler.run_once().await.unwrap(), Outcome::Worked);
    let now_refund: Value = app.get(&format!("/v1/refunds/{id}")).await.json().await.unwrap();
    assert_eq!(now_refund["status"], "succeeded");
    let paid = payment["id"].as_str().unwrap();
    let totals =
        format!("SELECT amount_refunded = 400 AND amount_refund_pending = 0 FROM payments WHERE id = '{paid}'");
    assert!(app.database_says(&totals).await);
}

/// A disagreement flagged while the key is not finished yet outlives its finish: the client's
/// retry finishes the key with what it recorded, and the key still waits for a person.
#[tokio::test]
async fn a_disagreement_flagged_before_the_key_finishes_stays_flagged_after() {
    let app = app().await;
    let key = new_key();
    let key_id = app.seed_key(&key, &payment_body(), "charge_created", Lock::Free).await;
    app.seed_payment(key_id, &key, "succeeded", Some("ch_recorded")).await;
    let downstream = app.downstream_key(key_id);

    let body = event("charge.succeeded", json!({ "id": "ch_another", "object": "charge" }), &downstream);
    let response = app.post_event(&body, Some(&signed(&body, &[SECRET], now()))).await;
    assert_eq!(response.json::<Value>().await.unwrap()["outcome"], "disagreement");
    let retried = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retried.status(), StatusCode::CREATED, "the retry finishes the key with what it recorded");

    let story: Value = app.key_story(&key).await.json().await.unwrap();
    assert_eq!(
        (story["recovery_point"].as_str(), story["needs_attention"].as_bool(), story["attention_reason"].as_str()),
        (Some("finished"), Some(true), Some("gateway_disagreement"))
    );
}

/// A `refund.failed` about a refund we recorded as succeeded is news that contradicts us (a
/// refund can fail after succeeding): flagged for a person, and no money moves.
#[tokio::test]
async fn a_refund_failing_after_it_succeeded_is_a_disagreement() {
    let app = TestApp::builder().webhook_secrets(&[SECRET]).spawn().await;
    let payment = app.paid(1000, "tok_visa").await;
    let key = new_key();
    let refund: Value =
        app.post_refund(&key, &json!({ "payment": payment["id"], "amount": 400 })).await.json().await.unwrap();
    assert_eq!(refund["status"], "succeeded");
    let downstream = app.downstream_key(app.key_row(&key).await.unwrap().id);
    let mut object = app.gateway.refunds_for(&downstream).await.remove(0);
    object["status"] = json!("failed");

    let late = event("refund.failed", object, &downstream);
    let response = app.post_event(&late, Some(&signed(&late, &[SECRET], now()))).await;
    assert_eq!(response.json::<Value>().await.unwrap()["outcome"], "disagreement");
    let id = payment["id"].as_str().unwrap();
    assert!(app.database_says(&format!("SELECT amount_refunded = 400 FROM payments WHERE id = '{id}'")).await);
    let story: Value = app.key_story(&key).await.json().await.unwrap();
    assert_eq!(
        (story["needs_attention"].as_bool(), story["attention_reason"].as_str()),
        (Some(true), Some("gateway_disagreement"))
    );
    // The operator's list names the refund the key made.
    let listed = needing_attention(&mut app.db().await, &payments_service::endpoints::all()).await.unwrap();
    let flagged: Vec<_> = listed.iter().map(|key| (key.request_path.as_str(), key.made_id)).collect();
    assert_eq!(flagged, [("/v1/refunds", Some(refund["id"].as_str().unwrap().parse().unwrap()))]);
}

#[tokio::test]
async fn with_no_retry_and_an_hours_backoff_the_gateways_event_finishes_the_payment() {
    let database = TestDatabase::create().await;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let (account, api_key) = payments_service::accounts::create(&mut conn, "events").await.unwrap();
    // `serve` with its in-process mock, which sends its events to it; the completer waits an hour
    // before driving a key on its own.
    let env = [
        ("DATABASE_URL", database.url.as_str()),
        ("PAYMENTS_MOCK_GATEWAY_BIND", "127.0.0.1:0"),
        ("PAYMENTS_COMPLETER_BACKOFF_MS", "3600000"),
        ("PAYMENTS_WORKER_INTERVAL_MS", "200"),
    ];
    let serve = Process::serve_with(&["serve", "--private-mock-gateway"], &env).await;
    let mock = serve.mock_gateway_url().await;
    let gateway = GatewayControl::new(&mock);
    gateway.fault("error_after", 1).await;
    let key = new_key();
    let answer = reqwest::Client::new()
        .post(format!("{}/v1/payments", serve.url))
        .bearer_auth(&api_key)
        .header("Idempotency-Key", &key)
        .json(&payment_body())
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::SERVICE_UNAVAILABLE);

    // Nobody retries: the event wakes the key, and the completer finishes it, long before its
    // backoff would have let it.
    let finished = format!(
        "SELECT count(*) AS n FROM idempotency_keys WHERE account_id = '{}' AND idempotency_key = '{key}' \
         AND recovery_point = 'finished'",
        account.id
    );
    wait_until(Duration::from_secs(20), "the event finishes the payment", || {
        let (url, sql) = (database.url.clone(), finished.clone());
        async move {
            let mut conn = AsyncPgConnection::establish(&url).await.unwrap();
            diesel::sql_query(sql).get_result::<Count>(&mut conn).await.unwrap().n == 1
        }
    })
    .await;
    let outcomes: Vec<InboxRow> =
        diesel::sql_query("SELECT outcome FROM gateway_events").load(&mut conn).await.unwrap();
    assert!(outcomes.iter().any(|o| o.outcome == "nudged"), "woken by its event");
    assert_eq!(gateway.stats().await.charges, 1);
}

/// The workers look for work once a minute, and no client retries: the gateway's event, the
/// events the finished payment and refund stage, and a pending refund's settlement each wake the
/// worker that acts on them (PostgreSQL's `NOTIFY`, after the commit), so each is done within
/// seconds, not at the next tick.
#[tokio::test]
async fn with_the_workers_looking_once_a_minute_an_event_and_what_it_stages_are_acted_on_at_once() {
    use wiremock::matchers::method;
    let database = TestDatabase::create().await;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let (account, api_key) = payments_service::accounts::create(&mut conn, "events").await.unwrap();
    let receiver = wiremock::MockServer::start().await;
    wiremock::Mock::given(method("POST")).respond_with(wiremock::ResponseTemplate::new(200)).mount(&receiver).await;
    let env = [
        ("DATABASE_URL", database.url.as_str()),
        ("PAYMENTS_MOCK_GATEWAY_BIND", "127.0.0.1:0"),
        ("PAYMENTS_WORKER_INTERVAL_MS", "60000"),
        ("PAYMENTS_WEBHOOK_URL", &receiver.uri()),
    ];
    let serve = Process::serve_with(&["serve", "--private-mock-gateway"], &env).await;
    let gateway = GatewayControl::new(&serve.mock_gateway_url().await);
    let post = |path: &str, key: &str, body: Value| {
        reqwest::Client::new()
            .post(format!("{}{path}", serve.url))
            .bearer_auth(&api_key)
            .header("Idempotency-Key", key)
            .json(&body)
            .send()
    };
    // Past the workers' first look, made as each starts.
    let database_says = |condition: String| {
        let url = database.url.clone();
        async move { TestApp::database_says_on(&mut AsyncPgConnection::establish(&url).await.unwrap(), &condition).await }
    };
    let delivered = |event: &'static str| {
        let receiver = &receiver;
        async move {
            let requests = receiver.received_requests().await.unwrap();
            requests.iter().any(|request| request.body_json::<Value>().is_ok_and(|body| body["type"] == event))
        }
    };

    gateway.fault("error_after", 1).await;
    let key = new_key();
    assert_eq!(post("/v1/payments", &key, payment_body()).await.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
    let finished = format!(
        "SELECT recovery_point = 'finished' FROM idempotency_keys WHERE account_id = '{}' AND idempotency_key = '{key}'",
        account.id
    );
    wait_until(Duration::from_secs(15), "the event wakes the completer, which finishes the payment", || {
        database_says(finished.clone())
    })
    .await;
    wait_until(Duration::from_secs(15), "the outbox is woken to deliver payment.succeeded", || {
        delivered("payment.succeeded")
    })
    .await;

    // The connection the server listens on is cut: it listens again on another.
    let cut = "SELECT count(pg_terminate_backend(pid)) = 1 FROM pg_stat_activity
               WHERE datname = current_database() AND (query LIKE 'LISTEN %' OR query = 'SELECT 1')";
    assert!(database_says(cut.into()).await, "one connection listens");

    // A refund the gateway settles later: its settlement, applied from the gateway's event,
    // stages refund.succeeded, which goes out at once too.
    let paid: Value =
        post("/v1/payments", &new_key(), json!({ "amount": 1000, "currency": "usd", "source": "tok_refundPending" }))
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    let refund = post("/v1/refunds", &new_key(), json!({ "payment": paid["id"], "amount": 400 })).await.unwrap();
    assert_eq!(refund.json::<Value>().await.unwrap()["status"], "pending");
    gateway.settle_refunds().await;
    wait_until(Duration::from_secs(15), "the settlement's event goes out at once", || delivered("refund.succeeded"))
        .await;
    assert_eq!(gateway.stats().await.charges, 2);
}

#[derive(diesel::QueryableByName)]
struct InboxRow {
    #[diesel(sql_type = diesel::sql_types::Text)]
    outcome: String,
}

#[tokio::test]
async fn the_event_of_a_payment_made_with_the_largest_body_is_received() {
    let app = TestApp::builder().gateway_events().spawn().await;
    // Near the request's own bound, in characters of two bytes each; the event adds the charge's
    // and its own fields around them.
    let metadata: serde_json::Map<String, Value> =
        (0..20).map(|i| (format!("k{i:02}"), json!("é".repeat(385)))).collect();
    let body = json!({ "amount": 1000, "currency": "usd", "source": "tok_visa", "description": "é".repeat(200),
                       "metadata": metadata });
    let bytes = serde_json::to_vec(&body).unwrap();
    assert!((15 * 1024..16 * 1024).contains(&bytes.len()), "{} bytes", bytes.len());
    let key = new_key();
    assert_eq!(app.post_payment(&key, &body).await.status(), StatusCode::CREATED);

    wait_until(Duration::from_secs(10), "the gateway hears its event acknowledged", || async {
        app.gateway.event_stats().await.3 == 1
    })
    .await;
    assert_eq!(app.gateway.event_stats().await.2, 1, "at its first delivery");
    let key_id = app.key_row(&key).await.unwrap().id;
    let received = format!("SELECT count(*) = 1 FROM gateway_events WHERE idempotency_key_id = '{key_id}'");
    assert!(app.database_says(&received).await);
}

#[tokio::test]
async fn an_event_about_no_request_of_ours_is_acknowledged_and_left() {
    let app = app().await;
    let before = written(&app).await;
    for caused_by in [json!({ "idempotency_key": "someone-elses-key" }), json!(null)] {
        let mut body: Value = serde_json::from_slice(&event("charge.succeeded", json!({ "id": "ch_1" }), "x")).unwrap();
        body["request"] = caused_by.clone();
        let body = serde_json::to_vec(&body).unwrap();
        let response = app.post_event(&body, Some(&signed(&body, &[SECRET], now()))).await;
        assert_eq!(response.status(), StatusCode::OK, "{caused_by}");
        assert_eq!(response.json::<Value>().await.unwrap()["outcome"], "unknown", "{caused_by}");
    }
    assert_eq!(written(&app).await, before, "nothing recorded");
}

/// On Citus, a commit that a crashing worker did not confirm is reported done, and its rows show
/// only once the coordinator's recovery finishes it: an event read in between names a key of ours
/// under which the database shows nothing. Here the payment is taken out of sight and put back.
#[tokio::test]
async fn an_event_naming_a_key_of_ours_the_database_does_not_show_yet_is_refused_until_it_does() {
    let app = app().await;
    let (payment, downstream) = charged(&app).await;
    let mut conn = app.db().await;
    let hide = format!(
        "CREATE TEMP TABLE out_of_sight AS SELECT * FROM payments WHERE id = '{id}';
         DELETE FROM payments WHERE id = '{id}'",
        id = payment["id"].as_str().unwrap()
    );
    conn.batch_execute(&hide).await.unwrap();
    let charge = json!({ "id": payment["gateway_charge_id"], "object": "charge" });
    let body = event("charge.succeeded", charge.clone(), &downstream);
    let before = written(&app).await;
    let response = app.post_event(&body, Some(&signed(&body, &[SECRET], now()))).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(response.headers().contains_key("Retry-After"));
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "https://payments.example/problems/event-not-seen-yet");
    assert_eq!(written(&app).await, before, "nothing recorded");

    // The same event once the payment shows: applied.
    conn.batch_execute("INSERT INTO payments OVERRIDING SYSTEM VALUE SELECT * FROM out_of_sight").await.unwrap();
    let response = app.post_event(&body, Some(&signed(&body, &[SECRET], now()))).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.json::<Value>().await.unwrap()["outcome"], "applied");

    // One that still shows nothing after ten minutes is taken for no request of ours.
    conn.batch_execute("DELETE FROM gateway_events; DELETE FROM payments").await.unwrap();
    let mut old: Value = serde_json::from_slice(&event("charge.succeeded", charge, &downstream)).unwrap();
    old["created"] = json!(now() - 11 * 60);
    let old = serde_json::to_vec(&old).unwrap();
    let response = app.post_event(&old, Some(&signed(&old, &[SECRET], now()))).await;
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.json::<Value>().await.unwrap()["outcome"], "unknown");
}

/// The wait for a key the database does not show yet is bounded on both sides of the event's
/// `created`: ten minutes after it, and five minutes before it (a gateway's clock a little ahead of
/// ours). An event stamped further ahead is no gateway's honest clock, and was answered
/// `503 event-not-seen-yet` until ten minutes after its `created`: a year ahead, for a year.
#[tokio::test]
async fn an_event_naming_a_key_of_ours_stamped_far_ahead_of_our_clock_is_not_waited_for() {
    let app = app().await;
    let unseen = app.downstream_key(Uuid::now_v7());
    let stamped = |ahead: chrono::TimeDelta| {
        let mut body: Value =
            serde_json::from_slice(&event("charge.succeeded", json!({ "id": "ch_1" }), &unseen)).unwrap();
        body["created"] = json!((chrono::Utc::now() + ahead).timestamp());
        serde_json::to_vec(&body).unwrap()
    };
    let before = written(&app).await;
    for ahead in [chrono::TimeDelta::days(365), chrono::TimeDelta::minutes(10)] {
        let body = stamped(ahead);
        let response = app.post_event(&body, Some(&signed(&body, &[SECRET], now()))).await;
        assert_eq!(response.status(), StatusCode::OK, "{} minutes ahead", ahead.num_minutes());
        assert_eq!(
            response.json::<Value>().await.unwrap()["outcome"],
            "unknown",
            "{} minutes ahead",
            ahead.num_minutes()
        );
    }
    // A clock a minute ahead is a gateway's: the event waits for the key, as one stamped now does.
    let body = stamped(chrono::TimeDelta::minutes(1));
    let response = app.post_event(&body, Some(&signed(&body, &[SECRET], now()))).await;
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["type"], "https://payments.example/problems/event-not-seen-yet");
    assert_eq!(written(&app).await, before, "nothing recorded");
}

#[tokio::test]
async fn with_no_secret_configured_every_event_is_refused() {
    let app = TestApp::spawn().await;
    let (payment, downstream) = charged(&app).await;
    let body = event("charge.succeeded", json!({ "id": payment["gateway_charge_id"] }), &downstream);
    for secret in [SECRET, ""] {
        let response = app.post_event(&body, Some(&signed(&body, &[secret], now()))).await;
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "signed with {secret:?}");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["type"], "https://payments.example/problems/invalid-signature");
    }
    assert!(app.database_says("SELECT count(*) = 0 FROM gateway_events").await);
}

#[tokio::test]
async fn a_failure_of_ours_rolls_the_event_back_and_answers_5xx_so_the_gateway_sends_it_again() {
    let app = app().await;
    let (payment, downstream) = charged(&app).await;
    let body = event("charge.succeeded", json!({ "id": payment["gateway_charge_id"] }), &downstream);
    let before = written(&app).await;
    // The inbox cannot be written: the event's transaction times out waiting for it.
    let mut holder = app.db().await;
    holder.batch_execute("BEGIN; LOCK TABLE gateway_events IN EXCLUSIVE MODE").await.unwrap();
    let response = app.post_event(&body, Some(&signed(&body, &[SECRET], now()))).await;
    holder.batch_execute("ROLLBACK").await.unwrap();

    assert!(response.status().is_server_error(), "{}", response.status());
    assert_eq!(written(&app).await, before, "nothing of it committed");
    let again = app.post_event(&body, Some(&signed(&body, &[SECRET], now()))).await;
    assert_eq!(again.json::<Value>().await.unwrap()["outcome"], "applied", "sent again, it is applied once");
}

/// A process frozen in the middle of applying an event (stopped between two statements of its
/// transaction, holding the refund's and the payment's rows) holds them for seconds, not for as
/// long as it is frozen: the server ends its idle transaction, and meanwhile a refund of the
/// payment on another process answers that a record is locked, not that the database is gone.
#[tokio::test]
async fn a_process_frozen_inside_an_events_transaction_holds_its_rows_for_seconds_not_for_ever() {
    let app = app().await;
    let payment = app.paid(1000, "tok_refundPending").await;
    let first = new_key();
    let refund: Value =
        app.post_refund(&first, &json!({ "payment": payment["id"], "amount": 600 })).await.json().await.unwrap();
    assert_eq!(refund["status"], "pending");
    app.gateway.settle_refunds().await;
    let downstream = app.downstream_key(app.key_row(&first).await.unwrap().id);
    let body = event("refund.succeeded", app.gateway.refunds_for(&downstream).await.remove(0), &downstream);
    let server = Process::serve(
        &app.database.url,
        app.gateway_url(),
        &["--no-workers"],
        &[("PAYMENTS_GATEWAY_WEBHOOK_SECRETS", SECRET)],
    )
    .await;

    // The payment's row held here, the event's settlement waits for it in the middle of the
    // server's transaction (the inbox row and the refund's row written); the server is stopped
    // there, and the row let go: the server's transaction sits idle, holding all three.
    // The wait is watched from inside the holder's session, so that the server is stopped and
    // the row let go well inside the second the event's statement waits for it.
    const OURS: &str = "datname = current_database() AND application_name = 'payments'";
    let payment_id = payment["id"].as_str().unwrap();
    let mut holder = OpenTransaction::begin(&app.database.url).await;
    holder.run(&format!("SELECT 1 FROM payments WHERE id = '{payment_id}' FOR UPDATE")).await;
    let delivery = tokio::spawn(
        reqwest::Client::new()
            .post(format!("{}/webhooks/gateway", server.url))
            .header("Gateway-Signature", signed(&body, &[SECRET], now()))
            .body(body.clone())
            .send(),
    );
    let waited = holder.wait_until_waited_for(Duration::from_secs(10)).await;
    waited.expect("the event's transaction waits for the held row");
    server.signal(nix::sys::signal::Signal::SIGSTOP);
    holder.rollback().await;
    wait_until(Duration::from_secs(10), "the frozen server's transaction sits idle, holding the rows", || async {
        app.database_says(&format!(
            "SELECT EXISTS (SELECT FROM pg_stat_activity WHERE {OURS} AND state = 'idle in transaction')"
        ))
        .await
    })
    .await;

    // Another process refunds the rest of the payment, retrying as its answers say, while the
    // server stays frozen.
    let (second, rest) = (new_key(), json!({ "payment": payment["id"], "amount": 400 }));
    let mut locked = 0;
    let refunded = loop {
        let response = app.post_refund(&second, &rest).await;
        if response.status() != StatusCode::SERVICE_UNAVAILABLE {
            break response;
        }
        assert_eq!(response.headers()["retry-after"], "1");
        let problem: Value = response.json().await.unwrap();
        assert_eq!(problem["type"], "https://payments.example/problems/record-locked", "{problem}");
        locked += 1;
        assert!(locked < 30, "the frozen transaction still holds the payment's row");
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    assert_eq!(refunded.status(), StatusCode::CREATED);
    assert!(locked > 0, "the refund waited for the frozen transaction at least once");
    assert!(server.is_stopped(), "the rows were let go while the server was still frozen");

    // Woken, the server finds its transaction gone and answers 5xx, so the event comes again,
    // and is applied then, once.
    server.signal(nix::sys::signal::Signal::SIGCONT);
    assert!(delivery.await.unwrap().unwrap().status().is_server_error());
    let again = app.post_event(&body, Some(&signed(&body, &[SECRET], now()))).await;
    assert_eq!(again.json::<Value>().await.unwrap()["outcome"], "applied");
    assert!(
        app.database_says(&format!(
            "SELECT amount_refunded = 600 AND amount_refund_pending = 400 FROM payments WHERE id = '{payment_id}'"
        ))
        .await
    );
}
