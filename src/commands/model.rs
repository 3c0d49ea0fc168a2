//! `payments model`: the protocol's model (`payments-model`), checked here (`check`: every state
//! within the bounds, each guarantee held or broken with the shortest path to it) or explored
//! step by step in a browser (`explore`: stateright's explorer).

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::{Args, Subcommand};
use payments_model::{
    ALWAYS, AUTHORIZATION_ALWAYS, AUTHORIZATION_SOMETIMES, Authorization, Mutant, Protocol, SOMETIMES,
    shortest_counterexample,
};
use stateright::{Checker, Model};

#[derive(Subcommand)]
pub enum ModelCommand {
    /// Explore every state within the bounds; print each guarantee, held or broken (with the
    /// shortest path to the break, step by step), and whether each path is reached (a guarantee
    /// holds for nothing if what it guards never happens). Exits 3 if a guarantee is broken.
    Check(ModelArgs),
    /// Serve the checker's explorer: the model's states, one action at a time, in a browser.
    Explore {
        #[command(flatten)]
        model: ModelArgs,
        /// Where the explorer listens.
        #[arg(long, default_value = "127.0.0.1:3000")]
        bind: SocketAddr,
    },
}

/// The bounds of a run of the model, and the rule broken in it, if any.
#[derive(Args)]
pub struct ModelArgs {
    /// The attempts the client makes with its key.
    #[arg(long, default_value_t = 2)]
    attempts: u8,
    /// The faults that may strike, all told (crashes, pauses, gateway failures, the gateway
    /// forgetting its keys, an event sent twice).
    #[arg(long, default_value_t = 2)]
    faults: u8,
    /// Leave out the gateway's events.
    #[arg(long)]
    no_events: bool,
    /// Leave out the two refunds.
    #[arg(long)]
    no_refunds: bool,
    /// Break one rule, to watch the checker find what goes wrong.
    #[arg(long, value_name = "RULE", value_parser = clap::builder::PossibleValuesParser::new(Mutant::ALL.map(Mutant::name)))]
    broken: Option<String>,
}

impl ModelArgs {
    fn protocol(&self) -> Protocol {
        let mut model = Protocol::new(self.attempts, self.faults);
        if !self.no_events {
            model = model.with_events();
        }
        if !self.no_refunds {
            model = model.with_refunds();
        }
        match self.broken.as_deref().and_then(Mutant::named) {
            Some(mutant) => model.with(mutant),
            None => model,
        }
    }
}

pub async fn run(command: ModelCommand) -> anyhow::Result<ExitCode> {
    match command {
        ModelCommand::Check(args) => tokio::task::spawn_blocking(move || check(&args.protocol())).await?,
        ModelCommand::Explore { model, bind } => {
            // The explorer's server panics on an address it cannot take: say why instead.
            drop(TcpListener::bind(bind).with_context(|| format!("binding the explorer to {bind}"))?);
            println!("the model's explorer at http://{bind}/");
            let model = model.protocol();
            tokio::task::spawn_blocking(move || model.checker().serve(bind)).await?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn check(model: &Protocol) -> anyhow::Result<ExitCode> {
    let started = Instant::now();
    let checker = model.clone().checker().spawn_bfs().join();
    let mut report = format!("{} states explored in {:.1?}\n", checker.unique_state_count(), started.elapsed());
    let found = checker.discoveries();
    let mut broken = false;
    for property in ALWAYS {
        if !found.contains_key(property) {
            writeln!(report, "holds:       {property}")?;
            continue;
        }
        broken = true;
        let path = shortest_counterexample(model, property).context("the shortest path to the break")?;
        writeln!(report, "BROKEN:      {property}\n{}", model.explain(&path))?;
    }
    for property in SOMETIMES.into_iter().filter(|property| model.takes_part_in(property)) {
        let reached = if found.contains_key(property) { "reached:    " } else { "not reached:" };
        writeln!(report, "{reached} {property}")?;
    }
    // An authorization's life, and the race to end it, with as many lost answers.
    let authorization = Authorization::new(model.faults);
    let checker = authorization.clone().checker().spawn_bfs().join();
    writeln!(report, "an authorization: {} states", checker.unique_state_count())?;
    for property in AUTHORIZATION_ALWAYS {
        if checker.discovery(property).is_none() {
            writeln!(report, "holds:       {property}")?;
            continue;
        }
        broken = true;
        let path = shortest_counterexample(&authorization, property).context("the shortest path to the break")?;
        let steps: Vec<String> = path.into_actions().iter().map(|step| authorization.format_action(step)).collect();
        writeln!(report, "BROKEN:      {property}\n    {}", steps.join("\n    "))?;
    }
    for property in AUTHORIZATION_SOMETIMES {
        let reached = if checker.discovery(property).is_some() { "reached:    " } else { "not reached:" };
        writeln!(report, "{reached} {property}")?;
    }
    // A reader who pipes it into `head` has what they wanted: a closed pipe is no failure.
    if let Err(error) = std::io::stdout().write_all(report.as_bytes())
        && error.kind() != std::io::ErrorKind::BrokenPipe
    {
        return Err(error.into());
    }
    Ok(if broken { ExitCode::from(3) } else { ExitCode::SUCCESS })
}
