//! relaybus: the operator's tool for a relaybus event bus. The library is the store engine
//! (`store`), the dispatcher (`dispatch`) and its handlers (`handler`), and the benchmark
//! harness (`bench`); `cli` is the thin command-line layer over them.

#![warn(unreachable_pub)]

pub mod backoff;
pub mod bench;
pub mod bounds;
pub mod cli;
pub mod config;
pub mod dispatch;
pub mod handler;
pub mod identity;
pub mod store;
#[cfg(test)]
mod test_servers;
