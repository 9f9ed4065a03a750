//! Schema adjustments that make the generated CRDs match what ARC's CRDs accept and what a Kubernetes API server
//! requires of a structural schema.
//!
//! Two kinds of adjustment live here:
//! - field-level helpers used from `#[schemars(...)]` attributes on our own fields (Go `int`s, serde defaults),
//!   so the intent is visible where the field is declared;
//! - [`finalize`], a pass over the whole generated schema, for what cannot be attached to a field: the embedded
//!   Kubernetes types (object metadata, object references) and what schemars and kube's derive add but a CRD
//!   should not carry.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    JSON, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
    JSONSchemaPropsOrStringArray,
};
use schemars::Schema;

/// The `format` values our CRDs may carry. These are the ones the Kubernetes API server validates and the ones
/// k8s-openapi uses inside pod templates; schemars' Rust-specific formats (`uint32`, `double`, ...) are dropped.
pub const ALLOWED_FORMATS: [&str; 4] = ["int32", "int64", "date-time", "byte"];

/// For fields that are a Go `int` in ARC: ARC's CRDs give them no `format` (`int64` is what our Rust type uses,
/// since Go's `int` is 64 bits wide), so the schema must not restrict them to `int32` either.
pub(crate) fn go_int(schema: &mut Schema) {
    schema.remove("format");
}

/// schemars turns `#[serde(default)]` into a schema `default`, which the API server would write into stored
/// objects. ARC's CRDs have no defaults on these fields, so fields that need a serde default for robust
/// deserialization drop the schema default with this.
pub(crate) fn no_default(schema: &mut Schema) {
    schema.remove("default");
}

/// The fields of an embedded `ObjectMeta` that ARC's CRDs keep (controller-gen's `generateEmbeddedObjectMeta`).
pub const EMBEDDED_OBJECT_META_FIELDS: [&str; 5] =
    ["annotations", "finalizers", "labels", "name", "namespace"];

/// Fields that only `ObjectMeta` has among the types embedded in our kinds; a schema with all of them is an
/// `ObjectMeta`.
const OBJECT_META_MARKERS: [&str; 4] = [
    "generateName",
    "managedFields",
    "ownerReferences",
    "resourceVersion",
];

/// How upstream describes the `name` of object references that default to `""` instead of being required
/// (`LocalObjectReference`, `ConfigMapKeySelector`, `SecretEnvSource`, ...).
const DEFAULTED_REFERENT_NAME: &str = "Name of the referent. This field is effectively required, but due to backwards compatibility is allowed to be empty.";

/// The syntax of a `resource.Quantity` string, as upstream's OpenAPI declares it.
pub const QUANTITY_PATTERN: &str = r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$";

/// Adjusts a generated CRD schema, everywhere in it, so the API server accepts the same objects as with ARC's
/// CRDs and stores them the same way:
/// - embedded `ObjectMeta` (pod templates, volume claim templates) keeps only [`EMBEDDED_OBJECT_META_FIELDS`];
///   the API server prunes anything else, as with ARC;
/// - object references whose `name` upstream defaults to `""` get that default instead of requiring `name`, and
///   are atomic maps (k8s-openapi's schemas mark `name` required, which would reject templates ARC accepts);
/// - `nullable` is removed: ARC's CRDs have none, so the API server drops `null` fields instead of storing them;
/// - `format`s other than [`ALLOWED_FORMATS`] are removed;
/// - resource quantities get [`QUANTITY_PATTERN`], so a malformed quantity in a pod template is rejected when the
///   object is written (as with ARC) rather than when a pod is created from it.
pub fn finalize(schema: &mut JSONSchemaProps) {
    add_quantity_patterns(schema);
    for_each_schema(schema, &mut |node| {
        node.nullable = None;
        if node
            .format
            .as_deref()
            .is_some_and(|format| !ALLOWED_FORMATS.contains(&format))
        {
            node.format = None;
        }
        if is_object_meta(node) {
            restrict_to_embedded_object_meta(node);
        }
        if has_defaulted_referent_name(node) {
            default_referent_name(node);
        }
    });
}

/// k8s-openapi gives `IntOrString` and `Quantity` the same schema (`x-kubernetes-int-or-string`), and a field's
/// description replaces the type's. In the core/v1 pod types the only `IntOrString` fields are named `port`
/// (probes and lifecycle handlers); every other int-or-string value is a `Quantity` (resource limits, requests and
/// overhead, `divisor`, `sizeLimit`).
fn add_quantity_patterns(schema: &mut JSONSchemaProps) {
    for (key, child) in schema.properties.iter_mut().flatten() {
        if key != "port" && child.x_kubernetes_int_or_string == Some(true) {
            child.pattern = Some(QUANTITY_PATTERN.to_owned());
        }
    }
    if let Some(JSONSchemaPropsOrBool::Schema(values)) = schema.additional_properties.as_mut()
        && values.x_kubernetes_int_or_string == Some(true)
    {
        values.pattern = Some(QUANTITY_PATTERN.to_owned());
    }
    for child in children_mut(schema) {
        add_quantity_patterns(child);
    }
}

