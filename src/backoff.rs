//! Exponential back-off, the one shape every retry in relaybus takes: a handler's failed
//! attempts, failing claims, a lost wake-up connection, a failing completion statement.

use std::time::Duration;

use rand::Rng;

/// `base * 2^(n-1)` for the n-th retry, capped at `max`; with jitter, scaled by a random factor
/// in [0.5, 1) so that retries of many deliveries do not fire in lockstep.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
    pub jitter: bool,
}

impl Backoff {
    /// Without jitter: for a single retrying task.
    pub const fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            jitter: false,
        }
    }

    /// With jitter: for retries that many deliveries schedule at once.
    pub const fn jittered(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            jitter: true,
        }
    }

    /// The delay before the `n`-th retry (counting from 1).
    pub fn delay(&self, n: u32) -> Duration {
        let exp = n.clamp(1, 32) - 1;
        let raw = self
            .base
            .saturating_mul(2u32.saturating_pow(exp))
            .min(self.max);
        if self.jitter {
            raw.mul_f64(rand::thread_rng().gen_range(0.5..1.0))
        } else {
            raw
        }
    }

    /// A sequence of delays for one task that retries until it succeeds.
    pub fn retries(self) -> Retries {
        Retries {
            backoff: self,
            n: 0,
        }
    }
}

/// The delays of one retrying task: each `next` doubles, `reset` starts over after a success.
#[derive(Clone, Debug)]
pub struct Retries {
    backoff: Backoff,
    n: u32,
}

impl Retries {
    pub fn next_delay(&mut self) -> Duration {
        self.n = self.n.saturating_add(1);
        self.backoff.delay(self.n)
    }

    pub fn reset(&mut self) {
        self.n = 0;
    }

    /// Retries so far since the last reset.
    pub fn count(&self) -> u32 {
        self.n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap_and_jitter_stays_in_range() {
        let b = Backoff::new(Duration::from_millis(100), Duration::from_millis(500));
        let seen: Vec<u128> = (1..=5).map(|n| b.delay(n).as_millis()).collect();
        assert_eq!(seen, [100, 200, 400, 500, 500]);
        let mut r = b.retries();
        assert_eq!((r.next_delay(), r.next_delay()), (b.delay(1), b.delay(2)));
        r.reset();
        assert_eq!((r.next_delay(), r.count()), (b.delay(1), 1));
        let j = Backoff::jittered(Duration::from_secs(8), Duration::from_secs(3600));
        for _ in 0..100 {
            let d = j.delay(2);
            assert!(
                d >= Duration::from_secs(8) && d < Duration::from_secs(16),
                "{d:?}"
            );
        }
    }
}
