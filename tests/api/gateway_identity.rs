//! A payment is asked about only at the gateway it started at: a process charging through another
//! gateway would find nothing there and charge a second time, so it never calls at all.

use std::time::Duration;

use payments::idempotency::needing_attention;
use payments::workers::{Outcome, Worker};
use reqwest::StatusCode;

use crate::helpers::{GatewayControl, Process, TestApp, new_key, payment_body};

#[tokio::test]
async fn a_worker_at_another_gateway_never_charges_a_payment_started_elsewhere() {
    let (first, second) = (Process::gateway().await, Process::gateway().await);
    let (at_first, at_second) = (GatewayControl::new(&first.url), GatewayControl::new(&second.url));
    let app = TestApp::builder()
        .gateway_url(&first.url)
        .workers(|w| {
            w.completer_backoff = Duration::ZERO;
            w.completer_max_attempts = 2;
        })
        .spawn()
        .await;
    let key = new_key();
    // The first gateway charges, and the answer is lost: the payment waits at `started`.
    at_first.fault("error_after", 1).await;
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::SERVICE_UNAVAILABLE);

    // A worker whose gateway is the second one takes the key over, twice, and gives up on it.
    let elsewhere = app.workers_at_gateway(&second.url);
    for _ in 0..2 {
        assert_eq!(elsewhere.completer.run_once().await.unwrap(), Outcome::Worked);
    }

    let asked = at_second.stats().await;
    assert_eq!((asked.requests, asked.look_ups), (0, 0), "never asked a gateway that knows nothing of it");
    let attention = needing_attention(&mut app.db().await).await.unwrap();
    assert_eq!(attention.len(), 1);
    assert!(attention[0].attention_reason.contains(&*app.gateway_id().await), "{}", attention[0].attention_reason);
    // A process with the right gateway finishes it, with the one charge that was made.
    let retry = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(at_first.stats().await.charges, 1);
}

#[tokio::test]
async fn a_gateway_restarted_with_an_empty_memory_is_another_gateway() {
    let mut gateway = Process::gateway().await;
    let app = TestApp::builder().gateway_url(&gateway.url).spawn().await;
    let key = new_key();
    GatewayControl::new(&gateway.url).fault("error_after", 1).await;
    assert_eq!(app.post_payment(&key, &payment_body()).await.status(), StatusCode::SERVICE_UNAVAILABLE);

    // The mock restarts on the same address, its charges gone.
    let address = gateway.url.trim_start_matches("http://").to_owned();
    gateway.signal(nix::sys::signal::Signal::SIGKILL);
    gateway.exited().await;
    let restarted =
        Process::start(&["gateway", "--bind", &address, "--control"], &[], "payments gateway listening on").await;

    let retry = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retry.status(), StatusCode::SERVICE_UNAVAILABLE, "it waits for the gateway it started at");
    let asked = GatewayControl::new(&restarted.url).stats().await;
    assert_eq!((asked.requests, asked.look_ups), (0, 0), "and never asks the new one about it");
}

#[tokio::test]
async fn a_payment_charged_at_a_gateway_replaced_since_this_process_last_asked_follows_it_there() {
    let mut gateway = Process::gateway().await;
    let app = TestApp::builder().gateway_url(&gateway.url).spawn().await;
    // The app has learnt who its gateway is...
    assert_eq!(app.post_payment(&new_key(), &payment_body()).await.status(), StatusCode::CREATED);
    // ...which is then replaced at the same address, unbeknown to it.
    let address = gateway.url.trim_start_matches("http://").to_owned();
    gateway.signal(nix::sys::signal::Signal::SIGKILL);
    gateway.exited().await;
    let replaced =
        Process::start(&["gateway", "--bind", &address, "--control"], &[], "payments gateway listening on").await;
    let at_replaced = GatewayControl::new(&replaced.url);
    at_replaced.fault("error_after", 1).await;
    let key = new_key();

    // The new gateway charges, and the answer is lost; the payment follows the charge there...
    let first = app.post_payment(&key, &payment_body()).await;
    assert_eq!(first.status(), StatusCode::SERVICE_UNAVAILABLE);

    // ...so the retry reconciles there, and adopts the one charge.
    let retry = app.post_payment(&key, &payment_body()).await;
    assert_eq!(retry.status(), StatusCode::CREATED);
    assert_eq!(at_replaced.stats().await.charges, 1);
    let trail = app.audit_trail().await;
    assert!(trail.iter().any(|(action, _)| action == "payment.gateway_changed"), "{trail:?}");
}
