//! A handler's statement, run in the transaction that completes its delivery: the fenced delete
//! first, so a takeover of the same delivery waits for this transaction or makes it complete
//! nothing, then the statement. Both commit or neither does.

use std::time::Duration;

use tokio_postgres::types::{Json, ToSql, Type};

use super::conn::{db, describe};
use super::dispatch::{token_arrays, tuple_ids};
use super::PgStore;
use crate::store::{ClaimedDelivery, Result, StatementOutcome, StoreError};

/// The envelope's fields, in the order a statement's parameters name them.
const PARAMS: [Type; 7] = [
    Type::TEXT,  // $1 event id
    Type::JSONB, // $2 payload
    Type::TEXT,  // $3 key
    Type::TEXT,  // $4 type
    Type::JSONB, // $5 headers
    Type::TEXT,  // $6 delivery id
    Type::INT4,  // $7 attempt
];

impl PgStore {
    pub(super) async fn check_statement_impl(&self, statement: &str) -> Result<()> {
        let conn = self.pool.get().await?;
        conn.client
            .prepare_typed(statement, &PARAMS)
            .await
            .map(drop)
            .map_err(|e| match e.as_db_error() {
                Some(_) => StoreError::InvalidStatement {
                    detail: describe(&e),
                },
                None => db("could not check the statement")(e),
            })
    }

    pub(super) async fn complete_with_statement_impl(
        &self,
        d: &ClaimedDelivery,
        statement: &str,
        timeout: Duration,
        history: bool,
    ) -> Result<StatementOutcome> {
        let complete = if history {
            &self.sql.complete_with_history
        } else {
            &self.sql.complete
        };
        let t = &d.token;
        let mut conn = self.pool.get().await?;
        // Dropped before its commit (an error, a lost lease, a worker stopping), the transaction
        // rolls back.
        let tx = conn
            .client
            .transaction()
            .await
            .map_err(db("could not begin the handler's transaction"))?;
        tx.batch_execute(&format!(
            "SET LOCAL statement_timeout = {}",
            timeout.as_millis().max(1)
        ))
        .await
        .map_err(db("could not set the handler's timeout"))?;
        let tokens = std::slice::from_ref(t);
        let (ids, lanes, epochs, claims) = token_arrays(tokens);
        let located = tuple_ids(tokens);
        let completed = tx
            .query_typed(
                &complete.text,
                &complete.typed(&[&ids, &lanes, &epochs, &claims, &located]),
            )
            .await
            .map_err(db("could not complete the delivery"))?;
        if completed.is_empty() {
            return Ok(StatementOutcome::LeaseLost);
        }
        let attempt = d.attempts + 1;
        let values: [&(dyn ToSql + Sync); 7] = [
            &d.event_id,
            &Json(&d.payload),
            &d.key,
            &d.event_type,
            &Json(&d.headers),
            &t.delivery_id,
            &attempt,
        ];
        let params: Vec<_> = values.into_iter().zip(PARAMS).collect();
        // The database's verdict on the statement (a constraint, a timeout, a deadlock; at
        // commit, a deferred constraint) fails the attempt; no answer at all is an error the
        // caller retries.
        let verdict = match tx.execute_typed(statement, &params).await {
            Ok(_) => tx.commit().await,
            Err(e) => Err(e),
        };
        match verdict {
            Ok(()) => Ok(StatementOutcome::Completed),
            Err(e) if e.as_db_error().is_some() => Ok(StatementOutcome::Failed(describe(&e))),
            Err(e) => Err(db("could not run the handler's statement")(e)),
        }
    }
}
