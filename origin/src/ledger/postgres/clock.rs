//! One clock for every daemon sharing the ledger: the database server's.
//!
//! Leases, due times, the shared limiter's stamps and portal tokens are times one daemon
//! writes and another compares; on the hosts' own clocks a daemon 60 s ahead would release
//! the others' live leases as expired (their sends' results then count for nothing and the
//! webhooks go twice) and one 60 s behind would find nothing due for a minute. So each
//! daemon measures how far the server's clock is from its host's (a `SELECT` of the server's
//! time, corrected for the round trip as NTP does), at start-up before it serves and then
//! every second, and its one clock (`crate::time::now_ms`) is its host's plus that offset.
//! Signatures are not the ledger's: a receiver checks `webhook-timestamp` against its own
//! wall clock, so the daemon signs with its host's (`outbound`), never the server's.
//!
//! An offset over [`crate::time::CLOCK_WARN_MS`] is logged as a warning (and shown in `/metrics` as
//! `fanout_clock_offset_seconds`) naming which clock is off: the HTTP servers the daemon calls
//! (subscribers, the edge) are a third clock (`Date` of their answers,
//! `fanout_peer_clock_offset_seconds`); the one of the host's and the server's that agrees with
//! them is right. Until one answered, or when they agree with neither, the warning says that
//! it cannot tell; it is logged again when its verdict changes.

use std::time::Duration;

use super::ledger::{every, PgLedger};
use crate::ledger::error::LedgerError;
use crate::time::{adopt_offset, host_ms, peer_offset_ms, ClockSample, ClockVerdict};

/// The server's clock, in unix ms (`clock_timestamp()`: the moment the statement reads it,
/// not the transaction's start).
const SERVER_NOW: &str = "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// The offset is measured again this often.
const MEASURE_EVERY: Duration = Duration::from_secs(1);

/// Samples taken at start-up; the one with the shortest round trip is used.
const FIRST_SAMPLES: usize = 3;

impl PgLedger {
    /// One reading of the server's clock, between two of the host's.
    async fn clock_sample(&self) -> Result<ClockSample, LedgerError> {
        let c = self.client().await?;
        let st = c.prepare_cached(SERVER_NOW).await?;
        let sent_ms = host_ms();
        let row = c.query_one(&st, &[]).await?;
        let received_ms = host_ms();
        Ok(ClockSample {
            sent_ms,
            theirs_ms: row.try_get(0)?,
            received_ms,
        })
    }

    /// Measure the server's clock ([`FIRST_SAMPLES`] times, the shortest round trip wins) and
    /// make it the daemon's, warning when the host's is off. Done once before the daemon
    /// serves or dispatches.
    pub(super) async fn set_clock(&self) -> Result<(), LedgerError> {
        let mut best: Option<ClockSample> = None;
        for _ in 0..FIRST_SAMPLES {
            let s = self.clock_sample().await?;
            if s.received_ms >= s.sent_ms && best.is_none_or(|b| s.error_ms() < b.error_ms()) {
                best = Some(s);
            }
        }
        let offset = best.and_then(|s| adopt_offset(None, &s)).unwrap_or(0);
        crate::time::set_offset_ms(offset);
        report(offset, ClockVerdict::of(offset, peer_offset_ms()), None);
        Ok(())
    }

    /// Measure the server's clock again every `MEASURE_EVERY` until `stop` fires or is
    /// dropped, adopting a new offset when it moved beyond the measurement's error, and
    /// reporting when the verdict on which clock is off changed.
    pub(super) fn keep_clock(&self, stop: tokio::sync::oneshot::Receiver<()>) {
        let me = self.clone();
        let verdict = std::sync::Arc::new(std::sync::Mutex::new(ClockVerdict::of(
            crate::time::offset_ms(),
            peer_offset_ms(),
        )));
        every(
            MEASURE_EVERY,
            None,
            stop,
            "read the PostgreSQL server's clock",
            move || {
                let me = me.clone();
                let verdict = verdict.clone();
                async move {
                    let sample = me.clock_sample().await?;
                    let current = crate::time::offset_ms();
                    let offset = adopt_offset(Some(current), &sample).unwrap_or(current);
                    crate::time::set_offset_ms(offset);
                    let now = ClockVerdict::of(offset, peer_offset_ms());
                    let mut last = verdict.lock().unwrap_or_else(|e| e.into_inner());
                    if now != *last {
                        report(offset, now, Some(*last));
                        *last = now;
                    }
                    Ok(())
                }
            },
        );
    }
}

/// Log the offset now in use and which clock is off (a warning while they disagree: at
/// start-up, then whenever the verdict changes), given the verdict before (`None` at start-up).
fn report(offset_ms: i64, verdict: ClockVerdict, before: Option<ClockVerdict>) {
    match (verdict.warning(offset_ms), before) {
        (Some(warning), _) => tracing::warn!(offset_ms, ?verdict, "{warning}"),
        (None, Some(b)) if b != ClockVerdict::Agree => tracing::info!(
            offset_ms,
            "this host's clock is within a second of the PostgreSQL server's again"
        ),
        (None, _) => tracing::debug!(offset_ms, "the PostgreSQL server's clock, from this host's"),
    }
}
