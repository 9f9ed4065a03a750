//! A real local control plane for tests.
