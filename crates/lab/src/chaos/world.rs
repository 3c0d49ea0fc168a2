//! The deployment a chaos run disturbs. Its own: a durable PostgreSQL cluster, `payments gateway`
//! as a process of its own (it outlives every crash, and counts the charges), two `payments
//! serve` and a `payments worker` on that database, a webhook receiver, and a relay that takes
//! the gateway's events to whichever server is up (the gateway sends them to one URL, and the
//! servers are killed). Or one it is pointed at, which it drives and checks but does not kill.
//!
//! The services run with fault injection on (so that requests can carry crash points) and with
//! short timeouts, so that a request cut short by a crash is taken over in seconds, not minutes:
//! the guarantees do not depend on the timeouts, only how long a run takes.

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::Signal;
use payments_mock_gateway::new_webhook_secret;
use payments_service::postgres::citus::CitusCluster;
use payments_service::startup::{LISTENING, WORKER_RUNNING};
use rand::seq::IteratorRandom;
use reqwest::Url;

use super::load::AUTHORIZATION_TTL;
use crate::child::{Child, payments};
use crate::relay::Relay;
use crate::webhook::WebhookSink;
use crate::{Nodes, OwnDatabase, Scratch};

/// The run's scratch directories: `/tmp/payments-chaos-<pid>`.
const SCRATCH_PREFIX: &str = "payments-chaos-";

/// The services' lock timeout: the shortest they accept with their gateway timeout (500 ms; an
/// injected `timeout_after` costs this much). A key whose request was cut short is taken over
/// after this.
pub const LOCK_TIMEOUT: Duration = Duration::from_millis(11_000);

/// What the services run with, beyond the database, gateway, webhook, address, lock timeout and
/// the gateway's webhook secret.
const SERVICE_SETTINGS: &[(&str, &str)] = &[
    ("PAYMENTS_GATEWAY_TIMEOUT_MS", "500"),
    ("PAYMENTS_WORKER_INTERVAL_MS", "200"),
    // Kills, pauses and faults make some completer runs fail; it must not give a key up while
    // the storm lasts, or a key would need attention for the storm's sake, not the service's.
    ("PAYMENTS_COMPLETER_MAX_ATTEMPTS", "50"),
    ("PAYMENTS_COMPLETER_BACKOFF_MS", "200"),
    ("PAYMENTS_WEBHOOK_BACKOFF_MS", "200"),
    // The settler's look-ups of the refunds the gateway left pending (it settles them about 2 s
    // after they were made): a second or so apart, never more than four, so that the storm's
    // refunds settle within seconds of it, not minutes.
    ("PAYMENTS_SETTLER_BACKOFF_MS", "1000"),
    ("PAYMENTS_SETTLER_MAX_BACKOFF_MS", "4000"),
    ("RUST_LOG", "warn"),
];

/// The deployment, as the run sees it.
pub struct World {
    /// The servers' base URLs; the clients spread their attempts over them.
    pub urls: Vec<Url>,
    pub api_key: String,
    pub database_url: String,
    pub gateway_url: Url,
    own: Option<Own>,
}

/// What a run started itself. Fields drop in order: the processes before the cluster they use,
/// the scratch directory last.
struct Own {
    fleet: Option<Fleet>,
    gateway: Child,
    relay: Relay,
    webhook: WebhookSink,
    database: OwnDatabase,
    scratch: Scratch,
}

/// The processes a run kills and restarts: the servers and the worker.
pub struct Fleet {
    members: Vec<Member>,
    logs: PathBuf,
}

