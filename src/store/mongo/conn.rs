//! The connection to MongoDB: the URL checked when the store opens and the client built on
//! first use, the store's collections, the errors a command shows, the operations counted for
//! `bench`, and transactions retried as the driver documents.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mongodb::bson::Document;
use mongodb::error::{ErrorKind, TRANSIENT_TRANSACTION_ERROR, UNKNOWN_TRANSACTION_COMMIT_RESULT};
use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;
use mongodb::options::{Acknowledgment, ClientOptions, ConnectionString, WriteConcern};
use mongodb::{Client, ClientSession, Collection, Database};
use tokio::sync::OnceCell;

use crate::store::{
    redact, refuse_ambiguous, unparsable, ClientCounts, Result, StoreError, StoreOptions,
};

/// A server that accepts connections and never answers fails a command within this, unless the
/// URL sets `serverSelectionTimeoutMS`.
const SERVER_SELECTION_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a transaction is run again after transient errors before it fails.
const TRANSIENT_RETRY: Duration = Duration::from_secs(2);

/// The database a MongoDB URL names in its path, if any.
pub(crate) fn url_database(url: &str) -> Option<String> {
    ConnectionString::parse(url).ok()?.default_database
}

/// A client, built on first use, and the database of the store.
pub(super) struct Connection {
    url: String,
    database: String,
    pool_size: u32,
    client: OnceCell<Client>,
    /// Commands sent, counted by the driver's command monitoring.
    operations: Arc<AtomicU64>,
}

impl Connection {
    /// Checks the URL now; connects on first use.
    pub(super) fn new(url: &str, database: &str, options: &StoreOptions) -> Result<Self> {
        refuse_ambiguous(url)?;
        ConnectionString::parse(url).map_err(|e| unparsable(url, e.kind.to_string()))?;
        Ok(Self {
            url: url.to_owned(),
            database: database.to_owned(),
            pool_size: options.pool_size.max(1) as u32,
            client: OnceCell::new(),
            operations: Arc::new(AtomicU64::new(0)),
        })
    }

    pub(super) async fn client(&self) -> Result<&Client> {
        self.client
            .get_or_try_init(|| async {
                let mut options = ClientOptions::parse(&self.url)
                    .await
                    .map_err(|e| self.connect_error(e))?;
                options.app_name.get_or_insert_with(|| "relaybus".into());
                options
                    .server_selection_timeout
                    .get_or_insert(SERVER_SELECTION_TIMEOUT);
                options.max_pool_size = Some(self.pool_size);
                // Every write is acknowledged once a majority has it in its journal (the
                // default of a replica set, asked for so that a server configured otherwise does
                // not acknowledge a claim it may lose: a claim lost in a crash is a delivery
                // that runs again as if for the first time). A URL that says otherwise wins.
                options.write_concern.get_or_insert_with(|| {
                    WriteConcern::builder()
                        .w(Acknowledgment::Majority)
                        .journal(true)
                        .build()
                });
                let operations = Arc::clone(&self.operations);
                options.command_event_handler =
                    Some(EventHandler::callback(move |event: CommandEvent| {
                        if let CommandEvent::Started(_) = event {
                            operations.fetch_add(1, Ordering::Relaxed);
                        }
                    }));
                let client = Client::with_options(options).map_err(|e| self.connect_error(e))?;
                self.require_replica_set(&client).await?;
                Ok(client)
            })
            .await
    }

    /// Fails unless the server is a replica set member or a `mongos`: asked once, when the
    /// client is built, so that no command runs against a standalone server.
    async fn require_replica_set(&self, client: &Client) -> Result<()> {
        let hello = client
            .database("admin")
            .run_command(mongodb::bson::doc! { "hello": 1 })
            .await
            .map_err(|e| self.connect_error(e))?;
        let replica_set = hello.get_str("setName").is_ok();
        let router = hello.get_str("msg") == Ok("isdbgrid");
        if replica_set || router {
            return Ok(());
        }
        Err(StoreError::NotReplicaSet {
            target: format!("MongoDB at {}", redact(&self.url)),
        })
    }

