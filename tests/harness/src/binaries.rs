//! The project's own binaries (the listener, the manager, the fake Actions Service) for tests that run them as
//! processes.
//!
//! Cargo builds a package's binaries only for that package's own integration tests, so a test of another
//! package asks cargo for the binary itself. It asks for what `cargo test --workspace` builds (every lib, bin and
//! test target of the workspace): feature unification is per invocation, so a narrower `cargo build -p x` would
//! resolve different dependency features and rebuild half the dependency graph (minutes on a small machine),
//! while this is a no-op after `cargo test --workspace`. The path comes from cargo's JSON messages, so
//! `CARGO_TARGET_DIR` and profiles just work.
//!
//! A release caller is a benchmark. It gets the binaries the project image ships (the manager and the listener)
//! built exactly as the Dockerfile builds them: the `dist` profile (whole-program optimisation, which takes a
//! quarter off the code a process keeps resident) and the same packages, so the memory and CPU a benchmark
//! reports are the image's. Any other binary comes from the workspace's release build.

use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, OnceLock};

use crate::Error;

/// A directory of binaries built beforehand. When set, a binary is taken from there and cargo is not asked:
/// `tests/demo.sh` builds just the binaries the demo runs, which takes a fraction of building every test target.
pub const PREBUILT_BIN_DIR_ENV: &str = "ARC_RS_BIN_DIR";

/// Builds (if needed) binary `bin` of workspace package `package` and returns its path; with
/// [`PREBUILT_BIN_DIR_ENV`] set, the binary of that name in that directory instead.
pub fn workspace_binary(package: &str, bin: &str) -> Result<PathBuf, Error> {
    if let Some(prebuilt) = prebuilt_binary(std::env::var_os(PREBUILT_BIN_DIR_ENV), bin) {
        return prebuilt;
    }
    build_once(
        package,
        bin,
        build_args(package, bin, cfg!(debug_assertions)),
    )
}

/// Runs `cargo` with `args` (a build with JSON messages) once per process for each distinct `args`, and returns
/// where it put binary `bin` of `package`; concurrent callers wait for the build.
fn build_once(package: &str, bin: &str, args: Vec<&'static str>) -> Result<PathBuf, Error> {
    static BUILT: OnceLock<Mutex<Vec<(String, PathBuf)>>> = OnceLock::new();
    let built = BUILT.get_or_init(Mutex::default);
    let mut built = built.lock().unwrap_or_else(|p| p.into_inner());
    let key = format!("{package}/{bin} {}", args.join(" "));
    if let Some((_, path)) = built.iter().find(|(k, _)| *k == key) {
        return Ok(path.clone());
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let output = Command::new(&cargo)
        .args(&args)
        .output()
        .map_err(|source| Error::StartProcess {
            name: format!("{cargo} {} (for {package}/{bin})", args.join(" ")),
            source,
        })?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let path = stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|msg| {
            // `--tests` also builds each binary's unit-test harness under the same target name; only the real
            // binary will do.
            msg["reason"] == "compiler-artifact"
                && msg["target"]["name"] == bin
                && msg["target"]["kind"]
                    .as_array()
                    .is_some_and(|kinds| kinds.iter().any(|k| k == "bin"))
                && msg["profile"]["test"] == false
                && msg["package_id"]
                    .as_str()
                    .is_some_and(|id| id.contains(package))
        })
        .find_map(|msg| msg["executable"].as_str().map(PathBuf::from));
    match path {
        Some(path) if output.status.success() => {
            built.push((key, path.clone()));
            Ok(path)
        }
        _ => Err(Error::BuildBinary {
            package: package.to_owned(),
            bin: bin.to_owned(),
            stderr: String::from_utf8_lossy(&output.stderr)
                .lines()
                .rev()
                .take(30)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
                .join("\n"),
        }),
    }
}

/// The binaries of the project image, by package and name.
pub const SHIPPED_BINARIES: [(&str, &str); 2] =
    [("controller", "manager"), ("listener", "listener")];

/// The cargo profile the image is built with (`[profile.dist]` in the workspace's Cargo.toml).
pub const SHIPPED_PROFILE: &str = "dist";

