//! Proxy settings of a resource (`spec.proxy`): for the controller's own Actions client and as the data of the
//! proxy Secret that runner pods read their `http_proxy`/`https_proxy`/`no_proxy` from
//! (docs/reference/controllers.md, "Proxy Secrets").

use std::collections::BTreeMap;
use std::future::Future;

use actions_client::{ProxyServer, ProxySettings, SecretString};
use crds::common::{ProxyConfig, ProxyServerConfig};
use kube::Client;
use url::Url;

use crate::actions::read_secret;
use crate::error::{Error, Result};

/// Secret keys of proxy credentials.
const USERNAME_KEY: &str = "username";
const PASSWORD_KEY: &str = "password";

/// Keys of the proxy Secret, also the environment variable names in runner pods.
pub const HTTP_PROXY_KEY: &str = "http_proxy";
/// See [`HTTP_PROXY_KEY`].
pub const HTTPS_PROXY_KEY: &str = "https_proxy";
/// See [`HTTP_PROXY_KEY`].
pub const NO_PROXY_KEY: &str = "no_proxy";

async fn credentials(
    client: &Client,
    namespace: &str,
    server: &ProxyServerConfig,
) -> Result<Option<(String, String)>> {
    if server.credential_secret_ref.is_empty() {
        return Ok(None);
    }
    let name = &server.credential_secret_ref;
    let fail = |reason: &str| Error::ReadProxyCredentials {
        namespace: namespace.to_owned(),
        name: name.clone(),
        reason: reason.to_owned(),
    };
    let secret = read_secret(client, namespace, name)
        .await?
        .ok_or_else(|| fail("the Secret does not exist"))?;
    let data = secret.data.unwrap_or_default();
    let text = |key: &str| -> Result<String> {
        let bytes = data
            .get(key)
            .map(|value| value.0.clone())
            .unwrap_or_default();
        String::from_utf8(bytes).map_err(|_| fail("a value is not UTF-8"))
    };
    Ok(Some((text(USERNAME_KEY)?, text(PASSWORD_KEY)?)))
}

/// The proxy settings of an Actions client for a resource in `namespace`.
pub async fn client_settings(
    client: &Client,
    namespace: &str,
    proxy: &ProxyConfig,
) -> Result<ProxySettings> {
    settings_with(proxy, |server| async move {
        Ok(credentials(client, namespace, server)
            .await?
            .map(|(username, password)| (username, SecretString::new(password))))
    })
    .await
}

/// The proxy settings of an Actions client, each server's credentials (when it names a `credentialSecretRef`)
/// from `credentials`: a Kubernetes Secret ([`client_settings`]) or a vault secret.
pub async fn settings_with<'a, F, Fut>(
    proxy: &'a ProxyConfig,
    mut credentials: F,
) -> Result<ProxySettings>
where
    F: FnMut(&'a ProxyServerConfig) -> Fut,
    Fut: Future<Output = Result<Option<(String, SecretString)>>>,
{
    let mut settings = ProxySettings {
        no_proxy: proxy.no_proxy.clone(),
        ..ProxySettings::default()
    };
    for (config, slot) in [
        (&proxy.http, &mut settings.http),
        (&proxy.https, &mut settings.https),
    ] {
        let Some(config) = config.as_ref().filter(|config| !config.url.is_empty()) else {
            continue;
        };
        let server = ProxyServer::new(config.url.clone());
        *slot = Some(match credentials(config).await? {
            Some((username, password)) => server.with_credentials(username, password),
            None => server,
        });
    }
    Ok(settings)
}

/// `url` with `username:password@` inserted (URL-escaped), or unchanged without credentials.
pub fn url_with_credentials(
    url: &str,
    credentials: Option<(&str, &str)>,
) -> Result<String, url::ParseError> {
    let Some((username, password)) = credentials else {
        return Ok(url.to_owned());
    };
    let mut parsed = Url::parse(url)?;
    // Only URLs without a host refuse credentials; a proxy URL has one, so the results can be ignored safely
    // after checking for that case.
    if !parsed.has_host() {
        return Err(url::ParseError::EmptyHost);
    }
    let _ = parsed.set_username(username);
    let _ = parsed.set_password(Some(password));
    Ok(parsed.to_string())
}

/// The data of a proxy Secret: always the three keys, possibly empty.
pub async fn secret_data(
    client: &Client,
    namespace: &str,
    resource: &str,
    proxy: &ProxyConfig,
) -> Result<BTreeMap<String, String>> {
    let mut data = BTreeMap::new();
    for (key, config) in [
        (HTTP_PROXY_KEY, &proxy.http),
        (HTTPS_PROXY_KEY, &proxy.https),
    ] {
        let value = match config {
            Some(config) => {
                let credentials = credentials(client, namespace, config).await?;
                url_with_credentials(
                    &config.url,
                    credentials.as_ref().map(|(u, p)| (u.as_str(), p.as_str())),
                )
                .map_err(|e| Error::ProxyUrl {
                    namespace: namespace.to_owned(),
                    name: resource.to_owned(),
                    source: actions_client::Error::ConfigureProxy {
                        url: actions_client::proxy::redact_url(&config.url),
                        reason: e.to_string(),
                    },
                })?
            }
            None => String::new(),
        };
        data.insert(key.to_owned(), value);
    }
    data.insert(NO_PROXY_KEY.to_owned(), proxy.no_proxy.join(","));
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_are_escaped_into_the_url() {
        assert_eq!(
            url_with_credentials("http://proxy:3128", Some(("us er", "p@ss:word"))).unwrap(),
            "http://us%20er:p%40ss%3Aword@proxy:3128/"
        );
        assert_eq!(
            url_with_credentials("http://proxy:3128", None).unwrap(),
            "http://proxy:3128"
        );
        assert!(url_with_credentials("not a url", Some(("u", "p"))).is_err());
    }
}
