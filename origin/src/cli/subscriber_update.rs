//! `fanout subscriber update ID`: a flag per field the API's PATCH takes, turned into the API's
//! own PATCH type ([`SubscriberUpdate::patch`], pure). Only the flags given change.

use clap::Args;
use fanout_core::batch::BatchSpec;

use super::args::{parse_json_arg, parse_lane, parse_ordering, parse_payload, parse_signature};
use super::client::{ClientArgs, ClientError};
use crate::api::views::SubscriberPatch;
use crate::model::{Lane, Ordering, Payload, Scheme};

#[derive(Debug, Args)]
#[command(
    after_help = "Only the flags given change; every other setting keeps its value. Flags left \
                  out default to unchanged."
)]
pub struct SubscriberUpdate {
    /// The subscriber's id
    pub id: String,
    /// Where its webhooks go from now on [default: unchanged]
    #[arg(long)]
    pub url: Option<String>,
    /// Event type or prefix pattern like video.* (repeatable; the list replaces the current
    /// one) [default: unchanged]
    #[arg(long = "event-type", short = 't')]
    pub event_types: Vec<String>,
    /// Requests per second, on average (0.0001 to 1000000) [default: unchanged]
    #[arg(long)]
    pub rate_per_sec: Option<f64>,
    /// Requests that may go at once after a quiet spell, above the rate (1 to 1000000)
    /// [default: unchanged]
    #[arg(long)]
    pub burst: Option<u32>,
    /// Requests in flight at once, at most (1 to 1000000) [default: unchanged]
    #[arg(long)]
    pub max_in_flight: Option<u32>,
    /// How long one request may take, in milliseconds (100 to 60000) [default: unchanged]
    #[arg(long)]
    pub timeout_ms: Option<u64>,
    /// edge, origin or auto [default: unchanged]
    #[arg(long, value_parser = parse_lane)]
    pub lane: Option<Lane>,
    /// true disables it (it is sent nothing; its deliveries wait), false re-enables it
    /// [default: unchanged]
    #[arg(long, value_name = "true|false")]
    pub disabled: Option<bool>,
    /// Move it to this customer [default: unchanged]
    #[arg(long, conflicts_with = "no_customer")]
    pub customer: Option<String>,
    /// Detach it from its customer
    #[arg(long)]
    pub no_customer: bool,
    /// The operator's content filter (JSON), or null to remove it [default: unchanged]
    #[arg(long, value_parser = parse_json_arg)]
    pub filter: Option<serde_json::Value>,
    /// The customer's own content filter (JSON), or null to remove it [default: unchanged]
    #[arg(long, value_parser = parse_json_arg)]
    pub customer_filter: Option<serde_json::Value>,
    /// full or thin [default: unchanged]
    #[arg(long, value_parser = parse_payload)]
    pub payload: Option<Payload>,
    /// none, subscriber or key (with --ordering-key); applies to events ingested after it
    /// [default: unchanged]
    #[arg(long, value_parser = parse_ordering)]
    pub ordering: Option<Ordering>,
    /// With ordering key: a JSON Pointer into the event naming the key [default: unchanged]
    #[arg(long)]
    pub ordering_key: Option<String>,
    /// hmac, ed25519 or both (ed25519 and both give it a public key) [default: unchanged]
    #[arg(long, value_parser = parse_signature)]
    pub signature: Option<Scheme>,
    /// Also send the legacy X-Fanout-Signature header: true or false [default: unchanged]
    #[arg(long, value_name = "true|false")]
    pub legacy_signature: Option<bool>,
    /// Send each webhook the traceparent its event arrived with: true or false
    /// [default: unchanged]
    #[arg(long, value_name = "true|false")]
    pub propagate_trace: Option<bool>,
    /// Batch up to this many events per request (1-1000); the batch settings are replaced
    /// as a whole [default: unchanged]
    #[arg(long, conflicts_with = "no_batch")]
    pub batch_max_events: Option<u32>,
    /// With --batch-max-events: at most this many bytes of body per request [default: 1 MiB]
    #[arg(long, requires = "batch_max_events")]
    pub batch_max_bytes: Option<u32>,
    /// With --batch-max-events: wait up to this many ms for more events [default: 0]
    #[arg(long, requires = "batch_max_events")]
    pub batch_max_wait_ms: Option<u32>,
    /// Go back to one event per request
    #[arg(long)]
    pub no_batch: bool,
    /// Print the daemon's JSON instead of one line per field
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

impl SubscriberUpdate {
    /// The API's PATCH body for these flags (pure); an update that changes nothing is refused
    /// here, before any call.
    pub fn patch(&self) -> Result<SubscriberPatch, ClientError> {
        let json_or_null =
            |v: &Option<serde_json::Value>| v.clone().map(|f| (!f.is_null()).then_some(f));
        let batch = match (self.no_batch, self.batch_max_events) {
            (true, _) => Some(None),
            (false, Some(max_events)) => Some(Some(BatchSpec {
                max_events,
                max_bytes: self
                    .batch_max_bytes
                    .unwrap_or(fanout_core::batch::MAX_BYTES),
                max_wait_ms: self.batch_max_wait_ms.unwrap_or(0),
            })),
            (false, None) => None,
        };
        let patch = SubscriberPatch {
            url: self.url.clone(),
            event_types: (!self.event_types.is_empty()).then(|| self.event_types.clone()),
            rate_per_sec: self.rate_per_sec,
            burst: self.burst,
            max_in_flight: self.max_in_flight,
            timeout_ms: self.timeout_ms,
            lane: self.lane,
            legacy_signature: self.legacy_signature,
            disabled: self.disabled,
            customer: match (self.no_customer, &self.customer) {
                (true, _) => Some(None),
                (false, c) => c.clone().map(Some),
            },
            filter: json_or_null(&self.filter),
            customer_filter: json_or_null(&self.customer_filter),
            payload: self.payload,
            ordering: self.ordering,
            ordering_key: self.ordering_key.clone(),
            propagate_trace: self.propagate_trace,
            signature: self.signature,
            batch,
            id: None,
        };
        if patch.fields().is_empty() {
            return Err(ClientError::Input(
                "nothing to change: give at least one flag (`fanout subscriber update --help` \
                 lists them)"
                    .into(),
            ));
        }
        Ok(patch)
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;
    use serde_json::json;

    use crate::cli::{Cli, Command, SubscriberCommand};

    /// The PATCH body `fanout subscriber update ARGS…` sends, or its error as text.
    fn body(args: &[&str]) -> Result<serde_json::Value, String> {
        let words = ["fanout", "subscriber", "update", "s1"]
            .into_iter()
            .chain(args.iter().copied());
        let cli = Cli::try_parse_from(words).map_err(|e| e.kind().to_string())?;
        let Command::Subscriber {
            command: SubscriberCommand::Update(u),
        } = cli.command
        else {
            return Err("not an update".into());
        };
        let patch = u.patch().map_err(|e| e.to_string())?;
        serde_json::to_value(patch).map_err(|e| e.to_string())
    }

    #[test]
    fn update_flags_become_the_patch() {
        let cases: Vec<(&[&str], serde_json::Value)> = vec![
            (
                &["--rate-per-sec", "2.5", "--burst", "5"],
                json!({ "rate_per_sec": 2.5, "burst": 5 }),
            ),
            (
                &["--max-in-flight", "3", "--timeout-ms", "2000"],
                json!({ "max_in_flight": 3, "timeout_ms": 2000 }),
            ),
            (
                &["-t", "a.*", "-t", "b", "--url", "https://x.example/h"],
                json!({ "event_types": ["a.*", "b"], "url": "https://x.example/h" }),
            ),
            (&["--no-customer"], json!({ "customer": null })),
            (&["--customer", "acme"], json!({ "customer": "acme" })),
            (&["--filter", "null"], json!({ "filter": null })),
            (
                &["--customer-filter", r#"{"a":1}"#],
                json!({ "customer_filter": { "a": 1 } }),
            ),
            (
                &["--disabled", "true", "--legacy-signature", "false"],
                json!({ "disabled": true, "legacy_signature": false }),
            ),
            (
                &[
                    "--ordering",
                    "key",
                    "--ordering-key",
                    "/k",
                    "--lane",
                    "edge",
                ],
                json!({ "ordering": "key", "ordering_key": "/k", "lane": "edge" }),
            ),
            (
                &[
                    "--signature",
                    "both",
                    "--payload",
                    "thin",
                    "--propagate-trace",
                    "true",
                ],
                json!({ "signature": "both", "payload": "thin", "propagate_trace": true }),
            ),
            (
                &["--batch-max-events", "10", "--batch-max-wait-ms", "50"],
                json!({ "batch": { "max_events": 10, "max_bytes": 1_048_576, "max_wait_ms": 50 } }),
            ),
            (&["--no-batch"], json!({ "batch": null })),
        ];
        for (args, expected) in cases {
            assert_eq!(body(args), Ok(expected), "{args:?}");
        }
    }

    #[test]
    fn an_update_that_changes_nothing_or_contradicts_itself_is_refused() {
        assert!(body(&[]).is_err_and(|e| e.contains("nothing to change")));
        for args in [
            &["--customer", "a", "--no-customer"][..],
            &["--no-batch", "--batch-max-events", "2"],
            &["--batch-max-bytes", "2"],
            &["--disabled", "maybe"],
        ] {
            assert!(body(args).is_err(), "{args:?}");
        }
    }
}
