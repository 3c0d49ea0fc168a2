//! The model's paths, walked on the real service. Random paths through the protocol's model
//! (`payments-model`), from a seed drawn afresh each run, are taken step by step by real `serve`
//! processes (one per attempt of the client, each stopped at every point its request passes by
//! `X-Fault-Inject: pause=every`, so that a step is one `SIGCONT`), the completer, a gateway
//! process and a real PostgreSQL. After each step, what the database, the gateway and the client
//! show is compared with what the model predicted. A failure names its seed, and
//! `PAYMENTS_CONFORMANCE_SEED=<seed>` walks the same paths again.
//!
//! The model's faults become real ones: a crash is `SIGKILL`; a lease lapsing is the key row's
//! `locked_until` put in the past (what time does to it); the gateway failing before or after
//! charging is armed at the gateway process; the gateway forgetting its keys is its control
//! endpoint. What a path here never takes: a pause that outlasts a lease (a process stops here
//! only between steps; `fencing.rs` pauses one past its lease), the gateway's events, refunds and
//! the reaper. The model checks those; their own tests drive them.
//!
//! With the look-up before re-charging switched off, in the model (its broken rule) and in the
//! service (a switch only a test build has), the walk takes the shortest path to a double charge
//! and the gateway makes two charges where the model says. And the rules the service states in
//! SQL (the claim, the fence, a refund's fit, a change of an authorization) decide, in every
//! situation the protocol's functions name, as those functions do.

use std::collections::{BTreeSet, HashSet, VecDeque};
use std::time::Duration;

use chrono::Utc;
use diesel::prelude::*;
use diesel_async::RunQueryDsl;
use nix::sys::signal::Signal;
use payments_model::{Action, Answer, Gateway, Mutant, Pc, Point, Protocol, State};
use payments_protocol::test_switches;
use payments_protocol::{Claim, Found, Lease, Refusal};
use payments_service::audit::Actor;
use payments_service::db::schema::payments;
use payments_service::idempotency::{
    Claim as Claimed, PhaseError, Reason, StoredResponse, Transition, atomic_phase, claim,
};
use payments_service::workers::{Outcome as Worked, Worker};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use reqwest::StatusCode;
use serde_json::{Value, json};
use stateright::Model;
use tokio::task::JoinHandle;

use crate::helpers::{
    GatewayControl, GatewayStats, KeyRowId, Lock as KeyLock, Process, TestApp, TestWrites, audited_phase, new_key,
    payment_body, wait_for,
};

/// How long a gateway call may take: long enough for a slow machine's first answers, short enough
/// for the `timeout_after` steps, which wait it out.
const GATEWAY_TIMEOUT: Duration = Duration::from_secs(2);

/// Paths per run (more, up to twice as many, until every kind of step was taken), and the most
/// steps on each. (A step: one fault, or one driver from a point where it can stop to the next.)
const PATHS: u64 = 24;
const MOST_STEPS: usize = 40;

/// The environment variable that replays a run: the seed its failure named.
const SEED_VARIABLE: &str = "PAYMENTS_CONFORMANCE_SEED";

/// Where this run's paths start from: a seed drawn afresh, so that each run walks other paths, or
/// the one [`SEED_VARIABLE`] names, to replay a run. Printed, and named by every failure.
fn run_seed() -> u64 {
    let seed = match std::env::var(SEED_VARIABLE) {
        Ok(seed) => seed.parse().unwrap_or_else(|_| panic!("{SEED_VARIABLE} is a number, not {seed:?}")),
        Err(_) => rand::random(),
    };
    eprintln!("model conformance: {SEED_VARIABLE}={seed} walks these paths again");
    seed
}

#[tokio::test]
async fn the_service_does_what_the_model_predicts_on_paths_drawn_from_it() {
    // Every kind of step is taken on some path, so that no comparison holds for want of trying:
    // after the first paths, more are drawn until each kind was taken.
    let kinds = [
        "a new key claimed",
        "a key taken up again",
        "a retry turned away",
        "a stored answer replayed",
        "the completer's take-over",
        "started",
        "a look-up",
        "charged",
        "declined",
        "fails before charging",
        "charges, then fails",
        "charge_created",
        "finished",
        "released",
        "a crash",
        "a lease lapses",
        "the gateway forgets",
    ];
    let gateway = Process::gateway().await;
    let mut taken = BTreeSet::new();
    let first = run_seed();
    for n in 0..2 * PATHS {
        if n >= PATHS && kinds.iter().all(|kind| taken.contains(kind)) {
            break;
        }
        let seed = first.wrapping_add(n);
        let mut rng = StdRng::seed_from_u64(seed);
        let harness = Harness { model: Protocol::new(2, 2), declines: rng.random_bool(0.25), completer: true };
        let mut path = Path::start(harness, seed, rng, &gateway, &[]).await;
        for _ in 0..MOST_STEPS {
            let Some(step) = path.plan_step() else { break };
            taken.extend(path.take(&step).await);
        }
    }
    for expected in kinds {
        assert!(taken.contains(expected), "no path took \"{expected}\" ({SEED_VARIABLE}={first}): took {taken:?}");
    }
}

