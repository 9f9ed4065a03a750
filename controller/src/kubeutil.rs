//! Small helpers over the Kubernetes API shared by the reconcilers: finalizer edits with an optimistic check,
//! idempotent deletes, owner references. Errors name the object's kind as its type gives it (`K::kind(&())`).

use std::fmt::Debug;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, PatchOperation, ReplaceOperation, TestOperation};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::error::{Error, Result, is_status};

/// Name and namespace of a namespaced object read from the API (both always set there).
pub fn name_and_namespace<K: Resource<DynamicType = ()>>(obj: &K) -> Result<(String, String)> {
    let missing = |field| Error::MissingObjectField {
        kind: K::kind(&()),
        field,
    };
    let name = obj.meta().name.clone().ok_or_else(|| missing("name"))?;
    let namespace = obj
        .meta()
        .namespace
        .clone()
        .ok_or_else(|| missing("namespace"))?;
    Ok((name, namespace))
}

/// The controller owner reference pointing at `obj` (needs its uid).
pub fn controller_ref<K: Resource<DynamicType = ()>>(obj: &K) -> Result<OwnerReference> {
    obj.controller_owner_ref(&())
        .ok_or_else(|| Error::MissingObjectField {
            kind: K::kind(&()),
            field: "uid",
        })
}

/// Whether `obj` is controlled by an `Owner` (kind and apiVersion) named `name`.
pub fn is_controlled_by<Owner: Resource<DynamicType = ()>>(
    obj: &impl Resource,
    name: &str,
) -> bool {
    obj.owner_references().iter().any(|owner| {
        owner.controller == Some(true)
            && owner.kind == Owner::kind(&())
            && owner.name == name
            && owner.api_version == Owner::api_version(&())
    })
}

/// Whether `obj` carries `finalizer`.
pub fn has_finalizer<K: Resource>(obj: &K, finalizer: &str) -> bool {
    obj.finalizers().iter().any(|have| have == finalizer)
}

/// Adds those of `finalizers` that `obj` lacks, in one patch; returns whether it sent one.
pub async fn add_finalizers<K>(api: &Api<K>, obj: &K, finalizers: &[&str]) -> Result<bool>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    edit_finalizers(api, obj, with_finalizers(obj.finalizers(), finalizers)).await
}

/// Removes `finalizers` from `obj`, in one patch, keeping everyone else's; returns whether it sent one.
pub async fn remove_finalizers<K>(api: &Api<K>, obj: &K, finalizers: &[&str]) -> Result<bool>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    edit_finalizers(api, obj, without_finalizers(obj.finalizers(), finalizers)).await
}

/// `current` plus those of `add` it lacks, in order; `None` when nothing is missing.
fn with_finalizers(current: &[String], add: &[&str]) -> Option<Vec<String>> {
    let mut wanted = current.to_vec();
    for finalizer in add {
        if !wanted.iter().any(|have| have == finalizer) {
            wanted.push((*finalizer).to_owned());
        }
    }
    (wanted.len() != current.len()).then_some(wanted)
}

/// `current` without `remove`; `None` when none of them is there.
fn without_finalizers(current: &[String], remove: &[&str]) -> Option<Vec<String>> {
    let wanted: Vec<String> = current
        .iter()
        .filter(|have| !remove.contains(&have.as_str()))
        .cloned()
        .collect();
    (wanted.len() != current.len()).then_some(wanted)
}

/// Adds `finalizer` to `obj` and sets its annotation `key` to `value`, in one patch (the finalizer then records
/// what the annotation says is left to do); returns whether it sent one (not when the finalizer is there).
pub async fn add_finalizer_with_annotation<K>(
    api: &Api<K>,
    obj: &K,
    finalizer: &str,
    key: &str,
    value: &str,
) -> Result<bool>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let Some(wanted) = with_finalizers(obj.finalizers(), &[finalizer]) else {
        return Ok(false);
    };
    let annotation = match obj.meta().annotations {
        Some(_) => AddOperation {
            path: PointerBuf::from_tokens(["metadata", "annotations", key]),
            value: value.into(),
        },
        None => AddOperation {
            path: "/metadata/annotations"
                .parse::<PointerBuf>()
                .unwrap_or_default(),
            value: serde_json::json!({ key: value }),
        },
    };
    set_finalizers(api, obj, wanted, vec![PatchOperation::Add(annotation)])
        .await
        .map(|()| true)
}

