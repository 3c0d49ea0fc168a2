//! The mock gateway's refunds over real HTTP.

use std::time::Duration;

use reqwest::{Response, StatusCode};
use serde_json::{Value, json};

use super::{Gw, body, impatient_client, json_of, replayed, start};
use crate::helpers::wait_until;

impl Gw {
    async fn refund(&self, key: &str, body: &Value) -> Response {
        self.refund_with(&self.client, key, body).await.expect("refund answered")
    }

    async fn refund_with(&self, client: &reqwest::Client, key: &str, body: &Value) -> reqwest::Result<Response> {
        let url = format!("{}/v1/refunds", self.url);
        client.post(url).header("Idempotency-Key", key).json(body).send().await
    }

    /// A charge of `amount` made with `source`, as the gateway answered it.
    async fn charged(&self, amount: u64, source: &str) -> Value {
        let (status, charge) =
            json_of(self.charge(&format!("charge-{source}-{amount}"), &body(amount, source)).await).await;
        assert_eq!(status, StatusCode::OK, "{charge}");
        charge
    }

    async fn refunds_with_key(&self, key: &str) -> Vec<Value> {
        let (status, list) = self.get(&format!("/v1/refunds?idempotency_key={key}")).await;
        assert_eq!((status, &list["object"]), (StatusCode::OK, &json!("list")));
        list["data"].as_array().expect("data is an array").clone()
    }

    /// What the gateway shows of a charge now: its refunded amount and whether it is all refunded.
    async fn refunded(&self, charge: &Value) -> (Value, Value) {
        let (_, now) = self.get(&format!("/v1/charges/{}", charge["id"].as_str().unwrap())).await;
        (now["amount_refunded"].clone(), now["refunded"].clone())
    }

    async fn refund_stats(&self) -> (u64, u64, u64) {
        let (_, stats) = self.get("/_control/stats").await;
        let count = |name: &str| stats[name].as_u64().expect("a count");
        (count("refunds"), count("refunded_amount"), count("refund_requests"))
    }

    async fn settle_refunds(&self) -> Value {
        let response = self.client.post(format!("{}/_control/refunds/settle", self.url)).send().await;
        let (status, settled) = json_of(response.expect("settle answered")).await;
        assert_eq!(status, StatusCode::OK);
        settled
    }
}

fn refund_of(charge: &Value, amount: Option<u64>) -> Value {
    json!({"charge": charge["id"], "amount": amount})
}

/// The error's status, `type`, `code` and `param`.
async fn error_of(response: Response) -> (StatusCode, Value, Value, Value) {
    let (status, body) = json_of(response).await;
    let error = &body["error"];
    assert!(error["message"].is_string(), "{body}");
    (status, error["type"].clone(), error["code"].clone(), error["param"].clone())
}

#[tokio::test]
async fn a_refund_succeeds_and_shows_on_its_charge() {
    let gw = start().await;
    let charge = gw.charged(1000, "tok_visa").await;
    let asked = json!({"charge": charge["id"], "amount": 400, "reason": "requested_by_customer",
        "metadata": {"order": "42"}});

    let response = gw.refund("r1", &asked).await;

    assert!(!replayed(&response));
    let (status, refund) = json_of(response).await;
    assert_eq!(status, StatusCode::OK);
    let id = refund["id"].as_str().expect("an id");
    assert!(id.starts_with("re_") && id.len() == 27, "{id}");
    let expected = json!({"id": id, "object": "refund", "amount": 400, "charge": charge["id"], "currency": "usd",
        "metadata": {"order": "42"}, "reason": "requested_by_customer", "status": "succeeded",
        "idempotency_key": "r1", "created": refund["created"]});
    assert_eq!(refund, expected);
    assert_eq!(gw.get(&format!("/v1/refunds/{id}")).await, (StatusCode::OK, refund.clone()));
    assert_eq!(gw.refunds_with_key("r1").await, vec![refund]);
    assert_eq!(gw.refunded(&charge).await, (json!(400), json!(false)));
    assert_eq!((&charge["amount_refunded"], &charge["refunded"]), (&json!(0), &json!(false)), "as charged");

    let (_, rest) = json_of(gw.refund("r2", &refund_of(&charge, None)).await).await;
    assert_eq!((&rest["amount"], &rest["reason"], &rest["metadata"]), (&json!(600), &Value::Null, &json!({})));
    assert_eq!(gw.refunded(&charge).await, (json!(1000), json!(true)));
    assert_eq!(gw.refund_stats().await, (2, 1000, 2));
    gw.stop().await;
}