#[tokio::test]
async fn with_the_look_up_before_re_charging_switched_off_the_walk_charges_twice() {
    // The model with the look-up broken, and the service with it switched off: the shortest path
    // the harness can take to two charges for one payment, walked on the real service, which must
    // charge twice exactly where the model says. The attempts' `serve` processes have the switch;
    // the completer runs in this process, which has not, so the path takes none of its steps.
    let harness =
        Harness { model: Protocol::new(2, 2).with(Mutant::NoLookUpBeforeCharging), declines: false, completer: false };
    let steps = harness.shortest_steps_to(|state| state.charges.len() == 2).expect("a path to a double charge");
    let gateway = Process::gateway().await;
    let seed = run_seed();
    let switched_off = [test_switches::LOOK_UP_BEFORE_CHARGING];
    let mut path = Path::start(harness, seed, StdRng::seed_from_u64(seed), &gateway, &switched_off).await;
    for step in &steps {
        path.take(step).await;
    }
    let made = path.observed().await.made;
    assert_eq!(made, (2, 0), "the gateway charged twice for one payment:\n{}", path.explain());
}

/// The kind of an action, for the tally of what the paths took; a claim's by what it led to.
fn kind(action: &Action, after: &State) -> &'static str {
    match action {
        Action::Claim(d) => match (after.drivers[*d].pc, after.answers.last()) {
            (Pc::Claimed, _) if !after.drivers[*d].resumed => "a new key claimed",
            (Pc::Claimed | Pc::Recorded, _) => "a key taken up again",
            (_, Some(Answer::InFlight)) => "a retry turned away",
            (_, Some(Answer::Payment(_))) => "a stored answer replayed",
            _ => "a claim answered otherwise",
        },
        Action::TakeOver => "the completer's take-over",
        Action::Start(_) => "started",
        Action::LookUp(_) => "a look-up",
        Action::Charge(_, Gateway::Answers) => "charged",
        Action::Charge(_, Gateway::Declines) => "declined",
        Action::Charge(_, Gateway::FailsBefore) => "fails before charging",
        Action::Charge(_, Gateway::FailsAfter) => "charges, then fails",
        Action::Record(_) => "charge_created",
        Action::Finish(_) => "finished",
        Action::Release(_) => "released",
        Action::Crash(_) => "a crash",
        Action::LeaseLapses => "a lease lapses",
        Action::Forget => "the gateway forgets",
        _ => "a step no path here takes",
    }
}

/// Which of the model's steps a walk may take on the real system.
struct Harness {
    /// The model, with the service's rules (or, to walk to what a broken one does, a broken
    /// variant's, the service's matching rule switched off).
    model: Protocol,
    /// The card is declined on this path (the gateway decides by the source).
    declines: bool,
    /// The completer's take-over may be taken (it runs in this process).
    completer: bool,
}

impl Harness {
    /// The actions the model offers in `state` that this harness can take (of driver `only`, and
    /// no process fault, when it is mid-step).
    fn offered(&self, state: &State, only: Option<usize>) -> Vec<Action> {
        let mut actions = Vec::new();
        self.model.actions(state, &mut actions);
        actions.retain(|action| match action {
            Action::Charge(_, Gateway::Declines) => self.declines,
            Action::Charge(_, Gateway::Answers | Gateway::FailsAfter) => !self.declines,
            Action::Pause(_) | Action::PauseInCall(_) | Action::Wake(_) | Action::Reap => false,
            Action::TakeOver => self.completer,
            Action::Crash(_) => only.is_none(),
            _ => true,
        });
        if only.is_some() {
            actions.retain(|action| self.driver_of(*action) == only);
        }
        actions
    }

    fn driver_of(&self, action: Action) -> Option<usize> {
        match action {
            Action::Claim(d)
            | Action::Start(d)
            | Action::LookUp(d)
            | Action::Charge(d, _)
            | Action::Record(d)
            | Action::Finish(d)
            | Action::Release(d)
            | Action::Crash(d)
            | Action::Pause(d)
            | Action::Wake(d) => Some(d),
            Action::TakeOver => Some(usize::from(self.model.attempts)),
            _ => None,
        }
    }

    /// Whether driver `d` is between two points where it could stop: the completer is until it
    /// ends; an attempt is in the claim before `started`, between a look-up and its charge
    /// request, and between an unknown outcome and its release.
    fn mid_step(&self, state: &State, d: usize) -> bool {
        let pc = state.drivers[d].pc;
        if d == usize::from(self.model.attempts) {
            return !matches!(pc, Pc::Idle | Pc::Done | Pc::Dead);
        }
        matches!(pc, Pc::Claimed | Pc::ToCharge | Pc::Unknown)
    }

    /// A step drawn at random from `state`: a fault, or one driver's actions from a point where a
    /// real process can stop to the next such point (the completer's whole run, which stops
    /// nowhere). `None`: nothing left to take.
    fn random_step(&self, state: &State, rng: &mut StdRng) -> Option<Vec<Action>> {
        let first = *self.offered(state, None).choose(rng)?;
        let mut step = vec![first];
        let mut state = self.model.next_state(state, first).expect("an action the model offers");
        if let Some(d) = self.driver_of(first) {
            while self.mid_step(&state, d) {
                let next = *self.offered(&state, Some(d)).choose(rng).expect("a driver mid-step goes on");
                state = self.model.next_state(&state, next).expect("an action the model offers");
                step.push(next);
            }
        }
        Some(step)
    }

