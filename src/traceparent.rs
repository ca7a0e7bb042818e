//! W3C Trace Context `traceparent` (<https://www.w3.org/TR/trace-context/>): the one parse and
//! format of the header a producer sends on `POST /v1/events` and a subscriber with
//! `propagate_trace` receives. The daemon parses what a producer sent; the Worker checks what
//! the origin put on the wire before making it a header.
//!
//! A value is accepted as the specification's "version-format" says: two lowercase hex digits of
//! version (not `ff`), a 32-digit trace id and a 16-digit parent id that are not all zeros, and
//! two digits of flags, separated by `-`. Version `00` is exactly that; a later version may be
//! longer, with `-` after the flags, and is kept as its version-00 part. Anything else is not a
//! trace context (the caller ignores it; it is never an error of the request).

/// A parsed `traceparent`: what a span needs to join a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceParent {
    pub trace_id: [u8; 16],
    pub parent_id: [u8; 8],
    pub flags: u8,
}

/// The length of a version-00 `traceparent`.
pub const LEN: usize = 55;

impl TraceParent {
    /// Parse a header value, or `None` when it is not a valid trace context.
    pub fn parse(value: &str) -> Option<TraceParent> {
        let v = value.trim_matches(|c| c == ' ' || c == '\t').as_bytes();
        if v.len() < LEN || (v.len() > LEN && (v[..2] == *b"00" || v[LEN] != b'-')) {
            return None;
        }
        if v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
            return None;
        }
        let version: [u8; 1] = hex(&v[0..2])?;
        if version[0] == 0xff {
            return None;
        }
        let trace_id: [u8; 16] = hex(&v[3..35])?;
        let parent_id: [u8; 8] = hex(&v[36..52])?;
        let [flags] = hex(&v[53..55])?;
        if trace_id == [0; 16] || parent_id == [0; 8] {
            return None;
        }
        Some(TraceParent {
            trace_id,
            parent_id,
            flags,
        })
    }

    /// The version-00 header value.
    pub fn format(&self) -> String {
        let mut s = String::with_capacity(LEN);
        s.push_str("00-");
        push_hex(&mut s, &self.trace_id);
        s.push('-');
        push_hex(&mut s, &self.parent_id);
        s.push('-');
        push_hex(&mut s, &[self.flags]);
        s
    }

    /// The trace id as 32 lowercase hex digits.
    pub fn trace_id_hex(&self) -> String {
        let mut s = String::with_capacity(32);
        push_hex(&mut s, &self.trace_id);
        s
    }
}

/// Lowercase hex digits into `N` bytes (uppercase is not allowed by the specification).
fn hex<const N: usize>(digits: &[u8]) -> Option<[u8; N]> {
    if digits.len() != 2 * N {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        out[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(out)
}

fn push_hex(s: &mut String, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn parse_table() {
        let cases: &[(&str, Option<&str>)] = &[
            (GOOD, Some(GOOD)),
            (&format!(" {GOOD}\t"), Some(GOOD)),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00",
                Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"),
            ),
            // A later version may carry more after its flags; its version-00 part is kept.
            (
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-future",
                Some(GOOD),
            ),
            (
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
                None,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
                None,
            ),
            (
                "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                None,
            ),
            (
                "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
                None,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
                None,
            ),
            (
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
                None,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
                None,
            ),
            (
                "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                None,
            ),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",
                None,
            ),
            ("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7", None),
            ("", None),
            ("garbage", None),
            (
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902é-01",
                None,
            ),
        ];
        for (input, want) in cases {
            let got = TraceParent::parse(input).map(|t| t.format());
            assert_eq!(got.as_deref(), *want, "{input:?}");
        }
        let t = TraceParent::parse(GOOD).unwrap();
        assert_eq!(t.trace_id_hex(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.flags, 1);
    }
}
