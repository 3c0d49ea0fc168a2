//! The command line: one binary, one subcommand per role.

use clap::{Parser, Subcommand};
use payments_service::config::{
    CreateAccountArgs, DatabaseArgs, GatewayArgs, MigrateArgs, ServeArgs, StatsArgs, WorkerCommandArgs,
};
use payments_service::telemetry::LogFormat;

use crate::commands::bench::{BenchArgs, BenchEndpointArgs};
use crate::commands::chaos::ChaosArgs;
use crate::commands::listen::ListenArgs;
use crate::commands::model::ModelCommand;
use crate::commands::pay::{CancelArgs, CaptureArgs, PayArgs};
use crate::commands::refund::RefundArgs;

/// A reference payment API: idempotency keys, atomic phases and recovery points on PostgreSQL.
#[derive(Parser)]
#[command(name = "payments", version, about)]
pub struct Cli {
    /// How every command writes its logs (to stderr): `text`, or `json` for one object per line.
    #[arg(long, global = true, env = "PAYMENTS_LOG_FORMAT", value_enum, default_value_t)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Serve the HTTP API and run the background workers. Without DATABASE_URL it runs its own
    /// PostgreSQL (embedded mode), and without GATEWAY_URL an in-process mock gateway, so it works
    /// with no set-up.
    Serve(ServeArgs),
    /// Run the background workers (completer, reaper, outbox, settler) alone, with no HTTP.
    Worker(WorkerCommandArgs),
    /// Run the mock payment gateway as a process of its own.
    Gateway(GatewayArgs),
    /// Apply the database migrations to DATABASE_URL and exit.
    Migrate(MigrateArgs),
    /// Manage accounts.
    #[command(subcommand)]
    Accounts(AccountsCommand),
    /// Keys the completer gave up on.
    #[command(subcommand)]
    Attention(AttentionCommand),
    /// Each account's requests by how their idempotency key was taken in, and the share that
    /// repeated a key: a client that retries far more than others is broken, or being replayed.
    Stats(StatsArgs),
    /// The reference receiver of a merchant's webhooks: answers 204 to a delivery signed as
    /// Standard Webhooks says under any of its secrets, within five minutes of its clock, and
    /// prints the event's type and id; 400 to anything else.
    Listen(ListenArgs),
    /// Make one payment through the reference client: one idempotency key for all its attempts,
    /// retries with backoff on what may succeed next time, never on a definitive answer. Exit
    /// codes: 0 paid; 3 declined; 4 rejected (nothing was charged); 5 gave up: no definitive
    /// answer, or an answer not about the key after an attempt may have reached the service (the
    /// key is printed, to resume with --key); 6 the key's record has expired (the payment it made
    /// is printed).
    Pay(PayArgs),
    /// Capture a payment `pay --no-capture` authorized, all or --amount of it, through the same
    /// client and with the same exit codes: 0 captured; 3 refused (not found, not an authorization
    /// still open, or more than was authorized); 4 rejected; 5 gave up; 6 expired.
    Capture(CaptureArgs),
    /// Cancel a payment `pay --no-capture` authorized, releasing the money held, with the exit
    /// codes of `capture`.
    Cancel(CancelArgs),
    /// Refund a payment, all it has left or --amount of it, through the same client and with the
    /// same exit codes: 0 refunded (or pending: the gateway settles it later, as stderr says); 3
    /// declined: nothing refunded (the payment was not found, is not refundable, is refunded
    /// already or has less left than asked; or the refund failed at the gateway); 4 rejected; 5
    /// gave up (the key is printed, to resume with --key); 6 the key's record has expired (the
    /// refund it made is printed).
    Refund(RefundArgs),
    /// Watch the guarantees hold: many payments, and refunds racing for them, through the reference
    /// client while servers and workers are killed, requests crash mid-way and the gateway fails;
    /// then check that nothing was charged or refunded twice or lost, and no payment refunded
    /// beyond its amount. Exits 3 if an invariant is broken.
    Chaos(ChaosArgs),
    /// Measure the service under load: new payments, replays, concurrent duplicates and refunds,
    /// against a deployment of its own (or --url), and optionally against the reference workloads.
    Bench(BenchArgs),
    /// The protocol's model: check every interleaving within bounds, or explore it step by step.
    #[command(subcommand)]
    Model(ModelCommand),
    /// The bare reference endpoint `bench --references` runs: actix-web parsing a JSON payment
    /// and answering JSON, with no database.
    #[command(hide = true)]
    BenchEndpoint(BenchEndpointArgs),
}

#[derive(Subcommand)]
pub enum AttentionCommand {
    /// List the keys that need attention, oldest first.
    List(DatabaseArgs),
    /// Hand a key back to the workers once its cause is fixed (safe: they reconcile before charging).
    Retry {
        /// The key row's id, as `attention list` prints it.
        key_id: String,
        /// First record GATEWAY as the gateway that holds what the key made (its pending payment,
        /// or its pending refund, capture or cancel and that one's payment), in place of the one
        /// recorded: for a key whose reason names a recorded gateway that is gone or was recorded
        /// wrongly, and the gateway answering now. Only once you know the recorded gateway holds
        /// nothing under the key: the workers then look the key up at GATEWAY, and charge, refund,
        /// capture or cancel there if it holds nothing either.
        #[arg(long, value_name = "GATEWAY")]
        gateway: Option<String>,
        #[command(flatten)]
        database: DatabaseArgs,
    },
}

#[derive(Subcommand)]
pub enum AccountsCommand {
    /// Create an account and print its new API key (shown once) on the last line.
    Create(CreateAccountArgs),
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_well_formed() {
        super::Cli::command().debug_assert();
    }
}
