//! End-to-end tests: the real binary against a real PostgreSQL (RELAYBUS_TEST_DATABASE_URL,
//! default the local server), each test in a schema of its own.

mod admin;
mod bench;
mod budget;
mod cli;
mod common;
mod conformance;
mod dispatch;
mod faults;
mod hardening;
mod metrics;
mod pgbouncer;
mod publish;
mod run;
mod schema;
mod sql_handler;
