//! Every fixed value of the vault credential source in one place.

use std::time::Duration;

/// Entra ID's public-cloud authority host (overridable for other clouds and for tests).
pub const DEFAULT_AUTHORITY_HOST: &str = "https://login.microsoftonline.com/";
/// Environment variable overriding the authority host (the one Azure's SDKs read).
pub const AUTHORITY_HOST_ENV: &str = "AZURE_AUTHORITY_HOST";
/// The OAuth scope of Azure Key Vault's data plane in Azure's public cloud. The client asks the vault instead
/// (its authentication challenge names the resource, as Azure's SDKs read it), so a vault in another cloud gets
/// a token for its own.
pub const KEY_VAULT_SCOPE: &str = "https://vault.azure.net/.default";
/// The Key Vault resources of Azure's clouds (public, China, US Government, Germany): a challenge naming one of
/// them is taken as it comes. Any other resource is taken only when the vault's host lies within it, so a vault URL
/// cannot make the client ask for a token to another service.
pub const KEY_VAULT_RESOURCES: [&str; 4] = [
    "vault.azure.net",
    "vault.azure.cn",
    "vault.usgovcloudapi.net",
    "vault.microsoftazure.de",
];
/// The secret name of the request that asks the vault for its authentication challenge: sent without a token,
/// it is answered with the challenge before any name is looked up.
pub const KEY_VAULT_CHALLENGE_PROBE: &str = "arc-rs-challenge";
/// The Key Vault REST API version of the "get secret" call.
pub const KEY_VAULT_API_VERSION: &str = "7.4";
/// `client_assertion_type` of a JWT-bearer client assertion (RFC 7523).
pub const CLIENT_ASSERTION_TYPE: &str = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";
/// The JWS algorithm of the client assertion: RSA-PSS with SHA-256, the one Entra ID documents together with
/// the `x5t#S256` thumbprint header.
pub const ASSERTION_ALGORITHM: &str = "PS256";
/// How long a client assertion is valid; it is used once, right away.
pub const ASSERTION_LIFETIME: Duration = Duration::from_secs(10 * 60);
/// A token is refreshed this long before it expires (or halfway through its life, if that is sooner), so a
/// request never leaves with a token about to lapse.
pub const TOKEN_REFRESH_MARGIN: Duration = Duration::from_secs(5 * 60);
/// Default deadline of each call (token request, secret read), connection included.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(15);
/// Largest certificate file read; real ones are a few kilobytes.
pub const MAX_CERTIFICATE_FILE_BYTES: u64 = 1 << 20;

/// Condition reasons, one per thing an operator does about it (see [`crate::Error::reason`]).
pub mod reasons {
    /// The certificate file is missing or unreadable: check the volume mount and `certificatePath`.
    pub const CERTIFICATE_UNREADABLE: &str = "VaultCertificateUnreadable";
    /// The certificate file holds no usable certificate and RSA key pair: replace the file.
    pub const CERTIFICATE_INVALID: &str = "VaultCertificateInvalid";
    /// Entra ID rejected the tenant, the client or its certificate: check `tenantId`, `clientId` and the
    /// certificate uploaded to the app registration.
    pub const AUTHENTICATION_FAILED: &str = "VaultAuthenticationFailed";
    /// Entra ID or the vault could not be reached or answered with a server error: check the network, the proxy
    /// and the vault URL.
    pub const UNREACHABLE: &str = "VaultUnreachable";
    /// The vault refused the token: grant the app read access to secrets.
    pub const ACCESS_DENIED: &str = "VaultAccessDenied";
    /// No secret by that name: check `githubConfigSecret` and the vault.
    pub const SECRET_NOT_FOUND: &str = "VaultSecretNotFound";
    /// The secret's value is not JSON app config with exactly one complete credential kind.
    pub const SECRET_INVALID: &str = "VaultSecretInvalid";
    /// The vault settings themselves are unusable (URL, IDs, secret name).
    pub const CONFIG_INVALID: &str = "VaultConfigInvalid";
}
