//! The tables that hold what was sent, beside the subscribers and customers: events,
//! deliveries, attempts and the counters of sequence numbers, each as both backends keep the
//! columns `fanout ledger copy` carries. (A delivery's lease is not among them: the copy
//! brings every delivery over unleased.)

use super::{added, col, Column, Kind, Table};

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

/// `status` and `next_attempt_ms` are where [`DELIVERY_STATUS`] and [`DELIVERY_DUE`] say.
pub const DELIVERIES: Table = Table {
    name: "deliveries",
    columns: DELIVERY_COLUMNS,
    paged: true,
};

const DELIVERY_COLUMNS: &[Column] = &[
    col("id", Int),
    col("subscriber_id", Text),
    col("event_id", Text),
    col("status", Text),
    col("attempts", Int),
    col("next_attempt_ms", Int),
    col("last_error", Text),
    col("created_ms", Int),
    col("updated_ms", Int),
    // A ledger from before sequence numbers has none: the copy numbers them as the migration
    // that added them does.
    added("sequence", Int, "0"),
    added("ordering_key", Text, "NULL"),
    added("previous_sequence", Int, "NULL"),
];

/// Where [`DELIVERIES`] has a delivery's status and its due time.
pub const DELIVERY_STATUS: usize = 3;
pub const DELIVERY_DUE: usize = 5;

pub const ATTEMPTS: Table = Table {
    name: "attempts",
    columns: &[
        col("id", Int),
        col("delivery_id", Int),
        col("attempt", Int),
        col("at_ms", Int),
        col("lane", Text),
        col("outcome", Text),
        col("status", Int),
        col("latency_ms", Int),
        col("response_body", Text),
        col("error", Text),
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
