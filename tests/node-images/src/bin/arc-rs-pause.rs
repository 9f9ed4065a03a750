//! The sandbox (pause) image's entrypoint: holds the pod's namespaces and sleeps until SIGTERM or SIGINT.

use std::process::ExitCode;

use tokio::signal::unix::{SignalKind, signal};

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // Process 1 of its PID namespace gets only the signals it handles.
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        eprintln!("pause: cannot install signal handlers");
        return ExitCode::FAILURE;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    ExitCode::SUCCESS
}
