//! The reference receiver of a merchant's webhooks, as `payments listen` runs it. Each delivery is
//! verified as Standard Webhooks says ([`payments_wire::standard_webhooks`], the module the
//! service signs with): under any of its secrets, its timestamp within five minutes of this
//! clock. One that verifies is answered `204` and heard; anything else `400`, with the reason.

use std::net::TcpListener;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_web::dev::ServerHandle;
use actix_web::web::{Data, Payload};
use actix_web::{App, HttpRequest, HttpResponse, HttpServer};
use serde::Deserialize;
use tokio::sync::mpsc;

use payments_wire::standard_webhooks::{
    Delivery, ID_HEADER, SIGNATURE_HEADER, SigningSecret, TIMESTAMP_HEADER, VerifyError, verify,
};

/// How far a delivery's timestamp may be from this clock, either way: an older one may be a replay.
pub const TOLERANCE: Duration = Duration::from_secs(5 * 60);

/// The largest body read: an event is a few KiB.
const MAX_BODY: usize = 1024 * 1024;

/// What the receiver heard: a delivery that verified, or one it refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    /// A verified event: its `type` (as its body says) and its id (`webhook-id`).
    Event {
        kind: String,
        id: String,
    },
    Refused(VerifyError),
    /// A body larger than a delivery's, or one that broke off: refused unread.
    Unreadable,
}

/// A running receiver.
pub struct Receiver {
    pub url: String,
    handle: ServerHandle,
}

impl Receiver {
    /// Listens on `listener` with `secrets`, telling `heard` of every delivery.
    pub fn start(
        listener: TcpListener,
        secrets: Vec<SigningSecret>,
        heard: mpsc::UnboundedSender<Heard>,
    ) -> std::io::Result<Receiver> {
        let url = format!("http://{}", listener.local_addr()?);
        let state = Data::new(State { secrets, heard });
        let server =
            HttpServer::new(move || App::new().app_data(state.clone()).default_service(actix_web::web::to(receive)))
                .listen(listener)?
                .workers(1)
                .disable_signals()
                .run();
        let handle = server.handle();
        tokio::spawn(server);
        Ok(Receiver { url, handle })
    }

    pub async fn stop(self) {
        self.handle.stop(true).await;
    }
}

struct State {
    secrets: Vec<SigningSecret>,
    heard: mpsc::UnboundedSender<Heard>,
}

/// What it reads of a verified event.
#[derive(Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
}

async fn receive(state: Data<State>, request: HttpRequest, payload: Payload) -> HttpResponse {
    // Read here, not by an extractor, so that a body too large is a `400` like every other refusal.
    let Ok(Ok(body)) = payload.to_bytes_limited(MAX_BODY).await else {
        let _ = state.heard.send(Heard::Unreadable);
        return HttpResponse::BadRequest().content_type("text/plain").body("the body is larger than an event's\n");
    };
    let header = |name: &str| request.headers().get(name).and_then(|value| value.to_str().ok());
    let delivery = Delivery {
        id: header(ID_HEADER),
        timestamp: header(TIMESTAMP_HEADER),
        signature: header(SIGNATURE_HEADER),
        body: &body,
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_secs() as i64);
    match verify(&delivery, &state.secrets, now, TOLERANCE) {
        Ok(id) => {
            let kind =
                serde_json::from_slice::<Event>(&body).map_or_else(|_| "(no type)".to_owned(), |event| event.kind);
            let _ = state.heard.send(Heard::Event { kind, id: id.to_owned() });
            HttpResponse::NoContent().finish()
        }
        Err(refused) => {
            let _ = state.heard.send(Heard::Refused(refused));
            HttpResponse::BadRequest().content_type("text/plain").body(format!("{refused}\n"))
        }
    }
}
