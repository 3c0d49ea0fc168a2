//! `payments migrate`

use crate::config::MigrateArgs;
use crate::db::migrate;

pub async fn run(args: MigrateArgs) -> anyhow::Result<()> {
    migrate::run_pending(&args.database_url).await?;
    println!("migrations applied");
    Ok(())
}
