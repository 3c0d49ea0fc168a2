//! `payments stats`: each account's requests by how their key was taken in, from the database.

use diesel_async::{AsyncConnection, AsyncPgConnection};
use payments_service::config::StatsArgs;
use payments_service::metrics::{AccountRequests, per_account};
use payments_service::postgres::embedded::Sharing;

use super::open_database;

/// The header of the table, and the width of each column after the first.
const COLUMNS: [&str; 9] = ["requests", "new", "resumed", "replayed", "409", "422", "410", "repeated", "account"];

pub async fn run(args: StatsArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.hours >= 1, "--hours is at least 1");
    let (url, embedded) = open_database(&args.database, Sharing::JoinRunning).await?;
    let accounts = per_account(&mut AsyncPgConnection::establish(&url).await?, args.hours).await?;
    if let Some(embedded) = embedded {
        embedded.stop().await?;
    }
    print!("{}", table(&accounts, args.hours));
    Ok(())
}

/// The accounts that repeat keys most first: `repeated` is the share of requests whose key the
/// account had used before (a retry, a replay, a conflict, a reused key).
fn table(accounts: &[AccountRequests], hours: i64) -> String {
    let mut out = format!("requests with an Idempotency-Key in the last {hours} h, by account\n");
    out += &COLUMNS.iter().map(|column| format!("{column:>9}")).collect::<Vec<_>>().join(" ");
    out += "\n";
    for account in accounts {
        let repeated = 100.0 * account.duplicates() as f64 / account.total().max(1) as f64;
        let counts = [
            account.total(),
            account.created,
            account.resumed,
            account.replayed,
            account.in_flight,
            account.key_reused,
            account.expired,
        ];
        let counts: Vec<String> = counts.iter().map(|count| format!("{count:>9}")).collect();
        let name = account.name.as_deref().unwrap_or("(deleted)");
        out += &format!("{} {:>8.1}% {} ({})\n", counts.join(" "), repeated, account.account_id, name);
    }
    if accounts.is_empty() {
        out += "(none)\n";
    }
    out
}
