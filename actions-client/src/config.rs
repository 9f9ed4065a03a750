//! The GitHub config URL: which repository, organization or enterprise the scale set belongs to, whether it is
//! hosted GitHub or GitHub Enterprise Server, and where the GitHub REST API lives
//! (docs/reference/actions-service-protocol.md, "Config URL").

use std::fmt;

use url::Url;

use crate::error::{ConfigUrlProblem, Error};

/// Environment variable that, when present with any value, makes every URL count as GitHub Enterprise Server.
pub const FORCE_GHES_ENV: &str = "GITHUB_ACTIONS_FORCE_GHES";

/// The owner of the runners: what the config URL points at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// `https://host/{organization}`.
    Organization {
        /// Organization login.
        organization: String,
    },
    /// `https://host/enterprises/{enterprise}`.
    Enterprise {
        /// Enterprise slug.
        enterprise: String,
    },
    /// `https://host/{owner}/{repository}`.
    Repository {
        /// Owning user or organization.
        owner: String,
        /// Repository name.
        repository: String,
    },
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Organization { organization } => write!(f, "organization {organization}"),
            Self::Enterprise { enterprise } => write!(f, "enterprise {enterprise}"),
            Self::Repository { owner, repository } => write!(f, "repository {owner}/{repository}"),
        }
    }
}

/// A parsed GitHub config URL (`githubConfigUrl`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitHubConfig {
    /// The input with leading and trailing `/` removed: the exact string sent to runner-registration.
    canonical: String,
    url: Url,
    scope: Scope,
    hosted: bool,
}

impl GitHubConfig {
    /// Parses a config URL, reading [`FORCE_GHES_ENV`] from the process environment.
    pub fn parse(input: &str) -> Result<Self, Error> {
        Self::parse_with(input, std::env::var_os(FORCE_GHES_ENV).is_some())
    }

    /// Parses a config URL; `force_ghes` has the effect of [`FORCE_GHES_ENV`] being present.
    pub fn parse_with(input: &str, force_ghes: bool) -> Result<Self, Error> {
        let canonical = input.trim_matches('/').to_owned();
        let fail = |problem| Error::ParseConfigUrl {
            url: input.to_owned(),
            problem,
        };
        let url =
            Url::parse(&canonical).map_err(|e| fail(ConfigUrlProblem::NotAUrl(e.to_string())))?;
        if !url.has_host() {
            return Err(fail(ConfigUrlProblem::NoHost));
        }
        let segments: Vec<&str> = url.path().trim_matches('/').split('/').collect();
        let scope = match segments.as_slice() {
            [org] if !org.is_empty() => Scope::Organization {
                organization: (*org).to_owned(),
            },
            [first, enterprise]
                if first.eq_ignore_ascii_case("enterprises") && !enterprise.is_empty() =>
            {
                Scope::Enterprise {
                    enterprise: (*enterprise).to_owned(),
                }
            }
            [owner, repository] if !owner.is_empty() && !repository.is_empty() => {
                Scope::Repository {
                    owner: (*owner).to_owned(),
                    repository: (*repository).to_owned(),
                }
            }
            _ => return Err(fail(ConfigUrlProblem::NotAScope)),
        };
        let hosted = !force_ghes && is_hosted_host(&host_with_port(&url));
        Ok(Self {
            canonical,
            url,
            scope,
            hosted,
        })
    }

    /// The config URL as sent to runner-registration (trailing `/` removed).
    pub fn as_str(&self) -> &str {
        &self.canonical
    }

    /// The parsed URL.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// Repository, organization or enterprise.
    pub fn scope(&self) -> &Scope {
        &self.scope
    }

    /// Whether this is hosted GitHub (github.com, GHE.com) rather than GitHub Enterprise Server.
    pub fn is_hosted(&self) -> bool {
        self.hosted
    }

    /// The GitHub REST API base, without a trailing slash: `https://api.github.com` for hosted GitHub,
    /// `https://host/api/v3` otherwise.
    pub fn api_base(&self) -> String {
        let scheme = self.url.scheme();
        let host = host_with_port(&self.url);
        if self.hosted {
            if host.eq_ignore_ascii_case("www.github.com") {
                format!("{scheme}://api.github.com")
            } else {
                format!("{scheme}://api.{host}")
            }
        } else {
            format!("{scheme}://{host}/api/v3")
        }
    }

    /// A GitHub REST API URL: `path` (starting with `/`) appended to [`Self::api_base`].
    pub fn api_url(&self, path: &str) -> Result<Url, Error> {
        let joined = format!("{}{path}", self.api_base());
        Url::parse(&joined).map_err(|e| Error::ParseConfigUrl {
            url: joined,
            problem: ConfigUrlProblem::NotAUrl(e.to_string()),
        })
    }

    /// The registration-token path for this scope.
    pub fn registration_token_path(&self) -> String {
        match &self.scope {
            Scope::Organization { organization } => {
                format!("/orgs/{organization}/actions/runners/registration-token")
            }
            Scope::Enterprise { enterprise } => {
                format!("/enterprises/{enterprise}/actions/runners/registration-token")
            }
            Scope::Repository { owner, repository } => {
                format!("/repos/{owner}/{repository}/actions/runners/registration-token")
            }
        }
    }
}

impl fmt::Display for GitHubConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical)
    }
}