    /// Every step the harness can take from `state`, with the state it leads to.
    fn steps_from(&self, state: &State) -> Vec<(Vec<Action>, State)> {
        let mut steps = Vec::new();
        for first in self.offered(state, None) {
            let next = self.model.next_state(state, first).expect("an action the model offers");
            self.go_on(vec![first], next, self.driver_of(first), &mut steps);
        }
        steps
    }

    fn go_on(&self, step: Vec<Action>, state: State, driver: Option<usize>, steps: &mut Vec<(Vec<Action>, State)>) {
        match driver {
            Some(d) if self.mid_step(&state, d) => {
                for action in self.offered(&state, Some(d)) {
                    let next = self.model.next_state(&state, action).expect("an action the model offers");
                    let mut longer = step.clone();
                    longer.push(action);
                    self.go_on(longer, next, driver, steps);
                }
            }
            _ => steps.push((step, state)),
        }
    }

    /// The fewest steps the harness can take from the model's start to a state that is `goal`.
    fn shortest_steps_to(&self, goal: impl Fn(&State) -> bool) -> Option<Vec<Vec<Action>>> {
        let start = self.model.init_states().remove(0);
        let mut seen = HashSet::from([start.clone()]);
        let mut queue = VecDeque::from([(start, Vec::new())]);
        while let Some((state, steps)) = queue.pop_front() {
            for (step, next) in self.steps_from(&state) {
                if !seen.insert(next.clone()) {
                    continue;
                }
                let mut steps: Vec<Vec<Action>> = steps.clone();
                steps.push(step);
                if goal(&next) {
                    return Some(steps);
                }
                queue.push_back((next, steps));
            }
        }
        None
    }
}

/// One path: the model's state and the real system taking the same steps.
struct Path<'g> {
    seed: u64,
    harness: Harness,
    state: State,
    rng: StdRng,
    app: TestApp,
    gateway: &'g Process,
    control: GatewayControl,
    /// The gateway's counters when the path began: what it made meanwhile is the path's.
    gateway_before: GatewayStats,
    /// The protocol's rules switched off in the attempts' processes.
    switched_off: Vec<&'static str>,
    key: String,
    body: Value,
    /// The client's attempts, by the model's driver.
    attempts: Vec<Option<Attempt>>,
    /// What the client was told, in order (`None`: no answer, the process died).
    replies: Vec<Option<(StatusCode, Value)>>,
    taken: Vec<Action>,
    /// The real lock tokens, by the model's: which driver holds the key.
    tokens: Vec<(u8, uuid::Uuid)>,
}

/// A client's attempt: its own `serve` process, and the request it sent.
struct Attempt {
    process: Process,
    reply: Option<JoinHandle<Option<(StatusCode, Value)>>>,
    /// The points it stopped at, in order.
    stops: usize,
    killed: bool,
}

/// The lock on the key, as the database holds it: by whom (the model's token), and whether its
/// lease is still live.
#[derive(Debug, PartialEq)]
enum Lock {
    Free,
    Live(u8),
    Over(u8),
}

/// Where an attempt stands.
#[derive(Debug, PartialEq)]
enum Where {
    NotSent,
    StoppedAt(&'static str),
    Answered,
    Killed,
}

/// A payment's outcome, as recorded or as told: a charge by its place in the gateway's list (a
/// decline names none).
#[derive(Debug, PartialEq)]
enum Outcome {
    Pending,
    Succeeded(u8),
    Declined,
}

/// What the client was told (or a key row stores): a payment with its status code (`201`, or
/// `402` for a decline), or another answer.
#[derive(Debug, PartialEq)]
enum Told {
    Payment(u16, Outcome),
    InFlight,
    Unknown,
    Nothing,
    Expired,
}

/// What the model and the real system are compared on.
#[derive(Debug, PartialEq)]
struct Observed {
    /// The key's row: its recovery point, its lock, and the answer it stores.
    key: Option<(Point, Lock, Option<Told>)>,
    payment: Option<Outcome>,
    /// The charges the gateway holds under the key's downstream key: succeeded, or declined.
    charges: Vec<bool>,
    /// The charges the gateway made during the path, under any key at all: succeeded, declined.
    made: (u64, u64),
    attempts: Vec<Where>,
    answers: Vec<Told>,
}

/// The points a payment's request stops at, from the service's log lines.
const STOPS: [&str; 3] = ["after_charge_created", "after_charge", "after_started"];

impl<'g> Path<'g> {
    /// A path on a database of its own, whose attempts (at most two) charge at `gateway`, with the
    /// protocol's rules `switched_off` in their processes.
    async fn start(
        harness: Harness,
        seed: u64,
        rng: StdRng,
        gateway: &'g Process,
        switched_off: &[&'static str],
    ) -> Path<'g> {
        let state = harness.model.init_states().remove(0);
        let app = TestApp::builder()
            .gateway_url(&gateway.url)
            .lock_timeout(Duration::from_secs(60))
            .gateway_timeout(GATEWAY_TIMEOUT)
            .workers(|w| w.completer_backoff = Duration::ZERO)
            .spawn()
            .await;
        let mut body = payment_body();
        if harness.declines {
            body["source"] = "tok_chargeDeclined".into();
        }
        let attempts = (0..harness.model.attempts).map(|_| None).collect();
        let control = GatewayControl::new(&gateway.url);
        control.clear_faults().await;
        let gateway_before = control.stats().await;
        Path {
            seed,
            harness,
            state,
            rng,
            app,
            gateway,
            control,
            gateway_before,
            switched_off: switched_off.to_vec(),
            key: new_key(),
            body,
            attempts,
            replies: Vec::new(),
            taken: Vec::new(),
            tokens: Vec::new(),
        }
    }

