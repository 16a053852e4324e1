//! Who a process is to the store: the machine it runs on, and its name as a worker.

use rand::Rng;

/// This machine's name, or "host" when it cannot be read.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "host".into())
}

/// The host and process of a name `worker_name` made; None for a name another client chose.
pub fn worker_host_and_pid(name: &str) -> Option<(&str, u32)> {
    let mut parts = name.rsplitn(3, ':');
    let (suffix, pid, host) = (parts.next()?, parts.next()?, parts.next()?);
    let hex = suffix.len() == 6 && suffix.bytes().all(|b| b.is_ascii_hexdigit());
    Some((host, pid.parse().ok()?)).filter(|_| hex && !host.is_empty())
}

/// A unique worker name: host, process and a random suffix.
pub fn worker_name() -> String {
    let host = hostname();
    format!(
        "{host}:{}:{:06x}",
        std::process::id(),
        rand::thread_rng().gen::<u32>() & 0xff_ffff
    )
}

#[cfg(test)]
mod tests {
    use super::{worker_host_and_pid, worker_name};

    #[test]
    fn a_default_worker_name_says_its_host_and_process() {
        let name = worker_name();
        assert_eq!(
            worker_host_and_pid(&name),
            Some((super::hostname().as_str(), std::process::id()))
        );
        assert_eq!(
            worker_host_and_pid("db-1:a:b:4021:00ff1a"),
            Some(("db-1:a:b", 4021))
        );
        for given in [
            "billing-worker",
            "host:12:xyz",
            "host:pid:00ff1a",
            ":12:00ff1a",
        ] {
            assert_eq!(worker_host_and_pid(given), None, "{given}");
        }
    }
}
