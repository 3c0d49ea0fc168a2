//! One module per subcommand; `main` only dispatches.

pub mod accounts;
pub mod attention;
pub mod gateway;
pub mod migrate;
pub mod serve;
pub mod worker;

use std::future::Future;

use crate::config::DatabaseArgs;
use crate::db::embedded::{EmbeddedDatabase, Sharing};

/// Installs the SIGINT and SIGTERM handlers at once (call it before announcing readiness, so that
/// a signal sent right after is not met by the default action, which kills the process), and
/// returns a future that resolves, naming the signal, when one arrives.
pub fn shutdown_signal() -> std::io::Result<impl Future<Output = &'static str>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = interrupt.recv() => "SIGINT",
            _ = terminate.recv() => "SIGTERM",
        }
    })
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