/// What the Dockerfile passes to `cargo build`: the shipped binaries, in the shipped profile.
pub fn shipped_build_args() -> Vec<&'static str> {
    let mut args = vec!["--profile", SHIPPED_PROFILE, "--locked"];
    for (package, bin) in SHIPPED_BINARIES {
        args.extend(["-p", package, "--bin", bin]);
    }
    args
}

/// The `cargo` arguments that build binary `bin` of `package` for a debug caller (a test: everything `cargo test
/// --workspace` builds, so nothing is built twice) or a release one (a benchmark: a shipped binary as the image
/// has it, any other from the workspace's release build, which `cargo build --release --workspace --lib --bins`
/// beforehand makes a no-op).
fn build_args(package: &str, bin: &str, debug: bool) -> Vec<&'static str> {
    let mut args = vec!["build", "--message-format=json"];
    if !debug && SHIPPED_BINARIES.contains(&(package, bin)) {
        args.extend(shipped_build_args());
    } else {
        let profile = if debug { "--tests" } else { "--release" };
        args.extend(["--workspace", "--lib", "--bins", profile]);
    }
    args
}

/// `bin` in the prebuilt directory `dir` (the value of [`PREBUILT_BIN_DIR_ENV`]), or `None` when no directory is
/// set. A directory without the binary is an error rather than a silent, slow build of every test target.
fn prebuilt_binary(dir: Option<std::ffi::OsString>, bin: &str) -> Option<Result<PathBuf, Error>> {
    let path = PathBuf::from(dir.filter(|d| !d.is_empty())?).join(bin);
    Some(if path.is_file() {
        Ok(path)
    } else {
        Err(Error::PrebuiltBinaryMissing { path })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_benchmark_gets_the_shipped_binaries_as_the_image_has_them() {
        for (package, bin) in SHIPPED_BINARIES {
            let args = build_args(package, bin, false);
            assert!(
                args.windows(2).any(|w| w == ["--profile", "dist"]),
                "{args:?}"
            );
            assert!(!args.contains(&"--workspace"), "{args:?}");
        }
        let other = build_args("fake-actions-service", "fake-actions-service", false);
        assert!(
            other.contains(&"--release") && other.contains(&"--workspace"),
            "{other:?}"
        );
        let test = build_args("controller", "manager", true);
        assert!(
            test.contains(&"--tests") && !test.contains(&"--release"),
            "{test:?}"
        );
    }

    #[test]
    fn the_dockerfile_builds_what_a_benchmark_measures() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Dockerfile");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let build = text
            .lines()
            .find_map(|line| line.trim().strip_prefix("cargo build "))
            .expect("the Dockerfile runs `cargo build`");
        let args: Vec<&str> = build
            .split_whitespace()
            .take_while(|a| *a != "\\")
            .collect();
        assert_eq!(
            args,
            shipped_build_args(),
            "the Dockerfile's `cargo build` line"
        );
        // The image cross-compiles for its platform (`--target`, on the line after): the same profile and
        // packages, built for another triple.
        let copied = format!("/{SHIPPED_PROFILE}/manager\"");
        assert!(text.contains(&copied), "the Dockerfile copies {copied}");
    }

    #[test]
    fn prebuilt_directory_is_used_only_when_set_and_must_hold_the_binary() {
        assert!(prebuilt_binary(None, "listener").is_none());
        assert!(prebuilt_binary(Some("".into()), "listener").is_none());
        let dir = tempfile::tempdir().expect("temp dir");
        let missing = prebuilt_binary(Some(dir.path().into()), "listener")
            .expect("a directory is set")
            .expect_err("no listener in it");
        assert!(
            missing.to_string().contains(PREBUILT_BIN_DIR_ENV),
            "{missing}"
        );
        std::fs::write(dir.path().join("listener"), b"").expect("write");
        let found = prebuilt_binary(Some(dir.path().into()), "listener")
            .expect("a directory is set")
            .expect("found");
        assert_eq!(found, dir.path().join("listener"));
    }
}
