//! One delivery filter, written as SQL for either backend: the `WHERE` clause of a list or a
//! bulk replay and its arguments, numbered `?N` (SQLite) or `$N` (PostgreSQL). Pure: it
//! builds text and values, runs nothing; each backend binds [`Arg`]s as its driver wants.
//!
//! Every list and bulk replay is an id range (`after`, and a time range as ids: creation
//! times never decrease with ids, see ingest) within one index: by status, by subscriber and
//! status, by event, or the id itself. Type and customer are residual filters: the rows are
//! still read in id order from one index range, and only those that match are kept. Where the
//! backends' planners want different text it is said below, per [`Dialect`].

use super::deliveries::DeliveryFilter;
use super::error::LedgerError;
use crate::model::Status;

/// Which backend the SQL is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `?N` placeholders; the status is an argument; a time bound is the first delivery created
    /// at or after it, by the `deliveries_created` index; the customer test is prefixed by a
    /// unary `+`, which keeps SQLite's planner from driving the query by it.
    Sqlite,
    /// `$N` placeholders; the status is written out (a fixed word) so that the partial index of
    /// that status serves even a generic plan; a time bound is the smallest delivery id of the
    /// events received first at or after it among those that have deliveries (events are
    /// written once and indexed by receive time), and the times themselves are checked too:
    /// across daemons (one clock, the server's, within a few milliseconds: `clock.rs`) a
    /// delivery created at nearly the same instant may fall on the other side of the bound.
    Postgres,
}

/// One argument of the clause, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arg {
    Text(String),
    Int(i64),
}

impl Dialect {
    fn placeholder(self, n: usize) -> String {
        match self {
            Dialect::Sqlite => format!("?{n}"),
            Dialect::Postgres => format!("${n}"),
        }
    }

    /// The id of the first delivery created at or after the time in argument `n`.
    fn first_at(self, n: usize) -> String {
        match self {
            Dialect::Sqlite => format!(
                "(SELECT id FROM deliveries WHERE created_ms >= ?{n} ORDER BY created_ms LIMIT 1)"
            ),
            Dialect::Postgres => format!(
                "(SELECT MIN(f.id) FROM deliveries f WHERE f.event_id IN (
                 SELECT id FROM events WHERE received_ms = (
                     SELECT e.received_ms FROM events e WHERE e.received_ms >= ${n}
                         AND EXISTS (SELECT 1 FROM deliveries x WHERE x.event_id = e.id)
                     ORDER BY e.received_ms LIMIT 1)))"
            ),
        }
    }
}

/// The clause being built: its tests and their arguments.
struct Builder {
    dialect: Dialect,
    clauses: Vec<String>,
    args: Vec<Arg>,
}

impl Builder {
    /// Push `arg` and return its placeholder.
    fn arg(&mut self, arg: Arg) -> String {
        self.args.push(arg);
        self.dialect.placeholder(self.args.len())
    }
}

/// `WHERE …` for a delivery filter, and its arguments (numbered from 1).
pub fn where_clause(f: &DeliveryFilter, dialect: Dialect) -> (String, Vec<Arg>) {
    let mut b = Builder {
        dialect,
        clauses: Vec::new(),
        args: Vec::new(),
    };
    if let Some(s) = f.status {
        let test = match dialect {
            Dialect::Sqlite => format!("d.status = {}", b.arg(Arg::Text(s.as_str().into()))),
            Dialect::Postgres => format!("d.status = '{}'", s.as_str()),
        };
        b.clauses.push(test);
    }
    if let Some(s) = &f.subscriber {
        let p = b.arg(Arg::Text(s.clone()));
        b.clauses.push(format!("d.subscriber_id = {p}"));
    }
    if let Some(e) = &f.event {
        let p = b.arg(Arg::Text(e.clone()));
        b.clauses.push(format!("d.event_id = {p}"));
    }
    if let Some(t) = &f.event_type {
        let p = b.arg(Arg::Text(t.clone()));
        b.clauses.push(format!(
            "(SELECT type FROM events WHERE id = d.event_id) = {p}"
        ));
    }
    if let Some(cu) = &f.customer {
        let p = b.arg(Arg::Text(cu.clone()));
        let residual = match dialect {
            Dialect::Sqlite => "+",
            Dialect::Postgres => "",
        };
        b.clauses.push(format!(
            "{residual}d.subscriber_id IN (SELECT id FROM subscribers WHERE customer = {p})"
        ));
    }
    if let Some(t) = f.since_ms {
        let p = b.arg(Arg::Int(t));
        let n = b.args.len();
        b.clauses.push(match dialect {
            Dialect::Sqlite => format!("d.id >= {}", dialect.first_at(n)),
            Dialect::Postgres => format!(
                "d.id >= COALESCE({}, 9223372036854775807) AND d.created_ms >= {p}",
                dialect.first_at(n)
            ),
        });
    }
    if let Some(t) = f.until_ms {
        let p = b.arg(Arg::Int(t));
        let n = b.args.len();
        let bound = format!(
            "d.id < COALESCE({}, 9223372036854775807)",
            dialect.first_at(n)
        );
        b.clauses.push(match dialect {
            Dialect::Sqlite => bound,
            Dialect::Postgres => format!("{bound} AND d.created_ms < {p}"),
        });
    }
    let p = b.arg(Arg::Int(f.after.unwrap_or(0)));
    b.clauses.push(format!("d.id > {p}"));
    (format!("WHERE {}", b.clauses.join(" AND ")), b.args)
}

