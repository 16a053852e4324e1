//! The PostgreSQL store: connections, the statements of `sql/postgres/` rendered for one
//! namespace, schema management, the delivery path, wake-ups and the operator's queries.
//! `docs/design/delivery-path.md` says why the delivery path's statements are shaped as they
//! are.

mod admin;
mod bench;
mod conn;
mod conninfo;
mod dispatch;
mod doctor;
mod handlers;
mod publish;
mod schema;
mod sql;
mod statement;
#[cfg(test)]
mod testing;
mod wake;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use conn::{ConnectOptions, Pool};
use sql::Statements;
use wake::Notifier;

pub(crate) use schema::script;

use crate::store::*;

pub(crate) struct PgStore {
    ns: Namespace,
    pool: Arc<Pool>,
    sql: Arc<Statements>,
    notifier: Arc<Notifier>,
    lock_timeout: Duration,
    /// Set when a batch held an event published before, cleared by a batch that held none:
    /// while set, batches skip `publish_new.sql`, whose failure on a republish the server logs.
    republishing: AtomicBool,
    /// This store instance (`StoreOptions::instance`), recorded after the owner name on the
    /// lanes it holds.
    holder: String,
}

/// Between the owner name and the store instance in a lane's `lease_owner`.
const HOLDER: &str = " #";

impl PgStore {
    /// The store at `url` (None: the libpq variables). Connections open on first use.
    pub(crate) fn open(url: Option<&str>, ns: Namespace, options: StoreOptions) -> Result<Self> {
        let pool = Arc::new(Pool::new(ConnectOptions::resolve(url)?, &options));
        let sql = Arc::new(Statements::render(&ns));
        Ok(Self {
            notifier: Notifier::new(
                Arc::clone(&pool),
                sql.notify.clone(),
                wake::channel(&ns),
                options.notify,
            ),
            lock_timeout: options.lock_timeout,
            republishing: AtomicBool::new(false),
            holder: options.instance.clone(),
            sql,
            ns,
            pool,
        })
    }

    /// What the lanes this instance holds record as their owner.
    fn lease_owner(&self, owner: &str) -> String {
        format!("{owner}{HOLDER}{}", self.holder)
    }
}

/// The owner name of a lane's `lease_owner`, without the store instance.
fn owner_name(lease_owner: Option<String>) -> Option<String> {
    lease_owner.map(|o| match o.rsplit_once(HOLDER) {
        Some((name, _)) => name.to_owned(),
        None => o,
    })
}

impl Store for PgStore {
    fn namespace(&self) -> &Namespace {
        &self.ns
    }

    fn client_counts(&self) -> ClientCounts {
        self.pool.counts()
    }
}
