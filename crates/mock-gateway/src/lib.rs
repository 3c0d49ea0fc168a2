#![doc = include_str!("../README.md")]

mod deliveries;
mod error;
mod event_plan;
mod events;
mod faults;
mod own_changes;
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
    /// What runs beside the server: the timer that settles refunds and makes the gateway's own
    /// changes, and the events' delivery.
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
        let mut background = vec![tokio::spawn(state.clone().into_inner().change_on_time())];
        background.extend(courier.map(tokio::spawn));
        let configure = move |cfg: &mut web::ServiceConfig| routes::configure(cfg, controls);
        // Every answer says which gateway gave it, so that a client never takes one gateway's
        // answer for another's.
        let identity = (payments_wire::IDENTITY_HEADER, state.account_id().to_owned());
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
