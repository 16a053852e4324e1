//! Connections to PostgreSQL: where to connect, how statements are sent, and a small pool.
//!
//! Every statement whose text never changes is a `Sql` with a fixed slot. With prepared
//! statements on, a connection parses each one once and afterwards only binds parameters; with
//! them off (PgBouncer before 1.21 in transaction mode), each call sends Parse, Bind and Execute
//! of an unnamed statement in one round trip, which poolers accept.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::{Client, Config, NoTls, Row, Statement};

use crate::store::{Result, StoreError};

/// How to reach the server, resolved once from the URL or the libpq variables.
#[derive(Clone, Debug)]
pub struct ConnectOptions {
    pub config: Config,
    /// `host:port/db as user`, for messages; never holds the password.
    pub target: String,
    pub prepared_statements: bool,
    pub lock_timeout: Duration,
}

impl ConnectOptions {
    /// From a `postgres://` URL, or from `PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD` and
    /// `PGDATABASE` with libpq's defaults when no URL is given.
    pub fn resolve(url: Option<&str>) -> Result<Config> {
        match url {
            Some(url) => {
                if url.starts_with("mongodb://") || url.starts_with("mongodb+srv://") {
                    return Err(StoreError::MongoUnavailable);
                }
                if !(url.starts_with("postgres://") || url.starts_with("postgresql://")) {
                    return Err(StoreError::UnsupportedUrl(redact_url(url)));
                }
                url.parse::<Config>()
                    .map_err(|_| StoreError::UnsupportedUrl(redact_url(url)))
            }
            None => Ok(from_libpq_env()),
        }
    }

    pub fn new(config: Config, prepared_statements: bool, lock_timeout: Duration) -> Self {
        let target = describe_target(&config);
        let mut config = config;
        if config.get_application_name().is_none() {
            config.application_name("relaybus");
        }
        Self {
            config,
            target,
            prepared_statements,
            lock_timeout,
        }
    }
}

fn from_libpq_env() -> Config {
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let mut config = Config::new();
    let host = var("PGHOST").unwrap_or_else(|| {
        // libpq's default is the server's Unix socket directory where one exists.
        if std::path::Path::new("/var/run/postgresql").exists() {
            "/var/run/postgresql".into()
        } else {
            "localhost".into()
        }
    });
    config.host(&host);
    config.port(var("PGPORT").and_then(|p| p.parse().ok()).unwrap_or(5432));
    let user = var("PGUSER")
        .or_else(|| var("USER"))
        .unwrap_or_else(|| "postgres".into());
    config.dbname(var("PGDATABASE").unwrap_or_else(|| user.clone()));
    config.user(&user);
    if let Some(password) = var("PGPASSWORD") {
        config.password(password);
    }
    config
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

/// A URL with its password replaced by `***`, for messages and logs.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let authority = &rest[..authority_end];
    match (authority.rfind('@'), authority.find(':')) {
        (Some(at), Some(colon)) if colon < at => format!(
            "{}{}:***{}",
            &url[..scheme_end + 3],
            &authority[..colon],
            &rest[at..]
        ),
        _ => url.to_owned(),
    }
}

/// Statements a store sent, and how many of them the server had to parse (a prepare, or an
/// unnamed statement).
#[derive(Debug, Default)]
pub(crate) struct StatementCounts {
    statements: AtomicU64,
    parses: AtomicU64,
}

impl StatementCounts {
    pub fn get(&self) -> (u64, u64) {
        (
            self.statements.load(Ordering::Relaxed),
            self.parses.load(Ordering::Relaxed),
        )
    }
}

/// A statement with a fixed text for the life of a store, and its parameter types.
#[derive(Debug)]
pub(crate) struct Sql {
    pub slot: usize,
    pub text: String,
    pub types: &'static [Type],
}

/// One server session and the statements it has prepared.
pub(crate) struct Conn {
    pub client: Client,
    prepared_statements: bool,
    prepared: HashMap<usize, Statement>,
    counts: Arc<StatementCounts>,
}

