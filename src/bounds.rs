//! The range each duration setting accepts, checked before anything connects. Beyond it a value
//! is a typo or breaks an invariant: a lease shorter than a renewal round trip is taken over by
//! its own worker, and a duration past what the database's intervals hold fails every statement
//! that adds it to `now()`.

use std::time::Duration;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounds {
    pub min: Duration,
    pub max: Duration,
}

const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

const DAY: u64 = 86_400;

impl Bounds {
    pub const fn new(min: Duration, max: Duration) -> Self {
        Self { min, max }
    }

    /// From zero up to a day.
    pub const UP_TO_A_DAY: Bounds = Bounds::new(Duration::ZERO, secs(DAY));
    /// From a millisecond up to a day.
    pub const POSITIVE_UP_TO_A_DAY: Bounds = Bounds::new(Duration::from_millis(1), secs(DAY));
    /// From zero up to thirty days.
    pub const UP_TO_A_MONTH: Bounds = Bounds::new(Duration::ZERO, secs(30 * DAY));
    /// From zero up to a hundred years.
    pub const UP_TO_A_CENTURY: Bounds = Bounds::new(Duration::ZERO, secs(36_500 * DAY));

    /// `d` when it lies within the bounds; otherwise what is allowed.
    pub fn check(&self, d: Duration) -> Result<Duration, String> {
        if d < self.min || d > self.max {
            return Err(format!(
                "{} is out of range: give a duration from {} to {}",
                humantime::format_duration(d),
                humantime::format_duration(self.min),
                humantime::format_duration(self.max)
            ));
        }
        Ok(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_outside_the_bounds_name_the_range() {
        let b = Bounds::new(secs(1), secs(DAY));
        assert_eq!(b.check(secs(30)), Ok(secs(30)));
        assert_eq!(b.check(secs(1)), Ok(secs(1)));
        assert_eq!(
            b.check(Duration::from_nanos(1)).unwrap_err(),
            "1ns is out of range: give a duration from 1s to 1day"
        );
        assert!(b.check(secs(DAY + 1)).is_err());
    }
}
