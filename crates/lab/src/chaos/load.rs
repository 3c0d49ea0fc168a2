//! The load: many payments at once through the reference client, each with its own key, some
//! carrying a crash point on their first attempt, some abandoned after one try, some declined.
//! A share of the payments that succeed are then refunded by the same client: by several refunds
//! at once, each with a key of its own, for parts of the payment or all it has left, so that they
//! race for its money and some are refused; some of them on charges whose refunds the gateway
//! leaves pending (and a few of those fail). Refunds carry crash points and are abandoned too.
//! A share of the payments are only authorized: then, at a moment drawn up to a little past the
//! authorization's lapse, captures (of all or part of it) and cancels, each with a key of its own,
//! race for it at once, and its refunds with them; some are left alone, for the lapse. Captures
//! and cancels carry crash points and are abandoned too.
//! Every answer a client sees is kept, for the checks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures_util::StreamExt;
use payments_client::{
    Answer, Attempt, Client, KeySeen, NewCancel, NewCapture, NewPayment, NewRefund, Outcome, RetryPolicy,
};
use payments_service::faults::FAULT_HEADER;
use rand::Rng;
use tokio::time::Instant;

use super::run::{KeyRun, Request};
use super::timeline::Timeline;

/// The crash points a payment request can carry (see [`payments_service::faults`]). A run that
/// made its payment records the answer with the key's finish, so `after_charge_created` stops only
/// a run that took up a payment an earlier one made.
const CRASH_POINTS: [&str; 3] = ["crash=after_started", "crash=after_charge", "crash=after_charge_created"];

/// The crash points a refund request can carry.
const REFUND_CRASH_POINTS: [&str; 3] = ["crash=after_started", "crash=after_refund", "crash=after_refund_created"];

/// The crash points a capture or a cancel can carry. As a payment's, a run that made its change
/// records the answer with the key's finish: `after_change_created` stops only a run that took up
/// a change an earlier one made.
const CHANGE_CRASH_POINTS: [&str; 3] = ["crash=after_started", "crash=after_change", "crash=after_change_created"];

/// How long an authorization lives before it lapses, as the run's services are told
/// ([`super::world`]). An authorization's captures and cancels are sent at a moment drawn from
/// none to [`CHANGES_WITHIN`], so that some race its lapse, and some come after it.
pub const AUTHORIZATION_TTL: Duration = Duration::from_secs(4);
const CHANGES_WITHIN: Duration = Duration::from_secs(5);

/// At most this many captures and cancels of one authorization are sent at once.
const MAX_CHANGES_AT_ONCE: usize = 3;

/// The share of authorizations left alone, for the lapse to cancel (in a world of the run's own,
/// whose authorizations lapse within it).
pub const LEFT_TO_LAPSE: f64 = 0.2;

/// The share of captures that take part of the authorization; the others take all of it.
const PARTIAL_CAPTURE: f64 = 0.5;

/// The share of an authorization's changes that are cancels; the others are captures.
const CANCELS: f64 = 0.4;

/// At most this many refunds of one payment are sent at once: enough that together they often
/// ask for more than it has.
const MAX_REFUNDS_AT_ONCE: usize = 3;

/// The share of the refunds that ask for all the payment has left; the others ask for a part of
/// it, between a quarter and three quarters of its amount.
const WHOLE_REFUND: f64 = 0.25;

/// The share of the charges made for pending refunds whose refunds then fail.
const FAILING_REFUNDS: f64 = 0.25;

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

/// The shares of payments (and refunds) that get each treatment.
#[derive(Debug, Clone, Copy)]
pub struct Mix {
    /// The first attempt carries a crash point: the server it reaches aborts there.
    pub crash: f64,
    /// The client tries once and walks away, whatever the answer.
    pub abandon: f64,
    /// The card is declined.
    pub decline: f64,
    /// Of the payments not declined, those only authorized, to be captured, cancelled or left to
    /// lapse.
    pub authorize: f64,
    /// Of the authorizations, those left alone for the lapse: none in a deployment the run was
    /// pointed at, whose authorizations need not lapse within the run.
    pub lapse: f64,
    /// Of the payments not declined, those refunded once they succeed (an authorization's refunds
    /// race its captures and cancels).
    pub refund: f64,
    /// Of those, the ones charged with `tok_refundPending` (a quarter of them `tok_refundFails`):
    /// the gateway leaves their refunds pending, to settle later.
    pub pending_refund: f64,
}

/// Live counts, for the progress display, and the timeline each key and attempt is recorded in.
#[derive(Debug, Default)]
pub struct Live {
    /// Payments made (their keys).
    pub keys: AtomicU64,
    /// Refunds asked for (their keys).
    pub refunds: AtomicU64,
    /// Captures and cancels asked for (their keys).
    pub changes: AtomicU64,
    pub attempts: AtomicU64,
    pub timeline: Arc<Timeline>,
}

/// Runs the load with `clients` payments (each with the refunds that follow it) in flight at once.
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
                    let done = one_payment(&client, mix, &live).await;
                    runs.lock().unwrap_or_else(PoisonError::into_inner).extend(done);
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

