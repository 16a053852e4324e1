//! The servers the tests use, shared by the unit tests and `tests/` (which include this file):
//! the URL in RELAYBUS_TEST_DATABASE_URL / RELAYBUS_TEST_MONGODB_URL, else the local server when
//! one answers on its default port, else a throwaway server started for this test process by
//! `scripts/throwaway-*.sh` and removed once the process has exited. A fresh machine needs
//! nothing but Rust to run `cargo test`.

use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

pub(crate) fn postgres_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        choose(
            "RELAYBUS_TEST_DATABASE_URL",
            "postgres://postgres@127.0.0.1:5432/test",
            5432,
            "throwaway-postgres.sh",
        )
    })
    .clone()
}

pub(crate) fn mongodb_url() -> String {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| {
        choose(
            "RELAYBUS_TEST_MONGODB_URL",
            "mongodb://127.0.0.1:27017/?directConnection=true",
            27017,
            "throwaway-mongodb.sh",
        )
    })
    .clone()
}

fn choose(variable: &str, local: &str, port: u16, script: &str) -> String {
    if let Ok(url) = std::env::var(variable) {
        return url;
    }
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    if std::net::TcpStream::connect_timeout(&address, Duration::from_secs(1)).is_ok() {
        return local.to_owned();
    }
    let script = format!("{}/scripts/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = Command::new(&script)
        .arg(std::process::id().to_string())
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("could not run {script}: {e}"));
    assert!(
        out.status.success(),
        "nothing answers at {local} and {script} could not start a server; set {variable}"
    );
    let url = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    eprintln!("nothing answers at {local}: these tests use a throwaway server at {url}");
    url
}
