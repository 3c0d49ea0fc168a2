//! `payments listen`, the reference receiver of a merchant's webhooks, as a process: `204` to a
//! delivery signed under any of its secrets within five minutes of its clock, its type and id
//! printed; `400` to anything else, nothing printed on stdout.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use payments_wire::standard_webhooks::{ID_HEADER, SIGNATURE_HEADER, SigningSecret, TIMESTAMP_HEADER, sign};
use reqwest::StatusCode;

use crate::helpers::Process;

fn now() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64
}

fn secret(byte: u8) -> SigningSecret {
    SigningSecret::from_bytes(vec![byte; 32]).unwrap()
}

/// Sends `body` as event `id`, at `timestamp`, signed under `signers`.
async fn deliver(url: &str, id: &str, timestamp: i64, signers: &[&SigningSecret], body: &str) -> StatusCode {
    let signature = sign(signers.iter().copied(), id, timestamp, body.as_bytes());
    let sent = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header(ID_HEADER, id)
        .header(TIMESTAMP_HEADER, timestamp.to_string())
        .header(SIGNATURE_HEADER, signature)
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    sent.status()
}

#[tokio::test]
async fn listen_answers_204_to_a_delivery_signed_under_any_of_its_secrets_and_400_to_any_other() {
    let (new, old) = (secret(1), secret(2));
    let args = ["listen", "--bind", "127.0.0.1:0", "--secret", &new.reveal(), "--secret", &old.reveal()];
    let listen = Process::start(&args, &[], "payments listen: on").await;
    let event = |id: &str| format!(r#"{{"id":"{id}","object":"event","type":"payment.succeeded"}}"#);

    assert_eq!(deliver(&listen.url, "evt_1", now(), &[&new], &event("evt_1")).await, StatusCode::NO_CONTENT);
    assert_eq!(deliver(&listen.url, "evt_2", now(), &[&old], &event("evt_2")).await, StatusCode::NO_CONTENT);
    assert_eq!(
        deliver(&listen.url, "evt_3", now(), &[&secret(3), &new], &event("evt_3")).await,
        StatusCode::NO_CONTENT
    );

    let refused = [
        deliver(&listen.url, "evt_4", now(), &[&secret(3)], &event("evt_4")).await,
        deliver(&listen.url, "evt_5", now() - 301, &[&new], &event("evt_5")).await,
        deliver(&listen.url, "evt_6", now() + 301, &[&new], &event("evt_6")).await,
        reqwest::Client::new().post(&listen.url).body(event("evt_7")).send().await.unwrap().status(),
        reqwest::Client::new().post(&listen.url).body(vec![b' '; 2 * 1024 * 1024]).send().await.unwrap().status(),
    ];
    assert_eq!(refused, [StatusCode::BAD_REQUEST; 5]);

    let mut stdout = listen.stdout.clone();
    let printed = tokio::time::timeout(Duration::from_secs(10), stdout.wait_for(|lines| lines.len() >= 3)).await;
    let printed = printed.expect("three lines printed").unwrap().clone();
    assert_eq!(printed, ["payment.succeeded evt_1", "payment.succeeded evt_2", "payment.succeeded evt_3"]);
}

#[tokio::test]
async fn listen_refuses_to_start_without_a_secret_it_can_read() {
    let run = |args: &[&str]| std::process::Command::new(env!("CARGO_BIN_EXE_payments")).args(args).output().unwrap();
    let without = run(&["listen", "--bind", "127.0.0.1:0"]);
    assert!(!without.status.success());
    let unreadable = run(&["listen", "--bind", "127.0.0.1:0", "--secret", "not-a-secret"]);
    assert!(!unreadable.status.success());
    assert!(String::from_utf8_lossy(&unreadable.stderr).contains("whsec_"), "{unreadable:?}");
}
