//! The controller manager: the four reconcilers.
