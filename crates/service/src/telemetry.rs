//! Logging: structured `tracing` events, written to stderr, filtered by `RUST_LOG`, as text for a
//! person or as JSON lines for a log collector (`PAYMENTS_LOG_FORMAT`).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The filter when `RUST_LOG` is unset: our own events at `info`, dependencies at `warn`.
const DEFAULT_FILTER: &str = "warn,payments=info";

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Lines for a person, coloured only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line: the event's level, target, fields and spans.
    Json,
}

/// Installs the process's subscriber (once; later calls do nothing).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        // Colour codes help at a terminal; in a log file or a collector they are noise.
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}
