//! Installing and converting a MongoDB store: what is installed, `setup`, the 0.1 conversion and
//! its plan, and the same as a `mongosh` script for teams whose migrations run elsewhere.
//!
//! MongoDB has no transactional DDL, so the conversion runs step by step in bounded batches and
//! every step picks up what is left: it can be run again after a crash at any point, and the
//! version document, written last, says when it is done. A lease on a lock document queues
//! setups and upgrades of one store behind each other. `docs/design/mongodb.md` records the 0.1
//! layout this converts from.

mod convert;
mod detect;
mod expand;
mod indexes;
mod install;
mod lock;
mod mongosh;

use super::MongoStore;
use std::time::Duration;

use crate::store::{
    ContractPlan, Conversion, Expansion, Locks, Result, Schema, SchemaStatus, SetupOutcome,
    UpgradePlan, UpgradeProgress,
};

pub(super) use detect::VERSION_ID;
pub(super) use expand::Adoption;
pub(super) use indexes::{
    drift, index_name, indexes, matches, retired, same_keys, IndexSpec, COLLECTIONS,
};
pub(crate) use mongosh::script;
pub(super) use mongosh::{collection_js, js};

impl Schema for MongoStore {
    async fn schema_status(&self) -> Result<SchemaStatus> {
        self.detect_thoroughly().await
    }

    async fn version_status(&self) -> Result<SchemaStatus> {
        self.detect().await
    }

    async fn setup(&self, force: bool) -> Result<SetupOutcome> {
        // What would be refused is refused before the lock is taken, so nothing is written.
        self.refuse(force).await?;
        let lock = self.lock().await?;
        let result = async {
            let before = self.detect_thoroughly().await?;
            match &before {
                s if s.is_current() => {}
                SchemaStatus::Newer { .. } => {
                    return Err(before
                        .error(&self.ns)
                        .expect("a newer schema is not current"))
                }
                SchemaStatus::V01 => {
                    self.refuse(force).await?;
                    self.convert(&|_| {}).await?;
                }
                _ => {
                    self.refuse(force).await?;
                    self.install().await?;
                }
            }
            Ok(SetupOutcome {
                before,
                after: self.detect_thoroughly().await?,
            })
        }
        .await;
        lock.release().await;
        result
    }

    async fn contract_plan(&self) -> Result<Option<ContractPlan>> {
        self.plan_contract().await
    }

    async fn contract(&self, quiet_for: Duration, force: bool) -> Result<Option<Expansion>> {
        let lock = self.lock().await?;
        let result = self.contract_expansion(quiet_for, force).await;
        lock.release().await;
        result
    }

    /// Every MongoDB conversion is online: batches, no lock on the collections.
    async fn upgrade_plan(&self, _: Conversion) -> Result<UpgradePlan> {
        let found = self.detect_thoroughly().await?;
        // A conversion stopped in its install step is finished by the install.
        let stopped = found == SchemaStatus::Incomplete && self.expansion().await?.is_some();
        if found != SchemaStatus::V01 && !stopped {
            return Ok(UpgradePlan::nothing_due(found));
        }
        Ok(UpgradePlan {
            found,
            steps: self.steps().await?,
            counts: self.counts().await?,
            live_leases: self.live_leases().await?,
            locks: Locks {
                what: "none on the collections: the conversion runs in batches of 1,000 \
                       documents under relaybus's setup lock; stop 0.1 workers first"
                    .into(),
                expected_seconds: None,
            },
            foreign_indexes: vec![],
        })
    }

    async fn upgrade(
        &self,
        _: Conversion,
        force: bool,
        progress: &(dyn Fn(UpgradeProgress) + Sync),
    ) -> Result<SetupOutcome> {
        if self.detect_thoroughly().await? == SchemaStatus::V01 {
            self.refuse(force).await?;
        }
        let lock = self.lock().await?;
        let result = async {
            let before = self.detect_thoroughly().await?;
            match before {
                // A conversion stopped in its install step: the install finishes it.
                SchemaStatus::Incomplete if self.expansion().await?.is_some() => {
                    self.install().await?
                }
                SchemaStatus::V01 => {
                    self.refuse(force).await?;
                    // Marked first, so that a rerun after a crash finds it expanded too.
                    self.expand().await?;
                    self.convert(progress).await?;
                }
                _ => {
                    return Ok(SetupOutcome {
                        after: before.clone(),
                        before,
                    })
                }
            }
            Ok(SetupOutcome {
                before,
                after: self.detect_thoroughly().await?,
            })
        }
        .await;
        lock.release().await;
        result
    }
}
