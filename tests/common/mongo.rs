//! The MongoDB test server (RELAYBUS_TEST_MONGODB_URL, default the local replica-set-like
//! server on 27017): a database of its own per test, dropped when the test ends.

use assert_cmd::Command;
use mongodb::bson::{doc, Bson, Document};
use relaybus::store::{AnyStore, Namespace, StoreOptions};

use super::{installed, relaybus, unique};

pub fn mongo_url() -> String {
    super::test_servers::mongodb_url()
}

fn client() -> mongodb::Client {
    super::block_on(async {
        mongodb::Client::with_uri_str(mongo_url())
            .await
            .expect("the MongoDB test server is reachable (set RELAYBUS_TEST_MONGODB_URL)")
    })
}

/// A database of its own for one test.
pub struct TestMongo {
    pub name: String,
    client: mongodb::Client,
}

impl TestMongo {
    /// An empty database name (nothing created yet).
    pub fn new(test: &str) -> Self {
        Self {
            name: unique(test),
            client: client(),
        }
    }

    /// A database with relaybus installed by `relaybus setup`.
    pub fn installed(test: &str) -> Self {
        let m = Self::new(test);
        m.cmd().arg("setup").assert().success();
        m
    }

    /// A database holding the reconstructed 0.1 store of `sql/fixtures/mongo-store-0.1.json`.
    pub fn with_fixture_0_1(test: &str) -> Self {
        let m = Self::new(test);
        let fixture: serde_json::Value =
            serde_json::from_str(include_str!("../../sql/fixtures/mongo-store-0.1.json")).unwrap();
        let db = m.client.database(&m.name);
        super::block_on(async {
            for (name, c) in fixture["collections"].as_object().unwrap() {
                let collection = format!("relaybus_{name}");
                db.create_collection(&collection).await.unwrap();
                let indexes: Vec<Bson> = c["indexes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|i| Bson::try_from(i.clone()).unwrap())
                    .collect();
                if !indexes.is_empty() {
                    db.run_command(doc! { "createIndexes": &collection, "indexes": indexes })
                        .await
                        .unwrap();
                }
                let docs: Vec<Document> = c["documents"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|d| match Bson::try_from(d.clone()).unwrap() {
                        Bson::Document(d) => d,
                        other => panic!("not a document: {other}"),
                    })
                    .collect();
                db.collection::<Document>(&collection)
                    .insert_many(docs)
                    .await
                    .unwrap();
            }
        });
        m
    }

    pub fn namespace(&self) -> Namespace {
        Namespace::for_mongo(&self.name, "relaybus_").unwrap()
    }

    pub fn store(&self, options: StoreOptions) -> AnyStore {
        relaybus::store::open(Some(&mongo_url()), self.namespace(), options).unwrap()
    }

    /// The binary, pointed at this database.
    pub fn cmd(&self) -> Command {
        let mut cmd = relaybus();
        cmd.env("RELAYBUS_DATABASE_URL", mongo_url())
            .env_remove("RELAYBUS_WEBHOOK_SECRET")
            .args(["--schema", &self.name]);
        cmd
    }

    /// A collection of the store, by its name without the prefix.
    pub fn collection(&self, name: &str) -> mongodb::Collection<Document> {
        self.client
            .database(&self.name)
            .collection(&format!("relaybus_{name}"))
    }

    /// Every document of a collection matching `filter`, in `_id` order.
    pub fn find(&self, name: &str, filter: Document) -> Vec<Document> {
        use futures_util::TryStreamExt;
        super::block_on(async {
            self.collection(name)
                .find(filter)
                .sort(mongodb::bson::doc! { "_id": 1 })
                .await
                .unwrap()
                .try_collect()
                .await
                .unwrap()
        })
    }
}

impl Drop for TestMongo {
    fn drop(&mut self) {
        let _ = super::block_on(async { self.client.database(&self.name).drop().await });
    }
}

/// Runs a script with `mongosh` against the test server (RELAYBUS_TEST_MONGOSH, default the copy
/// `scripts/install-mongosh.sh` installs into `.mongosh/` the first time one is needed); panics
/// with its output when it fails.
pub fn mongosh(script: &str) -> String {
    let (ok, text) = try_mongosh(script);
    assert!(ok, "mongosh failed:\n{script}\n{text}");
    text
}

/// Runs a script with `mongosh`: whether it succeeded, and what it printed.
pub fn try_mongosh(script: &str) -> (bool, String) {
    let bin =
        std::env::var("RELAYBUS_TEST_MONGOSH").unwrap_or_else(|_| installed("install-mongosh.sh"));
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), script).unwrap();
    let out = std::process::Command::new(&bin)
        .args([&mongo_url(), "--quiet", "--file"])
        .arg(file.path())
        .output()
        .unwrap_or_else(|e| panic!("could not run {bin}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// A MongoDB wire server of its own, for tests that need one the shared server is not: a
/// standalone server, one that requires authentication, or one no other test loads: SecantusDB,
/// installed into `.venv-mongo` the first time (RELAYBUS_TEST_SECANTUSD names another), on a free port, stopped and removed when dropped.
pub struct OwnServer {
    pub port: u16,
    child: std::process::Child,
    dir: tempfile::TempDir,
}

impl OwnServer {
    /// A server started with these extra options (`--standalone`, `--auth`).
    pub fn start(options: &[&str]) -> Self {
        Self::start_in(
            tempfile::tempdir().unwrap(),
            super::cluster::free_port(),
            options,
        )
    }

    fn start_in(dir: tempfile::TempDir, port: u16, options: &[&str]) -> Self {
        let bin = std::env::var("RELAYBUS_TEST_SECANTUSD")
            .unwrap_or_else(|_| installed("install-secantusdb.sh"));
        let child = std::process::Command::new(&bin)
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--storage-path",
            ])
            .arg(dir.path().join("data"))
            .args(options)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("could not start {bin}: {e}"));
        super::wait_until(
            "the server to listen",
            std::time::Duration::from_secs(30),
            || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(),
        );
        Self { port, child, dir }
    }

    /// The same data, served again on the same port with other options, after the server was
    /// killed (SIGKILL: what it had not written is lost).
    pub fn restart(mut self, options: &[&str]) -> Self {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let dir = std::mem::replace(&mut self.dir, tempfile::tempdir().unwrap());
        Self::start_in(dir, self.port, options)
    }

    pub fn url(&self, credentials: &str) -> String {
        format!(
            "mongodb://{credentials}127.0.0.1:{}/?directConnection=true&serverSelectionTimeoutMS=5000",
            self.port
        )
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
