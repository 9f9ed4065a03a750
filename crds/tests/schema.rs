//! Properties of the generated CRDs: what a Kubernetes 1.36 API server requires of a structural schema, and the
//! facts of ARC's CRDs (names, printer columns, required fields, minimums, formats) that clients rely on.

use std::collections::BTreeSet;
use std::sync::LazyLock;

use crds::schema::{ALLOWED_FORMATS, EMBEDDED_OBJECT_META_FIELDS, for_each_schema};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, CustomResourceDefinitionVersion, JSONSchemaProps,
    JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use pretty_assertions::assert_eq;

const KINDS: [&str; 4] = [
    "AutoscalingRunnerSet",
    "AutoscalingListener",
    "EphemeralRunnerSet",
    "EphemeralRunner",
];

/// Generating the schemas is slow in debug builds; generate them once for all tests.
static CRDS: LazyLock<Vec<CustomResourceDefinition>> = LazyLock::new(crds::all_crds);

fn crd(kind: &str) -> CustomResourceDefinition {
    CRDS.iter()
        .find(|crd| crd.spec.names.kind == kind)
        .cloned()
        .unwrap_or_else(|| panic!("no CRD for {kind}"))
}

fn version(crd: &CustomResourceDefinition) -> &CustomResourceDefinitionVersion {
    assert_eq!(crd.spec.versions.len(), 1, "exactly one version");
    &crd.spec.versions[0]
}

fn root_schema(kind: &str) -> JSONSchemaProps {
    version(&crd(kind))
        .schema
        .as_ref()
        .and_then(|s| s.open_api_v3_schema.clone())
        .unwrap_or_else(|| panic!("{kind} has no schema"))
}

/// The schema at a path such as `spec.template.spec.containers[].env` (`[]` = array items, `{}` = map values).
fn at<'a>(schema: &'a JSONSchemaProps, path: &str) -> &'a JSONSchemaProps {
    let mut node = schema;
    for segment in path.split('.') {
        let (name, suffixes) = segment
            .find(['[', '{'])
            .map_or((segment, ""), |i| (&segment[..i], &segment[i..]));
        if !name.is_empty() {
            node = node
                .properties
                .as_ref()
                .and_then(|p| p.get(name))
                .unwrap_or_else(|| panic!("no property {name} in path {path}"));
        }
        let mut rest = suffixes;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix("[]") {
                node = match node.items.as_ref() {
                    Some(JSONSchemaPropsOrArray::Schema(items)) => items,
                    _ => panic!("no items at {path}"),
                };
                rest = after;
            } else if let Some(after) = rest.strip_prefix("{}") {
                node = match node.additional_properties.as_ref() {
                    Some(JSONSchemaPropsOrBool::Schema(values)) => values,
                    _ => panic!("no additionalProperties at {path}"),
                };
                rest = after;
            } else {
                panic!("bad path segment {segment}");
            }
        }
    }
    node
}

fn required(schema: &JSONSchemaProps, path: &str) -> Vec<String> {
    let node = if path.is_empty() {
        schema
    } else {
        at(schema, path)
    };
    let mut required = node.required.clone().unwrap_or_default();
    required.sort();
    required
}

fn property_names(schema: &JSONSchemaProps) -> BTreeSet<String> {
    schema
        .properties
        .as_ref()
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default()
}

/// Visits every schema node with its path.
fn walk(schema: &JSONSchemaProps, path: &str, f: &mut impl FnMut(&str, &JSONSchemaProps)) {
    f(path, schema);
    for (name, child) in schema.properties.iter().flatten() {
        walk(child, &format!("{path}.{name}"), f);
    }
    if let Some(JSONSchemaPropsOrArray::Schema(items)) = &schema.items {
        walk(items, &format!("{path}[]"), f);
    }
    if let Some(JSONSchemaPropsOrBool::Schema(values)) = &schema.additional_properties {
        walk(values, &format!("{path}{{}}"), f);
    }
}

