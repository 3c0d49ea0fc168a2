//! `payments migrate`

use payments_service::config::MigrateArgs;
use payments_service::db::migrate;

pub async fn run(args: MigrateArgs) -> anyhow::Result<()> {
    migrate::run_pending(&args.database_url).await?;
    println!("migrations applied");
    Ok(())
}