    /// The model's next step, drawn at random from those the real system can take.
    fn plan_step(&mut self) -> Option<Vec<Action>> {
        self.harness.random_step(&self.state, &mut self.rng)
    }

    /// Takes `step` on the real system and in the model, compares the two, and returns the
    /// kinds of actions it took.
    async fn take(&mut self, step: &[Action]) -> Vec<&'static str> {
        // The gateway is told how its one charge request in the step fails, if it does; the
        // step must use it up.
        let faults_before = self.control.stats().await.faults;
        let mut armed = 0;
        for action in step {
            match action {
                Action::Charge(_, Gateway::FailsBefore) => {
                    self.control.fault("error_before", 1).await;
                    armed += 1;
                }
                Action::Charge(_, Gateway::FailsAfter) => {
                    let mode = if self.rng.random_bool(0.5) { "error_after" } else { "timeout_after" };
                    self.control.fault(mode, 1).await;
                    armed += 1;
                }
                _ => {}
            }
        }
        match step[0] {
            Action::Claim(d) => self.send(d).await,
            Action::TakeOver => {
                let outcome = self.app.workers().completer.run_once().await.expect("the completer runs");
                assert_eq!(outcome, Worked::Worked, "the completer takes the key over");
            }
            Action::Crash(d) => self.kill(d).await,
            Action::LeaseLapses => {
                self.app.run_sql("UPDATE idempotency_keys SET locked_until = now() - interval '1 millisecond'").await;
            }
            Action::Forget => self.control.forget_keys().await,
            Action::Start(d)
            | Action::LookUp(d)
            | Action::Charge(d, _)
            | Action::Record(d)
            | Action::Finish(d)
            | Action::Release(d) => {
                let attempt = self.attempts[d].as_ref().expect("a running attempt");
                attempt.process.signal(Signal::SIGCONT);
                self.until_it_stops_or_answers(d).await;
            }
            other => panic!("a step this harness does not take: {other:?}"),
        }
        let mut kinds = Vec::new();
        for &action in step {
            self.state = self.harness.model.next_state(&self.state, action).expect("an action the model offers");
            self.taken.push(action);
            kinds.push(kind(&action, &self.state));
        }
        assert_eq!(self.control.stats().await.faults, faults_before + armed, "the step used the faults armed for it");
        // A claim or a take-over that took the key: its real token is the model's new one.
        if let Some(token) = self.state.key.as_ref().and_then(|key| key.token)
            && !self.tokens.iter().any(|(known, _)| *known == token)
            && let Some(real) = self.app.key_row(&self.key).await.and_then(|row| row.lock_token)
        {
            self.tokens.push((token, real));
        }
        let predicted = self.predicted();
        let observed = self.observed().await;
        assert_eq!(
            observed,
            predicted,
            "path {SEED_VARIABLE}={} (declined card: {}, rules switched off: {:?}); the service (left) and the model \
             (right) part after:\n{}",
            self.seed,
            self.harness.declines,
            self.switched_off,
            self.explain(),
        );
        kinds
    }

    /// The steps taken so far, as the model explains them.
    fn explain(&self) -> String {
        let model = &self.harness.model;
        let path = stateright::Path::from_actions(model, model.init_states().remove(0), &self.taken);
        model.explain(&path.expect("the steps taken"))
    }

    /// Attempt `d`: a process of its own sends the request, which runs to its first stop.
    async fn send(&mut self, d: usize) {
        let gateway_timeout = GATEWAY_TIMEOUT.as_millis().to_string();
        let switched_off = self.switched_off.join(",");
        let env = [
            ("PAYMENTS_FAULT_INJECTION", "1"),
            ("PAYMENTS_GATEWAY_TIMEOUT_MS", &gateway_timeout),
            ("PAYMENTS_LOCK_TIMEOUT_MS", "60000"),
            (test_switches::VARIABLE, &switched_off),
        ];
        let process = Process::serve(&self.app.database.url, &self.gateway.url, &["--no-workers"], &env).await;
        let request = self.app.http.post(format!("{}/v1/payments", process.url)).bearer_auth(&self.app.api_key);
        let request = request.header("Idempotency-Key", &self.key).header("X-Fault-Inject", "pause=every");
        let request = request.json(&self.body);
        let reply = tokio::spawn(async move {
            let response = request.send().await.ok()?;
            let status = response.status();
            Some((status, response.json().await.ok()?))
        });
        self.attempts[d] = Some(Attempt { process, reply: Some(reply), stops: 0, killed: false });
        self.until_it_stops_or_answers(d).await;
    }

