//! Connections to PostgreSQL: where to connect (resolved once), the one place that opens a
//! connection (for the pool, the wake-up listener and the benchmark alike), the session a
//! connection runs, and a small pool.
//!
//! With prepared statements on, a connection parses each statement once and afterwards only
//! binds parameters; with them off (PgBouncer before 1.21 in transaction mode), each call sends
//! Parse, Bind and Execute of an unnamed statement in one round trip, which poolers accept.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

use futures_util::StreamExt;
use rand::seq::SliceRandom;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio_postgres::config::LoadBalanceHosts;
use tokio_postgres::error::SqlState;
use tokio_postgres::tls::MakeTlsConnect;
use tokio_postgres::{
    AsyncMessage, Client, Config, Connection, Row, RowStream, SimpleQueryMessage, Socket, Statement,
};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::conninfo::{self, ConnInfo};
use super::sql::{Params, Sql};
use crate::store::{refuse_ambiguous, unparsable, ClientCounts, Result, StoreError, StoreOptions};

/// The stream of a connection: TLS or plain, as `sslmode` and the server agree.
pub(crate) type Stream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;

/// rustls's connector, for TCP hosts and Unix sockets alike. tokio-postgres asks for a connector
/// of every host before it knows whether TLS is used, and a socket's host name is empty, which
/// rustls refuses as a DNS name. TLS never runs over a socket (`conninfo` turns it off there,
/// as libpq does), so the socket's connector is made for a name it never presents.
#[derive(Clone)]
pub(crate) struct Tls(MakeRustlsConnect);

impl MakeTlsConnect<Socket> for Tls {
    type Stream = Stream;
    type TlsConnect = <MakeRustlsConnect as MakeTlsConnect<Socket>>::TlsConnect;
    type Error = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Error;

    fn make_tls_connect(
        &mut self,
        hostname: &str,
    ) -> std::result::Result<Self::TlsConnect, Self::Error> {
        let name = if hostname.is_empty() {
            "localhost"
        } else {
            hostname
        };
        MakeTlsConnect::<Socket>::make_tls_connect(&mut self.0, name)
    }
}

/// How to reach the server, resolved once from the connection string and the libpq variables.
#[derive(Clone)]
pub(crate) struct ConnectOptions {
    config: Config,
    /// One configuration per host, tried in turn (shuffled with `load_balance_hosts=random`).
    hosts: Vec<Config>,
    tls: Tls,
    connect_timeout: Option<std::time::Duration>,
    /// `PostgreSQL at host:port/db as user`, for messages; never holds the password.
    target: String,
}

impl ConnectOptions {
    /// From a `postgres://` URL or `key=value` pairs, completed as libpq completes them; with no
    /// string, from the variables alone.
    pub(crate) fn resolve(conn: Option<&str>) -> Result<Self> {
        refuse_ambiguous(conn.unwrap_or_default())?;
        let ConnInfo {
            config,
            hosts,
            tls,
            connect_timeout,
        } = conninfo::resolve(conn, &|k| std::env::var(k).ok())
            .map_err(|why| unparsable(conn.unwrap_or_default(), why))?;
        Ok(Self {
            target: describe_target(&config),
            tls: Tls(MakeRustlsConnect::new(tls)),
            connect_timeout,
            hosts,
            config,
        })
    }

    /// A new connection, and the task that drives it (its errors reach the client's next
    /// request). The listener polls the connection itself. Each host is tried in turn, as
    /// libpq tries them, and its whole start-up (connecting, TLS, authentication,
    /// `target_session_attrs`) is bounded: a host that accepts and never answers costs its
    /// bound, and the next is tried. The last host's error is returned.
    pub(crate) async fn connect_raw(&self) -> Result<(Client, Connection<Socket, Stream>)> {
        let mut order: Vec<&Config> = self.hosts.iter().collect();
        if self.config.get_load_balance_hosts() == LoadBalanceHosts::Random {
            order.shuffle(&mut rand::thread_rng());
        }
        let mut failed = None;
        for config in order {
            match self.connect_host(config).await {
                Ok(connected) => return Ok(connected),
                Err(e) => failed = Some(e),
            }
        }
        Err(failed.expect("a connection string has a host"))
    }

