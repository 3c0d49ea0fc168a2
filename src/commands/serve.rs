//! `payments serve`: the HTTP API (and the workers, unless `--no-workers`), with everything it
//! needs started around it.

use std::future::pending;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::sync::Arc;

use anyhow::Context;
use payments_mock_gateway::{Controls, FaultPlan, MockGateway, Webhook, new_webhook_secret};
use payments_service::accounts::DEMO_API_KEY;
use payments_service::config::{DEFAULT_GATEWAY_BIND, DEFAULT_METRICS_BIND, DatabaseArgs, ServeArgs, Settings};
use payments_service::db;
use payments_service::gateway::GatewayClient;
use payments_service::gateway::signature::WebhookSecret;
use payments_service::metrics;
use payments_service::postgres::embedded::{EmbeddedDatabase, Sharing};
use payments_service::startup::{Application, LISTENING, bind_usual_or_free, exit_on_second_signal, shutdown_signal};
use payments_service::state::AppState;
use payments_service::webhooks::network::AllowedNetworks;
use payments_service::workers::Workers;
use tokio::sync::watch;

use super::{
    MetricsListener, advertise_gateway, open_database, refuse_a_role_that_cannot_write, routing,
    warn_if_events_are_only_logged, withdraw_gateway,
};

/// Connections per process. Each request holds one only while it runs a phase (never across the
/// gateway call), so a few dozen serve many more concurrent requests.
const POOL_SIZE: u32 = 32;

pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let mut settings = args.protocol.settings()?;
    let stop_requested = shutdown_signal()?;
    if settings.fault_injection {
        tracing::warn!("FAULT INJECTION IS ON: X-Fault-Inject can crash this process. Never use this in production.");
    }
    let shared_database = args.database.database_url.is_some();
    if shared_database && args.gateway_url.is_none() && !args.private_mock_gateway {
        anyhow::bail!(
            "DATABASE_URL is set but GATEWAY_URL is not: every process on a database must charge through the same \
             gateway, or one would find nothing of another's charges and charge again. Set GATEWAY_URL to that \
             gateway (`payments gateway --bind ...`, say), or pass --private-mock-gateway to charge through a mock \
             of this process's own, which only this process can then finish payments at"
        );
    }
    let listener = TcpListener::bind(&args.bind).with_context(|| format!("cannot listen on {}", args.bind))?;
    if !shared_database && !listener.local_addr()?.ip().is_loopback() {
        anyhow::bail!(
            "embedded mode seeds the public demo API key {DEMO_API_KEY}, so it serves only on a loopback address, \
             not on {}: anyone who reached it could pay with that key. Bind to 127.0.0.1 (PAYMENTS_BIND), or run \
             with DATABASE_URL and accounts of your own (`payments accounts create NAME`)",
            args.bind
        );
    }
    let metrics = MetricsListener::at_or_usual(args.metrics_bind.as_deref(), DEFAULT_METRICS_BIND)?;
    let (gateway_url, mock) = match &args.gateway_url {
        Some(url) => (url.clone(), None),
        None => {
            let events = own_events(listener.local_addr()?, &mut settings);
            let mock = start_mock_gateway(args.mock_gateway_bind.as_deref(), events.webhook.clone())?;
            (mock.url().parse()?, Some((mock, events)))
        }
    };
    let (database_url, embedded) = match args.citus_workers {
        None => open_database(&args.database, Sharing::Own).await?,
        Some(workers) => open_citus(&args.database, workers).await?,
    };
    match embedded {
        Some(_) => advertise_gateway(&args.database.data_dir, &gateway_url)?,
        None => refuse_a_role_that_cannot_write(&database_url).await?,
    }
    // Embedded mode runs on one machine, where a receiver to try webhooks on is on loopback.
    if embedded.is_some() && args.protocol.webhook_allowed_networks.is_none() {
        settings.webhook_networks = AllowedNetworks::loopback();
    }
    let state = Arc::new(AppState::new(
        db::pool(&database_url, POOL_SIZE),
        routing(&args.database, &database_url, POOL_SIZE),
        GatewayClient::new(&gateway_url, settings.gateway_timeout)?,
        settings,
    ));
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    // Printed first, before the line that says the API is ready.
    let metrics = metrics.serve(state.clone())?;
    let app = Application::build(state.clone(), listener, threads)?;
    let (addr, handle) = (app.addr(), app.handle());
    let mut server = tokio::spawn(app.run_until_stopped());
    let (stop_workers, workers_stop) = watch::channel(false);
    // The per-account request counts go to the database every few seconds, and once more at the end.
    let flusher = {
        let (state, stop) = (state.clone(), workers_stop.clone());
        tokio::spawn(async move { metrics::flush_until_stopped(&state.metrics, &state.db, stop).await })
    };
    let mut workers = match args.no_workers {
        true => None,
        false => Some(tokio::spawn(Workers::new(state, &args.workers.settings())?.run(workers_stop))),
    };
    if workers.is_some() && embedded.is_none() {
        warn_if_events_are_only_logged(&args.workers.settings());
    }

    println!("{LISTENING} http://{addr}");
    match &mock {
        Some((mock, _)) if args.mock_gateway_bind.is_none() && mock.addr().to_string() != DEFAULT_GATEWAY_BIND => {
            println!("gateway: in-process mock at {} ({DEFAULT_GATEWAY_BIND} is taken)", mock.url())
        }
        Some((mock, _)) => println!("gateway: in-process mock at {}", mock.url()),
        None => println!("gateway: {gateway_url}"),
    }
    if let Some((_, events)) = &mock {
        events.announce();
    }
    println!(
        "workers: {}",
        if workers.is_some() {
            "completer, reaper, outbox, webhooks, settler, lapser, analyzer"
        } else {
            "none (--no-workers)"
        }
    );
    if let Some(embedded) = &embedded {
        let socket = EmbeddedDatabase::socket_dir(&args.database.data_dir);
        match embedded.citus_nodes().first() {
            Some((_, port, _)) => println!(
                "database: embedded Citus, under {} (psql -h 127.0.0.1 -p {port} -U postgres payments)",
                args.database.data_dir.display()
            ),
            None => println!(
                "database: embedded, under {} (psql -h {} -U postgres payments)",
                args.database.data_dir.display(),
                socket.display()
            ),
        }
        println!("demo API key: {DEMO_API_KEY}");
        println!(
            "try: curl -s -X POST http://{addr}/v1/payments -H 'Authorization: Bearer {DEMO_API_KEY}' \
             -H 'Idempotency-Key: order-1' -H 'Content-Type: application/json' \
             -d '{{\"amount\": 1000, \"currency\": \"usd\", \"source\": \"tok_visa\"}}'"
        );
    }

    // The API and the workers run side by side; if either ends by itself, the process stops.
    let workers_ended = async {
        match &mut workers {
            Some(workers) => drop(workers.await),
            None => pending().await,
        }
    };
    tokio::select! {
        signal = stop_requested => tracing::info!(signal, "stopping: draining requests and workers"),
        result = &mut server => tracing::error!(?result, "the HTTP server stopped by itself; stopping"),
        () = workers_ended => tracing::error!("the workers stopped by themselves; stopping"),
    }
    exit_on_second_signal()?;
    // In dependency order: requests, then workers (which finish the unit they are on), then what
    // both use.
    handle.stop(true).await;
    let _ = stop_workers.send(true);
    if let Some(workers) = workers {
        let _ = workers.await;
    }
    let _ = flusher.await;
    metrics.stop().await;
    if let Some((mock, _)) = mock {
        mock.stop().await;
    }
    if let Some(embedded) = embedded {
        withdraw_gateway(&args.database.data_dir);
        embedded.stop().await?;
    }
    tracing::info!("stopped");
    Ok(())
}

/// Where the in-process mock gateway sends its events: to this `serve`'s own `POST
/// /webhooks/gateway`, signed under the webhook secrets it has; and a secret made for this run
/// (and added to the settings, so that this process accepts what its mock signs) if none is set.
struct OwnEvents {
    webhook: Webhook,
    /// Shown once, at start, for whoever wants to sign an event by hand; never logged.
    made_secret: Option<String>,
}

