//! What the command-line scenarios both engines must pass (`handlers`, `drain`, `replay`,
//! `workers`) need of a store: the binary pointed at it, and the library's store over the same
//! namespace. `tests/scenarios.rs` runs every scenario on each engine from one list.

use std::process::{Command as StdCommand, Stdio};
use std::time::Duration;

use assert_cmd::Command;
use relaybus::store::{AnyStore, StoreOptions};
use serde_json::Value;

use super::mongo::{mongo_url, TestMongo};
use super::{stderr, Spawned, TestSchema};

/// A fresh, installed store of one engine.
pub trait Target {
    /// The binary, pointed at this store.
    fn binary(&self) -> StdCommand;

    /// The library's store over the same namespace.
    fn store(&self, options: StoreOptions) -> AnyStore;

    /// How much of a scenario's work this engine's test server takes: PostgreSQL all of it, the
    /// MongoDB test server (one Python process) a fifth.
    fn scale(&self, full: usize) -> usize;

    /// The binary, killed after a minute.
    fn cmd(&self) -> Command {
        let mut cmd = Command::from_std(self.binary());
        cmd.timeout(Duration::from_secs(60));
        cmd
    }

    /// `run` with `args`, in the background.
    fn worker(&self, args: &[&str]) -> Spawned {
        self.binary()
            .arg("run")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
            .into()
    }

    /// Publishes events given as JSON, asserting success.
    fn publish(&self, events: &[Value]) {
        let lines: Vec<String> = events.iter().map(Value::to_string).collect();
        let out = self
            .cmd()
            .arg("publish")
            .write_stdin(lines.join("\n"))
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
    }

    /// Publishes one unkeyed event of type `t` per id, each for `handler`.
    fn publish_ids(&self, ids: &[&str], handler: &str) {
        let events: Vec<Value> = ids
            .iter()
            .map(|id| serde_json::json!({"id": id, "type": "t", "handlers": [handler]}))
            .collect();
        self.publish(&events);
    }
}

fn binary(url: &str, schema: &str) -> StdCommand {
    let mut cmd = StdCommand::new(assert_cmd::cargo::cargo_bin("relaybus"));
    cmd.env("RELAYBUS_DATABASE_URL", url)
        .env_remove("RELAYBUS_WEBHOOK_SECRET")
        .args(["--schema", schema]);
    cmd
}

impl Target for TestSchema {
    fn binary(&self) -> StdCommand {
        binary(&self.url, &self.name)
    }

    fn store(&self, options: StoreOptions) -> AnyStore {
        super::open_store(self, options)
    }

    fn scale(&self, full: usize) -> usize {
        full
    }
}

impl Target for TestMongo {
    fn binary(&self) -> StdCommand {
        binary(&mongo_url(), &self.name)
    }

    fn store(&self, options: StoreOptions) -> AnyStore {
        TestMongo::store(self, options)
    }

    fn scale(&self, full: usize) -> usize {
        full / 5
    }
}
