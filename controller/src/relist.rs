//! The deletions a watch's re-list implies.
//!
//! A watch that cannot resume where it stopped lists everything again: the API server answers 410 Gone once its
//! watch cache no longer holds the resource version the watch had reached (after an API server restart, or on a
//! busy cluster whose changes outrun the cache's window). An object deleted meanwhile never comes as a `Delete`
//! event; it is only missing from the new list. The watch's cache drops it when the list completes, but the
//! manager's deletion hooks (what the runner controller remembers of a runner, the count of runners that left with a
//! job, the owner's wake-up) run on events, so without [`with_relist_deletions`] they would never run for it: the
//! runner memory would keep the runner's entries for the life of the process, and its set or runner would not be
//! woken.

use std::collections::HashSet;
use std::sync::Arc;

use futures::{Stream, StreamExt, stream};
use kube::runtime::reflector::Store;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

/// `events` (a watch already feeding `cache`, through `reflect`), with a `Delete` event after each completed
/// re-list for every object the cache held before it that the list left out. Whoever handles deletions then
/// sees every one, whether the API server reported it or a re-list only implies it.
pub fn with_relist_deletions<K, E>(
    events: impl Stream<Item = Result<watcher::Event<K>, E>>,
    cache: Store<K>,
) -> impl Stream<Item = Result<watcher::Event<K>, E>>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let mut relist = Relist::default();
    events.flat_map(move |event| {
        let mut implied = Vec::new();
        match &event {
            // The reflector has started a new list but the cache serves the previous state until it completes.
            Ok(watcher::Event::Init) => relist.begin(cache.state()),
            Ok(watcher::Event::InitApply(obj)) => relist.listed(obj),
            Ok(watcher::Event::InitDone) => {
                implied = relist
                    .complete()
                    .into_iter()
                    .map(|obj| Ok(watcher::Event::Delete(K::clone(&obj))))
                    .collect();
            }
            _ => {}
        }
        stream::iter(std::iter::once(event).chain(implied))
    })
}

/// Follows one watch's lists: what its cache held when a list began, and what the list holds.
#[derive(Debug)]
struct Relist<K> {
    before: Vec<Arc<K>>,
    listed: HashSet<String>,
}

impl<K> Default for Relist<K> {
    fn default() -> Self {
        Self {
            before: Vec::new(),
            listed: HashSet::new(),
        }
    }
}

impl<K: Resource> Relist<K> {
    /// A list begins (`Init`); `cached` is what the watch's cache holds, which it keeps until the list completes.
    /// A list that failed half way and starts over begins again from the same cache.
    fn begin(&mut self, cached: Vec<Arc<K>>) {
        self.before = cached;
        self.listed.clear();
    }

    /// The list holds `obj` (`InitApply`).
    fn listed(&mut self, obj: &K) {
        self.listed.insert(identity(obj));
    }

    /// The list is complete (`InitDone`): the objects cached before it that it does not hold, deleted while the
    /// watch was not following. An object recreated under the same name in between is a new object (another uid),
    /// so the old one is among them.
    fn complete(&mut self) -> Vec<Arc<K>> {
        let listed = std::mem::take(&mut self.listed);
        std::mem::take(&mut self.before)
            .into_iter()
            .filter(|obj| !listed.contains(&identity(obj.as_ref())))
            .collect()
    }
}

/// An object's uid; its namespace and name for one that has none (never the case for what the API server lists).
fn identity<K: Resource>(obj: &K) -> String {
    obj.uid()
        .unwrap_or_else(|| format!("{}/{}", obj.namespace().unwrap_or_default(), obj.name_any()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use proptest::prelude::*;

    fn object(name: &str, uid: &str) -> Arc<ConfigMap> {
        Arc::new(ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("ns".to_owned()),
                uid: Some(uid.to_owned()),
                ..ObjectMeta::default()
            },
            ..ConfigMap::default()
        })
    }

    fn names(objects: &[Arc<ConfigMap>]) -> Vec<String> {
        objects.iter().map(|obj| obj.name_any()).collect()
    }

    #[test]
    fn the_first_list_implies_no_deletion() {
        let mut relist = Relist::default();
        relist.begin(Vec::new());
        relist.listed(object("a", "1").as_ref());
        assert!(relist.complete().is_empty());
    }

    #[test]
    fn what_the_new_list_leaves_out_was_deleted() {
        let mut relist = Relist::default();
        relist.begin(vec![object("a", "1"), object("b", "2"), object("c", "3")]);
        relist.listed(object("b", "2").as_ref());
        relist.listed(object("d", "4").as_ref());
        assert_eq!(names(&relist.complete()), ["a", "c"]);
        // Nothing is reported twice: the next list starts from what the cache then holds.
        assert!(relist.complete().is_empty());
    }

    #[test]
    fn an_object_recreated_under_its_name_was_deleted() {
        let mut relist = Relist::default();
        relist.begin(vec![object("a", "1")]);
        relist.listed(object("a", "9").as_ref());
        let deleted = relist.complete();
        assert_eq!(deleted.len(), 1);
        assert_eq!(deleted[0].uid().as_deref(), Some("1"));
    }

    #[test]
    fn a_list_that_starts_over_forgets_what_its_first_try_listed() {
        let mut relist = Relist::default();
        let cached = vec![object("a", "1"), object("b", "2")];
        relist.begin(cached.clone());
        relist.listed(object("a", "1").as_ref());
        // The list failed half way; the watcher lists again from the start, and `a` is gone by then.
        relist.begin(cached);
        relist.listed(object("b", "2").as_ref());
        assert_eq!(names(&relist.complete()), ["a"]);
    }

    proptest! {
        /// Exactly the cached objects the list leaves out are reported, each once.
        #[test]
        fn reports_exactly_the_cached_objects_not_listed(
            cached in proptest::collection::btree_set(0u8..40, 0..20),
            listed in proptest::collection::btree_set(0u8..40, 0..20),
        ) {
            let mut relist = Relist::default();
            relist.begin(cached.iter().map(|n| object(&n.to_string(), &n.to_string())).collect());
            for n in &listed {
                relist.listed(object(&n.to_string(), &n.to_string()).as_ref());
            }
            let deleted: Vec<String> = names(&relist.complete());
            let expected: Vec<String> = cached.difference(&listed).map(|n| n.to_string()).collect();
            prop_assert_eq!(deleted, expected);
        }
    }
}