    /// Waits until attempt `d` stops at its next point, or answers.
    async fn until_it_stops_or_answers(&mut self, d: usize) {
        let watched = self.attempts[d].as_ref().expect("a running attempt");
        let stopped_before = watched.stops;
        let what = format!("attempt {d} stops again or answers");
        let answered = wait_for(Duration::from_secs(30), &what, || async move {
            let reply = watched.reply.as_ref().expect("not answered yet");
            if reply.is_finished() {
                return Some(true);
            }
            (stops(&watched.process) > stopped_before && watched.process.is_stopped()).then_some(false)
        })
        .await;
        let attempt = self.attempts[d].as_mut().expect("a running attempt");
        if answered {
            let reply = attempt.reply.take().expect("not answered yet").await.expect("the request's task");
            self.replies.push(reply);
        } else {
            attempt.stops = stops(&attempt.process);
        }
    }

    /// Kills attempt `d`'s process where it stopped: the client gets no answer.
    async fn kill(&mut self, d: usize) {
        let attempt = self.attempts[d].as_mut().expect("a running attempt");
        attempt.process.signal(Signal::SIGKILL);
        attempt.killed = true;
        let reply = attempt.reply.take().expect("not answered yet").await.expect("the request's task");
        assert!(reply.is_none(), "a killed process answered: {reply:?}");
        self.replies.push(reply);
    }

    /// What the model says the database, the gateway and the client show now.
    fn predicted(&self) -> Observed {
        let state = &self.state;
        let lock = |token: Option<u8>, over| match (token, over) {
            (None, _) => Lock::Free,
            (Some(token), false) => Lock::Live(token),
            (Some(token), true) => Lock::Over(token),
        };
        let attempts = state.drivers[..usize::from(self.harness.model.attempts)].iter().map(|driver| match driver.pc {
            Pc::Idle => Where::NotSent,
            Pc::Started => Where::StoppedAt("after_started"),
            Pc::Answered(_) => Where::StoppedAt("after_charge"),
            Pc::Recorded => Where::StoppedAt("after_charge_created"),
            Pc::Done => Where::Answered,
            Pc::Dead => Where::Killed,
            pc => panic!("an attempt left mid-step, at {pc:?}"),
        });
        let payment = |charge: u8| match state.charges[usize::from(charge)].succeeded {
            true => Told::Payment(201, Outcome::Succeeded(charge)),
            false => Told::Payment(402, Outcome::Declined),
        };
        let outcome = |charge: u8| match payment(charge) {
            Told::Payment(_, outcome) => outcome,
            _ => unreachable!(),
        };
        let succeeded = state.charges.iter().filter(|charge| charge.succeeded).count() as u64;
        let answers = state.answers.iter().map(|answer| match *answer {
            Answer::Payment(charge) => payment(charge),
            Answer::InFlight => Told::InFlight,
            Answer::Unknown => Told::Unknown,
            Answer::Nothing => Told::Nothing,
            Answer::Expired => Told::Expired,
        });
        Observed {
            key: state.key.as_ref().map(|key| (key.point, lock(key.token, key.lease_over), key.answer.map(payment))),
            payment: state.payment.as_ref().map(|payment| payment.charge.map_or(Outcome::Pending, outcome)),
            charges: state.charges.iter().map(|charge| charge.succeeded).collect(),
            made: (succeeded, state.charges.len() as u64 - succeeded),
            attempts: attempts.collect(),
            answers: answers.collect(),
        }
    }

    /// What the database, the gateway and the client show.
    async fn observed(&self) -> Observed {
        let now = self.control.stats().await;
        let row = self.app.key_row(&self.key).await;
        let charges = match &row {
            Some(row) => self.control.charges_for(&self.app.downstream_key(row.id)).await,
            None => Vec::new(),
        };
        let outcome = |payment: &Value| match payment["status"].as_str() {
            Some("pending") => Outcome::Pending,
            Some("failed") => Outcome::Declined,
            Some("succeeded") => {
                let charge_id = payment["gateway_charge_id"].as_str().expect("a succeeded payment's charge");
                let place = charges.iter().position(|charge| charge["id"] == charge_id);
                Outcome::Succeeded(place.expect("the payment's charge is under its key's downstream key") as u8)
            }
            _ => panic!("a payment the model has no name for: {payment}"),
        };
        let told = |status: u16, body: &Value| match status {
            201 => Told::Payment(201, outcome(body)),
            402 => Told::Payment(402, outcome(&body["payment"])),
            409 => Told::InFlight,
            503 => Told::Unknown,
            410 => Told::Expired,
            _ => panic!("an answer the model has no name for: {status} {body}"),
        };
        let key = row.map(|row| {
            let point = match row.recovery_point.as_str() {
                "started" => Point::Started,
                "charge_created" => Point::ChargeCreated,
                "finished" => Point::Finished,
                point => panic!("a payment's key at {point}"),
            };
            let holder = |real: uuid::Uuid| {
                let known = self.tokens.iter().find(|(_, token)| *token == real);
                known.map(|(token, _)| *token).unwrap_or_else(|| panic!("a lock token no claim took: {real}"))
            };
            let lock = match (row.lock_token, row.locked_until) {
                (None, _) => Lock::Free,
                (Some(token), Some(until)) if until > Utc::now() => Lock::Live(holder(token)),
                (Some(token), _) => Lock::Over(holder(token)),
            };
            let stored = row.response_status.zip(row.response_body.as_ref()).map(|(status, body)| {
                let body: Value = serde_json::from_slice(body).expect("a stored JSON answer");
                told(status as u16, &body)
            });
            (point, lock, stored)
        });
        let payment: Option<(String, Option<String>)> = payments::table
            .filter(payments::account_id.eq(self.app.account_id))
            .filter(payments::idempotency_key.eq(&self.key))
            .select((payments::status, payments::gateway_charge_id))
            .get_result(&mut self.app.db().await)
            .await
            .optional()
            .unwrap();
        let payment = payment.map(|(status, charge_id)| json!({ "status": status, "gateway_charge_id": charge_id }));
        let answers = self.replies.iter().map(|reply| match reply {
            None => Told::Nothing,
            Some((status, body)) => told(status.as_u16(), body),
        });
        let attempts = self.attempts.iter().map(|attempt| match attempt {
            None => Where::NotSent,
            Some(attempt) if attempt.killed => Where::Killed,
            Some(attempt) if attempt.reply.is_none() => Where::Answered,
            Some(attempt) => Where::StoppedAt(last_stop(&attempt.process)),
        });
        Observed {
            key,
            payment: payment.as_ref().map(outcome),
            charges: charges.iter().map(|charge| charge["status"] == "succeeded").collect(),
            made: (now.charges - self.gateway_before.charges, now.declined - self.gateway_before.declined),
            attempts: attempts.collect(),
            answers: answers.collect(),
        }
    }
}

