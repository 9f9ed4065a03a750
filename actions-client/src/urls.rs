//! URL construction for Actions Service and message-queue requests
//! (docs/reference/actions-service-protocol.md, "URL and query", "Get a message", "Acknowledge a message").

use std::collections::BTreeMap;

use url::Url;
use url::form_urlencoded;

/// The `api-version` every Actions Service call carries.
pub const API_VERSION: &str = "6.0-preview";

/// Joins `path` onto the service base URL with path-join semantics (duplicate slashes collapse, `.`/`..`
/// resolve, a trailing `/` on `path` is kept), then overlays `params` on the base URL's own query, adds
/// `api-version` when absent, and encodes the query with keys sorted.
///
/// Unlike the reference client, values are form-encoded properly, so names with `&`, `#`, `+` or `%` arrive intact.
pub fn service_url(base: &Url, path: &str, params: &[(&str, &str)]) -> Url {
    let mut url = base.clone();
    let joined = format!("{}/{}", base.path(), path);
    let mut cleaned = clean_path(&joined);
    if path.ends_with('/') && !cleaned.ends_with('/') {
        cleaned.push('/');
    }
    url.set_path(&cleaned);

    let mut query: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in base.query_pairs() {
        query
            .entry(k.into_owned())
            .or_default()
            .push(v.into_owned());
    }
    for (k, v) in params {
        query.insert((*k).to_owned(), vec![(*v).to_owned()]);
    }
    query
        .entry("api-version".to_owned())
        .or_insert_with(|| vec![API_VERSION.to_owned()]);
    set_sorted_query(&mut url, &query);
    url
}

/// The long-poll URL: the queue URL as given, with `lastMessageId` set (replacing any existing one) when
/// `last_message_id > 0`.
pub fn message_poll_url(queue: &Url, last_message_id: i64) -> Url {
    if last_message_id <= 0 {
        return queue.clone();
    }
    let mut query: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (k, v) in queue.query_pairs() {
        query
            .entry(k.into_owned())
            .or_default()
            .push(v.into_owned());
    }
    query.insert(
        "lastMessageId".to_owned(),
        vec![last_message_id.to_string()],
    );
    let mut url = queue.clone();
    set_sorted_query(&mut url, &query);
    url
}

/// The acknowledge URL: `/{message_id}` appended to the queue URL's path, its query unchanged.
pub fn message_delete_url(queue: &Url, message_id: i64) -> Url {
    let mut url = queue.clone();
    let path = format!("{}/{message_id}", queue.path().trim_end_matches('/'));
    url.set_path(&path);
    url
}

fn set_sorted_query(url: &mut Url, query: &BTreeMap<String, Vec<String>>) {
    let mut serializer = form_urlencoded::Serializer::new(String::new());
    for (k, values) in query {
        for v in values {
            serializer.append_pair(k, v);
        }
    }
    let encoded = serializer.finish();
    url.set_query((!encoded.is_empty()).then_some(encoded.as_str()));
}

/// Go's `path.Clean` for absolute paths: collapse `//`, drop `.`, resolve `..`, no trailing slash.
fn clean_path(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    format!("/{}", parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn url(s: &str) -> Url {
        Url::parse(s).expect("valid url")
    }

    /// (base URL, endpoint path, endpoint query parameters, expected URL).
    type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], &'a str);

    #[test]
    fn service_url_table() {
        let cases: &[Case<'_>] = &[
            (
                "http://h/tenant/123/",
                "/_apis/runtime/runnerscalesets",
                &[],
                "http://h/tenant/123/_apis/runtime/runnerscalesets?api-version=6.0-preview",
            ),
            (
                "https://pipelines.actions.example/AbCdEf123/",
                "/_apis/runtime/runnerscalesets",
                &[("runnerGroupId", "1"), ("name", "my-set")],
                "https://pipelines.actions.example/AbCdEf123/_apis/runtime/runnerscalesets?api-version=6.0-preview&name=my-set&runnerGroupId=1",
            ),
            (
                "http://h/tenant/123",
                "/_apis/runtime/runnergroups/",
                &[("groupName", "gpu runners")],
                "http://h/tenant/123/_apis/runtime/runnergroups/?api-version=6.0-preview&groupName=gpu+runners",
            ),
            (
                "http://h/t//x/./y/../",
                "//a",
                &[],
                "http://h/t/x/a?api-version=6.0-preview",
            ),
            (
                "http://h/t/?api-version=7.0&z=1",
                "/a",
                &[],
                "http://h/t/a?api-version=7.0&z=1",
            ),
            (
                "http://h/t/?b=base",
                "/a",
                &[("b", "endpoint")],
                "http://h/t/a?api-version=6.0-preview&b=endpoint",
            ),
        ];
        for (base, path, params, expected) in cases {
            assert_eq!(
                service_url(&url(base), path, params).as_str(),
                *expected,
                "{base} + {path}"
            );
        }
    }

    #[test]
    fn reserved_characters_in_names_survive() {
        let built = service_url(
            &url("http://h/t/"),
            "/_apis/distributedtask/pools/0/agents",
            &[("agentName", "a&b#c+d%e")],
        );
        let name = built
            .query_pairs()
            .find(|(k, _)| k == "agentName")
            .map(|(_, v)| v.into_owned());
        assert_eq!(name.as_deref(), Some("a&b#c+d%e"));
        assert!(
            built
                .as_str()
                .ends_with("agentName=a%26b%23c%2Bd%25e&api-version=6.0-preview"),
            "{built}"
        );
    }

    #[test]
    fn poll_and_delete_urls() {
        let queue = url("https://broker.example/queue/abc?x=1");
        assert_eq!(
            message_poll_url(&queue, 0).as_str(),
            "https://broker.example/queue/abc?x=1"
        );
        assert_eq!(
            message_poll_url(&queue, 17).as_str(),
            "https://broker.example/queue/abc?lastMessageId=17&x=1"
        );
        assert_eq!(
            message_poll_url(&url("http://h/?lastMessageId=3"), 4).as_str(),
            "http://h/?lastMessageId=4"
        );
        assert_eq!(
            message_delete_url(&queue, 17).as_str(),
            "https://broker.example/queue/abc/17?x=1"
        );
        assert_eq!(
            message_delete_url(&url("http://127.0.0.1:1/"), 5).as_str(),
            "http://127.0.0.1:1/5"
        );
        assert_eq!(
            message_delete_url(&url("http://h/q/"), 5).as_str(),
            "http://h/q/5"
        );
    }
}
