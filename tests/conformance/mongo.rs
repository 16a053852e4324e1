//! The conformance suite against MongoDB: each test in a database of its own.

use relaybus::store::{AnyStore, StoreOptions};

use crate::common::mongo::TestMongo;

pub(crate) struct MongoNamespace {
    pub(crate) store: AnyStore,
    /// Another store instance over the same database.
    pub(crate) other: AnyStore,
    // Dropped after the store: the database goes when the test ends, however it ends.
    _database: TestMongo,
}

fn open(test: &str) -> MongoNamespace {
    let database = TestMongo::new(test);
    MongoNamespace {
        store: database.store(StoreOptions::worker(4)),
        other: database.store(StoreOptions::worker(4)),
        _database: database,
    }
}

super::conformance!(open);