    async fn connect_host(&self, config: &Config) -> Result<(Client, Connection<Socket, Stream>)> {
        let target = if self.hosts.len() == 1 {
            self.target.clone()
        } else {
            describe_target(config)
        };
        let connecting = config.connect(self.tls.clone());
        let connected = match self.connect_timeout {
            None => connecting.await,
            Some(bound) => match tokio::time::timeout(bound, connecting).await {
                Ok(connected) => connected,
                Err(_) => {
                    return Err(StoreError::Connect {
                        target,
                        detail: format!(
                            "no answer within {} (connect_timeout, or PGCONNECT_TIMEOUT)",
                            humantime::format_duration(bound)
                        ),
                        cause: Box::new(std::io::Error::from(std::io::ErrorKind::TimedOut)),
                    })
                }
            },
        };
        connected.map_err(|cause| StoreError::Connect {
            target,
            detail: describe(&cause),
            cause: Box::new(cause),
        })
    }

    /// A new connection driven by a task of its own.
    pub(crate) async fn connect(&self) -> Result<Client> {
        let (client, connection) = self.connect_raw().await?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(client)
    }

    /// A new connection driven by a task of its own that passes on the messages a script
    /// raises beginning with `prefix` (without it), as they arrive during a statement.
    pub(crate) async fn connect_hearing(
        &self,
        prefix: &'static str,
    ) -> Result<(Client, mpsc::UnboundedReceiver<String>)> {
        let (client, mut connection) = self.connect_raw().await?;
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(Ok(message)) = messages.next().await {
                if let AsyncMessage::Notice(notice) = message {
                    if let Some(text) = notice.message().strip_prefix(prefix) {
                        let _ = tx.send(text.to_owned());
                    }
                }
            }
        });
        Ok((client, rx))
    }

    pub(crate) fn connect_error(&self, cause: tokio_postgres::Error) -> StoreError {
        StoreError::Connect {
            target: self.target.clone(),
            detail: describe(&cause),
            cause: Box::new(cause),
        }
    }
}

fn describe_target(config: &Config) -> String {
    let host = config
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .unwrap_or_else(|| "localhost".into());
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!(
        "PostgreSQL at {host}:{port}/{} as {}",
        config.get_dbname().unwrap_or("?"),
        config.get_user().unwrap_or("?")
    )
}

/// The server's own words for an error: message, SQLSTATE and detail.
pub(crate) fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => {
            let mut s = format!("{} ({})", db.message(), db.code().code());
            if let Some(detail) = db.detail() {
                s.push_str(&format!(": {detail}"));
            }
            s
        }
        // The driver's text repeats "error connecting to server: "; the cause is what matters.
        None => match std::error::Error::source(e) {
            Some(cause) => cause.to_string(),
            None => e.to_string(),
        },
    }
}

