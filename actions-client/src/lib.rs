//! Client for the GitHub Actions Service scale-set API and the GitHub API calls it needs.
