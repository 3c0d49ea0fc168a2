//! The schema migrations, embedded in the binary so that every command and test applies the same.

use diesel_async::AsyncPgConnection;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_migrations::{EmbeddedMigrations, MigrationHarness, embed_migrations};

/// The files under `migrations/` (`build.rs` makes a new one trigger a rebuild).
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("../../migrations");

/// Applies every pending migration to the database at `database_url`.
pub async fn run_pending(database_url: &str) -> anyhow::Result<()> {
    let url = database_url.to_owned();
    // diesel's migration harness is synchronous: run it on a blocking thread, where the wrapper
    // drives the async connection itself (on any runtime flavour).
    tokio::task::spawn_blocking(move || {
        use diesel::Connection as _;
        use diesel::connection::SimpleConnection as _;
        let mut conn = AsyncConnectionWrapper::<AsyncPgConnection>::establish(&url)?;
        // A migration's transaction is bounded as the service's are: a `migrate` frozen between
        // two statements must not hold its locks for hours.
        let idle = super::IDLE_IN_TRANSACTION_TIMEOUT.as_millis();
        conn.batch_execute(&format!("SET idle_in_transaction_session_timeout = {idle}"))?;
        conn.run_pending_migrations(MIGRATIONS).map_err(|error| anyhow::anyhow!("applying migrations: {error}"))?;
        anyhow::Ok(())
    })
    .await?
}