/// One process of the fleet, and how to start it again.
struct Member {
    name: String,
    args: Vec<&'static str>,
    env: Vec<(&'static str, String)>,
    ready: &'static str,
    child: Option<Child>,
    starts: u32,
    /// Frozen with `SIGSTOP`, until thawed.
    paused: bool,
}

impl World {
    /// Starts a deployment of the run's own: on one PostgreSQL, or on a Citus cluster of
    /// `citus_workers` workers.
    pub async fn start(citus_workers: Option<u16>) -> anyhow::Result<World> {
        let scratch = Scratch::create(SCRATCH_PREFIX)?;
        let database = match citus_workers {
            None => OwnDatabase::start(&scratch.path().join("pg"), Vec::new(), "chaos").await?,
            Some(workers) => OwnDatabase::start_citus(&scratch.path().join("citus"), workers.into(), "chaos").await?,
        };
        // Fixed ports, so that a restarted server is where the clients and the relay look for it.
        let ports = [free_port()?, free_port()?];
        let urls: Vec<Url> =
            ports.iter().map(|port| format!("http://127.0.0.1:{port}").parse()).collect::<Result<_, _>>()?;
        let relay = Relay::start(&urls)?;
        // In the environment, never on a command line, where `ps` would show it.
        let secret = new_webhook_secret();
        let gateway_env = [
            ("RUST_LOG", "warn"),
            ("PAYMENTS_GATEWAY_EVENTS_URL", &relay.url),
            ("PAYMENTS_GATEWAY_WEBHOOK_SECRETS", &secret),
        ];
        let gateway = payments(&["gateway", "--bind", "127.0.0.1:0", "--control"], &gateway_env)?;
        let log = scratch.path().join("gateway.log");
        let gateway = Child::start("payments gateway", gateway, &log, "payments gateway listening on").await?;
        let gateway_url: Url = gateway.address.parse().context("the address the gateway printed")?;
        let webhook = WebhookSink::start()?;

        let common = |extra: Vec<(&'static str, String)>| {
            let mut env = vec![
                ("DATABASE_URL", database.url.clone()),
                ("GATEWAY_URL", gateway_url.to_string()),
                ("PAYMENTS_WEBHOOK_URL", webhook.url.clone()),
            ];
            env.extend(SERVICE_SETTINGS.iter().map(|(name, value)| (*name, value.to_string())));
            env.push(("PAYMENTS_LOCK_TIMEOUT_MS", LOCK_TIMEOUT.as_millis().to_string()));
            // Authorizations lapse within the run, some while their captures and cancels are on
            // their way.
            env.push(("PAYMENTS_AUTHORIZATION_TTL_SECS", AUTHORIZATION_TTL.as_secs().to_string()));
            env.extend(extra);
            env
        };
        let mut members = Vec::new();
        for (name, port) in ["serve-a", "serve-b"].into_iter().zip(ports) {
            let env = common(vec![
                ("PAYMENTS_BIND", format!("127.0.0.1:{port}")),
                // Never the usual 9464, which a `serve` of the user's may hold.
                ("PAYMENTS_METRICS_BIND", "127.0.0.1:0".to_owned()),
                ("PAYMENTS_FAULT_INJECTION", "1".to_owned()),
                ("PAYMENTS_GATEWAY_WEBHOOK_SECRETS", secret.clone()),
            ]);
            members.push(Member::new(name, vec!["serve"], env, LISTENING));
        }
        members.push(Member::new("worker", vec!["worker"], common(vec![]), WORKER_RUNNING));
        let mut fleet = Fleet { members, logs: scratch.path().to_owned() };
        for index in 0..fleet.members.len() {
            fleet.start(index).await?;
        }
        Ok(World {
            urls,
            api_key: database.api_key.clone(),
            database_url: database.url.clone(),
            gateway_url,
            own: Some(Own { fleet: Some(fleet), gateway, relay, webhook, database, scratch }),
        })
    }

    /// A running deployment.
    pub fn existing(urls: Vec<Url>, api_key: String, database_url: String, gateway_url: Url) -> World {
        World { urls, api_key, database_url, gateway_url, own: None }
    }

    /// The processes to disturb, taken out of the world for the time of the load (none in a
    /// deployment the run was pointed at).
    pub fn take_fleet(&mut self) -> Option<Fleet> {
        self.own.as_mut().and_then(|own| own.fleet.take())
    }

    pub fn put_back(&mut self, fleet: Fleet) {
        if let Some(own) = self.own.as_mut() {
            own.fleet = Some(fleet);
        }
    }

