//! What every handler and worker of a process shares.

use crate::config::Settings;
use crate::db::Pool;
use crate::gateway::GatewayClient;

/// What every handler and worker shares. Processes hold no other state that matters: everything
/// they coordinate on is in PostgreSQL, so any number of them can serve the same database.
pub struct AppState {
    pub db: Pool,
    pub gateway: GatewayClient,
    pub settings: Settings,
}