/// How many times the process stopped itself, by its log.
fn stops(process: &Process) -> usize {
    process.stderr.borrow().iter().filter(|line| line.contains("fault injection: stopping the process")).count()
}

/// The point the process last stopped at, by its log.
fn last_stop(process: &Process) -> &'static str {
    let lines = process.stderr.borrow();
    let line = lines.iter().rev().find(|line| line.contains("fault injection: stopping the process"));
    let line = line.expect("the process stopped");
    STOPS.into_iter().find(|point| line.contains(point)).expect("a payment's point")
}

/// The claim's rule lives in SQL (`idempotency/claim.rs`): in every situation the protocol names,
/// the statement decides as `payments_protocol::claim` says, which is what the model checks.
#[tokio::test]
async fn the_claims_statement_decides_as_the_protocols_rule_says() {
    let app = TestApp::spawn().await;
    let mut situations =
        vec![Found::Nothing, Found::Expired { same_endpoint: true }, Found::Expired { same_endpoint: false }];
    for same_request in [true, false] {
        for finished in [true, false] {
            for lease in [Lease::Free, Lease::Live, Lease::Over] {
                situations.push(Found::Row { same_request, finished, lease });
            }
        }
    }
    for found in situations {
        // A finished key is never held: the database refuses such a row, so no claim finds one.
        if let Found::Row { finished: true, lease: Lease::Live | Lease::Over, .. } = found {
            let key_id = app.seed_key(&new_key(), &payment_body(), "started", KeyLock::Live).await;
            let finished = diesel::sql_query(finish(key_id)).execute(&mut app.db().await).await;
            assert!(finished.is_err(), "a held key was let finish");
            continue;
        }
        // An expired key is one past its recorded expiry, or one already reaped.
        let ways = if matches!(found, Found::Expired { .. }) { &[false, true][..] } else { &[false] };
        for &reaped in ways {
            let decided = claim_where(&app, found, reaped).await;
            assert_eq!(decided, payments_protocol::claim(found), "{found:?} (reaped: {reaped})");
        }
    }
}

/// What the claim's statement decides for a request that finds `found` under its key.
async fn claim_where(app: &TestApp, found: Found, reaped: bool) -> Claim {
    let request = app.key_request();
    let key = request.key.as_str();
    let mut new = request.new_key();
    match found {
        Found::Nothing => {}
        Found::Expired { same_endpoint } => {
            let key_id = app.seed_key(key, &payment_body(), "started", KeyLock::Free).await;
            app.run_sql(&finish(key_id)).await;
            app.seed_payment(key_id, key, "succeeded", Some("ch_made_before")).await;
            let expire = match reaped {
                true => format!("DELETE FROM idempotency_keys WHERE id = '{key_id}'"),
                false => format!(
                    "UPDATE idempotency_keys SET finished_at = now() - interval '2 seconds', \
                     expires_at = now() - interval '1 second' WHERE id = '{key_id}'"
                ),
            };
            app.run_sql(&expire).await;
            if !same_endpoint {
                new.endpoint = &payments_service::refunds::ENDPOINT;
            }
        }
        Found::Row { same_request, finished, lease } => {
            let mut body = payment_body();
            if !same_request {
                body["amount"] = 999.into();
            }
            let lock = match lease {
                Lease::Free => KeyLock::Free,
                Lease::Live => KeyLock::Live,
                Lease::Over => KeyLock::Expired,
            };
            let key_id = app.seed_key(key, &body, "started", lock).await;
            if finished {
                app.run_sql(&finish(key_id)).await;
            }
        }
    }
    let lease = Duration::from_secs(60);
    match claim::<TestWrites, KeyRowId>(&mut app.db().await, app.routing(), &new, lease, None, None)
        .await
        .expect("the claim")
    {
        Claimed::Mismatch => Claim::Mismatch,
        Claimed::Replay { .. } => Claim::Replay,
        Claimed::InFlight => Claim::InFlight,
        Claimed::Expired { .. } => Claim::Expired,
        Claimed::Acquired { lock, .. } if !lock.resumed() => Claim::New,
        Claimed::Acquired { lock, .. } => {
            let taken_over = format!(
                "(SELECT action = 'idempotency_key.taken_over' FROM audit_records WHERE resource_id = '{}' \
                 ORDER BY id DESC LIMIT 1)",
                lock.key_id
            );
            Claim::Resume { taken_over: app.database_says(&taken_over).await }
        }
        Claimed::Answered { .. } => unreachable!("a claim given no answer finishes no key"),
    }
}

