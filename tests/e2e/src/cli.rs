//! What the three binaries (`demo`, `e2e-bench`, `chaos`) share around their own work: logging to stderr, the
//! async runtime, and how a result becomes output and an exit status.

use std::future::Future;
use std::process::ExitCode;

use serde::Serialize;

/// Logs to stderr, quiet by default (`RUST_LOG` overrides): the binaries' own output is on stdout.
pub fn init_tracing() {
    let filter = std::env::var("RUST_LOG").unwrap_or_else(|_| "error,kube_client=off".to_owned());
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .init();
}

/// Runs `work` on a multi-threaded runtime. On success `render` prints the outcome, `--json` adds it as the last
/// line, and `passed` decides the exit status; an error is printed (and, with `--json`, given as
/// `{"error": ...}`) and fails.
pub fn run<T: Serialize>(
    name: &str,
    json: bool,
    work: impl Future<Output = crate::Result<T>>,
    render: impl FnOnce(&T),
    passed: impl FnOnce(&T) -> bool,
) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("{name}: starting the async runtime failed: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(work) {
        Ok(outcome) => {
            render(&outcome);
            if json {
                println!("{}", serde_json::to_string(&outcome).unwrap_or_default());
            }
            if passed(&outcome) {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
        Err(e) => {
            eprintln!("{name}: {e}");
            if json {
                println!("{}", serde_json::json!({"error": e.to_string()}));
            }
            ExitCode::FAILURE
        }
    }
}