    pub(super) async fn database(&self) -> Result<Database> {
        Ok(self.client().await?.database(&self.database))
    }

    pub(super) async fn collection(&self, name: &str) -> Result<Collection<Document>> {
        Ok(self.database().await?.collection(name))
    }

    pub(super) fn counts(&self) -> ClientCounts {
        ClientCounts {
            statements: self.operations.load(Ordering::Relaxed),
            parses: 0,
        }
    }

    fn connect_error(&self, cause: mongodb::error::Error) -> StoreError {
        StoreError::Connect {
            target: format!("MongoDB at {}", redact(&self.url)),
            detail: describe(&cause),
            cause: Box::new(cause),
        }
    }

    /// The error a failed operation shows: a server that cannot be reached reads as a
    /// connection failure, anything else as `context` with the server's message.
    pub(super) fn error(
        &self,
        context: impl Into<String>,
    ) -> impl Fn(mongodb::error::Error) -> StoreError + '_ {
        let context = context.into();
        move |cause| match &*cause.kind {
            ErrorKind::ServerSelection { .. }
            | ErrorKind::DnsResolve { .. }
            | ErrorKind::Authentication { .. } => self.connect_error(cause),
            ErrorKind::Command(c) if c.code == UNAUTHORIZED => self.connect_error(cause),
            _ => StoreError::Database {
                context: context.clone(),
                detail: describe(&cause),
                cause: Box::new(cause),
            },
        }
    }

    /// Runs `body` in a transaction, committed when it returns. Transient errors (a write
    /// conflict with another transaction, an unknown commit result) run it again for
    /// `TRANSIENT_RETRY` at most, then fail: the driver's own loop retries for 120 s, longer
    /// than the server keeps a dead client's transaction (60 s), and a worker waited behind one
    /// for all that time. Each caller retries later as its work allows (`transient` tells).
    pub(super) async fn transaction<T>(
        &self,
        context: &str,
        body: impl for<'s> AsyncFnMut(&'s mut ClientSession) -> mongodb::error::Result<T>,
    ) -> Result<T> {
        self.transaction_within(context, TRANSIENT_RETRY, body)
            .await
    }

    /// Runs `body` in a transaction once: a transient error is returned at once, for work that
    /// is better tried again later than waited for (a best-effort write, or one that conflicts
    /// with a dead client's transaction).
    pub(super) async fn transaction_once<T>(
        &self,
        context: &str,
        body: impl for<'s> AsyncFnMut(&'s mut ClientSession) -> mongodb::error::Result<T>,
    ) -> Result<T> {
        self.transaction_within(context, Duration::ZERO, body).await
    }

    pub(super) async fn transaction_within<T>(
        &self,
        context: &str,
        retry_for: Duration,
        mut body: impl for<'s> AsyncFnMut(&'s mut ClientSession) -> mongodb::error::Result<T>,
    ) -> Result<T> {
        let client = self.client().await?;
        let mut session = client.start_session().await.map_err(self.error(context))?;
        let deadline = Instant::now() + retry_for;
        let mut pause = Duration::from_millis(5);
        loop {
            match attempt(&mut session, &mut body, deadline).await {
                Err(e)
                    if e.contains_label(TRANSIENT_TRANSACTION_ERROR)
                        && Instant::now() < deadline =>
                {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                done => return done.map_err(self.error(context)),
            }
        }
    }
}

