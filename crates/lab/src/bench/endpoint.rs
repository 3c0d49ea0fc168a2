//! The bare reference endpoint (the reference workloads' `bare_actix_main.rs`): actix-web parsing
//! a JSON payment and answering JSON, with no database, no authentication and no idempotency. It
//! answers at the service's path, so that the load generator sends it exactly the requests it
//! sends the service, and the client's own cost cancels out in the ratio of the two.

use std::net::TcpListener;

use actix_web::{App, HttpResponse, HttpServer, web};
use serde::{Deserialize, Serialize};

/// The line it prints once it accepts connections.
pub const LISTENING: &str = "bench endpoint listening on";

#[derive(Deserialize)]
struct PaymentRequest {
    amount: i64,
    currency: String,
    #[expect(dead_code, reason = "parsed, as the service parses it, and not used")]
    description: Option<String>,
}

#[derive(Serialize)]
struct PaymentResponse<'a> {
    id: &'a str,
    object: &'a str,
    amount: i64,
    currency: String,
    status: &'a str,
    gateway_charge_id: &'a str,
    created_at: &'a str,
    recovery_point: &'a str,
}

async fn create_payment(body: web::Json<PaymentRequest>) -> HttpResponse {
    let body = body.into_inner();
    HttpResponse::Ok().json(PaymentResponse {
        id: "0b8a3c2e-6f1d-4a5b-9c7e-2d4f6a8b0c1e",
        object: "payment",
        amount: body.amount,
        currency: body.currency,
        status: "succeeded",
        gateway_charge_id: "ch_1234567890abcdef",
        created_at: "2025-01-01T00:00:00Z",
        recovery_point: "finished",
    })
}

/// Serves until SIGTERM or SIGINT.
pub async fn serve(bind: &str, workers: usize) -> anyhow::Result<()> {
    let listener = TcpListener::bind(bind)?;
    let addr = listener.local_addr()?;
    let stop_requested = payments_service::startup::shutdown_signal()?;
    let server = HttpServer::new(|| App::new().route("/v1/payments", web::post().to(create_payment)))
        .listen(listener)?
        .workers(workers)
        .disable_signals()
        .run();
    let handle = server.handle();
    let server = tokio::spawn(server);
    println!("{LISTENING} http://{addr}");
    stop_requested.await;
    handle.stop(true).await;
    server.await??;
    Ok(())
}
