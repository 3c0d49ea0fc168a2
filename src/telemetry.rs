//! Logging: structured `tracing` events, written to stderr, filtered by `RUST_LOG`.

use tracing_subscriber::EnvFilter;

/// The filter when `RUST_LOG` is unset: our own events at `info`, dependencies at `warn`.
const DEFAULT_FILTER: &str = "warn,payments=info";

/// Installs the process's subscriber (once; later calls do nothing).
pub fn init() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).try_init();
}
