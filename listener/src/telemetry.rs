//! Logging: structured records on stdout, JSON or text, with the source location, at the configured level.

use tracing_subscriber::EnvFilter;

use crate::config::{LogFormat, LogLevel};
use crate::error::{Error, Result};

/// Libraries whose debug output drowns the listener's own.
const QUIET_LIBRARIES: &str =
    "hyper=info,hyper_util=info,h2=info,tower=info,rustls=info,reqwest=info,kube_client=info";

/// Installs the global subscriber. `RUST_LOG`, when set, replaces the level from the config (for debugging).
pub fn init(level: LogLevel, format: LogFormat) -> Result<()> {
    let level = match level {
        LogLevel::Debug => "debug",
        LogLevel::Info => "info",
        LogLevel::Warn => "warn",
        LogLevel::Error => "error",
    };
    let filter = match std::env::var("RUST_LOG") {
        Ok(directives) if !directives.is_empty() => EnvFilter::try_new(directives),
        _ => EnvFilter::try_new(format!("{level},{QUIET_LIBRARIES}")),
    }
    .map_err(|e| Error::InitLogging(e.to_string()))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stdout)
        .with_file(true)
        .with_line_number(true)
        .with_target(false);
    let installed = match format {
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
        LogFormat::Text => builder.with_ansi(false).try_init(),
    };
    installed.map_err(|e| Error::InitLogging(e.to_string()))
}
