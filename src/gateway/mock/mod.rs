//! A mock payment gateway: a small Stripe-like HTTP server that the payment
//! service charges cards and refunds charges through, in demos and tests.
//!
//! It exists to make the hard part of talking to a processor testable: not
//! knowing whether a charge or refund went through. The mock speaks Stripe's
//! idempotency protocol (`Idempotency-Key`; a retry with the same key and
//! body replays the stored response byte for byte, with
//! `Idempotent-Replayed: true`; a different body, or the key of a charge
//! sent to refunds or the reverse, is refused; a key still in use gets 409)
//! and can be told to fail on purpose.
//!
//! # Routes
//!
//! - `POST /v1/charges`: `tok_chargeDeclined` is declined (402, and the charge
//!   is kept, `failed`, as Stripe keeps it), any other `tok_…` source succeeds,
//!   anything else is an unknown token (400). `tok_refundPending` and
//!   `tok_refundFails` charge too, and choose how the charge's refunds end.
//! - `GET /v1/charges/{id}` and `GET /v1/charges?idempotency_key=K`: look-ups
//!   by id and by key. Charges keep their key for good, so a client can find
//!   out whether an earlier attempt charged even after the gateway has
//!   forgotten the key. A charge shows `amount_refunded` (its refunds that
//!   have not failed, pending ones included) and `refunded` (all of it).
//! - `POST /v1/refunds` with `{charge, amount?, reason?, metadata?}`: a refund
//!   of the charge, by default of all it has left, `succeeded` at once; for a
//!   `tok_refundPending` charge `pending`, then `succeeded` 2 s later; for a
//!   `tok_refundFails` charge `pending`, then `failed`, which gives its amount
//!   back to the charge. More than the charge has left is refused (400
//!   `amount_too_large`, or `charge_already_refunded` when nothing is left),
//!   as is an unknown charge (404 `resource_missing`) or a failed one (400
//!   `charge_not_refundable`); these answers are stored under the key like any
//!   other.
//! - `GET /v1/refunds/{id}` and `GET /v1/refunds?idempotency_key=K`: look-ups,
//!   as for charges. A pending refund settles on time, by a timer (and its
//!   event goes out then); anything that looks at the books settles those due
//!   too, so no reader sees one pending late.
//! - `GET /v1/account`: the gateway's identity, `acct_…`, new each time it
//!   starts (its memory is new too). Every answer also names it, in the
//!   `Gateway-Account` header.
//! - `/_control/…`, only when started with [`Controls::Served`]: `faults`
//!   (`POST` a plan, `GET` it, `DELETE` it), `events` (the same, for how events
//!   are misdelivered), `GET events/sent`, `DELETE idempotency-keys` (forget
//!   every answered key, keep the charges and refunds), `POST refunds/settle`
//!   (settle every pending refund now), and `GET stats`.
//!
//! # Events
//!
//! Started with a [`Webhook`], the gateway tells the merchant what happened to
//! its books: every change (a charge made or declined, a refund that succeeded
//! at once or settled) makes an event, `charge.succeeded`, `charge.failed`,
//! `refund.succeeded` or `refund.failed`, carrying the charge or refund as a
//! `GET` showed it then and the `Idempotency-Key` of the request that caused
//! it. Each is `POST`ed to the webhook, signed (`Gateway-Signature`, see
//! [`crate::gateway::signature`]), and retried with backoff until a 2xx. The
//! plan set at `/_control/events` sends some twice, late, or shuffled.
//!
//! # Fault model
//!
//! `POST /_control/faults` with `{"mode", "count", "latency_ms", "rate"}`
//! sets a plan for the next `count` (default 1) charge and refund requests:
//! every `POST /v1/charges` and `POST /v1/refunds`, replays and refused ones
//! included, uses one up. Faults sit on the way in or out of the gateway and
//! are never stored, so a retry with the same key sees what really happened:
//!
//! - `error_before`: 500, and the request is not processed at all;
//! - `error_after`: processed normally, then 500 (the charge or refund exists);
//! - `timeout_after`: processed normally, then no answer until the client
//!   gives up (the charge or refund exists);
//! - `latency`: processed after a delay; the key is claimed on arrival, so a
//!   concurrent retry gets 409;
//! - `random`: each request, with probability `rate`, gets one of the three
//!   failures above.
//!
//! Processing runs in its own task, so a client hanging up never leaves a
//! charge or refund half made. All state lives in memory for the server's
//! lifetime.

