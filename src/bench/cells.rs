//! The benchmark's cells, named after the seed's: publishers x batch x handlers x keys, dispatch
//! processes x configuration, and mixed load at a fixed offered rate.

use std::fmt;
use std::time::Duration;

use crate::dispatch::DispatchOptions;
use crate::store::StoreOptions;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Keys {
    /// No ordering key.
    None,
    /// 1,000 distinct keys.
    Distinct,
    /// 10 hot keys.
    Hot10,
    /// One key for everything.
    Hot1,
}

impl Keys {
    /// How many distinct keys the generator cycles through (none: unkeyed).
    pub fn modulus(self) -> Option<u64> {
        match self {
            Keys::None => None,
            Keys::Distinct => Some(1000),
            Keys::Hot10 => Some(10),
            Keys::Hot1 => Some(1),
        }
    }

    /// The key of the n-th event a generator makes.
    pub fn key(self, n: u64) -> Option<String> {
        self.modulus().map(|m| format!("k{}", n % m))
    }
}

/// A dispatcher configuration of the seed: `defaults`, `mid` or `tuned`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Config {
    Defaults,
    Mid,
    Tuned,
}

/// What a dispatcher configuration sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub concurrency: usize,
    pub batch_size: usize,
    pub pool_size: usize,
    pub poll_interval: Duration,
}

impl Config {
    pub fn settings(self) -> Settings {
        match self {
            Config::Defaults => Settings {
                concurrency: DispatchOptions::CONCURRENCY,
                batch_size: DispatchOptions::BATCH_SIZE,
                pool_size: StoreOptions::WORKER_POOL_SIZE,
                poll_interval: DispatchOptions::POLL_INTERVAL,
            },
            Config::Mid => Settings {
                concurrency: 50,
                batch_size: 200,
                pool_size: 20,
                poll_interval: Duration::from_secs(1),
            },
            Config::Tuned => Settings {
                concurrency: 200,
                batch_size: 200,
                pool_size: 40,
                poll_interval: Duration::from_millis(50),
            },
        }
    }

    /// Deliveries per second one dispatcher of this configuration takes at most on 2 cores
    /// (measured: 15,000, 37,000 and 42,500), so that a preloaded backlog outlasts the window
    /// without preloads becoming the longest part of the bench; a faster machine makes the
    /// bench preload more. The raw-SQL floor, faster still, is timed until its backlog of the
    /// same size runs out.
    pub fn ceiling(self) -> f64 {
        match self {
            Config::Defaults => 16_000.0,
            Config::Mid => 40_000.0,
            Config::Tuned => 50_000.0,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "scenario", rename_all = "snake_case")]
pub enum Cell {
    Publish {
        publishers: u32,
        batch: u32,
        handlers: u32,
        keys: Keys,
    },
    Dispatch {
        processes: u32,
        config: Config,
        handlers: u32,
        keys: Keys,
    },
    Mixed {
        rate: u32,
        config: Config,
    },
}

impl fmt::Display for Cell {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let suffix = |handlers: u32, keys: Keys| {
            let mut s = String::new();
            if handlers > 1 {
                s.push_str(&format!("-h{handlers}"));
            }
            s.push_str(match keys {
                Keys::None => "",
                Keys::Distinct => "-k1000",
                Keys::Hot10 => "-hot10",
                Keys::Hot1 => "-hot1",
            });
            s
        };
        match *self {
            Cell::Publish {
                publishers,
                batch,
                handlers,
                keys,
            } => {
                write!(f, "pub-p{publishers}-b{batch}{}", suffix(handlers, keys))
            }
            Cell::Dispatch {
                processes,
                config,
                handlers,
                keys,
            } => write!(
                f,
                "disp-{processes}i-{}{}",
                format!("{config:?}").to_lowercase(),
                suffix(handlers, keys)
            ),
            Cell::Mixed { rate, config } => {
                write!(f, "mixed-{rate}-{}", format!("{config:?}").to_lowercase())
            }
        }
    }
}

