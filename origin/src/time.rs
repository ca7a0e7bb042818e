//! The daemon's only clock and randomness, and the parsing of times in queries.

use std::time::{SystemTime, UNIX_EPOCH};

/// Unix milliseconds now.
pub fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
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
    fn jitter_is_in_range() {
        for _ in 0..100 {
            let j = jitter();
            assert!((0.0..=1.0).contains(&j));
        }
    }
}
