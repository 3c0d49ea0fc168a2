//! `payments chaos`: watch the guarantees hold.
//!
//! It starts a deployment of its own (see [`world`]), or is pointed at one, and then, while many
//! payments, and refunds of a share of them, several at once per payment, go through the reference
//! client ([`load`]) over both servers:
//! - the gateway fails a share of the charge and refund requests (`error_before`, `error_after`,
//!   `timeout_after`: each leaves the service unsure whether it charged or refunded);
//! - every 1 to 3 s a random server or the worker is killed with SIGKILL, and started again;
//! - every 10 to 20 s one is frozen with SIGSTOP for a little longer than its leases, then thawed:
//!   its requests wake up to find their keys taken over, and the fence must stop them;
//! - every 1 to 3 s the gateway forgets its idempotency keys (as a real one does after a day),
//!   so only the service's look-up stands between a resumed request and a second charge;
//! - some requests carry a crash point, and the server that takes them aborts there;
//! - some clients walk away after one try, leaving their key to the workers;
//! - the gateway sends its events (one per charge, and per refund made or settled) late, a share of
//!   them twice at once, and shuffled ([`EventStorm`]), to a relay that hands each delivery to
//!   whichever server is up ([`crate::relay`]): the kills land while events are on their way;
//! - the gateway captures (all or part) or cancels a share of the authorizations on its own, as its
//!   dashboard or another system would, a moment after each is made: sometimes while the payment's
//!   answer is lost, sometimes after the payment recorded it authorized.
//!
//! When the load ends the faults stop, the system settles (every key finished, every refund the
//! gateway left pending settled, every event the gateway made acknowledged, each within a bounded
//! wait), every key is asked for once more, and [`check`] holds what everyone saw, and what the
//! gateway holds and sent, against the database. The run prints what it did and each invariant,
//! and fails if one is broken.

mod check;
mod gateway;
mod load;
mod report;
mod run;
mod timeline;
mod world;

use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use payments_client::Client;
use payments_service::gateway::downstream_key;
use payments_service::postgres::citus::CitusCluster;
use rand::Rng;
use reqwest::Url;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::progress::{Phase, Progress};
use crate::relay::Relay;
use check::{GatewayEvents, Outside, SentEvent, Stored};
use gateway::GatewayControl;
use load::Live;
use report::{Did, EventsDid, Report};
use timeline::Timeline;
use world::{Fleet, LOCK_TIMEOUT, World};

pub use gateway::EventStorm;
pub use load::{Extent, LEFT_TO_LAPSE, Mix};

/// The wait between two kills, and between two times the gateway forgets its keys, is drawn
/// from this range.
const KILL_EVERY: std::ops::Range<Duration> = Duration::from_secs(1)..Duration::from_secs(3);

/// The first pause comes early, so that a short run has one too.
const FIRST_PAUSE: std::ops::Range<Duration> = Duration::from_secs(2)..Duration::from_secs(5);

/// The wait between the end of a pause and the next.
const PAUSE_EVERY: std::ops::Range<Duration> = Duration::from_secs(10)..Duration::from_secs(20);

/// How much longer than the lock timeout a pause lasts: long enough for the frozen process's
/// leases to run out and its keys to be taken over.
const PAUSE_PAST_LEASE: std::ops::Range<Duration> = Duration::from_secs(1)..Duration::from_secs(3);

/// On Citus, the wait between two crashes of a worker node, and how long the node stays down.
const NODE_CRASH_EVERY: std::ops::Range<Duration> = Duration::from_secs(6)..Duration::from_secs(12);
const NODE_DOWN: std::ops::Range<Duration> = Duration::from_millis(500)..Duration::from_secs(3);

/// How soon after an authorization is made the gateway changes it on its own, when it does: at a
/// moment drawn from none to this, so that some changes land while the payment's answer is lost (a
/// fault's retry, a crash's lease) and some after it recorded the authorization, most before its
/// lapse (4 s).
const GATEWAY_ACTS_WITHIN: Duration = Duration::from_secs(3);

/// How often the fleet is checked for processes that aborted at a crash point.
const RESTART_POLL: Duration = Duration::from_millis(100);

/// How long the system may take to settle after the load: a key locked by a request that a
/// crash cut short waits out the lock timeout (11 s) before a worker or a retry takes it over.
/// Pending refunds get as long again to settle once the keys have: the gateway settles them about
/// 2 s after they were made, and the workers look them up with a backoff that the storm's faults
/// may have stretched.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(120);

/// How often settling is polled.
const SETTLE_POLL: Duration = Duration::from_millis(250);