#[test]
fn names_scope_versions_and_subresources_match_arc() {
    for (kind, plural) in KINDS.iter().zip([
        "autoscalingrunnersets",
        "autoscalinglisteners",
        "ephemeralrunnersets",
        "ephemeralrunners",
    ]) {
        let crd = crd(kind);
        assert_eq!(
            crd.metadata.name.as_deref(),
            Some(format!("{plural}.actions.github.com").as_str())
        );
        assert_eq!(crd.spec.group, "actions.github.com");
        assert_eq!(crd.spec.scope, "Namespaced");
        assert_eq!(crd.spec.names.plural, plural);
        assert_eq!(
            crd.spec.names.singular.as_deref(),
            Some(&plural[..plural.len() - 1])
        );
        assert_eq!(
            crd.spec.names.list_kind.as_deref(),
            Some(format!("{kind}List").as_str())
        );
        assert_eq!(crd.spec.names.short_names, None);
        assert_eq!(crd.spec.names.categories, None);
        let version = version(&crd);
        assert_eq!(version.name, "v1alpha1");
        assert!(version.served && version.storage);
        let subresources = version.subresources.as_ref().expect("subresources");
        assert!(
            subresources.status.is_some(),
            "{kind} has the status subresource"
        );
        assert!(
            subresources.scale.is_none(),
            "{kind} has no scale subresource"
        );
    }
}

fn columns(kind: &str) -> Vec<(String, String, String)> {
    version(&crd(kind))
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| (c.name.clone(), c.type_.clone(), c.json_path.clone()))
        .collect()
}

fn expected(columns: &[(&str, &str, &str)]) -> Vec<(String, String, String)> {
    columns
        .iter()
        .map(|(n, t, p)| ((*n).to_owned(), (*t).to_owned(), (*p).to_owned()))
        .collect()
}

#[test]
fn printer_columns_match_arc_in_order() {
    assert_eq!(
        columns("AutoscalingRunnerSet"),
        expected(&[
            ("Minimum Runners", "integer", ".spec.minRunners"),
            ("Maximum Runners", "integer", ".spec.maxRunners"),
            ("Current Runners", "integer", ".status.currentRunners"),
            ("Phase", "string", ".status.phase"),
            (
                "Pending Runners",
                "integer",
                ".status.pendingEphemeralRunners"
            ),
            (
                "Running Runners",
                "integer",
                ".status.runningEphemeralRunners"
            ),
            (
                "Finished Runners",
                "integer",
                ".status.finishedEphemeralRunners"
            ),
            (
                "Deleting Runners",
                "integer",
                ".status.deletingEphemeralRunners"
            ),
            // Not in ARC: appended after ARC's columns.
            (
                "Served",
                "string",
                ".status.conditions[?(@.type==\"Ready\")].status"
            ),
        ])
    );
    assert_eq!(
        columns("AutoscalingListener"),
        expected(&[
            ("GitHub Configure URL", "string", ".spec.githubConfigUrl"),
            (
                "AutoscalingRunnerSet Namespace",
                "string",
                ".spec.autoscalingRunnerSetNamespace"
            ),
            (
                "AutoscalingRunnerSet Name",
                "string",
                ".spec.autoscalingRunnerSetName"
            ),
        ])
    );
    assert_eq!(
        columns("EphemeralRunnerSet"),
        expected(&[
            ("DesiredReplicas", "integer", ".spec.replicas"),
            ("CurrentReplicas", "integer", ".status.currentReplicas"),
            (
                "Pending Runners",
                "integer",
                ".status.pendingEphemeralRunners"
            ),
            (
                "Running Runners",
                "integer",
                ".status.runningEphemeralRunners"
            ),
            (
                "Finished Runners",
                "integer",
                ".status.finishedEphemeralRunners"
            ),
            (
                "Deleting Runners",
                "integer",
                ".status.deletingEphemeralRunners"
            ),
            ("Phase", "string", ".status.phase"),
        ])
    );
    assert_eq!(
        columns("EphemeralRunner"),
        expected(&[
            ("GitHub Config URL", "string", ".spec.githubConfigUrl"),
            ("RunnerId", "number", ".status.runnerId"),
            ("Phase", "string", ".status.phase"),
            ("JobRepository", "string", ".status.jobRepositoryName"),
            ("JobWorkflowRef", "string", ".status.jobWorkflowRef"),
            ("WorkflowRunId", "number", ".status.workflowRunId"),
            ("JobDisplayName", "string", ".status.jobDisplayName"),
            ("JobId", "string", ".status.jobId"),
            ("Message", "string", ".status.message"),
            ("Age", "date", ".metadata.creationTimestamp"),
        ])
    );
}

