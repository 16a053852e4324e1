//! The README's walk-through on MongoDB, step for step the output it gives on PostgreSQL.

use serde_json::{json, Value};

use crate::common::http::serve;
use crate::common::mongo::{mongo_url, TestMongo};
use crate::common::{stderr, stdout, TestSchema};

/// A command of the walk-through, on either engine.
struct Engine {
    url: String,
    schema: String,
}

impl Engine {
    fn cmd(&self) -> assert_cmd::Command {
        let mut cmd = crate::common::relaybus();
        cmd.env("RELAYBUS_DATABASE_URL", &self.url)
            .env_remove("RELAYBUS_WEBHOOK_SECRET")
            .args(["--schema", &self.schema]);
        cmd
    }

    /// Runs a step, asserting success; its stdout.
    fn step(&self, args: &[&str], stdin: &str) -> String {
        let out = self.cmd().args(args).write_stdin(stdin).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
        stdout(&out)
    }
}

/// A JSON value with what differs between runs replaced: ids, times, durations and epochs.
fn shape(v: &Value) -> Value {
    let id = |s: &str| s.parse::<ulid::Ulid>().is_ok();
    let time = |s: &str| s.len() >= 19 && s.as_bytes()[4] == b'-' && s.as_bytes()[10] == b'T';
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let v = match k.as_str() {
                        "lag_seconds" | "epoch" | "lane_epoch" | "seconds" => {
                            json!(if v.is_null() { "null" } else { "<n>" })
                        }
                        _ => shape(v),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(shape).collect()),
        Value::String(s) if id(s) => json!("<id>"),
        Value::String(s) if time(s) => json!("<time>"),
        other => other.clone(),
    }
}

/// The walk-through of README's "Try it": every step's output, with ids and times replaced.
fn walk_through(engine: &Engine) -> Vec<Value> {
    let hook = serve(vec![(200, "", "ok")]);
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("handlers.toml");
    std::fs::write(
        &config,
        format!(
            "[handlers.billing]\nwebhook = \"{}\"\n\n[handlers.email]\nexec = \"exit 65\"\n",
            hook.url
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let events = [
        json!({"id": "o1", "type": "order.paid", "key": "c1", "payload": {"amount": 12.50}}),
        json!({"id": "o2", "type": "order.paid", "key": "c1", "payload": {"amount": 3}}),
        json!({"id": "o3", "type": "user.new", "payload": {"n": 123456789012345678901234567890_u128}}),
    ];
    let lines: Vec<String> = events.iter().map(Value::to_string).collect();
    let mut seen = vec![];
    let text = |s: String| json!(s);
    let parsed = |s: String| shape(&serde_json::from_str::<Value>(&s).unwrap());
    seen.push(parsed(engine.step(&["setup", "--json"], "")));
    seen.push(text(engine.step(
        &["publish", "--handler", "billing", "--handler", "email"],
        &lines.join("\n"),
    )));
    seen.push(text(
        engine.step(&["run", "--config", config, "--drain"], ""),
    ));
    assert_eq!(hook.requests.lock().unwrap().len(), 3);
    seen.push(parsed(engine.step(&["dead", "list", "--json"], "")));
    seen.push(parsed(engine.step(&["stats", "--json"], "")));
    seen.push(text(
        engine.step(&["dead", "requeue", "--handler", "email", "--yes"], ""),
    ));
    seen.push(parsed(engine.step(&["deliveries", "list", "--json"], "")));
    seen.push(text(engine.step(
        &[
            "run",
            "--handler",
            "email",
            "--exec",
            "cat >/dev/null",
            "--drain",
        ],
        "",
    )));
    seen.push(parsed(engine.step(&["events", "show", "o3", "--json"], "")));
    seen.push(parsed(engine.step(&["lanes", "--json"], "")));
    seen.push(parsed(engine.step(
        &[
            "purge",
            "--completed-older-than",
            "0s",
            "--dead-older-than",
            "0s",
            "--yes",
            "--json",
        ],
        "",
    )));
    seen.push(parsed(engine.step(&["stats", "--json"], "")));
    seen
}

#[test]
fn the_walk_through_gives_the_same_output_on_mongodb_as_on_postgresql() {
    let pg = TestSchema::new("walk_pg");
    let mongo = TestMongo::new("walk_mongo");
    let on_pg = walk_through(&Engine {
        url: crate::common::database_url(),
        schema: pg.name.clone(),
    });
    let on_mongo = walk_through(&Engine {
        url: mongo_url(),
        schema: mongo.name.clone(),
    });
    assert_eq!(on_pg.len(), on_mongo.len());
    for (i, (p, m)) in on_pg.iter().zip(&on_mongo).enumerate() {
        assert_eq!(p, m, "step {i}:\nPostgreSQL {p:#}\nMongoDB {m:#}");
    }
    // The exact payload reached the store and the handler.
    assert_eq!(
        on_mongo[8]["payload"],
        json!({"n": 123456789012345678901234567890_u128})
    );
    assert_eq!(
        on_mongo[2],
        json!("handled 3, failed attempts 0, dead 3, lease lost 0, released 0\n")
    );
}
