use clap::Parser;
use payments::cli::{AccountsCommand, AttentionCommand, Cli, Command};
use payments::commands;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    payments::telemetry::init(cli.log_format);
    match cli.command {
        Command::Serve(args) => commands::serve::run(args).await,
        Command::Worker(args) => commands::worker::run(args).await,
        Command::Gateway(args) => commands::gateway::run(args).await,
        Command::Migrate(args) => commands::migrate::run(args).await,
        Command::Accounts(AccountsCommand::Create(args)) => commands::accounts::create(args).await,
        Command::Attention(AttentionCommand::List(database)) => commands::attention::list(database).await,
        Command::Attention(AttentionCommand::Retry { key_id, database }) => {
            commands::attention::retry(database, &key_id).await
        }
        Command::Stats(args) => commands::stats::run(args).await,
        Command::Bench(args) => commands::bench::run(args).await,
        Command::BenchEndpoint(args) => commands::bench::endpoint(args).await,
    }
}
