//! What a subscriber request says, as types, and what it does to a subscriber (pure): the
//! creation body ([`SubscriberInput`], also written by the CLI), the PATCH body
//! ([`SubscriberPatch`]: only the fields a PATCH may set, so anything else is refused by the
//! type), their validation, and the rules of a PATCH. No I/O, no clock, no randomness.

use fanout_core::batch::BatchSpec;
use fanout_core::endpoint::check_url;
use fanout_core::sign::Secret;
use serde::{Deserialize, Serialize};

use super::auth::Principal;
use super::body::present;
use super::error::ApiError;
use crate::keyring::ensure_signing_key;
use crate::model::{
    validate_id, validate_pattern, Disabled, Lane, Limits, Ordering, Payload, Scheme, Subscriber,
    DEFAULT_MAX_IN_FLIGHT, DEFAULT_RATE_PER_SEC, DEFAULT_TIMEOUT_MS,
};

const MAX_URL_LEN: usize = 2048;

/// The body of `POST /v1/subscribers` (the CLI writes it with the same type).
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriberInput {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_types: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_per_sec: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lane: Option<Lane>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub legacy_signature: Option<bool>,
    /// A `whsec_` secret to use instead of a generated one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    /// Only `false`: a subscriber is created enabled (the type refuses `true`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled: Option<CreatedEnabled>,
    /// The owning customer (`null` is none).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub customer: Option<Option<String>>,
    /// The operator's content filter (`crate::event_filter`; `null` is none).
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub filter: Option<Option<serde_json::Value>>,
    /// The customer's own content filter (`null` is none): an event must match both.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub customer_filter: Option<Option<serde_json::Value>>,
    /// `full` (default) or `thin`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<Payload>,
    /// `none` (default), `subscriber` or `key` (`crate::ordering`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordering: Option<Ordering>,
    /// For `ordering: "key"`: a JSON Pointer into the event (`/video_id`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    /// Its webhooks carry the event's `traceparent` (`crate::trace`); default `false`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub propagate_trace: Option<bool>,
    /// `hmac` (default), `ed25519` or `both`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<Scheme>,
    /// Several events per request (`fanout_core::batch`); `null` is one per request.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub batch: Option<Option<BatchSpec>>,
}

/// `"disabled": false` in a creation body, the only value it may have there: a subscriber is
/// created enabled (`PATCH {"disabled": true}` disables it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CreatedEnabled;

impl Serialize for CreatedEnabled {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bool(false)
    }
}

impl<'de> Deserialize<'de> for CreatedEnabled {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if bool::deserialize(d)? {
            Err(serde::de::Error::custom(
                "a subscriber is created enabled; PATCH {\"disabled\": true} disables it",
            ))
        } else {
            Ok(CreatedEnabled)
        }
    }
}

/// The body of `PATCH /v1/subscribers/{id}`: only the fields given change. It has no
/// `secret` (rotate instead), so a body naming one is refused as an unknown field. The CLI's
/// `fanout subscriber update` writes it with the same type.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriberPatch {
    /// May only repeat the current id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub event_types: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rate_per_sec: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lane: Option<Lane>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub legacy_signature: Option<bool>,
    /// `false` re-enables a disabled subscriber, `true` disables it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disabled: Option<bool>,
    /// Move to this customer; `null` detaches the subscriber from its customer.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub customer: Option<Option<String>>,
    /// A new operator's content filter; `null` removes it. Not for a portal token.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub filter: Option<Option<serde_json::Value>>,
    /// A new customer's own filter; `null` removes it.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub customer_filter: Option<Option<serde_json::Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payload: Option<Payload>,
    /// A new ordering; leaving `key` drops the pointer. Applies to events ingested after it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordering: Option<Ordering>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ordering_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub propagate_trace: Option<bool>,
    /// Switching to `ed25519` or `both` gives the current secret a signing key if it has none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub signature: Option<Scheme>,
    /// New batch settings; `null` goes back to one event per request.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    pub batch: Option<Option<BatchSpec>>,
}

