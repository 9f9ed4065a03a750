//! The helm the chart tests use renders like a released helm. Without `--kube-version`, `helm template` (and
//! `helm lint`) assume the Kubernetes version helm was linked with: a released helm links its client
//! libraries' version; one built without the release's link flags assumes v1.20, and every chart that branches
//! on the version renders its oldest layout. `tests/env/provision.sh` builds helm with those flags.

use chart_tests::run_helm;

/// `.Capabilities.KubeVersion` as `helm template` sees it with no cluster and no `--kube-version`.
fn default_kube_version() -> String {
    let chart = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        chart.path().join("Chart.yaml"),
        "apiVersion: v2\nname: kube-version-probe\nversion: 0.1.0\n",
    )
    .expect("Chart.yaml");
    std::fs::create_dir(chart.path().join("templates")).expect("templates dir");
    std::fs::write(
        chart.path().join("templates/probe.yaml"),
        "kubeVersion: {{ .Capabilities.KubeVersion.Version | quote }}\n",
    )
    .expect("template");
    let output = run_helm([
        "template".as_ref(),
        "probe".as_ref(),
        chart.path().as_os_str(),
    ])
    .unwrap_or_else(|e| panic!("{e}"));
    output
        .lines()
        .find_map(|line| line.strip_prefix("kubeVersion: "))
        .unwrap_or_else(|| panic!("no kubeVersion line in:\n{output}"))
        .trim_matches('"')
        .to_owned()
}

#[test]
fn helm_assumes_the_kubernetes_version_of_its_release() {
    let version = default_kube_version();
    let minor: u32 = version
        .strip_prefix("v1.")
        .and_then(|rest| rest.split('.').next())
        .and_then(|minor| minor.parse().ok())
        .unwrap_or_else(|| panic!("unexpected version {version:?}"));
    // helm v3.22.0 links Kubernetes 1.37; any helm of the last years is past native sidecars (1.29).
    assert!(
        minor >= 29,
        "helm assumes Kubernetes {version}: it was built without the release's version link flags; \
         rebuild it with tests/env/provision.sh"
    );
}
