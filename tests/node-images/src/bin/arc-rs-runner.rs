//! The runner image's entrypoint: a stand-in for the actions/runner that the fake Actions Service cannot tell
//! apart from one (see `node_images::runner`), with switches for misbehaviour (`node_images::constants::env`).

use std::process::ExitCode;
use std::time::Duration;

use node_images::constants::JIT_CONFIG_ENV;
use node_images::runner::http::HttpService;
use node_images::runner::{Event, Session, Switches};
use tokio::signal::unix::{Signal, SignalKind, signal};

/// Exit code after SIGTERM: 128 + 15, what a shell reports for a terminated process.
const TERMINATED: u8 = 143;
/// Exit code when the runner cannot work at all (bad switches, no or unusable JIT config).
const BROKEN: u8 = 1;
/// How much memory the `GROW_MEMORY` switch takes per step, and how often.
const GROWTH_STEP: usize = 16 << 20;
const GROWTH_INTERVAL: Duration = Duration::from_millis(50);

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let switches = match Switches::from_env(|name| std::env::var(name).ok()) {
        Ok(switches) => switches,
        Err(error) => return broken(&error.to_string()),
    };
    if let Some(code) = switches.exit_at_start {
        println!("runner: exiting {code} at start");
        return ExitCode::from(u8::try_from(code).unwrap_or(BROKEN));
    }
    // In its container the runner is process 1, which the kernel shields from every signal it has no handler
    // for: without this handler SIGTERM would do nothing at all.
    let sigterm = match signal(SignalKind::terminate()) {
        Ok(sigterm) => sigterm,
        Err(error) => return broken(&format!("installing the SIGTERM handler: {error}")),
    };
    let terminated = terminated(sigterm, switches.ignore_sigterm);
    if switches.hang {
        println!("runner: hanging (never reports online, never exits by itself)");
        terminated.await;
        return ExitCode::from(TERMINATED);
    }
    let Ok(jit_config) = std::env::var(JIT_CONFIG_ENV) else {
        return broken(&format!("no {JIT_CONFIG_ENV} in the environment"));
    };
    let control_url = match node_images::jit::fake_control_url(&jit_config) {
        Ok(url) => url,
        Err(error) => return broken(&error.to_string()),
    };
    let service = match HttpService::new(&control_url) {
        Ok(service) => service,
        Err(error) => return broken(&error.to_string()),
    };
    let mut session = Session::default();
    let grow = switches.grow_memory;
    let mut on_event = |event: Event| {
        println!("runner: {event:?}");
        if grow && matches!(event, Event::Started(_)) {
            tokio::spawn(grow_memory());
        }
    };
    let outcome = tokio::select! {
        outcome = session.run(&service, &jit_config, &switches.job, &mut on_event) => Some(outcome),
        () = terminated => None,
    };
    match outcome {
        Some(Ok(code)) => {
            println!("runner: exiting {code}");
            ExitCode::from(u8::try_from(code).unwrap_or(BROKEN))
        }
        Some(Err(error)) => broken(&error.to_string()),
        None => {
            let termination = session.terminate(&service).await;
            println!("runner: SIGTERM: {termination:?}");
            ExitCode::from(TERMINATED)
        }
    }
}

/// Resolves on the first SIGTERM, or never when it is to be ignored.
async fn terminated(mut sigterm: Signal, ignore: bool) {
    loop {
        sigterm.recv().await;
        if !ignore {
            return;
        }
        println!("runner: SIGTERM ignored");
    }
}

async fn grow_memory() {
    let mut hoard: Vec<Vec<u8>> = Vec::new();
    loop {
        // Non-zero bytes: every page is written, so it counts against the cgroup's limit at once.
        hoard.push(vec![1u8; GROWTH_STEP]);
        println!("runner: holding {} MiB", hoard.len() * (GROWTH_STEP >> 20));
        tokio::time::sleep(GROWTH_INTERVAL).await;
    }
}

fn broken(why: &str) -> ExitCode {
    eprintln!("runner: {why}");
    ExitCode::from(BROKEN)
}
