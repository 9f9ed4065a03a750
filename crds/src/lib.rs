//! The four `actions.github.com/v1alpha1` kinds as Rust types.
