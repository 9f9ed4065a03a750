//! What the real-node tier needs on the host, and the tier's gate: run, skip loudly, or (in CI) fail.

use std::path::{Path, PathBuf};

use crate::assets;

/// Where the CNI plugins may be (Debian's `containernetworking-plugins` uses the first); keep in step with
/// `tests/env/provision-node.sh`.
pub const CNI_DIRS: &[&str] = &["/usr/lib/cni", "/opt/cni/bin"];
/// The command that installs the runtime parts.
pub const PROVISION_NODE_COMMAND: &str = "tests/env/provision-node.sh";

/// Where each host part of a node is.
#[derive(Debug, Clone)]
pub struct NodeParts {
    pub containerd: PathBuf,
    pub ctr: PathBuf,
    pub runc: PathBuf,
    pub cni_bin_dir: PathBuf,
    pub kubelet: PathBuf,
    pub kube_scheduler: PathBuf,
}

/// Finds every part, or says what is missing (one entry per missing part, with how to get it).
pub fn node_parts() -> Result<NodeParts, Vec<String>> {
    let mut missing = Vec::new();
    if !is_root(&std::fs::read_to_string("/proc/self/status").unwrap_or_default()) {
        missing.push("root: the kubelet and containerd run as root".to_owned());
    }
    let mut find = |name: &str, package: &str| {
        let found = which(name);
        if found.is_none() {
            missing.push(format!(
                "`{name}` (Debian package {package}; {PROVISION_NODE_COMMAND} installs it as root)"
            ));
        }
        found.unwrap_or_default()
    };
    let containerd = find("containerd", "containerd");
    let ctr = find("ctr", "containerd");
    let runc = find("runc", "runc");
    let cni_bin_dir = CNI_DIRS.iter().map(PathBuf::from).find(|dir| {
        ["bridge", "loopback", "host-local"]
            .iter()
            .all(|p| dir.join(p).is_file())
    });
    if cni_bin_dir.is_none() {
        missing.push(format!(
            "the CNI plugins in one of {CNI_DIRS:?} (Debian package containernetworking-plugins; \
             {PROVISION_NODE_COMMAND} installs it as root)"
        ));
    }
    let mut asset = |name: &str| match assets::binary(name) {
        Ok(path) => path,
        Err(error) => {
            missing.push(error.to_string());
            PathBuf::new()
        }
    };
    let kubelet = asset("kubelet");
    let kube_scheduler = asset("kube-scheduler");
    if missing.is_empty() {
        Ok(NodeParts {
            containerd,
            ctr,
            runc,
            cni_bin_dir: cni_bin_dir.unwrap_or_default(),
            kubelet,
            kube_scheduler,
        })
    } else {
        Err(missing)
    }
}

/// Whether `/proc/self/status` (its text) says the effective user is root.
pub fn is_root(status: &str) -> bool {
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        == Some("0")
}

fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|candidate| is_executable(candidate))
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// What the tier does without its parts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    Run,
    /// Skip, with the message printed.
    Skip(String),
    /// CI must run the tier: fail, with this message.
    Fail(String),
}

/// The decision, from what is missing and whether this is CI (`CI=true`).
pub fn gate(test: &str, missing: &[String], ci: bool) -> Gate {
    if missing.is_empty() {
        return Gate::Run;
    }
    let list = missing.join("\n  - ");
    if ci {
        Gate::Fail(format!(
            "real-node tier: {test}: CI=true, so the tier must run, but it is missing:\n  - {list}"
        ))
    } else {
        Gate::Skip(format!(
            "SKIPPED: real-node tier: {test}: missing:\n  - {list}\n\
             Run `{PROVISION_NODE_COMMAND}` as root (and `{}`), then run the tier as root.",
            assets::PROVISION_COMMAND
        ))
    }
}

/// The tier's gate for one test: `Some(parts)` to run; `None` after printing a loud skip message; panics in
/// CI (`CI=true`) when a part is missing.
pub fn node_tier(test: &str) -> Option<NodeParts> {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    match node_parts() {
        Ok(parts) => Some(parts),
        Err(missing) => match gate(test, &missing, ci) {
            Gate::Run => None,
            Gate::Skip(message) => {
                // Straight to the process's stderr: libtest captures `eprintln!` of a passing test, which
                // would make the skip silent.
                use std::io::Write;
                let frame = "*".repeat(78);
                let _ = writeln!(std::io::stderr(), "\n{frame}\n{message}\n{frame}\n");
                None
            }
            Gate::Fail(message) => panic!("{message}"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_read_from_the_effective_uid() {
        assert!(is_root("Name:\tx\nUid:\t0\t0\t0\t0\n"));
        assert!(!is_root("Uid:\t1000\t1000\t1000\t1000\n"));
        // Real uid root, effective not: not root.
        assert!(!is_root("Uid:\t0\t1000\t0\t0\n"));
        assert!(!is_root(""));
    }

    #[test]
    fn missing_parts_skip_loudly_outside_ci_and_fail_in_ci() {
        assert_eq!(gate("t", &[], true), Gate::Run);
        let missing = vec!["`runc`".to_owned()];
        match gate("t", &missing, false) {
            Gate::Skip(message) => {
                assert!(message.starts_with("SKIPPED: real-node tier"), "{message}");
                assert!(message.contains("runc") && message.contains(PROVISION_NODE_COMMAND));
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(gate("t", &missing, true), Gate::Fail(m) if m.contains("CI=true")));
    }
}
