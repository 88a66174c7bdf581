//! Unit tests of the engine with a toy driver (see also `core/tests/serve_prop.rs`).