mod deliveries;
mod error;
mod event_plan;
mod events;
mod faults;
mod requests;
mod routes;
mod state;

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};

use actix_web::dev::ServerHandle;
use actix_web::middleware::DefaultHeaders;
use actix_web::{App, HttpServer, web};
use tokio::task::JoinHandle;

pub use self::deliveries::{
    DEFAULT_ATTEMPT_TIMEOUT, DEFAULT_FIRST_RETRY, DEFAULT_MAX_RETRY, Webhook, new_webhook_secret,
};
pub use self::faults::FaultPlan;
pub use self::routes::Controls;

/// A running mock gateway. Stop it with [`MockGateway::stop`]; dropping it
/// leaves the server running until its tokio runtime shuts down.
pub struct MockGateway {
    addr: SocketAddr,
    handle: ServerHandle,
    task: JoinHandle<io::Result<()>>,
    /// What runs beside the server: the timer that settles refunds, and the events' delivery.
    background: Vec<JoinHandle<()>>,
}

impl MockGateway {
    /// Serves on an already-bound listener (port 0 is fine: see
    /// [`MockGateway::addr`]) with one worker and no signal handling, starting
    /// with the given fault plan, e.g. [`FaultPlan::none`], and serving its
    /// control endpoints or not.
    ///
    /// Must be called from within a tokio runtime, onto which the server is
    /// spawned. It sends no events.
    pub fn start(listener: TcpListener, faults: FaultPlan, controls: Controls) -> io::Result<MockGateway> {
        MockGateway::launch(listener, faults, controls, None)
    }

    /// As [`MockGateway::start`], and sends its events to `webhook`.
    pub fn start_with_events(
        listener: TcpListener,
        faults: FaultPlan,
        controls: Controls,
        webhook: Webhook,
    ) -> io::Result<MockGateway> {
        MockGateway::launch(listener, faults, controls, Some(webhook))
    }

    fn launch(
        listener: TcpListener,
        faults: FaultPlan,
        controls: Controls,
        webhook: Option<Webhook>,
    ) -> io::Result<MockGateway> {
        let addr = listener.local_addr()?;
        let (outbox, courier) = deliveries::Outbox::new(webhook).map_err(io::Error::other)?;
        let state = web::Data::new(routes::AppState::new(faults, outbox));
        let mut background = vec![tokio::spawn(state.clone().into_inner().settle_on_time())];
        background.extend(courier.map(tokio::spawn));
        let configure = move |cfg: &mut web::ServiceConfig| routes::configure(cfg, controls);
        // Every answer says which gateway gave it, so that a client never takes one gateway's
        // answer for another's.
        let identity = (crate::gateway::IDENTITY_HEADER, state.account_id().to_owned());
        let server = HttpServer::new(move || {
            let identify = DefaultHeaders::new().add(identity.clone());
            App::new().wrap(identify).app_data(state.clone()).configure(configure)
        })
        .listen(listener)?
        .workers(1)
        .disable_signals()
        // Drop a request as soon as its client hangs up; otherwise a
        // `timeout_after` request would wait for an answer forever.
        .h1_allow_half_closed(false)
        // A mock has nothing worth waiting long for when stopping.
        .shutdown_timeout(1)
        .run();
        let handle = server.handle();
        let task = tokio::spawn(server);
        Ok(MockGateway { addr, handle, task, background })
    }

    /// The address the gateway listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The base URL to reach the gateway, e.g. `http://127.0.0.1:4242`. A
    /// gateway listening on all interfaces is reached through loopback.
    pub fn url(&self) -> String {
        let ip = match self.addr.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
            ip => ip,
        };
        format!("http://{}", SocketAddr::new(ip, self.addr.port()))
    }

    /// Stops accepting connections, lets requests in progress finish (for at
    /// most a second), and waits for the server to end. Events not yet
    /// acknowledged are dropped, with everything else the gateway knew.
    pub async fn stop(self) {
        self.handle.stop(true).await;
        for task in &self.background {
            task.abort();
        }
        match self.task.await {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::warn!(%err, "mock gateway stopped with an error"),
            Err(err) => tracing::warn!(%err, "mock gateway task failed"),
        }
    }
}
