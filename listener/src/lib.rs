//! The scale-set listener.
