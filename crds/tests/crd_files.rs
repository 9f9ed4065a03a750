//! The CRD files committed in the controller chart must be exactly what the Rust types render to.

use std::fs;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use pretty_assertions::assert_eq;

const REGENERATE: &str =
    "UPDATE_CRDS=1 cargo test -p crds --test crd_files   (or: cargo run -p crds --bin crdgen)";

#[test]
fn committed_crd_files_match_the_rust_types() {
    let dir = crds::workspace_crd_dir();
    if std::env::var_os("UPDATE_CRDS").is_some() {
        crds::write_all(&dir).expect("write the CRD files");
    }
    let drift = crds::check_dir(&dir).expect("read the CRD files");
    assert!(
        drift.is_empty(),
        "the CRD files in {} do not match the Rust types in crds/src \
         (missing: {:?}, changed: {:?}, unexpected: {:?}).\nRegenerate them with:\n    {REGENERATE}",
        dir.display(),
        drift.missing,
        drift.changed,
        drift.unexpected,
    );
}

#[test]
fn rendered_yaml_reads_back_as_the_same_crds() {
    for (crd, (name, yaml)) in crds::all_crds()
        .into_iter()
        .zip(crds::render_all().expect("render"))
    {
        assert_eq!(
            name,
            format!("actions.github.com_{}.yaml", crd.spec.names.plural)
        );
        assert!(
            yaml.starts_with("---\n# Generated"),
            "{name} starts with the generated-file header"
        );
        let parsed: CustomResourceDefinition = serde_saphyr::from_str(&yaml).expect("valid YAML");
        assert_eq!(parsed, crd, "{name}");
    }
}

#[test]
fn check_dir_reports_every_kind_of_drift() {
    let dir = tempfile::tempdir().expect("temp dir");
    let missing = crds::check_dir(dir.path()).expect("check");
    assert_eq!(missing.missing.len(), 4);
    assert!(!missing.is_empty());

    let written = crds::write_all(dir.path()).expect("write");
    assert_eq!(written.len(), 4);
    assert!(crds::check_dir(dir.path()).expect("check").is_empty());

    // A hand edit, a deleted file and a stray file are all reported.
    let edited = &written[0];
    let content = fs::read_to_string(edited).expect("read");
    fs::write(edited, content.replace("type: integer", "type: string")).expect("edit");
    fs::remove_file(&written[3]).expect("remove");
    fs::write(dir.path().join("stray.yaml"), "kind: ConfigMap\n").expect("stray");
    fs::write(dir.path().join("README.md"), "not a manifest\n").expect("non-yaml");

    let drift = crds::check_dir(dir.path()).expect("check");
    let file_name = |path: &std::path::Path| {
        path.file_name()
            .expect("file")
            .to_string_lossy()
            .into_owned()
    };
    assert_eq!(drift.changed, [file_name(edited)]);
    assert_eq!(drift.missing, [file_name(&written[3])]);
    assert_eq!(drift.unexpected, ["stray.yaml"]);
}
