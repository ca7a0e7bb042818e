//! The daemon's only clock and randomness, and the parsing and writing of times (RFC 3339 or
//! unix ms). Durations (`5d`, `30s`) are `crate::duration`'s.
//!
//! The clock is the host's plus an offset: 0 on SQLite; on a shared PostgreSQL ledger the
//! offset of the database server's clock from this host's, measured at start-up and every
//! second (`ledger::postgres::clock`), so that every daemon sharing the ledger writes and compares
//! leases, due times, limiter stamps and tokens on one clock, the server's, whatever its own
//! host's says.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// What [`now_ms`] adds to the host's clock (see the module's header).
static OFFSET_MS: AtomicI64 = AtomicI64::new(0);

/// Unix milliseconds now, on the ledger's clock: the host's plus [`offset_ms`].
pub fn now_ms() -> i64 {
    host_ms().saturating_add(OFFSET_MS.load(Ordering::Relaxed))
}

/// Unix milliseconds now by this host's own clock (only to measure the offset).
pub fn host_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// What [`now_ms`] adds to the host's clock now.
pub fn offset_ms() -> i64 {
    OFFSET_MS.load(Ordering::Relaxed)
}

/// From now on [`now_ms`] is the host's clock plus `ms`.
pub fn set_offset_ms(ms: i64) {
    OFFSET_MS.store(ms, Ordering::Relaxed);
}

/// A host clock further than this from the ledger server's is warned about.
pub const CLOCK_WARN_MS: i64 = 1_000;

/// How far apart two clocks may be and still be said to agree when one of them is read from an
/// HTTP `Date` header (whole seconds, read at some point of a round trip).
pub const DATE_AGREE_MS: i64 = 2_000;

/// The last HTTP answers' `Date` less this host's clock when each arrived (ms), newest last:
/// a third clock, the one receivers verify signatures with, that tells which of the host's and
/// the PostgreSQL server's is off. Only a warning's wording depends on it, never a time the
/// daemon uses (a subscriber chooses its own `Date`).
static PEER_OFFSETS: std::sync::Mutex<Vec<i64>> = std::sync::Mutex::new(Vec::new());

/// How many of the last answers' `Date`s [`peer_offset_ms`] takes the median of.
const PEER_SAMPLES: usize = 15;

/// Note an HTTP answer's `Date` (`peer_ms`) read when this host's clock said `host_ms`.
pub fn note_peer_date(peer_ms: i64, host_ms: i64) {
    // An HTTP date has whole seconds: its clock read anywhere in [peer_ms, peer_ms + 1000).
    let offset = peer_ms + 500 - host_ms;
    let mut v = PEER_OFFSETS.lock().unwrap_or_else(|e| e.into_inner());
    if v.len() == PEER_SAMPLES {
        v.remove(0);
    }
    v.push(offset);
}

/// The median of the last HTTP answers' `Date` less this host's clock, once any was seen.
pub fn peer_offset_ms() -> Option<i64> {
    let mut v = PEER_OFFSETS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

/// Which clock is off, from the PostgreSQL server's offset from this host's and the HTTP
/// peers' (their `Date`), both in ms (pure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClockVerdict {
    /// The host's and the server's agree (within [`CLOCK_WARN_MS`]).
    Agree,
    /// The host's agrees with its HTTP peers'; the server's is off.
    ServerOff,
    /// The server's agrees with the HTTP peers'; the host's is off.
    HostOff,
    /// They disagree and no peer's clock tells which is off (none heard yet, or it agrees with
    /// neither).
    Unknown,
}

impl ClockVerdict {
    pub fn of(server_ms: i64, peers_ms: Option<i64>) -> ClockVerdict {
        if server_ms.abs() <= CLOCK_WARN_MS {
            return ClockVerdict::Agree;
        }
        match peers_ms {
            Some(p) if p.abs() <= DATE_AGREE_MS => ClockVerdict::ServerOff,
            Some(p) if (p - server_ms).abs() <= DATE_AGREE_MS => ClockVerdict::HostOff,
            _ => ClockVerdict::Unknown,
        }
    }

