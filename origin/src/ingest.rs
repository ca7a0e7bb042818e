//! Taking events in, the same through every door (`POST /v1/events` and the outbox): the
//! ledger's ingest, the counts `/metrics` shows (events new and duplicate), and the dispatcher
//! woken for the subscribers that got work. Nothing else: each door reads and answers its own
//! way.

use std::sync::atomic::Ordering::Relaxed;

use tokio::sync::mpsc::UnboundedSender;

use crate::dispatch::Control;
use crate::ledger::{Deliveries, Ingested, LedgerError, NewEvent};
use crate::metrics::Metrics;

/// Ingest `events` at `now_ms`, count them in `metrics`, and tell the dispatcher (`control`)
/// which subscribers have new work. The dispatcher is gone only while the daemon stops (its
/// next start rescans the ledger), so a closed channel is not an error. The outcome of each
/// event, in order.
pub async fn ingest(
    ledger: &impl Deliveries,
    metrics: &Metrics,
    control: &UnboundedSender<Control>,
    events: Vec<NewEvent>,
    now_ms: i64,
) -> Result<Vec<Ingested>, LedgerError> {
    let (results, touched) = ledger.ingest(events, now_ms).await?;
    let dups = results.iter().filter(|r| r.duplicate).count() as u64;
    metrics
        .events_ingested
        .fetch_add(results.len() as u64 - dups, Relaxed);
    metrics.events_duplicate.fetch_add(dups, Relaxed);
    if !touched.is_empty() {
        let _ = control.send(Control::Due(touched));
    }
    Ok(results)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::store::Store;
    use crate::ledger::Subscribers;

    /// New events and duplicates are counted apart, and the dispatcher hears of the
    /// subscribers with new work, once per ingest, and of none when nothing matched.
    #[tokio::test]
    async fn an_ingest_is_counted_and_wakes_the_dispatcher() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = Store::scratch(dir.path());
        let sub = crate::ledger::test_subscriber("a", &["t"]);
        ledger.create_subscriber(sub, "s".into()).await.unwrap();
        let metrics = Metrics::new(false);
        let (control, mut heard) = tokio::sync::mpsc::unbounded_channel();
        let mut events = crate::ledger::test_events(2);
        events.push(events[0].clone());
        let got = ingest(&ledger, &metrics, &control, events, 1)
            .await
            .unwrap();
        assert_eq!(
            got.iter().map(|r| r.duplicate).collect::<Vec<_>>(),
            [false, false, true]
        );
        assert_eq!(metrics.events_ingested.load(Relaxed), 2);
        assert_eq!(metrics.events_duplicate.load(Relaxed), 1);
        match heard.try_recv() {
            Ok(Control::Due(subs)) => assert_eq!(subs, ["a"]),
            other => panic!("expected the dispatcher told of a, got {other:?}"),
        }
        let mut other = crate::ledger::test_events(1);
        other[0].event_type = "u".into();
        other[0].id = "x".into();
        ingest(&ledger, &metrics, &control, other, 2).await.unwrap();
        assert!(
            heard.try_recv().is_err(),
            "no subscriber of u: nothing to tell"
        );
        assert_eq!(metrics.events_ingested.load(Relaxed), 3);
    }
}
