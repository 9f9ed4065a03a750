//! A stateful fake of the GitHub Actions Service.
