//! A handler's statement, run in the transaction that completes its delivery: the fenced delete
//! first, so a takeover of the same delivery waits for this transaction or makes it complete
//! nothing, then the statement. Both commit or neither does.

use std::time::Duration;

use tokio_postgres::types::{Json, ToSql, Type};

use tokio_postgres::Client;

use super::conn::{db, describe, session_unusable};
use super::dispatch::{token_arrays, tuple_ids};
use super::sql::Sql;
use super::PgStore;
use crate::store::{ClaimedDelivery, Result, SqlHandler, StatementOutcome, StoreError};

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

/// The fenced delete, then the statement, in one transaction: None when the lease was lost,
/// else the statement's verdict and the commit's. An error before the statement ran comes with
/// what was being done.
async fn run_in_transaction(
    client: &mut Client,
    complete: &Sql,
    d: &ClaimedDelivery,
    statement: &str,
    timeout: Duration,
) -> std::result::Result<
    Option<std::result::Result<(), tokio_postgres::Error>>,
    (&'static str, tokio_postgres::Error),
> {
    // Dropped before its commit (an error, a lost lease, a worker stopping), the transaction
    // rolls back.
    let tx = client
        .transaction()
        .await
        .map_err(|e| ("could not begin the handler's transaction", e))?;
    tx.batch_execute(&format!(
        "SET LOCAL statement_timeout = {}",
        timeout.as_millis().max(1)
    ))
    .await
    .map_err(|e| ("could not set the handler's timeout", e))?;
    let t = &d.token;
    let tokens = std::slice::from_ref(t);
    let (ids, lanes, epochs, claims) = token_arrays(tokens);
    let located = tuple_ids(tokens);
    let completed = tx
        .query_typed(
            &complete.text,
            &complete.typed(&[&ids, &lanes, &epochs, &claims, &located]),
        )
        .await
        .map_err(|e| ("could not complete the delivery", e))?;
    if completed.is_empty() {
        return Ok(None);
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
    Ok(Some(match tx.execute_typed(statement, &params).await {
        Ok(_) => tx.commit().await,
        Err(e) => Err(e),
    }))
}

impl SqlHandler for PgStore {
    async fn check_statement(&self, statement: &str) -> Result<()> {
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

    async fn complete_with_statement(
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
        let mut conn = self.pool.get().await?;
        let ran = run_in_transaction(&mut conn.client, complete, d, statement, timeout).await;
        if let Err((_, e)) | Ok(Some(Err(e))) = &ran {
            conn.note(e);
        }
        match ran {
            Err((context, e)) => Err(db(context)(e)),
            Ok(None) => Ok(StatementOutcome::LeaseLost),
            Ok(Some(Ok(()))) => Ok(StatementOutcome::Completed),
            // The database's verdict on the statement (a constraint, a timeout, a deadlock; at
            // commit, a deferred constraint) fails the attempt. No answer at all, or a session
            // that cannot run anything (read-only, shutting down), is an error the caller
            // retries: the statement was not to blame.
            Ok(Some(Err(e))) if e.as_db_error().is_some() && !session_unusable(&e) => {
                Ok(StatementOutcome::Failed(describe(&e)))
            }
            Ok(Some(Err(e))) => Err(db("could not run the handler's statement")(e)),
        }
    }
}
