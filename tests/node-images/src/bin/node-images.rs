//! Builds the real-node tier's images as docker-archive tarballs, with no Docker engine:
//!
//! ```text
//! node-images --out DIR --pause BIN --runner BIN [--manager BIN --listener BIN]
//! ctr -a <containerd socket> -n k8s.io images import DIR/runner.tar
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use node_images::images::{Binaries, write_images};

#[derive(Parser)]
#[command(about = "Builds the real-node test tier's images as docker-archive tarballs")]
struct Args {
    /// Directory for pause.tar, runner.tar and project.tar.
    #[arg(long)]
    out: PathBuf,
    /// The arc-rs-pause binary.
    #[arg(long)]
    pause: PathBuf,
    /// The arc-rs-runner binary.
    #[arg(long)]
    runner: PathBuf,
    /// The manager binary (with --listener: the project image).
    #[arg(long, requires = "listener")]
    manager: Option<PathBuf>,
    /// The listener binary.
    #[arg(long, requires = "manager")]
    listener: Option<PathBuf>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let project = args.manager.as_deref().zip(args.listener.as_deref());
    let binaries = Binaries {
        pause: &args.pause,
        runner: &args.runner,
        project,
    };
    match write_images(binaries, &args.out) {
        Ok(archives) => {
            println!("{}", archives.pause.display());
            println!("{}", archives.runner.display());
            if let Some(project) = archives.project {
                println!("{}", project.display());
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("node-images: {error}");
            let mut source = std::error::Error::source(&error);
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::FAILURE
        }
    }
}
