//! The lane of a delivery: FNV-1a 32-bit over the UTF-8 bytes of its ordering key (or of its
//! event id when it has none), modulo 256. All deliveries of one key share a lane, and a lane
//! has one owner at a time, which is half of what keeps per-key order. The SQL function
//! `<prefix>lane_of` computes the same value for the 0.1 backfill; a test holds both to the same
//! vectors.

/// Number of lanes. Stored in each delivery, so it is not a setting.
pub const LANES: u32 = 256;

pub fn fnv1a_32(bytes: &[u8]) -> u32 {
    bytes.iter().fold(2_166_136_261u32, |h, &b| {
        (h ^ u32::from(b)).wrapping_mul(16_777_619)
    })
}

pub fn lane_of(key: Option<&str>, event_id: &str) -> i16 {
    let basis = key.unwrap_or(event_id);
    (fnv1a_32(basis.as_bytes()) % LANES) as i16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_vectors() {
        assert_eq!(fnv1a_32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a_32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a_32(b"foobar"), 0xbf9c_f968);
        assert_eq!(lane_of(None, ""), 197);
        assert_eq!(lane_of(Some("a"), "ignored"), 44);
    }
}
