//! Connecting to MongoDB: a standalone server refused with why, and each failure said in one
//! sentence with the README's exit code.

use mongodb::bson::doc;

use crate::common::mongo::OwnServer;
use crate::common::{relaybus, stderr};

/// A standalone server has no transactions a worker can rely on and no change stream to wake
/// it: `setup` and `run` refuse it, saying why and what to do.
#[test]
fn a_standalone_server_is_refused_with_why() {
    let server = OwnServer::start(&["--standalone"]);
    for args in [&["setup"][..], &["run", "--handler", "h", "--noop"]] {
        let out = relaybus()
            .env("RELAYBUS_DATABASE_URL", server.url(""))
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(
            stderr(&out),
            format!(
                "error: MongoDB at {} is a standalone server; relaybus needs a replica set (a \
                 single node is enough) or a sharded cluster, since deliveries are completed in \
                 transactions and workers are woken by a change stream, neither of which a \
                 standalone server has: start mongod with --replSet rs0 and run rs.initiate() \
                 once\n",
                server.url("")
            )
        );
    }
}

/// What failed, in one sentence and with the exit code the README gives: a refused connection
/// (69) names the address and the refusal, not the driver's topology and labels; a wrong
/// password (69) is named as bad credentials; a URL that does not parse is a usage error (2) in
/// `bench` as everywhere.
#[test]
fn connection_failures_say_what_failed_in_one_sentence() {
    let port = crate::common::cluster::free_port();
    let refused =
        format!("mongodb://127.0.0.1:{port}/?directConnection=true&serverSelectionTimeoutMS=2000");
    let out = relaybus()
        .env("RELAYBUS_DATABASE_URL", &refused)
        .arg("stats")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert_eq!(
        stderr(&out),
        format!(
            "error: could not connect to MongoDB at {refused}: 127.0.0.1:{port}: Connection \
             refused (os error 111); check RELAYBUS_DATABASE_URL (set in the environment) and \
             that the server is running\n"
        )
    );
    let server = OwnServer::start(&[]);
    crate::common::block_on(async {
        let client = mongodb::Client::with_uri_str(server.url("")).await.unwrap();
        let user = doc! { "createUser": "app", "pwd": "right", "roles": ["root"] };
        client.database("admin").run_command(user).await.unwrap();
    });
    let server = server.restart(&["--auth"]);
    let out = relaybus()
        .env("RELAYBUS_DATABASE_URL", server.url("app:wrong@"))
        .arg("stats")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    let text = stderr(&out);
    assert!(
        text.contains(": bad credentials (authentication failed: "),
        "{text}"
    );
    assert!(
        !text.contains("wrong") && !text.contains("labels"),
        "{text}"
    );
    // Reached without credentials: the server answers, and refuses the first command.
    let out = relaybus()
        .env("RELAYBUS_DATABASE_URL", server.url(""))
        .arg("stats")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert!(
        stderr(&out).contains(": the server requires authentication, or this user lacks the privileges: give a user and password in the URL"),
        "{}",
        stderr(&out)
    );
    // A server that answers as a member of another replica set.
    let other = format!(
        "{}&replicaSet=elsewhere",
        server
            .url("app:right@")
            .replace("directConnection=true&", "")
    );
    let out = relaybus()
        .env("RELAYBUS_DATABASE_URL", &other)
        .arg("stats")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(69));
    assert!(
        stderr(&out).contains("no member of the replica set `elsewhere` answered"),
        "{}",
        stderr(&out)
    );
    let out = relaybus()
        .env("RELAYBUS_DATABASE_URL", "mongodb://app:p@127.0.0.1:99999/")
        .args(["bench", "--yes"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert_eq!(
        stderr(&out),
        "error: invalid connection string `mongodb://app:***@127.0.0.1:99999/`: An invalid \
         argument was provided: invalid server address 127.0.0.1:99999: the port must be an \
         integer between 1 and 65535, got 99999\n"
    );
}
