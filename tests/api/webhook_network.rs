//! A merchant's webhook goes out on a hostile network (`webhooks/network.rs`). Every receiver here
//! listens on loopback; refusals are shown with loopback addresses left out of the allowed
//! networks, and with a name that resolves to loopback.

use std::io::ErrorKind;
use std::net::TcpListener as StdListener;
use std::time::Duration;

use payments_service::webhooks::network::{AllowedNetworks, Attempted, Guard, MAX_ANSWER, Sender};
use reqwest::Url;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const TIMEOUT: Duration = Duration::from_secs(2);

fn sender(allowed: &str) -> Sender {
    Sender::new(Guard::new(AllowedNetworks::parse(allowed).unwrap()), TIMEOUT).unwrap()
}

async fn post(sender: &Sender, url: &str) -> Attempted {
    sender.post(&Url::parse(url).unwrap(), &[("webhook-id", "evt_1".into())], b"{}".to_vec()).await
}

/// A listener that never accepts: whether anything connected to it shows in its queue.
struct Watched(StdListener);

impl Watched {
    fn on(ip: &str) -> Watched {
        let listener = StdListener::bind((ip, 0)).unwrap();
        listener.set_nonblocking(true).unwrap();
        Watched(listener)
    }

    fn port(&self) -> u16 {
        self.0.local_addr().unwrap().port()
    }

    /// Whether a connection came: any that did is in the queue once the attempt has ended.
    fn was_reached(&self) -> bool {
        match self.0.accept() {
            Ok(_) => true,
            Err(error) if error.kind() == ErrorKind::WouldBlock => false,
            Err(error) => panic!("{error}"),
        }
    }
}

/// A receiver that answers every connection with `answer` (raw HTTP/1.1), then `tail` bytes of
/// `x`; its URL.
async fn answering(answer: String, tail: usize) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let answer = answer.clone();
            tokio::spawn(async move {
                let mut request = [0; 4096];
                let _ = socket.read(&mut request).await;
                let _ = socket.write_all(answer.as_bytes()).await;
                let chunk = vec![b'x'; 64 * 1024];
                let mut sent = 0;
                while sent < tail {
                    if socket.write_all(&chunk).await.is_err() {
                        break;
                    }
                    sent += chunk.len();
                }
            });
        }
    });
    url
}

#[tokio::test]
async fn a_literal_address_outside_the_allowed_networks_is_never_connected_to() {
    let refused = Watched::on("127.0.0.2");
    let attempted = post(&sender("127.0.0.1/32"), &format!("http://127.0.0.2:{}/hook", refused.port())).await;
    assert_eq!((attempted.status, attempted.error.as_deref()), (None, Some("address not allowed")));
    assert!(!refused.was_reached());

    let allowed = Watched::on("127.0.0.2");
    let attempted = post(&sender("127.0.0.2/32"), &format!("http://127.0.0.2:{}/hook", allowed.port())).await;
    assert!(allowed.was_reached(), "the same address, allowed, is reached: {attempted:?}");
}

#[tokio::test]
async fn a_name_that_resolves_only_to_refused_addresses_reaches_nothing() {
    let listener = Watched::on("127.0.0.1");
    // `localhost` resolves to 127.0.0.1 (and ::1): with only 127.0.0.2 allowed, to nothing allowed.
    let attempted = post(&sender("127.0.0.2/32"), &format!("http://localhost:{}/hook", listener.port())).await;
    assert_eq!((attempted.status, attempted.error.as_deref()), (None, Some("address not allowed")));
    assert!(!listener.was_reached());

    let attempted = post(&sender("127.0.0.1/32"), &format!("http://localhost:{}/hook", listener.port())).await;
    assert!(listener.was_reached(), "allowed, the name's address is reached: {attempted:?}");
}

#[tokio::test]
async fn a_redirect_is_a_failed_attempt_and_is_never_followed() {
    let elsewhere = Watched::on("127.0.0.1");
    let location = format!("http://127.0.0.1:{}/hook", elsewhere.port());
    let url = answering(format!("HTTP/1.1 302 Found\r\nlocation: {location}\r\ncontent-length: 0\r\n\r\n"), 0).await;
    let attempted = post(&sender("127.0.0.1/32"), &url).await;
    assert_eq!((attempted.status, attempted.error.as_deref()), (Some(302), Some("redirect")));
    assert!(!attempted.delivered());
    assert!(!elsewhere.was_reached(), "the redirect's target saw nothing");
}

