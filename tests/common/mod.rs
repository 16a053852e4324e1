//! Shared test fixtures: a throwaway schema per test and helpers to run the binary.

pub mod cluster;
pub mod drain;
pub mod handlers;
pub mod http;
pub mod mongo;
pub mod pgbouncer;
pub mod replay;
pub mod scenario;
pub mod top;
pub mod workers;

use std::io::Read;
use std::process::{Child, Command as StdCommand, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use assert_cmd::Command;
use relaybus::store::{AnyStore, ClaimRequest, LaneShare, Namespace, StoreOptions};
use tokio_postgres::{Client, NoTls, Row};

#[path = "../../src/test_servers.rs"]
pub(crate) mod test_servers;

pub fn database_url() -> String {
    test_servers::postgres_url()
}

/// The database the tests use, as RELAYBUS_TEST_DATABASE_URL (or its default) names it.
pub fn database_name() -> String {
    let config: tokio_postgres::Config = database_url().parse().expect("a valid test URL");
    config.get_dbname().unwrap_or("postgres").to_owned()
}

/// How long any one wait of a test on the runtime may take: a server that stops answering
/// fails the test instead of hanging the run.
pub const BLOCK_ON_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs `f` on the tests' runtime, failing the test once it takes longer than the bound.
pub fn block_on<F: std::future::Future>(f: F) -> F::Output {
    runtime()
        .block_on(async { tokio::time::timeout(BLOCK_ON_TIMEOUT, f).await })
        .unwrap_or_else(|_| panic!("a wait of the test took longer than {BLOCK_ON_TIMEOUT:?}"))
}

pub fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    })
}

pub fn connect() -> Client {
    connect_to(&database_url())
}

pub fn connect_to(url: &str) -> Client {
    block_on(async {
        let (client, conn) = tokio_postgres::connect(url, NoTls)
            .await
            .expect("the test database is reachable (set RELAYBUS_TEST_DATABASE_URL)");
        tokio::spawn(conn);
        client
    })
}

/// A schema or database name no other test uses, within PostgreSQL's 63 bytes.
pub fn unique(test: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    let mut name = format!(
        "t{}_{}_{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed),
        test
    );
    name.truncate(63);
    name
}

/// A database of its own, for tests whose counters depend on what other sessions of the same
/// database do (old row versions are pruned only past the oldest snapshot in the database).
pub struct TestDatabase {
    pub name: String,
    pub url: String,
}

impl TestDatabase {
    pub fn new(test: &str) -> Self {
        let name = unique(test);
        let admin = connect();
        block_on(admin.batch_execute(&format!("CREATE DATABASE \"{name}\""))).unwrap();
        let base = database_url();
        let url = match base.rsplit_once('/') {
            Some((server, _)) => format!("{server}/{name}"),
            None => panic!("RELAYBUS_TEST_DATABASE_URL has no database: {base}"),
        };
        Self { name, url }
    }
}

impl Drop for TestDatabase {
    fn drop(&mut self) {
        let admin = connect();
        let _ = block_on(admin.batch_execute(&format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            self.name
        )));
    }
}

/// `url` with another user: a role's own connection to the same server and database.
pub fn url_as(url: &str, user: &str) -> String {
    let (scheme, rest) = url.split_once("://").expect("a postgres:// URL");
    let rest = rest.split_once('@').map_or(rest, |(_, host)| host);
    format!("{scheme}://{user}@{rest}")
}

/// A login role of its own for one test (the test server trusts local connections), dropped
/// with what it was granted in the database of `url` when the test ends.
pub struct TestRole {
    pub name: String,
    url: String,
}

impl TestRole {
    pub fn new(test: &str, url: &str) -> Self {
        let name = unique(test);
        block_on(connect().batch_execute(&format!("CREATE ROLE \"{name}\" LOGIN"))).unwrap();
        Self {
            name,
            url: url.to_owned(),
        }
    }

    /// The database of the role's URL, connected to as the role.
    pub fn url(&self) -> String {
        url_as(&self.url, &self.name)
    }
}

impl Drop for TestRole {
    fn drop(&mut self) {
        let name = &self.name;
        let _ = block_on(async {
            let (client, conn) = tokio_postgres::connect(&self.url, NoTls).await?;
            tokio::spawn(conn);
            client
                .batch_execute(&format!("DROP OWNED BY \"{name}\"; DROP ROLE \"{name}\""))
                .await
        });
    }
}

