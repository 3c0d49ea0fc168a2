//! `payments migrate [--distribute]`

use diesel_async::{AsyncConnection, AsyncPgConnection};
use payments_service::config::MigrateArgs;
use payments_service::db::{distribute, migrate};

pub async fn run(args: MigrateArgs) -> anyhow::Result<()> {
    if !args.distribute {
        migrate::run_pending(&args.database_url).await?;
        println!("migrations applied");
        return Ok(());
    }
    // Refused before any migration runs: without Citus, nothing changes.
    let mut conn = AsyncPgConnection::establish(&args.database_url).await?;
    if !distribute::has_citus(&mut conn).await? {
        return Err(distribute::DistributeError::NoCitus.into());
    }
    migrate::run_pending(&args.database_url).await?;
    println!("migrations applied");
    let distributed = distribute::distribute(&mut conn).await?;
    if distributed.is_empty() {
        println!("every table was distributed already");
    }
    for (table, how) in distributed {
        println!("distributed {table}: {how}");
    }
    Ok(())
}
