//! Workflow name and target from a job's `jobWorkflowRef` (`{owner}/{repo}/.github/workflows/{file}@{ref}`),
//! for the optional `job_workflow_name` and `job_workflow_target` metric labels.

/// The parts of a workflow ref that make useful labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkflowRef {
    /// The workflow file name without `.yml`/`.yaml`, e.g. `ci` or `build.test`.
    pub name: String,
    /// `heads/<branch>`, `tags/<tag>`, `pull/<number>`, or empty for anything else.
    pub target: String,
}

/// Parses a workflow ref. Anything that is not `<path>@<ref>` with exactly one `@` gives empty parts.
pub fn parse(workflow_ref: &str) -> WorkflowRef {
    let mut parts = workflow_ref.split('@');
    let (Some(path), Some(reference), None) = (parts.next(), parts.next(), parts.next()) else {
        return WorkflowRef::default();
    };
    let file = base_name(path);
    let name = file.strip_suffix(".yml").unwrap_or(file);
    let name = name.strip_suffix(".yaml").unwrap_or(name);
    WorkflowRef {
        name: name.to_owned(),
        target: target(reference),
    }
}

/// The last `/`-separated element, ignoring trailing slashes; `.` for an empty path and `/` for a path of only
/// slashes (the conventions of Go's `path.Base`, which dashboards built on ARC's labels already see).
fn base_name(path: &str) -> &str {
    if path.is_empty() {
        return ".";
    }
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        return "/";
    }
    trimmed.rsplit('/').next().unwrap_or(trimmed)
}

fn target(reference: &str) -> String {
    if let Some(branch) = reference.strip_prefix("refs/heads/") {
        return format!("heads/{branch}");
    }
    if let Some(tag) = reference.strip_prefix("refs/tags/") {
        return format!("tags/{tag}");
    }
    if let Some(pull) = reference.strip_prefix("refs/pull/") {
        return match pull.find('/') {
            Some(end) if end > 0 => format!("pull/{}", &pull[..end]),
            _ => String::new(),
        };
    }
    String::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table() {
        let cases = [
            ("", "", ""),
            ("no-at-sign", "", ""),
            ("a@b@c", "", ""),
            (
                "org/repo/.github/workflows/ci.yml@refs/heads/main",
                "ci",
                "heads/main",
            ),
            (
                "org/repo/.github/workflows/ci.yaml@refs/heads/feature/new-feature",
                "ci",
                "heads/feature/new-feature",
            ),
            (
                "org/repo/.github/workflows/build.test.yml@refs/tags/v1.2.3",
                "build.test",
                "tags/v1.2.3",
            ),
            (
                "org/repo/.github/workflows/pr.yml@refs/pull/123/merge",
                "pr",
                "pull/123",
            ),
            ("org/repo/.github/workflows/pr.yml@refs/pull/123", "pr", ""),
            ("org/repo/.github/workflows/pr.yml@refs/pull//x", "pr", ""),
            ("org/repo/.github/workflows/x.yml@main", "x", ""),
            (
                "org/repo/.github/workflows/x.json@refs/heads/m",
                "x.json",
                "heads/m",
            ),
            ("org/repo/.github/workflows/x.yaml.yml@r", "x", ""),
            ("org/repo/dir/@refs/heads/m", "dir", "heads/m"),
            ("@refs/heads/m", ".", "heads/m"),
            ("///@refs/tags/t", "/", "tags/t"),
        ];
        for (input, name, target) in cases {
            assert_eq!(
                parse(input),
                WorkflowRef {
                    name: name.to_owned(),
                    target: target.to_owned()
                },
                "{input:?}"
            );
        }
    }
}