/// The statement that finishes a key row, with an answer to replay.
fn finish(key_id: uuid::Uuid) -> String {
    format!(
        "UPDATE idempotency_keys SET recovery_point = 'finished', finished_at = now(), response_status = 201, \
         response_body = convert_to('{{}}', 'UTF8') WHERE id = '{key_id}'"
    )
}

/// The refund's rule lives in SQL (`refunds/writes.rs`): for payments succeeded or not, with
/// money refunded, reserved by pending refunds or neither, and a refund that asks for less than
/// is left, all of it, more, or says nothing, the statement decides as
/// `payments_protocol::refund_fits` says, which is what the model checks.
#[tokio::test]
async fn the_refunds_statement_decides_as_the_protocols_rule_says() {
    let app = TestApp::spawn().await;
    for succeeded in [true, false] {
        for (refunded, reserved) in [(0, 0), (600, 0), (0, 600), (400, 600)] {
            for asked in [None, Some(300), Some(400), Some(500)] {
                let payment = app.paid(1000, "tok_visa").await;
                let id = payment["id"].as_str().unwrap();
                let outcome = match succeeded {
                    true => "status = 'succeeded'",
                    false => "status = 'failed', failure_code = 'card_declined'",
                };
                app.run_sql(&format!(
                    "UPDATE payments SET {outcome}, amount_refunded = {refunded}, amount_refund_pending = {reserved} \
                     WHERE id = '{id}'"
                ))
                .await;
                let mut body = json!({ "payment": id });
                if let Some(asked) = asked {
                    body["amount"] = asked.into();
                }
                let answer = app.post_refund(&new_key(), &body).await;
                let status = answer.status();
                let answer: Value = answer.json().await.unwrap();
                let decided = match status {
                    StatusCode::CREATED | StatusCode::ACCEPTED => Ok(answer["amount"].as_i64().expect("an amount")),
                    _ => Err(match answer["type"].as_str().and_then(|t| t.rsplit('/').next()) {
                        Some("payment-not-refundable") => Refusal::PaymentNotRefundable,
                        Some("payment-already-refunded") => Refusal::PaymentAlreadyRefunded,
                        Some("refund-exceeds-payment") => Refusal::RefundExceedsPayment,
                        _ => panic!("an answer the rule has no name for: {status} {answer}"),
                    }),
                };
                let expected = payments_protocol::refund_fits(succeeded, 1000 - refunded - reserved, asked);
                let paid = if succeeded { "a succeeded" } else { "a failed" };
                assert_eq!(
                    decided, expected,
                    "{paid} payment, {refunded} refunded, {reserved} reserved, {asked:?} asked"
                );
            }
        }
    }
}

/// The fence's rule lives in SQL (every phase's statement moves the key row only `WHERE ..
/// lock_token = {key.token}`, `idempotency/phase.rs`; the release is fenced the same way): for a
/// row that carries the driver's token, another driver's or none (let go, or finished), with the
/// lease live or over, each transition of a phase, and the release, commit exactly when
/// `payments_protocol::commits` says, which is what the model checks.
#[tokio::test]
async fn the_fence_decides_as_the_protocols_rule_says() {
    // The model's tokens: the driver's is 1, another driver's 2.
    let situations = [
        ("the driver's token, its lease live", Some(1), "started", false),
        ("the driver's token, its lease over", Some(1), "started", true),
        ("another's token, its lease live", Some(2), "started", false),
        ("another's token, its lease over", Some(2), "started", true),
        ("no token: let go", None, "started", false),
        ("no token: finished", None, "finished", false),
    ];
    let app = TestApp::spawn().await;
    let mut conn = app.db().await;
    for (situation, row_token, point, lease_over) in situations {
        for step in ["stay", "advance", "finish", "release"] {
            let request = app.key_request();
            let mut lock = request.claim(&app).await;
            let id = lock.key_id;
            let until = if lease_over { "now() - interval '1 second'" } else { "now() + interval '1 minute'" };
            let row = match row_token {
                Some(1) => format!("locked_until = {until}"),
                Some(_) => format!("lock_token = gen_random_uuid(), locked_until = {until}"),
                None => "lock_token = NULL, locked_until = NULL".to_owned(),
            };
            app.run_sql(&format!("UPDATE idempotency_keys SET {row} WHERE id = '{id}'")).await;
            if point == "finished" {
                app.run_sql(&finish(id)).await;
            }
            let before = app.key_row(request.key.as_str()).await.expect("the key row");
            let transition = match step {
                "stay" => Some(Transition::Stay),
                "advance" => Some(Transition::Advance(payments_service::payments::CHARGE_CREATED)),
                "finish" => Some(Transition::Finish {
                    response: StoredResponse { status: 201, body: b"{}".to_vec() },
                    retention: Duration::from_secs(60),
                    made: None,
                }),
                _ => None,
            };
            let committed = match transition {
                Some(transition) => {
                    let phase = atomic_phase::<TestWrites, KeyRowId>(
                        &mut conn,
                        app.routing(),
                        &mut lock,
                        transition,
                        audited_phase("", ""),
                    );
                    match phase.await {
                        Ok(_) => true,
                        Err(PhaseError::LockLost) => false,
                        Err(error) => panic!("{situation}: the phase failed otherwise: {error}"),
                    }
                }
                None => {
                    let reason = Reason { code: "internal", detail: "the fence's table" };
                    lock.release(&mut conn, Actor::Api, reason, &request.request_id).await.expect("the release");
                    let after = app.key_row(request.key.as_str()).await.expect("the key row");
                    before.lock_token.is_some() && after.lock_token.is_none()
                }
            };
            let after = app.key_row(request.key.as_str()).await.expect("the key row");
            if !committed {
                assert_eq!(
                    (after.recovery_point.as_str(), after.lock_token, after.locked_until),
                    (before.recovery_point.as_str(), before.lock_token, before.locked_until),
                    "{situation}, {step}: a phase fenced out leaves the row as it was"
                );
            }
            let rule = payments_protocol::commits(row_token, 1);
            assert_eq!(committed, rule, "{situation}, {step}: the statement and the rule part");
        }
    }
}

