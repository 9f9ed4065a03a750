//! Container images for the real-node test tier, built with no Docker engine and no registry, and the runner
//! logic shared by the runner image and the e2e simulator.
//!
//! * [`image`] writes docker-archive tarballs (`ctr images import` reads them) from a list of files.
//! * [`rootfs`] gathers a dynamically linked binary's shared libraries and loader, so an image can run it.
//! * [`images`] describes the three images: the project image (as the Dockerfile describes it), the pause
//!   (sandbox) image and the runner image.
//! * [`runner`] is what a runner does as far as the Actions Service can tell: report online with its JIT
//!   config, take its job, run it, report it finished, exit. The `arc-rs-runner` binary runs it against the
//!   fake over HTTP; the e2e simulator runs the same code in-process.

pub mod constants;
pub mod image;
pub mod images;
pub mod jit;
pub mod rootfs;
pub mod runner;
pub mod tar;

use std::path::PathBuf;

/// Everything that can go wrong in this crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("writing {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("running `ldd {binary}`: {reason}")]
    Ldd { binary: PathBuf, reason: String },
    #[error("tar entry {path}: {reason}")]
    TarEntry { path: String, reason: String },
    #[error("the JIT config is not what the runner expects: {0}")]
    JitConfig(String),
    #[error("{name}={value} is not valid: {reason}")]
    Setting {
        name: &'static str,
        value: String,
        reason: String,
    },
    #[error("the Actions Service: {0}")]
    Service(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
