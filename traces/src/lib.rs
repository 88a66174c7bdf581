//! moonagent-traces