/// Why the events of a gateway the run was pointed at are not checked.
const NO_EVENTS: &str = "the gateway made no events during the run (is it started with --events-url?)";

/// What to run.
pub struct Plan {
    pub extent: Extent,
    pub clients: usize,
    pub fault_rate: f64,
    pub mix: Mix,
    /// Whether to kill and pause processes.
    pub processes: bool,
    /// Whether to crash the worker nodes of a Citus cluster (and start them again).
    pub node_crashes: bool,
    /// How the gateway misdelivers its events during the storm.
    pub events: EventStorm,
    /// The share of the authorizations the gateway captures or cancels on its own during the
    /// storm.
    pub gateway_acts: f64,
    /// Where to draw the run's timeline, if anywhere (see [`timeline`]).
    pub plot: Option<PathBuf>,
    pub deployment: Deployment,
    /// A world of the run's own on a Citus cluster of this many workers, instead of one
    /// PostgreSQL.
    pub citus_workers: Option<u16>,
}

/// What to disturb.
pub enum Deployment {
    Own,
    /// A running deployment: driven and checked, never killed; no crash points (its servers may
    /// not honour them) and no check of its outbox's events (its webhook is not the run's). Its
    /// gateway's events are checked if it sends them (to the deployment, which nothing else uses
    /// meanwhile).
    Existing {
        urls: Vec<Url>,
        api_key: String,
        database_url: String,
        gateway_url: Url,
    },
}

/// What the run counted while it disturbed the fleet.
#[derive(Debug, Default)]
struct Disturbed {
    kills: Mutex<BTreeMap<String, u64>>,
    /// Pauses by process.
    pauses: Mutex<BTreeMap<String, u64>>,
    /// Citus workers crashed (immediate shutdown) and started again, by node.
    node_crashes: Mutex<BTreeMap<String, u64>>,
    /// Times the gateway was made to forget its idempotency keys.
    forgotten: AtomicU64,
    /// Processes that aborted by themselves (at a crash point) and were started again.
    aborted: AtomicU64,
    /// Kills while the gateway had events on their way (made, not acknowledged yet), and those
    /// events, summed over the kills.
    kills_amid_events: AtomicU64,
    events_at_kills: AtomicU64,
}

/// Runs the chaos and prints its report; whether every invariant held.
pub async fn run(mut plan: Plan) -> anyhow::Result<bool> {
    let progress = Progress::new();
    let starting = progress.step("starting the world");
    let mut world = match &plan.deployment {
        Deployment::Own => World::start(plan.citus_workers).await?,
        Deployment::Existing { urls, api_key, database_url, gateway_url } => {
            plan.mix.crash = 0.0;
            plan.mix.lapse = 0.0;
            World::existing(urls.clone(), api_key.clone(), database_url.clone(), gateway_url.clone())
        }
    };
    let urls: Vec<String> = world.urls.iter().map(Url::to_string).collect();
    starting.finish(&format!("servers at {}", urls.join(" and ")));
    let outcome = disturb_and_check(&plan, &mut world, &progress).await;
    let held = outcome.as_ref().is_ok_and(|report| report.held());
    let stopping = progress.step("stopping");
    let kept = world.stop(!held).await;
    drop(stopping);
    if let Ok(report) = &outcome {
        println!("{}", report.table());
    }
    if let Ok(Some(logs)) = &kept {
        println!("The processes' logs are kept in {}", logs.display());
    }
    outcome?;
    kept?;
    Ok(held)
}

