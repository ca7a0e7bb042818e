//! Tidy: the invariants ARCHITECTURE.md states about the origin's source, checked on the source.
//! - `rusqlite` is named only inside `origin/src/ledger/` (everything else goes through the
//!   ledger's typed operations), but for the files [`RUSQLITE_ALLOWED`] lists as debt.
//! - Rows are deleted only where the invariants allow it: [`DELETES_ALLOWED`] lists each
//!   `DELETE FROM <table>` by file, with the reason. Deliveries, events and attempts are never
//!   deleted except by retention (`ledger/retention.rs`).
//! - No file git tracks holds an unresolved merge conflict (one reached main in a document once).

// Test code: a failed expect is a failed test.
#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};

/// Files outside `ledger/` still allowed to name `rusqlite`, with the reason: each is debt to
/// pay by moving its queries into `ledger/` as typed operations, not a place to add more.
/// (None today: the customer-scope checks moved into `ledger::store`.)
const RUSQLITE_ALLOWED: &[(&str, &str)] = &[];

/// `(file under origin/src, table, why)`.
const DELETES_ALLOWED: &[(&str, &str, &str)] = &[
    (
        "ledger/postgres/dispatch.rs",
        "daemons",
        "a daemon leaving the share when it stops, and rows of daemons gone a week",
    ),
    (
        "ledger/sqlite/subscribers.rs",
        "subscriber_secrets",
        "a rotated secret past its grace period, and a removed subscriber's secrets when it is created again",
    ),
    (
        "ledger/sqlite/subscribers.rs",
        "subscribers",
        "a removed subscriber's row when a subscriber is created again under its id",
    ),
    (
        "ledger/postgres/subscribers.rs",
        "subscriber_secrets",
        "the PostgreSQL ledger: as ledger/sqlite/subscribers.rs (rotated-out secrets past their grace, a removed subscriber's secrets when it is created again)",
    ),
    (
        "ledger/postgres/subscribers.rs",
        "subscribers",
        "the PostgreSQL ledger: as ledger/sqlite/subscribers.rs (a removed subscriber's row when it is created again)",
    ),
    (
        "ledger/sqlite/customers.rs",
        "customers",
        "DELETE /v1/customers/{id}: a customer that owns no live subscriber",
    ),
    (
        "ledger/sqlite/retention.rs",
        "deliveries",
        "retention: a sent delivery past --retain-sent, a dead one past --retain-dead (never pending or in flight)",
    ),
    (
        "ledger/sqlite/retention.rs",
        "attempts",
        "retention: the attempts of a delivery it removes",
    ),
    (
        "ledger/sqlite/retention.rs",
        "events",
        "retention: an event no delivery refers to any more",
    ),
    (
        "ledger/postgres/retention.rs",
        "deliveries",
        "retention on PostgreSQL: as ledger/sqlite/retention.rs (a sent delivery past --retain-sent, a dead one past --retain-dead)",
    ),
    (
        "ledger/postgres/retention.rs",
        "attempts",
        "retention on PostgreSQL: the attempts of a delivery it removes",
    ),
    (
        "ledger/postgres/retention.rs",
        "events",
        "retention on PostgreSQL: an event no delivery refers to any more",
    ),
    (
        "ledger/postgres/retention.rs",
        "delivery_counts",
        "the fold of the PostgreSQL count rows: replaced by their sums in the same transaction",
    ),
    (
        "ledger/postgres/retention.rs",
        "last_errors",
        "the fold of the PostgreSQL error rows: all but each subscriber's latest",
    ),
    (
        "ledger/postgres/customers.rs",
        "customers",
        "the PostgreSQL ledger: as ledger/sqlite/customers.rs (a customer that owns no live subscriber)",
    ),
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("the source directory is readable") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every source file as (path relative to origin/src with `/`, text).
fn sources() -> Vec<(String, String)> {
    let mut files = Vec::new();
    rust_files(&src(), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(src())
                .expect("under src")
                .to_string_lossy()
                .replace('\\', "/");
            let text = std::fs::read_to_string(&p).expect("a readable source file");
            (rel, text)
        })
        .collect()
}