async fn edit_finalizers<K>(api: &Api<K>, obj: &K, wanted: Option<Vec<String>>) -> Result<bool>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    match wanted {
        Some(wanted) => set_finalizers(api, obj, wanted, Vec::new())
            .await
            .map(|()| true),
        None => Ok(false),
    }
}

/// Replaces `obj`'s finalizers with `wanted` (and applies `also` in the same patch), failing (so the caller retries
/// with fresh data) if the list changed since `obj` was read; a JSON patch `test` makes the check without locking
/// the whole object. A second `test` on the uid keeps the edit off a successor under the same name: a pass working
/// from a cache that still holds a deleted object must not take the finalizers off the one created after it.
async fn set_finalizers<K>(
    api: &Api<K>,
    obj: &K,
    wanted: Vec<String>,
    also: Vec<PatchOperation>,
) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let current = obj.finalizers();
    let path = |p: &str| p.parse::<PointerBuf>().unwrap_or_default();
    let same_object = obj.meta().uid.as_ref().map(|uid| {
        PatchOperation::Test(TestOperation {
            path: path("/metadata/uid"),
            value: uid.as_str().into(),
        })
    });
    let operations = if current.is_empty() {
        vec![
            PatchOperation::Test(TestOperation {
                path: path("/metadata/finalizers"),
                value: serde_json::Value::Null,
            }),
            PatchOperation::Add(AddOperation {
                path: path("/metadata/finalizers"),
                value: wanted.into(),
            }),
        ]
    } else {
        vec![
            PatchOperation::Test(TestOperation {
                path: path("/metadata/finalizers"),
                value: current.to_vec().into(),
            }),
            PatchOperation::Replace(ReplaceOperation {
                path: path("/metadata/finalizers"),
                value: wanted.into(),
            }),
        ]
    };
    let operations: Vec<PatchOperation> = same_object
        .into_iter()
        .chain(operations)
        .chain(also)
        .collect();
    let (name, namespace) = name_and_namespace(obj)?;
    match api
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Json::<()>(json_patch::Patch(operations)),
        )
        .await
    {
        Ok(_) => Ok(()),
        // Gone already: nothing left to finalize.
        Err(error) if is_status(&error, 404) => Ok(()),
        Err(source) => Err(Error::PatchObject {
            kind: K::kind(&()),
            what: "finalizers",
            namespace,
            name,
            source: Box::new(source),
        }),
    }
}

/// `obj` as the API server has it now (not a cache), when it is still the object being deleted that carries one of
/// `finalizers`; `None` when it is gone, replaced by another of the same name, or no longer waits on them.
///
/// A deletion pass runs from the controller's cache, which can still hold an object the pass before finished:
/// that pass's own writes (the last finalizer edit, an annotation) queue one more, and the cache learns of the
/// deletion only after. Everything a deletion pass does goes by name (children, Helm's protected objects, the
/// listener's pod and RBAC), so such a pass run after a reinstall under the same names would take the new
/// install's objects apart. Reading the object first makes every deletion pass work on the object that is there.
pub async fn still_finalizing<K>(api: &Api<K>, obj: &K, finalizers: &[&str]) -> Result<Option<K>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let (name, namespace) = name_and_namespace(obj)?;
    let fresh = get_if_present(api, &name, &namespace).await?;
    Ok(fresh.filter(|fresh| is_still_finalizing(obj, fresh, finalizers)))
}

/// Whether `fresh` (read from the API server) is `cached` (same uid), being deleted, with one of `finalizers` left.
fn is_still_finalizing<K: Resource>(cached: &K, fresh: &K, finalizers: &[&str]) -> bool {
    cached.meta().uid.is_some()
        && fresh.meta().uid == cached.meta().uid
        && fresh.meta().deletion_timestamp.is_some()
        && finalizers
            .iter()
            .any(|finalizer| has_finalizer(fresh, finalizer))
}