    /// The Citus cluster the run's own world runs on, if it does: its workers are crashed too.
    pub fn citus(&self) -> Option<Arc<Mutex<CitusCluster>>> {
        match &self.own.as_ref()?.database.nodes {
            Nodes::Citus(citus) => Some(citus.clone()),
            Nodes::One(_) => None,
        }
    }

    /// The webhook the run's own services deliver their events to.
    pub fn webhook(&self) -> Option<&WebhookSink> {
        self.own.as_ref().map(|own| &own.webhook)
    }

    /// The relay the run's own gateway sends its events through.
    pub fn relay(&self) -> Option<&Relay> {
        self.own.as_ref().map(|own| &own.relay)
    }

    /// Stops what the run started, in dependency order. With `keep_logs`, the scratch directory
    /// stays, and its path is returned.
    pub async fn stop(mut self, keep_logs: bool) -> anyhow::Result<Option<PathBuf>> {
        let Some(own) = self.own.take() else { return Ok(None) };
        if let Some(fleet) = own.fleet {
            fleet.stop().await?;
        }
        own.gateway.stop().await?;
        own.relay.stop().await;
        own.webhook.stop().await;
        own.database.stop().await?;
        Ok(keep_logs.then(|| own.scratch.keep()))
    }
}

/// A port nothing listens on now.
fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Member {
    fn new(name: &str, args: Vec<&'static str>, env: Vec<(&'static str, String)>, ready: &'static str) -> Member {
        Member { name: name.to_owned(), args, env, ready, child: None, starts: 0, paused: false }
    }
}

impl Fleet {
    /// Starts member `index` (again), with a log of its own for each start.
    async fn start(&mut self, index: usize) -> anyhow::Result<()> {
        let member = &mut self.members[index];
        member.starts += 1;
        let env: Vec<(&str, &str)> = member.env.iter().map(|(name, value)| (*name, value.as_str())).collect();
        let log = self.logs.join(format!("{}.{}.log", member.name, member.starts));
        let name = format!("payments {}", member.name);
        member.child = Some(Child::start(&name, payments(&member.args, &env)?, &log, member.ready).await?);
        Ok(())
    }

    /// A member at random, among those not paused.
    fn pick(&self) -> Option<usize> {
        (0..self.members.len()).filter(|index| !self.members[*index].paused).choose(&mut rand::rng())
    }

    /// Kills a member at random with SIGKILL and starts it again; returns its name.
    pub async fn kill_one(&mut self) -> anyhow::Result<Option<&str>> {
        let Some(index) = self.pick() else { return Ok(None) };
        if let Some(child) = self.members[index].child.take() {
            child.kill().await?;
        }
        self.start(index).await?;
        Ok(Some(&self.members[index].name))
    }

    /// Freezes a member at random with SIGSTOP, mid-request maybe; returns its index and name.
    pub fn pause_one(&mut self) -> anyhow::Result<Option<(usize, &str)>> {
        let Some(index) = self.pick() else { return Ok(None) };
        let member = &mut self.members[index];
        if let Some(child) = &member.child {
            child.signal(Signal::SIGSTOP)?;
            member.paused = true;
        }
        Ok(Some((index, &member.name)))
    }

    /// Thaws a member frozen by [`Fleet::pause_one`].
    pub fn resume(&mut self, index: usize) -> anyhow::Result<()> {
        let member = &mut self.members[index];
        if let Some(child) = member.child.as_ref().filter(|_| member.paused) {
            child.signal(Signal::SIGCONT)?;
        }
        member.paused = false;
        Ok(())
    }

    /// Starts again every member that exited by itself (at a crash point); returns how many.
    pub async fn restart_exited(&mut self) -> anyhow::Result<u64> {
        let mut restarted = 0;
        for index in 0..self.members.len() {
            if self.members[index].child.as_mut().is_none_or(Child::has_exited) {
                self.start(index).await?;
                restarted += 1;
            }
        }
        Ok(restarted)
    }

    async fn stop(self) -> anyhow::Result<()> {
        for member in self.members {
            if let Some(child) = member.child {
                child.stop().await?;
            }
        }
        Ok(())
    }
}
