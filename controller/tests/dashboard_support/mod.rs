//! Checks shared by `controller/tests/dashboard.rs` and `listener/tests/dashboard.rs`: the Grafana dashboard
//! (`docs/grafana/arc-rs-dashboard.json`) and `docs/metrics.md` against the metrics the two processes really
//! export.
//!
//! No crate sees both registries, so the check is split in two by metric name: the manager owns every
//! `gha_controller_*` and `controller_runtime_*` series ([`is_manager_metric`]), the listener everything else.
//! Each test asserts that its process exports only names of its own part, and checks the dashboard queries of its
//! part; together they cover every query.
//!
//! PromQL is read with a small tokenizer, enough for the dashboard's queries: metric names, their label
//! matchers, and the label lists of `by`/`without`/`on`/`ignoring`/`group_left`/`group_right`. Strings, range
//! selectors (`[...]`), numbers, durations and Grafana variables (`$x`, `${x}`) are skipped; functions and
//! aggregations are recognised by name or by the `(` that follows them.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde_json::Value;

/// Path of the dashboard, relative to the repository root.
pub const DASHBOARD: &str = "docs/grafana/arc-rs-dashboard.json";
/// Path of the metrics documentation, relative to the repository root.
pub const METRICS_DOC: &str = "docs/metrics.md";

/// Whether a series belongs to the manager (otherwise it is the listener's).
pub fn is_manager_metric(name: &str) -> bool {
    name.starts_with("gha_controller_") || name.starts_with("controller_runtime_")
}

fn repository_root() -> PathBuf {
    // Both crates live one level below the workspace root.
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the crate has a parent directory")
        .to_path_buf()
}

/// Reads a file of the repository.
pub fn read(relative: &str) -> String {
    let path = repository_root().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The dashboard JSON.
pub fn dashboard() -> Value {
    serde_json::from_str(&read(DASHBOARD))
        .unwrap_or_else(|e| panic!("{DASHBOARD} is not JSON: {e}"))
}

/// A metric family's type, from its `# TYPE` line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `counter`: stored by Prometheus as `<name>_total`.
    Counter,
    /// `gauge`: stored as `<name>`.
    Gauge,
    /// `histogram`: stored as `<name>_bucket`, `<name>_sum` and `<name>_count`.
    Histogram,
}

impl Kind {
    fn suffixes(self) -> &'static [&'static str] {
        match self {
            Self::Counter => &["_total"],
            Self::Gauge => &[""],
            Self::Histogram => &["_bucket", "_sum", "_count"],
        }
    }
}

/// What one process exports, read from its OpenMetrics text.
#[derive(Debug, Default)]
pub struct Exported {
    /// Family name (as on the `# TYPE` line) to type.
    pub families: BTreeMap<String, Kind>,
    /// Series name (as Prometheus stores it) to the label names seen on its samples.
    pub series: BTreeMap<String, BTreeSet<String>>,
    /// Families with at least one sample.
    pub sampled: BTreeSet<String>,
}

impl Exported {
    /// Parses the text exposition. Every registered family has a `# TYPE` line, with or without samples; label
    /// names are only known for families that have samples.
    pub fn parse(text: &str) -> Self {
        let mut exported = Self::default();
        let mut current: Option<(String, Kind)> = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("# TYPE <name> <type>");
                let kind = match kind {
                    "counter" => Kind::Counter,
                    "gauge" => Kind::Gauge,
                    "histogram" => Kind::Histogram,
                    other => {
                        panic!("family {name} has type {other}, which this check does not know")
                    }
                };
                exported.families.insert(name.to_owned(), kind);
                for suffix in kind.suffixes() {
                    exported
                        .series
                        .entry(format!("{name}{suffix}"))
                        .or_default();
                }
                current = Some((name.to_owned(), kind));
                continue;
            }
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let (family, kind) = current
                .as_ref()
                .unwrap_or_else(|| panic!("sample before any # TYPE line: {line}"));
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            let series = &line[..end];
            if series == format!("{family}_created") {
                continue;
            }
            assert!(
                kind.suffixes()
                    .iter()
                    .any(|s| series == format!("{family}{s}")),
                "sample {series} does not belong to family {family} ({kind:?})"
            );
            let labels = if line[end..].starts_with('{') {
                label_names(&line[end..])
            } else {
                Vec::new()
            };
            exported
                .series
                .entry(series.to_owned())
                .or_default()
                .extend(labels);
            exported.sampled.insert(family.clone());
        }
        exported
    }

    /// Families without a sample: their labels are unknown, so the test must record a value in each.
    pub fn families_without_samples(&self) -> Vec<&str> {
        self.families
            .keys()
            .filter(|f| !self.sampled.contains(*f))
            .map(String::as_str)
            .collect()
    }

    /// The name under which each family is documented: the gauge's name, the counter's `_total` name, the
    /// histogram's base name.
    pub fn documented_names(&self) -> Vec<String> {
        self.families
            .iter()
            .map(|(name, kind)| match kind {
                Kind::Counter => format!("{name}_total"),
                Kind::Gauge | Kind::Histogram => name.clone(),
            })
            .collect()
    }
}

