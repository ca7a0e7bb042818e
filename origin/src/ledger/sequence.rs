//! Sequence numbers (pure): each delivery's `webhook-sequence`, its subscriber's count of
//! deliveries in fan-out order, from 1, without gaps, assigned once by the ingest transaction
//! that creates it and stored on the delivery (`deliveries.sequence`), so a retry or a replay
//! sends the same number.
//!
//! Each backend keeps a counter per subscriber (`sequences`: the number of its last delivery)
//! and an ingest (1) [`tally`]s how many deliveries each subscriber gets, (2) moves each of
//! those counters by its count, in subscriber-id order, and (3) numbers each delivery from its
//! counter's new value ([`from_end`], [`assign`]); on PostgreSQL (2) and (3) are one statement
//! with the deliveries' insert. On PostgreSQL the reservation locks the counter
//! rows until the commit, so the transactions of several daemons that fan out to the same
//! subscribers take their numbers one after the other, in commit order, and deliveries of a
//! subscriber have ascending ids in ascending sequence; the rows are locked in one fixed order,
//! so two such transactions never wait on each other in a circle. Numbers are therefore never
//! used twice and never skipped: a transaction that rolls back gives its reservation back.
//!
//! The counter lives in its own table, not the subscriber's row, which claims lock: ingest
//! never waits on a dispatcher's claim.

use std::collections::BTreeMap;

use super::error::LedgerError;

/// How many deliveries each subscriber gets, from the subscribers of the deliveries in fan-out
/// order; in key order (the order the counters are reserved in).
pub fn tally<K: Ord + Clone>(fan_out: &[K]) -> Vec<(K, i64)> {
    tally_refs(fan_out)
        .into_iter()
        .map(|(k, n)| (k.clone(), n))
        .collect()
}

/// For each delivery of the fan-out, how many deliveries of its subscriber follow it in the
/// same call: its number is its subscriber's counter after the reservation minus this.
pub fn from_end<K: Ord>(fan_out: &[K]) -> Vec<i64> {
    let mut after: BTreeMap<&K, i64> = BTreeMap::new();
    let mut out = vec![0; fan_out.len()];
    for (i, k) in fan_out.iter().enumerate().rev() {
        let n = after.entry(k).or_default();
        out[i] = *n;
        *n += 1;
    }
    out
}

/// The number of each delivery, in fan-out order, given each subscriber's counter after the
/// reservation (`last`: the number its last delivery of this call takes). A subscriber of the
/// fan-out missing from `reserved`, or a number below 1, is a broken reservation: nothing may
/// be numbered (the caller rolls back).
pub fn assign<K: Ord + std::fmt::Debug>(
    fan_out: &[K],
    reserved: &[(K, i64)],
) -> Result<Vec<i64>, LedgerError> {
    let last: BTreeMap<&K, i64> = reserved.iter().map(|(k, n)| (k, *n)).collect();
    fan_out
        .iter()
        .zip(from_end(fan_out))
        .map(|(k, back)| match last.get(k) {
            Some(l) if l - back >= 1 => Ok(l - back),
            Some(l) => Err(LedgerError::Invalid(format!(
                "subscriber {k:?}: counter {l} is below the deliveries reserved"
            ))),
            None => Err(LedgerError::Invalid(format!(
                "no sequence was reserved for subscriber {k:?}"
            ))),
        })
        .collect()
}

fn tally_refs<K: Ord>(fan_out: &[K]) -> BTreeMap<&K, i64> {
    let mut counts: BTreeMap<&K, i64> = BTreeMap::new();
    for k in fan_out {
        *counts.entry(k).or_default() += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(fan_out: &[&str], before: &[(&str, i64)], expected: &[i64]) {
        // What a backend does: tally, move each counter by its count, assign.
        let counts = tally(fan_out);
        let mut sorted: Vec<&str> = counts.iter().map(|(k, _)| *k).collect();
        sorted.sort_unstable();
        assert_eq!(
            counts.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            sorted,
            "reserved in key order"
        );
        let reserved: Vec<(&str, i64)> = counts
            .iter()
            .map(|(k, n)| {
                let was = before.iter().find(|(b, _)| b == k).map_or(0, |(_, l)| *l);
                (*k, was + n)
            })
            .collect();
        assert_eq!(assign(fan_out, &reserved).unwrap(), expected, "{fan_out:?}");
    }

    #[test]
    fn numbering_table() {
        check(&[], &[], &[]);
        check(&["a"], &[], &[1]);
        check(&["a", "a", "a"], &[("a", 7)], &[8, 9, 10]);
        // Two events to three subscribers, fan-out order interleaves them.
        check(
            &["b", "a", "c", "b", "a", "c"],
            &[("a", 1), ("c", 40)],
            &[1, 2, 41, 2, 3, 42],
        );
    }

    #[test]
    fn from_end_table() {
        let rows: &[(&[&str], &[i64])] = &[
            (&[], &[]),
            (&["a"], &[0]),
            (&["a", "a", "a"], &[2, 1, 0]),
            (&["b", "a", "c", "b", "a", "c"], &[1, 1, 1, 0, 0, 0]),
            (&["a", "b", "b", "a", "b"], &[1, 2, 1, 0, 0]),
        ];
        for (fan_out, expected) in rows {
            assert_eq!(from_end(fan_out), *expected, "{fan_out:?}");
        }
    }

    #[test]
    fn a_broken_reservation_numbers_nothing() {
        assert!(assign(&["a", "b"], &[("a", 1)]).is_err(), "b unreserved");
        assert!(assign(&["a", "a"], &[("a", 1)]).is_err(), "counter too low");
        assert_eq!(assign(&["a"], &[("a", 1), ("z", 9)]).unwrap(), [1]);
    }
}
