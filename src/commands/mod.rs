//! One module per subcommand; `main` only dispatches.

pub mod accounts;
pub mod attention;
pub mod gateway;
pub mod migrate;
pub mod serve;
pub mod worker;

use crate::config::DatabaseArgs;
use crate::db::embedded::{EmbeddedDatabase, Sharing};

/// Resolves when the process is asked to stop (SIGINT or SIGTERM), naming the signal.
pub async fn shutdown_signal() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let mut terminate = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
    }
}

/// The database to use: `DATABASE_URL`, or the embedded cluster (started if need be).
pub async fn open_database(
    args: &DatabaseArgs,
    sharing: Sharing,
) -> anyhow::Result<(String, Option<EmbeddedDatabase>)> {
    match &args.database_url {
        Some(url) => Ok((url.clone(), None)),
        None => {
            let embedded = EmbeddedDatabase::open(&args.data_dir, sharing).await?;
            Ok((embedded.url.clone(), Some(embedded)))
        }
    }
}
