//! The schema migrations, embedded in the binary so that every command and test applies the same.
//!
//! On a database already distributed over Citus, each migration runs as one `DO` block instead of
//! the file's text as is: Citus passes some commands on to its nodes by the text of the query they
//! came in, and a migration's file is one text of many commands, which a node refuses ("cannot
//! insert multiple commands into a prepared statement"). In a `DO` block each command is sent with
//! its own text, in the migration's one transaction as before. (A migration that runs outside a
//! transaction, `run_in_transaction = false`, is one command already, and runs as it is. A
//! migration must not have a bare `SELECT`, which a `DO` block refuses.) Several tables are changed
//! in one transaction there, so Citus must use one connection per node for all of it
//! (`multi_shard_modify_mode`, as `distribute` sets it). And a table a migration adds with a
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

/// The same migrations' names, `up.sql` texts and whether each runs in a transaction, in order,
/// for [`EachCommandAlone`].
const TEXTS: &[(&str, &str, bool)] = include!(concat!(env!("OUT_DIR"), "/migration_texts.rs"));

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
                conn.batch_execute(
                    "SET citus.enable_local_reference_table_foreign_keys = off; \
                     SET citus.multi_shard_modify_mode TO 'sequential'",
                )?;
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
        let migration = |&(name, up, in_transaction): &(&'static str, &'static str, bool)| {
            Box::new(InOneBlock { name, up, in_transaction }) as Box<dyn Migration<Pg>>
        };
        Ok(TEXTS.iter().map(migration).collect())
    }
}

/// One migration, its commands as one `DO` block (or as it is, outside a transaction).
struct InOneBlock {
    name: &'static str,
    up: &'static str,
    in_transaction: bool,
}

impl Migration<Pg> for InOneBlock {
    fn run(&self, conn: &mut dyn diesel::connection::BoxableConnection<Pg>) -> diesel::migration::Result<()> {
        match self.in_transaction {
            true => conn.batch_execute(&format!("DO $migration$ BEGIN\n{}\nEND $migration$", self.up))?,
            false => conn.batch_execute(self.up)?,
        }
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

impl MigrationMetadata for InOneBlock {
    fn run_in_transaction(&self) -> bool {
        self.in_transaction
    }
}

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
    fn each_migration_is_numbered_and_run_as_diesel_numbers_and_runs_it() {
        let described = |migrations: Vec<Box<dyn Migration<Pg>>>| -> Vec<(String, bool)> {
            let each = |m: &dyn Migration<Pg>| (m.name().version().to_string(), m.metadata().run_in_transaction());
            migrations.iter().map(|m| each(m.as_ref())).collect()
        };
        let ours = described(EachCommandAlone.migrations().unwrap());
        assert_eq!(ours, described(MigrationSource::<Pg>::migrations(&MIGRATIONS).unwrap()));
        assert!(ours.iter().any(|(_, in_transaction)| !in_transaction), "{ours:?}");
    }
}