/// The rules of a structural schema (apiextensions v1) that our generator could break, checked on every node.
#[test]
fn schemas_are_structural() {
    for kind in KINDS {
        let schema = root_schema(kind);
        walk(&schema, "", &mut |path, node| {
            let at = if path.is_empty() { "." } else { path };
            assert!(node.ref_path.is_none(), "{kind} {at}: $ref");
            assert!(node.schema.is_none(), "{kind} {at}: $schema");
            assert!(node.definitions.is_none(), "{kind} {at}: definitions");
            assert!(node.id.is_none(), "{kind} {at}: id");
            assert!(
                node.any_of.is_none()
                    && node.one_of.is_none()
                    && node.all_of.is_none()
                    && node.not.is_none(),
                "{kind} {at}: logical junctors"
            );
            assert!(
                node.additional_items.is_none() && node.dependencies.is_none(),
                "{kind} {at}"
            );
            assert!(
                node.unique_items.is_none(),
                "{kind} {at}: uniqueItems is forbidden"
            );
            assert!(node.nullable.is_none(), "{kind} {at}: nullable");
            assert!(
                node.x_kubernetes_preserve_unknown_fields.is_none(),
                "{kind} {at}: preserve-unknown-fields"
            );
            assert!(
                node.x_kubernetes_embedded_resource.is_none(),
                "{kind} {at}: embedded-resource"
            );
            if node.x_kubernetes_int_or_string == Some(true) {
                assert!(
                    node.type_.is_none(),
                    "{kind} {at}: int-or-string must not have a type"
                );
            } else {
                let ty = node
                    .type_
                    .as_deref()
                    .unwrap_or_else(|| panic!("{kind} {at}: no type"));
                assert!(
                    ["object", "array", "string", "integer", "number", "boolean"].contains(&ty),
                    "{kind} {at}: type {ty}"
                );
                assert_eq!(
                    ty == "array",
                    node.items.is_some(),
                    "{kind} {at}: items iff array"
                );
                if ty != "object" {
                    assert!(
                        node.properties.is_none() && node.additional_properties.is_none(),
                        "{kind} {at}"
                    );
                }
            }
            assert!(
                node.properties.is_none() || node.additional_properties.is_none(),
                "{kind} {at}: properties and additionalProperties are mutually exclusive"
            );
            if let Some(JSONSchemaPropsOrBool::Bool(_)) = node.additional_properties {
                panic!("{kind} {at}: boolean additionalProperties");
            }
            if let Some(JSONSchemaPropsOrArray::Schemas(_)) = node.items {
                panic!("{kind} {at}: tuple items");
            }
            for required in node.required.iter().flatten() {
                assert!(
                    node.properties
                        .as_ref()
                        .is_some_and(|p| p.contains_key(required)),
                    "{kind} {at}: required {required} is not a property"
                );
            }
        });
    }
}

#[test]
fn formats_are_kubernetes_formats_on_matching_types() {
    for kind in KINDS {
        let mut schema = root_schema(kind);
        for_each_schema(&mut schema, &mut |node| {
            if let Some(format) = node.format.as_deref() {
                assert!(ALLOWED_FORMATS.contains(&format), "{kind}: format {format}");
                let expected_type = match format {
                    "int32" | "int64" => "integer",
                    _ => "string",
                };
                assert_eq!(
                    node.type_.as_deref(),
                    Some(expected_type),
                    "{kind}: format {format}"
                );
            }
        });
    }
}

#[test]
fn the_only_defaults_are_empty_referent_names() {
    for kind in KINDS {
        let schema = root_schema(kind);
        let mut count = 0;
        walk(&schema, "", &mut |path, node| {
            for (name, property) in node.properties.iter().flatten() {
                if let Some(default) = &property.default {
                    assert_eq!(name, "name", "{kind} {path}.{name}: unexpected default");
                    assert_eq!(default.0, serde_json::json!(""), "{kind} {path}.{name}");
                    assert!(
                        !node.required.iter().flatten().any(|r| r == "name"),
                        "{kind} {path}: a defaulted name must not be required"
                    );
                    assert_eq!(
                        node.x_kubernetes_map_type.as_deref(),
                        Some("atomic"),
                        "{kind} {path}"
                    );
                    count += 1;
                }
            }
        });
        assert!(count > 0, "{kind}: object references found");
    }
    let listener = root_schema("AutoscalingListener");
    assert_eq!(
        required(&listener, "spec.imagePullSecrets[]"),
        Vec::<String>::new()
    );
    let tls = "spec.githubServerTLS.certificateFrom.configMapKeyRef";
    assert_eq!(required(&listener, tls), ["key"]);
    assert_eq!(
        at(&listener, &format!("{tls}.name"))
            .default
            .as_ref()
            .map(|d| &d.0),
        Some(&"".into())
    );
}