#[tokio::test]
async fn a_refund_of_more_than_is_left_is_refused_and_the_refusal_is_kept() {
    let gw = start().await;
    let charge = gw.charged(500, "tok_visa").await;

    let too_large = gw.refund("r1", &refund_of(&charge, Some(501))).await;
    let refusal = (StatusCode::BAD_REQUEST, json!("invalid_request_error"), json!("amount_too_large"), json!("amount"));
    assert_eq!(error_of(too_large).await, refusal);
    assert_eq!(gw.refund("r2", &refund_of(&charge, Some(500))).await.status(), StatusCode::OK);
    let nothing_left = gw.refund("r3", &refund_of(&charge, Some(1))).await;
    let (status, error) = (nothing_left.status(), nothing_left.bytes().await.unwrap());
    let body: Value = serde_json::from_slice(&error).unwrap();
    assert_eq!((status, &body["error"]["code"]), (StatusCode::BAD_REQUEST, &json!("charge_already_refunded")));

    // An answer decided against the books is the key's answer for good.
    let again = gw.refund("r3", &refund_of(&charge, Some(1))).await;
    assert!(replayed(&again));
    assert_eq!((again.status(), again.bytes().await.unwrap()), (status, error));
    let unknown = gw.refund("r4", &json!({"charge": "ch_nope", "amount": 1})).await;
    let missing = (StatusCode::NOT_FOUND, json!("invalid_request_error"), json!("resource_missing"), json!("charge"));
    assert_eq!(error_of(unknown).await, missing);
    let declined = gw.charge("declined", &super::body(500, "tok_chargeDeclined")).await;
    let (_, error) = json_of(declined).await;
    let failed = gw.refund("r5", &json!({"charge": error["error"]["charge"]})).await;
    let not_refundable =
        (StatusCode::BAD_REQUEST, json!("invalid_request_error"), json!("charge_not_refundable"), json!("charge"));
    assert_eq!(error_of(failed).await, not_refundable, "a declined card's charge moved no money");
    assert!(gw.refunds_with_key("r1").await.is_empty() && gw.refunds_with_key("r3").await.is_empty());
    assert_eq!(gw.refund_stats().await, (1, 500, 6));
    gw.stop().await;
}