impl SubscriberPatch {
    /// The names of the fields this PATCH sets (what [`Principal::may_patch`] judges). The
    /// destructuring names every field: one added to the type and not here fails to compile.
    pub fn fields(&self) -> Vec<&'static str> {
        let SubscriberPatch {
            id,
            url,
            event_types,
            rate_per_sec,
            burst,
            max_in_flight,
            timeout_ms,
            lane,
            legacy_signature,
            disabled,
            customer,
            filter,
            customer_filter,
            payload,
            ordering,
            ordering_key,
            propagate_trace,
            signature,
            batch,
        } = self;
        let set: [(&'static str, bool); 19] = [
            ("id", id.is_some()),
            ("url", url.is_some()),
            ("event_types", event_types.is_some()),
            ("rate_per_sec", rate_per_sec.is_some()),
            ("burst", burst.is_some()),
            ("max_in_flight", max_in_flight.is_some()),
            ("timeout_ms", timeout_ms.is_some()),
            ("lane", lane.is_some()),
            ("legacy_signature", legacy_signature.is_some()),
            ("disabled", disabled.is_some()),
            ("customer", customer.is_some()),
            ("filter", filter.is_some()),
            ("customer_filter", customer_filter.is_some()),
            ("payload", payload.is_some()),
            ("ordering", ordering.is_some()),
            ("ordering_key", ordering_key.is_some()),
            ("propagate_trace", propagate_trace.is_some()),
            ("signature", signature.is_some()),
            ("batch", batch.is_some()),
        ];
        set.into_iter()
            .filter(|(_, on)| *on)
            .map(|(f, _)| f)
            .collect()
    }
}

fn validate_customer_ref(customer: &Option<Option<String>>) -> Result<(), ApiError> {
    if let Some(Some(c)) = customer {
        validate_id("customer", c).map_err(ApiError::Invalid)?;
    }
    Ok(())
}

/// A content filter compiles (`null`: none); a refusal names the field and where it is wrong
/// (`filter/amount/$gt: …`, `customer_filter/amount/$gt: …`).
fn validate_filter(
    field: &str,
    filter: &Option<Option<serde_json::Value>>,
) -> Result<(), ApiError> {
    if let Some(Some(f)) = filter {
        crate::event_filter::Filter::compile(f).map_err(|e| {
            let path = e.path.replacen("filter", field, 1);
            ApiError::Invalid(format!("{path}: {}", e.message))
        })?;
    }
    Ok(())
}

/// Batch settings within their bounds. (With ordering, a batch is a run of one key in order.)
fn validate_batch(batch: Option<BatchSpec>) -> Result<(), ApiError> {
    if let Some(b) = batch {
        b.check().map_err(|e| ApiError::Invalid(e.to_string()))?;
    }
    Ok(())
}

fn validate_url(url: &str, allow_loopback: bool) -> Result<(), ApiError> {
    if url.len() > MAX_URL_LEN {
        return Err(ApiError::InvalidUrl(format!(
            "url is longer than {MAX_URL_LEN} characters"
        )));
    }
    check_url(url, allow_loopback)
        .map(|_| ())
        .map_err(|e| ApiError::InvalidUrl(format!("url refused: {e}")))
}

fn validate_types(types: &[String]) -> Result<(), ApiError> {
    if types.is_empty() {
        return Err(ApiError::Invalid(
            "event_types must hold at least one pattern".into(),
        ));
    }
    for t in types {
        validate_pattern(t).map_err(ApiError::Invalid)?;
    }
    Ok(())
}

/// Build a subscriber from a creation request (pure).
pub fn subscriber_from(
    input: SubscriberInput,
    allow_loopback: bool,
    now: i64,
) -> Result<(Subscriber, Option<String>), ApiError> {
    let id = input
        .id
        .ok_or_else(|| ApiError::Invalid("id is missing".into()))?;
    validate_id("id", &id).map_err(ApiError::Invalid)?;
    let url = input
        .url
        .ok_or_else(|| ApiError::Invalid("url is missing".into()))?;
    validate_url(&url, allow_loopback)?;
    let event_types = input
        .event_types
        .ok_or_else(|| ApiError::Invalid("event_types is missing".into()))?;
    validate_types(&event_types)?;
    let rate_per_sec = input.rate_per_sec.unwrap_or(DEFAULT_RATE_PER_SEC);
    let limits = Limits {
        rate_per_sec,
        burst: input
            .burst
            .unwrap_or_else(|| Limits::default_burst(rate_per_sec)),
        max_in_flight: input.max_in_flight.unwrap_or(DEFAULT_MAX_IN_FLIGHT),
        timeout_ms: input.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS),
    };
    limits.validate().map_err(ApiError::Invalid)?;
    if let Some(s) = &input.secret {
        Secret::parse(s).map_err(|e| ApiError::Invalid(format!("secret: {e}")))?;
    }
    validate_customer_ref(&input.customer)?;
    validate_filter("filter", &input.filter)?;
    validate_filter("customer_filter", &input.customer_filter)?;
    let ordering = input.ordering.unwrap_or_default();
    crate::ordering::validate(ordering, input.ordering_key.as_deref())
        .map_err(ApiError::Invalid)?;
    let batch = input.batch.flatten();
    validate_batch(batch)?;
    Ok((
        Subscriber {
            id,
            url,
            event_types,
            limits,
            lane: input.lane.unwrap_or_default(),
            legacy_signature: input.legacy_signature.unwrap_or(false),
            secrets: Vec::new(),
            created_ms: now,
            updated_ms: now,
            health: Default::default(),
            customer: input.customer.flatten(),
            filter: input.filter.flatten(),
            customer_filter: input.customer_filter.flatten(),
            payload: input.payload.unwrap_or_default(),
            ordering,
            ordering_key: input.ordering_key,
            propagate_trace: input.propagate_trace.unwrap_or(false),
            signature: input.signature.unwrap_or_default(),
            batch,
        },
        input.secret,
    ))
}

