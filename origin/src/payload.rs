//! What a webhook's body is (pure): the event's stored body byte for byte (`"payload":
//! "full"`, the default), or a thin notice of it (`"thin"`): `{"id","type","timestamp"}`, plus
//! `"url"` where the receiver fetches the event when the daemon has `--event-url`.
//!
//! The stored event is never changed: the thin body is built at the origin when a delivery is
//! launched, before either lane takes it, so both lanes send the same bytes (the edge signs
//! whatever `body` it is handed). It is the same for every attempt of a delivery.
//!
//! `timestamp` is when the ledger received the event (the time every delivery of it shares),
//! as RFC 3339 in UTC with milliseconds, the form the Standard Webhooks payload's `timestamp`
//! takes. It is not `webhook-timestamp`, which is the unix second of each attempt (signed, for
//! replay protection) and changes from one retry to the next.

use serde::{Deserialize, Serialize};

use crate::time::format_rfc3339;

/// A subscriber's choice of body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Payload {
    /// The event's stored body, byte for byte.
    #[default]
    Full,
    /// `{"id","type","timestamp"}` and, with `--event-url`, `"url"`.
    Thin,
}

impl Payload {
    pub fn as_str(self) -> &'static str {
        match self {
            Payload::Full => "full",
            Payload::Thin => "thin",
        }
    }

    pub fn parse(s: &str) -> Option<Payload> {
        match s {
            "full" => Some(Payload::Full),
            "thin" => Some(Payload::Thin),
            _ => None,
        }
    }
}

/// The placeholder an `--event-url` template must hold.
const ID: &str = "{id}";

/// `--event-url`: a template such as `https://api.example.com/events/{id}`, validated once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventUrl(String);

impl EventUrl {
    /// An absolute `http(s)` URL holding `{id}` (where the event id goes, percent-encoded) in
    /// its path or query only: an id in its host, user, port or fragment would let an event's
    /// producer choose where the receiver fetches from, or hide the id from the server.
    pub fn parse(template: &str) -> Result<EventUrl, String> {
        if !template.contains(ID) {
            return Err(format!(
                "--event-url {template:?} must hold {ID} where the event id goes"
            ));
        }
        // A marker no template holds otherwise, to find where the ids land.
        const MARK: &str = "fanoutEventIdMark";
        let probe = template.replace(ID, MARK);
        match url::Url::parse(&probe) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {
                let placed =
                    u.path().matches(MARK).count() + u.query().unwrap_or("").matches(MARK).count();
                if placed != template.matches(ID).count() {
                    return Err(format!(
                        "--event-url {template:?} may hold {ID} only in its path or query"
                    ));
                }
                Ok(EventUrl(template.to_string()))
            }
            _ => Err(format!(
                "--event-url {template:?} must be an absolute http:// or https:// URL"
            )),
        }
    }

    /// The URL of one event: the template with each `{id}` replaced by the id, every byte
    /// outside `A-Z a-z 0-9 - . _ ~ :` percent-encoded, and so are the dots of the ids `.` and
    /// `..` (no dot segment for a parser that does not decode them; ingest refuses such ids).
    pub fn of(&self, event_id: &str) -> String {
        let mut id = String::with_capacity(event_id.len());
        let dot_segment = event_id == "." || event_id == "..";
        for b in event_id.bytes() {
            if !dot_segment
                && (b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b':'))
            {
                id.push(char::from(b));
            } else {
                id.push_str(&format!("%{b:02X}"));
            }
        }
        self.0.replace(ID, &id)
    }
}

/// A thin body, fields in this order.
#[derive(Serialize)]
struct Thin<'a> {
    id: &'a str,
    #[serde(rename = "type")]
    event_type: &'a str,
    timestamp: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    url: Option<String>,
}

/// The thin body of an event received at `received_ms`.
pub fn thin_body(
    event_id: &str,
    event_type: &str,
    received_ms: i64,
    event_url: Option<&EventUrl>,
) -> String {
    let thin = Thin {
        id: event_id,
        event_type,
        timestamp: format_rfc3339(received_ms),
        url: event_url.map(|u| u.of(event_id)),
    };
    // A struct of strings always serialises.
    serde_json::to_string(&thin).unwrap_or_default()
}