#[test]
fn root_declares_api_version_kind_metadata_spec_and_status() {
    for kind in KINDS {
        let schema = root_schema(kind);
        assert_eq!(
            property_names(&schema),
            ["apiVersion", "kind", "metadata", "spec", "status"]
                .map(String::from)
                .into()
        );
        assert_eq!(at(&schema, "metadata").type_.as_deref(), Some("object"));
        assert!(at(&schema, "metadata").properties.is_none());
        assert!(
            schema
                .description
                .as_deref()
                .is_some_and(|d| !d.contains("Auto-generated"))
        );
    }
}

#[test]
fn required_fields_match_arc() {
    let ers = root_schema("EphemeralRunnerSet");
    assert_eq!(required(&ers, "spec"), ["patchID"]);
    assert_eq!(required(&ers, "status"), ["currentReplicas"]);
    let runner_spec = ["githubConfigSecret", "githubConfigUrl", "runnerScaleSetId"];
    assert_eq!(required(&ers, "spec.ephemeralRunnerSpec"), runner_spec);
    let er = root_schema("EphemeralRunner");
    assert_eq!(required(&er, "spec"), runner_spec);
    assert_eq!(required(&er, "status"), Vec::<String>::new());
    assert_eq!(required(&er, "spec.spec"), ["containers"]);
    assert_eq!(required(&er, "spec.spec.containers[]"), ["name"]);

    let ars = root_schema("AutoscalingRunnerSet");
    assert_eq!(required(&ars, "spec"), Vec::<String>::new());
    assert_eq!(required(&ars, "status"), Vec::<String>::new());
    assert_eq!(required(&ars, "spec.template.spec"), ["containers"]);
    assert_eq!(
        required(&ars, "spec.vaultConfig.azureKeyVault"),
        ["certificatePath", "clientId", "tenantId", "url"]
    );
    for metric in ["counters{}", "gauges{}", "histograms{}"] {
        assert_eq!(
            required(&ars, &format!("spec.listenerMetrics.{metric}")),
            ["labels"]
        );
    }
    let al = root_schema("AutoscalingListener");
    assert_eq!(required(&al, "spec"), Vec::<String>::new());
    // ARC's status is an empty object; ours only adds optional fields, so an empty status stays valid.
    assert_eq!(required(&al, "status"), Vec::<String>::new());
    assert_eq!(required(&al, "status.lastError"), Vec::<String>::new());
    assert_eq!(required(&al, "status.podFailures"), Vec::<String>::new());
    // Every kind requires `spec` at the root (kube's derive does; ARC's Go clients always send it).
    for kind in KINDS {
        assert_eq!(required(&root_schema(kind), ""), ["spec"], "{kind}");
    }
}

#[test]
fn runner_bounds_have_minimum_zero_and_integer_formats_follow_go_types() {
    for (kind, prefix) in [
        ("AutoscalingRunnerSet", "spec"),
        ("AutoscalingListener", "spec"),
    ] {
        let schema = root_schema(kind);
        for field in ["minRunners", "maxRunners"] {
            let node = at(&schema, &format!("{prefix}.{field}"));
            assert_eq!(node.minimum, Some(0.0), "{kind} {field}");
            assert_eq!(node.type_.as_deref(), Some("integer"));
            assert_eq!(node.format, None, "{kind} {field}: Go int has no format");
        }
    }
    let er = root_schema("EphemeralRunner");
    for go_int in ["spec.runnerScaleSetId", "status.runnerId"] {
        assert_eq!(at(&er, go_int).format, None, "{go_int}");
    }
    for int64 in ["status.jobRequestId", "status.workflowRunId"] {
        assert_eq!(at(&er, int64).format.as_deref(), Some("int64"), "{int64}");
    }
    let failures = at(&er, "status.failures{}");
    assert_eq!(
        (failures.type_.as_deref(), failures.format.as_deref()),
        (Some("string"), Some("date-time"))
    );
    let ers = root_schema("EphemeralRunnerSet");
    for go_int in [
        "spec.replicas",
        "spec.patchID",
        "status.currentReplicas",
        "status.failedEphemeralRunners",
    ] {
        assert_eq!(at(&ers, go_int).format, None, "{go_int}");
    }
    let ars = root_schema("AutoscalingRunnerSet");
    let buckets = at(&ars, "spec.listenerMetrics.histograms{}.buckets[]");
    assert_eq!(
        (buckets.type_.as_deref(), buckets.format.as_deref()),
        (Some("number"), None)
    );
    // Inside pod templates the upstream formats stay.
    let port = at(
        &ars,
        "spec.template.spec.containers[].ports[].containerPort",
    );
    assert_eq!(port.format.as_deref(), Some("int32"));
    let cpu = at(&ars, "spec.template.spec.containers[].resources.limits{}");
    assert_eq!(cpu.x_kubernetes_int_or_string, Some(true));
}

