//! One module per subcommand: parse arguments, call the libraries, print.
pub mod trace;