async fn disturb_and_check(plan: &Plan, world: &mut World, progress: &Progress) -> anyhow::Result<Report> {
    let client = Client::new(&world.urls, &world.api_key, load::PERSISTENT)?;
    let gateway = GatewayControl::new(&world.gateway_url)?;
    let before = gateway.stats().await?;
    let sent_before: HashSet<String> = gateway.events_sent().await?.into_iter().map(|event| event.id).collect();

    // The storm.
    gateway.random_faults(plan.fault_rate).await?;
    gateway.misdeliver_events(plan.events).await?;
    gateway.change_authorizations(plan.gateway_acts, GATEWAY_ACTS_WITHIN).await?;
    let disturbed = Arc::new(Disturbed::default());
    let (stop, stopped) = watch::channel(false);
    let fleet = world.take_fleet();
    let timeline = Arc::new(Timeline::default());
    let drawing = plan.plot.clone().map(|dir| timeline.sample(gateway.clone(), world.database_url.clone(), dir));
    let nodes = world.citus().filter(|_| plan.node_crashes);
    let disturbing =
        disturb(fleet, nodes, plan.processes, gateway.clone(), stopped, disturbed.clone(), timeline.clone());
    let mut disturber = tokio::spawn(disturbing);
    let live = Arc::new(Live { timeline: timeline.clone(), ..Live::default() });
    let started = Instant::now();
    let phase = match plan.extent {
        Extent::Keys(keys) => progress.counted("payments under chaos", keys),
        Extent::For(duration) => progress.timed("payments under chaos", duration, None),
    };
    let ticker = tokio::spawn(show(plan.extent, live.clone(), disturbed.clone(), phase.bar()));
    // A disturber that fails (a process that will not start again, say) ends the run: the load
    // would go on against a world no longer disturbed, or no longer there.
    let load = load::drive(&client, plan.mix, plan.extent, plan.clients, &live);
    let mut runs = tokio::select! {
        runs = load => runs?,
        failed = &mut disturber => {
            failed??;
            anyhow::bail!("the disturber stopped before the load ended");
        }
    };
    let load_took = started.elapsed();
    timeline.rule("load ends");
    ticker.abort();
    let _ = stop.send(true);
    if let Some(fleet) = disturber.await?? {
        world.put_back(fleet);
    }
    let refunds = runs.iter().filter(|run| run.request.is_refund()).count();
    let changes = runs.iter().filter(|run| run.request.changes().is_some()).count();
    let payments = runs.len() - refunds - changes;
    phase.finish(&format!(
        "{payments} payments, {refunds} refunds and {changes} captures and cancels in {:.1} s",
        load_took.as_secs_f64()
    ));

    // The calm after it.
    let settling = progress.step("settling");
    let started = Instant::now();
    // How long each step of the settling took.
    let mut lap = started;
    let mut took = || std::mem::replace(&mut lap, Instant::now()).elapsed();
    gateway.clear_faults().await?;
    gateway.deliver_events().await?;
    gateway.leave_authorizations().await?;
    let keys: Vec<String> = runs.iter().map(|run| run.key.clone()).collect();
    let database = world.database_url.as_str();
    let unfinished = wait_for_none(&settling, "keys not finished yet", || check::unsettled(database, &keys)).await?;
    let keys_took = took();
    // Asked once more before the refunds settle: a refund whose every attempt was lost before its
    // claim committed is made only now, and may be left pending too.
    timeline.rule("every key asked once more");
    let final_attempts = load::replay_all(&client, &mut runs, plan.clients).await;
    let asked_took = took();
    let pending = wait_for_none(&settling, "refunds still pending", || check::pending_refunds(database, &keys)).await?;
    let refunds_took = took();
    // The authorizations left alone lapse within a few seconds of their time: those the final
    // round made too (a payment whose every attempt was lost before its claim committed).
    let open =
        wait_for_none(&settling, "authorizations still open", || check::open_authorizations(database, &keys)).await?;
    let lapses_took = took();
    // Last, since settling a refund makes an event.
    let unacknowledged =
        wait_for_none(&settling, "gateway events not acknowledged", || gateway.events_unacknowledged(&sent_before))
            .await?;
    let events_took = took();
    let stored = Stored::read(database, &keys).await?;
    let events = match world.webhook() {
        Some(webhook) => {
            let deadline = Instant::now() + SETTLE_TIMEOUT;
            let missing = |events| {
                !check::payment_events_missing(&stored, &events).is_empty()
                    || !check::refund_events_missing(&stored, &events).is_empty()
            };
            while missing(webhook.events()) && Instant::now() < deadline {
                settling.set_message("waiting for the outbox's events".into());
                tokio::time::sleep(SETTLE_POLL).await;
            }
            Some(webhook.events())
        }
        None => None,
    };
    let outbox_took = took();
    let settle_took = started.elapsed();
    let waited = |left: i64, what: &str, done: &str, took: Duration| match left {
        0 => format!("{what} {done} in {:.1} s", took.as_secs_f64()),
        left => format!("{left} {what} not {done} after {:.1} s", took.as_secs_f64()),
    };
    settling.finish(&format!(
        "{}, each asked once more in {:.1} s, {}, {}, {}, the outbox's events awaited {:.1} s: {:.1} s",
        waited(unfinished, "keys", "finished", keys_took),
        asked_took.as_secs_f64(),
        waited(pending, "pending refunds", "settled", refunds_took),
        waited(open, "authorizations", "ended", lapses_took),
        waited(unacknowledged, "gateway events", "acknowledged", events_took),
        outbox_took.as_secs_f64(),
        settle_took.as_secs_f64()
    ));
    if let Some(drawing) = drawing {
        drawing.finish(progress).await;
    }

    let after = gateway.stats().await?;
    let sent: Vec<SentEvent> =
        gateway.events_sent().await?.into_iter().filter(|event| !sent_before.contains(&event.id)).collect();
    // The run's own gateway sends its events (through the relay); one it was pointed at may not.
    let gateway_events = match world.relay() {
        None if after.events == before.events => GatewayEvents::NotChecked(NO_EVENTS),
        _ => GatewayEvents::Sent { made: after.events.saturating_sub(before.events), sent },
    };
    // A gateway restarted meanwhile counts from zero again; the check then fails, as it should.
    let charged = stored.totals.values().filter_map(|totals| totals.charge_id.clone());
    let authorized = stored.authorizations().filter_map(|payment| payment.charge_id.clone());
    let outside = Outside {
        gateway_charges: after.charges.saturating_sub(before.charges),
        gateway_authorizations: after.authorizations.saturating_sub(before.authorizations),
        gateway_captures: after.captures.saturating_sub(before.captures),
        gateway_cancels: after.cancels.saturating_sub(before.cancels),
        gateway_refunds: after.refunds.saturating_sub(before.refunds),
        charges: gateway.charges(charged.chain(authorized).collect::<HashSet<_>>().into_iter()).await?,
        charges_by_key: gateway
            .charges_by_key(stored.payments.values().flatten().filter_map(|payment| {
                let key = payment.downstream_key.clone()?;
                Some((payment.id, key))
            }))
            .await?,
        own_changes: gateway.own_changes().await?,
        refunds_by_key: gateway
            .refunds_by_key(
                stored.all_refunds().map(|refund| (refund.id, downstream_key(refund.account_id, refund.key_id))),
            )
            .await?,
        events,
        gateway_events,
    };
    let verdicts = check::check(&runs, &stored, &outside);
    let attempts = (live.attempts.load(Ordering::Relaxed), final_attempts);
    let did = Did::of(&runs, &stored, &outside, attempts, &disturbed, before, after, load_took, settle_took);
    let relayed = world.relay().map(Relay::relayed);
    let events = EventsDid::of(plan.events, &outside.gateway_events, &disturbed, relayed, &stored);
    Ok(Report { did, events, verdicts })
}