/// Wraps a driver error with what was being done.
pub(crate) fn db(context: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> StoreError {
    let context = context.into();
    move |cause| StoreError::Database {
        context,
        detail: describe(&cause),
        cause: Box::new(cause),
    }
}

/// The errors after which a session cannot be trusted for more work, though it may still be
/// open: it was opened read-only (`default_transaction_read_only` set for the database, or a
/// standby after a failover) or the server is going away. The pool closes such a session and
/// every idle one opened before it, which likely shares the cause, instead of handing them out
/// again; a worker would otherwise fail on them long after the cause went away.
pub(crate) fn session_unusable(e: &tokio_postgres::Error) -> bool {
    let Some(db) = e.as_db_error() else {
        return e.is_closed();
    };
    let code = db.code().code();
    code.starts_with("08")
        || code.starts_with("57P")
        || [
            SqlState::READ_ONLY_SQL_TRANSACTION.code(),
            SqlState::IN_FAILED_SQL_TRANSACTION.code(),
            SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT.code(),
        ]
        .contains(&code)
}

/// The errors of a prepared statement that a transaction pooler gives: missing from the server
/// session a transaction was given (prepared in another, or reset away), already there (another
/// process prepared one of that name in that session), or of another shape. None of them ran
/// the statement.
fn pooled_session(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_some_and(|db| {
        let code = db.code();
        *code == SqlState::INVALID_SQL_STATEMENT_NAME
            || *code == SqlState::DUPLICATE_PSTATEMENT
            || (*code == SqlState::PROTOCOL_VIOLATION
                && db.message().starts_with("bind message supplies"))
    })
}

/// The driver error behind a store error, if any.
pub(crate) fn driver_error(e: &StoreError) -> Option<&tokio_postgres::Error> {
    match e {
        StoreError::Database { cause, .. } | StoreError::Connect { cause, .. } => {
            cause.downcast_ref()
        }
        _ => None,
    }
}

/// The statement that finds a transaction pooler when a connection opens: prepared in one round
/// trip, run in the next, where a pooler may have given the connection another server session
/// (or reset this one), or a session where others prepared statements. Its name carries a tag
/// drawn once per process, so that another connection of this process that meets the same
/// server session is refused it.
static PROBE: LazyLock<String> =
    LazyLock::new(|| format!("relaybus_probe_{:016x}", rand::random::<u64>()));

/// The session settings of a tuned connection: one generic plan per statement, made without
/// sequential scans and without JIT. Left to the server's defaults, a connection's first plan
/// of a statement is often made on an empty store and would scan a table of millions, and a
/// generic plan's estimate can pass `jit_above_cost` and compile on every call.
const TUNED_SESSION: &str =
    "SET plan_cache_mode = force_generic_plan; SET jit = off; SET enable_seqscan = off";

/// What the connections of a pool share.
#[derive(Debug)]
struct Shared {
    /// Statements sent, and how many of them the server had to parse and plan (a prepare, or
    /// an unnamed statement).
    statements: AtomicU64,
    parses: AtomicU64,
    /// Statements are prepared once per connection: on unless turned off, until a transaction
    /// pooler shows itself.
    prepared: AtomicBool,
    /// Long-lived sessions with prepared statements are tuned (see the design note on the
    /// delivery path).
    long_lived: bool,
}

impl Shared {
    fn prepared(&self) -> bool {
        self.prepared.load(Ordering::Relaxed)
    }

    fn pooler_found(&self, why: &str) {
        if self.prepared.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                why,
                "the connection goes through a transaction pooler, which shares server sessions \
                 between clients: statements are sent unnamed from now on \
                 (--no-prepared-statements starts that way)"
            );
        }
    }
}

/// One server session and the statements it has prepared.
pub(crate) struct Conn {
    pub(crate) client: Client,
    shared: Arc<Shared>,
    prepared: HashMap<&'static str, Statement>,
    /// The server process serving it, when known (tuned sessions).
    pid: Option<i32>,
    /// The pool's generation when it was opened: an older one is closed on return.
    generation: u64,
    /// An error said the session cannot be trusted any more (`session_unusable`).
    unusable: AtomicBool,
}

/// Rows, and the count of rows the statement affected.
type Outcome = (Vec<Row>, u64);

impl Conn {
    async fn open(pool: &Pool) -> Result<Conn> {
        let opts = &pool.opts;
        let generation = pool.generation.load(Ordering::Relaxed);
        let client = opts.connect().await?;
        let mut pid = None;
        if pool.shared.prepared() {
            match probe(&client)
                .await
                .map_err(|cause| opts.connect_error(cause))?
            {
                Probe::Pooled(why) => pool.shared.pooler_found(&why),
                Probe::Direct(found) if pool.shared.long_lived => {
                    client
                        .batch_execute(TUNED_SESSION)
                        .await
                        .map_err(|cause| opts.connect_error(cause))?;
                    pid = Some(found);
                }
                Probe::Direct(_) => {}
            }
        }
        Ok(Conn {
            client,
            shared: Arc::clone(&pool.shared),
            prepared: HashMap::new(),
            pid,
            generation,
            unusable: AtomicBool::new(false),
        })
    }

    /// Passes a result on, remembering an error after which the session is not to be reused.
    /// Every statement a pooled session runs goes through here, the handler's statements too.
    pub(crate) fn checked<T>(
        &self,
        result: Result<T, tokio_postgres::Error>,
    ) -> Result<T, tokio_postgres::Error> {
        if let Err(e) = &result {
            self.note(e);
        }
        result
    }

    /// Remembers an error after which the session is not to be reused.
    pub(crate) fn note(&self, e: &tokio_postgres::Error) {
        if session_unusable(e) {
            self.unusable.store(true, Ordering::Relaxed);
        }
    }

    /// Runs a statement of the delivery path: prepared once per connection, or unnamed.
    pub(crate) async fn query(
        &mut self,
        sql: &Sql,
        params: Params<'_>,
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        Ok(self.run(sql, params).await?.0)
    }

    /// Runs a statement of the delivery path for its row count.
    pub(crate) async fn execute(
        &mut self,
        sql: &Sql,
        params: Params<'_>,
    ) -> Result<u64, tokio_postgres::Error> {
        Ok(self.run(sql, params).await?.1)
    }

