//! `payments accounts create NAME`

use anyhow::{Context, bail};
use diesel_async::{AsyncConnection, AsyncPgConnection};
use payments_service::accounts;
use payments_service::config::CreateAccountArgs;
use payments_service::postgres::embedded::Sharing;

use super::open_database;

pub async fn create(args: CreateAccountArgs) -> anyhow::Result<()> {
    let name = args.name.trim();
    if name.is_empty() || name.chars().count() > 100 {
        bail!("the account name must be 1 to 100 characters");
    }
    let (url, embedded) = open_database(&args.database, Sharing::JoinRunning).await?;
    let mut conn = AsyncPgConnection::establish(&url).await.context("connecting to the database")?;
    let (account, api_key) = accounts::create(&mut conn, name).await?;
    drop(conn);
    if let Some(embedded) = embedded {
        embedded.stop().await?;
    }
    println!("created account {:?} ({})", account.name, account.id);
    println!("its API key, shown this once (only a hash is stored):");
    println!("{api_key}");
    Ok(())
}
