//! Policy names: the replay's view of the one registry, [`PolicyConfig::NAMES`].

use moonagent_core::store::{PolicyConfig, PolicyNameError};

/// Every policy name `PolicyConfig` knows, in its order (its own list,
/// [`PolicyConfig::NAMES`]).
pub const POLICY_NAMES: [&str; PolicyConfig::NAMES.len()] = PolicyConfig::NAMES;

/// A policy by name with default settings (`hierarchical` has no default tree: give it a
/// config file): [`PolicyConfig::by_name`].
pub fn policy_by_name(name: &str) -> Result<PolicyConfig, PolicyNameError> {
    PolicyConfig::by_name(name)
}
