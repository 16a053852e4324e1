//! End-to-end tests: the real binary against a real PostgreSQL (RELAYBUS_TEST_DATABASE_URL,
//! default the local server) and a real MongoDB wire server (RELAYBUS_TEST_MONGODB_URL, default
//! 127.0.0.1:27017), each test in a schema or database of its own.

mod admin;
mod bench;
mod budget;
mod cli;
mod common;
mod conformance;
mod connect;
mod dispatch;
mod doctor;
mod faults;
mod handlers;
mod layout;
mod metrics;
mod mongo;
mod pgbouncer;
mod publish;
mod publish_sql;
mod replay;
mod rolling;
mod run;
mod scenarios;
mod schema;
mod sql_handler;
mod startup;
mod top;
