//! What `fanout listen` decides and prints, without I/O (pure): the answer to one webhook from
//! the flags and one random draw ([`decide`]), the line it prints ([`line`]), and the name of
//! its temporary subscriber ([`subscriber_id`]). The receiver (`super`) draws, verifies,
//! forwards and sleeps; this file only decides.

use crate::term::{clip, escape};

/// How the listener answers webhooks, from its flags.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// `--status`: the answer to a webhook that neither fails by `--fail-rate` nor is forwarded.
    pub status: u16,
    /// `--fail-rate`: the share of verified webhooks answered [`FAIL_STATUS`], 0 to 1.
    pub fail_rate: f64,
    /// `--retry-after`: seconds, sent as `Retry-After` on every error answer; with no error
    /// answer configured, every webhook is answered 429 with it.
    pub retry_after: Option<u64>,
    /// `--forward-to` is set: a webhook that does not fail is answered with what the target
    /// answered.
    pub forwarding: bool,
}

/// The answer to a webhook that fails by `--fail-rate`: 503, which the daemon retries (and,
/// with `Retry-After`, which pauses the whole subscriber).
pub const FAIL_STATUS: u16 = 503;
/// The answer to a webhook whose signature does not verify, whatever the flags say: the
/// daemon sees a failure, so a wrong secret is never mistaken for a working endpoint.
pub const UNVERIFIED_STATUS: u16 = 401;
/// The answer when the `--forward-to` target could not be reached.
pub const FORWARD_FAILED_STATUS: u16 = 502;

/// What to do with one webhook.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Answer this status (with `Retry-After` seconds when given); do not forward.
    Answer {
        status: u16,
        retry_after: Option<u64>,
    },
    /// Forward it and answer what the target answers ([`forwarded`]).
    Forward,
}

/// A draw of 64 random bits as a uniform number in [0, 1).
pub fn unit(draw: u64) -> f64 {
    (draw >> 11) as f64 / (1u64 << 53) as f64
}

/// The answer to one webhook: `verified` says whether its signature checked out, `draw` is a
/// uniform number in [0, 1) drawn for this webhook alone.
pub fn decide(p: &Policy, verified: bool, draw: f64) -> Decision {
    let with_retry_after = |status: u16| Decision::Answer {
        status,
        retry_after: if status >= 400 { p.retry_after } else { None },
    };
    if !verified {
        return with_retry_after(UNVERIFIED_STATUS);
    }
    if draw < p.fail_rate {
        return with_retry_after(FAIL_STATUS);
    }
    if p.forwarding {
        return Decision::Forward;
    }
    // `--retry-after` alone: every answer is a 429 that asks for that pause.
    let status = if p.retry_after.is_some() && p.status < 400 && p.fail_rate <= 0.0 {
        429
    } else {
        p.status
    };
    with_retry_after(status)
}

/// The answer to a forwarded webhook: the target's status (`None`: it could not be reached,
/// [`FORWARD_FAILED_STATUS`]), its own `Retry-After` seconds or else `--retry-after` on an
/// error.
pub fn forwarded(p: &Policy, target: Option<u16>, target_retry_after: Option<u64>) -> Decision {
    let status = target.unwrap_or(FORWARD_FAILED_STATUS);
    Decision::Answer {
        status,
        retry_after: if status >= 400 {
            target_retry_after.or(p.retry_after)
        } else {
            None
        },
    }
}

/// One webhook as the listener saw and answered it.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen<'a> {
    /// When it arrived, unix ms.
    pub at_ms: i64,
    /// `webhook-id` (`-` when absent).
    pub id: Option<&'a str>,
    /// The body, to find the event's type.
    pub body: &'a [u8],
    /// `webhook-sequence` (`-` when absent).
    pub sequence: Option<&'a str>,
    /// The status it was answered.
    pub status: u16,
    /// `Err(reason)` when its signature did not verify.
    pub verified: Result<(), String>,
    /// With `--forward-to`: the target's status, or why it could not be reached.
    pub forward: Option<Result<u16, String>>,
}

/// The event type a body names: its `type`, `batch of N` for a batch (`{"events": […]}`), or
/// `-`.
pub fn event_type(body: &[u8]) -> String {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return "-".into();
    };
    if let Some(t) = v.get("type").and_then(|t| t.as_str()) {
        return clip(&escape(t), 60);
    }
    match v.get("events").and_then(|e| e.as_array()) {
        Some(events) => format!("batch of {}", events.len()),
        None => "-".into(),
    }
}

