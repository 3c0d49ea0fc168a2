//! The way in for the gateway's events to a fleet whose servers come and go. The mock gateway
//! sends its events to one URL, and `payments chaos` kills its servers: the relay is that URL. It
//! hands each delivery on, byte for byte (the signature is over the bytes), to the servers in turn,
//! so that the two copies of an event sent twice, which leave the gateway at the same moment, land
//! on different servers and race there for the event's row in the inbox. A server that refuses the
//! connection, drops it, or has not answered within [`PATIENCE`] is passed over for the next; what
//! a server answers goes back to the gateway as it is; when no server answers, the gateway is
//! answered `502` and sends the event again later.
//!
//! A delivery handed to a server that then died, or froze, may have been applied there all the
//! same: the next server gets it again, as behind any load balancer that retries, and must take it
//! for the duplicate it is.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::http::StatusCode;
use actix_web::http::header::CONTENT_TYPE;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use bytes::Bytes;
use reqwest::Url;
use serde::Deserialize;

use payments_wire::signature::SIGNATURE_HEADER;

/// How long a server may take to answer a delivery before the next is tried. A live one answers
/// within its own bounds (a second to check a database connection out, 2.5 s for the
/// transaction), so one that has not answered by then is frozen, or waits on a lock that a frozen
/// one holds.
const PATIENCE: Duration = Duration::from_secs(4);

/// A running relay.
pub struct Relay {
    /// Where the gateway sends its events.
    pub url: String,
    shared: Arc<Shared>,
    handle: ServerHandle,
}

struct Shared {
    /// Each server's `POST /webhooks/gateway`.
    servers: Vec<Url>,
    /// Whose turn it is to take the next delivery first.
    next: AtomicUsize,
    http: reqwest::Client,
    tally: Mutex<Tally>,
}

#[derive(Default)]
struct Tally {
    answers: BTreeMap<String, u64>,
    passed_over: BTreeMap<&'static str, u64>,
    /// Each event's id, and the servers that answered a delivery of it.
    reached: HashMap<String, BTreeSet<usize>>,
}

/// What became of the deliveries.
#[derive(Debug, Default, Clone)]
pub struct Relayed {
    /// Deliveries by their answer: the `outcome` a server gave with a `2xx` (`applied`,
    /// `duplicate`, `nudged`...), else its status code; `no server` when none answered.
    pub answers: BTreeMap<String, u64>,
    /// Times a server was passed over, by why: it was down (`refused`), it took the delivery and
    /// died with it (`dropped`), or it was frozen (`no answer`).
    pub passed_over: BTreeMap<&'static str, u64>,
    /// Events answered by every server: both copies of an event sent twice, or a copy and the
    /// gateway's retry of an unacknowledged delivery (a server passed over answered nothing).
    pub on_every_server: usize,
}

/// A server's answer: its status, content type and body.
type Answer = (StatusCode, Option<Vec<u8>>, Bytes);

/// Why a server gave no answer.
fn why(error: reqwest::Error) -> &'static str {
    match () {
        _ if error.is_timeout() => "no answer",
        _ if error.is_connect() => "refused",
        _ => "dropped",
    }
}

/// What the relay reads of a delivery: the event's id.
#[derive(Deserialize)]
struct Delivery {
    id: String,
}

/// What it reads of a server's `2xx`: `{"received": true, "outcome": ...}`.
#[derive(Deserialize)]
struct Received {
    outcome: String,
}

impl Relay {
    /// A relay in front of the servers at these base URLs (they need not be up yet).
    pub fn start(servers: &[Url]) -> anyhow::Result<Relay> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let url = format!("http://{}/webhooks/gateway", listener.local_addr()?);
        let http = reqwest::Client::builder()
            .timeout(PATIENCE)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent("payments-chaos-relay")
            .build()?;
        let servers = servers.iter().map(|base| base.join("webhooks/gateway")).collect::<Result<_, _>>()?;
        let shared = Arc::new(Shared { servers, next: AtomicUsize::new(0), http, tally: Mutex::default() });
        let data = web::Data::from(shared.clone());
        let server = HttpServer::new(move || App::new().app_data(data.clone()).default_service(web::to(relay)))
            .listen(listener)?
            .workers(1)
            .disable_signals()
            .run();
        let handle = server.handle();
        tokio::spawn(server);
        Ok(Relay { url, shared, handle })
    }

    /// What became of the deliveries so far.
    pub fn relayed(&self) -> Relayed {
        let tally = self.shared.lock();
        let every = self.shared.servers.len();
        Relayed {
            answers: tally.answers.clone(),
            passed_over: tally.passed_over.clone(),
            on_every_server: tally.reached.values().filter(|servers| servers.len() == every).count(),
        }
    }

    pub async fn stop(self) {
        self.handle.stop(true).await;
    }
}

/// One delivery: to each server in turn, from the one whose turn it is, until one answers.
async fn relay(shared: web::Data<Shared>, request: HttpRequest, body: Bytes) -> HttpResponse {
    let servers = shared.servers.len();
    let first = shared.next.fetch_add(1, Ordering::Relaxed);
    for index in (first..first + servers).map(|turn| turn % servers) {
        let (status, content_type, answer) = match shared.hand_on(index, &request, &body).await {
            Ok(answer) => answer,
            Err(why) => {
                *shared.lock().passed_over.entry(why).or_default() += 1;
                continue;
            }
        };
        shared.tally(Some(index), &body, status, &answer);
        let mut response = HttpResponse::build(status);
        if let Some(content_type) = content_type {
            response.insert_header((CONTENT_TYPE, content_type));
        }
        return response.body(answer);
    }
    shared.tally(None, &body, StatusCode::BAD_GATEWAY, &[]);
    HttpResponse::BadGateway().finish()
}