    /// Runs an operator's statement unnamed, so the server plans it for these values: a NULL
    /// filter drops out of the plan. One round trip, which poolers accept too.
    pub(crate) async fn query_once(
        &self,
        sql: &Sql,
        params: Params<'_>,
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        self.shared.statements.fetch_add(1, Ordering::Relaxed);
        self.shared.parses.fetch_add(1, Ordering::Relaxed);
        let result = send(&self.client, sql, params).await;
        Ok(self.checked(result)?.0)
    }

    /// A statement that meets a transaction pooler is not run: it was missing, or its PREPARE
    /// was refused. It is sent again unnamed, as every later one.
    async fn run(
        &mut self,
        sql: &Sql,
        params: Params<'_>,
    ) -> Result<Outcome, tokio_postgres::Error> {
        self.shared.statements.fetch_add(1, Ordering::Relaxed);
        if self.shared.prepared() {
            match self.run_prepared(sql, params).await {
                Err(e) if pooled_session(&e) => self.shared.pooler_found(&describe(&e)),
                result => return self.checked(result),
            }
        }
        self.shared.parses.fetch_add(1, Ordering::Relaxed);
        let result = send(&self.client, sql, params).await;
        self.checked(result)
    }

    async fn run_prepared(
        &mut self,
        sql: &Sql,
        params: Params<'_>,
    ) -> Result<Outcome, tokio_postgres::Error> {
        let statement = match self.prepared.get(sql.name) {
            Some(s) => s.clone(),
            None => {
                self.shared.parses.fetch_add(1, Ordering::Relaxed);
                let s = self.client.prepare_typed(&sql.text, &sql.types).await?;
                self.prepared.insert(sql.name, s.clone());
                s
            }
        };
        let stream = self
            .client
            .query_raw(&statement, params.iter().copied())
            .await?;
        collect(stream).await
    }
}

/// Sends a statement unnamed, its parameters typed, in one round trip.
async fn send(
    client: &Client,
    sql: &Sql,
    params: Params<'_>,
) -> Result<Outcome, tokio_postgres::Error> {
    collect(client.query_typed_raw(&sql.text, sql.typed(params)).await?).await
}

async fn collect(stream: RowStream) -> Result<Outcome, tokio_postgres::Error> {
    futures_util::pin_mut!(stream);
    let mut rows = Vec::new();
    while let Some(row) = stream.next().await {
        rows.push(row?);
    }
    Ok((rows, stream.rows_affected().unwrap_or(0)))
}

enum Probe {
    /// The server session is the connection's own, served by this process id.
    Direct(i32),
    /// A transaction pooler sits between, as this error or these statements show.
    Pooled(String),
}

/// Runs the probe (see `PROBE`). A session of its own holds no statement but the probe.
async fn probe(client: &Client) -> Result<Probe, tokio_postgres::Error> {
    let name = &*PROBE;
    let sql = format!(
        "PREPARE {name} AS SELECT pg_backend_pid()::text, \
         (SELECT count(*) FROM pg_prepared_statements)::text"
    );
    let replies = match client.batch_execute(&sql).await {
        Ok(()) => client.simple_query(&format!("EXECUTE {name}")).await,
        Err(e) => Err(e),
    };
    let replies = match replies {
        Err(e) if pooled_session(&e) => return Ok(Probe::Pooled(describe(&e))),
        replies => replies?,
    };
    let row = replies.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(row) => Some((row.get(0)?.parse().ok()?, row.get(1)?.to_owned())),
        _ => None,
    });
    Ok(match row {
        Some((pid, held)) if held == "1" => Probe::Direct(pid),
        Some((_, held)) => Probe::Pooled(format!("the session holds {held} prepared statements")),
        None => Probe::Pooled("the probe returned no row".into()),
    })
}

/// A fixed-size pool. Connections are opened on demand; one that is closed, or that an error
/// left unusable, is dropped on return, with every idle one opened before it.
pub(crate) struct Pool {
    opts: ConnectOptions,
    shared: Arc<Shared>,
    state: Mutex<PoolState>,
    /// Bumped when a session turned out unusable: older ones are not handed out again.
    generation: AtomicU64,
    permits: Arc<Semaphore>,
}

#[derive(Default)]
struct PoolState {
    idle: Vec<Conn>,
    /// The server processes of the sessions handed out, where known.
    busy: Vec<i32>,
}

