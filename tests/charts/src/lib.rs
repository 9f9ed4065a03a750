//! Helpers to render the charts with a real `helm` and inspect the objects.
//!
//! The render tests in `tests/` use them, and so can tests that install the charts into a live
//! control plane: [`helm`] finds the binary the same way everywhere, [`Template`] runs
//! `helm template`, and [`Manifests`] gives access to the rendered objects as JSON.

use std::env;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use serde_json::Value;

/// The Kubernetes version charts are rendered for unless a test picks another: the control plane's
/// own, which the tests run the controllers against and whose assets directory holds `helm`, so a
/// render is what an install on that cluster gets.
pub const KUBE_VERSION: &str = test_harness::K8S_VERSION;

/// A version before native sidecars (Kubernetes 1.29), for the templates that branch on it: the
/// `dind` container mode runs dockerd as a plain container there instead of an init container
/// with `restartPolicy: Always`.
pub const PRE_SIDECAR_KUBE_VERSION: &str = "v1.28.0";

/// The oldest version the charts' `kubeVersion` admits.
pub const OLDEST_KUBE_VERSION: &str = "v1.27.0";

/// Everything that can go wrong while finding helm, running it, or reading its output.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(
        "no helm binary found: looked at $HELM, $KUBEBUILDER_ASSETS/helm, {} and PATH; \
         run tests/env/provision.sh to build it",
        cached.display()
    )]
    FindHelm { cached: PathBuf },

    #[error("HELM is set to {}, which does not exist", path.display())]
    FindHelmFromEnv { path: PathBuf },

    #[error("could not start {}", helm.display())]
    RunHelm {
        helm: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("`helm {args}` failed ({status}):\n{stderr}")]
    HelmFailed {
        args: String,
        status: ExitStatus,
        stderr: String,
    },

    #[error("could not write a values file")]
    WriteValues(#[source] std::io::Error),

    #[error("could not parse the output of `helm {args}` as YAML")]
    ParseManifests {
        args: String,
        #[source]
        source: Box<serde_saphyr::Error>,
    },

    #[error("`helm {args}` succeeded, but a failure was expected")]
    HelmSucceeded { args: String },

    #[error("no {kind} named {name} among the rendered objects: {present:?}")]
    FindObject {
        kind: String,
        name: String,
        present: Vec<String>,
    },
}

impl Error {
    /// Helm's error output when helm ran and failed, e.g. a chart's `fail` message.
    pub fn helm_stderr(&self) -> Option<&str> {
        match self {
            Error::HelmFailed { stderr, .. } => Some(stderr),
            _ => None,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The helm binary: `$HELM` if set, else `$KUBEBUILDER_ASSETS/helm`, else the provisioned cache
/// (`~/.cache/arc-rs/k8s-v1.36.3/helm`, honouring `ARC_RS_CACHE` and `XDG_CACHE_HOME` as
/// `tests/env/provision.sh` does), else `helm` on `PATH`.
///
/// Fails rather than letting callers skip: a missing helm must not look like passing tests.
pub fn helm() -> Result<PathBuf> {
    if let Some(path) = env::var_os("HELM").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(Error::FindHelmFromEnv { path })
        };
    }
    if let Some(assets) = env::var_os("KUBEBUILDER_ASSETS").filter(|p| !p.is_empty()) {
        let path = Path::new(&assets).join("helm");
        if path.is_file() {
            return Ok(path);
        }
    }
    let cached = provisioned_helm();
    if cached.is_file() {
        return Ok(cached);
    }
    env::var_os("PATH")
        .iter()
        .flat_map(env::split_paths)
        .map(|dir| dir.join("helm"))
        .find(|path| path.is_file())
        .ok_or(Error::FindHelm { cached })
}

fn provisioned_helm() -> PathBuf {
    let non_empty = |name: &str| {
        env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    let cache_root = non_empty("ARC_RS_CACHE").unwrap_or_else(|| {
        non_empty("XDG_CACHE_HOME")
            .or_else(|| non_empty("HOME").map(|home| home.join(".cache")))
            .unwrap_or_else(|| PathBuf::from(".cache"))
            .join("arc-rs")
    });
    cache_root
        .join(format!("k8s-{}", test_harness::K8S_VERSION))
        .join("helm")
}

/// The two charts of this repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Chart {
    Controller,
    ScaleSet,
}

impl Chart {
    pub fn name(self) -> &'static str {
        match self {
            Chart::Controller => "gha-runner-scale-set-controller",
            Chart::ScaleSet => "gha-runner-scale-set",
        }
    }