/// The events of the in-process mock gateway of the `serve` that listens at `api`. A secret made
/// here lives as long as the process: the mock's events in flight die with it anyway (it keeps
/// them in memory), so nothing needs it after, and no secret is left on disk.
fn own_events(api: SocketAddr, settings: &mut Settings) -> OwnEvents {
    let made_secret = settings.gateway_webhook_secrets.is_empty().then(new_webhook_secret);
    if let Some(secret) = &made_secret {
        settings.gateway_webhook_secrets.push(WebhookSecret::new(secret.as_str()));
    }
    let url = format!("http://{}/webhooks/gateway", reachable(api)).parse().expect("a socket address makes a URL");
    OwnEvents { webhook: Webhook::new(url, settings.gateway_webhook_secrets.clone()), made_secret }
}

impl OwnEvents {
    /// Says where the events go, and with which secret.
    fn announce(&self) {
        match &self.made_secret {
            Some(secret) => {
                println!("gateway events: to {}", self.webhook.shown_url());
                println!(
                    "webhook secret: {secret} (made for this run; PAYMENTS_GATEWAY_WEBHOOK_SECRETS sets your own)"
                );
            }
            None => println!(
                "gateway events: to {}, signed under PAYMENTS_GATEWAY_WEBHOOK_SECRETS",
                self.webhook.shown_url()
            ),
        }
    }
}

/// Where a listener at `addr` is reached from this machine: through loopback if it listens on
/// every interface.
fn reachable(addr: SocketAddr) -> SocketAddr {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    SocketAddr::new(ip, addr.port())
}

/// Starts the in-process mock gateway at `bind`, or, when none is given, at the standalone
/// gateway's usual address so that the walkthrough's fault-control commands work as printed. If that
/// is taken it takes a free port, and says so loudly: it never charges anywhere unannounced, and
/// every payment records the gateway that answers for it, so no other gateway is ever asked to
/// charge it.
/// Its fault controls are served only on a loopback address. It sends its events to `webhook`.
fn start_mock_gateway(bind: Option<&str>, webhook: Webhook) -> anyhow::Result<MockGateway> {
    let listener = match bind {
        Some(bind) => TcpListener::bind(bind).with_context(|| {
            format!(
                "cannot start the in-process mock gateway on {bind} (PAYMENTS_MOCK_GATEWAY_BIND): free it, choose \
                 another address, or set GATEWAY_URL to charge through the gateway there"
            )
        })?,
        None => {
            let (listener, moved) = bind_usual_or_free(DEFAULT_GATEWAY_BIND)
                .with_context(|| format!("cannot start the in-process mock gateway on {DEFAULT_GATEWAY_BIND}"))?;
            if moved {
                let addr = listener.local_addr()?;
                tracing::warn!(taken = DEFAULT_GATEWAY_BIND, %addr, "the mock gateway's usual address is taken");
            }
            listener
        }
    };
    let controls = match listener.local_addr()?.ip().is_loopback() {
        true => Controls::Served,
        false => Controls::Hidden,
    };
    Ok(MockGateway::start_with_events(listener, FaultPlan::none(), controls, webhook)?)
}

/// `--citus-workers N`: a local Citus cluster under the data directory, the schema distributed over
/// it, the demo account in it; where each node is, printed. Refused at once with DATABASE_URL, or
/// where Citus is not installed.
async fn open_citus(database: &DatabaseArgs, workers: u16) -> anyhow::Result<(String, Option<EmbeddedDatabase>)> {
    if database.database_url.is_some() {
        anyhow::bail!("--citus-workers starts a Citus cluster of its own: it cannot be used with DATABASE_URL");
    }
    payments_service::postgres::citus::installed().map_err(anyhow::Error::msg)?;
    let embedded = EmbeddedDatabase::open_citus(&database.data_dir, workers.into()).await?;
    let mut conn = <diesel_async::AsyncPgConnection as diesel_async::AsyncConnection>::establish(&embedded.url).await?;
    payments_service::accounts::ensure_demo(&mut conn).await?;
    for (role, port, root) in embedded.citus_nodes() {
        println!("Citus {role:<11} 127.0.0.1:{port}  {}", root.display());
    }
    Ok((embedded.url.clone(), Some(embedded)))
}
