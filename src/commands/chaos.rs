//! `payments chaos`: the flags, turned into a [`chaos::Plan`]. The run itself is in
//! [`payments_lab::chaos`].

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use payments_lab::chaos::{self, Deployment, EventStorm, Extent, LEFT_TO_LAPSE, Mix, Plan};
use reqwest::Url;

use super::parse_duration;

/// The exit code of a run in which an invariant was broken.
pub const BROKEN: u8 = 3;

/// `payments chaos`.
#[derive(Clone, Args)]
pub struct ChaosArgs {
    /// Run the world of its own on a Citus cluster of this many workers (and a coordinator)
    /// instead of one PostgreSQL; needs the citus extension. Unless --no-kills or
    /// --no-node-crashes, a worker node is then also crashed (immediate shutdown) every 6 to 12 s,
    /// and started again after up to 3 s.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=16))]
    pub citus_workers: Option<u16>,
    /// Make this many payments (instead of running for --duration).
    #[arg(long, conflicts_with = "duration", value_parser = clap::value_parser!(u64).range(1..))]
    pub keys: Option<u64>,
    /// Make payments for this long: `60s`, `2m`.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Payments in flight at once.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub clients: u32,
    /// The share of charge requests the gateway fails (error_before, error_after or timeout_after).
    #[arg(long, default_value_t = 0.3, value_parser = rate)]
    pub fault_rate: f64,
    /// The share of payments whose first attempt carries a crash point (the server aborts there).
    #[arg(long, default_value_t = 0.05, value_parser = rate)]
    pub crash_rate: f64,
    /// The share of payments whose client tries once and walks away.
    #[arg(long, default_value_t = 0.1, value_parser = rate)]
    pub abandon_rate: f64,
    /// The share of payments made with a card that is declined.
    #[arg(long, default_value_t = 0.1, value_parser = rate)]
    pub decline_rate: f64,
    /// The share of the other payments only authorized (`capture: false`): then 1 to 3 captures
    /// (all or part) and cancels, each with a key of its own, race for each at once (with its
    /// refunds), at a moment up to a little past its lapse (the run's authorizations lapse after
    /// 4 s); a fifth are left alone, for the lapse (none against a running deployment).
    #[arg(long, default_value_t = 0.3, value_parser = rate)]
    pub authorize_rate: f64,
    /// The share of the authorizations the gateway captures (all or part) or cancels on its own, as
    /// its dashboard or another system would, at a moment drawn from none to 3 s after each is
    /// made: while the payment's answer is lost, or after it recorded the authorization.
    #[arg(long, default_value_t = 0.2, value_parser = rate)]
    pub gateway_acts_rate: f64,
    /// The share of the other payments that are refunded once they succeed, by 1 to 3 refunds at
    /// once, each with a key of its own, for part of the payment or all it has left.
    #[arg(long, default_value_t = 0.3, value_parser = rate)]
    pub refund_rate: f64,
    /// The share of the refunded payments charged with `tok_refundPending` (a quarter of them
    /// `tok_refundFails`): the gateway leaves their refunds pending, and they must settle.
    #[arg(long, default_value_t = 0.3, value_parser = rate)]
    pub pending_refund_rate: f64,
    /// The share of the gateway's events it sends twice, both copies at the same moment (the run's
    /// own relay hands deliveries to the servers in turn, so most pairs race for the inbox's row
    /// on different servers).
    #[arg(long, default_value_t = 0.3, value_parser = rate)]
    pub event_duplicate_rate: f64,
    /// How long the gateway holds each event back before sending it, in milliseconds: as long as
    /// the services' gateway timeout, so that an event comes after the answer of a request that
    /// went through, and while a request that a fault cut short is still unfinished.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(0..=3_600_000))]
    pub event_delay_ms: u64,
    /// Send the gateway's events in the order made (by default they go out in batches of a
    /// second's events, each batch out of order).
    #[arg(long)]
    pub no_event_shuffle: bool,
    /// Neither kill nor pause processes (crash points, gateway faults and abandoned clients remain).
    #[arg(long)]
    pub no_kills: bool,
    /// With --citus-workers: crash no worker node (the service's processes are still killed).
    #[arg(long, requires = "citus_workers")]
    pub no_node_crashes: bool,
    /// Also draw the run as an SVG timeline in this directory (made if need be),
    /// chaos-timeline.svg: attempts per second by answer, the gateway's requests and faults, keys
    /// unfinished, under a strip of the kills, pauses, crash-point aborts and forgotten keys.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Disturb a running deployment at these base URLs instead of starting one (repeat the flag
    /// for each server). It is driven and checked, not killed.
    #[arg(long = "url", requires_all = ["api_key", "database_url", "gateway_url"])]
    pub urls: Vec<Url>,
    /// With --url: the API key to pay with.
    #[arg(long, requires = "urls")]
    pub api_key: Option<String>,
    /// With --url: the deployment's database, checked at the end.
    #[arg(long, requires = "urls")]
    pub database_url: Option<String>,
    /// With --url: its mock gateway, started with --control (faults are set, and charges counted, there).
    #[arg(long, requires = "urls")]
    pub gateway_url: Option<Url>,
}

pub async fn run(args: ChaosArgs) -> anyhow::Result<ExitCode> {
    let deployment = match (args.urls.is_empty(), args.api_key, args.database_url, args.gateway_url) {
        (false, Some(api_key), Some(database_url), Some(gateway_url)) => {
            Deployment::Existing { urls: args.urls, api_key, database_url, gateway_url }
        }
        _ => Deployment::Own,
    };
    let plan = Plan {
        extent: args.keys.map_or(Extent::For(args.duration), Extent::Keys),
        clients: args.clients as usize,
        fault_rate: args.fault_rate,
        mix: Mix {
            crash: args.crash_rate,
            abandon: args.abandon_rate,
            decline: args.decline_rate,
            authorize: args.authorize_rate,
            lapse: LEFT_TO_LAPSE,
            refund: args.refund_rate,
            pending_refund: args.pending_refund_rate,
        },
        processes: !args.no_kills,
        node_crashes: !args.no_kills && !args.no_node_crashes,
        events: EventStorm {
            duplicate_rate: args.event_duplicate_rate,
            delay_ms: args.event_delay_ms,
            shuffle: !args.no_event_shuffle,
        },
        gateway_acts: args.gateway_acts_rate,
        plot: args.plot,
        deployment,
        citus_workers: args.citus_workers,
    };
    let held = chaos::run(plan).await?;
    Ok(if held { ExitCode::SUCCESS } else { ExitCode::from(BROKEN) })
}

/// A share between 0 and 1.
fn rate(value: &str) -> Result<f64, String> {
    match value.parse::<f64>() {
        Ok(rate) if (0.0..=1.0).contains(&rate) => Ok(rate),
        _ => Err(format!("{value:?} is not a share between 0 and 1")),
    }
}
