//! The three images of the real-node tier.

use std::path::Path;

use crate::constants::{
    LISTENER_ALIAS, LISTENER_PATH, MANAGER_PATH, NONROOT_UID, PAUSE_IMAGE, PAUSE_PATH,
    PROJECT_IMAGE, RUNNER_IMAGE, RUNNER_PATH,
};
use crate::image::ImageSpec;
use crate::rootfs::Rootfs;
use crate::{Error, Result};

/// Where the host keeps its CA bundle (Debian); copied into the project image as distroless ships one.
const HOST_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
const PATH_ENV: &str = "PATH=/usr/local/bin:/usr/bin:/bin";
/// Where the host keeps its time zone database (Debian's tzdata); distroless ships the same files.
const HOST_ZONEINFO: &str = "/usr/share/zoneinfo";

/// The project image as the Dockerfile describes it: `/manager` (the entrypoint), `/ghalistener` and its
/// alias `/listener`, running as the distroless nonroot user.
pub fn project_image(manager: &Path, listener: &Path) -> Result<ImageSpec> {
    let mut rootfs = Rootfs::new();
    rootfs.binary(manager, MANAGER_PATH)?;
    rootfs.binary(listener, LISTENER_PATH)?;
    rootfs.symlink(
        LISTENER_ALIAS.trim_start_matches('/'),
        LISTENER_PATH.trim_start_matches('/'),
    );
    ca_bundle(&mut rootfs)?;
    zoneinfo(&mut rootfs, Path::new(HOST_ZONEINFO))?;
    Ok(ImageSpec {
        reference: PROJECT_IMAGE.to_owned(),
        entrypoint: vec![MANAGER_PATH.to_owned()],
        user: format!("{NONROOT_UID}:{NONROOT_UID}"),
        env: vec![
            PATH_ENV.to_owned(),
            format!("SSL_CERT_FILE={HOST_CA_BUNDLE}"),
        ],
        entries: rootfs.into_entries(),
    })
}

/// The host's CA bundle, as distroless ships one: rustls with the platform verifier refuses to build an
/// HTTP client without any CA certificate, even for plain-HTTP use.
fn ca_bundle(rootfs: &mut Rootfs) -> Result<()> {
    if Path::new(HOST_CA_BUNDLE).is_file() {
        rootfs.copy(
            Path::new(HOST_CA_BUNDLE),
            HOST_CA_BUNDLE.trim_start_matches('/'),
            0o644,
        )?;
    }
    Ok(())
}

/// The host's time zone database (`dir` and below), as distroless ships one: the listener reads it for
/// `minRunnersSchedules` windows in a named time zone. Links are copied as the files they lead to.
fn zoneinfo(rootfs: &mut Rootfs, dir: &Path) -> Result<()> {
    let unreadable = |path: &Path, source: std::io::Error| Error::Read {
        path: path.to_path_buf(),
        source,
    };
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        let entries = std::fs::read_dir(&current).map_err(|e| unreadable(&current, e))?;
        for entry in entries {
            let path = entry.map_err(|e| unreadable(&current, e))?.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.is_file() {
                let at = path.to_string_lossy().trim_start_matches('/').to_owned();
                rootfs.copy(&path, &at, 0o644)?;
            }
        }
    }
    Ok(())
}

/// The sandbox image: `/pause`, which sleeps until signalled.
pub fn pause_image(pause: &Path) -> Result<ImageSpec> {
    single_binary(PAUSE_IMAGE, pause, PAUSE_PATH, "65535:65535")
}

/// The runner image: `/runner`, the stand-in for the actions/runner. It runs as the nonroot user, as the
/// real runner image does (uid 1001 there; the number does not matter to anything the tests observe).
pub fn runner_image(runner: &Path) -> Result<ImageSpec> {
    single_binary(
        RUNNER_IMAGE,
        runner,
        RUNNER_PATH,
        &format!("{NONROOT_UID}:{NONROOT_UID}"),
    )
}

fn single_binary(reference: &str, binary: &Path, at: &str, user: &str) -> Result<ImageSpec> {
    let mut rootfs = Rootfs::new();
    rootfs.binary(binary, at)?;
    ca_bundle(&mut rootfs)?;
    Ok(ImageSpec {
        reference: reference.to_owned(),
        entrypoint: vec![at.to_owned()],
        user: user.to_owned(),
        env: vec![
            PATH_ENV.to_owned(),
            format!("SSL_CERT_FILE={HOST_CA_BUNDLE}"),
        ],
        entries: rootfs.into_entries(),
    })
}

/// Writes `spec` as a docker-archive tarball to `path`.
pub fn write_archive(spec: &ImageSpec, path: &Path) -> Result<()> {
    let bytes = crate::image::docker_archive(spec)?;
    std::fs::write(path, bytes).map_err(|source| Error::Write {
        path: path.to_owned(),
        source,
    })
}

/// Where [`write_images`] put each archive.
#[derive(Debug, Clone)]
pub struct Archives {
    pub pause: std::path::PathBuf,
    pub runner: std::path::PathBuf,
    /// Only when the manager and listener binaries were given.
    pub project: Option<std::path::PathBuf>,
}

/// The binaries the images are built from.
#[derive(Debug, Clone, Copy)]
pub struct Binaries<'a> {
    pub pause: &'a Path,
    pub runner: &'a Path,
    /// `(manager, listener)`, for the project image.
    pub project: Option<(&'a Path, &'a Path)>,
}

/// Writes the images' docker archives into `out` (`pause.tar`, `runner.tar`, `project.tar`).
pub fn write_images(binaries: Binaries<'_>, out: &Path) -> Result<Archives> {
    std::fs::create_dir_all(out).map_err(|source| Error::Write {
        path: out.to_owned(),
        source,
    })?;
    let pause = out.join("pause.tar");
    write_archive(&pause_image(binaries.pause)?, &pause)?;
    let runner = out.join("runner.tar");
    write_archive(&runner_image(binaries.runner)?, &runner)?;
    let project = match binaries.project {
        Some((manager, listener)) => {
            let path = out.join("project.tar");
            write_archive(&project_image(manager, listener)?, &path)?;
            Some(path)
        }
        None => None,
    };
    Ok(Archives {
        pause,
        runner,
        project,
    })
}