    /// The warning for a server `server_ms` off this host's, or `None` when they agree.
    pub fn warning(self, server_ms: i64) -> Option<String> {
        let secs = server_ms.abs() as f64 / 1000.0;
        let (server_is, host_is) = if server_ms > 0 {
            ("ahead of", "behind")
        } else {
            ("behind", "ahead of")
        };
        match self {
            ClockVerdict::Agree => None,
            ClockVerdict::ServerOff => Some(format!(
                "the PostgreSQL server's clock is {secs:.1} s {server_is} this host's, which \
                 agrees with the HTTP servers it calls (their Date): set the server's clock \
                 right (NTP); leases keep the server's time, webhooks are signed with the host's"
            )),
            ClockVerdict::HostOff => Some(format!(
                "this host's clock is {secs:.1} s {host_is} the PostgreSQL server's, which agrees \
                 with the HTTP servers it calls (their Date): set the host's clock right (NTP); \
                 webhooks are signed with the host's clock and receivers may refuse them"
            )),
            ClockVerdict::Unknown => Some(format!(
                "this host's clock and the PostgreSQL server's are {secs:.1} s apart (the \
                 server's is {server_is} the host's) and no HTTP server's Date tells which is \
                 wrong: set both right (NTP); leases keep the server's time, webhooks are \
                 signed with the host's"
            )),
        }
    }
}

/// One reading of another clock (the database server's), taken between `sent_ms` and
/// `received_ms` by this host's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSample {
    pub sent_ms: i64,
    pub theirs_ms: i64,
    pub received_ms: i64,
}

impl ClockSample {
    /// Their clock less ours, as NTP reckons it: their reading was taken, on ours, halfway
    /// through the round trip. It is right within half the round trip ([`ClockSample::error_ms`]).
    pub fn offset_ms(&self) -> i64 {
        let mid = self.sent_ms + (self.received_ms - self.sent_ms) / 2;
        self.theirs_ms - mid
    }

    /// How far [`ClockSample::offset_ms`] may be off: half the round trip (rounded up).
    pub fn error_ms(&self) -> i64 {
        ((self.received_ms - self.sent_ms).max(0) + 1) / 2
    }
}

/// The offset to use after `sample`, given the one in use (`None` before any): the sample's
/// when it differs from the one in use by more than the sample's own error and a little
/// (so that the clock does not wander by a millisecond back and forth every second), the
/// one in use otherwise. A sample whose round trip went backwards on our clock (the host's
/// clock was set meanwhile) is no measurement.
pub fn adopt_offset(current: Option<i64>, sample: &ClockSample) -> Option<i64> {
    /// Changes smaller than this (beyond the sample's error) are noise.
    const STEADY_MS: i64 = 10;
    if sample.received_ms < sample.sent_ms {
        return current;
    }
    let measured = sample.offset_ms();
    match current {
        Some(c) if (measured - c).abs() <= sample.error_ms() + STEADY_MS => Some(c),
        _ => Some(measured),
    }
}

/// A uniform draw in [0, 1] from the OS's randomness (0.5 if it is unavailable).
pub fn jitter() -> f64 {
    match getrandom::u64() {
        Ok(x) => (x >> 11) as f64 / (1u64 << 53) as f64,
        Err(_) => 0.5,
    }
}

/// `n` random bytes from the OS.
pub fn random_bytes<const N: usize>() -> Result<[u8; N], getrandom::Error> {
    let mut buf = [0u8; N];
    getrandom::fill(&mut buf)?;
    Ok(buf)
}

/// Parse a time given in a query: unix milliseconds, or RFC 3339 in UTC or with an offset
/// (`2026-11-30T04:45:53Z`, `2026-11-30T04:45:53.250+01:00`).
pub fn parse_time(s: &str) -> Option<i64> {
    let s = s.trim();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().ok();
    }
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let t = s.get(r)?;
        if t.bytes().all(|c| c.is_ascii_digit()) {
            t.parse().ok()
        } else {
            None
        }
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, min, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || min > 59 || sec > 60 {
        return None;
    }
    let mut rest = &s[19..];
    let mut millis = 0i64;
    if let Some(frac) = rest.strip_prefix('.') {
        let digits = frac.bytes().take_while(|c| c.is_ascii_digit()).count();
        if digits == 0 {
            return None;
        }
        let mut ms_text: String = frac[..digits].chars().take(3).collect();
        while ms_text.len() < 3 {
            ms_text.push('0');
        }
        millis = ms_text.parse().ok()?;
        rest = &frac[digits..];
    }
    let offset_min = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first() {
                Some(b'+') => 1,
                Some(b'-') => -1,
                _ => return None,
            };
            if rest.len() != 6 || rest.as_bytes()[3] != b':' {
                return None;
            }
            let h: i64 = rest[1..3].parse().ok()?;
            let m: i64 = rest[4..6].parse().ok()?;
            sign * (h * 60 + m)
        }
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + min * 60 + sec - offset_min * 60;
    Some(secs * 1000 + millis)
}

