//! Our gateway client's refund calls: every shape of answer a gateway can give, read as what it
//! means (wiremock, one server per answer), and the client and the mock gateway agreeing (a real
//! `MockGateway`). The rule above all: an answer that does not say whether money moved is never
//! "not refunded".

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use payments_mock_gateway::{Controls, FaultPlan, MockGateway};
use payments_service::gateway::{
    Answered, ChargeRequest, GatewayClient, GatewayError, Refund, RefundRequest, RefundStatus,
};
use payments_service::metrics::Metrics;
use serde_json::{Value, json};
use wiremock::matchers::{body_json, header, method, path, query_param};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::helpers::{GatewayControl, Scrape, TestDatabase};

const KEY: &str = "payments:acct:key";
const CHARGE: &str = "ch_1";
const TIMEOUT: Duration = Duration::from_millis(500);
static NO_METADATA: BTreeMap<String, String> = BTreeMap::new();

fn request() -> RefundRequest<'static> {
    RefundRequest { charge: CHARGE, amount: 500, reason: None, metadata: &NO_METADATA }
}

/// A refund as a gateway describes it, made for [`request`] under [`KEY`], with `fields` on top.
fn refund_json(fields: Value) -> Value {
    let mut refund = json!({"id": "re_1", "object": "refund", "charge": CHARGE, "amount": 500, "currency": "usd",
        "idempotency_key": KEY});
    refund.as_object_mut().unwrap().extend(fields.as_object().cloned().unwrap());
    refund
}

fn client_at(url: &str) -> GatewayClient {
    GatewayClient::new(&url.parse().unwrap(), TIMEOUT).unwrap()
}

type RefundAnswer = Result<Answered<Result<Refund, GatewayError>>, GatewayError>;

/// What the client makes of a gateway answering a refund request (which must carry our key and
/// body, and be sent once) with `answer`.
async fn refund_answered(answer: ResponseTemplate) -> RefundAnswer {
    let gateway = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/v1/refunds"))
        .and(header("Idempotency-Key", KEY))
        .and(body_json(json!({"charge": CHARGE, "amount": 500, "metadata": {}})))
        .respond_with(answer)
        .expect(1)
        .mount(&gateway)
        .await;
    client_at(&gateway.uri()).refund(KEY, &request()).await
}

fn status_of(answer: &RefundAnswer) -> Option<&RefundStatus> {
    match answer {
        Ok(Answered { answer: Ok(refund), .. }) => Some(&refund.status),
        _ => None,
    }
}

/// Whether an answer leaves the outcome unknown (no readable answer, or one that says nothing).
fn unknown<T: std::fmt::Debug>(answer: &Result<Answered<Result<T, GatewayError>>, GatewayError>) -> bool {
    let unknown = |error: &GatewayError| matches!(error, GatewayError::Unavailable(_) | GatewayError::Timeout);
    match answer {
        Err(error) | Ok(Answered { answer: Err(error), .. }) => unknown(error),
        Ok(_) => false,
    }
}

#[tokio::test]
async fn each_refund_status_reads_as_where_the_refund_stands() {
    let failed = |code: &str| RefundStatus::Failed { code: code.into() };
    let cases = [
        (json!({"status": "succeeded"}), RefundStatus::Succeeded),
        (json!({"status": "pending"}), RefundStatus::Pending),
        (json!({"status": "requires_action"}), RefundStatus::Pending),
        (json!({"status": "failed", "failure_reason": "expired_or_canceled_card"}), failed("expired_or_canceled_card")),
        (json!({"status": "failed"}), failed("unknown")),
        (json!({"status": "canceled"}), failed("canceled")),
    ];
    for (fields, expected) in cases {
        let answer = refund_answered(ResponseTemplate::new(200).set_body_json(refund_json(fields.clone()))).await;
        assert_eq!(status_of(&answer), Some(&expected), "{fields}: {answer:?}");
        assert_eq!(answer.unwrap().answer.unwrap().id, "re_1");
    }
}

