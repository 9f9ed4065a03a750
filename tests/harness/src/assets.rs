//! Where the upstream binaries live: envtest's `KUBEBUILDER_ASSETS` convention, with the project's cache as the
//! default so a plain `cargo test` works once `tests/env/provision.sh` has run.

use std::path::{Path, PathBuf};

use crate::Error;

/// Kubernetes release the provisioning script builds; keep in step with `tests/env/provision.sh`.
pub const K8S_VERSION: &str = "v1.36.3";

/// The command that builds the binaries, named in every "missing binary" error.
pub const PROVISION_COMMAND: &str = "tests/env/provision.sh";

/// Directory holding `etcd`, `kube-apiserver`, `kube-controller-manager` and `helm`.
pub fn assets_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("KUBEBUILDER_ASSETS").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    default_cache_dir().join(format!("k8s-{K8S_VERSION}"))
}

fn default_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("ARC_RS_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from(".cache"));
    base.join("arc-rs")
}

/// Path of one provisioned binary, or an error naming the command that provisions it.
pub fn binary(name: &str) -> Result<PathBuf, Error> {
    let dir = assets_dir();
    let path = dir.join(name);
    if is_executable(&path) {
        Ok(path)
    } else {
        Err(Error::MissingBinary {
            name: name.to_owned(),
            dir,
        })
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    path.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_binary_names_the_provisioning_command() {
        let err = binary("definitely-not-a-provisioned-binary").unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains(PROVISION_COMMAND), "{msg}");
        assert!(msg.contains("definitely-not-a-provisioned-binary"), "{msg}");
    }
}