/// Every 1 to 3 s kills a random member of the fleet and starts it again (counting the gateway's
/// events on their way then), and every 10 to 20 s freezes one past its leases (with
/// `processes`); makes the gateway forget its keys on a timer of its own; starts again at once
/// any process that exited by itself (at a crash point). When told to stop, thaws what is frozen
/// and hands the fleet back, all running.
async fn disturb(
    mut fleet: Option<Fleet>,
    nodes: Option<Arc<Mutex<CitusCluster>>>,
    processes: bool,
    gateway: GatewayControl,
    mut stop: watch::Receiver<bool>,
    disturbed: Arc<Disturbed>,
    timeline: Arc<Timeline>,
) -> anyhow::Result<Option<Fleet>> {
    let after = |range: std::ops::Range<Duration>| Instant::now() + rand::rng().random_range(range);
    let (mut kill_at, mut forget_at, mut pause_at) = (after(KILL_EVERY), after(KILL_EVERY), after(FIRST_PAUSE));
    let mut crash_node_at = after(NODE_CRASH_EVERY);
    // The frozen member, and when it thaws.
    let mut paused: Option<(usize, Instant)> = None;
    let tally = |counts: &Mutex<BTreeMap<String, u64>>, name: &str| {
        *counts.lock().unwrap_or_else(PoisonError::into_inner).entry(name.to_owned()).or_default() += 1;
    };
    let (owned, idle) = (fleet.is_some(), Instant::now() + Duration::from_secs(86_400));
    loop {
        tokio::select! {
            _ = stop.changed() => break,
            _ = tokio::time::sleep_until(kill_at), if processes && owned => {
                let on_their_way = gateway.stats().await?.events_on_their_way();
                if let Some(fleet) = fleet.as_mut()
                    && let Some(name) = fleet.kill_one().await?
                {
                    tally(&disturbed.kills, name);
                    disturbed.kills_amid_events.fetch_add(u64::from(on_their_way > 0), Ordering::Relaxed);
                    disturbed.events_at_kills.fetch_add(on_their_way, Ordering::Relaxed);
                    timeline.killed();
                }
                kill_at = after(KILL_EVERY);
            }
            _ = tokio::time::sleep_until(pause_at), if processes && owned && paused.is_none() => {
                if let Some((index, name)) = fleet.as_mut().map(Fleet::pause_one).transpose()?.flatten() {
                    tally(&disturbed.pauses, name);
                    paused = Some((index, Instant::now() + LOCK_TIMEOUT + rand::rng().random_range(PAUSE_PAST_LEASE)));
                    timeline.paused();
                }
            }
            _ = tokio::time::sleep_until(paused.map_or(idle, |(_, at)| at)), if paused.is_some() => {
                if let (Some(fleet), Some((index, _))) = (fleet.as_mut(), paused.take()) {
                    fleet.resume(index)?;
                    timeline.thawed();
                }
                pause_at = after(PAUSE_EVERY);
            }
            _ = tokio::time::sleep_until(crash_node_at), if nodes.is_some() => {
                if let Some(nodes) = &nodes {
                    let name = crash_a_worker(nodes.clone()).await?;
                    tally(&disturbed.node_crashes, &name);
                    timeline.killed();
                }
                crash_node_at = after(NODE_CRASH_EVERY);
            }
            _ = tokio::time::sleep_until(forget_at) => {
                gateway.forget_keys().await?;
                disturbed.forgotten.fetch_add(1, Ordering::Relaxed);
                timeline.forgotten();
                forget_at = after(KILL_EVERY);
            }
            _ = tokio::time::sleep(RESTART_POLL), if owned => {
                if let Some(fleet) = fleet.as_mut() {
                    let restarted = fleet.restart_exited().await?;
                    disturbed.aborted.fetch_add(restarted, Ordering::Relaxed);
                    timeline.aborted(restarted);
                }
            }
        }
    }
    if let Some(fleet) = fleet.as_mut() {
        if let Some((index, _)) = paused {
            fleet.resume(index)?;
            timeline.thawed();
        }
        disturbed.aborted.fetch_add(fleet.restart_exited().await?, Ordering::Relaxed);
    }
    Ok(fleet)
}

