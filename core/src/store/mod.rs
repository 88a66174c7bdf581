//! The store: Mooncake Store semantics.
