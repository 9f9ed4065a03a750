//! What the release workflow (`.github/workflows/release.yml`) relies on, checked without a registry: both charts
//! package, one version names the crates and both charts, and a chart installed from a checkout warns that its
//! default image may not exist. The workflow itself is linted by `tests/run.sh` (actionlint).

use std::path::Path;
use std::process::Command;

use chart_tests::{Chart, repo_root, run_helm};

#[test]
fn the_crates_and_both_charts_name_one_version() {
    let output = Command::new("bash")
        .arg(repo_root().join("tests/env/check-release-versions.sh"))
        .output()
        .expect("run check-release-versions.sh");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn both_charts_package() {
    let dir = tempfile::tempdir().expect("temp dir");
    for chart in [Chart::Controller, Chart::ScaleSet] {
        let out = run_helm([
            "package".into(),
            chart.path().into_os_string(),
            "--destination".into(),
            dir.path().as_os_str().to_owned(),
        ])
        .unwrap_or_else(|e| panic!("helm package {}: {e}", chart.name()));
        assert!(out.contains("Successfully packaged"), "{out}");
    }
    let packaged = std::fs::read_dir(dir.path()).expect("read dir").count();
    assert_eq!(packaged, 2);
}

/// The controller chart's NOTES as `helm install` would print them: `helm template` leaves NOTES.txt out, so a
/// copy of the chart renders them into a ConfigMap.
fn notes(values: &[&str], released: bool) -> String {
    let dir = tempfile::tempdir().expect("temp dir");
    let copy = dir.path().join("chart");
    copy_dir(&Chart::Controller.path(), &copy);
    let notes = std::fs::read_to_string(copy.join("templates/NOTES.txt")).expect("NOTES.txt");
    std::fs::write(
        copy.join("templates/_notes_probe.tpl"),
        format!("{{{{- define \"notes-probe\" -}}}}\n{notes}\n{{{{- end -}}}}\n"),
    )
    .expect("write the probe's template");
    std::fs::write(
        copy.join("templates/notes_probe.yaml"),
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes-probe\ndata:\n  notes: {{ include \"notes-probe\" . | quote }}\n",
    )
    .expect("write the probe");
    if released {
        let file = copy.join("Chart.yaml");
        let text = std::fs::read_to_string(&file).expect("Chart.yaml");
        std::fs::write(
            &file,
            text.replace(
                "arc-rs.io/released: \"false\"",
                "arc-rs.io/released: \"true\"",
            ),
        )
        .expect("mark released");
    }
    let mut args: Vec<String> = [
        "template",
        "arc",
        copy.to_str().expect("path"),
        "--show-only",
        "templates/notes_probe.yaml",
    ]
    .map(str::to_owned)
    .to_vec();
    for value in values {
        args.push("--set".to_owned());
        args.push((*value).to_owned());
    }
    let out = run_helm(args).expect("render the NOTES");
    let probe: serde_json::Value = serde_saphyr::from_str(&out).expect("the probe ConfigMap");
    probe["data"]["notes"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("create dir");
    for entry in std::fs::read_dir(from).expect("read dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.file_type().expect("file type").is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

#[test]
fn a_chart_from_a_checkout_warns_that_its_default_image_may_not_exist() {
    let warning = "WARNING: this chart was installed from a checkout";
    assert!(notes(&[], false).contains(warning));
    assert!(
        !notes(&["image.tag=built-here"], false).contains(warning),
        "an image of the user's own"
    );
    assert!(
        !notes(&["image.repository=registry.example/arc"], false).contains(warning),
        "an image of the user's own"
    );
    assert!(!notes(&[], true).contains(warning), "a released chart");
}