/// One payment, treated as `mix` draws: its refunds if it is to be refunded and succeeds, and
/// its captures and cancels, racing them, if it is only authorized.
async fn one_payment(client: &Client, mix: Mix, live: &Live) -> Vec<KeyRun> {
    let (declined, authorized, refunded, amount) = {
        let mut rng = rand::rng();
        let declined = rng.random_bool(mix.decline);
        let authorized = !declined && rng.random_bool(mix.authorize);
        (declined, authorized, !declined && rng.random_bool(mix.refund), rng.random_range(100..100_000))
    };
    let source = match () {
        _ if declined => "tok_chargeDeclined",
        _ if refunded && rand::rng().random_bool(mix.pending_refund) => {
            match rand::rng().random_bool(FAILING_REFUNDS) {
                true => "tok_refundFails",
                false => "tok_refundPending",
            }
        }
        _ => "tok_visa",
    };
    let payment =
        NewPayment { amount, currency: "usd".into(), source: source.into(), description: None, capture: !authorized };
    let (run, outcome) = one_key(client, mix, &CRASH_POINTS, Request::Payment(payment), live).await;
    live.keys.fetch_add(1, Ordering::Relaxed);
    let payment_id = match outcome {
        Outcome::Succeeded(answer) if refunded || authorized => answer.object_id(),
        _ => None,
    };
    let Some(payment_id) = payment_id else { return vec![run] };
    let changes = match authorized {
        true => changes_of(&payment_id, amount, mix.lapse),
        false => Vec::new(),
    };
    if !changes.is_empty() {
        let wait = rand::rng().random_range(Duration::ZERO..CHANGES_WITHIN);
        tokio::time::sleep(wait).await;
    }
    let refunds = match refunded {
        true => rand::rng().random_range(1..=MAX_REFUNDS_AT_ONCE),
        false => 0,
    };
    let refunds = (0..refunds).map(|_| {
        let amount = {
            let mut rng = rand::rng();
            (!rng.random_bool(WHOLE_REFUND)).then(|| rng.random_range(amount / 4..=amount * 3 / 4))
        };
        Request::Refund(NewRefund { payment: payment_id.clone(), amount, reason: None })
    });
    let requests = changes
        .into_iter()
        .map(|change| (change, &CHANGE_CRASH_POINTS))
        .chain(refunds.map(|refund| (refund, &REFUND_CRASH_POINTS)));
    let sent = requests.map(|(request, crash_points)| one_key(client, mix, crash_points, request, live));
    let mut runs = vec![run];
    for (run, _) in futures_util::future::join_all(sent).await {
        match run.request.is_refund() {
            true => live.refunds.fetch_add(1, Ordering::Relaxed),
            false => live.changes.fetch_add(1, Ordering::Relaxed),
        };
        runs.push(run);
    }
    runs
}

/// The captures and cancels to race for an authorization of `amount`: none, if it is left to
/// lapse.
fn changes_of(payment_id: &str, amount: u64, lapse: f64) -> Vec<Request> {
    let mut rng = rand::rng();
    let Ok(payment) = payment_id.parse() else { return Vec::new() };
    if rng.random_bool(lapse) {
        return Vec::new();
    }
    let changes = rng.random_range(1..=MAX_CHANGES_AT_ONCE);
    (0..changes)
        .map(|_| match rng.random_bool(CANCELS) {
            true => Request::Cancel(NewCancel { payment, reason: None }),
            false => {
                let amount = rng.random_bool(PARTIAL_CAPTURE).then(|| rng.random_range(amount / 4..=amount * 3 / 4));
                Request::Capture(NewCapture { payment, amount })
            }
        })
        .collect()
}

/// One request with a key of its own, treated as `mix` draws (a crash point among
/// `crash_points`, abandoned after one try), as the client saw it and how it ended.
async fn one_key(
    client: &Client,
    mix: Mix,
    crash_points: &[&'static str],
    request: Request,
    live: &Live,
) -> (KeyRun, Outcome) {
    let (crash_point, abandoned) = {
        let mut rng = rand::rng();
        let crash_point = rng.random_bool(mix.crash).then(|| crash_points[rng.random_range(0..crash_points.len())]);
        (crash_point, rng.random_bool(mix.abandon))
    };
    let key = Client::new_key();
    live.timeline.key(&key);
    let client =
        if abandoned { client.with_policy(RetryPolicy { max_attempts: 1, ..PERSISTENT }) } else { client.clone() };
    let headers: Vec<(&str, &str)> = crash_point.map(|point| (FAULT_HEADER, point)).into_iter().collect();
    let mut answers = Vec::new();
    let finished =
        request.send(&client, &key, KeySeen::No, &headers, |attempt| keep(attempt, &mut answers, live)).await;
    let run = KeyRun {
        key,
        request,
        crash_point: crash_point.map(|point| point.trim_start_matches("crash=")),
        abandoned,
        answers,
        gave_up: matches!(finished.outcome, Outcome::GaveUp { .. }),
    };
    (run, finished.outcome)
}

fn keep(attempt: &Attempt, answers: &mut Vec<Answer>, live: &Live) {
    live.attempts.fetch_add(1, Ordering::Relaxed);
    live.timeline.attempt(&attempt.result);
    if let Ok(answer) = &attempt.result {
        answers.push(answer.clone());
    }
}

/// Once the system has settled, asks for every key's answer once more, as a client coming back
/// would; each answer joins the key's others. Returns the attempts it took (kept off the run's
/// timeline, whose attempts are the storm's).
pub async fn replay_all(client: &Client, runs: &mut [KeyRun], clients: usize) -> u64 {
    let live = Live::default();
    futures_util::stream::iter(runs.iter_mut())
        .for_each_concurrent(clients, |run| {
            let live = &live;
            async move {
                let (key, request, answers) = (&run.key, &run.request, &mut run.answers);
                request.send(client, key, KeySeen::Maybe, &[], |attempt| keep(attempt, answers, live)).await;
            }
        })
        .await;
    live.attempts.load(Ordering::Relaxed)
}