    /// The chart's directory in this repository.
    pub fn path(self) -> PathBuf {
        repo_root().join("charts").join(self.name())
    }
}

/// The repository root, found from this crate's location (`tests/charts`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Runs helm with `args` and returns its standard output.
pub fn run_helm<I, S>(args: I) -> Result<String>
where
    I: IntoIterator<Item = S>,
    S: Into<OsString>,
{
    let helm = helm()?;
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let output = Command::new(&helm)
        .args(&args)
        .output()
        .map_err(|source| Error::RunHelm {
            helm: helm.clone(),
            source,
        })?;
    if !output.status.success() {
        return Err(Error::HelmFailed {
            args: display_args(&args),
            status: output.status,
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn display_args(args: &[OsString]) -> String {
    args.iter()
        .map(|a| a.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ")
}

/// `helm lint` of a chart with the given values files; returns helm's report.
pub fn lint(chart: Chart, values_files: &[PathBuf]) -> Result<String> {
    let mut args: Vec<OsString> = vec!["lint".into(), "--strict".into(), chart.path().into()];
    for file in values_files {
        args.push("--values".into());
        args.push(file.into());
    }
    run_helm(args)
}

/// Renders `chart` as release `release` in `namespace` with `values` (a JSON object), for
/// [`KUBE_VERSION`], and returns the rendered objects.
pub fn render(chart: Chart, release: &str, namespace: &str, values: &Value) -> Result<Vec<Value>> {
    Template::new(chart)
        .release(release)
        .namespace(namespace)
        .values(values.clone())
        .render()
        .map(Manifests::into_objects)
}

/// A `helm template` invocation, built up step by step.
#[derive(Debug, Clone)]
pub struct Template {
    chart: Chart,
    release: String,
    namespace: String,
    kube_version: String,
    values: Vec<Value>,
    values_files: Vec<PathBuf>,
    sets: Vec<String>,
    set_strings: Vec<String>,
}

impl Template {
    /// Release `test`, namespace `default`, Kubernetes [`KUBE_VERSION`], no values.
    pub fn new(chart: Chart) -> Self {
        Self {
            chart,
            release: "test".to_owned(),
            namespace: "default".to_owned(),
            kube_version: KUBE_VERSION.to_owned(),
            values: Vec::new(),
            values_files: Vec::new(),
            sets: Vec::new(),
            set_strings: Vec::new(),
        }
    }

    pub fn release(mut self, release: &str) -> Self {
        release.clone_into(&mut self.release);
        self
    }

    pub fn namespace(mut self, namespace: &str) -> Self {
        namespace.clone_into(&mut self.namespace);
        self
    }

    /// The Kubernetes version helm assumes (`.Capabilities.KubeVersion`).
    pub fn kube_version(mut self, version: &str) -> Self {
        version.clone_into(&mut self.kube_version);
        self
    }

    /// Values as a JSON object; later values override earlier ones, as with `--values`.
    pub fn values(mut self, values: Value) -> Self {
        self.values.push(values);
        self
    }

    /// A values file, applied before the JSON values and `--set`s.
    pub fn values_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.values_files.push(path.into());
        self
    }

    /// `--set key=value` (helm's typed parsing: numbers become integers).
    pub fn set(mut self, key: &str, value: &str) -> Self {
        self.sets.push(format!("{key}={value}"));
        self
    }

    /// `--set-string key=value`.
    pub fn set_string(mut self, key: &str, value: &str) -> Self {
        self.set_strings.push(format!("{key}={value}"));
        self
    }

    /// Runs `helm template` and parses every rendered object.
    pub fn render(&self) -> Result<Manifests> {
        let (args, output) = self.run()?;
        Manifests::parse(&output).map_err(|source| Error::ParseManifests {
            args: display_args(&args),
            source,
        })
    }

    /// Runs `helm template` expecting it to fail, and returns helm's error output (which holds
    /// the chart's `fail` message).
    pub fn render_error(&self) -> Result<String> {
        match self.run() {
            Ok((args, _)) => Err(Error::HelmSucceeded {
                args: display_args(&args),
            }),
            Err(Error::HelmFailed { stderr, .. }) => Ok(stderr),
            Err(other) => Err(other),
        }
    }

    fn run(&self) -> Result<(Vec<OsString>, String)> {
        // The values files must outlive the helm run.
        let mut files = Vec::with_capacity(self.values.len());
        let mut args: Vec<OsString> = vec![
            "template".into(),
            self.release.clone().into(),
            self.chart.path().into(),
            "--namespace".into(),
            self.namespace.clone().into(),
            "--kube-version".into(),
            self.kube_version.clone().into(),
        ];
        for path in &self.values_files {
            args.push("--values".into());
            args.push(path.into());
        }
        for values in &self.values {
            let file = tempfile::Builder::new()
                .prefix("values-")
                .suffix(".json")
                .tempfile()
                .map_err(Error::WriteValues)?;
            // JSON is YAML, so helm reads the file as is.
            serde_json::to_writer(file.as_file(), values)
                .map_err(|e| Error::WriteValues(e.into()))?;
            args.push("--values".into());
            args.push(file.path().into());
            files.push(file);
        }
        for set in &self.sets {
            args.push("--set".into());
            args.push(set.into());
        }
        for set in &self.set_strings {
            args.push("--set-string".into());
            args.push(set.into());
        }
        let output = run_helm(args.clone())?;
        drop(files);
        Ok((args, output))
    }
}

/// The objects of one render, in helm's output order.
#[derive(Debug, Clone)]
pub struct Manifests(Vec<Value>);

impl Manifests {
    /// Parses helm's multi-document YAML output; empty documents are skipped.
    pub fn parse(yaml: &str) -> Result<Self, Box<serde_saphyr::Error>> {
        let documents: Vec<Value> = serde_saphyr::from_multiple(yaml).map_err(Box::new)?;
        Ok(Self(
            documents.into_iter().filter(|d| !d.is_null()).collect(),
        ))
    }

    pub fn objects(&self) -> &[Value] {
        &self.0
    }

    pub fn into_objects(self) -> Vec<Value> {
        self.0
    }

    /// All objects of `kind`.
    pub fn of_kind<'a>(&'a self, kind: &str) -> impl Iterator<Item = &'a Value> + use<'a> {
        let kind = kind.to_owned();
        self.0.iter().filter(move |o| o["kind"] == kind.as_str())
    }

    /// The object of `kind` named `name`, if rendered.
    pub fn find(&self, kind: &str, name: &str) -> Option<&Value> {
        self.of_kind(kind).find(|o| o["metadata"]["name"] == name)
    }

    /// The object of `kind` named `name`, or an error listing what was rendered.
    pub fn get(&self, kind: &str, name: &str) -> Result<&Value> {
        self.find(kind, name).ok_or_else(|| Error::FindObject {
            kind: kind.to_owned(),
            name: name.to_owned(),
            present: self
                .0
                .iter()
                .map(|o| format!("{}/{}", o["kind"], o["metadata"]["name"]))
                .collect(),
        })
    }

    /// The only object of `kind`, or an error when there is none or more than one.
    pub fn single(&self, kind: &str) -> Result<&Value> {
        let mut matching = self.of_kind(kind);
        match (matching.next(), matching.next()) {
            (Some(object), None) => Ok(object),
            _ => Err(Error::FindObject {
                kind: kind.to_owned(),
                name: "(exactly one)".to_owned(),
                present: self
                    .0
                    .iter()
                    .map(|o| format!("{}/{}", o["kind"], o["metadata"]["name"]))
                    .collect(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_skips_empty_documents_and_keeps_types() {
        let yaml = "---\n# Source: a.yaml\n---\n# Source: b.yaml\napiVersion: v1\nkind: ServiceAccount\n\
                    metadata:\n  name: sa\n  labels:\n    version: \"1\"\nspec:\n  replicas: 2\n";
        let manifests = Manifests::parse(yaml).expect("valid YAML");
        assert_eq!(manifests.objects().len(), 1);
        let sa = manifests.get("ServiceAccount", "sa").expect("present");
        assert_eq!(sa["metadata"]["labels"]["version"], "1");
        assert_eq!(sa["spec"]["replicas"], 2);
    }

    #[test]
    fn get_reports_what_was_rendered() {
        let manifests = Manifests(vec![serde_json::json!({
            "kind": "Role", "metadata": {"name": "r"}
        })]);
        let error = manifests.get("Role", "other").expect_err("absent");
        assert!(error.to_string().contains("Role"), "{error}");
        assert!(manifests.single("Role").is_ok());
        assert!(manifests.single("RoleBinding").is_err());
    }

    #[test]
    fn chart_paths_point_at_the_charts() {
        assert!(Chart::Controller.path().join("Chart.yaml").is_file());
        assert!(Chart::ScaleSet.path().join("Chart.yaml").is_file());
    }
}
