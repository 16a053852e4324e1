//! The PostgreSQL schema: the scripts (`render`), installing and converting a store with them
//! (`migrate`), and explaining a schema change that waited too long for a lock (`locks`).
//! `schema-sql` prints exactly what `setup` and `upgrade` run, so a DBA applying the script by
//! hand gets the same store.

mod locks;
mod migrate;
mod render;

pub(super) use locks::blocking_session;
pub(super) use render::install_script;
pub(crate) use render::script;
