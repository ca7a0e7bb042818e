//! The origin's side of the edge's limits (issue 9), against the daemon in-process and a real
//! HTTP server playing the edge: several calls per subscriber at once within its
//! `max_in_flight`, and a batch the edge can never take split until the one delivery it refuses
//! goes dead with the edge's error.

// Test code: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{wait_for, Answer, Daemon, Received, Subscriber};
use fanout_core::wire::{DeliveryBatch, DeliveryResult};
use serde_json::json;

const EDGE_KEY: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

/// The edge's answer: every delivery delivered.
fn delivered_all(batch: &DeliveryBatch) -> Answer {
    let results: Vec<DeliveryResult> = batch
        .deliveries
        .iter()
        .map(|d| DeliveryResult::Delivered {
            id: d.id.clone(),
            status: 200,
            latency_ms: 1,
            failed: Vec::new(),
        })
        .collect();
    Answer::status(200).body(&json!({ "results": results }).to_string())
}

fn batch_of(r: &Received) -> DeliveryBatch {
    serde_json::from_slice(&r.body).expect("the origin sends a DeliveryBatch")
}

async fn daemon_with_edge(edge: &Subscriber) -> Daemon {
    let url = edge.url.clone();
    Daemon::start_with(move |s| fanout_origin::config::Settings {
        edge_url: Some(url),
        edge_key: Some(EDGE_KEY.into()),
        ..s
    })
    .await
}

/// A batch with one delivery the edge refuses (413, as for a body over its limit): the batch
/// is split until that delivery is sent alone, which then counts attempts and goes dead with
/// the edge's error; every other delivery is delivered, and nothing stays pending.
#[tokio::test]
async fn a_batch_the_edge_refuses_is_split_and_the_refused_delivery_goes_dead() {
    let edge = Subscriber::start(|r, _| {
        let batch = batch_of(r);
        if batch.deliveries.iter().any(|d| d.event_id == "poison") {
            Answer::status(413).body(
                r#"{"error":{"code":"payload_too_large","message":"the delivery is too large"}}"#,
            )
        } else {
            delivered_all(&batch)
        }
    })
    .await;
    let d = daemon_with_edge(&edge).await;
    let mut spec = common::sub_spec("sub_e", "http://127.0.0.1:9/h", &["*"]);
    spec["lane"] = json!("edge");
    spec["max_in_flight"] = json!(64);
    d.api.subscriber(spec).await;
    let mut evs = common::events("ok", 20, "t");
    evs.as_array_mut()
        .unwrap()
        .insert(7, json!({ "id": "poison", "type": "t" }));
    d.api.events(evs).await;
    let api = d.api.clone();
    wait_for("everything settled", Duration::from_secs(20), || {
        let api = api.clone();
        async move { api.count("status=sent").await == 20 && api.count("status=dead").await == 1 }
    })
    .await;
    assert_eq!(d.api.count("status=pending").await, 0);
    let dead = d.api.deliveries("status=dead").await;
    assert_eq!(dead[0]["event_id"], "poison");
    let error = dead[0]["last_error"].as_str().unwrap_or_default();
    assert!(
        error.contains("413") && error.contains("payload_too_large"),
        "the edge's error: {error}"
    );
    assert_eq!(dead[0]["attempt_count"], 3, "the attempt limit");
    // Each healthy delivery was sent in a call the edge took, once.
    let taken: usize = edge
        .received()
        .iter()
        .map(batch_of)
        .filter(|b| !b.deliveries.iter().any(|d| d.event_id == "poison"))
        .map(|b| b.deliveries.len())
        .sum();
    assert_eq!(taken, 20);
    d.stop().await;
}

/// With `max_in_flight` 18, a grant of 18 goes out as several calls at once (the edge keeps only
/// a few sends of one call open), and never more than 18 deliveries are out together.
#[tokio::test]
async fn several_edge_calls_run_at_once_within_max_in_flight() {
    let open = Arc::new(Mutex::new((0usize, 0usize, 0usize))); // (calls open, most calls, most deliveries)
    let out_now = Arc::new(Mutex::new(0usize));
    let (o, n) = (open.clone(), out_now.clone());
    let edge = Subscriber::start(move |r, _| {
        let batch = batch_of(r);
        {
            let mut g = o.lock().unwrap();
            let mut out = n.lock().unwrap();
            g.0 += 1;
            *out += batch.deliveries.len();
            g.1 = g.1.max(g.0);
            g.2 = g.2.max(*out);
        }
        // The answer is held 450 ms; the counts drop just before it goes (no new call can come
        // before the answer, so the most seen is the most out).
        let (o, n, k) = (o.clone(), n.clone(), batch.deliveries.len());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(400)).await;
            o.lock().unwrap().0 -= 1;
            *n.lock().unwrap() -= k;
        });
        delivered_all(&batch).delay(Duration::from_millis(450))
    })
    .await;
    let d = daemon_with_edge(&edge).await;
    let mut spec = common::sub_spec("sub_p", "http://127.0.0.1:9/h", &["*"]);
    spec["lane"] = json!("edge");
    spec["max_in_flight"] = json!(18);
    d.api.subscriber(spec).await;
    d.api.events(common::events("p", 54, "t")).await;
    let api = d.api.clone();
    wait_for("all sent", Duration::from_secs(20), || {
        let api = api.clone();
        async move { api.count("status=sent").await == 54 }
    })
    .await;
    let (_, most_calls, most_out) = *open.lock().unwrap();
    assert!(most_calls >= 3, "calls at once: {most_calls}");
    assert!(most_out <= 18, "deliveries out at once: {most_out}");
    d.stop().await;
}
