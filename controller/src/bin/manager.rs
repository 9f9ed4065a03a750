//! The controller manager binary: flags and logging; the work, signals and HTTP endpoints included, is in the
//! library ([`controller::app::run`]).

use anyhow::Context as _;
use clap::Parser;
use controller::cli::Args;
use controller::{app, telemetry};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    telemetry::init(args.log_level, args.log_format).map_err(anyhow::Error::msg)?;
    app::run(&args).await.context("running the manager")
}
