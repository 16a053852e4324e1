//! The conformance suite against PostgreSQL: each test in a schema of its own.

use relaybus::store::{AnyStore, StoreOptions};

use crate::common::{database_url, TestSchema};

pub(crate) struct PgNamespace {
    pub(crate) store: AnyStore,
    /// Another store instance over the same schema.
    pub(crate) other: AnyStore,
    // Dropped after the store: the schema goes when the test ends, however it ends.
    _schema: TestSchema,
}

fn open(test: &str) -> PgNamespace {
    let schema = TestSchema::new(test);
    let open = || {
        relaybus::store::open(
            Some(&database_url()),
            schema.namespace(),
            StoreOptions::worker(4),
        )
        .unwrap()
    };
    PgNamespace {
        store: open(),
        other: open(),
        _schema: schema,
    }
}

super::conformance!(open);
