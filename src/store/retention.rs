//! Retention, the same on every store: dead deliveries, then completed rows kept from 0.1, the
//! completion history, and last the events left without deliveries (so events freed by this
//! purge go too), each in bounded batches so that no statement holds its locks for long.

use super::{PurgeCounts, PurgeKind, PurgeOptions, Result, Store};

/// Runs a purge; `progress` sees the running totals after every batch.
pub async fn purge<S: Store>(
    store: &S,
    options: &PurgeOptions,
    progress: impl Fn(&PurgeCounts),
) -> Result<PurgeCounts> {
    let mut done = PurgeCounts::default();
    let steps = [
        (PurgeKind::Dead, options.dead_older_than),
        (PurgeKind::Completed, options.completed_older_than),
        (PurgeKind::History, options.completed_older_than),
        (PurgeKind::Events, options.completed_older_than),
    ];
    for (kind, age) in steps {
        let Some(age) = age else { continue };
        loop {
            let batch = store.purge_batch(kind, age, options.batch).await?;
            *done.of_mut(kind) += batch.deleted;
            progress(&done);
            if !batch.more {
                break;
            }
        }
    }
    Ok(done)
}