impl Keys {
    fn describe(self) -> &'static str {
        match self {
            Keys::None => "unkeyed",
            Keys::Distinct => "1,000 keys",
            Keys::Hot10 => "10 hot keys",
            Keys::Hot1 => "one key",
        }
    }
}

impl Config {
    fn describe(self) -> String {
        let s = self.settings();
        format!(
            "concurrency {}, batch {}, pool {}, poll {}",
            s.concurrency,
            s.batch_size,
            s.pool_size,
            humantime::format_duration(s.poll_interval)
        )
    }
}

/// `1 worker`, `4 workers`.
fn count(n: u32, what: &str) -> String {
    match n {
        1 => format!("1 {what}"),
        n => format!("{n} {what}s"),
    }
}

impl Cell {
    /// What the cell measures, in words, for `bench --list`.
    pub fn describe(&self) -> String {
        match *self {
            Cell::Publish {
                publishers,
                batch,
                handlers,
                keys,
            } => format!(
                "{}, {batch}/transaction, {}, {}",
                count(publishers, "publisher"),
                count(handlers, "handler"),
                keys.describe()
            ),
            Cell::Dispatch {
                processes,
                config,
                handlers,
                keys,
            } => format!(
                "drain: {}, {}, {}; {}",
                count(processes, "worker"),
                count(handlers, "handler"),
                keys.describe(),
                config.describe()
            ),
            Cell::Mixed { rate, config } => format!(
                "latency at {rate} events/s, 1 worker; {}",
                config.describe()
            ),
        }
    }

    pub fn scenario(&self) -> &'static str {
        match self {
            Cell::Publish { .. } => "publish",
            Cell::Dispatch { .. } => "dispatch",
            Cell::Mixed { .. } => "mixed",
        }
    }
}

/// The quick set: the seed's cells at one sample each.
pub fn presets() -> Vec<Cell> {
    let mut cells = vec![];
    for publishers in [1, 8, 32] {
        for batch in [1, 100] {
            cells.push(Cell::Publish {
                publishers,
                batch,
                handlers: 1,
                keys: Keys::None,
            });
        }
    }
    cells.push(Cell::Publish {
        publishers: 8,
        batch: 1,
        handlers: 5,
        keys: Keys::None,
    });
    cells.push(Cell::Publish {
        publishers: 8,
        batch: 100,
        handlers: 5,
        keys: Keys::None,
    });
    for keys in [Keys::Distinct, Keys::Hot10, Keys::Hot1] {
        cells.push(Cell::Publish {
            publishers: 8,
            batch: 1,
            handlers: 1,
            keys,
        });
    }
    for processes in [1, 4, 8] {
        for config in [Config::Defaults, Config::Mid, Config::Tuned] {
            cells.push(Cell::Dispatch {
                processes,
                config,
                handlers: 1,
                keys: Keys::None,
            });
        }
    }
    cells.push(Cell::Dispatch {
        processes: 1,
        config: Config::Tuned,
        handlers: 5,
        keys: Keys::None,
    });
    cells.push(Cell::Dispatch {
        processes: 1,
        config: Config::Tuned,
        handlers: 1,
        keys: Keys::Distinct,
    });
    cells.push(Cell::Dispatch {
        processes: 1,
        config: Config::Tuned,
        handlers: 1,
        keys: Keys::Hot10,
    });
    cells.push(Cell::Mixed {
        rate: 1000,
        config: Config::Defaults,
    });
    cells.push(Cell::Mixed {
        rate: 1000,
        config: Config::Tuned,
    });
    cells.push(Cell::Mixed {
        rate: 5000,
        config: Config::Tuned,
    });
    cells
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_readable() {
        let names: Vec<String> = presets().iter().map(|c| c.to_string()).collect();
        let mut unique = names.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), names.len());
        assert_eq!(names[0], "pub-p1-b1");
        assert!(names.contains(&"pub-p8-b100-h5".to_owned()));
        assert!(names.contains(&"disp-8i-tuned".to_owned()));
        assert!(names.contains(&"disp-1i-tuned-hot10".to_owned()));
        assert_eq!(names.last().unwrap(), "mixed-5000-tuned");
    }
}