#[tokio::test]
async fn a_refund_key_replays_byte_for_byte_and_refunds_once() {
    let gw = start().await;
    let charge = gw.charged(500, "tok_visa").await;
    let first = gw.refund("r", &refund_of(&charge, Some(100))).await;
    let first_bytes = first.bytes().await.unwrap();

    let again = gw.refund("r", &json!({"amount": 100, "charge": charge["id"]})).await;

    assert!(replayed(&again));
    assert_eq!(again.bytes().await.unwrap(), first_bytes);
    let (status, kind, _, _) = error_of(gw.refund("r", &refund_of(&charge, Some(101))).await).await;
    assert_eq!((status, kind), (StatusCode::BAD_REQUEST, json!("idempotency_error")), "another body");
    let charge_key = charge["idempotency_key"].as_str().unwrap();
    let (status, kind, _, _) = error_of(gw.refund(charge_key, &refund_of(&charge, Some(100))).await).await;
    assert_eq!((status, kind), (StatusCode::BAD_REQUEST, json!("idempotency_error")), "a charge's key");
    assert_eq!(gw.refunds_with_key("r").await.len(), 1);
    assert_eq!(gw.refund_stats().await, (1, 100, 4));
    gw.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_key_in_use_is_409_and_refunds_once() {
    let gw = start().await;
    let charge = gw.charged(500, "tok_visa").await;
    gw.set_faults(json!({"mode": "latency", "latency_ms": 1000})).await;
    let slow = tokio::spawn({
        let (client, url) = (gw.client.clone(), format!("{}/v1/refunds", gw.url));
        client.post(url).header("Idempotency-Key", "r").json(&refund_of(&charge, Some(100))).send()
    });
    wait_until(Duration::from_secs(5), "the first request arrives", || async { gw.refund_stats().await.2 == 1 }).await;

    let (status, kind, code, _) = error_of(gw.refund("r", &refund_of(&charge, Some(100))).await).await;

    assert_eq!(
        (status, kind, code),
        (StatusCode::CONFLICT, json!("idempotency_error"), json!("idempotency_key_in_use"))
    );
    let (status, refund) = json_of(slow.await.unwrap().expect("first answered")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(gw.refunds_with_key("r").await, vec![refund]);
    gw.stop().await;
}

#[tokio::test]
async fn faults_strike_refunds_too_and_a_retry_gets_the_one_refund() {
    let gw = start().await;
    let charge = gw.charged(900, "tok_visa").await;
    let asked = refund_of(&charge, Some(300));

    gw.set_faults(json!({"mode": "error_before"})).await;
    assert_eq!(gw.refund("before", &asked).await.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(gw.refunds_with_key("before").await.is_empty(), "nothing made");
    gw.set_faults(json!({"mode": "error_after"})).await;
    assert_eq!(gw.refund("after", &asked).await.status(), StatusCode::INTERNAL_SERVER_ERROR);
    gw.set_faults(json!({"mode": "timeout_after"})).await;
    let gave_up = gw.refund_with(&impatient_client(), "timeout", &asked).await;
    assert!(gave_up.expect_err("no answer").is_timeout());

    for key in ["after", "timeout"] {
        let made = gw.refunds_with_key(key).await;
        assert_eq!(made.len(), 1, "{key}: the refund was made");
        let retry = gw.refund(key, &asked).await;
        assert!(replayed(&retry), "{key}");
        assert_eq!(json_of(retry).await, (StatusCode::OK, made[0].clone()));
    }
    assert_eq!(gw.refund("before", &asked).await.status(), StatusCode::OK, "the first real attempt");
    assert_eq!(gw.refunded(&charge).await, (json!(900), json!(true)));
    assert_eq!(gw.faults().await, 3);
    gw.stop().await;
}

#[tokio::test]
async fn a_pending_refund_succeeds_on_its_own() {
    let gw = start().await;
    let charge = gw.charged(500, "tok_refundPending").await;
    let (_, refund) = json_of(gw.refund("r", &refund_of(&charge, Some(200))).await).await;
    assert_eq!(refund["status"], "pending");
    assert_eq!(gw.refunded(&charge).await, (json!(200), json!(false)), "a pending refund takes its amount");
    let path = format!("/v1/refunds/{}", refund["id"].as_str().unwrap());

    wait_until(Duration::from_secs(10), "the refund succeeds", || async {
        gw.get(&path).await.1["status"] == "succeeded"
    })
    .await;

    let replay = gw.refund("r", &refund_of(&charge, Some(200))).await;
    assert_eq!(json_of(replay).await.1, refund, "the key's answer is the one it gave");
    assert_eq!(gw.refunds_with_key("r").await[0]["status"], "succeeded");
    assert_eq!(gw.settle_refunds().await, json!({"settled": 0}), "nothing left pending");
    gw.stop().await;
}

#[tokio::test]
async fn a_failed_refund_gives_its_amount_back() {
    let gw = start().await;
    let charge = gw.charged(500, "tok_refundFails").await;
    let (_, refund) = json_of(gw.refund("r1", &refund_of(&charge, None)).await).await;
    assert_eq!((&refund["status"], &refund["amount"]), (&json!("pending"), &json!(500)));
    let (status, _, code, _) = error_of(gw.refund("r2", &refund_of(&charge, Some(1))).await).await;
    assert_eq!((status, code), (StatusCode::BAD_REQUEST, json!("charge_already_refunded")), "while pending");

    assert_eq!(gw.settle_refunds().await, json!({"settled": 1}));

    let (_, failed) = gw.get(&format!("/v1/refunds/{}", refund["id"].as_str().unwrap())).await;
    assert_eq!((&failed["status"], &failed["failure_reason"]), (&json!("failed"), &json!("expired_or_canceled_card")));
    assert_eq!(gw.refunded(&charge).await, (json!(0), json!(false)));
    assert_eq!(gw.refund_stats().await, (1, 0, 2));
    let (status, again) = json_of(gw.refund("r3", &refund_of(&charge, Some(500))).await).await;
    assert_eq!((status, &again["status"]), (StatusCode::OK, &json!("pending")), "all of it again");
    gw.stop().await;
}

#[tokio::test]
async fn refunds_are_found_by_key_after_keys_are_forgotten() {
    let gw = start().await;
    let charge = gw.charged(500, "tok_visa").await;
    let (_, refund) = json_of(gw.refund("r", &refund_of(&charge, Some(100))).await).await;
    let (status, error) = gw.get("/v1/refunds/re_nope").await;
    assert_eq!((status, &error["error"]["code"]), (StatusCode::NOT_FOUND, &json!("resource_missing")));

    assert_eq!(gw.delete("/_control/idempotency-keys").await, StatusCode::NO_CONTENT);

    assert_eq!(gw.refunds_with_key("r").await, vec![refund.clone()]);
    // The gateway no longer knows the key, so the same request refunds again.
    let (_, second) = json_of(gw.refund("r", &refund_of(&charge, Some(100))).await).await;
    assert_ne!(second["id"], refund["id"]);
    assert_eq!(gw.refunds_with_key("r").await, vec![refund, second]);
    let (_, stats) = gw.get("/_control/stats").await;
    assert_eq!((&stats["refund_look_ups"], &stats["look_ups"]), (&json!(2), &json!(0)));
    gw.stop().await;
}

#[tokio::test]
async fn a_malformed_refund_is_400_and_not_remembered() {
    let gw = start().await;
    let charge = gw.charged(500, "tok_visa").await;
    let id = &charge["id"];
    let bad = [
        json!({"charge": id, "amount": 0}),
        json!({"charge": id, "amount": -5}),
        json!({"charge": id, "reason": "bored"}),
        json!({"charge": id, "colour": "red"}),
        json!({"amount": 5}),
    ];
    for body in bad {
        let (status, kind, _, _) = error_of(gw.refund("r", &body).await).await;
        assert_eq!((status, kind), (StatusCode::BAD_REQUEST, json!("invalid_request_error")), "{body}");
    }
    let response = gw.refund("r", &refund_of(&charge, Some(5))).await;
    assert_eq!((response.status(), replayed(&response)), (StatusCode::OK, false), "the key is still unused");
    assert_eq!(gw.refund_stats().await, (1, 5, 6));
    gw.stop().await;
}
