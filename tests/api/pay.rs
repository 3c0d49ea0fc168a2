//! `payments pay` and the reference client under it, against the real service and its mock
//! gateway with faults.

use std::time::{Duration, Instant};

use payments_client::{Client, KeySeen, NewPayment, Next, Outcome, RetryPolicy};
use serde_json::Value;
use wiremock::matchers::any;
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::helpers::{ClientRun, TestApp};

/// `payments pay` against `app`, for 1000 usd from `source`, with these extra flags.
async fn pay(app: &TestApp, source: &str, flags: &[&str]) -> ClientRun {
    let args = [&["--amount", "1000", "--currency", "usd", "--source", source], flags].concat();
    ClientRun::of(app, "pay", &args).await
}

#[tokio::test]
async fn a_charge_through_a_gateway_fault_ends_with_one_charge() {
    for fault in ["error_after", "error_before"] {
        let app = TestApp::spawn().await;
        app.gateway.fault(fault, 1).await;
        let paid = pay(&app, "tok_visa", &[]).await;
        assert_eq!(paid.code, 0, "{fault}: {}", paid.stderr);
        let attempts = paid.attempts();
        assert_eq!(attempts.len(), 2, "{fault}: {}", paid.stderr);
        assert!(attempts[0].starts_with("attempt 1: 503 gateway-unavailable, retrying in 2."), "{}", attempts[0]);
        assert_eq!(attempts[1], "attempt 2: 201 Created");
        assert_eq!(paid.body()["status"], "succeeded");
        let stats = app.gateway.stats().await;
        assert_eq!((stats.charges, stats.faults), (1, 1), "{fault}");
        // The one payment in the account is the one the client was answered.
        let list: Value = app.get("/v1/payments").await.json().await.unwrap();
        assert_eq!(list["data"].as_array().unwrap().len(), 1);
        assert_eq!(list["data"][0]["id"], paid.body()["id"]);
    }
}

#[tokio::test]
async fn a_decline_is_not_retried() {
    let app = TestApp::spawn().await;
    let paid = pay(&app, "tok_chargeDeclined", &[]).await;
    assert_eq!(paid.code, 3, "{}", paid.stderr);
    assert_eq!(paid.attempts(), ["attempt 1: 402 card-declined"]);
    assert_eq!(paid.body()["payment"]["status"], "failed");
    assert_eq!(app.gateway.stats().await.requests, 1);
}

#[tokio::test]
async fn other_definitive_answers_are_not_retried_and_exit_rejected() {
    let app = TestApp::spawn().await;
    // 422: the key made another payment.
    let paid = pay(&app, "tok_visa", &["--key", "k"]).await;
    assert_eq!(paid.code, 0);
    let reused =
        ClientRun::of(&app, "pay", &["--amount", "5", "--currency", "usd", "--source", "tok_visa", "--key", "k"]).await;
    assert_eq!(reused.code, 4);
    assert_eq!(reused.stderr.trim(), "attempt 1: 422 idempotency-key-reused");
    let unauthorized = pay(&app, "tok_visa", &["--api-key", "sk_wrong"]).await;
    assert_eq!((unauthorized.code, unauthorized.attempts()), (4, vec!["attempt 1: 401 unauthorized"]));
    assert_eq!(app.gateway.stats().await.requests, 1);
}

#[tokio::test]
async fn retry_after_is_honoured() {
    let app = TestApp::spawn().await;
    // Without the server's hint the waits would be 50 ms at most.
    let policy = RetryPolicy {
        base_delay: Duration::from_millis(10),
        max_delay: Duration::from_millis(50),
        ..Default::default()
    };
    let client = Client::new(&[app.address.parse().unwrap()], &app.api_key, policy).unwrap();
    app.gateway.fault("error_before", 2).await;
    let payment = NewPayment {
        amount: 1000,
        currency: "usd".into(),
        source: "tok_visa".into(),
        description: None,
        capture: true,
    };
    let mut ended = Vec::new();
    let finished = client
        .send(&Client::new_key(), KeySeen::No, &payment, |attempt| ended.push((Instant::now(), attempt.clone())))
        .await;
    assert!(matches!(finished.outcome, Outcome::Succeeded(_)), "{:?}", finished.outcome);
    assert_eq!(ended.len(), 3);
    for pair in ended.windows(2) {
        let (ended_at, attempt) = &pair[0];
        let answer = attempt.result.as_ref().expect("an answer");
        assert_eq!(answer.retry_after, Some(Duration::from_secs(2)), "{attempt}");
        assert_eq!(attempt.next, Next::RetryIn(Duration::from_secs(2)));
        // The next attempt took milliseconds; the wait before it was the server's two seconds.
        let (next_ended_at, _) = &pair[1];
        assert!(*next_ended_at - *ended_at >= Duration::from_secs(2), "{attempt}");
    }
    assert_eq!(app.gateway.stats().await.charges, 1);
}

