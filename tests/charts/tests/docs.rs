//! The documentation's references hold: every relative link names a file that exists (and, with `#anchor`, a
//! heading of that file), and every repository path quoted in backticks (`controller/src/...`) exists. Code moves;
//! a page that points at what is no longer there sends a reader nowhere.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use chart_tests::repo_root;

/// The pages a reader of the repository meets.
fn pages() -> Vec<PathBuf> {
    let root = repo_root();
    let mut pages: Vec<PathBuf> = ["README.md", "CHANGELOG.md", "SECURITY.md"]
        .iter()
        .map(|page| root.join(page))
        .collect();
    let mut dirs = vec![root.join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read docs") {
            let path = entry.expect("docs entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                pages.push(path);
            }
        }
    }
    pages.sort();
    pages
}

/// A heading's anchor as GitHub makes it: lower case, punctuation dropped (hyphens and underscores kept, code
/// and emphasis marks dropped), spaces as hyphens.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | ' ' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(page: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(page).expect("read page");
    let mut in_code = false;
    let mut anchors = BTreeSet::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        if let Some(heading) = line.strip_prefix('#') {
            let heading = heading.trim_start_matches('#');
            if heading.starts_with(' ') {
                anchors.insert(anchor(&heading.replace(['`', '*'], "")));
            }
        }
    }
    anchors
}

/// The targets of `[text](target)` links in `text`.
fn links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        if let Some(end) = rest.find(')') {
            let target = &rest[..end];
            if !target.contains(char::is_whitespace) {
                links.push(target.to_owned());
            }
        }
    }
    links
}

#[test]
fn anchor_follows_githubs_rule() {
    assert_eq!(
        anchor("8. Scale-down spares busy and just-ready runners"),
        "8-scale-down-spares-busy-and-just-ready-runners"
    );
    assert_eq!(
        anchor("Scheduled minimums (minRunnersSchedules, not in ARC)"),
        "scheduled-minimums-minrunnersschedules-not-in-arc"
    );
}

#[test]
fn every_relative_link_in_the_docs_leads_somewhere() {
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("read page");
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                continue;
            }
            let (path, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                page.clone()
            } else {
                page.parent().expect("a page's folder").join(path)
            };
            if !target.exists() {
                broken.push(format!("{}: {link}: no such file", page.display()));
            } else if !fragment.is_empty()
                && target.extension().is_some_and(|ext| ext == "md")
                && !anchors(&target).contains(fragment)
            {
                broken.push(format!("{}: {link}: no such heading", page.display()));
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn every_repository_path_the_docs_quote_exists() {
    let root = repo_root();
    let tops = [
        "controller/",
        "crds/",
        "listener/",
        "actions-client/",
        "vault/",
        "charts/",
        "tests/",
    ];
    let mut missing = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("read page");
        for quoted in text.split('`').skip(1).step_by(2) {
            if !tops.iter().any(|top| quoted.starts_with(top))
                || quoted.contains(char::is_whitespace)
            {
                continue;
            }
            // `path::item` and `path#anchor` name something inside the file.
            let path = quoted.split("::").next().unwrap_or(quoted);
            let path = path.split('#').next().unwrap_or(path);
            if path.contains(['*', '<', '{']) {
                continue;
            }
            if !root.join(path).exists() {
                missing.push(format!("{}: {quoted}", page.display()));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "paths the docs quote that do not exist:\n{}",
        missing.join("\n")
    );
}
