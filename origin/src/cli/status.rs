//! `fanout status`: one row per subscriber with its figures and state, then retention's line
//! and a clock warning; the lines are built here (pure) from the API's views.

use clap::Args;
use fanout_core::breaker::BreakerState;

use super::client::{print, Client, ClientArgs, ClientError};
use crate::api::views::SubscriberList;
use crate::metrics::OutboxView;
use crate::retention::RetentionView;
use crate::term::{human_number, or_dash};

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Print the daemon's JSON (subscribers with their stats) instead of a table
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// `fanout status`.
pub(super) async fn status(a: StatusArgs) -> Result<(), ClientError> {
    let client = Client::new(&a.client)?;
    let list: SubscriberList = client
        .call(reqwest::Method::GET, "/v1/subscribers?stats=true", None)
        .await?;
    let retention: RetentionView = client
        .call(reqwest::Method::GET, "/v1/retention", None)
        .await?;
    let outbox: OutboxView = client
        .call(reqwest::Method::GET, "/v1/outbox", None)
        .await?;
    // The daemon's clock against its PostgreSQL server's, from its `/metrics` (absent when
    // they cannot be read: the rest of the status stands without it).
    let metrics = client.text("/metrics").await;
    let clock = metrics
        .as_deref()
        .and_then(|m| sample(m, "fanout_clock_offset_seconds"));
    let peers = metrics
        .as_deref()
        .and_then(|m| sample(m, "fanout_peer_clock_offset_seconds"));
    if a.json {
        let mut v = serde_json::to_value(&list).unwrap_or_default();
        if let Some(o) = v.as_object_mut() {
            o.insert(
                "retention".into(),
                serde_json::to_value(&retention).unwrap_or_default(),
            );
            if outbox.outbox.is_some() {
                o.insert(
                    "outbox".into(),
                    serde_json::to_value(&outbox).unwrap_or_default(),
                );
            }
            if let Some(offset) = clock {
                o.insert("clock_offset_seconds".into(), offset.into());
            }
        }
        print(&v);
    } else {
        let now = crate::time::now_ms();
        print!("{}", status_table(&list, now));
        println!("{}", retention_line(&retention, now));
        if let Some(line) = outbox_line(&outbox) {
            println!("{line}");
        }
        if let Some(line) = clock.and_then(|c| clock_line(c, peers)) {
            println!("{line}");
        }
    }
    Ok(())
}

/// The sample of the unlabelled gauge `name` in a `/metrics` text (pure).
pub fn sample(metrics: &str, name: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))?
        .trim()
        .parse()
        .ok()
}

/// `fanout status`'s warning when the daemon's host clock is more than
/// [`crate::time::CLOCK_WARN_MS`] off its PostgreSQL server's (`offset_s`: the server's less
/// the host's), naming the clock that is off when the HTTP servers' (`peers_s`, the same way)
/// tell; nothing otherwise (pure).
pub fn clock_line(offset_s: f64, peers_s: Option<f64>) -> Option<String> {
    let ms = |s: f64| (s * 1000.0).round() as i64;
    let offset = ms(offset_s);
    crate::time::ClockVerdict::of(offset, peers_s.map(ms))
        .warning(offset)
        .map(|w| format!("clock: {w}"))
}

/// `fanout status`'s outbox line, when the daemon reads one (pure).
pub fn outbox_line(v: &OutboxView) -> Option<String> {
    let at = v.outbox.as_deref()?;
    let table = v.table.as_deref().unwrap_or_default();
    let state = match &v.error {
        Some(e) => format!("CANNOT READ: {e}"),
        None if v.standby => "standby: another daemon reads it".to_string(),
        None => format!("oldest row {:.1}s old", v.oldest_age_seconds),
    };
    Some(format!(
        "outbox {table} in {at}: {} rows read, {} rejected, {} rounds failed; {state}",
        v.rows_read, v.rows_rejected, v.rounds_failed
    ))
}

/// `fanout status`'s last line: what retention keeps and has removed (pure).
pub fn retention_line(v: &RetentionView, now_ms: i64) -> String {
    use crate::term::human_duration;
    let kept = |window: &str, oldest: Option<i64>| {
        let age = oldest.map_or("none kept".to_string(), |t| {
            format!("oldest {} ago", human_duration(now_ms - t))
        });
        format!("{window} ({age})")
    };
    let r = &v.report;
    let last = r.last_run_at_ms.map_or("not run yet".to_string(), |t| {
        format!("last pass {} ago", human_duration(now_ms - t))
    });
    format!(
        "retention: sent kept {}, dead kept {}; removed {} sent, {} dead, {} attempts, {} events; {last}",
        kept(&v.retain_sent, r.oldest_sent_at_ms),
        kept(&v.retain_dead, r.oldest_dead_at_ms),
        r.removed_sent,
        r.removed_dead,
        r.removed_attempts,
        r.removed_events,
    )
}