/// The rule of a change of an authorization lives in SQL (`authorizations/writes.rs`: its `started`
/// inserts the change only on a payment still `requires_capture`, and the unique index on the
/// payment's changes that are not `failed` lets one stand): for an authorization open, captured
/// or cancelled, with no other change, one pending, one that succeeded or one that failed, a
/// capture and a cancel stand (and reach the gateway) exactly when
/// `payments_protocol::change_stands` says, which is what the authorization's model checks.
#[tokio::test]
async fn a_changes_statement_decides_as_the_protocols_rule_says() {
    let app = TestApp::spawn().await;
    let ends = [
        ("open", None),
        ("captured", Some("status = 'succeeded', amount_captured = amount")),
        ("cancelled", Some("status = 'canceled', canceled_at = now()")),
    ];
    for (end, ended) in ends {
        for other in [None, Some("pending"), Some("succeeded"), Some("failed")] {
            for kind in ["capture", "cancel"] {
                let authorization =
                    json!({ "amount": 5000, "currency": "usd", "source": "tok_visa", "capture": false });
                let authorized = app.post_payment(&new_key(), &authorization).await;
                assert_eq!(authorized.status(), StatusCode::CREATED);
                let id = authorized.json::<Value>().await.unwrap()["id"].as_str().unwrap().to_owned();
                if let Some(ended) = ended {
                    app.run_sql(&format!("UPDATE payments SET {ended} WHERE id = '{id}'")).await;
                }
                if let Some(status) = other {
                    let failure = if status == "failed" { "'charge_already_captured'" } else { "NULL" };
                    app.run_sql(&format!(
                        "INSERT INTO payment_changes (id, account_id, payment_id, idempotency_key_id, idempotency_key,
                                                      kind, cancellation_reason, status, gateway, failure_code)
                         SELECT gen_random_uuid(), account_id, id, gen_random_uuid(), '{}', 'cancel',
                                'requested_by_customer', '{status}', gateway, {failure}
                         FROM payments WHERE id = '{id}'",
                        new_key()
                    ))
                    .await;
                }
                let requests_before = change_requests(&app).await;
                let url = format!("{}/v1/payments/{id}/{kind}", app.address);
                let request = app.http.post(url).bearer_auth(&app.api_key).header("Idempotency-Key", new_key());
                let answer = request.json(&json!({})).send().await.expect("answered");
                let status = answer.status();
                let problem: Value = answer.json().await.unwrap();
                let stood = match (status, problem["type"].as_str().and_then(|t| t.rsplit('/').next())) {
                    (StatusCode::OK, _) => true,
                    (StatusCode::BAD_REQUEST, Some("payment-not-capturable" | "payment-not-cancelable")) => false,
                    _ => panic!("an answer the rule has no name for: {status} {problem}"),
                };
                let asked = change_requests(&app).await - requests_before;
                let situation = format!("a {kind} of an authorization {end}, another change {other:?}");
                assert_eq!(asked, u64::from(stood), "{situation}: only a change that stands reaches the gateway");
                let another_stands = matches!(other, Some("pending" | "succeeded"));
                let rule = payments_protocol::change_stands(ended.is_none(), another_stands);
                assert_eq!(stood, rule, "{situation}: the statement and the rule part");
            }
        }
    }
}

/// The captures and cancels the gateway was asked for.
async fn change_requests(app: &TestApp) -> u64 {
    let stats = app.gateway.all_stats().await;
    let count = |name: &str| stats[name].as_u64().unwrap_or_else(|| panic!("{name} in {stats}"));
    count("capture_requests") + count("cancel_requests")
}
