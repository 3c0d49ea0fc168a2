//! The mock gateway's authorizations, captures and cancels over real HTTP.

use reqwest::{Response, StatusCode};
use serde_json::{Value, json};

use super::{Gw, json_of, replayed, start};

impl Gw {
    /// An authorization of `amount` (a charge made with `capture: false`), as the gateway answered it.
    async fn authorized(&self, key: &str, amount: u64) -> Value {
        let body = json!({"amount": amount, "currency": "usd", "source": "tok_visa", "capture": false});
        let (status, charge) = json_of(self.charge(key, &body).await).await;
        assert_eq!(status, StatusCode::OK, "{charge}");
        charge
    }

    /// `POST /v1/charges/{id}/{action}` under `key`, with `body` if any.
    async fn change(&self, id: &str, action: &str, key: &str, body: Option<&Value>) -> Response {
        let url = format!("{}/v1/charges/{id}/{action}", self.url);
        let request = self.client.post(url).header("Idempotency-Key", key);
        let request = match body {
            Some(body) => request.json(body),
            None => request,
        };
        request.send().await.expect("answered")
    }

    async fn counts(&self) -> Value {
        let (_, stats) = self.get("/_control/stats").await;
        let names = ["charges", "authorizations", "captures", "captured_amount", "cancels", "capture_requests"];
        names.iter().map(|name| (name.to_string(), stats[name].clone())).collect::<serde_json::Map<_, _>>().into()
    }
}

/// The error code of a refusal.
async fn refusal(response: Response) -> (StatusCode, String) {
    let (status, body) = json_of(response).await;
    (status, body["error"]["code"].as_str().unwrap_or_default().to_owned())
}

#[tokio::test]
async fn an_authorization_is_captured_once_under_its_key_and_replayed() {
    let gw = start().await;
    let charge = gw.authorized("auth", 500).await;
    assert_eq!(
        (&charge["status"], &charge["captured"], &charge["amount_captured"]),
        (&json!("requires_capture"), &json!(false), &json!(0))
    );
    let id = charge["id"].as_str().unwrap();

    let too_much = gw.change(id, "capture", "too-much", Some(&json!({"amount": 501}))).await;
    assert_eq!(refusal(too_much).await, (StatusCode::BAD_REQUEST, "amount_too_large".into()));
    let first = gw.change(id, "capture", "capture", Some(&json!({"amount": 300}))).await;
    assert!(!replayed(&first));
    let (status, captured) = json_of(first).await;
    assert_eq!(
        (status, &captured["status"], &captured["amount_captured"]),
        (StatusCode::OK, &json!("succeeded"), &json!(300))
    );
    let again = gw.change(id, "capture", "capture", Some(&json!({"amount": 300}))).await;
    assert!(replayed(&again));
    assert_eq!(json_of(again).await.1, captured, "the same answer, replayed");
    let other_amount = gw.change(id, "capture", "capture", Some(&json!({"amount": 200}))).await;
    assert_eq!(other_amount.status(), StatusCode::BAD_REQUEST, "the key with another body");

    let second = gw.change(id, "capture", "another-key", None).await;
    assert_eq!(refusal(second).await, (StatusCode::BAD_REQUEST, "charge_already_captured".into()));
    let cancel = gw.change(id, "cancel", "cancel", None).await;
    assert_eq!(refusal(cancel).await, (StatusCode::BAD_REQUEST, "charge_already_captured".into()));
    let counts = gw.counts().await;
    assert_eq!(
        counts,
        json!({"charges": 0, "authorizations": 1, "captures": 1, "captured_amount": 300, "cancels": 0, "capture_requests": 5})
    );
    gw.stop().await;
}

