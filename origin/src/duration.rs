//! The one grammar of human durations, for flags, the config file and the CLI alike (pure):
//! `30s`, `500ms`, `1.5s`, `2m`, `1h30m`, `5d`, or a bare number of seconds. It parses and
//! formats; it does not decide which durations a setting accepts (its caller's minimum and
//! maximum) and it does not read the clock.
//!
//! The grammar: optional spaces, then one or more parts, each a number (digits, an optional
//! `.` and fraction) and a unit, with optional spaces between a number and its unit; then
//! optional spaces. Units: `ms`; `s`, `sec`, `secs`; `m`, `min`; `h`; `d`. A bare number
//! alone is seconds. The result is whole milliseconds (a fraction of one is rounded to the
//! nearest); a negative or overflowing duration is not one.

use std::time::Duration;

/// Milliseconds in one of the grammar's units, `None` for a word that is not one.
fn unit_ms(unit: &str) -> Option<f64> {
    Some(match unit {
        "ms" => 1.0,
        "s" | "sec" | "secs" => 1000.0,
        "m" | "min" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        _ => return None,
    })
}

/// The number at the start of `text` (digits with an optional fraction) and what follows.
fn number(text: &str) -> Option<(f64, &str)> {
    let len = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let digits = &text[..len];
    if !digits.bytes().any(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((digits.parse().ok()?, &text[len..]))
}

/// A duration in milliseconds, `None` when `text` is not one (see the module's grammar).
pub fn parse_duration(text: &str) -> Option<i64> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    if let Some((n, "")) = number(rest) {
        return whole_ms(n * 1000.0);
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let (n, after) = number(rest)?;
        let after = after.trim_start();
        let len = after
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(after.len());
        total += n * unit_ms(&after[..len])?;
        rest = after[len..].trim_start();
    }
    whole_ms(total)
}

/// `ms` rounded to a whole number of milliseconds, when it is one an `i64` holds.
fn whole_ms(ms: f64) -> Option<i64> {
    let ms = ms.round();
    (ms.is_finite() && (0.0..i64::MAX as f64).contains(&ms)).then_some(ms as i64)
}

/// [`parse_duration`] for a command-line flag (clap's `value_parser`): the message says what
/// was expected.
pub fn parse_flag(text: &str) -> Result<Duration, String> {
    parse_duration(text)
        .map(|ms| Duration::from_millis(ms as u64))
        .ok_or_else(|| format!("{text:?} is not a duration like 10s, 500ms, 2m or 1h30m"))
}

/// A duration in ms the way [`parse_duration`] reads it, in its largest whole unit (`5d`,
/// `90s`, `250ms`).
pub fn format_duration(ms: i64) -> String {
    const UNITS: [(i64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1000, "s"),
    ];
    for (size, unit) in UNITS {
        if ms != 0 && ms % size == 0 {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every input either former grammar took (the configuration's and the CLI's) still
    /// reads the same; the rows marked "new" were refused by one of them.
    #[test]
    fn duration_table() {
        let cases: &[(&str, Option<i64>)] = &[
            ("5d", Some(432_000_000)),
            ("30s", Some(30_000)),
            ("2s", Some(2000)),
            ("250ms", Some(250)),
            ("1h30m", Some(5_400_000)),
            ("10m", Some(600_000)),
            ("90", Some(90_000)),
            (" 12h ", Some(43_200_000)),
            ("5", Some(5000)),
            ("10", Some(10_000)),
            ("1.5s", Some(1_500)),
            ("1.5", Some(1_500)),
            ("2min", Some(120_000)),
            ("3sec", Some(3_000)),
            ("3secs", Some(3_000)),
            ("5 s", Some(5_000)),
            ("1h", Some(3_600_000)),
            ("0", Some(0)),
            ("0.4ms", Some(0)),
            ("1.5h", Some(5_400_000)), // new: a fraction in the configuration
            ("5 d", Some(432_000_000)), // new: a space before the unit there
            ("2d12h", Some(216_000_000)), // new: days and parts on the command line
            ("1m 30s", Some(90_000)),  // new: a space between parts
            ("", None),
            ("   ", None),
            ("d", None),
            ("ten", None),
            ("5w", None),
            ("5 parsecs", None),
            ("a week", None),
            ("soon", None),
            ("-5s", None),
            ("-5", None),
            ("5s-", None),
            (".", None),
            ("1..5s", None),
            ("s5", None),
            ("99999999999999999999d", None),
        ];
        for &(input, expected) in cases {
            assert_eq!(parse_duration(input), expected, "{input:?}");
        }
        for ms in [432_000_000, 30_000, 5_400_000, 250, 2000, 3_600_000] {
            assert_eq!(parse_duration(&format_duration(ms)), Some(ms), "{ms}");
        }
        assert_eq!(format_duration(432_000_000), "5d");
        assert_eq!(format_duration(5_400_000), "90m");
        assert_eq!(parse_flag("1500ms"), Ok(Duration::from_millis(1500)));
        assert!(parse_flag("soon").unwrap_err().contains("not a duration"));
    }
}