/// Apply a PATCH to a subscriber (pure). `key_seed`: random bytes for an Ed25519 signing key,
/// used when the PATCH switches to a scheme that signs with one and the current secret has
/// none (the caller draws them when the PATCH names `ed25519` or `both`).
pub fn patched(
    mut s: Subscriber,
    input: SubscriberPatch,
    allow_loopback: bool,
    now: i64,
    who: &Principal,
    key_seed: Option<&[u8; 32]>,
) -> Result<Subscriber, ApiError> {
    if input.id.as_ref().is_some_and(|id| *id != s.id) {
        return Err(ApiError::Invalid("id cannot be changed".into()));
    }
    if let Some(url) = input.url {
        validate_url(&url, allow_loopback)?;
        s.url = url;
    }
    if let Some(types) = input.event_types {
        validate_types(&types)?;
        s.event_types = types;
    }
    if let Some(r) = input.rate_per_sec {
        s.limits.rate_per_sec = r;
    }
    if let Some(b) = input.burst {
        s.limits.burst = b;
    }
    if let Some(m) = input.max_in_flight {
        s.limits.max_in_flight = m;
    }
    if let Some(t) = input.timeout_ms {
        s.limits.timeout_ms = t;
    }
    s.limits.validate().map_err(ApiError::Invalid)?;
    if let Some(l) = input.lane {
        s.lane = l;
    }
    if let Some(l) = input.legacy_signature {
        s.legacy_signature = l;
    }
    if let Some(p) = input.payload {
        s.payload = p;
    }
    if let Some(o) = input.ordering {
        // Another ordering keeps the pointer only if it is `key` again (or a new one is given).
        if o != Ordering::Key {
            s.ordering_key = None;
        }
        s.ordering = o;
    }
    if input.ordering_key.is_some() {
        s.ordering_key = input.ordering_key;
    }
    crate::ordering::validate(s.ordering, s.ordering_key.as_deref()).map_err(ApiError::Invalid)?;
    if let Some(p) = input.propagate_trace {
        s.propagate_trace = p;
    }
    if let Some(scheme) = input.signature {
        s.signature = scheme;
        if let (true, Some(seed)) = (scheme.ed25519(), key_seed) {
            ensure_signing_key(&mut s.secrets, seed);
        }
    }
    if let Some(b) = input.batch {
        s.batch = b;
    }
    validate_batch(s.batch)?;
    validate_customer_ref(&input.customer)?;
    if let Some(c) = input.customer {
        s.customer = c;
    }
    validate_filter("filter", &input.filter)?;
    if let Some(f) = input.filter {
        s.filter = f;
    }
    validate_filter("customer_filter", &input.customer_filter)?;
    if let Some(f) = input.customer_filter {
        s.customer_filter = f;
    }
    match (input.disabled, &s.health.disabled) {
        // What an operator disabled only an operator re-enables.
        (Some(false), Some(d)) if d.by_operator && !who.is_operator() => {
            return Err(ApiError::Forbidden(
                "this endpoint was disabled by the operator: only the operator can re-enable it"
                    .into(),
            ))
        }
        // Re-enabled: a fresh start (no run of failures; the dispatcher closes the breaker).
        (Some(false), Some(_)) => s.health = Default::default(),
        (Some(true), None) => {
            s.health.disabled = Some(Disabled {
                at_ms: now,
                reason: format!("disabled by {}", who.actor()),
                by_operator: who.is_operator(),
            })
        }
        _ => {}
    }
    s.updated_ms = now;
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> SubscriberInput {
        SubscriberInput {
            id: Some("s".into()),
            url: Some("https://example.com/h".into()),
            event_types: Some(vec!["video.*".into()]),
            rate_per_sec: Some(10.0),
            ..Default::default()
        }
    }

    type Edit = fn(&mut SubscriberInput);

    #[test]
    fn subscriber_input_table() {
        let cases: &[(&str, Edit, Result<(), &str>)] = &[
            ("ok", |_| {}, Ok(())),
            ("no id", |i| i.id = None, Err("invalid_request")),
            ("no url", |i| i.url = None, Err("invalid_request")),
            (
                "http refused",
                |i| i.url = Some("http://example.com/h".into()),
                Err("invalid_url"),
            ),
            (
                "private ip",
                |i| i.url = Some("https://10.1.2.3/h".into()),
                Err("invalid_url"),
            ),
            (
                "not a url",
                |i| i.url = Some("nope".into()),
                Err("invalid_url"),
            ),
            (
                "zero rate",
                |i| i.rate_per_sec = Some(0.0),
                Err("invalid_request"),
            ),
            (
                "negative rate",
                |i| i.rate_per_sec = Some(-3.0),
                Err("invalid_request"),
            ),
            ("zero burst", |i| i.burst = Some(0), Err("invalid_request")),
            (
                "zero in flight",
                |i| i.max_in_flight = Some(0),
                Err("invalid_request"),
            ),
            (
                "no types",
                |i| i.event_types = Some(vec![]),
                Err("invalid_request"),
            ),
            (
                "bad pattern",
                |i| i.event_types = Some(vec!["vid*".into()]),
                Err("invalid_request"),
            ),
            (
                "bad secret",
                |i| i.secret = Some("hunter2".into()),
                Err("invalid_request"),
            ),
            (
                "filter",
                |i| i.filter = Some(Some(serde_json::json!({"amount": {"$gt": 5}}))),
                Ok(()),
            ),
            (
                "bad filter",
                |i| i.filter = Some(Some(serde_json::json!({"amount": {"$gt": "5"}}))),
                Err("invalid_request"),
            ),
            (
                "created enabled, said so",
                |i| i.disabled = Some(CreatedEnabled),
                Ok(()),
            ),
        ];
        for (name, edit, expected) in cases {
            let mut input = base();
            edit(&mut input);
            let got = subscriber_from(input, false, 0)
                .map(|_| ())
                .map_err(|e| e.status_and_code().1);
            assert_eq!(&got, expected, "{name}");
        }
    }

    #[test]
    fn patch_rules() {
        let (s, _) = subscriber_from(base(), false, 0).unwrap();
        assert_eq!(
            (s.limits.burst, s.limits.max_in_flight, s.lane),
            (10, DEFAULT_MAX_IN_FLIGHT, Lane::Auto)
        );
        let p = patched(
            s.clone(),
            SubscriberPatch {
                rate_per_sec: Some(-1.0),
                ..Default::default()
            },
            false,
            1,
            &Principal::Admin,
            None,
        );
        assert!(p.is_err());
        // Disable, then re-enable: a fresh start.
        let toggle = |d: bool| SubscriberPatch {
            disabled: Some(d),
            ..Default::default()
        };
        let off = patched(s.clone(), toggle(true), false, 5, &Principal::Admin, None).unwrap();
        let d = off.health.disabled.clone().unwrap();
        assert_eq!((d.at_ms, d.reason.as_str()), (5, "disabled by an operator"));
        let again = patched(off.clone(), toggle(true), false, 9, &Principal::Admin, None).unwrap();
        assert_eq!(again.health.disabled.map(|d| d.at_ms), Some(5));
        assert!(d.by_operator);
        // The customer pauses and resumes its own endpoint, but does not re-enable one the
        // operator disabled.
        let customer = Principal::Portal {
            customer: "acme".into(),
        };
        let paused = patched(s.clone(), toggle(true), false, 5, &customer, None).unwrap();
        assert!(!paused.health.disabled.as_ref().unwrap().by_operator);
        let resumed = patched(paused, toggle(false), false, 6, &customer, None).unwrap();
        assert_eq!(resumed.health.disabled, None);
        assert!(matches!(
            patched(off.clone(), toggle(false), false, 6, &customer, None),
            Err(ApiError::Forbidden(_))
        ));
        let mut failing = off;
        failing.health.failing_since_ms = Some(2);
        let on = patched(failing, toggle(false), false, 6, &Principal::Admin, None).unwrap();
        assert_eq!(on.health, Default::default());
        let mut enabled_failing = s;
        enabled_failing.health.failing_since_ms = Some(2);
        let still = patched(
            enabled_failing,
            toggle(false),
            false,
            6,
            &Principal::Admin,
            None,
        )
        .unwrap();
        assert_eq!(still.health.failing_since_ms, Some(2));
    }

    /// A switch to a scheme that signs with Ed25519 gives the current secret a key when it has
    /// none, and keeps the one it has; a switch back to HMAC keeps the key for later.
    #[test]
    fn signature_patch_table() {
        use crate::model::StoredSecret;
        let (mut s, _) = subscriber_from(base(), false, 0).unwrap();
        assert_eq!(s.signature, Scheme::Hmac);
        let generation = |created_ms, expires_ms, key: Option<&str>| StoredSecret {
            secret: format!("whsec_{created_ms}"),
            created_ms,
            expires_ms,
            signing_key: key.map(str::to_string),
        };
        s.secrets = vec![generation(5, None, None), generation(1, Some(90), None)];
        let to = |scheme| SubscriberPatch {
            signature: Some(scheme),
            ..Default::default()
        };
        let seed = [7u8; 32];
        let keys = |s: &Subscriber| -> Vec<bool> {
            s.secrets.iter().map(|g| g.signing_key.is_some()).collect()
        };
        let ed = patched(
            s.clone(),
            to(Scheme::Ed25519),
            false,
            9,
            &Principal::Admin,
            Some(&seed),
        )
        .unwrap();
        assert_eq!(
            (ed.signature, keys(&ed)),
            (Scheme::Ed25519, vec![true, false])
        );
        let made = ed.secrets[0].signing_key.clone();
        let both = patched(
            ed,
            to(Scheme::Both),
            false,
            10,
            &Principal::Admin,
            Some(&[8u8; 32]),
        )
        .unwrap();
        assert_eq!(both.secrets[0].signing_key, made, "an existing key is kept");
        let back = patched(both, to(Scheme::Hmac), false, 11, &Principal::Admin, None).unwrap();
        assert_eq!(
            (back.signature, keys(&back)),
            (Scheme::Hmac, vec![true, false])
        );
        let hmac = patched(
            s,
            to(Scheme::Hmac),
            false,
            9,
            &Principal::Admin,
            Some(&seed),
        )
        .unwrap();
        assert_eq!(keys(&hmac), vec![false, false], "hmac makes no key");
        let body: SubscriberPatch = serde_json::from_str(r#"{"signature":"both"}"#).unwrap();
        assert_eq!(body.fields(), ["signature"]);
        assert!(serde_json::from_str::<SubscriberPatch>(r#"{"signature":"rsa"}"#).is_err());
    }

    /// The PATCH body as a type: what it refuses, and the fields it names for the portal's rule.
    #[test]
    fn patch_body_table() {
        let cases: &[(&str, Result<Vec<&str>, &str>)] = &[
            (r#"{}"#, Ok(vec![])),
            (r#"{"disabled":true}"#, Ok(vec!["disabled"])),
            (r#"{"customer":null}"#, Ok(vec!["customer"])),
            (r#"{"filter":null}"#, Ok(vec!["filter"])),
            (r#"{"filter":{"a":1}}"#, Ok(vec!["filter"])),
            (
                r#"{"rate_per_sec":5,"burst":10}"#,
                Ok(vec!["rate_per_sec", "burst"]),
            ),
            (r#"{"secret":"whsec_x"}"#, Err("invalid_request")),
            (r#"{"colour":"red"}"#, Err("invalid_request")),
            (r#"{"disabled":"yes"}"#, Err("invalid_request")),
            (r#"{"disabled":"#, Err("malformed_json")),
        ];
        for (body, expected) in cases {
            let got = super::super::body::parse_json::<SubscriberPatch>(body.as_bytes())
                .map(|p| p.fields())
                .map_err(|e| e.status_and_code().1);
            assert_eq!(&got, expected, "{body}");
        }
        let detach: SubscriberPatch = serde_json::from_str(r#"{"customer":null}"#).unwrap();
        assert_eq!(detach.customer, Some(None));
        let keep: SubscriberPatch = serde_json::from_str("{}").unwrap();
        assert_eq!(keep.customer, None);
        // A creation body may say `"disabled": false`, never `true`.
        let create = |body: &str| {
            super::super::body::parse_json::<SubscriberInput>(body.as_bytes())
                .map(|i| i.disabled)
                .map_err(|e| e.status_and_code().1)
        };
        assert_eq!(create(r#"{"disabled":false}"#), Ok(Some(CreatedEnabled)));
        assert_eq!(create(r#"{"disabled":true}"#), Err("invalid_request"));
        assert_eq!(
            serde_json::to_string(&SubscriberInput {
                disabled: Some(CreatedEnabled),
                ..Default::default()
            })
            .unwrap(),
            r#"{"disabled":false}"#
        );
    }
}
