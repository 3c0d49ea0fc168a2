//! The real binary's logs, as a log file or a collector gets them: through a pipe.

use std::time::Duration;

use diesel_async::{AsyncConnection, AsyncPgConnection};
use nix::sys::signal::Signal;
use reqwest::StatusCode;
use serde_json::Value;
use tokio::process::Command;

use crate::helpers::{Process, TestDatabase, new_key, payment_body, wait_until};

/// What the outbox logs for an event when no webhook is set.
const EVENT_LOGGED: &str = "no PAYMENTS_WEBHOOK_URL set, so logged";

/// Everything a server logs while it starts, makes a payment, logs the payment's event (no webhook
/// is set) and stops.
async fn logs_of_one_payment(env: &[(&str, &str)]) -> Vec<String> {
    let database = TestDatabase::create().await;
    let mut conn = AsyncPgConnection::establish(&database.url).await.unwrap();
    let (_, api_key) = payments_service::accounts::create(&mut conn, "logs").await.unwrap();
    let gateway = Process::gateway().await;
    let mut server = Process::serve(&database.url, &gateway.url, &[], env).await;

    let response = reqwest::Client::new()
        .post(format!("{}/v1/payments", server.url))
        .bearer_auth(api_key)
        .header("Idempotency-Key", new_key())
        .json(&payment_body())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let stderr = server.stderr.clone();
    wait_until(Duration::from_secs(20), "the outbox logs the payment's event", || {
        let logged = stderr.borrow().iter().any(|line| line.contains(EVENT_LOGGED));
        async move { logged }
    })
    .await;
    server.signal(Signal::SIGTERM);
    server.logs().await
}

#[tokio::test]
async fn logs_written_to_a_pipe_carry_no_colour_codes() {
    let logs = logs_of_one_payment(&[]).await;

    assert!(logs.iter().all(|line| !line.contains('\x1b')), "{logs:#?}");
}

#[tokio::test]
async fn the_json_log_format_writes_one_object_per_line() {
    let logs = logs_of_one_payment(&[("PAYMENTS_LOG_FORMAT", "json")]).await;

    for line in &logs {
        let event: Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        assert!(event.is_object() && event["level"].is_string() && event["fields"].is_object(), "{line}");
    }
    let event = logs.iter().find(|line| line.contains(EVENT_LOGGED)).unwrap();
    let event: Value = serde_json::from_str(event).unwrap();
    assert!(event["fields"]["event.id"].is_string(), "fields stay fields: {event}");
}

#[tokio::test]
async fn an_unknown_log_format_is_refused_with_the_ones_there_are() {
    let refused = Command::new(env!("CARGO_BIN_EXE_payments"))
        .arg("gateway")
        .env("PAYMENTS_LOG_FORMAT", "xml")
        .output()
        .await
        .unwrap();

    assert!(!refused.status.success());
    let error = String::from_utf8_lossy(&refused.stderr);
    assert!(error.contains("xml") && error.contains("text, json"), "{error}");
}
