//! Proxy settings: read from the environment or given explicitly, with credentials, turned into reqwest
//! proxies (docs/reference/actions-service-protocol.md, "Proxy").
//!
//! The environment is read by this module rather than by reqwest so that the rules are the protocol's (upper-case
//! name wins, a scheme-less value means `http://`, loopback never proxied) and can be tested without touching the
//! process environment.

use std::fmt;

use url::Url;

use crate::error::Error;
use crate::secret::SecretString;

/// Hosts that are never proxied, whatever the settings say (Go's proxy rules skip loopback destinations).
const ALWAYS_DIRECT: &str = "localhost,127.0.0.0/8,::1";

/// Where the proxy settings come from.
#[derive(Debug, Clone, Default)]
pub enum ProxyConfig {
    /// `HTTP_PROXY`, `HTTPS_PROXY`, `NO_PROXY` (or their lower-case forms), read when the client is built.
    #[default]
    Environment,
    /// Connect directly.
    Disabled,
    /// The given settings; the environment is ignored.
    Explicit(ProxySettings),
}

/// Proxies per request scheme, plus exclusions. An `https://` request uses only `https`, an `http://` request only
/// `http`; there is no fallback between them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProxySettings {
    /// Proxy for `http://` URLs.
    pub http: Option<ProxyServer>,
    /// Proxy for `https://` URLs.
    pub https: Option<ProxyServer>,
    /// Hosts, domains (`example.com` also covers subdomains), IPs or CIDRs to reach directly; `*` for all.
    pub no_proxy: Vec<String>,
}

impl ProxySettings {
    /// Reads the process environment.
    pub fn from_env() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads settings through `lookup` (an environment-variable getter). The upper-case name wins when both
    /// spellings are non-empty; empty values count as unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let get = |upper: &str, lower: &str| {
            lookup(upper)
                .filter(|v| !v.trim().is_empty())
                .or_else(|| lookup(lower).filter(|v| !v.trim().is_empty()))
        };
        Self {
            http: get("HTTP_PROXY", "http_proxy").map(ProxyServer::new),
            https: get("HTTPS_PROXY", "https_proxy").map(ProxyServer::new),
            no_proxy: get("NO_PROXY", "no_proxy")
                .map(|list| {
                    list.split(',')
                        .map(|e| e.trim().to_ascii_lowercase())
                        .filter(|e| !e.is_empty())
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    /// Whether any proxy is configured.
    pub fn is_enabled(&self) -> bool {
        self.http.is_some() || self.https.is_some()
    }
}

/// One proxy server. Credentials may be in the URL's user-info or given separately (separate ones win).
#[derive(Clone, PartialEq, Eq)]
pub struct ProxyServer {
    /// `http://host:port`; a value without scheme is read as `http://`.
    pub url: String,
    /// Basic-auth user name.
    pub username: Option<String>,
    /// Basic-auth password.
    pub password: Option<SecretString>,
}

impl ProxyServer {
    /// A proxy without separate credentials.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            username: None,
            password: None,
        }
    }

    /// Adds basic-auth credentials.
    pub fn with_credentials(mut self, username: impl Into<String>, password: SecretString) -> Self {
        self.username = Some(username.into());
        self.password = Some(password);
        self
    }
}

impl fmt::Debug for ProxyServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ProxyServer")
            .field("url", &redact_url(&self.url))
            .field("username", &self.username)
            .field("password", &self.password)
            .finish()
    }
}

/// The URL with any password in its user-info replaced, for error messages and logs.
pub fn redact_url(raw: &str) -> String {
    match Url::parse(raw) {
        Ok(mut url) if url.password().is_some() => {
            // Setting a password only fails for URLs that cannot have one, which this one evidently can.
            let _ = url.set_password(Some("redacted"));
            url.to_string()
        }
        Ok(url) => url.to_string(),
        Err(_) if raw.contains('@') => "<unparseable proxy URL with user-info>".to_owned(),
        Err(_) => raw.to_owned(),
    }
}

/// Parses a proxy value: as given when it has a scheme and host, otherwise with `http://` prepended (Go's rule).
/// Only `http` and `https` proxies are supported.
pub fn parse_proxy_url(raw: &str) -> Result<Url, Error> {
    let fail = |reason: String| Error::ConfigureProxy {
        url: redact_url(raw),
        reason,
    };
    let url = match Url::parse(raw) {
        Ok(url) if url.has_host() && !url.host_str().unwrap_or_default().is_empty() => url,
        _ => Url::parse(&format!("http://{raw}")).map_err(|e| fail(e.to_string()))?,
    };
    match url.scheme() {
        "http" | "https" => Ok(url),
        other => Err(fail(format!(
            "unsupported proxy scheme {other:?}; use http or https"
        ))),
    }
}

/// The exclusion list handed to reqwest: loopback first, then the entries, with `*.example.com` read as
/// `.example.com` (reqwest only understands the leading-dot form).
pub fn no_proxy_list(entries: &[String]) -> String {
    let mut list = vec![ALWAYS_DIRECT.to_owned()];
    list.extend(entries.iter().map(|e| {
        let e = e.trim();
        e.strip_prefix("*.")
            .map_or_else(|| e.to_owned(), |rest| format!(".{rest}"))
    }));
    list.join(",")
}

