//! Building the application and running it: two steps, so that a caller (the CLI, the tests) can
//! bind first, learn the real address (port 0 allowed), and only then serve.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;

use actix_web::dev::{Server, ServerHandle};
use actix_web::middleware::from_fn;
use actix_web::{App, HttpServer, web};

use crate::state::AppState;
use crate::{endpoints, http};

/// The line `serve` prints once it accepts connections; tests, scripts and the benchmark read the
/// address off it.
pub const LISTENING: &str = "payments listening on";

/// The line `worker` prints once its workers run; tests and `payments chaos` wait for it.
pub const WORKER_RUNNING: &str = "payments worker running";

/// The line `serve` and `worker` print, before their ready line, with the URL of their metrics
/// (`metrics: http://127.0.0.1:9464/metrics`, and why in parentheses if that is not the address
/// asked for).
pub const METRICS_AT: &str = "metrics:";

/// Seconds in-flight requests get to finish when the server stops.
const SHUTDOWN_GRACE_SECS: u64 = 30;

/// A bound, not yet running, HTTP application.
pub struct Application {
    server: Server,
    addr: SocketAddr,
}

impl Application {
    /// Builds the server on an already-bound listener, with `workers` threads.
    pub fn build(state: Arc<AppState>, listener: TcpListener, workers: usize) -> std::io::Result<Application> {
        let addr = listener.local_addr()?;
        for entry in endpoints::KEYED {
            state.metrics.count_endpoint(entry.endpoint.label);
        }
        let state = web::Data::from(state);
        let configure = |cfg: &mut web::ServiceConfig| http::configure(cfg, endpoints::KEYED);
        let server = HttpServer::new(move || {
            App::new().app_data(state.clone()).wrap(from_fn(http::observe)).configure(configure)
        })
        .listen(listener)?
        .workers(workers)
        // Signals are ours to handle: on SIGTERM we stop the server first and then what it
        // depends on (the embedded cluster, the in-process gateway), in that order.
        .disable_signals()
        // A client that hangs up gets its handler dropped at once; its request goes on in a
        // task of its own (see `create_payment`), so nothing is left half-done.
        .h1_allow_half_closed(false)
        .shutdown_timeout(SHUTDOWN_GRACE_SECS)
        .run();
        Ok(Application { server, addr })
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A handle to stop the server gracefully.
    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    /// Serves until stopped through [`Application::handle`].
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.server.await
    }
}

/// A listener at `usual`, or, if that is taken, at a free port of the same host; the second value
/// then says that it moved, for the caller to announce. (An address a user set is bound as it
/// is: if it is taken, that is an error, since whoever set it meant it.)
pub fn bind_usual_or_free(usual: &str) -> std::io::Result<(TcpListener, bool)> {
    match TcpListener::bind(usual) {
        Ok(listener) => Ok((listener, false)),
        Err(error) if error.kind() == ErrorKind::AddrInUse => {
            let mut free: SocketAddr =
                usual.parse().map_err(|_| std::io::Error::new(ErrorKind::InvalidInput, usual.to_owned()))?;
            free.set_port(0);
            Ok((TcpListener::bind(free)?, true))
        }
        Err(error) => Err(error),
    }
}

/// A process's metrics listener: `GET /metrics` alone, on an address of its own (never the API's:
/// the metrics show every tenant's volumes), on one thread.
pub struct MetricsServer {
    addr: SocketAddr,
    handle: ServerHandle,
}

impl MetricsServer {
    /// Serves on `listener`, in a task of its own, until stopped.
    pub fn start(state: Arc<AppState>, listener: TcpListener) -> std::io::Result<MetricsServer> {
        let addr = listener.local_addr()?;
        let state = web::Data::from(state);
        let server = HttpServer::new(move || {
            App::new().app_data(state.clone()).wrap(from_fn(http::observe)).configure(http::configure_metrics)
        })
        .listen(listener)?
        .workers(1)
        .disable_signals()
        .shutdown_timeout(1)
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Ok(MetricsServer { addr, handle })
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A handle to stop it.
    pub fn handle(&self) -> ServerHandle {
        self.handle.clone()
    }

    /// Stops it, letting a scrape under way finish.
    pub async fn stop(self) {
        self.handle.stop(true).await;
    }
}

/// Installs the SIGINT and SIGTERM handlers at once (call it before announcing readiness, so that
/// a signal sent right after is not met by the default action, which kills the process), and
/// returns a future that resolves, naming the signal, when one arrives.
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = &'static str>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => "SIGINT",
            _ = terminate.recv() => "SIGTERM",
        }
    })
}

/// After the first stop signal a process drains what it is doing; a second one means "now": it
/// exits at once, and what was in flight is left as after a crash (and recovered like one).
pub fn exit_on_second_signal() -> std::io::Result<()> {
    let second = shutdown_signal()?;
    tracing::info!("draining; a second stop signal exits at once");
    tokio::spawn(async move {
        let signal = second.await;
        tracing::warn!(signal, "second stop signal: exiting at once");
        std::process::exit(1);
    });
    Ok(())
}
