//! The servers the tests use, shared by the unit tests and `tests/` (which include this file):
//! the URL in RELAYBUS_TEST_DATABASE_URL / RELAYBUS_TEST_MONGODB_URL, else the local server when
//! one answers on its default port, else (with the `testcontainers` feature and a Docker engine)
//! a container, else a throwaway server started for this test process by
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
            Engine::Postgres,
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
            Engine::Mongo,
        )
    })
    .clone()
}

#[derive(Clone, Copy)]
enum Engine {
    Postgres,
    Mongo,
}

fn choose(variable: &str, local: &str, port: u16, engine: Engine) -> String {
    if let Ok(url) = std::env::var(variable) {
        return url;
    }
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    if std::net::TcpStream::connect_timeout(&address, Duration::from_secs(1)).is_ok() {
        if let Engine::Postgres = engine {
            create_database(local);
        }
        return local.to_owned();
    }
    #[cfg(feature = "testcontainers")]
    if docker_engine() {
        return containers::start(engine);
    }
    let script = match engine {
        Engine::Postgres => "throwaway-postgres.sh",
        Engine::Mongo => "throwaway-mongodb.sh",
    };
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

/// Creates the database `url` names when the server lacks it, so that a local server without
/// one passes the tests as it is. A failure is the tests' to report, when they connect.
fn create_database(url: &str) {
    let url = url.to_owned();
    // A runtime of its own, on a thread of its own: this may be called inside another runtime.
    let created = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        runtime.block_on(async {
            let config: tokio_postgres::Config = url.parse().ok()?;
            let db = config.get_dbname()?.to_owned();
            let mut admin = config.clone();
            admin.dbname("postgres");
            let (client, connection) = admin.connect(tokio_postgres::NoTls).await.ok()?;
            tokio::spawn(connection);
            let found = client
                .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&db])
                .await
                .ok()?;
            if found.is_none() {
                // Another test process may create it first.
                let _ = client
                    .batch_execute(&format!("CREATE DATABASE \"{db}\""))
                    .await;
            }
            Some(())
        })
    });
    let _ = created.join();
}

/// A Docker engine answers where testcontainers looks first.
#[cfg(feature = "testcontainers")]
fn docker_engine() -> bool {
    std::env::var_os("DOCKER_HOST").is_some()
        || std::os::unix::net::UnixStream::connect("/var/run/docker.sock").is_ok()
}

#[cfg(feature = "testcontainers")]
mod containers {
    use std::sync::Mutex;

    use testcontainers_modules::mongo::Mongo;
    use testcontainers_modules::postgres::Postgres;
    use testcontainers_modules::testcontainers::runners::SyncRunner;
    use testcontainers_modules::testcontainers::{Container, ImageExt};

    use super::Engine;

    /// The containers live as long as the test process; testcontainers' reaper removes them
    /// once it has exited.
    static KEPT: Mutex<Vec<Box<dyn std::any::Any + Send>>> = Mutex::new(Vec::new());

    fn keep<T: Send + 'static>(container: T) {
        KEPT.lock()
            .expect("containers lock")
            .push(Box::new(container));
    }

    /// Started on a thread of its own: the blocking runner has its own runtime, and a test may
    /// be inside one.
    pub(super) fn start(engine: Engine) -> String {
        std::thread::spawn(move || match engine {
            Engine::Postgres => {
                let c: Container<Postgres> = Postgres::default()
                    .with_db_name("test")
                    .with_user("postgres")
                    .with_password("postgres")
                    .with_tag("15")
                    .start()
                    .expect("a PostgreSQL container");
                let port = c.get_host_port_ipv4(5432).expect("its port");
                keep(c);
                format!("postgres://postgres:postgres@127.0.0.1:{port}/test?sslmode=disable")
            }
            Engine::Mongo => {
                let c: Container<Mongo> = Mongo::repl_set()
                    .with_tag("7")
                    .start()
                    .expect("a MongoDB replica-set container");
                let port = c.get_host_port_ipv4(27017).expect("its port");
                keep(c);
                format!("mongodb://127.0.0.1:{port}/?directConnection=true")
            }
        })
        .join()
        .expect("the container thread")
    }
}
