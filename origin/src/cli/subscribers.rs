//! `fanout subscriber add|list|show|update|remove|secret|filter`, and what each prints for a
//! person (pure); `update`'s flags are `subscriber_update.rs`.

use clap::{Args, Subcommand};
use fanout_core::batch::BatchSpec;

use super::args::{parse_json_arg, parse_lane, parse_ordering, parse_payload, parse_signature};
use super::client::{encode, print, view, Client, ClientArgs, ClientError};
use crate::api::views::{Deleted, SubscriberInput, SubscriberList, SubscriberView};
use crate::model::{Lane, Ordering, Payload, Scheme};
use crate::term::human_number;
use crate::time::format_rfc3339;

#[derive(Debug, Subcommand)]
pub enum SubscriberCommand {
    /// Add a subscriber; prints a line about it and its generated secret (once), or the
    /// daemon's JSON with --json
    Add(SubscriberAdd),
    /// List subscribers
    List {
        /// Print the daemon's JSON instead of a table
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show one subscriber: every setting, its state and its public key
    Show {
        /// The subscriber's id
        id: String,
        /// Print the daemon's JSON instead of one line per field
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Change a subscriber: only the fields given change; prints the subscriber
    Update(super::subscriber_update::SubscriberUpdate),
    /// Remove a subscriber (its unfinished deliveries go dead)
    Remove {
        /// The subscriber's id
        id: String,
        /// Print the daemon's JSON instead of a line
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Print a subscriber's active signing secrets, newest first (a rotated-out one with the
    /// time it stops signing), each with its Ed25519 public key when it has one
    Secret {
        /// The subscriber's id
        id: String,
        /// Print the daemon's JSON instead of one line per secret
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Set a subscriber's content filter (a JSON object, see the manual's "Content filters"),
    /// or remove it with `null`; prints the subscriber
    Filter {
        /// The subscriber's id
        id: String,
        /// The filter, e.g. '{"amount": {"$gt": 100}}', or null
        #[arg(value_parser = parse_json_arg)]
        filter: serde_json::Value,
        /// Print the daemon's JSON instead of one line per field
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        client: ClientArgs,
    },
}

#[derive(Debug, Args)]
pub struct SubscriberAdd {
    /// The subscriber's id (letters, digits, `_`, `-`, `.`)
    pub id: String,
    /// Where its webhooks go (https://…; http:// and loopback only with the daemon's
    /// --allow-loopback)
    pub url: String,
    /// Event type or prefix pattern like video.* (repeatable) [default: *]
    #[arg(long = "event-type", short = 't')]
    pub event_types: Vec<String>,
    /// Requests per second the subscriber is sent at most, on average (0.0001 to 1000000)
    /// [default: 100]
    #[arg(long)]
    pub rate_per_sec: Option<f64>,
    /// Requests that may go at once after a quiet spell, above the rate (1 to 1000000)
    /// [default: the rate, rounded up, at least 1]
    #[arg(long)]
    pub burst: Option<u32>,
    /// Requests to the subscriber in flight at once, at most (1 to 1000000) [default: 16]
    #[arg(long)]
    pub max_in_flight: Option<u32>,
    /// How long one request may take before it counts as failed and is retried, in
    /// milliseconds (100 to 60000) [default: 10000]
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// Which side sends its webhooks: edge, origin or auto [default: auto]
    #[arg(long, value_parser = parse_lane)]
    pub lane: Option<Lane>,
    /// Also send the legacy X-Fanout-Signature header
    #[arg(long)]
    pub legacy_signature: bool,
    /// The customer that owns this endpoint (see `fanout customer add`) [default: none]
    #[arg(long)]
    pub customer: Option<String>,
    /// Print the daemon's JSON (the subscriber with its secret) instead of a line for a person
    #[arg(long)]
    pub json: bool,
    /// Deliver only events whose body matches this content filter (JSON, see the manual's
    /// "Content filters") [default: none, every event]
    #[arg(long, value_parser = parse_json_arg)]
    pub filter: Option<serde_json::Value>,
    /// The customer's own content filter: an event must match both [default: none]
    #[arg(long, value_parser = parse_json_arg)]
    pub customer_filter: Option<serde_json::Value>,
    /// full (the event's body) or thin ({"id","type","timestamp"} and the daemon's
    /// --event-url) [default: full]
    #[arg(long, value_parser = parse_payload)]
    pub payload: Option<Payload>,
    /// none, subscriber (one delivery at a time) or key (one at a time per --ordering-key)
    /// [default: none]
    #[arg(long, value_parser = parse_ordering)]
    pub ordering: Option<Ordering>,
    /// With --ordering key: a JSON Pointer into the event naming the key, e.g. /video_id
    /// [default: none]
    #[arg(long)]
    pub ordering_key: Option<String>,
    /// Send each webhook the W3C traceparent its event arrived with (OpenTelemetry)
    #[arg(long)]
    pub propagate_trace: bool,
    /// hmac (v1), ed25519 (v1a, verified with the public key it prints) or both
    /// [default: hmac]
    #[arg(long, value_parser = parse_signature)]
    pub signature: Option<Scheme>,
    /// Batch up to this many events per request (1-1000): one signed {"events":[...]}, one
    /// request against the rate and the in-flight cap [default: none, one event per request]
    #[arg(long)]
    pub batch_max_events: Option<u32>,
    /// With --batch-max-events: at most this many bytes of body per request [default: 1 MiB]
    #[arg(long, requires = "batch_max_events")]
    pub batch_max_bytes: Option<u32>,
    /// With --batch-max-events: wait up to this many ms for more events [default: 0]
    #[arg(long, requires = "batch_max_events")]
    pub batch_max_wait_ms: Option<u32>,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `fanout subscriber …`: each subcommand is its own function below.
pub(super) async fn run(command: SubscriberCommand) -> Result<(), ClientError> {
    match command {
        SubscriberCommand::Add(a) => subscriber_add(a).await,
        SubscriberCommand::List { json, client } => subscriber_list(&client, json).await,
        SubscriberCommand::Show { id, json, client } => {
            let path = format!("/v1/subscribers/{}", encode(&id));
            let v: SubscriberView = Client::new(&client)?
                .call(reqwest::Method::GET, &path, None)
                .await?;
            show(&v, json);
            Ok(())
        }
        SubscriberCommand::Update(a) => {
            let body =
                serde_json::to_vec(&a.patch()?).map_err(|e| ClientError::Input(e.to_string()))?;
            let path = format!("/v1/subscribers/{}", encode(&a.id));
            let v: SubscriberView = Client::new(&a.client)?
                .call(reqwest::Method::PATCH, &path, Some(body))
                .await?;
            show(&v, a.json);
            Ok(())
        }
        SubscriberCommand::Remove { id, json, client } => {
            subscriber_remove(&client, &id, json).await
        }
        SubscriberCommand::Secret { id, json, client } => {
            subscriber_secret(&id, json, &client).await
        }
        SubscriberCommand::Filter {
            id,
            filter,
            json,
            client,
        } => subscriber_filter(&id, filter, json, &client).await,
    }
}

/// A subscriber for a person, or the daemon's JSON.
fn show(v: &SubscriberView, json: bool) {
    if json {
        print(v);
    } else {
        print!("{}", subscriber_detail(v));
    }
}

/// `fanout subscriber add`: prints the new subscriber with its secret, for a person or as JSON.
async fn subscriber_add(a: SubscriberAdd) -> Result<(), ClientError> {
    let client = Client::new(&a.client)?;
    let input = SubscriberInput {
        id: Some(a.id),
        url: Some(a.url),
        event_types: Some(if a.event_types.is_empty() {
            vec!["*".to_string()]
        } else {
            a.event_types
        }),
        rate_per_sec: a.rate_per_sec,
        burst: a.burst,
        max_in_flight: a.max_in_flight,
        timeout_ms: a.timeout_ms,
        lane: a.lane,
        legacy_signature: a.legacy_signature.then_some(true),
        customer: a.customer.map(Some),
        filter: a.filter.map(Some),
        customer_filter: a.customer_filter.map(Some),
        payload: a.payload,
        ordering: a.ordering,
        ordering_key: a.ordering_key,
        propagate_trace: a.propagate_trace.then_some(true),
        signature: a.signature,
        batch: a.batch_max_events.map(|max_events| {
            Some(BatchSpec {
                max_events,
                max_bytes: a.batch_max_bytes.unwrap_or(fanout_core::batch::MAX_BYTES),
                max_wait_ms: a.batch_max_wait_ms.unwrap_or(0),
            })
        }),
        ..SubscriberInput::default()
    };
    let body = serde_json::to_vec(&input).map_err(|e| ClientError::Input(e.to_string()))?;
    let created: SubscriberView = client
        .call(reqwest::Method::POST, "/v1/subscribers", Some(body))
        .await?;
    if a.json {
        print(&created);
    } else {
        print!("{}", added_lines(&created));
    }
    Ok(())
}

/// What `fanout subscriber add` tells a person (pure): one line about the subscriber, for an
/// Ed25519 scheme the public key its receiver verifies with, then its secret alone on the last
/// line (shown here once), so `| tail -n 1` takes it.
pub fn added_lines(v: &SubscriberView) -> String {
    let mut out = format!(
        "added subscriber {}: {} -> {} (lane {}, {}/s, burst {}, {} in flight{})\n",
        v.id,
        v.event_types.join(","),
        v.url,
        v.lane.as_str(),
        human_number(v.rate_per_sec),
        v.burst,
        v.max_in_flight,
        v.customer
            .as_ref()
            .map_or(String::new(), |c| format!(", customer {c}")),
    );
    if let Some(b) = &v.batch {
        out.push_str(&format!(
            "it gets batches of up to {} events or {} bytes, waiting up to {} ms for more\n",
            b.max_events, b.max_bytes, b.max_wait_ms
        ));
    }
    if let (true, Some(key)) = (v.signature.ed25519(), &v.public_key) {
        out.push_str(&format!(
            "it signs with {} (v1a): verify with its public key\n{key}\n",
            v.signature.as_str()
        ));
    }
    if let Some(secret) = &v.secret {
        out.push_str(&format!(
            "its signing secret (`fanout subscriber secret {}` prints it again):\n{secret}\n",
            v.id
        ));
    }
    out
}

/// `fanout subscriber list`.
async fn subscriber_list(client: &ClientArgs, json: bool) -> Result<(), ClientError> {
    let list: SubscriberList = Client::new(client)?
        .call(reqwest::Method::GET, "/v1/subscribers", None)
        .await?;
    if json {
        print(&list);
    } else {
        print!("{}", subscribers_table(&list));
    }
    Ok(())
}

/// `fanout subscriber remove`.
async fn subscriber_remove(client: &ClientArgs, id: &str, json: bool) -> Result<(), ClientError> {
    let path = format!("/v1/subscribers/{}", encode(id));
    let deleted: Deleted = Client::new(client)?
        .call(reqwest::Method::DELETE, &path, None)
        .await?;
    if json {
        print(&deleted);
    } else {
        println!(
            "removed subscriber {}; {} unfinished deliveries went dead",
            deleted.id, deleted.deliveries_dead
        );
    }
    Ok(())
}

/// `fanout subscriber filter ID FILTER`: `PATCH {"filter": …}` (`null` removes it).
async fn subscriber_filter(
    id: &str,
    filter: serde_json::Value,
    json: bool,
    client: &ClientArgs,
) -> Result<(), ClientError> {
    let path = format!("/v1/subscribers/{}", encode(id));
    let patch = crate::api::views::SubscriberPatch {
        filter: Some((!filter.is_null()).then_some(filter)),
        ..Default::default()
    };
    let body = serde_json::to_vec(&patch).map_err(|e| ClientError::Input(e.to_string()))?;
    let changed: SubscriberView = Client::new(client)?
        .call(reqwest::Method::PATCH, &path, Some(body))
        .await?;
    show(&changed, json);
    Ok(())
}

/// `fanout subscriber secret ID`: `GET /v1/subscribers/{id}/secret`, read as its view.
async fn subscriber_secret(id: &str, json: bool, client: &ClientArgs) -> Result<(), ClientError> {
    let path = format!("/v1/subscribers/{}/secret", encode(id));
    let v = Client::new(client)?
        .call(reqwest::Method::GET, &path, None)
        .await?;
    let secrets: crate::model::SecretsView = view(v)?;
    if json {
        print(&secrets);
    } else {
        // The public keys matter to a receiver only when the subscriber signs with them.
        let sub: SubscriberView = Client::new(client)?
            .call(
                reqwest::Method::GET,
                &format!("/v1/subscribers/{}", encode(id)),
                None,
            )
            .await?;
        print!("{}", secrets_lines(&secrets, sub.signature.ed25519()));
    }
    Ok(())
}

/// One line per secret, newest first: the secret, a tab, `current` or `until <RFC 3339>`, and
/// for a subscriber that signs with Ed25519 (`with_keys`), a tab and the `whpk_` public key of
/// the secret's generation (pure).
pub fn secrets_lines(v: &crate::model::SecretsView, with_keys: bool) -> String {
    v.secrets
        .iter()
        .map(|s| {
            let when = match s.expires_at_ms {
                None => "current".to_string(),
                Some(ms) => format!("until {}", format_rfc3339(ms)),
            };
            match (&s.public_key, with_keys) {
                (Some(key), true) => format!("{}\t{when}\t{key}\n", s.secret),
                _ => format!("{}\t{when}\n", s.secret),
            }
        })
        .collect()
}

/// `fanout subscriber show` (and `update`, `filter`) for a person: one field a line, named
/// as in the API's JSON, times in RFC 3339 UTC (pure).
pub fn subscriber_detail(v: &SubscriberView) -> String {
    let json_or_none = |f: &Option<serde_json::Value>| {
        f.as_ref().map_or("none".to_string(), |f| {
            serde_json::to_string(f).unwrap_or_default()
        })
    };
    let state = match (&v.disabled_reason, v.disabled_at_ms) {
        _ if !v.disabled => "enabled".to_string(),
        (Some(reason), Some(at)) => format!("disabled since {}: {reason}", format_rfc3339(at)),
        (Some(reason), None) => format!("disabled: {reason}"),
        (None, _) => "disabled".to_string(),
    };
    let fields: Vec<(&str, String)> = vec![
        ("id", v.id.clone()),
        ("url", v.url.clone()),
        ("event_types", v.event_types.join(",")),
        (
            "customer",
            v.customer.clone().unwrap_or_else(|| "none".into()),
        ),
        ("lane", v.lane.as_str().into()),
        ("rate_per_sec", human_number(v.rate_per_sec)),
        ("burst", v.burst.to_string()),
        ("max_in_flight", v.max_in_flight.to_string()),
        ("timeout_ms", v.timeout_ms.to_string()),
        ("state", state),
        (
            "failing_since",
            v.failing_since_ms.map_or("-".into(), format_rfc3339),
        ),
        ("payload", v.payload.as_str().into()),
        (
            "ordering",
            match &v.ordering_key {
                Some(key) => format!("{} {key}", v.ordering.as_str()),
                None => v.ordering.as_str().into(),
            },
        ),
        (
            "batch",
            v.batch.map_or("none".into(), |b| {
                format!(
                    "up to {} events or {} bytes, waiting up to {} ms",
                    b.max_events, b.max_bytes, b.max_wait_ms
                )
            }),
        ),
        ("filter", json_or_none(&v.filter)),
        ("customer_filter", json_or_none(&v.customer_filter)),
        ("signature", v.signature.as_str().into()),
        (
            "public_key",
            v.public_key.clone().unwrap_or_else(|| "none".into()),
        ),
        ("active_secrets", v.active_secrets.to_string()),
        ("legacy_signature", v.legacy_signature.to_string()),
        ("propagate_trace", v.propagate_trace.to_string()),
        ("created_at", format_rfc3339(v.created_at_ms)),
        ("updated_at", format_rfc3339(v.updated_at_ms)),
    ];
    fields
        .into_iter()
        .map(|(k, v)| format!("{k:<18}{v}\n"))
        .collect()
}

/// `fanout subscriber list` as a table (pure).
pub fn subscribers_table(list: &SubscriberList) -> String {
    if list.subscribers.is_empty() {
        return "no subscribers\n".into();
    }
    let rows: Vec<Vec<String>> = list
        .subscribers
        .iter()
        .map(|s| {
            let v = &s.view;
            vec![
                v.id.clone(),
                v.lane.as_str().into(),
                human_number(v.rate_per_sec),
                v.burst.to_string(),
                v.max_in_flight.to_string(),
                v.event_types.join(","),
                v.url.clone(),
            ]
        })
        .collect();
    crate::term::table(
        &[
            "ID",
            "LANE",
            "RATE/S",
            "BURST",
            "MAX IN FLIGHT",
            "EVENT TYPES",
            "URL",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn added_lines_table() {
        // Built the way the daemon builds it, so a field added to the view needs no edit here.
        let (sub, _) = crate::api::subscriber_input::subscriber_from(
            SubscriberInput {
                id: Some("partner".into()),
                url: Some("https://partner.example/hooks".into()),
                event_types: Some(vec!["video.*".into(), "order.paid".into()]),
                rate_per_sec: Some(2.5),
                burst: Some(5),
                max_in_flight: Some(8),
                lane: Some(Lane::Edge),
                ..SubscriberInput::default()
            },
            false,
            1,
        )
        .unwrap();
        let created = SubscriberView::of(&sub, 1, Some("whsec_abc".into()));
        let owned = SubscriberView {
            customer: Some("acme".into()),
            secret: None,
            ..created.clone()
        };
        let asymmetric = SubscriberView {
            signature: Scheme::Both,
            public_key: Some("whpk_abc".into()),
            ..created.clone()
        };
        let cases: &[(&SubscriberView, &str)] = &[
            (
                &created,
                "added subscriber partner: video.*,order.paid -> https://partner.example/hooks \
                 (lane edge, 2.5/s, burst 5, 8 in flight)\n\
                 its signing secret (`fanout subscriber secret partner` prints it again):\n\
                 whsec_abc\n",
            ),
            (
                &owned,
                "added subscriber partner: video.*,order.paid -> https://partner.example/hooks \
                 (lane edge, 2.5/s, burst 5, 8 in flight, customer acme)\n",
            ),
            (
                &asymmetric,
                "added subscriber partner: video.*,order.paid -> https://partner.example/hooks \
                 (lane edge, 2.5/s, burst 5, 8 in flight)\n\
                 it signs with both (v1a): verify with its public key\n\
                 whpk_abc\n\
                 its signing secret (`fanout subscriber secret partner` prints it again):\n\
                 whsec_abc\n",
            ),
        ];
        for (view, expected) in cases {
            assert_eq!(added_lines(view), *expected);
        }
    }

    #[test]
    fn secrets_as_lines() {
        use crate::model::{SecretView, SecretsView};
        let v = SecretsView {
            secrets: vec![
                SecretView {
                    secret: "whsec_new".into(),
                    expires_at_ms: None,
                    public_key: None,
                },
                SecretView {
                    secret: "whsec_old".into(),
                    expires_at_ms: Some(1_700_000_000_000),
                    public_key: None,
                },
            ],
        };
        assert_eq!(
            secrets_lines(&v, false),
            "whsec_new\tcurrent\nwhsec_old\tuntil 2023-11-14T22:13:20.000Z\n"
        );
        let asymmetric = SecretsView {
            secrets: vec![SecretView {
                secret: "whsec_new".into(),
                expires_at_ms: None,
                public_key: Some("whpk_new".into()),
            }],
        };
        assert_eq!(
            secrets_lines(&asymmetric, true),
            "whsec_new\tcurrent\twhpk_new\n"
        );
        assert_eq!(secrets_lines(&asymmetric, false), "whsec_new\tcurrent\n");
        assert_eq!(secrets_lines(&SecretsView { secrets: vec![] }, true), "");
    }
}
