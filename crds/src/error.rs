//! The crate's error type.

use std::path::PathBuf;

use crate::appconfig::CredentialsProblem;

/// Everything that can fail in this crate, one variant per failed operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A key of a credentials Secret could not be read.
    #[error("parse GitHub credentials from Secret key {key}: {reason}")]
    ParseSecretCredentials {
        /// The Secret key.
        key: &'static str,
        /// What is wrong with its value.
        reason: String,
    },

    /// A credentials JSON document (vault secret) could not be decoded.
    #[error("parse GitHub credentials JSON: {0}")]
    ParseJsonCredentials(#[source] serde_json::Error),

    /// The credentials are not exactly one complete kind.
    #[error("validate GitHub credentials: {0}")]
    ValidateCredentials(#[source] CredentialsProblem),

    /// A CRD could not be serialised to YAML.
    #[error("render CRD {name} as YAML: {source}")]
    RenderCrd {
        /// The CRD's `metadata.name`.
        name: String,
        /// The serialiser's error.
        source: serde_saphyr::SerializeError,
    },

    /// A CRD file could not be written.
    #[error("write CRD file {}: {source}", path.display())]
    WriteCrdFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },

    /// A CRD file or directory could not be read.
    #[error("read CRD file {}: {source}", path.display())]
    ReadCrdFile {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}
