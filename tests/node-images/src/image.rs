//! docker-archive tarballs (what `docker save` writes and `ctr images import` reads): one layer, its config,
//! and a `manifest.json` naming the image.

use serde_json::json;

use crate::Result;
use crate::tar::{self, Entry};

/// One single-layer image.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    /// Full reference, e.g. `docker.io/arc-rs/runner:test`; containerd stores the image under this name.
    pub reference: String,
    pub entrypoint: Vec<String>,
    /// `uid:gid`, or empty for root.
    pub user: String,
    pub env: Vec<String>,
    /// The root filesystem.
    pub entries: Vec<Entry>,
}

/// Hex SHA-256.
pub fn sha256_hex(bytes: &[u8]) -> String {
    aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The image config (the OCI/Docker image configuration JSON) for a layer with digest `diff_id`.
pub fn config_json(spec: &ImageSpec, diff_id: &str) -> serde_json::Value {
    json!({
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "Entrypoint": spec.entrypoint,
            "User": spec.user,
            "Env": spec.env,
            "WorkingDir": "/",
        },
        "rootfs": {"type": "layers", "diff_ids": [format!("sha256:{diff_id}")]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "arc-rs node-images"}],
    })
}

/// The docker-archive tarball of `spec`.
pub fn docker_archive(spec: &ImageSpec) -> Result<Vec<u8>> {
    let layer = tar::archive(&spec.entries)?;
    let diff_id = sha256_hex(&layer);
    let config = config_json(spec, &diff_id).to_string().into_bytes();
    let config_name = format!("{}.json", sha256_hex(&config));
    let layer_path = format!("{diff_id}/layer.tar");
    let manifest = json!([{
        "Config": config_name,
        "RepoTags": [spec.reference],
        "Layers": [layer_path],
    }])
    .to_string()
    .into_bytes();
    let file = |path: String, contents: Vec<u8>| Entry::File {
        path,
        mode: 0o644,
        uid: 0,
        gid: 0,
        contents,
    };
    tar::archive(&[
        Entry::Dir {
            path: diff_id.clone(),
            mode: 0o755,
        },
        file(layer_path, layer),
        file(config_name, config),
        file("manifest.json".to_owned(), manifest),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn sha256_matches_the_known_digest() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn the_archive_names_its_layer_by_digest_and_the_manifest_names_the_image() {
        let spec = ImageSpec {
            reference: "docker.io/arc-rs/x:test".to_owned(),
            entrypoint: vec!["/x".to_owned()],
            user: "65532:65532".to_owned(),
            env: vec!["PATH=/".to_owned()],
            entries: vec![Entry::File {
                path: "x".into(),
                mode: 0o755,
                uid: 0,
                gid: 0,
                contents: b"#!x".to_vec(),
            }],
        };
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("image.tar");
        std::fs::write(&file, docker_archive(&spec).unwrap()).unwrap();
        let status = Command::new("tar")
            .arg("-xf")
            .arg(&file)
            .arg("-C")
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(status.success());
        let manifest: serde_json::Value =
            serde_json::from_slice(&std::fs::read(dir.path().join("manifest.json")).unwrap())
                .unwrap();
        assert_eq!(manifest[0]["RepoTags"][0], "docker.io/arc-rs/x:test");
        let layer_path = manifest[0]["Layers"][0].as_str().unwrap();
        let layer = std::fs::read(dir.path().join(layer_path)).unwrap();
        let config: serde_json::Value = serde_json::from_slice(
            &std::fs::read(dir.path().join(manifest[0]["Config"].as_str().unwrap())).unwrap(),
        )
        .unwrap();
        assert_eq!(
            config["rootfs"]["diff_ids"][0],
            format!("sha256:{}", sha256_hex(&layer))
        );
        assert_eq!(config["config"]["User"], "65532:65532");
        assert_eq!(config["config"]["Entrypoint"][0], "/x");
    }
}