/// The line printed for one webhook: time (UTC), event id, type, sequence, the status
/// answered, `verified` or `NOT VERIFIED (why)`, then what forwarding gave. With `verbose`, the
/// body follows on its own line. Nothing is printed raw: a body is unverified until shown
/// otherwise, and anyone may send one, so what it holds is escaped (`crate::term::escape`).
pub fn line(s: &Seen<'_>, verbose: bool) -> String {
    let stamp = crate::time::format_rfc3339(s.at_ms);
    let time = stamp.get(11..23).unwrap_or(&stamp);
    let verified = match &s.verified {
        Ok(()) => "verified".to_string(),
        Err(why) => format!("NOT VERIFIED ({})", escape(why)),
    };
    let mut out = format!(
        "{time}  {}  {}  seq {}  {}  {verified}",
        clip(&escape(s.id.unwrap_or("-")), 80),
        event_type(s.body),
        clip(&escape(s.sequence.unwrap_or("-")), 20),
        s.status,
    );
    match &s.forward {
        None => {}
        Some(Ok(status)) => out.push_str(&format!("  forwarded: {status}")),
        Some(Err(why)) => out.push_str(&format!("  forward failed: {}", escape(why))),
    }
    out.push('\n');
    if verbose {
        out.push_str(&escape(&String::from_utf8_lossy(s.body)));
        out.push('\n');
    }
    out
}

