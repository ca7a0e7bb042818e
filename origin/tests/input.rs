//! What the API takes from a caller, through the daemon's real socket: ids and names a person
//! reads (in the console, the portal, `/metrics` and logs) are a visible, safe set, and the
//! bearer scheme is read as HTTP says (case-insensitive).

mod common;

use common::*;
use serde_json::{json, Value};

/// Ids and event types that would read differently from what they are: bidi overrides and
/// isolates, zero-width characters, other invisible formatting, look-alike letters, spaces.
const SPOOFS: &[&str] = &[
    "acme\u{202E}gpj.exe",   // right-to-left override
    "acme\u{2066}x\u{2069}", // left-to-right isolate
    "ac\u{200B}me",          // zero-width space
    "ac\u{200D}me",          // zero-width joiner
    "\u{FEFF}acme",          // byte order mark
    "acme\u{00AD}",          // soft hyphen
    "\u{0430}cme",           // Cyrillic a
    "acme\u{00A0}x",         // no-break space
    "acme\u{3000}x",         // ideographic space
    "ac<me>",                // markup (refused in subscriber and customer ids)
    "acme/x",
    "acme x",
    "",
];

#[tokio::test]
async fn ids_and_event_types_are_a_visible_safe_set() {
    let d = Daemon::start().await;
    let sink = Subscriber::ok().await;
    let url = format!("{}/h", sink.url);

    // Allowed: ASCII letters, digits and `_ - . :`, 1 to 255 of them.
    for id in ["sub_partner", "a", "Sub-1.v2:eu", &"s".repeat(255)] {
        d.api.subscriber(sub_spec(id, &url, &["video.*"])).await;
        let (status, body) = d
            .api
            .post("/v1/customers", json!({ "id": id, "weight": 1 }))
            .await;
        assert_eq!(status, 201, "customer {id:?}: {body}");
    }
    let (status, body) = d
        .api
        .post(
            "/v1/events",
            json!({ "id": "evt_1", "type": "video.trending_v2:eu-1" }),
        )
        .await;
    assert_eq!(status, 202, "{body}");

    let refused = |what: &str, status: u16, body: &Value| {
        assert_eq!(status, 400, "{what}: {body}");
        assert_eq!(body["error"]["code"], "invalid_request", "{what}: {body}");
    };
    for id in SPOOFS
        .iter()
        .map(|s| s.to_string())
        .chain(["s".repeat(256)])
    {
        let (status, body) = d
            .api
            .post("/v1/subscribers", sub_spec(&id, &url, &["*"]))
            .await;
        refused(&format!("subscriber {id:?}"), status, &body);
        let (status, body) = d
            .api
            .post("/v1/customers", json!({ "id": id, "weight": 1 }))
            .await;
        refused(&format!("customer {id:?}"), status, &body);
        let mut spec = sub_spec("sub_owned", &url, &["*"]);
        spec["customer"] = json!(id);
        let (status, body) = d.api.post("/v1/subscribers", spec).await;
        refused(&format!("customer reference {id:?}"), status, &body);
        // Event ids and types are the producer's: visible ASCII, markup included (the console
        // and the portal render text, never HTML).
        if id.is_empty() || id.bytes().all(|b| b.is_ascii_graphic()) {
            continue;
        }
        let (status, body) = d
            .api
            .post("/v1/events", json!({ "id": "evt_2", "type": id }))
            .await;
        refused(&format!("event type {id:?}"), status, &body);
        let (status, body) = d
            .api
            .post(
                "/v1/subscribers",
                sub_spec("sub_pattern", &url, &[&format!("{id}.*")]),
            )
            .await;
        refused(&format!("event type pattern {id:?}"), status, &body);
        let (status, body) = d
            .api
            .post("/v1/events", json!({ "id": id, "type": "video.trending" }))
            .await;
        refused(&format!("event id {id:?}"), status, &body);
    }
    d.stop().await;
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let d = Daemon::start().await;
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let call = |auth: String| {
        let http = http.clone();
        let url = format!("{}/v1/subscribers", d.api.base);
        async move {
            http.get(url)
                .header("authorization", auth)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        assert_eq!(call(format!("{scheme} {TOKEN}")).await, 200, "{scheme}");
        assert_eq!(call(format!("{scheme}  {TOKEN} ")).await, 200, "{scheme}");
    }
    for wrong in [
        format!("Basic {TOKEN}"),
        format!("Bearer{TOKEN}"),
        format!("Bearer {TOKEN}x"),
        format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]),
        "Bearer".to_string(),
        "Bearer ".to_string(),
        TOKEN.to_string(),
    ] {
        assert_eq!(call(wrong.clone()).await, 401, "{wrong:?}");
    }
    d.stop().await;
}