fn is_object_meta(schema: &JSONSchemaProps) -> bool {
    schema.properties.as_ref().is_some_and(|properties| {
        OBJECT_META_MARKERS
            .iter()
            .all(|key| properties.contains_key(*key))
    })
}

fn restrict_to_embedded_object_meta(schema: &mut JSONSchemaProps) {
    if let Some(properties) = schema.properties.as_mut() {
        properties.retain(|key, _| EMBEDDED_OBJECT_META_FIELDS.contains(&key.as_str()));
    }
    schema.required = None;
}

fn has_defaulted_referent_name(schema: &JSONSchemaProps) -> bool {
    schema
        .properties
        .as_ref()
        .and_then(|properties| properties.get("name"))
        .and_then(|name| name.description.as_deref())
        .is_some_and(|description| description.starts_with(DEFAULTED_REFERENT_NAME))
}

fn default_referent_name(schema: &mut JSONSchemaProps) {
    if let Some(required) = schema.required.as_mut() {
        required.retain(|field| field != "name");
        if required.is_empty() {
            schema.required = None;
        }
    }
    if let Some(name) = schema
        .properties
        .as_mut()
        .and_then(|properties| properties.get_mut("name"))
    {
        name.default = Some(JSON("".into()));
    }
    schema.x_kubernetes_map_type = Some("atomic".to_owned());
}

/// Adds the `apiVersion`, `kind` and `metadata` properties to a CRD's root schema. The API server handles these
/// itself, but declaring them (as ARC's CRDs do) documents them and keeps schema comparisons meaningful.
pub fn add_root_properties(schema: &mut JSONSchemaProps) {
    let string = |description: &str| JSONSchemaProps {
        description: Some(description.to_owned()),
        type_: Some("string".to_owned()),
        ..JSONSchemaProps::default()
    };
    let root_properties = [
        (
            "apiVersion",
            string(
                "Versioned schema of this representation of an object (actions.github.com/v1alpha1).",
            ),
        ),
        ("kind", string("REST resource this object represents.")),
        (
            "metadata",
            JSONSchemaProps {
                type_: Some("object".to_owned()),
                ..JSONSchemaProps::default()
            },
        ),
    ];
    let properties = schema.properties.get_or_insert_with(BTreeMap::new);
    for (key, value) in root_properties {
        properties.entry(key.to_owned()).or_insert(value);
    }
}

/// Calls `f` on `schema` and on every schema nested in it, parents before children.
pub fn for_each_schema(schema: &mut JSONSchemaProps, f: &mut impl FnMut(&mut JSONSchemaProps)) {
    f(schema);
    for child in children_mut(schema) {
        for_each_schema(child, f);
    }
}

fn children_mut(schema: &mut JSONSchemaProps) -> Vec<&mut JSONSchemaProps> {
    let mut children: Vec<&mut JSONSchemaProps> = Vec::new();
    if let Some(properties) = schema.properties.as_mut() {
        children.extend(properties.values_mut());
    }
    if let Some(properties) = schema.pattern_properties.as_mut() {
        children.extend(properties.values_mut());
    }
    if let Some(definitions) = schema.definitions.as_mut() {
        children.extend(definitions.values_mut());
    }
    match schema.items.as_mut() {
        Some(JSONSchemaPropsOrArray::Schema(item)) => children.push(item),
        Some(JSONSchemaPropsOrArray::Schemas(items)) => children.extend(items.iter_mut()),
        None => {}
    }
    for extra in [
        schema.additional_properties.as_mut(),
        schema.additional_items.as_mut(),
    ]
    .into_iter()
    .flatten()
    {
        if let JSONSchemaPropsOrBool::Schema(extra) = extra {
            children.push(extra);
        }
    }
    for list in [
        schema.all_of.as_mut(),
        schema.any_of.as_mut(),
        schema.one_of.as_mut(),
    ]
    .into_iter()
    .flatten()
    {
        children.extend(list.iter_mut());
    }
    if let Some(not) = schema.not.as_mut() {
        children.push(not);
    }
    if let Some(dependencies) = schema.dependencies.as_mut() {
        for dependency in dependencies.values_mut() {
            if let JSONSchemaPropsOrStringArray::Schema(dependency) = dependency {
                children.push(dependency);
            }
        }
    }
    children
}