#[tokio::test]
async fn every_answer_names_the_gateway_that_gave_it() {
    let named = ResponseTemplate::new(200).insert_header("Gateway-Account", "acct_refunder");
    let answer = refund_answered(named.set_body_json(refund_json(json!({"status": "succeeded"})))).await;
    assert_eq!(answer.unwrap().named.as_deref(), Some("acct_refunder"));

    let gateway = MockServer::start().await;
    let refused = json!({"error": {"type": "invalid_request_error", "code": "amount_too_large"}});
    Mock::given(method("POST")).respond_with(ResponseTemplate::new(400).set_body_json(refused)).mount(&gateway).await;
    let answer = client_at(&gateway.uri()).refund(KEY, &request()).await;
    let answer = answer.unwrap();
    assert_eq!(answer.named, None, "a gateway that names none");
    assert_eq!(answer.by(), format!("{}/", gateway.uri()), "is its address");
}

#[tokio::test]
async fn a_refusal_is_definitive_and_says_why() {
    let error = |code: &str, message: &str| {
        json!({"error": {"type": "invalid_request_error", "code": code,
        "message": message}})
    };
    let too_large = "Refund amount (500) is greater than unrefunded amount on charge (300).";
    let cases = [
        (400, Some(error("amount_too_large", too_large)), too_large),
        (
            400,
            Some(error("charge_already_refunded", "Charge ch_1 has already been refunded.")),
            "Charge ch_1 has already been refunded.",
        ),
        (404, Some(error("resource_missing", "No such charge: 'ch_1'")), "No such charge: 'ch_1'"),
        (402, Some(json!({"error": {"type": "card_error", "message": "Declined."}})), "Declined."),
        (400, None, "the gateway answered 400"),
    ];
    for (status, body, message) in cases {
        let mut answer = ResponseTemplate::new(status);
        if let Some(body) = body {
            answer = answer.set_body_json(body);
        }
        let read = refund_answered(answer).await;
        match read {
            Ok(Answered { answer: Err(GatewayError::Rejected { status: rejected, message: said }), .. }) => {
                assert_eq!((rejected, said.as_str()), (status, message));
            }
            other => panic!("{status} {message}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn an_unknown_outcome_never_reads_as_not_refunded() {
    let idempotency_conflict = json!({"error": {"type": "idempotency_error", "message": "Keys for idempotent..."}});
    let in_use = json!({"error": {"type": "idempotency_error", "code": "idempotency_key_in_use"}});
    let named = |status: u16, fields: Value| ResponseTemplate::new(status).set_body_json(refund_json(fields));
    let answers = [
        ("500", ResponseTemplate::new(500)),
        ("502", ResponseTemplate::new(502).set_body_string("<html>bad gateway</html>")),
        ("503", ResponseTemplate::new(503)),
        ("504", ResponseTemplate::new(504)),
        ("408", ResponseTemplate::new(408)),
        ("409", ResponseTemplate::new(409)),
        ("409 in use", ResponseTemplate::new(409).set_body_json(in_use)),
        ("425", ResponseTemplate::new(425)),
        ("429", ResponseTemplate::new(429)),
        ("400 idempotency_error", ResponseTemplate::new(400).set_body_json(idempotency_conflict)),
        ("307", ResponseTemplate::new(307).insert_header("Location", "http://127.0.0.1:1/v1/refunds")),
        ("not JSON", ResponseTemplate::new(200).set_body_string("not json")),
        ("no id", ResponseTemplate::new(200).set_body_json(json!({"status": "succeeded"}))),
        ("no status", named(200, json!({}))),
        ("an unknown status", named(200, json!({"status": "reversed"}))),
        ("a long id", named(200, json!({"status": "succeeded", "id": "r".repeat(256)}))),
        ("an id with a newline", named(200, json!({"status": "succeeded", "id": "re_1\n"}))),
        ("an empty id", named(200, json!({"status": "succeeded", "id": ""}))),
        (
            "an identity too long",
            named(200, json!({"status": "succeeded"})).insert_header("Gateway-Account", "a".repeat(501)),
        ),
        ("too late", named(200, json!({"status": "succeeded"})).set_delay(2 * TIMEOUT)),
    ];
    for (shown, answer) in answers {
        let read = refund_answered(answer).await;
        assert!(unknown(&read), "{shown} read as {read:?}");
    }

    let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let read = client_at(&format!("http://{closed}")).refund(KEY, &request()).await;
    assert!(matches!(read, Err(GatewayError::Unavailable(_))), "nobody listening: {read:?}");
}

#[tokio::test]
async fn text_from_the_gateway_is_cleaned_before_anyone_stores_it() {
    let noisy = format!("a\u{0}b\nc\u{1b}[31m{}", "x".repeat(10_000));
    let refused = json!({"error": {"type": "invalid_request_error", "code": "amount_too_large", "message": noisy}});
    let read = refund_answered(ResponseTemplate::new(400).set_body_json(refused)).await;
    let Ok(Answered { answer: Err(GatewayError::Rejected { message, .. }), .. }) = read else { panic!("{read:?}") };
    assert!(message.starts_with("abc[31mxxx") && message.chars().count() == 500, "{message}");

    let failed = refund_json(json!({"status": "failed", "failure_reason": format!("\u{7}lost\t{}", "y".repeat(500))}));
    let read = refund_answered(ResponseTemplate::new(200).set_body_json(failed)).await;
    let Some(RefundStatus::Failed { code }) = status_of(&read) else { panic!("{read:?}") };
    assert!(code.starts_with("losty") && code.chars().count() == 100, "{code}");

    let odd = refund_json(json!({"status": format!("weird\u{0}{}", "z".repeat(500))}));
    let read = refund_answered(ResponseTemplate::new(200).set_body_json(odd)).await;
    let Ok(Answered { answer: Err(GatewayError::Unavailable(said)), .. }) = read else { panic!("{read:?}") };
    assert!(!said.chars().any(char::is_control) && said.len() < 200, "{said}");
}

#[tokio::test]
async fn the_look_up_by_key_takes_only_a_refund_made_for_our_request() {
    let ours = |status: &str| refund_json(json!({"status": status}));
    let other = |fields: Value| {
        refund_json(
            fields.as_object().unwrap().clone().into_iter().chain([("status".into(), json!("succeeded"))]).collect(),
        )
    };
    let list = |data: Vec<Value>| ResponseTemplate::new(200).set_body_json(json!({"object": "list", "data": data}));
    let failed = RefundStatus::Failed { code: "unknown".into() };
    let found = [
        (list(vec![ours("succeeded")]), RefundStatus::Succeeded),
        (list(vec![ours("failed"), ours("succeeded")]), RefundStatus::Succeeded),
        (list(vec![ours("failed"), ours("pending")]), RefundStatus::Pending),
        (list(vec![ours("failed")]), failed),
    ];
    for (answer, expected) in found {
        let read = look_up(answer).await;
        let Ok(Answered { answer: Some(Ok(refund)), .. }) = read else { panic!("{expected:?}: {read:?}") };
        assert_eq!(refund.status, expected);
    }

    let nothing = look_up(list(vec![])).await;
    assert!(matches!(nothing, Ok(Answered { answer: None, .. })), "an empty list: nothing refunded");
    let without_status = look_up(list(vec![refund_json(json!({}))])).await;
    assert!(matches!(without_status, Ok(Answered { answer: Some(Err(GatewayError::Unavailable(_))), .. })));

    let unreadable = [
        ("another amount", list(vec![other(json!({"amount": 499}))])),
        ("another charge", list(vec![other(json!({"charge": "ch_2"}))])),
        ("another key", list(vec![other(json!({"idempotency_key": "payments:acct:other"}))])),
        ("no key", list(vec![other(json!({"idempotency_key": null}))])),
        ("not a list", ResponseTemplate::new(200).set_body_json(json!({"object": "list"}))),
        ("404", ResponseTemplate::new(404)),
        ("500", ResponseTemplate::new(500)),
    ];
    for (shown, answer) in unreadable {
        let read = look_up(answer).await;
        assert!(matches!(read, Err(GatewayError::Unavailable(_))), "{shown} read as {read:?}");
    }
}

/// What the client makes of a look-up by [`KEY`] answered with `answer`.
async fn look_up(answer: ResponseTemplate) -> Result<Answered<Option<Result<Refund, GatewayError>>>, GatewayError> {
    let gateway = MockServer::start().await;
    Mock::given(method("GET"))
        .and(path("/v1/refunds"))
        .and(query_param("idempotency_key", KEY))
        .respond_with(answer)
        .expect(1)
        .mount(&gateway)
        .await;
    client_at(&gateway.uri()).find_refund(KEY, &request()).await
}

#[tokio::test]
async fn a_refund_read_by_id_is_as_it_stands_or_known_to_be_missing() {
    let read = |answer: ResponseTemplate| async move {
        let gateway = MockServer::start().await;
        Mock::given(method("GET")).and(path("/v1/refunds/re_1")).respond_with(answer).expect(1).mount(&gateway).await;
        client_at(&gateway.uri()).get_refund("re_1").await
    };
    let pending = read(ResponseTemplate::new(200).set_body_json(refund_json(json!({"status": "pending"})))).await;
    assert_eq!(pending.unwrap().answer.unwrap().status, RefundStatus::Pending);
    let missing = json!({"error": {"type": "invalid_request_error", "code": "resource_missing"}});
    assert!(read(ResponseTemplate::new(404).set_body_json(missing)).await.unwrap().answer.is_none());

    let unreadable = [
        ("a 404 that does not say", ResponseTemplate::new(404)),
        ("500", ResponseTemplate::new(500)),
        (
            "another refund",
            ResponseTemplate::new(200).set_body_json(refund_json(json!({"status": "succeeded", "id": "re_2"}))),
        ),
        ("no status", ResponseTemplate::new(200).set_body_json(refund_json(json!({})))),
    ];
    for (shown, answer) in unreadable {
        let read = read(answer).await;
        assert!(matches!(read, Err(GatewayError::Unavailable(_))), "{shown} read as {read:?}");
    }
}

/// The client and a real mock gateway: a charge of `amount` made with `source`, and its id.
async fn charged(client: &GatewayClient, key: &str, amount: i64, source: &str) -> String {
    let request =
        ChargeRequest { amount, currency: "usd", source, description: None, metadata: &NO_METADATA, capture: true };
    client.charge(key, &request).await.unwrap().answer.unwrap().id
}

fn refund_of(charge: &str, amount: i64) -> RefundRequest<'_> {
    RefundRequest { charge, amount, reason: Some("requested_by_customer"), metadata: &NO_METADATA }
}

#[tokio::test]
async fn the_client_reads_the_mock_gateway_as_it_means() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let gateway = MockGateway::start(listener, FaultPlan::none(), Controls::Served).unwrap();
    let (client, control) = (client_at(&gateway.url()), GatewayControl::new(&gateway.url()));
    let account = client.id().await.unwrap();
    let charge = charged(&client, "c1", 1000, "tok_refundFails").await;

    let made = client.refund("r1", &refund_of(&charge, 400)).await.unwrap();
    assert_eq!(made.named, Some(account));
    let pending = made.answer.unwrap();
    assert_eq!(pending.status, RefundStatus::Pending);
    let too_large = client.refund("r2", &refund_of(&charge, 601)).await.unwrap().answer;
    assert!(matches!(too_large, Err(GatewayError::Rejected { status: 400, .. })), "{too_large:?}");
    let unknown_charge = client.refund("r3", &refund_of("ch_nope", 1)).await.unwrap().answer;
    assert!(matches!(unknown_charge, Err(GatewayError::Rejected { status: 404, .. })), "{unknown_charge:?}");

    assert_eq!(control.settle_refunds().await, 1);

    let failed = RefundStatus::Failed { code: "expired_or_canceled_card".into() };
    assert_eq!(control.refunds_for("r1").await[0]["status"], "failed");
    assert_eq!(client.get_refund(&pending.id).await.unwrap().answer.unwrap().status, failed);
    let found = client.find_refund("r1", &refund_of(&charge, 400)).await.unwrap().answer;
    assert_eq!(found.unwrap().unwrap(), Refund { id: pending.id.clone(), status: failed });
    assert!(client.find_refund("r1", &refund_of(&charge, 401)).await.is_err(), "not the refund we asked for");
    assert!(client.find_refund("r2", &refund_of(&charge, 601)).await.unwrap().answer.is_none(), "refused");
    assert!(client.get_refund("re_nope").await.unwrap().answer.is_none());
    let again = client.refund("r4", &refund_of(&charge, 1000)).await.unwrap().answer.unwrap();
    assert_eq!(again.status, RefundStatus::Pending, "the failed refund gave its amount back");

    let later = charged(&client, "c2", 1000, "tok_refundPending").await;
    let pending = client.refund("r5", &refund_of(&later, 1000)).await.unwrap().answer.unwrap();
    assert_eq!(control.settle_refunds().await, 2, "this one, and the one made again");
    assert_eq!(client.get_refund(&pending.id).await.unwrap().answer.unwrap().status, RefundStatus::Succeeded);
    let at_once = charged(&client, "c3", 1000, "tok_visa").await;
    let refund = client.refund("r6", &refund_of(&at_once, 1)).await.unwrap().answer.unwrap();
    assert_eq!(refund.status, RefundStatus::Succeeded);
    gateway.stop().await;
}

#[tokio::test]
async fn refund_calls_are_counted_by_operation_and_outcome() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let gateway = MockGateway::start(listener, FaultPlan::none(), Controls::Served).unwrap();
    let metrics = Arc::new(Metrics::new());
    let client = client_at(&gateway.url()).observed_by(metrics.clone());
    let control = GatewayControl::new(&gateway.url());
    let charge = charged(&client, "c1", 1000, "tok_refundPending").await;

    let pending = client.refund("r1", &refund_of(&charge, 400)).await.unwrap().answer.unwrap();
    client.refund("r2", &refund_of(&charge, 601)).await.unwrap().answer.unwrap_err();
    client.find_refund("r3", &refund_of(&charge, 1)).await.unwrap();
    assert_eq!(control.settle_refunds().await, 1);
    client.find_refund("r1", &refund_of(&charge, 400)).await.unwrap();
    client.get_refund(&pending.id).await.unwrap();
    client.get_refund("re_nope").await.unwrap();
    gateway.stop().await;
    client.refund("r4", &refund_of(&charge, 1)).await.unwrap_err();

    let database = TestDatabase::create().await;
    let scrape = Scrape(metrics.render(&payments_service::db::pool(&database.url, 1)).await);
    let calls = |operation: &str, outcome: &str| {
        scrape.count("gateway_requests_total", &[("operation", operation), ("outcome", outcome)])
    };
    let counted = [
        calls("refund", "pending"),
        calls("refund", "rejected"),
        calls("refund", "indeterminate"),
        calls("refund_lookup", "not_found"),
        calls("refund_lookup", "succeeded"),
        calls("refund_read", "succeeded"),
        calls("refund_read", "not_found"),
    ];
    assert_eq!(counted, [1.0; 7]);
    assert_eq!(scrape.count("gateway_request_duration_seconds_count", &[("operation", "refund")]), 3.0);
    assert_eq!(calls("refund", "succeeded") + calls("refund", "failed") + calls("lookup", "not_found"), 0.0);
}
