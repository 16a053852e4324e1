//! Names an operator types. A handler the store has never seen (no event names it, no delivery,
//! no row in the handlers table) is a typo until the operator says otherwise: a command that would act on it,
//! or list nothing for it, refuses (exit 2) naming the closest handlers it knows. An event type
//! is open-ended, so one never seen is only warned about. An id may be given as the part a
//! table shows (its end) or any unique start or end of it.

use anyhow::Result;

use super::usage;
use crate::store::prelude::*;
use crate::store::{EventName, Record};

/// Fails (a usage error) unless the store has seen the handler `name`.
pub(super) async fn known_handler<S: Store>(store: &S, name: &str) -> Result<()> {
    let mut known: Vec<String> = store
        .stats()
        .await?
        .into_iter()
        .map(|s| s.handler)
        .collect();
    known.extend(store.handler_rows().await?.into_iter().map(|c| c.handler));
    if known.iter().any(|k| k == name) || store.event_named(EventName::Handler(name)).await? {
        return Ok(());
    }
    known.sort();
    known.dedup();
    let hint = match closest(name, &known).as_slice() {
        [] if known.is_empty() => "; the store has no handler yet".to_owned(),
        [] => format!("; the store's handlers: {}", quoted(&known)),
        close => format!("; did you mean {}?", quoted(close)),
    };
    usage!(
        "no handler `{name}` in this store (no event names it, no delivery, no row in the handlers table){hint}"
    )
}

/// The whole id that `given` stands for: itself when a record has that id (the caller looks it
/// up), else the one id that begins or ends with it. Several are a usage error naming them.
pub(super) async fn whole_id<S: Store>(store: &S, record: Record, given: &str) -> Result<String> {
    let exact = match record {
        Record::Delivery => store.show_delivery(given).await?.is_some(),
        Record::Event => store.show_event(given).await?.is_some(),
    };
    if exact {
        return Ok(given.to_owned());
    }
    match store.ids_like(record, given, 4).await?.as_slice() {
        [] => Ok(given.to_owned()),
        [one] => Ok(one.clone()),
        several => {
            let more = if several.len() > 3 { ", ..." } else { "" };
            let shown: Vec<&String> = several.iter().take(3).collect();
            usage!(
                "the id `{given}` matches several {}s ({}{more}); give more of it",
                record.name(),
                quoted(&shown)
            )
        }
    }
}

/// Checks a listing's or a selection's filters: the handler must be known, and an unseen type
/// is warned about.
pub(super) async fn check_filters<S: Store>(
    store: &S,
    handler: Option<&str>,
    event_type: Option<&str>,
) -> Result<()> {
    if let Some(h) = handler {
        known_handler(store, h).await?;
    }
    if let Some(t) = event_type {
        warn_unknown_type(store, t).await?;
    }
    Ok(())
}

/// Says on stderr when no event has the type `name`: likely a typo, though types are
/// open-ended.
async fn warn_unknown_type<S: Store>(store: &S, name: &str) -> Result<()> {
    if !store.event_named(EventName::Type(name)).await? {
        eprintln!("warning: no event has the type `{name}`; nothing will match it");
    }
    Ok(())
}

/// The names within a small edit distance of `name` (a third of its length, at least one),
/// nearest first.
fn closest<'a>(name: &str, known: &'a [String]) -> Vec<&'a String> {
    let most = (name.chars().count() / 3).max(1);
    let mut near: Vec<(usize, &String)> = known
        .iter()
        .map(|k| (strsim::damerau_levenshtein(name, k), k))
        .filter(|(d, _)| *d <= most)
        .collect();
    near.sort();
    near.into_iter().map(|(_, k)| k).collect()
}

fn quoted(names: &[impl AsRef<str>]) -> String {
    names
        .iter()
        .map(|n| format!("`{}`", n.as_ref()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::closest;

    #[test]
    fn the_closest_names_are_within_a_third_of_the_length() {
        let known = ["billing", "bill", "crm", "shipping"].map(String::from);
        assert_eq!(closest("biling", &known), ["billing"]);
        assert_eq!(closest("bil", &known), ["bill"]);
        assert_eq!(closest("crn", &known), ["crm"]);
        assert!(closest("audit", &known).is_empty());
    }
}