pub(crate) struct PooledConn<'a> {
    conn: Option<Conn>,
    pool: &'a Pool,
    _permit: OwnedSemaphorePermit,
}

impl Pool {
    pub(crate) fn new(opts: ConnectOptions, options: &StoreOptions) -> Self {
        Self {
            opts,
            shared: Arc::new(Shared {
                statements: AtomicU64::new(0),
                parses: AtomicU64::new(0),
                prepared: AtomicBool::new(options.prepared_statements),
                long_lived: options.long_lived,
            }),
            state: Mutex::default(),
            generation: AtomicU64::new(0),
            permits: Arc::new(Semaphore::new(options.pool_size.max(1))),
        }
    }

    pub(crate) fn options(&self) -> &ConnectOptions {
        &self.opts
    }

    /// Whether statements are prepared once per connection (not behind a transaction pooler).
    pub(crate) fn prepared_statements(&self) -> bool {
        self.shared.prepared()
    }

    pub(crate) fn counts(&self) -> ClientCounts {
        ClientCounts {
            statements: self.shared.statements.load(Ordering::Relaxed),
            parses: self.shared.parses.load(Ordering::Relaxed),
        }
    }

    pub(crate) async fn get(&self) -> Result<PooledConn<'_>> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the pool's semaphore is never closed");
        let idle = self.state.lock().expect("pool lock").idle.pop();
        let conn = match idle {
            Some(c) if !c.client.is_closed() => c,
            _ => Conn::open(self).await?,
        };
        if let Some(pid) = conn.pid {
            self.state.lock().expect("pool lock").busy.push(pid);
        }
        Ok(PooledConn {
            conn: Some(conn),
            pool: self,
            _permit: permit,
        })
    }
}

impl std::ops::Deref for PooledConn<'_> {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        self.conn.as_ref().expect("present until drop")
    }
}

impl std::ops::DerefMut for PooledConn<'_> {
    fn deref_mut(&mut self) -> &mut Conn {
        self.conn.as_mut().expect("present until drop")
    }
}

impl Pool {
    /// The server processes of the sessions handed out now.
    pub(crate) fn busy_pids(&self) -> Vec<i32> {
        self.state.lock().expect("pool lock").busy.clone()
    }

    fn put_back(&self, conn: Conn) {
        let mut state = self.state.lock().expect("pool lock");
        if let Some(at) = conn
            .pid
            .and_then(|p| state.busy.iter().position(|b| *b == p))
        {
            state.busy.swap_remove(at);
        }
        if conn.unusable.load(Ordering::Relaxed) {
            self.generation
                .fetch_max(conn.generation + 1, Ordering::Relaxed);
            state.idle.clear();
        } else if !conn.client.is_closed()
            && conn.generation == self.generation.load(Ordering::Relaxed)
        {
            state.idle.push(conn);
        }
    }
}

impl Drop for PooledConn<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.put_back(conn);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::testing::database_url;

    /// Long-lived stores with prepared statements plan generically, without sequential scans or
    /// JIT; one-shot stores and unnamed-statement stores (the pooler mode) keep the server's
    /// settings, since a pooler would hand them to other clients.
    #[tokio::test]
    async fn session_settings_follow_the_store_kind_and_statement_mode() {
        async fn settings(client: &Client) -> Vec<String> {
            let sql = "SELECT current_setting('plan_cache_mode'), current_setting('jit'), \
                              current_setting('enable_seqscan')";
            let row = client.query_one(sql, &[]).await.unwrap();
            (0..3).map(|i| row.get(i)).collect()
        }
        let opts = ConnectOptions::resolve(Some(&database_url())).unwrap();
        let mut seen = vec![];
        for (long_lived, prepared_statements) in [(true, true), (true, false), (false, true)] {
            let options = StoreOptions {
                long_lived,
                prepared_statements,
                ..StoreOptions::admin()
            };
            let pool = Pool::new(opts.clone(), &options);
            seen.push(settings(&pool.get().await.unwrap().client).await);
        }
        let server = settings(&opts.connect().await.unwrap()).await;
        assert_eq!(server, ["auto", "on", "on"], "the test server's defaults");
        let tuned: Vec<String> = ["force_generic_plan", "off", "off"]
            .map(String::from)
            .into();
        assert_eq!(seen, [tuned, server.clone(), server]);
    }
}