/// Label names of a `{a="x",b="y"}` block (values may contain escaped quotes and commas).
fn label_names(block: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut chars = block.chars().skip(1).peekable();
    loop {
        let name: String = chars.by_ref().take_while(|c| *c != '=').collect();
        let name = name.trim_start_matches(',').trim();
        if name.is_empty() || name.starts_with('}') {
            break;
        }
        names.push(name.to_owned());
        assert_eq!(
            chars.next(),
            Some('"'),
            "label {name} has no quoted value in {block}"
        );
        let mut escaped = false;
        for c in chars.by_ref() {
            match (escaped, c) {
                (false, '\\') => escaped = true,
                (false, '"') => break,
                _ => escaped = false,
            }
        }
        if chars.peek() == Some(&'}') {
            break;
        }
    }
    names
}

/// One metric named in a query, with the label names of its matchers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The series name.
    pub metric: String,
    /// Labels in its `{...}`.
    pub matchers: Vec<String>,
}

/// What a query refers to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Metrics, in order.
    pub references: Vec<Reference>,
    /// Labels of `by`, `without`, `on`, `ignoring`, `group_left` and `group_right` lists.
    pub grouping: Vec<String>,
}

const AGGREGATIONS: &[&str] = &[
    "sum",
    "avg",
    "min",
    "max",
    "count",
    "group",
    "stddev",
    "stdvar",
    "topk",
    "bottomk",
    "quantile",
    "count_values",
    "limitk",
    "limit_ratio",
];
const GROUPING: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
const KEYWORDS: &[&str] = &[
    "and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "Inf", "NaN",
];

fn is_ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

struct Tokens<'a> {
    chars: Vec<char>,
    at: usize,
    expr: &'a str,
}

impl Tokens<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.at).copied()
    }

    fn skip_space(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.at += 1;
        }
    }

    fn ident(&mut self) -> String {
        let start = self.at;
        while self.peek().is_some_and(is_ident) {
            self.at += 1;
        }
        self.chars[start..self.at].iter().collect()
    }

    fn skip_string(&mut self) -> Result<(), String> {
        let quote = self.chars[self.at];
        self.at += 1;
        while let Some(c) = self.peek() {
            self.at += 1;
            if c == '\\' && quote != '`' {
                self.at += 1;
            } else if c == quote {
                return Ok(());
            }
        }
        Err(format!("unterminated string in {:?}", self.expr))
    }

    fn skip_past(&mut self, close: char) -> Result<(), String> {
        while let Some(c) = self.peek() {
            self.at += 1;
            if c == close {
                return Ok(());
            }
        }
        Err(format!("missing {close:?} in {:?}", self.expr))
    }

    /// `{name op "value", ...}`: the label names.
    fn matchers(&mut self) -> Result<Vec<String>, String> {
        self.at += 1;
        let mut labels = Vec::new();
        loop {
            self.skip_space();
            match self.peek() {
                Some('}') => {
                    self.at += 1;
                    return Ok(labels);
                }
                Some(',') => self.at += 1,
                Some(c) if is_ident_start(c) => {
                    labels.push(self.ident());
                    self.skip_space();
                    while self.peek().is_some_and(|c| matches!(c, '=' | '!' | '~')) {
                        self.at += 1;
                    }
                    self.skip_space();
                    if !matches!(self.peek(), Some('"' | '\'' | '`')) {
                        return Err(format!("matcher without a quoted value in {:?}", self.expr));
                    }
                    self.skip_string()?;
                }
                _ => return Err(format!("cannot read the label matchers of {:?}", self.expr)),
            }
        }
    }

    /// `(a, b)` after a grouping keyword.
    fn label_list(&mut self) -> Result<Vec<String>, String> {
        self.at += 1;
        let mut labels = Vec::new();
        loop {
            self.skip_space();
            match self.peek() {
                Some(')') => {
                    self.at += 1;
                    return Ok(labels);
                }
                Some(',') => self.at += 1,
                Some(c) if is_ident_start(c) => labels.push(self.ident()),
                _ => return Err(format!("cannot read a label list in {:?}", self.expr)),
            }
        }
    }
}