/// Host plus an explicit port, the way Go's `URL.Host` reads (a default port given explicitly is dropped by the
/// `url` crate; that only matters for URLs such as `https://github.com:443/org`).
fn host_with_port(url: &Url) -> String {
    let host = url.host_str().unwrap_or_default();
    match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host.to_owned(),
    }
}

/// Hosted GitHub: the three fixed names case-insensitively, or a `.ghe.com` suffix (case-sensitive, as in the
/// reference client).
fn is_hosted_host(host: &str) -> bool {
    ["github.com", "www.github.com", "github.localhost"]
        .iter()
        .any(|h| host.eq_ignore_ascii_case(h))
        || host.ends_with(".ghe.com")
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn org(o: &str) -> Scope {
        Scope::Organization {
            organization: o.to_owned(),
        }
    }

    fn repo(o: &str, r: &str) -> Scope {
        Scope::Repository {
            owner: o.to_owned(),
            repository: r.to_owned(),
        }
    }

    #[test]
    fn scope_and_hosting_table() {
        let cases = [
            ("https://github.com/org/repo", repo("org", "repo"), true),
            ("https://github.com/org/repo/", repo("org", "repo"), true),
            ("https://github.com/org", org("org"), true),
            (
                "https://github.com/enterprises/my-enterprise/",
                Scope::Enterprise {
                    enterprise: "my-enterprise".into(),
                },
                true,
            ),
            (
                "https://github.com/Enterprises/e",
                Scope::Enterprise {
                    enterprise: "e".into(),
                },
                true,
            ),
            ("https://www.github.com/org", org("org"), true),
            ("https://GitHub.com/org", org("org"), true),
            ("https://github.localhost/org", org("org"), true),
            ("https://my-ghes.com/org", org("org"), false),
            ("https://my-ghes.ghe.com/org/", org("org"), true),
            ("http://127.0.0.1:8080/my-org", org("my-org"), false),
        ];
        for (input, scope, hosted) in cases {
            let config =
                GitHubConfig::parse_with(input, false).unwrap_or_else(|e| panic!("{input}: {e}"));
            assert_eq!(config.scope(), &scope, "{input}");
            assert_eq!(config.is_hosted(), hosted, "{input}");
        }
    }

    #[test]
    fn invalid_urls_are_rejected_with_the_reason() {
        for input in [
            "https://github.com",
            "https://github.com/",
            "https://github.com/some/random/path",
            "https://github.com/a//b",
        ] {
            let err = GitHubConfig::parse_with(input, false).expect_err(input);
            assert!(
                matches!(
                    &err,
                    Error::ParseConfigUrl {
                        problem: ConfigUrlProblem::NotAScope,
                        ..
                    }
                ),
                "{input}: {err:?}"
            );
            assert!(
                err.to_string().contains("enterprise, org, or repository"),
                "{err}"
            );
        }
        let err = GitHubConfig::parse_with("not a url", false).expect_err("garbage");
        assert!(matches!(
            err,
            Error::ParseConfigUrl {
                problem: ConfigUrlProblem::NotAUrl(_),
                ..
            }
        ));
    }

    #[test]
    fn canonical_string_drops_surrounding_slashes() {
        let config =
            GitHubConfig::parse_with("https://github.com/org/repo/", false).expect("valid");
        assert_eq!(config.as_str(), "https://github.com/org/repo");
        assert_eq!(config.to_string(), "https://github.com/org/repo");
    }

    #[test]
    fn api_base_table() {
        let cases = [
            (
                "https://github.com/org/repo",
                false,
                "https://api.github.com",
            ),
            (
                "https://www.github.com/org/repo",
                false,
                "https://api.github.com",
            ),
            (
                "http://github.localhost/org/repo",
                false,
                "http://api.github.localhost",
            ),
            (
                "https://github.ghe.com/org/repo",
                false,
                "https://api.github.ghe.com",
            ),
            (
                "https://my-instance.com/org/repo",
                false,
                "https://my-instance.com/api/v3",
            ),
            (
                "http://localhost/org/repo",
                false,
                "http://localhost/api/v3",
            ),
            (
                "http://127.0.0.1:3000/org",
                false,
                "http://127.0.0.1:3000/api/v3",
            ),
            (
                "https://test.ghe.com/org/repo",
                true,
                "https://test.ghe.com/api/v3",
            ),
            ("https://github.com/org", true, "https://github.com/api/v3"),
        ];
        for (input, force, base) in cases {
            let config = GitHubConfig::parse_with(input, force).expect(input);
            assert_eq!(config.api_base(), base, "{input}");
        }
        let config = GitHubConfig::parse_with("https://github.com/org/repo", false).expect("valid");
        assert_eq!(
            config
                .api_url("/app/installations/123/access_tokens")
                .expect("url")
                .as_str(),
            "https://api.github.com/app/installations/123/access_tokens"
        );
    }

    #[test]
    fn registration_token_path_per_scope() {
        let cases = [
            (
                "https://github.com/o",
                "/orgs/o/actions/runners/registration-token",
            ),
            (
                "https://github.com/enterprises/e",
                "/enterprises/e/actions/runners/registration-token",
            ),
            (
                "https://github.com/o/r",
                "/repos/o/r/actions/runners/registration-token",
            ),
        ];
        for (input, path) in cases {
            let config = GitHubConfig::parse_with(input, false).expect(input);
            assert_eq!(config.registration_token_path(), path);
        }
    }
}
