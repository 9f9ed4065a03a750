//! Logging set-up: ARC's `--log-level` (`debug`, `info`, `warn`, `error`, or a zap integer level) and
//! `--log-format` (`text` or `json`). `RUST_LOG`, when set, overrides the level with a full filter.

use tracing_subscriber::EnvFilter;

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The tracing level for an ARC log level: names, or zap's integers (-1 debug, 0 info, 1 warn, 2 error; lower
/// is more verbose).
pub fn parse_level(value: &str) -> Result<tracing::Level, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "debug" => Ok(tracing::Level::DEBUG),
        "info" => Ok(tracing::Level::INFO),
        "warn" | "warning" => Ok(tracing::Level::WARN),
        "error" => Ok(tracing::Level::ERROR),
        other => match other.parse::<i32>() {
            Ok(n) if n < -1 => Ok(tracing::Level::TRACE),
            Ok(-1) => Ok(tracing::Level::DEBUG),
            Ok(0) => Ok(tracing::Level::INFO),
            Ok(1) => Ok(tracing::Level::WARN),
            Ok(_) => Ok(tracing::Level::ERROR),
            Err(_) => Err(format!(
                "{value:?} is not a log level (debug, info, warn, error or an integer)"
            )),
        },
    }
}

/// Installs the global subscriber. Fails if one is installed already.
pub fn init(level: tracing::Level, format: LogFormat) -> Result<(), String> {
    // Our crates at the requested level; dependencies one step quieter unless RUST_LOG says otherwise.
    // The listener loops of the manager's listener mode log as the listener binary does.
    let default = format!(
        "warn,controller={level},listener={level},actions_client={level},kube_runtime=info"
    );
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    result.map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arc_levels() {
        assert_eq!(parse_level("debug"), Ok(tracing::Level::DEBUG));
        assert_eq!(parse_level("INFO"), Ok(tracing::Level::INFO));
        assert_eq!(parse_level("-1"), Ok(tracing::Level::DEBUG));
        assert_eq!(parse_level("-5"), Ok(tracing::Level::TRACE));
        assert_eq!(parse_level("2"), Ok(tracing::Level::ERROR));
        assert!(parse_level("loud").is_err());
    }
}