/// Every row of a query as text, columns joined by `|`, NULL spelled out.
pub fn rows_of(client: &Client, sql: &str) -> Vec<String> {
    let wrapped = format!(
        "SELECT array_to_string(ARRAY(SELECT coalesce(value, 'NULL') \
           FROM json_each_text(row_to_json(q))), '|') FROM ({sql}) q"
    );
    block_on(client.query(&wrapped, &[]))
        .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// A schema of its own for one test, dropped when the test ends.
pub struct TestSchema {
    pub name: String,
    pub client: Client,
    pub url: String,
}

impl TestSchema {
    /// An empty schema name (nothing created yet).
    pub fn new(test: &str) -> Self {
        Self::in_database(test, &database_url())
    }

    /// An empty schema in the database at `url`.
    pub fn in_database(test: &str, url: &str) -> Self {
        let name = unique(test);
        let client = connect_to(url);
        block_on(client.batch_execute(&format!("DROP SCHEMA IF EXISTS \"{name}\" CASCADE")))
            .unwrap();
        Self {
            name,
            client,
            url: url.to_owned(),
        }
    }

    /// A schema with relaybus installed by `relaybus setup`.
    pub fn installed(test: &str) -> Self {
        let s = Self::new(test);
        s.cmd().arg("setup").assert().success();
        s
    }

    /// A schema holding the reconstructed 0.1 store.
    pub fn with_fixture_0_1(test: &str) -> Self {
        let s = Self::new(test);
        s.exec(&format!(
            "CREATE SCHEMA \"{0}\"; SET search_path TO \"{0}\"; {1}; RESET search_path",
            s.name,
            include_str!("../../sql/fixtures/store-0.1.sql")
        ));
        s
    }

    pub fn namespace(&self) -> Namespace {
        Namespace::new(&self.name, "relaybus_").unwrap()
    }

    pub fn table(&self, name: &str) -> String {
        format!("\"{}\".relaybus_{name}", self.name)
    }

    /// The binary, pointed at this schema.
    pub fn cmd(&self) -> Command {
        let mut cmd = relaybus();
        cmd.env("RELAYBUS_DATABASE_URL", &self.url)
            .env_remove("RELAYBUS_WEBHOOK_SECRET")
            .args(["--schema", &self.name]);
        cmd
    }

    pub fn exec(&self, sql: &str) {
        block_on(self.client.batch_execute(sql)).unwrap_or_else(|e| panic!("{sql}: {e:?}"));
    }

    pub fn query(&self, sql: &str) -> Vec<Row> {
        block_on(self.client.query(sql, &[])).unwrap_or_else(|e| panic!("{sql}: {e:?}"))
    }

    /// Every row of a query as text; see `rows_of`.
    pub fn rows(&self, sql: &str) -> Vec<String> {
        rows_of(&self.client, sql)
    }

    pub fn count(&self, sql: &str) -> i64 {
        self.query(sql)[0].get(0)
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let _ = block_on(
            self.client
                .batch_execute(&format!("DROP SCHEMA IF EXISTS \"{}\" CASCADE", self.name)),
        );
    }
}

/// A claim of 10 by `owner` for `handlers`, which may take every lane.
pub fn claim_request(owner: &str, handlers: &[&str]) -> ClaimRequest {
    ClaimRequest {
        owner: owner.into(),
        handlers: handlers.iter().map(|h| h.to_string()).collect(),
        max_attempts: vec![25; handlers.len()],
        batch: 10,
        new_lanes: 256,
        lease: Duration::from_secs(30),
        outstanding: vec![],
        lanes: LaneShare::ALL,
        held: None,
    }
}

/// The store of a test's schema, as the library opens it.
pub fn open_store(s: &TestSchema, options: StoreOptions) -> AnyStore {
    relaybus::store::open(Some(&s.url), s.namespace(), options).unwrap()
}

/// The binary, killed if it runs longer than a minute (a test fails; it never hangs).
pub fn relaybus() -> Command {
    let mut cmd = Command::cargo_bin("relaybus").unwrap();
    cmd.timeout(Duration::from_secs(60));
    cmd
}

/// A spawned process that is killed if the test ends (or fails) before `finish` waits for it,
/// so a failing test leaves no worker behind.
pub struct Spawned(Option<Child>);

impl From<Child> for Spawned {
    fn from(child: Child) -> Self {
        Self(Some(child))
    }
}

impl std::ops::Deref for Spawned {
    type Target = Child;
    fn deref(&self) -> &Child {
        self.0
            .as_ref()
            .expect("a spawned process until it is finished")
    }
}

impl std::ops::DerefMut for Spawned {
    fn deref_mut(&mut self) -> &mut Child {
        self.0
            .as_mut()
            .expect("a spawned process until it is finished")
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Runs a command of `s` on a terminal `columns` wide (a pty from `script`), with `keys` typed
/// ahead, and returns what the terminal showed; the command must exit 0.
pub fn on_a_terminal(s: &TestSchema, columns: u16, args: &str, keys: &[u8]) -> String {
    let command = format!(
        "stty cols {columns}; '{}' --database-url '{}' --schema {} {args}",
        assert_cmd::cargo::cargo_bin("relaybus").display(),
        database_url(),
        s.name
    );
    let mut script = StdCommand::new("script")
        .args(["-qec", &command, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // Typed ahead, keys wait in the terminal until a prompt reads them.
    std::io::Write::write_all(script.stdin.as_mut().unwrap(), keys).unwrap();
    let out = finish(script, Duration::from_secs(30));
    assert_eq!(out.status.code(), Some(0));
    String::from_utf8_lossy(&out.stdout).replace('\r', "")
}

/// Waits for a spawned child, at most `timeout`: on timeout it is killed and the test fails.
pub fn finish(child: impl Into<Spawned>, timeout: Duration) -> Output {
    let mut spawned = child.into();
    let mut child = spawned
        .0
        .take()
        .expect("a spawned process is finished once");
    fn drain(pipe: Option<impl Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut buf = vec![];
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    }
    let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if start.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "the child did not exit within {timeout:?}; stderr: {}",
                String::from_utf8_lossy(&err.join().unwrap())
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output {
        status,
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A worker process in the background.
pub fn spawn_worker(s: &TestSchema, args: &[&str]) -> Spawned {
    StdCommand::new(assert_cmd::cargo::cargo_bin("relaybus"))
        .env("RELAYBUS_DATABASE_URL", database_url())
        .args(["--schema", &s.name, "run"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
        .into()
}

/// The path an install script (`scripts/install-*.sh`)
/// prints, after it installed what it installs for the first test that needs it.
pub fn installed(script: &'static str) -> String {
    static PATHS: std::sync::Mutex<Vec<(&str, String)>> = std::sync::Mutex::new(Vec::new());
    let mut paths = PATHS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, path)) = paths.iter().find(|(name, _)| *name == script) {
        return path.clone();
    }
    let path = format!("{}/scripts/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new(&path)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("could not run {path}: {e}"));
    assert!(out.status.success(), "{path} failed");
    let bin = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    paths.push((script, bin.clone()));
    bin
}

pub fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn signal(child: &Child, sig: nix::sys::signal::Signal) {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), sig).unwrap();
}

/// Sequential scans of a table of the schema, and index entries read through its primary key,
/// as of now.
pub fn reads_of(s: &TestSchema, table: &str) -> (i64, i64) {
    s.exec("SELECT pg_stat_clear_snapshot()");
    let r = &s.query(&format!(
        "SELECT t.seq_scan, i.idx_tup_read FROM pg_stat_user_tables t \
           JOIN pg_stat_user_indexes i \
             ON i.relid = t.relid AND i.indexrelname = t.relname || '_pkey' \
          WHERE t.schemaname = '{}' AND t.relname = 'relaybus_{table}'",
        s.name
    ))[0];
    (r.get(0), r.get(1))
}

/// Waits until the lanes of `s` list exactly `n` deliveries in flight.
pub fn wait_in_flight(s: &TestSchema, n: i64) {
    let sql = format!(
        "SELECT coalesce(sum(cardinality(in_flight)), 0) FROM {}",
        s.table("lanes")
    );
    wait_until(
        &format!("{n} deliveries in flight"),
        Duration::from_secs(20),
        || s.count(&sql) == n,
    );
}

/// Upgrades `store` through the library and returns what it reported, a step at a time: each
/// step's number and the rows it had rewritten at every report, in order.
pub fn upgrade_reports(store: &relaybus::store::AnyStore) -> Vec<(usize, Vec<u64>)> {
    use relaybus::store::prelude::*;
    let reports = std::sync::Mutex::new(Vec::<(usize, Vec<u64>)>::new());
    block_on(
        store.upgrade(relaybus::store::Conversion::Offline, false, &|at| {
            let mut reports = reports.lock().unwrap();
            match reports.last_mut() {
                Some((step, rows)) if *step == at.step => rows.push(at.rows),
                _ => reports.push((at.step, vec![at.rows])),
            }
        }),
    )
    .unwrap();
    reports.into_inner().unwrap()
}
