//! The load: many payments at once through the reference client, each with its own key, some
//! carrying a crash point on their first attempt, some abandoned after one try, some declined.
//! Every answer a client sees is kept, for the checks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use rand::Rng;
use tokio::time::Instant;

use crate::client::{Answer, Attempt, Client, KeySeen, NewPayment, Outcome, RetryPolicy};
use crate::faults::FAULT_HEADER;

/// The crash points a request can carry (see [`crate::faults`]).
const CRASH_POINTS: [&str; 3] = ["crash=after_started", "crash=after_charge", "crash=after_charge_created"];

/// How hard the chaos clients try: a request cut short by a crash holds its key for the
/// services' lock timeout (11 s), so a client must outlast a few of those.
pub const PERSISTENT: RetryPolicy = RetryPolicy {
    max_attempts: 200,
    deadline: Duration::from_secs(120),
    base_delay: Duration::from_millis(100),
    max_delay: Duration::from_secs(2),
    attempt_timeout: Duration::from_secs(15),
};

/// How many payments to make.
#[derive(Debug, Clone, Copy)]
pub enum Extent {
    Keys(u64),
    For(Duration),
}

/// The shares of payments that get each treatment.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    /// The first attempt carries a crash point: the server it reaches aborts there.
    pub crash: f64,
    /// The client tries once and walks away, whatever the answer.
    pub abandon: f64,
    /// The card is declined.
    pub decline: f64,
}

/// One key's story, as its client saw it.
#[derive(Debug)]
pub struct KeyRun {
    pub key: String,
    pub payment: NewPayment,
    pub crash_point: Option<&'static str>,
    pub abandoned: bool,
    /// Every answer, in order (the final replay's included).
    pub answers: Vec<Answer>,
    /// The client stopped without a definitive answer (abandoned keys always do, unless their
    /// one try got one).
    pub gave_up: bool,
}

/// Live counts, for the progress display.
#[derive(Debug, Default)]
pub struct Live {
    pub keys: AtomicU64,
    pub attempts: AtomicU64,
}

/// Runs the load with `clients` payments in flight at once.
pub async fn drive(
    client: &Client,
    mix: Mix,
    extent: Extent,
    clients: usize,
    live: &Arc<Live>,
) -> anyhow::Result<Vec<KeyRun>> {
    let runs = Arc::new(Mutex::new(Vec::new()));
    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|_| {
            let (client, runs, next, live) = (client.clone(), runs.clone(), next.clone(), live.clone());
            tokio::spawn(async move {
                loop {
                    let more = match extent {
                        Extent::Keys(keys) => next.fetch_add(1, Ordering::Relaxed) < keys,
                        Extent::For(duration) => started.elapsed() < duration,
                    };
                    if !more {
                        break;
                    }
                    let run = one_key(&client, mix, &live).await;
                    live.keys.fetch_add(1, Ordering::Relaxed);
                    runs.lock().unwrap_or_else(PoisonError::into_inner).push(run);
                }
            })
        })
        .collect();
    for task in tasks {
        // A client that panicked would leave its keys out of the checks unseen.
        task.await?;
    }
    Ok(std::mem::take(&mut *runs.lock().unwrap_or_else(PoisonError::into_inner)))
}

/// One payment, treated as `mix` draws.
async fn one_key(client: &Client, mix: Mix, live: &Live) -> KeyRun {
    let (crash_point, abandoned, declined, amount) = {
        let mut rng = rand::rng();
        let crash_point = rng.random_bool(mix.crash).then(|| CRASH_POINTS[rng.random_range(0..CRASH_POINTS.len())]);
        (crash_point, rng.random_bool(mix.abandon), rng.random_bool(mix.decline), rng.random_range(100..100_000))
    };
    let source = if declined { "tok_chargeDeclined" } else { "tok_visa" };
    let payment = NewPayment { amount, currency: "usd".into(), source: source.into(), description: None };
    let key = Client::new_key();
    let client =
        if abandoned { client.with_policy(RetryPolicy { max_attempts: 1, ..PERSISTENT }) } else { client.clone() };
    let headers: Vec<(&str, &str)> = crash_point.map(|point| (FAULT_HEADER, point)).into_iter().collect();
    let mut answers = Vec::new();
    let finished =
        client.send_with(&key, KeySeen::No, &payment, &headers, |attempt| keep(attempt, &mut answers, live)).await;
    KeyRun {
        key,
        payment,
        crash_point: crash_point.map(|point| point.trim_start_matches("crash=")),
        abandoned,
        answers,
        gave_up: matches!(finished.outcome, Outcome::GaveUp { .. }),
    }
}

fn keep(attempt: &Attempt, answers: &mut Vec<Answer>, live: &Live) {
    live.attempts.fetch_add(1, Ordering::Relaxed);
    if let Ok(answer) = &attempt.result {
        answers.push(answer.clone());
    }
}

/// Once the system has settled, asks for every key's answer once more, as a client coming back
/// would; each answer joins the key's others. Returns the attempts it took.
pub async fn replay_all(client: &Client, runs: &mut [KeyRun], clients: usize) -> u64 {
    let live = Live::default();
    futures_util::stream::iter(runs.iter_mut())
        .for_each_concurrent(clients, |run| {
            let live = &live;
            async move {
                let (key, payment, answers) = (&run.key, &run.payment, &mut run.answers);
                client.send(key, KeySeen::Maybe, payment, |attempt| keep(attempt, answers, live)).await;
            }
        })
        .await;
    live.attempts.load(Ordering::Relaxed)
}