/// The temporary subscriber's id: `listen_<host>_<port>`, the host reduced to the characters
/// an id may hold. One per receiver port and host, so a listener that died without removing
/// its subscriber is replaced by the next one on the same port.
pub fn subscriber_id(host: &str, port: u16) -> String {
    let host: String = host
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    let host = host.trim_matches('-');
    let host = if host.is_empty() { "local" } else { host };
    format!("listen_{host}_{port}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy {
            status: 200,
            fail_rate: 0.0,
            retry_after: None,
            forwarding: false,
        }
    }

    fn answer(status: u16, retry_after: Option<u64>) -> Decision {
        Decision::Answer {
            status,
            retry_after,
        }
    }

    #[test]
    fn decisions_table() {
        type Edit = fn(&mut Policy);
        let cases: &[(&str, Edit, bool, f64, Decision)] = &[
            ("default", |_| {}, true, 0.5, answer(200, None)),
            ("not verified", |_| {}, false, 0.5, answer(401, None)),
            ("status", |p| p.status = 500, true, 0.0, answer(500, None)),
            (
                "status 2xx",
                |p| p.status = 204,
                true,
                0.0,
                answer(204, None),
            ),
            (
                "fails when the draw is under the rate",
                |p| p.fail_rate = 0.3,
                true,
                0.29,
                answer(503, None),
            ),
            (
                "passes at the rate",
                |p| p.fail_rate = 0.3,
                true,
                0.3,
                answer(200, None),
            ),
            (
                "rate 1 fails every draw",
                |p| p.fail_rate = 1.0,
                true,
                0.999_999,
                answer(503, None),
            ),
            ("rate 0 fails none", |_| {}, true, 0.0, answer(200, None)),
            (
                "retry-after alone: 429",
                |p| p.retry_after = Some(5),
                true,
                0.0,
                answer(429, Some(5)),
            ),
            (
                "retry-after on an error status",
                |p| {
                    p.status = 503;
                    p.retry_after = Some(7);
                },
                true,
                0.0,
                answer(503, Some(7)),
            ),
            (
                "retry-after with a fail rate: failures carry it, the rest pass",
                |p| {
                    p.fail_rate = 0.5;
                    p.retry_after = Some(2);
                },
                true,
                0.7,
                answer(200, None),
            ),
            (
                "retry-after with a fail rate, failing",
                |p| {
                    p.fail_rate = 0.5;
                    p.retry_after = Some(2);
                },
                true,
                0.1,
                answer(503, Some(2)),
            ),
            (
                "retry-after on the unverified",
                |p| p.retry_after = Some(3),
                false,
                0.0,
                answer(401, Some(3)),
            ),
            (
                "forwarding",
                |p| p.forwarding = true,
                true,
                0.5,
                Decision::Forward,
            ),
            (
                "a failure is not forwarded",
                |p| {
                    p.forwarding = true;
                    p.fail_rate = 0.5;
                },
                true,
                0.2,
                answer(503, None),
            ),
            (
                "the unverified is not forwarded",
                |p| p.forwarding = true,
                false,
                0.9,
                answer(401, None),
            ),
        ];
        for (name, edit, verified, draw, expected) in cases {
            let mut p = policy();
            edit(&mut p);
            assert_eq!(decide(&p, *verified, *draw), *expected, "{name}");
        }
    }

    #[test]
    fn forwarded_table() {
        let mut with = policy();
        with.retry_after = Some(9);
        let cases: &[(&Policy, Option<u16>, Option<u64>, Decision)] = &[
            (&policy(), Some(200), None, answer(200, None)),
            (&policy(), Some(500), None, answer(500, None)),
            (&policy(), None, None, answer(502, None)),
            (&with, Some(200), Some(4), answer(200, None)),
            (&with, Some(429), Some(4), answer(429, Some(4))),
            (&with, Some(500), None, answer(500, Some(9))),
            (&with, None, None, answer(502, Some(9))),
        ];
        for (p, target, ra, expected) in cases {
            assert_eq!(forwarded(p, *target, *ra), *expected, "{target:?} {ra:?}");
        }
    }

    #[test]
    fn draws_are_uniform_in_the_unit_interval() {
        assert_eq!(unit(0), 0.0);
        assert!(unit(u64::MAX) < 1.0);
        assert_eq!(unit(1 << 63), 0.5);
    }

    #[test]
    fn lines_table() {
        let at = 1_796_013_953_250; // 2026-11-30T04:45:53.250Z
        let seen = |verified: Result<(), String>, forward, seq| Seen {
            at_ms: at,
            id: Some("evt_1"),
            body: br#"{"id":"evt_1","type":"video.trending"}"#,
            sequence: seq,
            status: if verified.is_ok() { 200 } else { 401 },
            verified,
            forward,
        };
        let cases: Vec<(Seen<'_>, bool, &str)> = vec![
            (
                seen(Ok(()), None, Some("3")),
                false,
                "04:45:53.250  evt_1  video.trending  seq 3  200  verified\n",
            ),
            (
                seen(Ok(()), None, None),
                false,
                "04:45:53.250  evt_1  video.trending  seq -  200  verified\n",
            ),
            (
                seen(Err("no signature matches".into()), None, None),
                false,
                "04:45:53.250  evt_1  video.trending  seq -  401  NOT VERIFIED (no signature matches)\n",
            ),
            (
                seen(Ok(()), Some(Ok(201)), Some("1")),
                false,
                "04:45:53.250  evt_1  video.trending  seq 1  200  verified  forwarded: 201\n",
            ),
            (
                seen(Ok(()), Some(Err("connection refused".into())), Some("1")),
                false,
                "04:45:53.250  evt_1  video.trending  seq 1  200  verified  forward failed: connection refused\n",
            ),
            (
                seen(Ok(()), None, Some("1")),
                true,
                "04:45:53.250  evt_1  video.trending  seq 1  200  verified\n{\"id\":\"evt_1\",\"type\":\"video.trending\"}\n",
            ),
        ];
        for (s, verbose, expected) in cases {
            assert_eq!(line(&s, verbose), expected);
        }
    }

    /// Whoever sent it, a webhook prints as one line (and its body as one more): escape
    /// sequences, newlines and text-reordering characters in its body, type or the reasons
    /// shown are written out, so no body clears the screen or prints a "verified" line.
    #[test]
    fn what_a_sender_wrote_is_escaped() {
        let body = "{\"type\":\"order\u{202e}dia\u{1b}[2J\"}\n04:45:53.250  evt_2  x  seq 1  200  verified\u{1b}[1A";
        let s = Seen {
            at_ms: 1_796_013_953_250,
            id: Some("evt_1"),
            body: body.as_bytes(),
            sequence: Some("1"),
            status: 401,
            verified: Err("bad \u{1b}[32mverified".into()),
            forward: Some(Err("refused\r\nverified".into())),
        };
        assert_eq!(
            line(&s, true),
            "04:45:53.250  evt_1  -  seq 1  401  NOT VERIFIED (bad \\x1b[32mverified)  forward failed: refused\\r\\nverified\n\
             {\"type\":\"order\\u{202e}dia\\x1b[2J\"}\\n04:45:53.250  evt_2  x  seq 1  200  verified\\x1b[1A\n"
        );
        let typed = "{\"type\":\"order\u{202e}dia\"}";
        assert_eq!(event_type(typed.as_bytes()), "order\\u{202e}dia");
    }

    #[test]
    fn event_types_table() {
        let cases: &[(&[u8], &str)] = &[
            (br#"{"id":"e","type":"order.paid"}"#, "order.paid"),
            (br#"{"events":[{"id":"a"},{"id":"b"}]}"#, "batch of 2"),
            (br#"{"id":"e"}"#, "-"),
            (b"not json", "-"),
            (br#"{"type":7}"#, "-"),
        ];
        for (body, expected) in cases {
            assert_eq!(event_type(body), *expected);
        }
    }

    #[test]
    fn subscriber_ids_table() {
        let cases = [
            ("devbox", 9000, "listen_devbox_9000"),
            ("Dev.Box.local\n", 9001, "listen_dev-box-local_9001"),
            ("", 9000, "listen_local_9000"),
            ("???", 9000, "listen_local_9000"),
        ];
        for (host, port, expected) in cases {
            let id = subscriber_id(host, port);
            assert_eq!(id, expected);
            assert!(crate::model::validate_id("id", &id).is_ok());
        }
    }
}
