//! The API server's own count of the requests it served (`apiserver_request_total` on `/metrics`), keyed
//! `resource[/subresource] VERB`: how a test or the benchmark learns which requests were made, without a proxy
//! in between. The count is the whole API server's, so a test that reads it has the control plane to itself
//! (a test binary of its own) or looks only at requests no one else makes.

use std::collections::BTreeMap;

use kube::Client;

/// Whether `verb` (as the API server names it) changes something.
pub fn is_write_verb(verb: &str) -> bool {
    matches!(
        verb,
        "POST" | "PUT" | "PATCH" | "DELETE" | "APPLY" | "DELETECOLLECTION"
    )
}

/// The API server's count of requests (watches aside), by `resource[/subresource] VERB`.
pub async fn count(client: &Client) -> Result<BTreeMap<String, u64>, kube::Error> {
    Ok(parse_requests(&metrics(client).await?, true))
}

/// The API server's `/metrics` text.
pub async fn metrics(client: &Client) -> Result<String, kube::Error> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(kube::Error::HttpError)?;
    client.request_text(request).await
}

/// Watches the API server closed because their client (or the server's own goroutine for it) fell behind, by
/// resource (`apiserver_terminated_watchers_total`): the mark of an API server past what it can deliver. Each one
/// costs its client a new watch, and until then every event of that resource.
pub fn parse_terminated_watchers(metrics: &str) -> BTreeMap<String, u64> {
    sum_by_label(metrics, "apiserver_terminated_watchers_total", "resource")
}

/// The watches the API server closed for falling behind, from its own log line for each (`Forcing <resource>
/// watcher close due to unresponsiveness`), by whose watch and which end was behind: the watch's scope and
/// selectors say whose it is (the control plane's own watches take every namespace without a selector; the
/// manager's take runner pods by label), and the watcher's result buffer says where its events were held up. With
/// events in it, they waited to be encoded and written to the client (`sending behind`: a client that reads
/// slowly, or a writer short of CPU); with it empty, they waited for the API server's own goroutine of the watch to
/// convert them (`converting behind`: a server short of CPU). `log` is the part of the log written during a run.
pub fn parse_closed_watches(log: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for line in log.lines() {
        if let Some(watch) = ClosedWatch::parse(line) {
            *counts.entry(watch.describe()).or_default() += 1;
        }
    }
    counts
}

/// One watch closed for falling behind, as the API server logs it.
struct ClosedWatch<'a> {
    resource: &'a str,
    key: &'a str,
    labels: &'a str,
    fields: &'a str,
    /// Events converted for the client but not yet encoded and written to it.
    result_len: u64,
}

impl<'a> ClosedWatch<'a> {
    fn parse(line: &'a str) -> Option<Self> {
        let (_, rest) = line.split_once("Forcing ")?;
        let (resource, rest) = rest.split_once(" watcher close due to unresponsiveness")?;
        let quoted = |name: &str| -> Option<&'a str> {
            let (_, after) = rest.split_once(&format!("{name}: \""))?;
            Some(after.split_once('"')?.0)
        };
        let (_, result) = rest.split_once("len(c.result) = ")?;
        let digits = result
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(result.len());
        Some(Self {
            resource,
            key: quoted("key")?,
            labels: quoted("labels")?,
            fields: quoted("fields")?,
            result_len: result[..digits].parse().ok()?,
        })
    }

    fn describe(&self) -> String {
        // The key is the storage prefix of what is watched: it ends in the resource's own name for a watch of every
        // namespace, and in the namespace's name for a watch of one.
        let last = self
            .key
            .trim_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or_default();
        let scope = if self.resource.contains(last) {
            "every namespace".to_owned()
        } else {
            format!("namespace {last}")
        };
        let selector = match (self.labels, self.fields) {
            ("", "") => "no selector".to_owned(),
            (labels, "") => format!("labels {labels}"),
            ("", fields) => format!("fields {fields}"),
            (labels, fields) => format!("labels {labels}, fields {fields}"),
        };
        let behind = if self.result_len > 0 {
            "sending behind"
        } else {
            "converting behind"
        };
        format!("{} ({scope}, {selector}): {behind}", self.resource)
    }
}

/// The samples of counter `name` (its full sample name, `_total` included) summed by the value of `label`.
pub fn sum_by_label(metrics: &str, name: &str, label_name: &str) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for (labels, count) in samples(metrics, name) {
        *counts
            .entry(label(labels, label_name).to_owned())
            .or_default() += count;
    }
    counts
}

/// The samples of metric `name` in a Prometheus text exposition: each one's label list (`a="x",b="y"`) and value.
fn samples<'a>(metrics: &'a str, name: &str) -> impl Iterator<Item = (&'a str, u64)> {
    let prefix = format!("{name}{{");
    metrics.lines().filter_map(move |line| {
        let (labels, value) = line.strip_prefix(&prefix)?.rsplit_once("} ")?;
        Some((labels, value.trim().parse::<f64>().unwrap_or(0.0) as u64))
    })
}

/// The value of label `name` in a sample's label list, empty when it has none.
fn label<'a>(labels: &'a str, name: &str) -> &'a str {
    labels
        .split(',')
        .find_map(|pair| {
            pair.strip_prefix(name)?
                .strip_prefix("=\"")?
                .strip_suffix('"')
        })
        .unwrap_or_default()
}

