//! Waking the workers when a write gives them work, in whichever process they run: PostgreSQL's
//! `NOTIFY`, which reaches every process that `LISTEN`s on the database, after the write commits.
//!
//! The workers' timers stay the backstop (a process that dies between its commit and its wake-up,
//! a listener reconnecting); a wake-up only makes the work start within moments of the write
//! instead of at the next tick, whatever the interval.
//!
//! A wake-up is sent after the commit, not in the same transaction, and many are sent as one:
//! PostgreSQL serialises the commits of every transaction that notifies (it holds a lock from the
//! notification to the end of the commit, its flush to disk included), so one `NOTIFY` in every
//! payment's `finished` would make payments commit one at a time (docs/workers.md has the
//! figures). Sent after the commit, a wake-up never comes before the row it is about is there to
//! be seen; coalesced, each process sends at most one [`MIN_GAP`] apart, however many writes ask.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use diesel_async::SimpleAsyncConnection;
use futures_util::StreamExt;
use tokio::sync::{Notify, watch};

use super::{Pool, PooledConnection};
use crate::runtime::ProcessRuntime;

/// The shortest time between two wake-ups a process sends: a burst of writes is one wake-up.
pub const MIN_GAP: Duration = Duration::from_millis(50);

/// How often the listener checks that its connection still stands: notifications on a
/// connection that died would never come, and no error says so.
const LISTENER_CHECK: Duration = Duration::from_secs(5);

/// A worker that a write can give work to at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// A key a gateway event nudged.
    Completer,
    /// An event staged for delivery.
    Outbox,
    /// A pending refund due to be looked up.
    Settler,
    /// Deliveries to merchants' endpoints made by the fan-out.
    Webhooks,
}

impl Wake {
    const ALL: [Wake; 4] = [Wake::Completer, Wake::Outbox, Wake::Settler, Wake::Webhooks];