#[tokio::test]
async fn an_endless_answer_is_read_to_64_kib_and_no_further() {
    let ten_mb = 10 * 1024 * 1024;
    let url = answering(format!("HTTP/1.1 200 OK\r\ncontent-length: {ten_mb}\r\n\r\n"), ten_mb).await;
    let attempted = post(&sender("127.0.0.1/32"), &url).await;
    assert_eq!(attempted.status, Some(200));
    assert_eq!(attempted.body.len(), MAX_ANSWER);
}

#[tokio::test]
async fn a_receiver_that_hangs_is_cut_at_the_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    // Accepts, reads, and never answers.
    let hanging = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut request = Vec::new();
        let _ = socket.read_to_end(&mut request).await;
    });
    let attempted = post(&sender("127.0.0.1/32"), &url).await;
    assert_eq!((attempted.status, attempted.error.as_deref()), (None, Some("timeout")));
    assert!(attempted.duration >= TIMEOUT, "{attempted:?}");
    hanging.abort();
}

#[tokio::test]
async fn a_refused_connection_and_an_error_status_are_failed_attempts_that_say_why() {
    let closed = StdListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://127.0.0.1:{}/hook", closed.local_addr().unwrap().port());
    drop(closed);
    let attempted = post(&sender("127.0.0.1/32"), &url).await;
    assert_eq!((attempted.status, attempted.error.as_deref()), (None, Some("connection refused")));

    let url =
        answering("HTTP/1.1 503 Service Unavailable\r\nretry-after: 30\r\ncontent-length: 4\r\n\r\nbusy".into(), 0)
            .await;
    let attempted = post(&sender("127.0.0.1/32"), &url).await;
    assert_eq!((attempted.status, attempted.error.as_deref()), (Some(503), Some("answered 503")));
    assert_eq!((attempted.retry_after, attempted.body.as_slice()), (Some(Duration::from_secs(30)), &b"busy"[..]));

    let url = answering("HTTP/1.1 204 No Content\r\n\r\n".into(), 0).await;
    let attempted = post(&sender("127.0.0.1/32"), &url).await;
    assert!(attempted.delivered() && attempted.error.is_none(), "{attempted:?}");
}

/// An attempt, as the reference receiver hears it: the event's id and type, its signature verified
/// under each secret of a rotation; under a secret the receiver does not hold, refused.
#[tokio::test]
async fn an_attempt_is_signed_so_that_the_reference_receiver_verifies_it_under_either_secret_of_a_rotation() {
    use payments_client::listen::{Heard, Receiver};
    use payments_service::webhooks::deliver::{Outgoing, attempt};
    use payments_wire::standard_webhooks::{SigningSecret, VerifyError};

    let secret = |byte: u8| SigningSecret::from_bytes(vec![byte; 32]).unwrap();
    let (heard, mut hearing) = tokio::sync::mpsc::unbounded_channel();
    let receiver = Receiver::start(StdListener::bind("127.0.0.1:0").unwrap(), vec![secret(1)], heard).unwrap();
    let url = Url::parse(&receiver.url).unwrap();
    let body = br#"{"id":"evt_1","object":"event","type":"payment.succeeded"}"#;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let sender = sender("127.0.0.1/32");

    for (secrets, event_id) in [(vec![secret(2), secret(1)], "evt_1"), (vec![secret(1)], "evt_1")] {
        let outgoing = Outgoing { url: &url, event_id, body, secrets: &secrets };
        let attempted = attempt(&sender, outgoing, now).await;
        assert_eq!(attempted.status, Some(204), "{attempted:?}");
        let expected = Heard::Event { kind: "payment.succeeded".into(), id: event_id.into() };
        assert_eq!(hearing.recv().await, Some(expected));
    }
    let outgoing = Outgoing { url: &url, event_id: "evt_1", body, secrets: &[secret(3)] };
    assert_eq!(attempt(&sender, outgoing, now).await.status, Some(400));
    assert_eq!(hearing.recv().await, Some(Heard::Refused(VerifyError::NoMatch)));
    receiver.stop().await;
}