/// Reads `name` from the API server (not a cache); `None` when it does not exist.
pub async fn get_if_present<K>(api: &Api<K>, name: &str, namespace: &str) -> Result<Option<K>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    api.get_opt(name)
        .await
        .map_err(|source| Error::ReadObjects {
            kind: K::kind(&()),
            namespace: namespace.to_owned(),
            source: Box::new(source),
        })
}

/// Deletes `name` unless it is already gone; returns whether a delete was issued.
pub async fn delete_if_present<K>(api: &Api<K>, name: &str, namespace: &str) -> Result<bool>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(true),
        Err(error) if is_status(&error, 404) => Ok(false),
        Err(source) => Err(delete_error::<K>(namespace, name, source)),
    }
}

fn delete_error<K: Resource<DynamicType = ()>>(
    namespace: &str,
    name: &str,
    source: kube::Error,
) -> Error {
    Error::DeleteObject {
        kind: K::kind(&()),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        source: Box::new(source),
    }
}

/// Deletes pod `uid`, whose containers have all exited, without a grace period, as Kubernetes' own pod garbage
/// collector does with terminated pods: there is nothing left to stop, and the graceful path would keep the
/// object until the kubelet confirms, one more write and a kubelet round trip later. The uid precondition makes
/// sure it is that pod: if the name now belongs to a newer one (the cache was behind), that one is deleted
/// gracefully.
pub async fn delete_terminated_pod(
    api: &Api<Pod>,
    name: &str,
    namespace: &str,
    uid: &str,
) -> Result<bool> {
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_owned()),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(name, &params).await {
        Ok(_) => Ok(true),
        Err(error) if is_status(&error, 404) => Ok(false),
        Err(error) if is_status(&error, 409) => delete_if_present(api, name, namespace).await,
        Err(source) => Err(delete_error::<Pod>(namespace, name, source)),
    }
}

/// The deletion timestamp as a predicate value: marking a custom resource for deletion gives it a new generation
/// as well, and hashing the mark itself means a filter does not depend on that.
pub fn deletion_mark<K: Resource>(obj: &K) -> Option<u64> {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let mut hasher = DefaultHasher::new();
    obj.meta()
        .deletion_timestamp
        .as_ref()
        .map(|t| t.0.as_second())
        .hash(&mut hasher);
    Some(hasher.finish())
}

