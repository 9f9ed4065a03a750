//! The project's own binaries (the listener, the manager, the fake Actions Service) for tests that run them as
//! processes.
//!
//! Cargo builds a package's binaries only for that package's own integration tests, so a test of another
//! package asks cargo for the binary itself. It asks for what `cargo test --workspace` builds (every lib, bin and
//! test target of the workspace): feature unification is per invocation, so a narrower `cargo build -p x` would
//! resolve different dependency features and rebuild half the dependency graph (minutes on a small machine),
//! while this is a no-op after `cargo test --workspace`. The path comes from cargo's JSON messages, so
//! `CARGO_TARGET_DIR` and profiles just work.

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
    // One build per binary per test process; concurrent tests wait for it.
    static BUILT: OnceLock<Mutex<Vec<(String, PathBuf)>>> = OnceLock::new();
    let built = BUILT.get_or_init(Mutex::default);
    let mut built = built.lock().unwrap_or_else(|p| p.into_inner());
    let key = format!("{package}/{bin}");
    if let Some((_, path)) = built.iter().find(|(k, _)| *k == key) {
        return Ok(path.clone());
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut cmd = Command::new(&cargo);
    cmd.args([
        "build",
        "--message-format=json",
        "--workspace",
        "--lib",
        "--bins",
    ]);
    // A release caller is a benchmark (`cargo build --release --workspace --lib --bins` first makes this a
    // no-op); only debug callers are tests, whose `cargo test` also built the test targets.
    if cfg!(debug_assertions) {
        cmd.arg("--tests");
    } else {
        cmd.arg("--release");
    }
    let output = cmd.output().map_err(|source| Error::StartProcess {
        name: format!("{cargo} build --workspace (for {package}/{bin})"),
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