/// The settings a configuration stands for now: the environment is read at this moment; `Disabled` is no proxy.
pub(crate) fn resolve(config: &ProxyConfig) -> ProxySettings {
    match config {
        ProxyConfig::Disabled => ProxySettings::default(),
        ProxyConfig::Environment => ProxySettings::from_env(),
        ProxyConfig::Explicit(settings) => settings.clone(),
    }
}

/// Turns settings into reqwest proxies (empty: connect directly).
pub(crate) fn reqwest_proxies(settings: &ProxySettings) -> Result<Vec<reqwest::Proxy>, Error> {
    let no_proxy = reqwest::NoProxy::from_string(&no_proxy_list(&settings.no_proxy));
    let mut proxies = Vec::new();
    for (server, for_https) in [(&settings.http, false), (&settings.https, true)] {
        let Some(server) = server else { continue };
        let url = parse_proxy_url(&server.url)?;
        let built = if for_https {
            reqwest::Proxy::https(url)
        } else {
            reqwest::Proxy::http(url)
        };
        let mut proxy = built.map_err(|e| Error::ConfigureProxy {
            url: redact_url(&server.url),
            reason: e.to_string(),
        })?;
        if let Some(username) = &server.username {
            let password = server
                .password
                .as_ref()
                .map(SecretString::expose_secret)
                .unwrap_or_default();
            proxy = proxy.basic_auth(username, password);
        }
        proxies.push(proxy.no_proxy(no_proxy.clone()));
    }
    Ok(proxies)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn lookup(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn environment_rules() {
        let settings = ProxySettings::from_lookup(lookup(&[
            ("HTTP_PROXY", "http://upper:3128"),
            ("http_proxy", "http://lower:3128"),
            ("HTTPS_PROXY", ""),
            ("https_proxy", "secure:3129"),
            ("no_proxy", " Example.com, 10.0.0.0/8 ,,"),
        ]));
        assert_eq!(settings.http, Some(ProxyServer::new("http://upper:3128")));
        assert_eq!(
            settings.https,
            Some(ProxyServer::new("secure:3129")),
            "empty upper-case value counts as unset"
        );
        assert_eq!(settings.no_proxy, ["example.com", "10.0.0.0/8"]);
        assert!(settings.is_enabled());
        let empty = ProxySettings::from_lookup(lookup(&[]));
        assert!(!empty.is_enabled());
        assert!(empty.no_proxy.is_empty());
    }

    #[test]
    fn proxy_url_parsing() {
        assert_eq!(
            parse_proxy_url("proxy:3128").expect("ok").as_str(),
            "http://proxy:3128/"
        );
        assert_eq!(
            parse_proxy_url("10.1.2.3:8080").expect("ok").as_str(),
            "http://10.1.2.3:8080/"
        );
        assert_eq!(
            parse_proxy_url("https://p.example").expect("ok").as_str(),
            "https://p.example/"
        );
        let err = parse_proxy_url("socks5://user:hunter2@p:1080").expect_err("socks");
        let text = err.to_string();
        assert!(text.contains("unsupported proxy scheme"), "{text}");
        assert!(!text.contains("hunter2"), "{text}");
    }

    #[test]
    fn redaction() {
        assert_eq!(
            redact_url("http://u:hunter2@p:3128"),
            "http://u:redacted@p:3128/"
        );
        assert_eq!(redact_url("http://p:3128"), "http://p:3128/");
        assert!(!redact_url("::u:hunter2@").contains("hunter2"));
        let server = ProxyServer::new("http://u:hunter2@p")
            .with_credentials("x", SecretString::new("pw-secret"));
        let printed = format!("{server:?}");
        assert!(
            !printed.contains("hunter2") && !printed.contains("pw-secret"),
            "{printed}"
        );
    }

    #[test]
    fn exclusions_always_cover_loopback() {
        assert_eq!(no_proxy_list(&[]), "localhost,127.0.0.0/8,::1");
        assert_eq!(
            no_proxy_list(&["*.corp.example".into(), "10.0.0.0/8".into(), "*".into()]),
            "localhost,127.0.0.0/8,::1,.corp.example,10.0.0.0/8,*"
        );
    }

    #[test]
    fn builds_reqwest_proxies() {
        let settings = ProxySettings {
            http: Some(
                ProxyServer::new("proxy:3128").with_credentials("u", SecretString::new("p")),
            ),
            https: Some(ProxyServer::new("https://secure:443")),
            no_proxy: vec!["internal".into()],
        };
        assert_eq!(
            reqwest_proxies(&resolve(&ProxyConfig::Explicit(settings)))
                .expect("builds")
                .len(),
            2
        );
        assert!(
            reqwest_proxies(&resolve(&ProxyConfig::Disabled))
                .expect("builds")
                .is_empty()
        );
        let bad = ProxySettings {
            https: Some(ProxyServer::new("ftp://x")),
            ..Default::default()
        };
        assert!(matches!(
            reqwest_proxies(&resolve(&ProxyConfig::Explicit(bad))),
            Err(Error::ConfigureProxy { .. })
        ));
    }
}