/// A driver error in one sentence: the kind's own message, without the driver's dump of labels
/// and sources. When no server could be selected, each server's own error (a refused
/// connection, bad credentials) instead of the topology; the driver's labels on them
/// ("SystemOverloadedError" on a refused connection) are for its retry logic, not for people.
pub(super) fn describe(e: &mongodb::error::Error) -> String {
    match &*e.kind {
        ErrorKind::ServerSelection { message, .. } => {
            let servers = server_errors(message);
            match replica_set(message) {
                _ if !servers.is_empty() => servers.join("; "),
                Some(set) => format!(
                    "no member of the replica set `{set}` answered before the server selection \
                     timeout (serverSelectionTimeoutMS); a server that answers as a member of \
                     another set is left out: check `replicaSet` in the URL"
                ),
                None => "no server answered before the server selection timeout \
                         (serverSelectionTimeoutMS)"
                    .to_owned(),
            }
        }
        ErrorKind::Command(c) if c.code == UNAUTHORIZED => format!(
            "the server requires authentication, or this user lacks the privileges: give a \
             user and password in the URL (mongodb://user:password@host/...) with a role that \
             may read and write the database ({}: {})",
            c.code_name, c.message
        ),
        ErrorKind::Authentication { message, .. } => {
            format!("bad credentials (authentication failed: {message})")
        }
        kind => kind.to_string(),
    }
}

/// The server's code for a command refused for want of authentication or privileges.
const UNAUTHORIZED: i32 = 13;

/// The replica set the driver looked for, as its server selection message names it.
fn replica_set(message: &str) -> Option<&str> {
    let after = message.split("Set Name: ").nth(1)?;
    let name = after.split([',', ' ', '}']).next()?;
    (!name.is_empty() && name != "None").then_some(name)
}

/// `address: error` of each server the driver's server selection message lists with an error,
/// from its description of the topology (`{ Address: h:p, Type: Unknown, Error: Kind: ...,
/// labels: ... }`).
fn server_errors(message: &str) -> Vec<String> {
    message
        .split("Address: ")
        .skip(1)
        .filter_map(|server| {
            let (address, rest) = server.split_once(',')?;
            let error = rest.split_once("Error: Kind: ")?.1;
            let error = error.split(", labels:").next()?.trim();
            let error = match error.strip_prefix("I/O error: ") {
                Some(io) => io.to_owned(),
                None => error.to_owned(),
            };
            let error = if error.contains("Authentication failed") || error.contains("auth") {
                format!("bad credentials ({error})")
            } else {
                error
            };
            Some(format!("{address}: {error}"))
        })
        .collect()
}

/// The server's code of a failed command or write.
pub(super) fn command_code(e: &mongodb::error::Error) -> Option<i32> {
    match &*e.kind {
        mongodb::error::ErrorKind::Command(c) => Some(c.code),
        mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w)) => {
            Some(w.code)
        }
        _ => None,
    }
}

/// A write refused by a unique index (E11000).
pub(super) fn is_duplicate_key(e: &mongodb::error::Error) -> bool {
    command_code(e) == Some(11000)
}

/// Whether a store error is a transient conflict of transactions: the same work may succeed
/// once the other transaction ends.
pub(super) fn transient(e: &StoreError) -> bool {
    match e {
        StoreError::Database { cause, .. } => cause
            .downcast_ref::<mongodb::error::Error>()
            .is_some_and(|e| e.contains_label(TRANSIENT_TRANSACTION_ERROR)),
        _ => false,
    }
}

/// One run of a transaction's body and its commit; an unknown commit result is committed again
/// until `deadline`, as the transactions specification allows.
async fn attempt<T>(
    session: &mut ClientSession,
    body: &mut impl for<'s> AsyncFnMut(&'s mut ClientSession) -> mongodb::error::Result<T>,
    deadline: Instant,
) -> mongodb::error::Result<T> {
    session.start_transaction().await?;
    let value = match body(session).await {
        Ok(value) => value,
        Err(e) => {
            // The server may have aborted it already; either way it is over.
            let _ = session.abort_transaction().await;
            return Err(e);
        }
    };
    loop {
        match session.commit_transaction().await {
            Err(e)
                if e.contains_label(UNKNOWN_TRANSACTION_COMMIT_RESULT)
                    && Instant::now() < deadline => {}
            done => return done.map(|()| value),
        }
    }
}