/// Passes on only the objects whose `predicate` value changed, with kube-runtime's `predicate_filter` (which
/// remembers each object by namespace, name and uid and forgets what it has not seen for an hour).
///
/// `predicate_filter` takes a stream of owned objects, while the manager's shared watches hand out `Arc`s: each
/// caller is its watch's only subscriber, so taking each object out of its `Arc` and back normally copies nothing.
pub fn changed_only<K>(
    objects: impl futures::Stream<Item = std::sync::Arc<K>> + Send + 'static,
    predicate: impl kube::runtime::Predicate<K> + Send + 'static,
) -> impl futures::Stream<Item = std::sync::Arc<K>> + Send + 'static
where
    K: Resource + Clone + Send + Sync + 'static,
{
    use futures::StreamExt;
    use kube::runtime::WatchStreamExt;
    objects
        .map(|obj| Ok::<_, kube::runtime::watcher::Error>(std::sync::Arc::unwrap_or_clone(obj)))
        .predicate_filter(predicate, kube::runtime::PredicateConfig::default())
        // No errors: the stream above only holds `Ok`s.
        .filter_map(|obj| futures::future::ready(obj.ok().map(std::sync::Arc::new)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(names: &[&str]) -> Vec<String> {
        names.iter().map(|name| (*name).to_owned()).collect()
    }

    #[test]
    fn adding_keeps_the_others_and_adds_only_what_is_missing() {
        assert_eq!(with_finalizers(&[], &["a", "b"]), Some(list(&["a", "b"])));
        assert_eq!(
            with_finalizers(&list(&["x", "b"]), &["a", "b"]),
            Some(list(&["x", "b", "a"]))
        );
        assert_eq!(with_finalizers(&list(&["b", "a"]), &["a", "b"]), None);
        assert_eq!(with_finalizers(&list(&["x"]), &[]), None);
    }

    fn runner_set(uid: &str, deleting: bool, finalizers: &[&str]) -> crds::EphemeralRunnerSet {
        let mut set = crds::EphemeralRunnerSet::new("s", Default::default());
        set.metadata.uid = Some(uid.to_owned());
        set.metadata.deletion_timestamp =
            deleting.then_some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        set.metadata.finalizers = Some(list(finalizers));
        set
    }

    #[test]
    fn only_the_same_object_still_being_deleted_with_a_finalizer_left_is_finalized() {
        let cached = runner_set("u1", true, &["f"]);
        assert!(is_still_finalizing(
            &cached,
            &runner_set("u1", true, &["x", "f"]),
            &["g", "f"]
        ));
        // A successor under the same name, even one being deleted with the same finalizer.
        assert!(!is_still_finalizing(
            &cached,
            &runner_set("u2", true, &["f"]),
            &["f"]
        ));
        // The finalizer is gone (the pass before was the last), someone else's is left.
        assert!(!is_still_finalizing(
            &cached,
            &runner_set("u1", true, &["x"]),
            &["f"]
        ));
        // Not being deleted: nothing to finalize (a cache cannot run ahead of the server, but the check is exact).
        assert!(!is_still_finalizing(
            &cached,
            &runner_set("u1", false, &["f"]),
            &["f"]
        ));
        // Without a uid nothing can be told apart.
        let mut anonymous = cached.clone();
        anonymous.metadata.uid = None;
        assert!(!is_still_finalizing(&anonymous, &anonymous.clone(), &["f"]));
    }

    /// The kind in errors comes from the type and reads as the literal kinds did.
    #[test]
    fn errors_name_the_kind_of_the_type() {
        let mut pod = Pod::default();
        pod.metadata.name = Some("p".into());
        let error = name_and_namespace(&pod).unwrap_err();
        assert_eq!(error.to_string(), "Pod has no metadata.namespace");
        let set = crds::EphemeralRunnerSet::new("s", Default::default());
        let error = controller_ref(&set).unwrap_err();
        assert_eq!(error.to_string(), "EphemeralRunnerSet has no metadata.uid");
        let error = delete_error::<crds::AutoscalingListener>(
            "ns",
            "l",
            kube::Error::Api(
                kube::core::Status::failure("boom", "Reason")
                    .with_code(500)
                    .boxed(),
            ),
        );
        assert_eq!(error.to_string(), "delete AutoscalingListener ns/l: boom");
    }

    #[test]
    fn controlled_by_compares_the_owner_type_and_name() {
        let mut set = crds::EphemeralRunnerSet::new("set", Default::default());
        set.metadata.uid = Some("u".into());
        let mut runner = crds::EphemeralRunner::new("r", Default::default());
        runner.metadata.owner_references = Some(vec![controller_ref(&set).unwrap()]);
        assert!(is_controlled_by::<crds::EphemeralRunnerSet>(&runner, "set"));
        assert!(!is_controlled_by::<crds::EphemeralRunnerSet>(
            &runner, "other"
        ));
        assert!(!is_controlled_by::<crds::AutoscalingRunnerSet>(
            &runner, "set"
        ));
    }

    #[test]
    fn removing_keeps_the_others_and_is_a_no_op_when_absent() {
        assert_eq!(
            without_finalizers(&list(&["x", "a", "y", "b"]), &["a", "b"]),
            Some(list(&["x", "y"]))
        );
        assert_eq!(without_finalizers(&list(&["a"]), &["a"]), Some(list(&[])));
        assert_eq!(without_finalizers(&list(&["x"]), &["a"]), None);
        assert_eq!(without_finalizers(&[], &["a"]), None);
    }
}
