//! The four CRDs as Kubernetes objects and as the YAML files shipped in the controller chart.

use std::path::{Path, PathBuf};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_core::CustomResourceExt;

use crate::{
    AutoscalingListener, AutoscalingRunnerSet, EphemeralRunner, EphemeralRunnerSet, Error, schema,
};

/// Where the generated CRD files live, relative to the workspace root.
pub const CRD_DIR: &str = "charts/gha-runner-scale-set-controller/crds";

/// Comment at the top of every generated file's document (inside it, after `---`, so tools that split YAML
/// streams never see a comment-only document).
const HEADER: &str = "# Generated from the Rust types in crds/src by `cargo run -p crds --bin crdgen`. Do not edit.\n";

/// The CRD of `K` as it is installed: kube's derived CRD with the schema finalized ([`schema::finalize`]), the
/// root `apiVersion`/`kind`/`metadata` properties declared, and `listKind` set (the API server would default it,
/// but ARC's files state it and tools compare files).
pub fn crd<K: CustomResourceExt>() -> CustomResourceDefinition {
    let mut crd = K::crd();
    let kind = crd.spec.names.kind.clone();
    crd.spec.names.list_kind = Some(format!("{kind}List"));
    for version in &mut crd.spec.versions {
        if let Some(schema) = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
        {
            schema::add_root_properties(schema);
            schema::finalize(schema);
        }
    }
    crd
}

/// The four CRDs, in the order AutoscalingRunnerSet, AutoscalingListener, EphemeralRunnerSet, EphemeralRunner.
pub fn all_crds() -> Vec<CustomResourceDefinition> {
    vec![
        crd::<AutoscalingRunnerSet>(),
        crd::<AutoscalingListener>(),
        crd::<EphemeralRunnerSet>(),
        crd::<EphemeralRunner>(),
    ]
}

/// File name of a CRD, as ARC names them: `<group>_<plural>.yaml`.
pub fn crd_file_name(crd: &CustomResourceDefinition) -> String {
    format!("{}_{}.yaml", crd.spec.group, crd.spec.names.plural)
}

/// A CRD as the YAML document written to its file (`---`, a header comment, then the object).
pub fn render_crd(crd: &CustomResourceDefinition) -> Result<String, Error> {
    let yaml = serde_saphyr::to_string(crd).map_err(|source| Error::RenderCrd {
        name: crd.metadata.name.clone().unwrap_or_default(),
        source,
    })?;
    Ok(format!("---\n{HEADER}{yaml}"))
}

/// Every CRD file: `(file name, content)`.
pub fn render_all() -> Result<Vec<(String, String)>, Error> {
    all_crds()
        .iter()
        .map(|crd| Ok((crd_file_name(crd), render_crd(crd)?)))
        .collect()
}

/// The CRD directory of this workspace (resolved from this crate's location at build time).
pub fn workspace_crd_dir() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    // The crate lives directly under the workspace root.
    let workspace = manifest_dir.parent().unwrap_or(manifest_dir);
    workspace.join(CRD_DIR)
}

/// Writes every CRD file into `dir` (created if missing) and returns the paths written.
pub fn write_all(dir: &Path) -> Result<Vec<PathBuf>, Error> {
    std::fs::create_dir_all(dir).map_err(|source| Error::WriteCrdFile {
        path: dir.to_owned(),
        source,
    })?;
    render_all()?
        .into_iter()
        .map(|(name, content)| {
            let path = dir.join(name);
            std::fs::write(&path, content).map_err(|source| Error::WriteCrdFile {
                path: path.clone(),
                source,
            })?;
            Ok(path)
        })
        .collect()
}

/// How the files in a directory differ from the rendered CRDs.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Drift {
    /// Generated files that are missing from the directory.
    pub missing: Vec<String>,
    /// Files whose content differs from the rendered CRD.
    pub changed: Vec<String>,
    /// YAML files in the directory that no CRD renders to.
    pub unexpected: Vec<String>,
}

impl Drift {
    /// Whether the directory matches the rendered CRDs exactly.
    pub fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.changed.is_empty() && self.unexpected.is_empty()
    }
}

/// Compares `dir` with the rendered CRDs.
pub fn check_dir(dir: &Path) -> Result<Drift, Error> {
    let read_error = |path: &Path| {
        let path = path.to_owned();
        move |source| Error::ReadCrdFile { path, source }
    };
    let rendered = render_all()?;
    let mut drift = Drift::default();
    for (name, content) in &rendered {
        let path = dir.join(name);
        match std::fs::read_to_string(&path) {
            Ok(on_disk) if on_disk == *content => {}
            Ok(_) => drift.changed.push(name.clone()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                drift.missing.push(name.clone())
            }
            Err(err) => return Err(read_error(&path)(err)),
        }
    }
    if dir.is_dir() {
        for entry in std::fs::read_dir(dir).map_err(read_error(dir))? {
            let name = entry
                .map_err(read_error(dir))?
                .file_name()
                .to_string_lossy()
                .into_owned();
            let is_yaml = name.ends_with(".yaml") || name.ends_with(".yml");
            if is_yaml
                && !rendered
                    .iter()
                    .any(|(rendered_name, _)| *rendered_name == name)
            {
                drift.unexpected.push(name);
            }
        }
    }
    drift.unexpected.sort();
    Ok(drift)
}
