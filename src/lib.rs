//! Shared helpers for Fulcrum's end-to-end tests (`tests/`) and benchmarks
//! (`benches/`): the config text they run Fulcrum with. The clusters and the
//! daemon process come from `fulcrum-testkit`.