/// `WHERE …` for what a bulk replay with this filter replays: its status (dead unless said),
/// never in flight, only live subscribers'.
pub fn replayable(f: &DeliveryFilter, dialect: Dialect) -> Result<(String, Vec<Arg>), LedgerError> {
    let mut f = f.clone();
    if f.status.is_none() {
        f.status = Some(Status::Dead);
    }
    if f.status == Some(Status::InFlight) {
        return Err(LedgerError::Invalid(
            "in-flight deliveries cannot be replayed".into(),
        ));
    }
    let (filter, args) = where_clause(&f, dialect);
    let live = "d.subscriber_id IN (SELECT id FROM subscribers WHERE deleted_ms IS NULL)";
    Ok((format!("{filter} AND {live}"), args))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pg_first_at(n: usize) -> String {
        Dialect::Postgres.first_at(n)
    }

    /// Each filter, as each backend's SQL: the same tests in the same order, numbered in each
    /// placeholder style, differing only where a planner wants it (see [`Dialect`]).
    #[test]
    fn a_filter_as_sql_for_each_backend() {
        let sub = |s: &str| Some(s.to_string());
        let cases: Vec<(DeliveryFilter, &str, String, Vec<Arg>)> = vec![
            (
                DeliveryFilter::default(),
                "WHERE d.id > ?1",
                "WHERE d.id > $1".into(),
                vec![Arg::Int(0)],
            ),
            (
                DeliveryFilter {
                    status: Some(Status::Sent),
                    subscriber: sub("a"),
                    after: Some(9),
                    ..Default::default()
                },
                "WHERE d.status = ?1 AND d.subscriber_id = ?2 AND d.id > ?3",
                "WHERE d.status = 'sent' AND d.subscriber_id = $1 AND d.id > $2".into(),
                vec![],
            ),
            (
                DeliveryFilter {
                    event: sub("e"),
                    event_type: sub("t"),
                    customer: sub("c"),
                    ..Default::default()
                },
                "WHERE d.event_id = ?1 AND (SELECT type FROM events WHERE id = d.event_id) = ?2 \
                 AND +d.subscriber_id IN (SELECT id FROM subscribers WHERE customer = ?3) \
                 AND d.id > ?4",
                "WHERE d.event_id = $1 AND (SELECT type FROM events WHERE id = d.event_id) = $2 \
                 AND d.subscriber_id IN (SELECT id FROM subscribers WHERE customer = $3) \
                 AND d.id > $4"
                    .into(),
                vec![
                    Arg::Text("e".into()),
                    Arg::Text("t".into()),
                    Arg::Text("c".into()),
                    Arg::Int(0),
                ],
            ),
            (
                DeliveryFilter {
                    since_ms: Some(5),
                    until_ms: Some(7),
                    ..Default::default()
                },
                "WHERE d.id >= (SELECT id FROM deliveries WHERE created_ms >= ?1 ORDER BY \
                 created_ms LIMIT 1) AND d.id < COALESCE((SELECT id FROM deliveries WHERE \
                 created_ms >= ?2 ORDER BY created_ms LIMIT 1), 9223372036854775807) AND d.id > ?3",
                format!(
                    "WHERE d.id >= COALESCE({}, 9223372036854775807) AND d.created_ms >= $1 AND \
                     d.id < COALESCE({}, 9223372036854775807) AND d.created_ms < $2 AND d.id > $3",
                    pg_first_at(1),
                    pg_first_at(2)
                ),
                vec![Arg::Int(5), Arg::Int(7), Arg::Int(0)],
            ),
        ];
        for (f, sqlite, postgres, args) in cases {
            let (s, s_args) = where_clause(&f, Dialect::Sqlite);
            let (p, p_args) = where_clause(&f, Dialect::Postgres);
            assert_eq!(s, sqlite, "{f:?}");
            assert_eq!(p, postgres, "{f:?}");
            if f.status.is_none() {
                assert_eq!(s_args, args, "{f:?}");
                assert_eq!(p_args, args, "{f:?}");
            } else {
                // SQLite passes the status as the first argument; PostgreSQL writes it out.
                assert_eq!(s_args[1..], p_args[..], "{f:?}");
            }
        }
    }

    /// A replay takes dead deliveries unless told, never in-flight ones, only live subscribers'.
    #[test]
    fn a_replay_filter() {
        let (sql, args) = replayable(&DeliveryFilter::default(), Dialect::Postgres).unwrap();
        assert!(
            sql.starts_with("WHERE d.status = 'dead' AND d.id > $1 AND "),
            "{sql}"
        );
        assert!(sql.ends_with("deleted_ms IS NULL)"), "{sql}");
        assert_eq!(args, vec![Arg::Int(0)]);
        let (sql, _) = replayable(&DeliveryFilter::default(), Dialect::Sqlite).unwrap();
        assert!(
            sql.starts_with("WHERE d.status = ?1 AND d.id > ?2 AND "),
            "{sql}"
        );
        let in_flight = DeliveryFilter {
            status: Some(Status::InFlight),
            ..Default::default()
        };
        for dialect in [Dialect::Sqlite, Dialect::Postgres] {
            assert!(matches!(
                replayable(&in_flight, dialect),
                Err(LedgerError::Invalid(_))
            ));
        }
    }
}
