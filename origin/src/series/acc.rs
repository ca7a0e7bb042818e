//! The dispatcher's side of the series: one [`Tally`] per subscriber since the last flush,
//! behind one short lock taken once per result (`crate::metrics::Metrics::record`). No clock,
//! no ledger: the flush task (`crate::charts`) takes the tallies every [`super::buckets::FINE_MS`]
//! and writes them in one ledger operation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use fanout_core::wire::DeliveryResult;

use super::buckets::Tally;

#[derive(Debug, Default)]
pub struct Accumulator {
    tallies: Mutex<HashMap<Arc<str>, Tally>>,
}

impl Accumulator {
    /// Count one result of `subscriber`, with its latency when it has one.
    pub fn record(&self, subscriber: &Arc<str>, result: &DeliveryResult, latency_ms: Option<u64>) {
        if let Ok(mut t) = self.tallies.lock() {
            match t.get_mut(subscriber) {
                Some(tally) => tally.record(result, latency_ms),
                None => t
                    .entry(subscriber.clone())
                    .or_default()
                    .record(result, latency_ms),
            }
        }
    }

    /// Everything counted since the last take.
    pub fn take(&self) -> Vec<(String, Tally)> {
        let taken = match self.tallies.lock() {
            Ok(mut t) => std::mem::take(&mut *t),
            Err(_) => return Vec::new(),
        };
        taken.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    /// Put back tallies a flush could not write, so the next flush writes them.
    pub fn restore(&self, tallies: Vec<(String, Tally)>) {
        if let Ok(mut t) = self.tallies.lock() {
            for (id, tally) in tallies {
                t.entry(Arc::from(id)).or_default().absorb(&tally);
            }
        }
    }
}
