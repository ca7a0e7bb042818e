//! The events and the counters of sequence numbers, as both backends keep the columns
//! `fanout ledger copy` carries (deliveries and attempts are in `deliveries.rs`).

use super::{added, col, Kind, Table};

use Kind::{Int, Text};

pub const EVENTS: Table = Table {
    name: "events",
    columns: &[
        col("id", Text),
        col("type", Text),
        col("body", Text),
        col("received_ms", Int),
        added("traceparent", Text, "NULL"),
    ],
    paged: true,
};

/// Each subscriber's last sequence number.
pub const SEQUENCES: Table = Table {
    name: "sequences",
    columns: &[col("subscriber_id", Text), col("last", Int)],
    paged: false,
};

/// Each ordered key's last sequence number.
pub const ORDERING_KEYS: Table = Table {
    name: "ordering_keys",
    columns: &[
        col("subscriber_id", Text),
        col("key", Text),
        col("last", Int),
    ],
    paged: false,
};
