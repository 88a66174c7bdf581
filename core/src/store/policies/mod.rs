//! Eviction policies beyond `mooncake-default` (issue 5). Being written.
