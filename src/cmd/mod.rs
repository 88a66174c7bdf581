//! One module per subcommand: parse arguments, call the libraries, print.
pub mod demo;
pub mod plot;
pub mod replay;
pub mod repro;
pub mod simulate;
pub mod sweep;
pub mod trace;
pub mod util;
pub mod validate;
