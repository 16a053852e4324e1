//! The PostgreSQL schema: the scripts (`render`), installing and converting a store with them
//! (`migrate`), and explaining a schema change that waited too long for a lock (`locks`).
//! `schema-sql` prints exactly what `setup` and `upgrade` run, so a DBA applying the script by
//! hand gets the same store.

mod locks;
mod migrate;
mod online;
mod render;

pub(super) use locks::blocking_session;
pub(crate) use render::script;
pub(super) use render::{index_statement, install_script};
