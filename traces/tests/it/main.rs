//! Integration tests of moonagent-traces, in one binary to keep link time down.

mod bad_input;
mod common;
mod fuzz;
mod generators;
mod mooncake;
mod raw_trace_hint;
mod roundtrip;
