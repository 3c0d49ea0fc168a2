//! The webhook a run's own service delivers its events to: it answers every POST `200`, counts
//! the deliveries, and keeps each event's type and the id of its object (a payment, a refund). It
//! runs inside the run's process (so the benchmark counts its CPU time with its own).

use std::collections::{BTreeSet, HashMap};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use actix_web::dev::ServerHandle;
use actix_web::{App, HttpResponse, HttpServer, web};
use serde::Deserialize;

/// A running webhook receiver.
pub struct WebhookSink {
    pub url: String,
    received: Arc<Received>,
    handle: ServerHandle,
}

#[derive(Default)]
struct Received {
    deliveries: AtomicU64,
    events: Mutex<Events>,
}

/// The events that arrived: each object's id, and the types of the events about it.
pub type Events = HashMap<String, BTreeSet<String>>;

/// What the sink reads of an event: `{"type": ..., "data": {"object": {"id": ...}}}`.
#[derive(Deserialize)]
struct Event {
    #[serde(rename = "type")]
    kind: String,
    data: EventData,
}

#[derive(Deserialize)]
struct EventData {
    object: EventObject,
}

#[derive(Deserialize)]
struct EventObject {
    id: String,
}

impl WebhookSink {
    pub fn start() -> anyhow::Result<WebhookSink> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let url = format!("http://{}/events", listener.local_addr()?);
        let received = Arc::new(Received::default());
        let data = web::Data::from(received.clone());
        let server = HttpServer::new(move || App::new().app_data(data.clone()).default_service(web::to(receive)))
            .listen(listener)?
            .workers(1)
            .disable_signals()
            .run();
        let handle = server.handle();
        tokio::spawn(server);
        Ok(WebhookSink { url, received, handle })
    }

    /// Events delivered so far (at least once each: a redelivery counts again).
    pub fn deliveries(&self) -> u64 {
        self.received.deliveries.load(Ordering::Relaxed)
    }

    /// The events that arrived so far, by the id of their object.
    pub fn events(&self) -> Events {
        self.received.events.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    pub async fn stop(self) {
        self.handle.stop(true).await;
    }
}

async fn receive(received: web::Data<Received>, body: web::Bytes) -> HttpResponse {
    received.deliveries.fetch_add(1, Ordering::Relaxed);
    if let Ok(event) = serde_json::from_slice::<Event>(&body) {
        let mut events = received.events.lock().unwrap_or_else(PoisonError::into_inner);
        events.entry(event.data.object.id).or_default().insert(event.kind);
    }
    HttpResponse::Ok().finish()
}