#[tokio::test]
async fn giving_up_prints_the_key_and_resuming_with_it_finishes_the_same_payment() {
    let app = TestApp::spawn().await;
    // The charge is made, then the answer is lost: the one attempt allowed ends without knowing.
    app.gateway.fault("error_after", 1).await;
    let gave_up = pay(&app, "tok_visa", &["--max-attempts", "1"]).await;
    assert_eq!(gave_up.code, 5, "{}", gave_up.stderr);
    let key = gave_up.key_to_resume();
    assert!(uuid::Uuid::parse_str(&key).is_ok_and(|uuid| uuid.get_version_num() == 4), "{key}");
    assert_eq!(gave_up.body()["type"], "https://payments.example/problems/gateway-unavailable");

    let resumed = pay(&app, "tok_visa", &["--key", &key]).await;
    assert_eq!(resumed.code, 0, "{}", resumed.stderr);
    assert_eq!(resumed.attempts(), ["attempt 1: 201 Created"]);
    let story: Value = app.key_story(&key).await.json().await.unwrap();
    assert_eq!(story["payment"]["id"], resumed.body()["id"]);
    assert_eq!(app.gateway.stats().await.charges, 1);
}

#[tokio::test]
async fn after_an_unknown_outcome_an_answer_not_about_the_key_gives_up_with_the_key() {
    let app = TestApp::spawn().await;
    let proxy = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(404).set_body_string("<h1>Not Found</h1>"))
        .mount(&proxy)
        .await;
    // Another deployment, which does not know the API key: what a wrong --url, or a key rotated
    // between two attempts, answers.
    let elsewhere = TestApp::spawn().await;
    let second_urls = [
        (proxy.uri(), "404 Not Found"),
        (elsewhere.address.clone(), "401 unauthorized"),
        // A wrong --url: the gateway's (the example in docs/client.md).
        (app.gateway_url().to_owned(), "404 Not Found"),
    ];
    for (second_url, answer) in second_urls {
        // The first attempt charges, then loses its answer; the second reaches a server that
        // knows nothing of the key.
        app.gateway.fault("error_after", 1).await;
        let gave_up = pay(&app, "tok_visa", &["--url", &second_url]).await;

        assert_eq!(gave_up.code, 5, "{answer}: {}", gave_up.stderr);
        let attempts = gave_up.attempts();
        assert!(attempts[0].starts_with("attempt 1: 503 gateway-unavailable, retrying in "), "{}", attempts[0]);
        assert_eq!(
            attempts[1..],
            [format!(
                "attempt 2: {answer}, giving up: not an answer about this key, and an earlier attempt may have paid"
            )]
        );
        let key = gave_up.key_to_resume();
        let resumed = pay(&app, "tok_visa", &["--key", &key]).await;
        assert_eq!(resumed.code, 0, "{}", resumed.stderr);
        assert_eq!(resumed.attempts(), ["attempt 1: 201 Created"]);
        let story: Value = app.key_story(&key).await.json().await.unwrap();
        assert_eq!(story["payment"]["id"], resumed.body()["id"]);
    }
    assert_eq!(app.gateway.stats().await.charges, 3, "one charge per payment");
    assert_eq!(elsewhere.gateway.stats().await.requests, 0);
}

