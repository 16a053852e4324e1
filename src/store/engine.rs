//! The store engines relaybus knows, and which one a connection string names.

use super::{redact, Result, StoreError};

/// The store engines relaybus knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    Postgres,
    Mongo,
}

impl Engine {
    /// The engine a connection string names; without one, PostgreSQL through the libpq
    /// variables.
    pub fn of(url: Option<&str>) -> Result<Engine> {
        match url {
            None => Ok(Engine::Postgres),
            Some(u) if u.starts_with("postgres://") || u.starts_with("postgresql://") => {
                Ok(Engine::Postgres)
            }
            Some(u) if u.starts_with("mongodb://") || u.starts_with("mongodb+srv://") => {
                Ok(Engine::Mongo)
            }
            // libpq's other form: `host=db dbname=app sslmode=require`.
            Some(u) if !u.contains("://") && u.contains('=') => Ok(Engine::Postgres),
            Some(u) => Err(StoreError::UnsupportedUrl(redact(u))),
        }
    }
}