/// `fanout status`: one row per subscriber from `GET /v1/subscribers?stats=true` (pure).
pub fn status_table(list: &SubscriberList, now_ms: i64) -> String {
    use crate::term::{clip, human_duration};
    if list.subscribers.is_empty() {
        return "no subscribers\n".into();
    }
    let rows: Vec<Vec<String>> = list
        .subscribers
        .iter()
        .map(|s| {
            let (v, st) = (&s.view, s.stats.as_ref());
            let mut state = Vec::new();
            if let Some(stall) = st.and_then(|st| st.stalled.as_ref()) {
                state.push(format!(
                    "STALLED {} (due work, nothing sent)",
                    human_duration(now_ms - stall.since_ms)
                ));
            }
            if v.disabled {
                state.push(match &v.disabled_reason {
                    Some(reason) => format!("disabled: {}", clip(reason, 40)),
                    None => "disabled".into(),
                });
            }
            if let Some(until) = st.and_then(|st| st.paused_until_ms) {
                state.push(format!("paused {}", human_duration(until - now_ms)));
            }
            match st.map(|st| st.breaker.state) {
                Some(BreakerState::Open) => state.push("breaker open".into()),
                Some(BreakerState::HalfOpen) => state.push("breaker half-open".into()),
                Some(BreakerState::Closed) | None => {}
            }
            if st.is_some_and(|st| st.limiter_error.is_some()) {
                state.push("limiter state reset".into());
            }
            if state.is_empty() {
                state.push(if st.is_none() { "-" } else { "ok" }.into());
            }
            let last_error = match (
                st.and_then(|st| st.last_error.as_deref()),
                st.and_then(|st| st.last_error_at_ms),
            ) {
                (Some(e), Some(at)) => {
                    format!("{} ago: {}", human_duration(now_ms - at), clip(e, 48))
                }
                (Some(e), None) => clip(e, 48),
                _ => String::new(),
            };
            vec![
                v.id.clone(),
                v.lane.as_str().into(),
                human_number(v.rate_per_sec),
                v.burst.to_string(),
                or_dash(st.map(|st| st.pending)),
                or_dash(st.map(|st| st.in_flight)),
                or_dash(st.map(|st| st.sent)),
                or_dash(st.map(|st| st.dead)),
                state.join(", "),
                last_error,
            ]
        })
        .collect();
    crate::term::table(
        &[
            "SUBSCRIBER",
            "LANE",
            "RATE/S",
            "BURST",
            "PENDING",
            "IN FLIGHT",
            "SENT",
            "DEAD",
            "STATE",
            "LAST ERROR",
        ],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::views::{SubscriberStats, SubscriberView, ViewWithStats};
    use crate::model::{Lane, Limits, Subscriber};

    fn view(id: &str, lane: Lane, rate_per_sec: f64, burst: u32) -> SubscriberView {
        let limits = Limits {
            rate_per_sec,
            burst,
            max_in_flight: 8,
            timeout_ms: 10_000,
        };
        SubscriberView {
            lane,
            active_secrets: 1,
            ..SubscriberView::of(
                &Subscriber::new(id, "https://example.com/h", &["*"], limits),
                0,
                None,
            )
        }
    }

    fn stats(
        (pending, in_flight, sent, dead): (i64, i64, i64, i64),
        paused_until_ms: Option<i64>,
        breaker: BreakerState,
        last_error: Option<(&str, i64)>,
    ) -> SubscriberStats {
        SubscriberStats {
            pending,
            in_flight,
            sent,
            dead,
            tokens: 0.0,
            paused_until_ms,
            breaker: fanout_core::breaker::BreakerView {
                state: breaker,
                consecutive_failures: 0,
                open_until_ms: None,
            },
            last_error: last_error.map(|(e, _)| e.to_string()),
            last_error_at_ms: last_error.map(|(_, at)| at),
            stalled: None,
            limiter_error: None,
        }
    }

    #[test]
    fn clock_warning_from_the_metrics() {
        let metrics = "# TYPE fanout_daemons gauge\nfanout_daemons 2\n\
                       # TYPE fanout_clock_offset_seconds gauge\nfanout_clock_offset_seconds -59.998\n\
                       fanout_peer_clock_offset_seconds -59.5\n";
        assert_eq!(
            sample(metrics, "fanout_clock_offset_seconds"),
            Some(-59.998)
        );
        assert_eq!(
            sample(metrics, "fanout_peer_clock_offset_seconds"),
            Some(-59.5)
        );
        assert_eq!(
            sample("fanout_daemons 1\n", "fanout_clock_offset_seconds"),
            None
        );
        // The HTTP servers agree with the PostgreSQL server: the host is off.
        assert!(clock_line(-59.998, Some(-59.5)).is_some_and(|l| l
            .starts_with("clock: this host's clock is 60.0 s ahead of the PostgreSQL server's")));
        // They agree with the host: the server is off.
        assert!(clock_line(600.0, Some(0.4)).is_some_and(|l| l
            .starts_with("clock: the PostgreSQL server's clock is 600.0 s ahead of this host's")));
        // None heard: it cannot tell.
        assert!(clock_line(2.5, None).is_some_and(|l| l.contains("2.5 s apart")));
        assert_eq!(clock_line(0.9, Some(30.0)), None);
        assert_eq!(clock_line(-1.0, None), None);
        assert_eq!(clock_line(0.0, None), None);
    }

    #[test]
    fn outbox_line_table() {
        let mut v = OutboxView {
            outbox: None,
            table: None,
            rows_read: 12,
            rows_rejected: 1,
            rounds_failed: 0,
            oldest_age_seconds: 0.25,
            error: None,
            standby: false,
        };
        assert_eq!(outbox_line(&v), None);
        v.outbox = Some("/data/shop.db".into());
        v.table = Some("fanout_outbox".into());
        assert_eq!(
            outbox_line(&v).as_deref(),
            Some("outbox fanout_outbox in /data/shop.db: 12 rows read, 1 rejected, 0 rounds failed; oldest row 0.2s old")
        );
        v.standby = true;
        assert!(outbox_line(&v)
            .unwrap_or_default()
            .ends_with("; standby: another daemon reads it"));
        v.error = Some("no such table".into());
        assert!(outbox_line(&v)
            .unwrap_or_default()
            .ends_with("CANNOT READ: no such table"));
    }

    #[test]
    fn retention_line_table() {
        let v: RetentionView = serde_json::from_value(json!({ "retain_sent": "7d",
            "retain_dead": "forever", "removed_sent": 120, "removed_dead": 3,
            "removed_attempts": 130, "removed_events": 121, "oldest_sent_at_ms": 3_600_000,
            "oldest_dead_at_ms": null, "last_run_at_ms": 7_170_000, "longest_step_ms": 4.5 }))
        .unwrap();
        assert_eq!(
            retention_line(&v, 7_200_000),
            "retention: sent kept 7d (oldest 1h00m ago), dead kept forever (none kept); removed \
             120 sent, 3 dead, 130 attempts, 121 events; last pass 30s ago"
        );
    }

    #[test]
    fn status_table_shows_backlog_pause_breaker_and_last_error() {
        let mut gone = view("gone", Lane::Origin, 1.0, 1);
        gone.disabled = true;
        gone.disabled_reason = Some("the endpoint answered 410 Gone".into());
        let v = SubscriberList {
            subscribers: vec![
                ViewWithStats {
                    view: view("partner", Lane::Edge, 10.0, 20),
                    stats: Some(stats(
                        (120, 8, 4000, 2),
                        Some(61_000),
                        BreakerState::Closed,
                        Some(("429: rate limited", 55_000)),
                    )),
                },
                ViewWithStats {
                    view: view("crm", Lane::Auto, 2.5, 5),
                    stats: Some(SubscriberStats {
                        stalled: Some(crate::model::StallView {
                            since_ms: 15_000,
                            not_before_ms: None,
                            next_due_ms: Some(0),
                            paused_until_ms: None,
                            breaker: BreakerState::Open,
                        }),
                        ..stats((0, 0, 7, 0), None, BreakerState::Open, None)
                    }),
                },
                ViewWithStats {
                    view: view("new", Lane::Origin, 100.0, 100),
                    stats: Some(stats((0, 0, 0, 0), None, BreakerState::Closed, None)),
                },
                ViewWithStats {
                    view: gone,
                    stats: Some(stats((3, 0, 0, 1), None, BreakerState::Open, None)),
                },
            ],
        };
        let t = status_table(&v, 60_000);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 5, "{t}");
        assert!(
            lines[0].starts_with("SUBSCRIBER  LANE    RATE/S  BURST  PENDING"),
            "{t}"
        );
        for (line, cells) in lines[1..].iter().zip([
            &[
                "partner",
                "edge",
                "10",
                "20",
                "120",
                "8",
                "4000",
                "2",
                "paused 1s",
                "5s ago: 429: rate limited",
            ][..],
            &[
                "crm",
                "auto",
                "2.5",
                "5",
                "0",
                "0",
                "7",
                "0",
                "STALLED 45s (due work, nothing sent), breaker open",
            ][..],
            &["new", "origin", "100", "100", "0", "0", "0", "0", "ok"][..],
            &[
                "gone",
                "origin",
                "1",
                "1",
                "3",
                "0",
                "0",
                "1",
                "disabled: the endpoint answered 410 Gone, breaker open",
            ][..],
        ]) {
            let mut rest = *line;
            for cell in cells {
                let at = rest
                    .find(cell)
                    .unwrap_or_else(|| panic!("{cell} in {line}"));
                rest = &rest[at + cell.len()..];
            }
        }
        assert_eq!(
            status_table(
                &SubscriberList {
                    subscribers: vec![]
                },
                0
            ),
            "no subscribers\n"
        );
    }
}
