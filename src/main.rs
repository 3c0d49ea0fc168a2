use std::process::ExitCode;

mod cli;
mod commands;

use clap::Parser;
use cli::{AccountsCommand, AttentionCommand, Cli, Command};

/// mimalloc rather than the C library's allocator: the API allocates and frees many small buffers
/// per request, and glibc's `malloc` and `free` were a large share of its CPU (docs/performance.md,
/// "The allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    payments_service::telemetry::init(cli.log_format);
    // Most commands succeed or fail; `pay`, `capture`, `cancel`, `refund`, `chaos` and `model` say with their exit code how a run ended.
    let done = |()| ExitCode::SUCCESS;
    match cli.command {
        Command::Serve(args) => commands::serve::run(args).await.map(done),
        Command::Worker(args) => commands::worker::run(args).await.map(done),
        Command::Gateway(args) => commands::gateway::run(args).await.map(done),
        Command::Listen(args) => commands::listen::run(args).await.map(done),
        Command::Migrate(args) => commands::migrate::run(args).await.map(done),
        Command::Accounts(AccountsCommand::Create(args)) => commands::accounts::create(args).await.map(done),
        Command::Attention(AttentionCommand::List(database)) => commands::attention::list(database).await.map(done),
        Command::Attention(AttentionCommand::Retry { key_id, gateway, database }) => {
            commands::attention::retry(database, &key_id, gateway.as_deref()).await.map(done)
        }
        Command::Stats(args) => commands::stats::run(args).await.map(done),
        Command::Pay(args) => commands::pay::run(args).await,
        Command::Capture(args) => commands::pay::capture(args).await,
        Command::Cancel(args) => commands::pay::cancel(args).await,
        Command::Refund(args) => commands::refund::run(args).await,
        Command::Chaos(args) => commands::chaos::run(args).await,
        Command::Model(command) => commands::model::run(command).await,
        Command::Bench(args) => commands::bench::run(args).await.map(done),
        Command::BenchEndpoint(args) => commands::bench::endpoint(args).await.map(done),
    }
}