/// Unix ms as RFC 3339 in UTC with milliseconds (`2026-11-30T04:45:53.250Z`).
pub fn format_rfc3339(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let millis = ms.rem_euclid(1000);
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_time_table() {
        let cases: &[(&str, Option<i64>)] = &[
            ("0", Some(0)),
            ("1764477953000", Some(1_764_477_953_000)),
            ("1970-01-01T00:00:00Z", Some(0)),
            ("2000-03-01T00:00:00Z", Some(951_868_800_000)),
            ("2026-11-30T04:45:53Z", Some(1_796_013_953_000)),
            ("2026-11-30T04:45:53.25Z", Some(1_796_013_953_250)),
            ("2026-11-30T05:45:53+01:00", Some(1_796_013_953_000)),
            ("2026-11-30T03:45:53.5-01:00", Some(1_796_013_953_500)),
            ("2026-13-30T04:45:53Z", None),
            ("2026-11-30T04:45:53", None),
            ("2026-11-30", None),
            ("yesterday", None),
            ("", None),
            ("-5", None),
        ];
        for &(input, expected) in cases {
            assert_eq!(parse_time(input), expected, "{input:?}");
        }
    }

    #[test]
    fn rfc3339_round_trips() {
        for ms in [0, 951_868_800_000, 1_796_013_953_250, 1_709_251_199_999] {
            let text = format_rfc3339(ms);
            assert_eq!(parse_time(&text), Some(ms), "{text}");
        }
        assert_eq!(
            format_rfc3339(1_796_013_953_250),
            "2026-11-30T04:45:53.250Z"
        );
    }

    #[test]
    fn offset_is_round_trip_corrected_and_kept_within_its_error() {
        let s = |sent_ms, theirs_ms, received_ms| ClockSample {
            sent_ms,
            theirs_ms,
            received_ms,
        };
        // Their clock read halfway through a 10 ms round trip: 60 s ahead, within 5 ms.
        let ahead = s(1_000, 61_005, 1_010);
        assert_eq!(ahead.offset_ms(), 60_000);
        assert_eq!(ahead.error_ms(), 5);
        assert_eq!(s(1_000, -58_995, 1_010).offset_ms(), -60_000);
        let cases: &[(Option<i64>, ClockSample, Option<i64>)] = &[
            (None, ahead, Some(60_000)),
            // Within the error and the steady margin: the one in use stays.
            (Some(60_010), ahead, Some(60_010)),
            (Some(59_985), ahead, Some(59_985)),
            // Beyond them: the clock moved (or was set), the sample wins.
            (Some(59_900), ahead, Some(60_000)),
            (Some(0), ahead, Some(60_000)),
            // A slow round trip tells little: a change within its error is not taken.
            (Some(60_400), s(1_000, 61_500, 2_000), Some(60_400)),
            // Our clock went backwards during the round trip: no measurement.
            (Some(7), s(1_000, 50_000, 900), Some(7)),
            (None, s(1_000, 50_000, 900), None),
        ];
        for (current, sample, expected) in cases {
            assert_eq!(
                adopt_offset(*current, sample),
                *expected,
                "{current:?} {sample:?}"
            );
        }
    }

    #[test]
    fn which_clock_is_off_table() {
        use ClockVerdict::*;
        // (the server's less the host's, the HTTP peers' less the host's, verdict)
        let cases: &[(i64, Option<i64>, ClockVerdict)] = &[
            (0, None, Agree),
            (900, Some(600_000), Agree),
            (-1_000, None, Agree),
            // The server 600 s ahead, the peers agree with the host: the server is off.
            (600_000, Some(400), ServerOff),
            (600_000, Some(-1_900), ServerOff),
            // The host 60 s ahead (the server 60 s behind it), the peers agree with the server.
            (-60_000, Some(-59_300), HostOff),
            (60_000, Some(60_800), HostOff),
            // No peer heard, or one that agrees with neither.
            (600_000, None, Unknown),
            (600_000, Some(300_000), Unknown),
        ];
        for &(server, peers, verdict) in cases {
            assert_eq!(
                ClockVerdict::of(server, peers),
                verdict,
                "{server} {peers:?}"
            );
        }
        let w = ServerOff.warning(600_000).unwrap();
        assert!(w.starts_with("the PostgreSQL server's clock is 600.0 s ahead of this host's"));
        let w = HostOff.warning(-60_000).unwrap();
        assert!(w.starts_with("this host's clock is 60.0 s ahead of the PostgreSQL server's"));
        assert_eq!(Agree.warning(0), None);
    }

    #[test]
    fn jitter_is_in_range() {
        for _ in 0..100 {
            let j = jitter();
            assert!((0.0..=1.0).contains(&j));
        }
    }
}