    /// The channel its wake-ups go on.
    pub fn channel(self) -> &'static str {
        match self {
            Wake::Completer => "payments_completer",
            Wake::Outbox => "payments_outbox",
            Wake::Settler => "payments_settler",
            Wake::Webhooks => "payments_webhooks",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Sends this process's wake-ups: [`Waker::wake`] after a commit that gave a worker work.
pub struct Waker {
    db: Pool,
    runtime: ProcessRuntime,
    /// Which workers a write asked to wake since the last send.
    asked: [AtomicBool; Wake::ALL.len()],
    /// Whether a task is sending (or waiting out [`MIN_GAP`] after a send).
    sending: AtomicBool,
}

impl Waker {
    pub fn new(db: Pool) -> Arc<Waker> {
        Arc::new(Waker {
            db,
            runtime: ProcessRuntime::current(),
            asked: Default::default(),
            sending: AtomicBool::new(false),
        })
    }

    /// Wakes `worker`, in every process that runs one, soon: call it once the write that gave it
    /// work has committed. Never waits, never fails (a wake-up lost is the timer's to make up).
    pub fn wake(self: &Arc<Self>, worker: Wake) {
        self.asked[worker.index()].store(true, Ordering::SeqCst);
        if !self.sending.swap(true, Ordering::SeqCst) {
            self.runtime.spawn(self.clone().send());
        }
    }

    /// Wakes `worker` once `delay` has passed: for work that falls due later (a refund the
    /// gateway left pending, first looked up a few seconds on). Lost if the process dies
    /// meanwhile, as any wake-up may be.
    pub fn wake_after(self: &Arc<Self>, worker: Wake, delay: Duration) {
        let waker = self.clone();
        self.runtime.spawn(async move {
            tokio::time::sleep(delay).await;
            waker.wake(worker);
        });
    }

    /// Sends what was asked, then again after [`MIN_GAP`] if more was asked meanwhile.
    async fn send(self: Arc<Self>) {
        loop {
            let channels: Vec<&str> = Wake::ALL
                .into_iter()
                .filter(|worker| self.asked[worker.index()].swap(false, Ordering::SeqCst))
                .map(Wake::channel)
                .collect();
            if !channels.is_empty()
                && let Err(error) = self.notify(&channels).await
            {
                tracing::warn!(%error, "a wake-up was not sent; the workers' timers will find the work");
            }
            tokio::time::sleep(MIN_GAP).await;
            self.sending.store(false, Ordering::SeqCst);
            // Asked after the swap above and before `sending` was let go: nobody else will send it.
            let asked = self.asked.iter().any(|asked| asked.load(Ordering::SeqCst));
            if !asked || self.sending.swap(true, Ordering::SeqCst) {
                return;
            }
        }
    }

    async fn notify(&self, channels: &[&str]) -> Result<(), super::StoreError> {
        let mut conn = super::connect(&self.db).await?;
        let sql: String = channels.iter().map(|channel| format!("NOTIFY {channel};")).collect();
        super::query(conn.batch_execute(&sql)).await
    }
}

/// What the workers of a process wait on between runs: each is woken by its channel's
/// notifications.
#[derive(Default)]
pub struct Woken {
    workers: [Arc<Notify>; Wake::ALL.len()],
}

impl Woken {
    /// What wakes `worker`: a permit is kept for a wake-up that comes while it works, so that it
    /// looks again at once rather than sleeping past it.
    pub fn of(&self, worker: Wake) -> Arc<Notify> {
        self.workers[worker.index()].clone()
    }

    fn wake(&self, worker: Wake) {
        self.workers[worker.index()].notify_one();
    }

    fn wake_all(&self) {
        Wake::ALL.into_iter().for_each(|worker| self.wake(worker));
    }

    /// Listens on a connection of its own from `db` until `stop`, waking each worker its channel
    /// names. A connection that breaks is replaced, and every worker woken, since a wake-up may
    /// have been missed meanwhile.
    pub async fn listen(&self, db: &Pool, mut stop: watch::Receiver<bool>) {
        while !*stop.borrow() {
            if let Err(error) = self.listen_on(db, &mut stop).await {
                tracing::warn!(%error, "listening for wake-ups failed; listening again shortly");
                tokio::select! {
                    _ = tokio::time::sleep(LISTENER_CHECK) => {}
                    _ = stop.changed() => {}
                }
            }
            self.wake_all();
        }
    }

    /// Listens on one connection, until it fails or `stop`. The connection is never handed to
    /// anyone else: it would keep gathering notifications that nobody reads.
    async fn listen_on(&self, db: &Pool, stop: &mut watch::Receiver<bool>) -> Result<(), super::StoreError> {
        let mut conn: PooledConnection = super::connect(db).await?;
        let listened = self.listen_with(&mut conn, stop).await;
        super::discard(&mut conn);
        listened
    }

    async fn listen_with(
        &self,
        conn: &mut PooledConnection,
        stop: &mut watch::Receiver<bool>,
    ) -> Result<(), super::StoreError> {
        let sql: String = Wake::ALL.iter().map(|worker| format!("LISTEN {};", worker.channel())).collect();
        super::query(conn.batch_execute(&sql)).await?;
        while !*stop.borrow() {
            let notified = {
                let mut notifications = std::pin::pin!(conn.notifications_stream());
                tokio::select! {
                    notification = notifications.next() => notification,
                    _ = tokio::time::sleep(LISTENER_CHECK) => None,
                    _ = stop.changed() => return Ok(()),
                }
            };
            match notified {
                Some(notification) => {
                    let channel = notification?.channel;
                    Wake::ALL
                        .into_iter()
                        .filter(|worker| worker.channel() == channel)
                        .for_each(|worker| self.wake(worker));
                }
                // Quiet for a while: is the connection still there?
                None => super::query(conn.batch_execute("SELECT 1")).await?,
            }
        }
        Ok(())
    }
}