/// The length of the body a webhook of this event carries under `payload`: the stored
/// `body`'s, or the thin one's (what a batch's `max_bytes` counts).
pub fn body_len(
    payload: Payload,
    body: &str,
    event_id: &str,
    event_type: &str,
    received_ms: i64,
    event_url: Option<&EventUrl>,
) -> usize {
    match payload {
        Payload::Full => body.len(),
        Payload::Thin => thin_body(event_id, event_type, received_ms, event_url).len(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_names_table() {
        for p in [Payload::Full, Payload::Thin] {
            assert_eq!(Payload::parse(p.as_str()), Some(p));
            let json = serde_json::to_string(&p).unwrap();
            assert_eq!(json, format!("\"{}\"", p.as_str()));
        }
        for bad in ["", "Thin", "none", "full "] {
            assert_eq!(Payload::parse(bad), None, "{bad:?}");
        }
        assert_eq!(Payload::default(), Payload::Full);
    }

    #[test]
    fn event_url_templates_table() {
        let rows: &[(&str, Result<&str, &str>)] = &[
            (
                "https://api.example.com/events/{id}",
                Ok("https://api.example.com/events/evt_1%2Fx%3F%20%25:v2"),
            ),
            (
                "http://127.0.0.1:9/e?id={id}&again={id}",
                Ok("http://127.0.0.1:9/e?id=evt_1%2Fx%3F%20%25:v2&again=evt_1%2Fx%3F%20%25:v2"),
            ),
            ("https://api.example.com/events/", Err("must hold {id}")),
            ("/events/{id}", Err("absolute http")),
            ("ftp://example.com/{id}", Err("absolute http")),
            // The id goes in the path or the query, nowhere else.
            ("https://{id}", Err("only in its path or query")),
            (
                "https://{id}.example.com/e",
                Err("only in its path or query"),
            ),
            (
                "https://u:{id}@example.com/e",
                Err("only in its path or query"),
            ),
            ("https://example.com:{id}/e", Err("absolute http")),
            (
                "https://example.com/e#{id}",
                Err("only in its path or query"),
            ),
            (
                "https://example.com/e/{id}#{id}",
                Err("only in its path or query"),
            ),
        ];
        for (template, expected) in rows {
            match (EventUrl::parse(template), expected) {
                (Ok(u), Ok(want)) => assert_eq!(u.of("evt_1/x? %:v2"), *want, "{template}"),
                (Err(e), Err(want)) => assert!(e.contains(want), "{template}: {e}"),
                (got, want) => panic!("{template}: got {got:?}, expected {want:?}"),
            }
        }
    }

    /// An id made of dots only is no dot segment in the url (`…/events/../body` would be
    /// `…/body`): its dots are percent-encoded (ingest refuses `.` and `..` as event ids, as
    /// a WHATWG parser resolves `%2E%2E` too; a ledger may hold older ones).
    #[test]
    fn dot_ids_are_encoded_table() {
        let url = EventUrl::parse("https://api.example.com/events/{id}/body").unwrap();
        let rows: &[(&str, &str)] = &[
            (".", "https://api.example.com/events/%2E/body"),
            ("..", "https://api.example.com/events/%2E%2E/body"),
            ("...", "https://api.example.com/events/.../body"),
            ("a..b", "https://api.example.com/events/a..b/body"),
            (".a", "https://api.example.com/events/.a/body"),
        ];
        for (id, want) in rows {
            assert_eq!(url.of(id), *want, "{id:?}");
        }
    }

    #[test]
    fn thin_bodies_table() {
        let url = EventUrl::parse("https://api.example.com/events/{id}").unwrap();
        let rows: &[(Option<&EventUrl>, &str)] = &[
            (
                None,
                r#"{"id":"evt_\"1","type":"video.trending","timestamp":"2025-11-30T04:45:53.250Z"}"#,
            ),
            (
                Some(&url),
                r#"{"id":"evt_\"1","type":"video.trending","timestamp":"2025-11-30T04:45:53.250Z","url":"https://api.example.com/events/evt_%221"}"#,
            ),
        ];
        for (u, want) in rows {
            assert_eq!(
                thin_body("evt_\"1", "video.trending", 1_764_477_953_250, *u),
                *want
            );
        }
    }
}
