//! The webhook the benchmark's service delivers its events to: it answers every POST `200` and
//! counts them. It runs inside the benchmark, so its CPU time is counted with the benchmark's.

use std::net::TcpListener;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use actix_web::dev::ServerHandle;
use actix_web::{App, HttpResponse, HttpServer, web};

/// A running webhook receiver.
pub struct WebhookSink {
    pub url: String,
    deliveries: Arc<AtomicU64>,
    handle: ServerHandle,
}

impl WebhookSink {
    pub fn start() -> anyhow::Result<WebhookSink> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let url = format!("http://{}/events", listener.local_addr()?);
        let deliveries = Arc::new(AtomicU64::new(0));
        let counter = web::Data::from(deliveries.clone());
        let server = HttpServer::new(move || {
            App::new().app_data(counter.clone()).default_service(web::to(|counter: web::Data<AtomicU64>| async move {
                counter.fetch_add(1, Ordering::Relaxed);
                HttpResponse::Ok().finish()
            }))
        })
        .listen(listener)?
        .workers(1)
        .disable_signals()
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Ok(WebhookSink { url, deliveries, handle })
    }

    /// Events delivered so far (at least once each: a redelivery counts again).
    pub fn deliveries(&self) -> u64 {
        self.deliveries.load(Ordering::Relaxed)
    }

    pub async fn stop(self) {
        self.handle.stop(true).await;
    }
}