/// Crashes a Citus worker at random, keeps it down a moment, and starts it again (recovering
/// from its WAL; the coordinator resolves the transactions it had prepared); returns its name.
async fn crash_a_worker(nodes: Arc<Mutex<CitusCluster>>) -> anyhow::Result<String> {
    let worker = {
        let workers = nodes.lock().unwrap_or_else(PoisonError::into_inner).workers();
        rand::rng().random_range(1..=workers)
    };
    let crashing = nodes.clone();
    tokio::task::spawn_blocking(move || crashing.lock().unwrap_or_else(PoisonError::into_inner).crash_worker(worker))
        .await??;
    let down = rand::rng().random_range(NODE_DOWN);
    tokio::time::sleep(down).await;
    tokio::task::spawn_blocking(move || nodes.lock().unwrap_or_else(PoisonError::into_inner).restart_worker(worker))
        .await??;
    Ok(format!("citus worker {worker}"))
}

/// Keeps the progress line's counts up to date.
async fn show(extent: Extent, live: Arc<Live>, disturbed: Arc<Disturbed>, bar: indicatif::ProgressBar) {
    loop {
        let (keys, refunds) = (live.keys.load(Ordering::Relaxed), live.refunds.load(Ordering::Relaxed));
        let changes = live.changes.load(Ordering::Relaxed);
        let count = |counts: &Mutex<BTreeMap<String, u64>>| -> u64 {
            counts.lock().unwrap_or_else(PoisonError::into_inner).values().sum()
        };
        let (kills, pauses) = (count(&disturbed.kills), count(&disturbed.pauses));
        let aborted = disturbed.aborted.load(Ordering::Relaxed);
        let attempts = live.attempts.load(Ordering::Relaxed);
        match extent {
            Extent::Keys(_) => bar.set_position(keys),
            Extent::For(_) => {}
        }
        bar.set_message(format!(
            "{keys} payments · {refunds} refunds · {changes} captures and cancels · {attempts} attempts · {kills} kills · {pauses} pauses · {aborted} \
             aborted at a crash point"
        ));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Polls `count` (of what is not settled yet, `what`) until it is zero, or for at most
/// [`SETTLE_TIMEOUT`]; returns what is still unsettled then, which the checks report.
async fn wait_for_none<F, Fut>(step: &Phase<'_>, what: &str, mut count: F) -> anyhow::Result<i64>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<i64>>,
{
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let left = count().await?;
        step.set_message(format!("{left} {what}"));
        if left == 0 || Instant::now() >= deadline {
            return Ok(left);
        }
        tokio::time::sleep(SETTLE_POLL).await;
    }
}
