//! What operators and workers decide about a handler, kept in the store so that every worker of
//! it acts on the same: a pause, and the circuit breaker of a webhook endpoint. The rules are
//! written once, here, as changes of a `HandlerRow`; each engine only reads the rows and
//! applies a change atomically.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use crate::bounds::Bounds;

/// How a handler's circuit breaker behaves: configured per webhook handler (its TOML table, the
/// worker's flags the default), kept in the handler's row by the worker that started last, and
/// applied from there by every worker, so that all of them count failures against one limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct BreakerPolicy {
    /// Requests failing in a row that open the breaker.
    pub threshold: i32,
    /// The longest cool-down: each after a failed probe doubles, up to this.
    #[serde(with = "humantime_serde")]
    pub max_cooldown: Duration,
}

impl BreakerPolicy {
    pub const THRESHOLD: i32 = 10;
    pub const THRESHOLD_LIMIT: i32 = 10_000;
    /// The first cool-down of an opened breaker.
    pub const COOLDOWN: Duration = Duration::from_secs(30);
    pub const MAX_COOLDOWN: Duration = Duration::from_secs(600);
    /// From the first cool-down to a day.
    pub const MAX_COOLDOWN_BOUNDS: Bounds = Bounds::new(Self::COOLDOWN, Bounds::UP_TO_A_DAY.max);

    /// The settings as a store keeps them (the longest cool-down in milliseconds), each the
    /// default where the row has none.
    pub fn stored(threshold: Option<i32>, max_cooldown_ms: Option<i64>) -> Self {
        let ms = |ms: i64| Duration::from_millis(ms.try_into().unwrap_or_default());
        Self {
            threshold: threshold.unwrap_or(Self::THRESHOLD),
            max_cooldown: max_cooldown_ms.map_or(Self::MAX_COOLDOWN, ms),
        }
    }

    pub fn max_cooldown_ms(&self) -> i64 {
        self.max_cooldown.as_millis().try_into().unwrap_or(i64::MAX)
    }

    /// The cool-down after the breaker's `opened`th opening in a row.
    pub fn cooldown(&self, opened: i32) -> chrono::Duration {
        let doublings = opened.clamp(1, 16) as u32 - 1;
        let wait = Self::COOLDOWN
            .saturating_mul(1 << doublings)
            .min(self.max_cooldown);
        chrono::Duration::from_std(wait).expect("a day fits")
    }
}

impl Default for BreakerPolicy {
    fn default() -> Self {
        Self {
            threshold: Self::THRESHOLD,
            max_cooldown: Self::MAX_COOLDOWN,
        }
    }
}

/// One handler's row of the handlers table (a document on MongoDB). A handler without one has the default: running, breaker closed.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct HandlerRow {
    pub handler: String,
    pub paused_at: Option<DateTime<Utc>>,
    pub paused_by: Option<String>,
    pub pause_reason: Option<String>,
    /// Requests to the handler's endpoint that failed in a row.
    pub failures: i32,
    /// Times the breaker opened since the endpoint last answered; each cool-down doubles.
    pub opened: i32,
    /// The breaker is open until then; once past, the next request is its probe.
    pub open_until: Option<DateTime<Utc>>,
    /// The breaker's threshold and longest cool-down (the defaults in a row that has none).
    pub breaker_policy: BreakerPolicy,
}

/// Where a handler's breaker stands at some moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Breaker {
    Closed,
    /// Nothing is sent to the endpoint until the cool-down ends.
    Open,
    /// The cool-down ended: the next request is the probe.
    ProbeDue,
}

impl Breaker {
    pub fn name(self) -> &'static str {
        match self {
            Breaker::Closed => "closed",
            Breaker::Open => "open",
            Breaker::ProbeDue => "probe due",
        }
    }
}

/// What a handler's row lets workers do with it now: the one word every command shows for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HandlerState {
    Running,
    Paused,
    /// Its breaker is open: nothing is sent until the cool-down ends.
    BreakerOpen,
    /// The cool-down ended: the next request is the probe.
    ProbeDue,
}

impl HandlerState {
    pub fn name(self) -> &'static str {
        match self {
            HandlerState::Running => "running",
            HandlerState::Paused => "paused",
            HandlerState::BreakerOpen => "breaker-open",
            HandlerState::ProbeDue => "probe-due",
        }
    }
}

impl HandlerRow {
    pub fn new(handler: &str) -> Self {
        Self {
            handler: handler.to_owned(),
            ..Self::default()
        }
    }

    pub fn paused(&self) -> bool {
        self.paused_at.is_some()
    }

    pub fn breaker(&self, now: DateTime<Utc>) -> Breaker {
        match self.open_until {
            None => Breaker::Closed,
            Some(until) if until > now => Breaker::Open,
            Some(_) => Breaker::ProbeDue,
        }
    }

    /// A pause first: a paused handler's breaker does not matter until it is resumed.
    pub fn state(&self, now: DateTime<Utc>) -> HandlerState {
        match (self.paused(), self.breaker(now)) {
            (true, _) => HandlerState::Paused,
            (false, Breaker::Closed) => HandlerState::Running,
            (false, Breaker::Open) => HandlerState::BreakerOpen,
            (false, Breaker::ProbeDue) => HandlerState::ProbeDue,
        }
    }

    /// Whether a worker may claim the handler's deliveries: not paused, and its breaker not
    /// open (a due probe needs a delivery to send).
    pub fn claimable(&self, now: DateTime<Utc>) -> bool {
        !self.paused() && self.breaker(now) != Breaker::Open
    }

