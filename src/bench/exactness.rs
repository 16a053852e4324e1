//! The exactness check of a sample: what the workers handled (kept in files outside the
//! database, so checking adds no database writes) against what was published and what is left.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

use serde::Serialize;

use super::cells::Keys;
use super::Error;

#[derive(Clone, Debug, Serialize)]
pub struct Exactness {
    pub valid: bool,
    pub lost: u64,
    pub duplicates: u64,
    pub duplicates_after_lease_loss: u64,
    pub order_violations: u64,
    pub dead: i64,
    /// A dispatch backlog ran out inside the window, so the window measured an emptying store.
    pub ran_out: bool,
    pub problems: Vec<String>,
}

impl Exactness {
    pub(super) fn new(dead: i64, ran_out: bool) -> Self {
        Self {
            valid: true,
            lost: 0,
            duplicates: 0,
            duplicates_after_lease_loss: 0,
            order_violations: 0,
            dead,
            ran_out,
            problems: vec![],
        }
    }

    /// Marks the sample invalid, with why.
    pub(super) fn refuse(&mut self, problem: &str) {
        self.problems.push(problem.to_owned());
        self.valid = false;
    }

    /// A publish sample: exactly one delivery per published event and handler.
    pub(super) fn of_publish(deliveries: u64, published: u64, handlers: u32) -> Self {
        let expected = published * u64::from(handlers);
        let mut e = Self::new(0, false);
        e.lost = expected.saturating_sub(deliveries);
        e.duplicates = deliveries.saturating_sub(expected);
        if deliveries != expected {
            e.problems.push(format!(
                "{deliveries} deliveries for {published} events x {handlers} handlers"
            ));
        }
        e.valid = e.problems.is_empty();
        e
    }
}

/// One published delivery: (event id, handler, the event's number in its generator).
pub(super) type Expected = (String, String, u64);

/// What a dispatch or mixed sample must show: every (event, handler) published was handled once
/// or is still pending, none twice unless a lease was lost, nothing dead, and per key the
/// handled deliveries ran in order and precede every pending one. `backlog`: the sample drained
/// a preloaded backlog, which must not have run out.
pub(super) fn check(
    files: &[PathBuf],
    expected: &[Expected],
    pending: &HashSet<(String, String)>,
    dead: i64,
    keys: Keys,
    backlog: bool,
) -> Result<Exactness, Error> {
    let mut handled: HashMap<(String, String), Vec<(i32, u64)>> = HashMap::new();
    for f in files {
        for line in std::fs::read_to_string(f)?.lines() {
            let p: Vec<&str> = line.split('\t').collect();
            handled
                .entry((p[0].to_owned(), p[1].to_owned()))
                .or_default()
                .push((p[2].parse()?, p[3].parse()?));
        }
    }
    let mut e = Exactness::new(dead, backlog && pending.is_empty());
    // Per (handler, key): (run time, number) of the handled ones, and the first pending one.
    type KeyRuns = (Vec<(u64, u64)>, u64);
    let mut by_key: HashMap<(String, String), KeyRuns> = HashMap::new();
    for (event, handler, n) in expected {
        let k = (event.clone(), handler.clone());
        let runs = handled.get(&k);
        match runs.map(|r| r.len()).unwrap_or(0) {
            0 if !pending.contains(&k) => e.lost += 1,
            0 | 1 => {}
            _ if runs.unwrap().iter().any(|(attempt, _)| *attempt > 1) => {
                e.duplicates_after_lease_loss += 1
            }
            _ => e.duplicates += 1,
        }
        if let Some(key) = keys.key(*n) {
            let entry = by_key
                .entry((handler.clone(), key))
                .or_insert((vec![], u64::MAX));
            match runs.and_then(|r| r.first()) {
                Some((_, t)) if !pending.contains(&k) => entry.0.push((*t, *n)),
                _ => entry.1 = entry.1.min(*n),
            }
        }
    }
    for (runs, first_pending) in by_key.values_mut() {
        runs.sort_unstable();
        let in_order = runs.windows(2).all(|w| w[0].1 < w[1].1);
        let before_pending = runs.iter().all(|(_, n)| n < first_pending);
        if !(in_order && before_pending) {
            e.order_violations += 1;
        }
    }
    if e.lost > 0 {
        e.problems.push(format!("{} lost", e.lost));
    }
    if e.duplicates > 0 {
        e.problems.push(format!(
            "{} handled twice without a lost lease",
            e.duplicates
        ));
    }
    if e.order_violations > 0 {
        e.problems
            .push(format!("{} keys out of order", e.order_violations));
    }
    if e.dead > 0 {
        e.problems.push(format!("{} dead", e.dead));
    }
    if e.ran_out {
        e.problems
            .push("the backlog ran out inside the window".into());
    }
    e.valid = e.problems.is_empty();
    Ok(e)
}