#[test]
fn embedded_object_metadata_keeps_only_five_fields() {
    let five: BTreeSet<String> = EMBEDDED_OBJECT_META_FIELDS.map(String::from).into();
    let embedded = [
        ("AutoscalingRunnerSet", "spec.template.metadata"),
        ("AutoscalingRunnerSet", "spec.listenerTemplate.metadata"),
        (
            "AutoscalingRunnerSet",
            "spec.template.spec.volumes[].ephemeral.volumeClaimTemplate.metadata",
        ),
        ("AutoscalingListener", "spec.template.metadata"),
        ("EphemeralRunnerSet", "spec.ephemeralRunnerSpec.metadata"),
        ("EphemeralRunner", "spec.metadata"),
    ];
    for (kind, path) in embedded {
        let schema = root_schema(kind);
        let node = at(&schema, path);
        assert_eq!(property_names(node), five, "{kind} {path}");
        assert_eq!(node.required, None, "{kind} {path}");
    }
    // And nowhere else does a full ObjectMeta survive.
    for kind in KINDS {
        walk(&root_schema(kind), "", &mut |path, node| {
            let names = property_names(node);
            assert!(
                !names.contains("managedFields"),
                "{kind} {path}: full ObjectMeta"
            );
        });
    }
}

#[test]
fn crds_fit_in_etcd() {
    // etcd's default request limit is 1.5 MiB; the API server stores CRDs as JSON.
    for crd in CRDS.iter() {
        let size = serde_json::to_vec(&crd).expect("serialises").len();
        assert!(
            size < 1_400_000,
            "{} is {size} bytes of JSON",
            crd.spec.names.kind
        );
    }
}

#[test]
fn descriptions_have_no_rustdoc_links() {
    // Doc comments of our types become `kubectl explain` text; Rust-only notes belong in `//` comments.
    for kind in KINDS {
        walk(&root_schema(kind), "", &mut |path, node| {
            if let Some(description) = &node.description {
                assert!(!description.contains("[`"), "{kind} {path}: {description}");
            }
        });
    }
}

#[test]
fn quantities_have_the_quantity_pattern_and_ports_do_not() {
    use crds::schema::QUANTITY_PATTERN;
    let er = root_schema("EphemeralRunner");
    for quantity in [
        "spec.spec.containers[].resources.limits{}",
        "spec.spec.containers[].resources.requests{}",
        "spec.spec.containers[].env[].valueFrom.resourceFieldRef.divisor",
        "spec.spec.volumes[].emptyDir.sizeLimit",
        "spec.spec.overhead{}",
    ] {
        assert_eq!(
            at(&er, quantity).pattern.as_deref(),
            Some(QUANTITY_PATTERN),
            "{quantity}"
        );
    }
    for port in [
        "spec.spec.containers[].livenessProbe.httpGet.port",
        "spec.spec.containers[].readinessProbe.tcpSocket.port",
    ] {
        assert_eq!(at(&er, port).pattern, None, "{port}");
        assert_eq!(
            at(&er, port).x_kubernetes_int_or_string,
            Some(true),
            "{port}"
        );
    }
    for kind in KINDS {
        walk(&root_schema(kind), "", &mut |path, node| {
            if node.x_kubernetes_int_or_string == Some(true) {
                assert_eq!(
                    node.pattern.is_some(),
                    !path.ends_with(".port"),
                    "{kind} {path}"
                );
            } else if path.contains(".minRunnersSchedules[].") {
                // Not in ARC: the schedules' times and dates have their syntax checked at admission.
                let field = path.rsplit('.').next().unwrap_or_default();
                assert_eq!(
                    node.pattern.is_some(),
                    ["start", "end", "startDate", "endDate"].contains(&field),
                    "{kind} {path}"
                );
            } else {
                assert_eq!(
                    node.pattern, None,
                    "{kind} {path}: only quantities and schedule times have a pattern"
                );
            }
        });
    }
}
