//! The connection to MongoDB: the URL checked when the store opens and the client built on
//! first use, the store's collections, the errors a command shows, the operations counted for
//! `bench`, and transactions retried as the driver documents.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::Document;
use mongodb::event::command::CommandEvent;
use mongodb::event::EventHandler;
use mongodb::options::{ClientOptions, ConnectionString};
use mongodb::{Client, ClientSession, Collection, Database};
use tokio::sync::OnceCell;

use crate::store::{redact, ClientCounts, Result, StoreError, StoreOptions};

/// A server that accepts connections and never answers fails a command within this, unless the
/// URL sets `serverSelectionTimeoutMS`.
const SERVER_SELECTION_TIMEOUT: Duration = Duration::from_secs(10);

/// The database a MongoDB URL names in its path, if any.
pub(crate) fn url_database(url: &str) -> Option<String> {
    ConnectionString::parse(url).ok()?.default_database
}

/// A database name MongoDB accepts, checked before anything is sent.
pub(crate) fn check_database_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("it is empty".into());
    }
    if name.len() > 63 {
        return Err("it is longer than 63 bytes".into());
    }
    if let Some(c) = name.chars().find(|c| "/\\. \"$*<>:|?\0".contains(*c)) {
        return Err(format!("MongoDB database names cannot hold `{c}`"));
    }
    Ok(())
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
        ConnectionString::parse(url).map_err(|e| StoreError::InvalidConnectionString {
            shown: redact(url),
            why: e.to_string(),
        })?;
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
                let operations = Arc::clone(&self.operations);
                options.command_event_handler =
                    Some(EventHandler::callback(move |event: CommandEvent| {
                        if let CommandEvent::Started(_) = event {
                            operations.fetch_add(1, Ordering::Relaxed);
                        }
                    }));
                Client::with_options(options).map_err(|e| self.connect_error(e))
            })
            .await
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
            detail: cause.to_string(),
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
        move |cause| match *cause.kind {
            mongodb::error::ErrorKind::ServerSelection { .. }
            | mongodb::error::ErrorKind::DnsResolve { .. } => self.connect_error(cause),
            _ => StoreError::Database {
                context: context.clone(),
                detail: cause.to_string(),
                cause: Box::new(cause),
            },
        }
    }

    /// Runs `body` in a transaction, committed when it returns; transient errors (a write
    /// conflict with another transaction, an unknown commit result) run it again, as the
    /// driver's convenient transaction API documents.
    pub(super) async fn transaction<T>(
        &self,
        context: &str,
        body: impl for<'s> AsyncFnMut(&'s mut ClientSession) -> mongodb::error::Result<T>,
    ) -> Result<T> {
        let client = self.client().await?;
        let mut session = client.start_session().await.map_err(self.error(context))?;
        session
            .start_transaction()
            .and_run2(body)
            .await
            .map_err(self.error(context))
    }
}