    /// Pauses the handler; a second pause keeps the first one's time and takes the new words.
    /// False when nothing changed.
    pub fn pause(&mut self, by: &str, reason: Option<&str>, now: DateTime<Utc>) -> bool {
        let before = self.clone();
        self.paused_at.get_or_insert(now);
        self.paused_by = Some(by.to_owned());
        self.pause_reason = reason.map(str::to_owned);
        *self != before
    }

    /// False when the handler was not paused.
    pub fn resume(&mut self) -> bool {
        let paused = self.paused();
        (self.paused_at, self.paused_by, self.pause_reason) = (None, None, None);
        paused
    }

    /// Takes a worker's configured breaker settings. False when they were the row's already.
    pub fn set_breaker_policy(&mut self, policy: BreakerPolicy) -> bool {
        std::mem::replace(&mut self.breaker_policy, policy) != policy
    }

    /// Counts a failed request; the breaker opens at the row's threshold of failures in a row,
    /// and opens again, for twice as long, when its probe fails. True when this failure opened
    /// it.
    pub fn failed(&mut self, probe: bool, now: DateTime<Utc>) -> bool {
        self.failures = self.failures.saturating_add(1);
        let policy = self.breaker_policy;
        let opens = probe || (self.open_until.is_none() && self.failures >= policy.threshold);
        if opens {
            self.opened = self.opened.saturating_add(1);
            self.open_until = Some(now + policy.cooldown(self.opened));
        }
        opens
    }

    /// A request that succeeded, or an operator, closes the breaker. False when it was closed
    /// with no failures.
    pub fn close_breaker(&mut self) -> bool {
        let before = (self.failures, self.opened, self.open_until);
        (self.failures, self.opened, self.open_until) = (0, 0, None);
        before != (0, 0, None)
    }

    /// Takes the probe of a breaker whose cool-down ended: the others wait another cool-down
    /// for its answer (and probe again after it, should the prober die). False for all but one.
    pub fn take_probe(&mut self, now: DateTime<Utc>) -> bool {
        if self.breaker(now) != Breaker::ProbeDue {
            return false;
        }
        self.open_until = Some(now + self.breaker_policy.cooldown(self.opened));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_breaker_opens_at_the_threshold_and_each_failed_probe_doubles_the_cool_down() {
        let now = Utc::now();
        let policy = BreakerPolicy::default();
        let mut c = HandlerRow::new("h");
        for _ in 0..9 {
            assert!(!c.failed(false, now));
        }
        assert_eq!(c.breaker(now), Breaker::Closed);
        assert!(c.failed(false, now));
        assert_eq!(c.open_until, Some(now + chrono::Duration::seconds(30)));
        // A request sent before the breaker opened fails later: counted, the cool-down kept.
        assert!(!c.failed(false, now));
        assert_eq!((c.failures, c.opened), (11, 1));
        let later = now + chrono::Duration::seconds(30);
        assert_eq!(c.breaker(later), Breaker::ProbeDue);
        assert!(c.take_probe(later));
        assert!(!c.take_probe(later), "one probe at a time");
        assert!(c.failed(true, later));
        assert_eq!(c.open_until, Some(later + chrono::Duration::seconds(60)));
        let waits = |policy: BreakerPolicy| -> Vec<i64> {
            (1..=7).map(|n| policy.cooldown(n).num_seconds()).collect()
        };
        assert_eq!(waits(policy), [30, 60, 120, 240, 480, 600, 600]);
        let capped = BreakerPolicy {
            max_cooldown: Duration::from_secs(90),
            ..policy
        };
        assert_eq!(waits(capped), [30, 60, 90, 90, 90, 90, 90]);
        assert!(c.close_breaker());
        assert_eq!((c.failures, c.opened, c.open_until), (0, 0, None));
        assert!(!c.close_breaker());
        // The row's settings decide, whichever worker counts the failure.
        assert!(c.set_breaker_policy(capped_at_three()));
        assert!(!c.set_breaker_policy(capped_at_three()));
        assert!(!c.failed(false, now) && !c.failed(false, now));
        assert!(c.failed(false, now));
        assert_eq!(c.open_until, Some(now + chrono::Duration::seconds(30)));
        let cooldowns = [(); 3].map(|()| {
            let due = c.open_until.unwrap();
            assert!(c.take_probe(due));
            assert!(c.failed(true, due));
            (c.open_until.unwrap() - due).num_seconds()
        });
        assert_eq!(cooldowns, [60, 90, 90]);
    }

    fn capped_at_three() -> BreakerPolicy {
        BreakerPolicy {
            threshold: 3,
            max_cooldown: Duration::from_secs(90),
        }
    }

    #[test]
    fn a_second_pause_keeps_the_first_time_and_takes_the_new_reason() {
        let (first, second) = (Utc::now(), Utc::now() + chrono::Duration::seconds(5));
        let mut c = HandlerRow::new("h");
        assert!(c.pause("ana", Some("deploy"), first));
        assert!(!c.claimable(first));
        assert!(!c.pause("ana", Some("deploy"), second));
        assert!(c.pause("bo", None, second));
        assert_eq!(
            (
                c.paused_at,
                c.paused_by.as_deref(),
                c.pause_reason.as_deref()
            ),
            (Some(first), Some("bo"), None)
        );
        assert!(c.resume());
        assert!(!c.resume());
        assert!(c.claimable(second));
    }
}