pub(crate) type Params<'a> = &'a [&'a (dyn ToSql + Sync)];

impl Conn {
    pub async fn connect(opts: &ConnectOptions, counts: Arc<StatementCounts>) -> Result<Conn> {
        let (client, connection) =
            opts.config
                .connect(NoTls)
                .await
                .map_err(|cause| StoreError::Connect {
                    target: opts.target.clone(),
                    cause,
                })?;
        tokio::spawn(async move {
            // The error reaches the caller through the client's next request.
            let _ = connection.await;
        });
        if opts.prepared_statements {
            // The statements take arrays and are written for one plan that fits every call;
            // left to choose, the server re-plans the claim on every call (measured: 1.9 ms of
            // planning against 1.3 ms of execution). A connection keeps the plan it made first,
            // often on a store that was empty then: there every statement would read its tables
            // sequentially, and keep doing so over a backlog of millions until an autoanalyze.
            // Every statement here has an index for its access, so sequential scans are ruled
            // out. A generic plan's estimates know nothing of the arrays' sizes and can pass
            // jit_above_cost, and then every execution of the claim compiled its expressions
            // first: 37-40 ms of LLVM emission in a 41 ms claim (auto_explain). Unnamed
            // statements are planned per call anyway, and a pooler would leak the settings to
            // other clients, so they are set only here.
            client
                .batch_execute(
                    "SET plan_cache_mode = force_generic_plan; SET jit = off; \
                     SET enable_seqscan = off",
                )
                .await
                .map_err(|cause| StoreError::Connect {
                    target: opts.target.clone(),
                    cause,
                })?;
        }
        Ok(Conn {
            client,
            prepared_statements: opts.prepared_statements,
            prepared: HashMap::new(),
            counts,
        })
    }

    pub async fn query(
        &mut self,
        sql: &Sql,
        params: Params<'_>,
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        self.counts.statements.fetch_add(1, Ordering::Relaxed);
        if self.prepared_statements {
            let statement = self.statement(sql).await?;
            self.client.query(&statement, params).await
        } else {
            self.counts.parses.fetch_add(1, Ordering::Relaxed);
            self.client
                .query_typed(&sql.text, &typed(sql, params))
                .await
        }
    }

    pub async fn execute(
        &mut self,
        sql: &Sql,
        params: Params<'_>,
    ) -> Result<u64, tokio_postgres::Error> {
        self.counts.statements.fetch_add(1, Ordering::Relaxed);
        if self.prepared_statements {
            let statement = self.statement(sql).await?;
            self.client.execute(&statement, params).await
        } else {
            self.counts.parses.fetch_add(1, Ordering::Relaxed);
            self.client
                .execute_typed(&sql.text, &typed(sql, params))
                .await
        }
    }

    async fn statement(&mut self, sql: &Sql) -> Result<Statement, tokio_postgres::Error> {
        if let Some(s) = self.prepared.get(&sql.slot) {
            return Ok(s.clone());
        }
        self.counts.parses.fetch_add(1, Ordering::Relaxed);
        let s = self.client.prepare_typed(&sql.text, sql.types).await?;
        self.prepared.insert(sql.slot, s.clone());
        Ok(s)
    }
}

fn typed<'a>(sql: &Sql, params: Params<'a>) -> Vec<(&'a (dyn ToSql + Sync), Type)> {
    params
        .iter()
        .zip(sql.types)
        .map(|(p, t)| (*p, t.clone()))
        .collect()
}

/// A fixed-size pool. Connections are opened on demand and a broken one is dropped on return.
pub(crate) struct Pool {
    opts: ConnectOptions,
    idle: Mutex<Vec<Conn>>,
    permits: Arc<Semaphore>,
    pub counts: Arc<StatementCounts>,
}

pub(crate) struct PooledConn<'a> {
    conn: Option<Conn>,
    pool: &'a Pool,
    _permit: OwnedSemaphorePermit,
}

impl Pool {
    pub fn new(opts: ConnectOptions, size: usize) -> Self {
        Self {
            opts,
            idle: Mutex::new(Vec::new()),
            permits: Arc::new(Semaphore::new(size.max(1))),
            counts: Arc::default(),
        }
    }

    pub fn options(&self) -> &ConnectOptions {
        &self.opts
    }

    pub async fn get(&self) -> Result<PooledConn<'_>> {
        let permit = self
            .permits
            .clone()
            .acquire_owned()
            .await
            .expect("the pool's semaphore is never closed");
        let idle = self.idle.lock().expect("pool lock").pop();
        let conn = match idle {
            Some(c) if !c.client.is_closed() => c,
            _ => Conn::connect(&self.opts, Arc::clone(&self.counts)).await?,
        };
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

impl Drop for PooledConn<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if !conn.client.is_closed() {
                self.pool.idle.lock().expect("pool lock").push(conn);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::postgres::testing::database_url;

    /// Prepared connections plan generically, without sequential scans or JIT; unnamed-statement
    /// connections (the pooler mode) keep the server's settings, since a pooler would hand them
    /// to other clients.
    #[tokio::test]
    async fn session_settings_follow_the_statement_mode() {
        async fn settings(client: &Client) -> Vec<String> {
            let sql = "SELECT current_setting('plan_cache_mode'), current_setting('jit'), \
                              current_setting('enable_seqscan')";
            let row = client.query_one(sql, &[]).await.unwrap();
            (0..3).map(|i| row.get(i)).collect()
        }
        let url = database_url();
        let mut seen = vec![];
        for prepared in [true, false] {
            let config = ConnectOptions::resolve(Some(&url)).unwrap();
            let opts = ConnectOptions::new(config, prepared, Duration::from_secs(10));
            let conn = Conn::connect(&opts, Arc::default()).await.unwrap();
            seen.push(settings(&conn.client).await);
        }
        let (client, connection) = tokio_postgres::connect(&url, NoTls).await.unwrap();
        tokio::spawn(connection);
        let server = settings(&client).await;
        assert_eq!(server, ["auto", "on", "on"], "the test server's defaults");
        assert_eq!(seen[0], ["force_generic_plan", "off", "off"]);
        assert_eq!(seen[1], server);
    }

    #[test]
    fn passwords_never_survive_redaction() {
        assert_eq!(
            redact_url("postgres://app:s3cret@db:5432/x?sslmode=disable"),
            "postgres://app:***@db:5432/x?sslmode=disable"
        );
        assert_eq!(redact_url("postgres://app@db/x"), "postgres://app@db/x");
        assert_eq!(redact_url("postgres://db/x"), "postgres://db/x");
    }
}