impl Shared {
    /// Hands the delivery to server `index`, with the headers the service reads: its answer (status,
    /// content type, body), or why it gave none.
    async fn hand_on(&self, index: usize, request: &HttpRequest, body: &Bytes) -> Result<Answer, &'static str> {
        let mut delivery = self.http.post(self.servers[index].clone()).body(body.clone());
        for name in [CONTENT_TYPE.as_str(), SIGNATURE_HEADER] {
            if let Some(value) = request.headers().get(name) {
                delivery = delivery.header(name, value.as_bytes());
            }
        }
        let response = delivery.send().await.map_err(why)?;
        let status = StatusCode::from_u16(response.status().as_u16()).map_err(|_| "an unknown status")?;
        let content_type = response.headers().get(reqwest::header::CONTENT_TYPE).map(|value| value.as_bytes().to_vec());
        let answer = response.bytes().await.map_err(why)?;
        Ok((status, content_type, answer))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a delivery's answer, from `server` (`None`: no server answered).
    fn tally(&self, server: Option<usize>, body: &[u8], status: StatusCode, answer: &[u8]) {
        let answered = match server {
            None => "no server".to_owned(),
            Some(_) if status.is_success() => serde_json::from_slice::<Received>(answer)
                .map_or_else(|_| status.as_u16().to_string(), |received| received.outcome),
            Some(_) => status.as_u16().to_string(),
        };
        let mut tally = self.lock();
        *tally.answers.entry(answered).or_default() += 1;
        if let (Some(server), Ok(delivery)) = (server, serde_json::from_slice::<Delivery>(body)) {
            tally.reached.entry(delivery.id).or_default().insert(server);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    const APPLIED: &str = r#"{"received":true,"outcome":"applied"}"#;

    /// A server that answers every delivery [`APPLIED`] and keeps the signature and body of each.
    struct Receiver {
        base: Url,
        got: Arc<Mutex<Vec<(String, Bytes)>>>,
    }

    fn receiver() -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}/", listener.local_addr().unwrap()).parse().unwrap();
        let got: Arc<Mutex<Vec<(String, Bytes)>>> = Arc::default();
        let kept = got.clone();
        let server = HttpServer::new(move || {
            let kept = kept.clone();
            App::new().default_service(web::to(move |request: HttpRequest, body: Bytes| {
                let signature = request.headers().get(SIGNATURE_HEADER).unwrap().to_str().unwrap().to_owned();
                kept.lock().unwrap().push((signature, body));
                async { HttpResponse::Ok().content_type("application/json").body(APPLIED) }
            }))
        })
        .listen(listener)
        .unwrap()
        .workers(1)
        .disable_signals()
        .run();
        tokio::spawn(server);
        Receiver { base, got }
    }

    /// An address nothing listens on.
    fn nobody() -> Url {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        format!("http://127.0.0.1:{port}/").parse().unwrap()
    }

    async fn deliver(relay: &Relay, id: &str) -> (u16, String) {
        let response = reqwest::Client::new()
            .post(&relay.url)
            .header(SIGNATURE_HEADER, "t=1,v1=ab")
            .body(format!(r#"{{"id":"{id}"}}"#))
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    #[tokio::test]
    async fn deliveries_go_to_the_servers_in_turn_past_one_that_is_down_and_are_502_when_none_answers() {
        // None up: the gateway is told 502, and sends the event again later.
        let relay = Relay::start(&[nobody(), nobody()]).unwrap();
        assert_eq!(deliver(&relay, "evt_1").await.0, 502);
        let relayed = relay.relayed();
        assert_eq!(relayed.answers, [("no server".to_owned(), 1)].into());
        assert_eq!(relayed.passed_over, [("refused", 2)].into());
        relay.stop().await;

        // One down: every delivery reaches the other, byte for byte, signature and all, and its
        // answer comes back as it was.
        let up = receiver();
        let relay = Relay::start(&[nobody(), up.base.clone()]).unwrap();
        for id in ["evt_1", "evt_2"] {
            assert_eq!(deliver(&relay, id).await, (200, APPLIED.to_owned()));
        }
        let got = up.got.lock().unwrap().clone();
        assert_eq!(
            got,
            [("t=1,v1=ab".into(), r#"{"id":"evt_1"}"#.into()), ("t=1,v1=ab".into(), r#"{"id":"evt_2"}"#.into())]
        );
        let relayed = relay.relayed();
        assert_eq!(relayed.answers, [("applied".to_owned(), 2)].into());
        assert_eq!(relayed.passed_over, [("refused", 1)].into(), "only the first started with the one down");
        assert_eq!(relayed.on_every_server, 0);
        relay.stop().await;

        // Both up: the two copies of an event go one to each.
        let other = receiver();
        let relay = Relay::start(&[up.base.clone(), other.base.clone()]).unwrap();
        let (first, second) = tokio::join!(deliver(&relay, "evt_3"), deliver(&relay, "evt_3"));
        assert_eq!((first.0, second.0), (200, 200));
        assert_eq!(relay.relayed().on_every_server, 1);
        assert_eq!(other.got.lock().unwrap().len(), 1);
        relay.stop().await;
    }
}
