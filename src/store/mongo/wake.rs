//! Wake-ups from a change stream on the deliveries collection: every insert is new work. The
//! server sends them as it commits, so no publisher holds anything back. A stream that fails
//! is opened again with back-off; polling stays the correctness path.

use std::time::Duration;

use futures_util::StreamExt;
use mongodb::bson::doc;

use super::{MongoStore, DELIVERIES};
use crate::backoff::Backoff;
use crate::store::{Result, Wake, WakeUp, WakeUps};

/// How long after a commit its wake-up may arrive.
pub(super) const DELIVERY_DELAY: Duration = Duration::from_millis(10);

const REOPEN: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(30));

impl MongoStore {
    pub(super) fn watch(&self) -> WakeUps {
        let (tx, rx) = WakeUps::channel();
        let conn = std::sync::Arc::clone(&self.conn);
        let name = self.name(DELIVERIES);
        let task = tokio::spawn(async move {
            let mut retries = REOPEN.retries();
            let failed = conn.error("the change stream of deliveries failed");
            loop {
                let stream = match conn.collection(&name).await {
                    Ok(collection) => collection
                        .watch()
                        .pipeline([
                            doc! { "$match": { "operationType": "insert" } },
                            // The driver reads `operationType`; `_id` is the resume token.
                            doc! { "$project": { "operationType": 1 } },
                        ])
                        .await
                        .map_err(&failed),
                    Err(e) => Err(e),
                };
                let error = match stream {
                    Err(e) => e.to_string(),
                    Ok(mut stream) => {
                        retries.reset();
                        // Whatever was published while not watching is due now.
                        let _ = tx.try_send(WakeUp::Signal);
                        loop {
                            match stream.next().await {
                                Some(Ok(_)) => {
                                    let _ = tx.try_send(WakeUp::Signal);
                                }
                                Some(Err(e)) => break failed(e).to_string(),
                                None => break "the server ended the change stream".into(),
                            }
                        }
                    }
                };
                let retry_in = retries.next_delay();
                if tx.send(WakeUp::Lost { error, retry_in }).await.is_err() {
                    return;
                }
                tokio::time::sleep(retry_in).await;
            }
        });
        WakeUps::new(rx, task)
    }
}

impl Wake for MongoStore {
    /// Workers learn of new deliveries from a change stream: nothing is held back.
    async fn flush_wake_ups(&self) -> Result<()> {
        Ok(())
    }

    fn wake_ups(&self) -> Option<WakeUps> {
        Some(self.watch())
    }

    fn wake_up_delay(&self) -> Duration {
        DELIVERY_DELAY
    }
}