/// The metrics and grouping labels of a PromQL expression (with Grafana variables in it).
pub fn parse_promql(expr: &str) -> Result<Parsed, String> {
    let mut t = Tokens {
        chars: expr.chars().collect(),
        at: 0,
        expr,
    };
    let mut parsed = Parsed::default();
    // Whether the previous token was a metric name, so a `{` belongs to it.
    let mut after_metric = false;
    while let Some(c) = t.peek() {
        let was_after_metric = std::mem::take(&mut after_metric);
        match c {
            c if c.is_whitespace() => {
                t.at += 1;
                after_metric = was_after_metric;
            }
            '"' | '\'' | '`' => t.skip_string()?,
            '$' => {
                t.at += 1;
                if t.peek() == Some('{') {
                    t.skip_past('}')?;
                } else {
                    t.ident();
                }
            }
            '[' => t.skip_past(']')?,
            '{' => {
                if !was_after_metric {
                    return Err(format!(
                        "a selector without a metric name in {expr:?}; name the metric"
                    ));
                }
                let labels = t.matchers()?;
                let last = parsed.references.last_mut().expect("a metric came before");
                last.matchers.extend(labels);
            }
            c if c.is_ascii_digit()
                || (c == '.' && t.chars.get(t.at + 1).is_some_and(char::is_ascii_digit)) =>
            {
                // Numbers and durations (1e3, 0.95, 5m).
                while t
                    .peek()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '.')
                {
                    t.at += 1;
                }
            }
            c if is_ident_start(c) => {
                let word = t.ident();
                t.skip_space();
                let next = t.peek();
                if GROUPING.contains(&word.as_str()) {
                    if next == Some('(') {
                        parsed.grouping.extend(t.label_list()?);
                    }
                } else if AGGREGATIONS.contains(&word.as_str())
                    || KEYWORDS.contains(&word.as_str())
                    || next == Some('(')
                {
                    // A function, an aggregation or an operator keyword.
                } else {
                    parsed.references.push(Reference {
                        metric: word,
                        matchers: Vec::new(),
                    });
                    after_metric = true;
                }
            }
            '(' | ')' | ',' | '+' | '-' | '*' | '/' | '%' | '^' | '=' | '!' | '<' | '>' => {
                t.at += 1
            }
            other => return Err(format!("unexpected {other:?} in {expr:?}")),
        }
    }
    Ok(parsed)
}

/// A query of the dashboard and where it is.
#[derive(Debug, Clone)]
pub struct Query {
    /// Panel title and refId, or the template variable.
    pub location: String,
    /// The PromQL.
    pub expr: String,
}

fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(panels: &'a Value, out: &mut Vec<&'a Value>) {
        for panel in panels.as_array().into_iter().flatten() {
            out.push(panel);
            walk(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// Every query: panel targets, and template variables' `label_values(<selector>, <label>)` as
/// `count by (<label>) (<selector>)`, so the label is checked against the selector's metric.
pub fn queries(dashboard: &Value) -> Result<Vec<Query>, String> {
    let mut queries = Vec::new();
    for panel in panels(dashboard) {
        let title = panel["title"].as_str().unwrap_or("(untitled)");
        for target in panel["targets"].as_array().into_iter().flatten() {
            queries.push(Query {
                location: format!(
                    "panel {title:?} target {}",
                    target["refId"].as_str().unwrap_or("?")
                ),
                expr: target["expr"].as_str().unwrap_or_default().to_owned(),
            });
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if variable["type"] != "query" {
            continue;
        }
        let name = variable["name"].as_str().unwrap_or("?");
        let query = match &variable["query"] {
            Value::String(query) => query.as_str(),
            object => object["query"].as_str().unwrap_or_default(),
        };
        let inner = query
            .trim()
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .ok_or_else(|| format!("variable {name}: only label_values(<metric>, <label>) is checked, got {query:?}"))?;
        let (selector, label) = inner.rsplit_once(',').ok_or_else(|| {
            format!("variable {name}: label_values needs a metric, got {query:?}")
        })?;
        queries.push(Query {
            location: format!("variable {name}"),
            expr: format!("count by ({}) ({})", label.trim(), selector.trim()),
        });
    }
    Ok(queries)
}

fn hint(metric: &str, exported: &Exported) -> String {
    if exported.series.contains_key(&format!("{metric}_total")) {
        return " (a counter: Prometheus stores it with _total)".to_owned();
    }
    if exported.families.get(metric) == Some(&Kind::Histogram) {
        return " (a histogram: use _bucket, _sum or _count)".to_owned();
    }
    String::new()
}

/// Problems with the queries of one part: metrics that part does not export, label matchers and grouping
/// labels its metrics do not have, queries mixing the two parts or naming no metric.
pub fn check_queries(
    queries: &[Query],
    exported: &Exported,
    mine: fn(&str) -> bool,
) -> Vec<String> {
    let mut problems = Vec::new();
    for query in queries {
        let parsed = match parse_promql(&query.expr) {
            Ok(parsed) => parsed,
            Err(e) => {
                problems.push(format!("{}: {e}", query.location));
                continue;
            }
        };
        if parsed.references.is_empty() {
            problems.push(format!(
                "{}: names no metric: {:?}",
                query.location, query.expr
            ));
            continue;
        }
        let own = parsed.references.iter().filter(|r| mine(&r.metric)).count();
        if own == 0 {
            continue;
        }
        if own != parsed.references.len() {
            problems.push(format!(
                "{}: mixes manager and listener metrics in one expression: {:?}",
                query.location, query.expr
            ));
            continue;
        }
        let mut available = BTreeSet::new();
        let mut all_known = true;
        for reference in &parsed.references {
            let Some(labels) = exported.series.get(&reference.metric) else {
                problems.push(format!(
                    "{}: {} is not exported{}",
                    query.location,
                    reference.metric,
                    hint(&reference.metric, exported)
                ));
                all_known = false;
                continue;
            };
            for label in &reference.matchers {
                if !labels.contains(label) {
                    problems.push(format!(
                        "{}: {} has no label {label} (it has {labels:?})",
                        query.location, reference.metric
                    ));
                }
            }
            available.extend(labels.iter().cloned());
        }
        for label in parsed.grouping.iter().filter(|_| all_known) {
            if !available.contains(label) {
                problems.push(format!(
                    "{}: groups by {label}, which none of its metrics has (they have {available:?})",
                    query.location
                ));
            }
        }
    }
    problems
}

/// Problems with the dashboard's shape: schema version, the datasource variable, panels without queries or
/// with another datasource, duplicate ids.
pub fn check_structure(dashboard: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    if dashboard["schemaVersion"].as_u64().is_none_or(|v| v < 36) {
        problems.push("schemaVersion should be a number >= 36".to_owned());
    }
    let variables = dashboard["templating"]["list"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !variables.iter().any(|v| {
        v["name"] == "datasource" && v["type"] == "datasource" && v["query"] == "prometheus"
    }) {
        problems.push("no Prometheus datasource variable named datasource".to_owned());
    }
    let mut ids = BTreeSet::new();
    for panel in panels(dashboard) {
        let title = panel["title"].as_str().unwrap_or_default();
        if title.is_empty() {
            problems.push(format!("a panel without a title: {panel}"));
        }
        match panel["id"].as_u64() {
            Some(id) if !ids.insert(id) => problems.push(format!("panel id {id} is used twice")),
            None => problems.push(format!("panel {title:?} has no id")),
            _ => {}
        }
        if panel["type"] == "row" {
            continue;
        }
        if panel["datasource"]["uid"] != "${datasource}" {
            problems.push(format!("panel {title:?} does not use ${{datasource}}"));
        }
        let targets = panel["targets"].as_array().cloned().unwrap_or_default();
        if targets.is_empty() {
            problems.push(format!("panel {title:?} has no query"));
        }
        for target in &targets {
            if target["expr"].as_str().is_none_or(str::is_empty) {
                problems.push(format!("panel {title:?} has a target without expr"));
            }
            if !target["datasource"].is_null() && target["datasource"]["uid"] != "${datasource}" {
                problems.push(format!(
                    "panel {title:?} has a target with another datasource"
                ));
            }
        }
    }
    problems
}

/// Exported names `docs/metrics.md` does not mention (as a whole word), and a missing link to the dashboard.
pub fn check_docs(exported: &Exported) -> Vec<String> {
    let doc = read(METRICS_DOC);
    let words: BTreeSet<&str> = doc
        .split(|c: char| !is_ident(c))
        .filter(|w| !w.is_empty())
        .collect();
    let mut problems: Vec<String> = exported
        .documented_names()
        .into_iter()
        .filter(|name| !words.contains(name.as_str()))
        .map(|name| format!("{METRICS_DOC} does not mention {name}"))
        .collect();
    if !doc.contains("grafana/arc-rs-dashboard.json") {
        problems.push(format!("{METRICS_DOC} does not link the dashboard"));
    }
    problems
}

/// Runs every check for one part and panics with the list of problems.
pub fn assert_consistent(exported: &Exported, mine: fn(&str) -> bool, part: &str) {
    let mut problems = Vec::new();
    for family in exported.families_without_samples() {
        problems.push(format!(
            "{part} family {family} has no sample in the test, so its labels are unknown: record a value in it"
        ));
    }
    for series in exported.series.keys() {
        if !mine(series) {
            problems.push(format!(
                "{part} exports {series}, a name of the other part (see is_manager_metric)"
            ));
        }
    }
    let dashboard = dashboard();
    problems.extend(check_structure(&dashboard));
    match queries(&dashboard) {
        Ok(queries) => problems.extend(check_queries(&queries, exported, mine)),
        Err(e) => problems.push(e),
    }
    problems.extend(check_docs(exported));
    assert!(
        problems.is_empty(),
        "{DASHBOARD} or {METRICS_DOC} drifted from the {part}'s metrics:\n  {}",
        problems.join("\n  ")
    );
}

/// Unit checks of the PromQL reader itself, run by both tests.
pub fn check_reader() {
    let parsed = parse_promql(
        r#"histogram_quantile(0.95, sum by (le, controller) (rate(controller_runtime_reconcile_time_seconds_bucket{controller=~"$c"}[$__rate_interval])))"#,
    )
    .unwrap();
    assert_eq!(
        parsed,
        Parsed {
            references: vec![Reference {
                metric: "controller_runtime_reconcile_time_seconds_bucket".into(),
                matchers: vec!["controller".into()],
            }],
            grouping: vec!["le".into(), "controller".into()],
        }
    );
    let parsed = parse_promql(
        r#"sum(rate(a_total{x="1", y!~"a,b}"}[5m] offset 1h)) / on (x) group_left sum without (z) (b) > bool 0"#,
    )
    .unwrap();
    let metrics: Vec<&str> = parsed
        .references
        .iter()
        .map(|r| r.metric.as_str())
        .collect();
    assert_eq!(metrics, ["a_total", "b"]);
    assert_eq!(parsed.references[0].matchers, ["x", "y"]);
    assert_eq!(parsed.grouping, ["x", "z"]);
    assert!(parse_promql(r#"{__name__="x"}"#).is_err());
    let exported = Exported::parse(
        "# HELP c Help.\n# TYPE c counter\nc_total{a=\"x,\\\"y\",b=\"\"} 1\n# HELP h H.\n# TYPE h histogram\n# UNIT h seconds\n# EOF\n",
    );
    assert_eq!(
        exported.series["c_total"],
        BTreeSet::from(["a".into(), "b".into()])
    );
    assert_eq!(exported.families_without_samples(), ["h"]);
    assert_eq!(exported.documented_names(), ["c_total", "h"]);
    let problems = check_queries(
        &[Query {
            location: "q".into(),
            expr: "rate(c[1m]) + h".into(),
        }],
        &exported,
        |_| true,
    );
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].contains("_total") && problems[1].contains("_bucket"),
        "{problems:?}"
    );
}
