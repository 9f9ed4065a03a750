//! A string that must never be printed: tokens, private keys, JIT configurations.
//!
//! A small newtype is enough here: the client only needs "carry it, hand it to the HTTP layer, never format it".
//! `Debug` prints a fixed placeholder and there is deliberately no `Display`, so a secret cannot reach a log line
//! or an error message by accident (`tracing` fields and `{}` formatting both need one of the two).

use std::fmt;

/// A secret string whose `Debug` form is redacted and which has no `Display` form.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretString(Box<str>);

impl SecretString {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into().into_boxed_str())
    }

    /// Returns the secret value. Call sites are easy to audit with `grep expose_secret`.
    pub fn expose_secret(&self) -> &str {
        &self.0
    }

    /// Whether the secret is the empty string (an empty credential is always a configuration error).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretString(<redacted>)")
    }
}

impl From<String> for SecretString {
    fn from(value: String) -> Self {
        Self::new(value)
    }
}

impl From<&str> for SecretString {
    fn from(value: &str) -> Self {
        Self::new(value)
    }
}

impl serde::Serialize for SecretString {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // Serialising is how a JIT config or token is handed on on purpose (e.g. into a Kubernetes Secret);
        // it is not a formatting path, so the value is written as is.
        serializer.serialize_str(&self.0)
    }
}

impl<'de> serde::Deserialize<'de> for SecretString {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self::from)
    }
}

impl Default for SecretString {
    fn default() -> Self {
        Self::new(String::new())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_never_shows_the_value() {
        let secret = SecretString::new("ghp_supersecret");
        let printed = format!("{secret:?} {:?}", Some(&secret));
        assert!(!printed.contains("supersecret"), "{printed}");
        assert!(printed.contains("redacted"));
    }

    #[test]
    fn exposes_and_round_trips_through_serde() {
        let secret: SecretString = serde_json::from_str("\"abc\"").expect("decodes");
        assert_eq!(secret.expose_secret(), "abc");
        assert_eq!(serde_json::to_string(&secret).expect("encodes"), "\"abc\"");
        assert!(SecretString::default().is_empty());
    }
}
