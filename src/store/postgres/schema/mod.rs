//! The PostgreSQL schema: the scripts (`render`), installing and converting a store with them
//! (`migrate`, `online`, both comparing the indexes with 0.2's through `drift`), ending the
//! expansion an online conversion leaves (`contract`), and explaining a schema change that
//! waited too long for a lock (`locks`).
//! `schema-sql` prints exactly what `setup` and `upgrade` run, so a DBA applying the script by
//! hand gets the same store.

mod contract;
mod drift;
mod locks;
mod migrate;
mod online;
mod render;

pub(super) use locks::blocking_session;
pub(crate) use render::script;
pub(super) use render::{index_statement, install_script};
