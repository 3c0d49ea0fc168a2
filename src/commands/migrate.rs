//! `payments migrate [--distribute]`

use payments_service::config::MigrateArgs;
use payments_service::db::{distribute, migrate};

pub async fn run(args: MigrateArgs) -> anyhow::Result<()> {
    if !args.distribute {
        migrate::run_pending(&args.database_url).await?;
        println!("migrations applied");
        return Ok(());
    }
    let distributed = distribute::migrate_and_distribute(&args.database_url).await?;
    println!("migrations applied");
    if distributed.is_empty() {
        println!("every table was distributed already");
    }
    for (table, how) in distributed {
        println!("distributed {table}: {how}");
    }
    Ok(())
}
