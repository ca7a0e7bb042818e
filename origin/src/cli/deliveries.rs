//! `fanout deliveries` (a page of deliveries, or one with its attempts) and `fanout replay`
//! (one by id, or every match of the filters, call after call), and their tables (pure).

use clap::Args;
use serde_json::json;

use super::client::{encode, print, query, Client, ClientArgs, ClientError};
use crate::api::views::{DeliveryList, DeliveryView, Replayed, ReplayedOne};
use crate::term::or_dash;
use crate::time::format_rfc3339;

#[derive(Debug, Args)]
pub struct DeliveriesArgs {
    /// Only deliveries in this state: pending, in_flight, sent or dead
    /// [default: any]
    #[arg(long)]
    pub status: Option<String>,
    /// Only this subscriber's deliveries [default: every subscriber's]
    #[arg(long)]
    pub subscriber: Option<String>,
    /// Only the deliveries of this event id [default: every event's]
    #[arg(long)]
    pub event: Option<String>,
    /// Only deliveries created at or after this time: RFC 3339 or unix ms [default: no bound]
    #[arg(long)]
    pub since: Option<String>,
    /// Only deliveries created before this time: RFC 3339 or unix ms [default: no bound]
    #[arg(long)]
    pub until: Option<String>,
    /// Most deliveries to list (1 to 10000) [default: 1000]
    #[arg(long)]
    pub limit: Option<usize>,
    /// The page after this delivery id: the `next` a page ended with [default: the first page]
    #[arg(long)]
    pub after: Option<String>,
    /// Show one delivery (dlv_…) with its attempts, instead of a list [default: none]
    #[arg(long)]
    pub id: Option<String>,
    /// Print the daemon's JSON instead of a table
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// One delivery (dlv_…); without it, every match of the filters
    pub id: Option<String>,
    /// Only this subscriber's deliveries [default: every subscriber's]
    #[arg(long)]
    pub subscriber: Option<String>,
    /// dead or sent [default: dead]
    #[arg(long)]
    pub status: Option<String>,
    /// Only deliveries created at or after this time: RFC 3339 or unix ms [default: no bound]
    #[arg(long)]
    pub since: Option<String>,
    /// Only deliveries created before this time: RFC 3339 or unix ms [default: no bound]
    #[arg(long)]
    pub until: Option<String>,
    /// Print the daemon's JSON instead of a line
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `fanout deliveries`: one delivery with its attempts, or a page of them.
pub(super) async fn deliveries(a: DeliveriesArgs) -> Result<(), ClientError> {
    let client = Client::new(&a.client)?;
    match &a.id {
        Some(id) => {
            let d: DeliveryView = client
                .call(
                    reqwest::Method::GET,
                    &format!("/v1/deliveries/{}", encode(id)),
                    None,
                )
                .await?;
            if a.json {
                print(&d);
            } else {
                print!("{}", delivery_detail(&d));
            }
        }
        None => {
            let limit = a.limit.map(|l| l.to_string());
            let q = query(&[
                ("status", &a.status),
                ("subscriber", &a.subscriber),
                ("event", &a.event),
                ("since", &a.since),
                ("until", &a.until),
                ("limit", &limit),
                ("after", &a.after),
            ]);
            let page: DeliveryList = client
                .call(reqwest::Method::GET, &format!("/v1/deliveries{q}"), None)
                .await?;
            if a.json {
                print(&page);
            } else {
                print!("{}", deliveries_table(&page));
            }
        }
    }
    Ok(())
}

/// `fanout replay`: one delivery by id, or every one matching the filters.
pub(super) async fn replay(a: ReplayArgs) -> Result<(), ClientError> {
    let client = Client::new(&a.client)?;
    match &a.id {
        Some(id) => {
            let one: ReplayedOne = client
                .call(
                    reqwest::Method::POST,
                    &format!("/v1/deliveries/{}/replay", encode(id)),
                    None,
                )
                .await?;
            if a.json {
                print(&one);
            } else {
                println!("delivery {} is {} again", one.id, one.status.as_str());
            }
        }
        None => {
            let mut body = json!({ "subscriber": a.subscriber, "status": a.status, "since": a.since, "until": a.until });
            let progress = crate::term::spinner("replaying…");
            // The daemon replays at most REPLAY_PER_CALL per call and says where to go on.
            let mut total = 0;
            let replayed = loop {
                let step = client
                    .call::<Replayed>(
                        reqwest::Method::POST,
                        "/v1/replay",
                        Some(body.to_string().into_bytes()),
                    )
                    .await;
                match step {
                    Ok(r) if r.more => {
                        total += r.replayed;
                        body["after"] = json!(r.next);
                    }
                    Ok(r) => {
                        break Ok(Replayed {
                            replayed: total + r.replayed,
                            ..r
                        })
                    }
                    Err(e) => break Err(e),
                }
            };
            progress.finish_and_clear();
            let replayed = replayed?;
            if a.json {
                print(&replayed);
            } else {
                println!("replayed {} deliveries", replayed.replayed);
            }
        }
    }
    Ok(())
}

/// `fanout deliveries` as a table (pure); says how to get the next page.
pub fn deliveries_table(page: &DeliveryList) -> String {
    if page.deliveries.is_empty() {
        return "no deliveries\n".into();
    }
    let rows: Vec<Vec<String>> = page
        .deliveries
        .iter()
        .map(|d| {
            vec![
                d.id.clone(),
                d.subscriber_id.clone(),
                d.event_id.clone(),
                d.event_type.clone(),
                d.status.as_str().into(),
                d.attempt_count.to_string(),
                d.last_error
                    .as_deref()
                    .map(|e| crate::term::clip(e, 60))
                    .unwrap_or_default(),
            ]
        })
        .collect();
    let mut out = crate::term::table(
        &[
            "ID",
            "SUBSCRIBER",
            "EVENT",
            "TYPE",
            "STATUS",
            "ATTEMPTS",
            "LAST ERROR",
        ],
        &rows,
    );
    if let Some(next) = &page.next {
        out.push_str(&format!(
            "({} shown; the next page: --after {next})\n",
            page.deliveries.len()
        ));
    }
    out
}

/// One delivery with its attempts (pure).
pub fn delivery_detail(d: &DeliveryView) -> String {
    let mut out = String::new();
    for (key, value) in [
        ("id", d.id.clone()),
        ("subscriber_id", d.subscriber_id.clone()),
        ("event_id", d.event_id.clone()),
        ("event_type", d.event_type.clone()),
        ("sequence", d.sequence.to_string()),
        ("status", d.status.as_str().into()),
        ("attempt_count", d.attempt_count.to_string()),
        (
            "next_attempt_at",
            or_dash(d.next_attempt_at_ms.map(format_rfc3339)),
        ),
        ("last_error", or_dash(d.last_error.as_deref())),
        ("created_at", format_rfc3339(d.created_at_ms)),
        ("updated_at", format_rfc3339(d.updated_at_ms)),
    ] {
        out.push_str(&format!("{key:<20}{value}\n"));
    }
    let rows: Vec<Vec<String>> = d
        .attempts
        .iter()
        .flatten()
        .map(|a| {
            vec![
                a.attempt.to_string(),
                format_rfc3339(a.at_ms),
                a.lane.as_str().into(),
                a.outcome.as_str().into(),
                or_dash(a.status),
                or_dash(a.latency_ms),
                a.error.clone().unwrap_or_default(),
                a.response_body
                    .as_deref()
                    .map(|b| crate::term::clip(b, 60))
                    .unwrap_or_default(),
            ]
        })
        .collect();
    if !rows.is_empty() {
        out.push('\n');
        out.push_str(&crate::term::table(
            &[
                "ATTEMPT", "AT", "LANE", "OUTCOME", "STATUS", "LATENCY", "ERROR", "BODY",
            ],
            &rows,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::views::AttemptRecordView;
    use crate::model::{AttemptOutcome, Lane, Status};

    #[test]
    fn deliveries_table_and_detail() {
        let dead = DeliveryView {
            id: "dlv_1".into(),
            subscriber_id: "s".into(),
            event_id: "e1".into(),
            event_type: "video.x".into(),
            status: Status::Dead,
            attempt_count: 3,
            next_attempt_at_ms: None,
            last_error: Some("gone".into()),
            created_at_ms: 0,
            updated_at_ms: 0,
            sequence: 4,
            ordering_key: None,
            previous_sequence: None,
            held: false,
            attempts: None,
        };
        let v = DeliveryList {
            deliveries: vec![dead.clone()],
            next: Some("dlv_1".into()),
        };
        let t = deliveries_table(&v);
        assert!(
            t.starts_with("ID     SUBSCRIBER  EVENT  TYPE     STATUS  ATTEMPTS  LAST ERROR\n"),
            "{t}"
        );
        assert!(
            t.contains("dlv_1  s           e1     video.x  dead    3         gone\n"),
            "{t}"
        );
        assert!(t.contains("the next page: --after dlv_1"), "{t}");
        let d = DeliveryView {
            status: Status::Sent,
            attempts: Some(vec![AttemptRecordView {
                attempt: 1,
                at_ms: 5,
                lane: Lane::Edge,
                outcome: AttemptOutcome::Failed,
                status: Some(503),
                latency_ms: Some(40),
                error: None,
                response_body: Some("busy".into()),
            }]),
            ..dead
        };
        let t = delivery_detail(&d);
        assert!(t.contains("status              sent\n"), "{t}");
        assert!(t.contains("sequence            4\n"), "{t}");
        assert!(
            t.contains("1        1970-01-01T00:00:00.005Z  edge  failed   503     40"),
            "{t}"
        );
        assert!(
            t.contains("created_at          1970-01-01T00:00:00.000Z\n"),
            "{t}"
        );
    }
}