#[tokio::test]
async fn a_cancelled_authorization_is_never_captured_and_an_expired_one_only_cancelled() {
    let gw = start().await;
    let first = gw.authorized("first", 500).await;
    let first = first["id"].as_str().unwrap();
    let (status, canceled) = json_of(gw.change(first, "cancel", "cancel", Some(&json!({}))).await).await;
    assert_eq!((status, &canceled["status"]), (StatusCode::OK, &json!("canceled")));
    let capture = gw.change(first, "capture", "capture", None).await;
    assert_eq!(refusal(capture).await, (StatusCode::BAD_REQUEST, "charge_canceled".into()));

    let second = gw.authorized("second", 500).await;
    let second = second["id"].as_str().unwrap();
    let (_, expired) = gw.get("/_control/stats").await;
    assert_eq!(expired["cancels"], 1);
    let response = gw.client.post(format!("{}/_control/authorizations/expire", gw.url)).send().await.unwrap();
    assert_eq!(json_of(response).await.1, json!({"expired": 1}));
    let late = gw.change(second, "capture", "late", None).await;
    assert_eq!(refusal(late).await, (StatusCode::BAD_REQUEST, "authorization_expired".into()));
    let (status, canceled) = json_of(gw.change(second, "cancel", "lapse", None).await).await;
    assert_eq!((status, &canceled["status"]), (StatusCode::OK, &json!("canceled")));

    let unknown = gw.change("ch_nope", "capture", "unknown", None).await;
    assert_eq!(refusal(unknown).await, (StatusCode::NOT_FOUND, "resource_missing".into()));
    let no_key = gw.client.post(format!("{}/v1/charges/{second}/cancel", gw.url)).send().await.unwrap();
    assert_eq!(no_key.status(), StatusCode::BAD_REQUEST, "a key is required");
    let unknown_field = gw.change(second, "capture", "odd", Some(&json!({"amount_to_capture": 1}))).await;
    assert_eq!(unknown_field.status(), StatusCode::BAD_REQUEST);
    gw.stop().await;
}

#[tokio::test]
async fn a_capture_failing_after_it_was_made_is_replayed_by_its_key() {
    let gw = start().await;
    let charge = gw.authorized("auth", 500).await;
    let id = charge["id"].as_str().unwrap();
    gw.set_faults(json!({"mode": "error_after", "count": 1})).await;
    let failed = gw.change(id, "capture", "capture", None).await;
    assert_eq!(failed.status(), StatusCode::INTERNAL_SERVER_ERROR);
    let (status, captured) = json_of(gw.change(id, "capture", "capture", None).await).await;
    assert_eq!((status, &captured["amount_captured"]), (StatusCode::OK, &json!(500)), "captured once, by the first");
    assert_eq!(gw.counts().await["captures"], 1);
    gw.stop().await;
}

#[tokio::test]
async fn the_gateway_changes_authorizations_on_its_own_under_keys_of_its_own_and_lists_what_it_changed() {
    let gw = start().await;
    let own_changes = format!("{}/_control/authorizations/own-changes", gw.url);
    let set = |spec: Value| gw.client.post(&own_changes).json(&spec).send();
    let refused = json_of(set(json!({"rate": 1.5})).await.unwrap()).await;
    assert_eq!(refused.0, StatusCode::BAD_REQUEST, "{}", refused.1);
    // Every authorization, changed as soon as it is made: due the moment it is made, the change
    // is made by the next look at the books.
    let (status, plan) = json_of(set(json!({"rate": 1.0, "within_ms": 0})).await.unwrap()).await;
    assert_eq!((status, &plan), (StatusCode::OK, &json!({"rate": 1.0, "within_ms": 0})));
    assert_eq!(gw.get("/_control/authorizations/own-changes").await.1, plan);

    let id = gw.authorized("auth", 1000).await["id"].as_str().unwrap().to_owned();
    let (_, charge) = gw.get(&format!("/v1/charges/{id}")).await;
    let (_, made) = gw.get("/_control/authorizations/own-changes/made").await;
    let [change] = made["data"].as_array().unwrap().as_slice() else { panic!("one change: {made}") };
    assert_eq!((&change["charge"], &change["amount_captured"]), (&json!(id), &charge["amount_captured"]));
    assert!(change["idempotency_key"].as_str().unwrap().starts_with("own_"), "{change}");
    let (status, code) = match change["kind"].as_str().unwrap() {
        "capture" => ("succeeded", "charge_already_captured"),
        _ => ("canceled", "charge_canceled"),
    };
    assert_eq!(charge["status"], status, "{charge}");
    assert_eq!(gw.counts().await["authorizations"], 1);
    // The merchant's change comes after the gateway's, and is refused.
    assert_eq!(refusal(gw.change(&id, "cancel", "ours", None).await).await, (StatusCode::BAD_REQUEST, code.into()));

    // Left alone from now on.
    assert_eq!(gw.delete("/_control/authorizations/own-changes").await, StatusCode::NO_CONTENT);
    let open = gw.authorized("auth2", 1000).await["id"].as_str().unwrap().to_owned();
    assert_eq!(gw.get(&format!("/v1/charges/{open}")).await.1["status"], "requires_capture");
    assert_eq!(gw.get("/_control/authorizations/own-changes/made").await.1["data"].as_array().unwrap().len(), 1);
    gw.stop().await;
}