/// Sums `apiserver_request_total` samples by `resource[/subresource] VERB`, reads (GET, LIST) included when
/// asked; watches are long-lived and not counted. Requests the API server did not carry out are keyed apart,
/// so that `pods POST` counts pods created: a dry run as `resource VERB (dry run)`, a request answered with
/// anything but 2xx as `resource VERB (CODE)` (a conflict, a refusal, a server-side failure or timeout).
pub fn parse_requests(metrics: &str, include_reads: bool) -> BTreeMap<String, u64> {
    let mut counts = BTreeMap::new();
    for (labels, count) in samples(metrics, "apiserver_request_total") {
        let label = |name: &str| label(labels, name);
        let verb = label("verb");
        if (!include_reads && !is_write_verb(verb)) || verb == "WATCH" {
            continue;
        }
        let resource = match label("subresource") {
            "" => label("resource").to_owned(),
            sub => format!("{}/{sub}", label("resource")),
        };
        let key = match (label("dry_run"), label("code")) {
            ("", code) if code.starts_with('2') => format!("{resource} {verb}"),
            ("", code) => format!("{resource} {verb} ({code})"),
            (_, _) => format!("{resource} {verb} (dry run)"),
        };
        *counts.entry(key).or_default() += count;
    }
    counts
}

/// What grew from `before` to `after`, by key (keys that did not grow are left out).
pub fn diff(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(key, n)| {
            let delta = n.saturating_sub(before.get(key).copied().unwrap_or(0));
            (delta > 0).then(|| (key.clone(), delta))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_watches_by_whose_watch_and_where_events_were_held_up() {
        // Lines as kube-apiserver v1.36 wrote them in a 2000-runner benchmark run, and one that is not about a watch.
        let log = r#"I1207 19:31:40.385725   31976 cache_watcher.go:203] Forcing pods watcher close due to unresponsiveness: key: "/pods/", labels: "", fields: "". len(c.input) = 10, len(c.result) = 10, graceful = false
I1207 19:31:40.385943   31976 cache_watcher.go:203] Forcing pods watcher close due to unresponsiveness: key: "/pods/", labels: "", fields: "". len(c.input) = 10, len(c.result) = 10, graceful = false
I1207 19:31:40.386066   31976 cache_watcher.go:203] Forcing pods watcher close due to unresponsiveness: key: "/pods/bench-31922-0/", labels: "actions-ephemeral-runner=True", fields: "". len(c.input) = 10, len(c.result) = 0, graceful = false
I1207 19:31:41.000000   31976 cache_watcher.go:203] Forcing ephemeralrunners.actions.github.com watcher close due to unresponsiveness: key: "/actions.github.com/ephemeralrunners/bench-31922-0/", labels: "", fields: "spec.nodeName=a". len(c.input) = 10, len(c.result) = 3, graceful = false
I1207 19:31:42.000000   31976 httplog.go:134] "HTTP" verb="WATCH" URI="/api/v1/pods?watch=true"
"#;
        let closed = parse_closed_watches(log);
        assert_eq!(
            closed,
            BTreeMap::from([
                (
                    "pods (every namespace, no selector): sending behind".to_owned(),
                    2
                ),
                (
                    "pods (namespace bench-31922-0, labels actions-ephemeral-runner=True): converting behind"
                        .to_owned(),
                    1
                ),
                (
                    "ephemeralrunners.actions.github.com (namespace bench-31922-0, fields spec.nodeName=a): sending behind"
                        .to_owned(),
                    1
                ),
            ])
        );
        assert!(
            parse_closed_watches("Forcing pods watcher close due to unresponsiveness: key")
                .is_empty()
        );
    }

    #[test]
    fn terminated_watchers_by_resource() {
        let metrics = r#"# HELP apiserver_terminated_watchers_total [ALPHA] Counter of watchers closed due to unresponsiveness broken by resource type.
# TYPE apiserver_terminated_watchers_total counter
apiserver_terminated_watchers_total{group="",resource="pods"} 3
apiserver_terminated_watchers_total{group="actions.github.com",resource="ephemeralrunners"} 2
apiserver_request_total{code="200",component="apiserver",resource="pods",verb="GET"} 7
"#;
        let counts = parse_terminated_watchers(metrics);
        assert_eq!(
            counts,
            BTreeMap::from([("ephemeralrunners".to_owned(), 2), ("pods".to_owned(), 3)])
        );
        assert!(parse_terminated_watchers("apiserver_request_total{} 1\n").is_empty());
    }

    #[test]
    fn a_counter_is_summed_by_one_label() {
        // The manager's passes, as prometheus_client writes them: one series per controller and result.
        let metrics = "controller_runtime_reconcile_total{controller=\"ephemeralrunner\",result=\"success\"} 5\n\
                       controller_runtime_reconcile_total{controller=\"ephemeralrunner\",result=\"error\"} 2\n\
                       controller_runtime_reconcile_total{controller=\"ephemeralrunnerset\",result=\"success\"} 4\n\
                       controller_runtime_reconcile_time_seconds_count{controller=\"ephemeralrunner\"} 7\n";
        assert_eq!(
            sum_by_label(metrics, "controller_runtime_reconcile_total", "controller"),
            BTreeMap::from([
                ("ephemeralrunner".to_owned(), 7),
                ("ephemeralrunnerset".to_owned(), 4)
            ])
        );
    }
}
