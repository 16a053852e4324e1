//! relaybus: the operator's tool for a relaybus event bus. The library is the store engine and
//! the dispatcher; `cli` is the thin command-line layer over it.

pub mod cli;
pub mod store;
