//! The schema migrations, embedded in the binary so that every command and test applies the same.
//!
//! On a database already distributed over Citus, each migration runs as one `DO` block instead of
//! the file's text as is: Citus passes some commands on to its nodes by the text of the query they
//! came in, and a migration's file is one text of many commands, which a node refuses ("cannot
//! insert multiple commands into a prepared statement"). In a `DO` block each command is sent with
//! its own text, in the migration's one transaction as before. And a table a migration adds with a
//! foreign key to `accounts` (a reference table there) stays a plain table, which `distribute`
//! then converts as it did the others: Citus would otherwise make it a "Citus local" table, which
//! it cannot convert again once it has an identity column.

use std::fmt;

use diesel::migration::{Migration, MigrationMetadata, MigrationName, MigrationSource, MigrationVersion};
use diesel::pg::Pg;
use diesel_async::AsyncPgConnection;
use diesel_async::async_connection_wrapper::AsyncConnectionWrapper;
use diesel_migrations::{EmbeddedMigrations, MigrationError, MigrationHarness, embed_migrations};

/// The files under `migrations/` (`build.rs` makes a new one trigger a rebuild).
pub const MIGRATIONS: EmbeddedMigrations = embed_migrations!("../../migrations");

/// The same migrations' names and `up.sql` texts, in order, for [`EachCommandAlone`].
const TEXTS: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/migration_texts.rs"));

/// Applies every pending migration to the database at `database_url`.
pub async fn run_pending(database_url: &str) -> anyhow::Result<()> {
    let url = database_url.to_owned();
    // diesel's migration harness is synchronous: run it on a blocking thread, where the wrapper
    // drives the async connection itself (on any runtime flavour).
    tokio::task::spawn_blocking(move || {
        use diesel::Connection as _;
        use diesel::RunQueryDsl as _;
        use diesel::connection::SimpleConnection as _;
        let mut conn = AsyncConnectionWrapper::<AsyncPgConnection>::establish(&url)?;
        // A migration's transaction is bounded as the service's are: a `migrate` frozen between
        // two statements must not hold its locks for hours.
        let idle = super::IDLE_IN_TRANSACTION_TIMEOUT.as_millis();
        conn.batch_execute(&format!("SET idle_in_transaction_session_timeout = {idle}"))?;
        let citus = diesel::sql_query("SELECT 1 FROM pg_extension WHERE extname = 'citus'").execute(&mut conn)? > 0;
        let distributed = citus && diesel::sql_query("SELECT 1 FROM pg_dist_partition LIMIT 1").execute(&mut conn)? > 0;
        let applied = match distributed {
            false => conn.run_pending_migrations(MIGRATIONS).map(drop),
            true => {
                conn.batch_execute("SET citus.enable_local_reference_table_foreign_keys = off")?;
                conn.run_pending_migrations(EachCommandAlone).map(drop)
            }
        };
        applied.map_err(|error| anyhow::anyhow!("applying migrations: {error}"))
    })
    .await?
}

/// The migrations as a distributed database must be given them: see the module's documentation.
struct EachCommandAlone;

impl MigrationSource<Pg> for EachCommandAlone {
    fn migrations(&self) -> diesel::migration::Result<Vec<Box<dyn Migration<Pg>>>> {
        Ok(TEXTS.iter().map(|&(name, up)| Box::new(InOneBlock { name, up }) as Box<dyn Migration<Pg>>).collect())
    }
}

/// One migration, its commands as one `DO` block.
struct InOneBlock {
    name: &'static str,
    up: &'static str,
}

impl Migration<Pg> for InOneBlock {
    fn run(&self, conn: &mut dyn diesel::connection::BoxableConnection<Pg>) -> diesel::migration::Result<()> {
        conn.batch_execute(&format!("DO $migration$ BEGIN\n{}\nEND $migration$", self.up))?;
        Ok(())
    }

    fn revert(&self, _conn: &mut dyn diesel::connection::BoxableConnection<Pg>) -> diesel::migration::Result<()> {
        Err(MigrationError::NoMigrationRevertFile.into())
    }

    fn metadata(&self) -> &dyn MigrationMetadata {
        self
    }

    fn name(&self) -> &dyn MigrationName {
        self
    }
}

impl MigrationMetadata for InOneBlock {}

impl MigrationName for InOneBlock {
    /// As diesel numbers a migration folder: its name up to the first `_`, without dashes.
    fn version(&self) -> MigrationVersion<'_> {
        MigrationVersion::from(self.name.split('_').next().unwrap_or_default().replace('-', ""))
    }
}

impl fmt::Display for InOneBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_migration_is_numbered_as_diesel_numbers_it() {
        let ours: Vec<String> = EachCommandAlone
            .migrations()
            .unwrap()
            .iter()
            .map(|migration| migration.name().version().to_string())
            .collect();
        let diesels: Vec<String> = MigrationSource::<Pg>::migrations(&MIGRATIONS)
            .unwrap()
            .iter()
            .map(|migration| migration.name().version().to_string())
            .collect();
        assert_eq!(ours, diesels);
    }
}
