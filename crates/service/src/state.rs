//! What every handler and worker of a process shares.

use std::sync::Arc;

use crate::accounts::ApiKeyCache;
use crate::config::Settings;
use crate::db::Pool;
use crate::db::delegate::Routing;
use crate::db::wake::Waker;
use crate::gateway::GatewayClient;
use crate::idempotency::{self, ReplayCache};
use crate::metrics::Metrics;

/// How much memory a process gives finished answers kept for replays: at about 600 bytes a
/// payment, the seven thousand or so most recent, which is where retries land (within seconds or
/// minutes), and the process stays within a few tens of megabytes.
const REPLAY_CACHE_BYTES: u64 = 4 * 1024 * 1024;

/// What every handler and worker shares. Processes hold no other state that matters: everything
/// they coordinate on is in PostgreSQL, so any number of them can serve the same database. The
/// caches only ever hold what cannot change underneath them (see each).
pub struct AppState {
    pub db: Pool,
    /// How the statements under a key reach their rows: see [`Routing`].
    pub routing: Routing,
    pub gateway: GatewayClient,
    pub settings: Settings,
    pub replays: ReplayCache,
    pub api_keys: ApiKeyCache,
    /// What this process counts, served at `GET /metrics`.
    pub metrics: Arc<Metrics>,
    /// Wakes the workers, in every process, after a write that gave them work.
    pub wake: Arc<Waker>,
}

impl AppState {
    pub fn new(db: Pool, routing: Routing, gateway: GatewayClient, settings: Settings) -> AppState {
        let metrics = Arc::new(Metrics::new());
        AppState {
            wake: Waker::new(db.clone()),
            db,
            routing,
            gateway: gateway.observed_by(metrics.clone()),
            settings,
            replays: ReplayCache::new(REPLAY_CACHE_BYTES),
            api_keys: ApiKeyCache::new(),
            metrics,
        }
    }
}

impl AppState {
    /// What the idempotency driver needs of this process.
    pub fn keys(&self) -> idempotency::Context<'_> {
        idempotency::Context {
            db: &self.db,
            routing: &self.routing,
            metrics: &self.metrics,
            replays: &self.replays,
            lock_timeout: self.settings.lock_timeout,
            key_retention: self.settings.key_retention,
        }
    }
}