/// Files naming `rusqlite` outside `ledger/`.
fn rusqlite_outside_ledger(files: &[(String, String)]) -> Vec<String> {
    files
        .iter()
        .filter(|(rel, text)| {
            !rel.starts_with("ledger/")
                && !RUSQLITE_ALLOWED.iter().any(|(f, _)| f == rel)
                && text.contains("rusqlite")
        })
        .map(|(rel, _)| rel.clone())
        .collect()
}

/// Every `DELETE FROM <table>` as (file, table).
fn deletes(files: &[(String, String)]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (rel, text) in files {
        let upper = text.to_ascii_uppercase();
        let mut from = 0;
        while let Some(i) = upper[from..].find("DELETE FROM") {
            let start = from + i + "DELETE FROM".len();
            let table: String = text[start..]
                .trim_start()
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.push((rel.clone(), table.to_ascii_lowercase()));
            from = start;
        }
    }
    out
}

fn disallowed(found: &[(String, String)]) -> Vec<(String, String)> {
    found
        .iter()
        .filter(|(rel, table)| {
            !DELETES_ALLOWED
                .iter()
                .any(|(f, t, _)| f == rel && t == table)
        })
        .cloned()
        .collect()
}

#[test]
fn rusqlite_is_used_only_inside_the_ledger() {
    let found = rusqlite_outside_ledger(&sources());
    assert!(
        found.is_empty(),
        "rusqlite outside origin/src/ledger/ (use the ledger's typed operations): {found:?}"
    );
}

#[test]
fn rows_are_deleted_only_where_the_invariants_allow() {
    let found = disallowed(&deletes(&sources()));
    assert!(
        found.is_empty(),
        "DELETE statements the invariants do not allow (see DELETES_ALLOWED in origin/tests/tidy.rs): {found:?}"
    );
}

/// The checks themselves catch what they are for.
#[test]
fn the_checks_catch_violations() {
    let files = vec![
        (
            "dispatch/mod.rs".to_string(),
            "fn f(c: &rusqlite::Connection) {}".to_string(),
        ),
        (
            "ledger/sqlite/subscribers.rs".to_string(),
            "use rusqlite::Connection;\nc.execute(\"DELETE FROM subscribers WHERE id = ?1\")"
                .to_string(),
        ),
        (
            "ledger/purge.rs".to_string(),
            "c.execute(\"delete from  deliveries WHERE 1\")".to_string(),
        ),
    ];
    assert_eq!(
        rusqlite_outside_ledger(&files),
        vec!["dispatch/mod.rs".to_string()]
    );
    assert_eq!(
        disallowed(&deletes(&files)),
        vec![("ledger/purge.rs".to_string(), "deliveries".to_string())]
    );
}

/// Lines that a merge left unresolved (`<<<<<<< `, `>>>>>>> ` or a lone `=======` between
/// them), as `path:line`.
fn conflict_markers(files: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, text) in files {
        let mut open = false;
        for (i, line) in text.lines().enumerate() {
            let marker = line.starts_with("<<<<<<< ")
                || line.starts_with(">>>>>>> ")
                || (open && line == "=======");
            if line.starts_with("<<<<<<< ") {
                open = true;
            } else if line.starts_with(">>>>>>> ") {
                open = false;
            }
            if marker {
                found.push(format!("{path}:{}", i + 1));
            }
        }
    }
    found
}

/// Every file git tracks in the repository, as (path, text), text files only.
fn tracked_texts() -> Vec<(String, String)> {
    let root = src().join("../..");
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(&root)
        .args(["ls-files", "-z"])
        .output()
        .expect("git ls-files");
    assert!(out.status.success(), "git ls-files failed");
    String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .filter(|p| !p.is_empty())
        .filter_map(|p| {
            let text = std::fs::read_to_string(root.join(p)).ok()?;
            Some((p.to_string(), text))
        })
        .collect()
}

#[test]
fn no_tracked_file_holds_a_merge_conflict() {
    let found = conflict_markers(&tracked_texts());
    assert!(
        found.is_empty(),
        "unresolved merge conflict markers at: {found:?}"
    );
}

#[test]
fn the_conflict_check_catches_markers() {
    let text = "a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> main\nd\n=======\n".to_string();
    assert_eq!(
        conflict_markers(&[("f.md".into(), text)]),
        ["f.md:2", "f.md:4", "f.md:6"]
    );
}