#[tokio::test]
async fn a_key_given_to_resume_is_not_rejected_by_an_answer_not_about_it() {
    let app = TestApp::spawn().await;
    app.gateway.fault("error_after", 1).await;
    let gave_up = pay(&app, "tok_visa", &["--max-attempts", "1"]).await;
    let key = gave_up.key_to_resume();

    // The API key was rotated in the meantime: `401`, which says nothing of the payment the key
    // may have made.
    let unauthorized = pay(&app, "tok_visa", &["--key", &key, "--api-key", "sk_rotated"]).await;
    assert_eq!(unauthorized.code, 5, "{}", unauthorized.stderr);
    assert_eq!(unauthorized.key_to_resume(), key);
    // On a new key, the same answer is definitive: nothing can have happened.
    let new_key = pay(&app, "tok_visa", &["--api-key", "sk_rotated"]).await;
    assert_eq!((new_key.code, new_key.attempts()), (4, vec!["attempt 1: 401 unauthorized"]));

    let resumed = pay(&app, "tok_visa", &["--key", &key]).await;
    assert_eq!((resumed.code, resumed.attempts()), (0, vec!["attempt 1: 201 Created"]));
    assert_eq!(app.gateway.stats().await.charges, 1);
}

#[tokio::test]
async fn a_key_whose_record_expired_exits_6_naming_the_payment_it_made() {
    let app = TestApp::builder().key_retention(Duration::from_secs(1)).spawn().await;
    let key = Client::new_key();
    let paid = pay(&app, "tok_visa", &["--key", &key]).await;
    assert_eq!(paid.code, 0, "{}", paid.stderr);
    let payment = paid.body()["id"].as_str().unwrap().to_owned();
    app.wait_until_reaped(&key).await;

    let late = pay(&app, "tok_visa", &["--key", &key]).await;

    assert_eq!(late.code, 6, "{}", late.stderr);
    assert_eq!(late.attempts(), ["attempt 1: 410 idempotency-key-expired"]);
    assert!(
        late.stderr.contains(&format!("the key made payment {payment}, and nothing was charged now")),
        "{}",
        late.stderr
    );
    assert_eq!(late.body()["payment"]["id"], payment.as_str());
    assert_eq!(app.gateway.stats().await.requests, 1);
}

#[tokio::test]
async fn an_authorization_is_captured_through_a_gateway_fault_once_and_a_second_capture_is_refused() {
    let app = TestApp::spawn().await;
    let authorized = pay(&app, "tok_visa", &["--no-capture"]).await;
    assert_eq!(authorized.code, 0, "{}", authorized.stderr);
    assert_eq!(authorized.body()["status"], "requires_capture");
    let id = authorized.body()["id"].as_str().unwrap().to_owned();

    app.gateway.fault("error_after", 1).await;
    let captured = ClientRun::of(&app, "capture", &[&id, "--amount", "300"]).await;
    assert_eq!(captured.code, 0, "{}", captured.stderr);
    let attempts = captured.attempts();
    assert_eq!(attempts.len(), 2, "{}", captured.stderr);
    assert_eq!(attempts[1], "attempt 2: 200 OK");
    assert_eq!((&captured.body()["status"], &captured.body()["amount_captured"]), (&"succeeded".into(), &300.into()));
    assert_eq!(app.gateway.all_stats().await["captures"], 1);

    // A second capture, and a cancel, are refused about their own keys: exit 3, not retried.
    let again = ClientRun::of(&app, "capture", &[&id]).await;
    assert_eq!((again.code, again.attempts().len()), (3, 1), "{}", again.stderr);
    let cancel = ClientRun::of(&app, "cancel", &[&id]).await;
    assert_eq!(cancel.code, 3, "{}", cancel.stderr);

    let other = pay(&app, "tok_visa", &["--no-capture"]).await.body()["id"].as_str().unwrap().to_owned();
    let canceled = ClientRun::of(&app, "cancel", &[&other, "--reason", "duplicate"]).await;
    assert_eq!(canceled.code, 0, "{}", canceled.stderr);
    assert_eq!(
        (&canceled.body()["status"], &canceled.body()["cancellation_reason"]),
        (&"canceled".into(), &"duplicate".into())
    );
}
