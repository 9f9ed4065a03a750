//! Helpers to render the charts with a real `helm` and inspect the objects.
