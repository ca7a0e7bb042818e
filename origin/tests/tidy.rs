//! Tidy: the invariants ARCHITECTURE.md states about the source, checked on the source. Each
//! check is a pure function over (path, text) pairs with a self-test that feeds it a synthetic
//! violation and sees it caught.
//! - `rusqlite` is named only inside `origin/src/ledger/` (everything else goes through the
//!   ledger's typed operations) and [`OUTBOX`] (a producer's database, not the ledger), but for
//!   the files [`RUSQLITE_ALLOWED`] lists as debt; and each driver only by its backend
//!   ([`DRIVERS`]: `rusqlite` in [`SQLITE_BACKEND`], `tokio_postgres`/`deadpool` in
//!   [`POSTGRES_BACKEND`], both in [`COPY_COMMAND`] and `rusqlite`/`tokio_postgres` in
//!   [`OUTBOX`]; `tokio_postgres` and `rustls` in [`PG_DIAL`], the URL grammar and TLS the
//!   PostgreSQL backend and the outbox share; `rustls` also in [`OUTBOUND`]).
//! - `api/` names no backend ([`BACKEND_NAMES`]).
//! - A backend exports its handle and its contract's implementations only ([`DOORS`]).
//! - Rows are deleted only where the invariants allow it: [`DELETES_ALLOWED`] lists each
//!   `DELETE FROM <table>` by file, with the reason. Deliveries, events and attempts are never
//!   deleted except by retention (`ledger/retention.rs`).
//! - No file git tracks holds an unresolved merge conflict (one reached main in a document once).
//! - The pure modules ([`PURE`]) name no clock, randomness, I/O or async ([`IMPURE`]).
//! - No two files of a crate import each other, directly or in a circle ([`import_graph`] says
//!   what an import is; it follows `pub use`).
//! - The daemon's top-level modules form [`LAYERS`]: none names a module of a higher layer, and
//!   no two name each other. There is no allowlist.
//! - At most [`MAX_FILE_CODE`] lines of code per file before its tests and [`MAX_FN_LINES`]
//!   lines per function, but for [`SIZE_ALLOWLIST`], which may only shrink.
//! - Every path ARCHITECTURE.md names exists.
//! - No lane is compared as a string outside [`LANE_STRINGS_ALLOWED`].
//! - No test passes without running: none returns early when not root, none sleeps a guessed
//!   time and then asserts (but for [`SLEEPS_ALLOWED`]).

// Test code: a failed expect is a failed test.
#![allow(clippy::expect_used)]

use std::path::{Path, PathBuf};

/// Files outside `ledger/` still allowed to name `rusqlite`, with the reason: each is debt to
/// pay by moving its queries into `ledger/` as typed operations, not a place to add more.
/// (None today: the customer-scope checks moved into `ledger::store`.)
const RUSQLITE_ALLOWED: &[(&str, &str)] = &[];

/// The producer's outbox (`fanout serve --outbox`), under origin/src: it reads and writes a
/// producer's own database (SQLite or PostgreSQL), never the ledger, which it reaches only
/// through the contract (ingest). Its drivers are therefore its own, not the ledger's.
const OUTBOX: &str = "outbox/";

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
        "ledger/subscribers.rs",
        "sequences",
        "an id created again once none of its removed endpoint's deliveries are kept: the new endpoint starts at sequence 1",
    ),
    (
        "ledger/subscribers.rs",
        "ordering_keys",
        "an id created again once none of its removed endpoint's deliveries are kept: no ordered key's last number survives",
    ),
    (
        "ledger/subscribers.rs",
        "series",
        "an id created again once none of its removed endpoint's deliveries are kept: its chart starts empty",
    ),
    (
        "ledger/subscribers.rs",
        "last_errors",
        "an id created again once none of its removed endpoint's deliveries are kept: no last error of the old one",
    ),
    (
        "ledger/customers.rs",
        "series",
        "a customer created again under a removed one's id: its combined chart's totals start empty",
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
        "ledger/sqlite/retention.rs",
        "ordering_keys",
        "retention: an ordered key whose last delivery it removes, with nothing of the key pending or in flight",
    ),
    (
        "ledger/postgres/retention.rs",
        "ordering_keys",
        "retention on PostgreSQL: as ledger/sqlite/retention.rs (an ordered key whose last delivery it removes, nothing of it outstanding)",
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
        "ledger/sqlite/retention.rs",
        "series",
        "retention: the charts' buckets past their window (two hours fine, two days coarse)",
    ),
    (
        "ledger/postgres/retention.rs",
        "series",
        "retention on PostgreSQL: as ledger/sqlite/retention.rs (the charts' buckets past their window)",
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
    (
        "outbox/postgres.rs",
        "{t}",
        "a producer's outbox rows (not the ledger's), once the ledger holds their events",
    ),
    (
        "outbox/sqlite.rs",
        "{t}",
        "a producer's outbox rows in its SQLite file, once the ledger holds their events",
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
                && !rel.starts_with(OUTBOX)
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
            // A quoted name (`DELETE FROM \"{t}\"` in a Rust string) is the name.
            let table: String = text[start..]
                .trim_start()
                .trim_start_matches(['\\', '"'])
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || "_{}".contains(*c))
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

// ---------------------------------------------------------------------------------------------
// Reading the tree: every check below is a pure function over (path, text) pairs, so each one
// is fed a synthetic violation in a self-test and seen to catch it.
// ---------------------------------------------------------------------------------------------

/// The repository's root (the workspace holding `origin/` and the core crate's `src/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `.rs` file under `dir` (relative to the repository's root), as (path relative to the
/// root with `/`, text), sorted by path.
fn rust_tree(dir: &str) -> Vec<(String, String)> {
    let mut files = Vec::new();
    rust_files(&root().join(dir), &mut files);
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let rel = p
                .strip_prefix(root())
                .expect("under the root")
                .to_string_lossy()
                .replace('\\', "/");
            let text = std::fs::read_to_string(&p).expect("a readable source file");
            (rel, text)
        })
        .collect()
}

/// The sources of both crates (the daemon's `origin/src/` and the core's `src/`), paths from
/// the repository's root.
fn crate_sources() -> Vec<(String, String)> {
    let mut files = rust_tree("origin/src");
    files.extend(rust_tree("src"));
    files
}

/// `files` under `prefix`, with the prefix taken off their paths.
fn under(files: &[(String, String)], prefix: &str) -> Vec<(String, String)> {
    files
        .iter()
        .filter_map(|(p, t)| Some((p.strip_prefix(prefix)?.to_string(), t.clone())))
        .collect()
}

/// Leading whitespace of a line.
fn indent(line: &str) -> &str {
    &line[..line.len() - line.trim_start().len()]
}

/// The last line (index) of the item starting at line `start`, on rustfmt's layout: the line
/// itself when it ends in `;` or closes what it opens, else the first later line at the same
/// indentation that closes it (`}`, `};`, `)…;`).
fn item_end(lines: &[&str], start: usize) -> usize {
    let first = lines[start].trim_end();
    let opens = first.matches('{').count() + first.matches('(').count();
    let closes = first.matches('}').count() + first.matches(')').count();
    if (first.ends_with(';') || first.ends_with('}') || first.ends_with(',')) && opens <= closes {
        return start;
    }
    let ind = indent(lines[start]);
    for (j, line) in lines.iter().enumerate().skip(start + 1) {
        let line = line.trim_end();
        if indent(line) != ind {
            continue;
        }
        let rest = line.trim_start();
        if rest == "}"
            || rest == "};"
            || rest == "},"
            || (rest.starts_with(')') && rest.ends_with(';'))
        {
            return j;
        }
    }
    lines.len() - 1
}

/// `text` with every item under `#[cfg(test)]` blanked out (lines kept, so line numbers hold).
fn strip_cfg_test(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut keep = vec![true; lines.len()];
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "#[cfg(test)]" {
            let mut item = i + 1;
            while item < lines.len() && lines[item].trim_start().starts_with("#[") {
                item += 1;
            }
            let end = if item < lines.len() {
                item_end(&lines, item)
            } else {
                i
            };
            for k in keep.iter_mut().take(end + 1).skip(i) {
                *k = false;
            }
            i = end + 1;
        } else {
            i += 1;
        }
    }
    lines
        .iter()
        .zip(keep)
        .map(|(l, k)| if k { *l } else { "" })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `text` without its `//` comments (a `//` inside a string literal stays).
fn strip_comments(text: &str) -> String {
    text.lines()
        .map(|line| {
            let mut in_string = false;
            let mut escaped = false;
            let bytes = line.as_bytes();
            for (i, &b) in bytes.iter().enumerate() {
                match b {
                    _ if escaped => escaped = false,
                    b'\\' if in_string => escaped = true,
                    b'"' => in_string = !in_string,
                    b'/' if !in_string && bytes.get(i + 1) == Some(&b'/') => return &line[..i],
                    _ => {}
                }
            }
            line
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The code of a file a check reads: no comments, no `#[cfg(test)]` items.
fn code(text: &str) -> String {
    strip_comments(&strip_cfg_test(text))
}

/// Files their parent declares only for tests (`#[cfg(test)] mod x;`: a `tests.rs` sibling, a
/// simulation, a `tests/` folder and every file under it), by path: none of their text is the
/// crate's code.
fn test_only_files(files: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    let mut folders = Vec::new();
    for (path, text) in files {
        let (parent, file) = match path.rsplit_once('/') {
            Some((d, f)) => (format!("{d}/"), f),
            None => (String::new(), path.as_str()),
        };
        let dir = match file {
            "mod.rs" | "lib.rs" | "main.rs" => parent,
            _ => format!("{parent}{}/", file.trim_end_matches(".rs")),
        };
        let lines: Vec<&str> = text.lines().collect();
        for w in lines.windows(2) {
            let decl = w[1].trim();
            if w[0].trim() == "#[cfg(test)]" && decl.ends_with(';') {
                if let Some(name) = decl
                    .trim_start_matches("pub ")
                    .strip_prefix("mod ")
                    .map(|n| n.trim_end_matches(';'))
                {
                    out.push(format!("{dir}{name}.rs"));
                    folders.push(format!("{dir}{name}/"));
                }
            }
        }
    }
    for (path, _) in files {
        if folders.iter().any(|f| path.starts_with(f.as_str())) {
            out.push(path.clone());
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// a. Pure files name no clock, randomness, I/O or async.
// ---------------------------------------------------------------------------------------------

/// The pure modules, from the repository's root, without `.rs`: each names a file `x.rs` or a
/// folder `x/` (every file under it), so a module split into a folder keeps its entry. Their
/// `#[cfg(test)]` items and the files their parent declares only for tests are not read.
const PURE: &[&str] = &[
    "origin/src/dispatch/plan",
    "origin/src/dispatch/fair",
    "origin/src/dispatch/state",
    "origin/src/dispatch/vocab",
    "origin/src/ledger/filter",
    "origin/src/ledger/scope",
    "origin/src/ledger/rows",
    "origin/src/ledger/rules",
    "origin/src/duration",
    "origin/src/event_filter",
    "origin/src/event_input",
    "origin/src/portal/token",
    "origin/src/api/subscriber_input",
    "origin/src/model",
    "origin/src/payload",
    "origin/src/keyring",
    "origin/src/ledger/sequence",
    "origin/src/customer",
    "origin/src/alert/rules",
    "origin/src/cli/listen/reply",
    "origin/src/series",
    "origin/src/ordering",
    "origin/src/outbox/plan",
    "origin/src/cli/apply/plan",
    "origin/src/cli/apply/yaml",
    "src/breaker",
    "src/bucket",
    "src/edge_limits",
    "src/endpoint",
    "src/limiter",
    "src/limits",
    "src/logrec",
    "src/retry",
    "src/sign",
    "src/wire",
];

/// What a pure file may not name: a clock, randomness, I/O (files, sockets, processes, the
/// environment, a database, HTTP) or async. `std::net`'s address types are values and allowed
/// (`src/endpoint.rs` classifies IP addresses); its sockets are not.
const IMPURE: &[&str] = &[
    "SystemTime",
    "Instant::now",
    "now_ms()",
    "rand::",
    "thread_rng",
    "getrandom",
    "random_bytes",
    "std::fs",
    "std::io",
    "std::env",
    "std::process",
    "std::thread",
    "TcpStream",
    "TcpListener",
    "UdpSocket",
    "tokio",
    "async ",
    ".await",
    "reqwest",
    "hyper",
    "axum",
    "rusqlite",
    "tokio_postgres",
    "deadpool",
    "worker::",
];

fn is_pure(path: &str, pure: &[&str]) -> bool {
    pure.iter()
        .any(|m| path == format!("{m}.rs") || path.starts_with(&format!("{m}/")))
}

/// `path: token` for each impure name in a pure file's code.
fn impure_names(files: &[(String, String)], pure: &[&str]) -> Vec<String> {
    let test_only = test_only_files(files);
    let mut found = Vec::new();
    for (path, text) in files {
        if !is_pure(path, pure) || test_only.contains(path) {
            continue;
        }
        let code = code(text);
        for token in IMPURE {
            if code.contains(token) {
                found.push(format!("{path}: {token}"));
            }
        }
    }
    found
}

/// The entries of `PURE` naming neither a file nor a folder (a module renamed: update the list).
fn missing_modules(modules: &[&str]) -> Vec<String> {
    modules
        .iter()
        .filter(|m| !root().join(format!("{m}.rs")).is_file() && !root().join(m).is_dir())
        .map(|m| m.to_string())
        .collect()
}

#[test]
fn pure_files_name_no_clock_randomness_io_or_async() {
    let missing = missing_modules(PURE);
    assert!(missing.is_empty(), "PURE names modules that do not exist (renamed? update the list in origin/tests/tidy.rs): {missing:?}");
    let found = impure_names(&crate_sources(), PURE);
    assert!(
        found.is_empty(),
        "pure files naming a clock, randomness, I/O or async (take `now` and randomness as arguments; let an executor do the I/O): {found:?}"
    );
}

#[test]
fn the_purity_check_catches_a_clock() {
    let files = vec![
        (
            "origin/src/dispatch/state/claims.rs".to_string(),
            "//! No SystemTime here.\nfn f() -> i64 { crate::time::now_ms() }\n#[cfg(test)]\nmod tests {\n    use std::fs;\n}\n".to_string(),
        ),
        (
            "origin/src/dispatch/state/mod.rs".to_string(),
            "mod claims;\n#[cfg(test)]\nmod tests;\n".to_string(),
        ),
        (
            "origin/src/dispatch/state/tests.rs".to_string(),
            "use std::time::SystemTime;".to_string(),
        ),
        (
            "src/wire.rs".to_string(),
            "async fn g() { x.await }".to_string(),
        ),
        (
            "origin/src/server.rs".to_string(),
            "async fn serve() { tokio::spawn(x).await }".to_string(),
        ),
    ];
    assert_eq!(
        impure_names(&files, &["origin/src/dispatch/state", "src/wire"]),
        [
            "origin/src/dispatch/state/claims.rs: now_ms()",
            "src/wire.rs: async ",
            "src/wire.rs: .await",
        ]
    );
    assert_eq!(
        missing_modules(&["src/wire", "origin/src/dispatch", "src/nowhere"]),
        ["src/nowhere"]
    );
}

// ---------------------------------------------------------------------------------------------
// b. Each database driver is named only by its backend (and the copy between them).
// c. `api/` names no backend.
// ---------------------------------------------------------------------------------------------

/// The SQLite backend's folder, under origin/src.
const SQLITE_BACKEND: &str = "ledger/sqlite/";
/// The PostgreSQL backend's folder, under origin/src.
const POSTGRES_BACKEND: &str = "ledger/postgres/";
/// The command copying a SQLite ledger into PostgreSQL (a file or a folder, under origin/src):
/// the one place that speaks both drivers.
const COPY_COMMAND: &str = "ledger/copy/";

/// Speaking to a PostgreSQL server (its URL grammar and TLS), under origin/src: shared by the
/// PostgreSQL backend and the outbox, below both.
const PG_DIAL: &str = "pg/";
/// The daemon's outbound HTTP client, under origin/src: it tells a TLS failure by its type.
const OUTBOUND: &str = "outbound.rs";

/// Which driver names may appear only where, under origin/src.
const DRIVERS: &[(&str, &[&str])] = &[
    ("rusqlite", &[SQLITE_BACKEND, COPY_COMMAND, OUTBOX]),
    (
        "tokio_postgres",
        &[POSTGRES_BACKEND, COPY_COMMAND, OUTBOX, PG_DIAL],
    ),
    ("deadpool", &[POSTGRES_BACKEND, COPY_COMMAND]),
    ("rustls::", &[PG_DIAL, OUTBOUND]),
];

/// `path: driver` for each driver named (in code, not comments) outside its places.
fn drivers_out_of_place(files: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, text) in files {
        let code = strip_comments(text);
        for (driver, places) in DRIVERS {
            if code.contains(driver) && !places.iter().any(|p| path.starts_with(p)) {
                found.push(format!("{path}: {driver}"));
            }
        }
    }
    found
}

/// What `api/` may not name: a driver, a backend's type or module, a `Store` variant.
const BACKEND_NAMES: &[&str] = &[
    "rusqlite",
    "tokio_postgres",
    "deadpool",
    "PgLedger",
    "Store::Sqlite",
    "Store::Postgres",
    "sqlite::",
    "postgres::",
];

/// `path: name` for each backend named in `api/` (tests included: they too go through the
/// contract).
fn api_backend_names(files: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, text) in files.iter().filter(|(p, _)| p.starts_with("api/")) {
        let code = strip_comments(text);
        for name in BACKEND_NAMES {
            if code.contains(name) {
                found.push(format!("{path}: {name}"));
            }
        }
    }
    found
}

/// Fails until the ledger is split into `ledger/sqlite/` and `ledger/postgres/` (issue 23's
/// ledger branch): that is expected on a branch without it.
#[test]
fn each_driver_is_named_only_by_its_backend() {
    let found = drivers_out_of_place(&sources());
    assert!(
        found.is_empty(),
        "drivers named outside their backend ({SQLITE_BACKEND}, {POSTGRES_BACKEND}, the copy {COPY_COMMAND}): {found:?}"
    );
}

#[test]
fn the_api_names_no_backend() {
    let found = api_backend_names(&sources());
    assert!(
        found.is_empty(),
        "api/ names a backend (use the ledger's contract): {found:?}"
    );
}

#[test]
fn the_driver_checks_catch_a_driver_out_of_place() {
    let files = vec![
        (
            "ledger/sqlite/queries.rs".to_string(),
            "use rusqlite::Connection;".to_string(),
        ),
        (
            "ledger/postgres/ops.rs".to_string(),
            "use tokio_postgres::Row;\nfn f(c: &rusqlite::Connection) {}".to_string(),
        ),
        (
            "ledger/copy/mod.rs".to_string(),
            "use rusqlite::Connection;\nuse deadpool_postgres::Pool;".to_string(),
        ),
        (
            "ledger/mod.rs".to_string(),
            "//! Names no driver: not rusqlite.\npub struct Row;".to_string(),
        ),
        (
            "pg/tls.rs".to_string(),
            "use tokio_postgres::tls::TlsConnect;\nuse rustls::ClientConfig;".to_string(),
        ),
        (
            "ledger/postgres/ledger.rs".to_string(),
            "fn f(e: &rustls::Error) {}".to_string(),
        ),
        (
            "dispatch/mod.rs".to_string(),
            "type P = deadpool_postgres::Pool;".to_string(),
        ),
        (
            "api/stats.rs".to_string(),
            "match s { Store::Postgres(l) => l.x(), _ => 0 }".to_string(),
        ),
        (
            "api/mod.rs".to_string(),
            "// not PgLedger\nuse crate::ledger::Ledger;".to_string(),
        ),
    ];
    assert_eq!(
        drivers_out_of_place(&files),
        [
            "ledger/postgres/ops.rs: rusqlite",
            "ledger/postgres/ledger.rs: rustls::",
            "dispatch/mod.rs: deadpool"
        ]
    );
    assert_eq!(api_backend_names(&files), ["api/stats.rs: Store::Postgres"]);
}

// ---------------------------------------------------------------------------------------------
// c'. One door: a backend exports its handle (`open`) and its contract's implementations.
// ---------------------------------------------------------------------------------------------

/// A backend's door: what its `mod.rs` may make `pub` (or `pub(crate)`) and which inherent
/// methods of its handle may be `pub`, each with the reason. Everything else of the backend is
/// `pub(super)`, `pub(in crate::ledger)` or private: the store (`ledger/store.rs`) and the copy
/// (`ledger/copy/`) reach it, nothing outside `ledger/` does. Tests that drive a backend's own
/// methods live inside it (`ledger/postgres/tests/`), so no entry is there for them.
struct Door {
    /// The backend's folder under origin/src.
    folder: &'static str,
    /// Its handle type: `impl <handle> {` blocks hold its inherent methods.
    handle: &'static str,
    exports: &'static [(&'static str, &'static str)],
    methods: &'static [(&'static str, &'static str)],
}

const DOORS: &[Door] = &[
    Door {
        folder: SQLITE_BACKEND,
        handle: "Ledger",
        exports: &[
            ("Ledger", "the handle"),
            ("backup", "`fanout backup`: SQLite's own, run on the file"),
        ],
        methods: &[("open", "the door")],
    },
    Door {
        folder: POSTGRES_BACKEND,
        handle: "PgLedger",
        exports: &[("PgLedger", "the handle")],
        methods: &[("open", "the door")],
    },
];

/// The names a module's code makes `pub` or `pub(crate)` at its top level (`*` for a glob
/// re-export), `#[cfg(test)]` items not read.
fn exported(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("pub") {
        if at > 0 && code.as_bytes()[at - 1] != b'\n' {
            continue;
        }
        let rest = &code[at..];
        let Some(rest) = rest
            .strip_prefix("pub(crate) ")
            .or_else(|| rest.strip_prefix("pub "))
        else {
            continue;
        };
        if let Some(tree) = rest.strip_prefix("use ") {
            let mut uses = Vec::new();
            use_tree(tree.as_bytes(), &mut 0, Vec::new(), &mut uses);
            for (path, alias) in uses {
                out.extend(alias.or_else(|| path.last().cloned()));
            }
            continue;
        }
        let words: Vec<&str> = rest.split_whitespace().take(3).collect();
        let name = match words.as_slice() {
            ["async" | "const" | "unsafe", "fn", name] | [_, name, ..] => name,
            _ => continue,
        };
        let name: String = name
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        out.push(name);
    }
    out
}

/// The `pub` (unrestricted) inherent methods of `handle` in a file's code, by name.
fn handle_methods(code: &str, handle: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut inside = false;
    for line in code.lines() {
        if line == format!("impl {handle} {{") {
            inside = true;
        } else if line == "}" {
            inside = false;
        } else if inside {
            if let Some(rest) = line.strip_prefix("    pub ") {
                let rest = rest
                    .trim_start_matches("async ")
                    .trim_start_matches("const ");
                if let Some(name) = rest.strip_prefix("fn ") {
                    out.push(
                        name.chars()
                            .take_while(|c| c.is_alphanumeric() || *c == '_')
                            .collect(),
                    );
                }
            }
        }
    }
    out
}

/// `path: name` for what a backend exports beyond its door, and `folder: name (not exported)`
/// for each door entry it no longer exports (the list only shrinks).
fn past_the_door(files: &[(String, String)], doors: &[Door]) -> Vec<String> {
    let mut found = Vec::new();
    for door in doors {
        let mut exports = Vec::new();
        let mut methods = Vec::new();
        for (path, text) in files.iter().filter(|(p, _)| p.starts_with(door.folder)) {
            let code = code(text);
            if *path == format!("{}mod.rs", door.folder) {
                for name in exported(&code) {
                    if !door.exports.iter().any(|(n, _)| *n == name) {
                        found.push(format!("{path}: {name}"));
                    }
                    exports.push(name);
                }
            }
            for name in handle_methods(&code, door.handle) {
                if !door.methods.iter().any(|(n, _)| *n == name) {
                    found.push(format!("{path}: {}::{name}", door.handle));
                }
                methods.push(name);
            }
        }
        for (name, _) in door.exports {
            if !exports.iter().any(|e| e == name) {
                found.push(format!("{}: {name} (not exported)", door.folder));
            }
        }
        for (name, _) in door.methods {
            if !methods.iter().any(|m| m == name) {
                found.push(format!(
                    "{}: {}::{name} (not public)",
                    door.folder, door.handle
                ));
            }
        }
    }
    found
}

#[test]
fn each_backend_has_one_door() {
    let found = past_the_door(&sources(), DOORS);
    assert!(
        found.is_empty(),
        "a backend exporting more than its handle and its contract (make it pub(super) or pub(in crate::ledger)), or DOORS entries to remove (origin/tests/tidy.rs): {found:#?}"
    );
}

#[test]
fn the_door_check_catches_an_export() {
    let file = |p: &str, t: &str| (p.to_string(), t.to_string());
    let files = vec![
        file(
            "ledger/sqlite/mod.rs",
            "mod ledger;\npub mod backup;\npub use ledger::{Ledger, LedgerOptions as Options};\npub(super) use a::B;\npub(crate) use c::*;\npub(in crate::ledger) use d::D;\n#[cfg(test)]\npub(crate) use t::T;\npub const VERSION: i64 = 1;\n",
        ),
        file(
            "ledger/sqlite/ledger.rs",
            "pub struct Ledger;\nimpl Ledger {\n    pub fn open() {}\n    pub(super) fn tx() {}\n    pub async fn claim() {}\n}\nimpl Deliveries for Ledger {\n    fn ingest() {}\n}\n",
        ),
    ];
    let doors = [Door {
        folder: SQLITE_BACKEND,
        handle: "Ledger",
        exports: &[("Ledger", "the handle"), ("backup", "b"), ("gone", "g")],
        methods: &[("open", "the door"), ("tx", "t")],
    }];
    assert_eq!(
        past_the_door(&files, &doors),
        [
            "ledger/sqlite/mod.rs: Options",
            "ledger/sqlite/mod.rs: *",
            "ledger/sqlite/mod.rs: VERSION",
            "ledger/sqlite/ledger.rs: Ledger::claim",
            "ledger/sqlite/: gone (not exported)",
            "ledger/sqlite/: Ledger::tx (not public)",
        ]
    );
}

// ---------------------------------------------------------------------------------------------
// d. No import cycle between files.
// ---------------------------------------------------------------------------------------------

/// A file's module path inside its crate (`a/b.rs` and `a/b/mod.rs` are `[a, b]`; `lib.rs` is
/// `[]`), or `None` for a crate root that is not the library (`main.rs`).
fn module_of(rel: &str) -> Option<Vec<String>> {
    if rel == "main.rs" {
        return None;
    }
    let rel = rel.strip_suffix(".rs")?;
    let mut segs: Vec<String> = rel.split('/').map(str::to_string).collect();
    if segs.last().is_some_and(|s| s == "mod" || s == "lib") {
        segs.pop();
    }
    Some(segs)
}

/// A path a use tree names, and the name it is given when renamed (`a::B as C`: `C`).
type Named = (Vec<String>, Option<String>);

/// Reads a use tree at `s[*i..]` under `prefix` (`a::b`, `a::{b, c::d}`, `a::*`, `a as b`),
/// pushing each full path (with its new name, if renamed) to `out`.
fn use_tree(s: &[u8], i: &mut usize, mut prefix: Vec<String>, out: &mut Vec<Named>) {
    let skip_ws = |i: &mut usize| {
        while *i < s.len() && s[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    let ident = |i: &mut usize| {
        let start = *i;
        while *i < s.len() && (s[*i].is_ascii_alphanumeric() || s[*i] == b'_') {
            *i += 1;
        }
        String::from_utf8_lossy(&s[start..*i]).into_owned()
    };
    loop {
        skip_ws(i);
        if *i < s.len() && s[*i] == b'{' {
            *i += 1;
            loop {
                skip_ws(i);
                if *i >= s.len() || s[*i] == b'}' {
                    *i += 1;
                    return;
                }
                let before = *i;
                use_tree(s, i, prefix.clone(), out);
                skip_ws(i);
                // Past a comma, or past what could not be read (never stuck in place).
                if (*i < s.len() && s[*i] == b',') || *i == before {
                    *i += 1;
                }
            }
        }
        let name = ident(i);
        if name.is_empty() {
            if *i < s.len() && s[*i] == b'*' {
                *i += 1;
                prefix.push("*".into());
            }
            out.push((prefix, None));
            return;
        }
        prefix.push(name);
        if s[*i..].starts_with(b"::") {
            *i += 2;
            continue;
        }
        // `path as name`: the path under its new name.
        let mut j = *i;
        skip_ws(&mut j);
        let alias =
            if s[j..].starts_with(b"as") && s.get(j + 2).is_some_and(u8::is_ascii_whitespace) {
                j += 2;
                skip_ws(&mut j);
                *i = j;
                Some(ident(i))
            } else {
                None
            };
        out.push((prefix, alias));
        return;
    }
}

/// Every module path a file's code names through `crate::`, `super::` or `self::` (in a `use`
/// or inline), made absolute from the file's own module path `me`.
fn named_paths(code: &str, me: &[String]) -> Vec<Vec<String>> {
    named_uses(code, me).into_iter().map(|(p, _)| p).collect()
}

/// [`named_paths`] with the name each is given when renamed (`as`).
fn named_uses(code: &str, me: &[String]) -> Vec<Named> {
    let s = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < s.len() {
        let boundary =
            i == 0 || !(s[i - 1].is_ascii_alphanumeric() || matches!(s[i - 1], b'_' | b':' | b'$'));
        let rest = &s[i..];
        let base: Option<(Vec<String>, usize)> = if !boundary {
            None
        } else if rest.starts_with(b"crate::") {
            Some((Vec::new(), "crate::".len()))
        } else if rest.starts_with(b"self::") {
            Some((me.to_vec(), "self::".len()))
        } else if rest.starts_with(b"super::") {
            let mut base = me.to_vec();
            let mut n = 0;
            while s[i + n..].starts_with(b"super::") {
                base.pop();
                n += "super::".len();
            }
            Some((base, n))
        } else {
            None
        };
        match base {
            Some((base, n)) => {
                i += n;
                use_tree(s, &mut i, base, &mut out);
            }
            None => i += 1,
        }
    }
    out
}

/// What a file passes on (`pub use`, `pub(crate) use`, …): each name it gives (`*` for a
/// glob) with the path it stands for, made absolute from the file's own module path `me` (a
/// path not starting with `crate::`, `self::` or `super::` is relative to it).
fn reexports(code: &str, me: &[String]) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("pub") {
        let b = code.as_bytes();
        if at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_') {
            continue;
        }
        let mut rest = &code[at + 3..];
        if rest.starts_with('(') {
            let Some(close) = rest.find(')') else {
                continue;
            };
            rest = &rest[close + 1..];
        }
        let Some(tree) = rest.trim_start().strip_prefix("use ") else {
            continue;
        };
        let mut tree = tree.trim_start();
        let mut base = me.to_vec();
        if let Some(t) = tree.strip_prefix("crate::") {
            base.clear();
            tree = t;
        } else if let Some(t) = tree.strip_prefix("self::") {
            tree = t;
        }
        while let Some(t) = tree.strip_prefix("super::") {
            base.pop();
            tree = t;
        }
        let mut uses = Vec::new();
        use_tree(tree.as_bytes(), &mut 0, base, &mut uses);
        for (mut path, alias) in uses {
            if path.last().is_some_and(|l| l == "self") {
                path.pop();
            }
            let Some(last) = path.last().cloned() else {
                continue;
            };
            if last == "*" {
                path.pop();
            }
            out.push((alias.unwrap_or(last), path));
        }
    }
    out
}

/// Whether a file's code declares an item called `name` (a glob `pub use` passes it on).
fn defines(code: &str, name: &str) -> bool {
    let kinds = [
        "fn ", "struct ", "enum ", "trait ", "type ", "const ", "static ", "mod ", "union ",
    ];
    kinds.iter().any(|kind| {
        let decl = format!("{kind}{name}");
        code.match_indices(&decl).any(|(i, _)| {
            let after = code[i + decl.len()..].chars().next();
            !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
        })
    })
}

/// The file holding `path` (its index in `modules`, each a module path and its code) and how
/// many of the path's segments name it.
fn holder(path: &[String], modules: &[(&[String], &str)]) -> Option<(usize, usize)> {
    (0..=path.len())
        .rev()
        .find_map(|k| Some((modules.iter().position(|(m, _)| m[..] == path[..k])?, k)))
}

/// The files (indices in `modules`) `path` leads to: the one holding it, then each that a
/// `pub use` (`exports`, by file) passes it on to, to the file declaring it. A glob passes on
/// what the file it names declares or passes on in turn (`depth` globs deep at most).
fn follow_uses(
    path: &[String],
    modules: &[(&[String], &str)],
    exports: &[Vec<(String, Vec<String>)>],
    depth: usize,
) -> Vec<usize> {
    let mut out = Vec::new();
    let mut path = path.to_vec();
    for _ in 0..16 {
        let Some((file, k)) = holder(&path, modules) else {
            break;
        };
        out.push(file);
        let Some(name) = path.get(k) else { break };
        let named = exports[file].iter().find(|(n, _)| n == name);
        let globbed = || {
            exports[file]
                .iter()
                .filter(|(n, _)| n == "*" && depth > 0)
                .map(|(_, t)| [t.clone(), vec![name.clone()]].concat())
                .find(|t| {
                    let ends = follow_uses(t, modules, exports, depth - 1);
                    ends.last().is_some_and(|&f| defines(modules[f].1, name))
                })
        };
        let Some(mut next) = named.map(|(_, t)| t.clone()).or_else(globbed) else {
            break;
        };
        next.extend_from_slice(&path[k + 1..]);
        if next == path {
            break;
        }
        path = next;
    }
    out
}

/// The import graph of one crate's files (paths relative to its `src/`): an edge from a file to
/// the deepest file holding what it names (`crate::a::b::C` is `a/b.rs` or `a/b/mod.rs` if one
/// exists, else `a.rs`…), and on from there through each `pub use` that passes the name on, to
/// the file declaring it (so `a/mod.rs`'s `pub use x::C` does not hide `a/x.rs`). A `mod`
/// declaration only says where a file sits and is no edge, so a child naming its parent
/// (`super::X`) is an edge, the parent's `mod child;` is not, and a parent naming its child
/// through `self::child::` or `crate::…::child::` is one. A parent's relative `use child::X` is
/// not read (a path from the parent down to its own child). `#[cfg(test)]` items and test-only
/// files are not read.
fn import_graph(files: &[(String, String)]) -> Vec<(String, Vec<String>)> {
    let test_only = test_only_files(files);
    let read: Vec<(Vec<String>, &String, String)> = files
        .iter()
        .filter(|(p, _)| !test_only.contains(p))
        .filter_map(|(p, t)| Some((module_of(p)?, p, code(t))))
        .collect();
    let exports: Vec<Vec<(String, Vec<String>)>> =
        read.iter().map(|(m, _, c)| reexports(c, m)).collect();
    let modules: Vec<(&[String], &str)> = read
        .iter()
        .map(|(m, _, c)| (m.as_slice(), c.as_str()))
        .collect();
    let follow = |p: &[String]| -> Vec<String> {
        follow_uses(p, &modules, &exports, 8)
            .into_iter()
            .map(|f| read[f].1.clone())
            .collect()
    };
    let mut graph = Vec::new();
    for (me, path, code) in &read {
        let mut to: Vec<String> = named_paths(code, me)
            .iter()
            .flat_map(|p| follow(p))
            .filter(|f| f != *path)
            .collect();
        to.sort();
        to.dedup();
        graph.push(((*path).clone(), to));
    }
    graph
}

/// The strongly connected groups of more than one file, each sorted, in order.
fn cycles(graph: &[(String, Vec<String>)]) -> Vec<Vec<String>> {
    let reach = |from: &String| -> Vec<String> {
        let mut seen = vec![from.clone()];
        let mut todo = vec![from.clone()];
        while let Some(f) = todo.pop() {
            for (_, to) in graph.iter().filter(|(g, _)| *g == f) {
                for t in to {
                    if !seen.contains(t) {
                        seen.push(t.clone());
                        todo.push(t.clone());
                    }
                }
            }
        }
        seen
    };
    let reaches: Vec<(String, Vec<String>)> =
        graph.iter().map(|(f, _)| (f.clone(), reach(f))).collect();
    let mut groups: Vec<Vec<String>> = Vec::new();
    for (f, fr) in &reaches {
        if groups.iter().any(|g| g.contains(f)) {
            continue;
        }
        let mut group: Vec<String> = reaches
            .iter()
            .filter(|(g, gr)| fr.contains(g) && gr.contains(f))
            .map(|(g, _)| g.clone())
            .collect();
        group.sort();
        if group.len() > 1 {
            groups.push(group);
        }
    }
    groups
}

#[test]
fn no_import_cycle_between_files() {
    let mut found = Vec::new();
    for dir in ["origin/src/", "src/"] {
        let graph = import_graph(&under(&crate_sources(), dir));
        for group in cycles(&graph) {
            // The edges inside the circle, to see which import to move.
            let edges: Vec<String> = graph
                .iter()
                .filter(|(f, _)| group.contains(f))
                .flat_map(|(f, to)| {
                    to.iter()
                        .filter(|t| group.contains(t))
                        .map(move |t| format!("{dir}{f} -> {dir}{t}"))
                })
                .collect();
            found.push(edges);
        }
    }
    assert!(
        found.is_empty(),
        "files that import each other, in a circle (move what they share below both): {found:#?}"
    );
}

#[test]
fn the_cycle_check_catches_a_circle() {
    let file = |p: &str, t: &str| (p.to_string(), t.to_string());
    let files = vec![
        file("lib.rs", "pub mod a;\npub mod b;\npub mod c;\npub mod d;\nuse crate::a::A;"),
        // A parent and a child naming it: no circle (`mod` is no edge).
        file("a/mod.rs", "mod x;\n#[cfg(test)]\nmod tests;\npub struct A;"),
        file("a/x.rs", "use super::A;"),
        file("a/tests.rs", "use crate::b::B;"),
        // b -> c -> d -> b, through a group, `self::` and an inline path.
        file("b.rs", "use crate::{c::C, a::A};\npub struct B;"),
        file("c.rs", "pub struct C;\nfn f() { crate::d::g() }\n#[cfg(test)]\nmod tests {\n    use crate::a::A;\n}"),
        file("d.rs", "// crate::a::A in a comment\nuse crate::b::B as Bee;\npub fn g() {}"),
    ];
    assert_eq!(cycles(&import_graph(&files)), [["b.rs", "c.rs", "d.rs"]]);
    // A circle through a `pub use`: `health` names `dispatch::Heartbeat`, which
    // `dispatch/mod.rs` passes on from `executor.rs` (renamed) or `state/beat.rs` (a glob).
    let hidden = |health: &str| {
        vec![
            file("lib.rs", "pub mod dispatch;\npub mod health;\npub mod metrics;"),
            file(
                "dispatch/mod.rs",
                "mod executor;\nmod state;\npub use executor::{Beat as Heartbeat, Clock};\npub(crate) use state::*;",
            ),
            file("dispatch/executor.rs", "use crate::metrics::M;\npub struct Beat;\npub struct Clock;"),
            file("dispatch/state/mod.rs", "pub mod beat;\npub use beat::*;"),
            file("dispatch/state/beat.rs", "use crate::metrics::M;\npub struct Pulse;"),
            file("metrics.rs", "use crate::health::Problem;\npub struct M;"),
            file("health.rs", health),
        ]
    };
    let graph = import_graph(&hidden(
        "use crate::dispatch::Heartbeat;\npub struct Problem;",
    ));
    assert_eq!(
        cycles(&graph),
        [["dispatch/executor.rs", "health.rs", "metrics.rs"]]
    );
    let graph = import_graph(&hidden("use crate::dispatch::Pulse;\npub struct Problem;"));
    assert_eq!(
        cycles(&graph),
        [["dispatch/state/beat.rs", "health.rs", "metrics.rs"]]
    );
    let mut paths = Vec::new();
    let mut i = 0;
    use_tree(
        b"a::{b::{C, d as D}, e::*, self}",
        &mut i,
        vec!["r".into()],
        &mut paths,
    );
    let joined: Vec<String> = paths
        .iter()
        .map(|(p, alias)| {
            format!(
                "{}{}",
                p.join("::"),
                alias
                    .as_deref()
                    .map(|a| format!(" as {a}"))
                    .unwrap_or_default()
            )
        })
        .collect();
    assert_eq!(
        joined,
        ["r::a::b::C", "r::a::b::d as D", "r::a::e::*", "r::a::self"]
    );
    assert_eq!(
        named_paths(
            "use super::super::X; x::crate::y; $crate::z",
            &["p".into(), "q".into()]
        ),
        [vec!["X".to_string()]]
    );
}

// ---------------------------------------------------------------------------------------------
// d'. Layers: the daemon's top-level modules name only their own layer or a lower one, and no
// two of them name each other, even through others.
// ---------------------------------------------------------------------------------------------

/// The daemon's layers, lowest first, each a few top-level modules of origin/src (a file `x.rs`
/// or a folder `x/`; `lib` is the crate's root and `main` the binary's). A file names (through
/// `crate::`, `super::` or `self::`, and on through every `pub use` that passes a name on) only
/// modules of its own layer or a lower one. ARCHITECTURE.md draws the same table.
const LAYERS: &[(&str, &[&str])] = &[
    (
        "values, pure rules and leaf helpers",
        &[
            "model",
            "ordering",
            "payload",
            "customer",
            "keyring",
            "event_filter",
            "series",
            "duration",
            "time",
            "redact",
            "term",
            "trace",
            "outbound",
            "alert",
            "pg",
        ],
    ),
    ("the ledger: its contract and both backends", &["ledger"]),
    (
        "running: the dispatcher and what it feeds",
        &[
            "dispatch",
            "metrics",
            "health",
            "retention",
            "charts",
            "ingest",
        ],
    ),
    (
        "doors: the API and the pages, the outbox",
        &["api", "portal", "console", "pages", "outbox", "event_input"],
    ),
    (
        "the binary: CLI, configuration, server",
        &["cli", "load", "config", "server", "lib", "main"],
    ),
];

/// The top-level module a file of origin/src belongs to (`a/b.rs` and `a.rs` are `a`).
fn top_module(path: &str) -> &str {
    let first = path.split('/').next().unwrap_or(path);
    first.strip_suffix(".rs").unwrap_or(first)
}

fn layer_of(module: &str, layers: &[(&str, &[&str])]) -> Option<usize> {
    layers.iter().position(|(_, ms)| ms.contains(&module))
}

/// The top-level modules in no layer or in more than one, and the layers' entries naming no
/// module.
fn unlayered(files: &[(String, String)], layers: &[(&str, &[&str])]) -> Vec<String> {
    let mut modules: Vec<&str> = files.iter().map(|(p, _)| top_module(p)).collect();
    modules.dedup();
    let mut out: Vec<String> = modules
        .iter()
        .filter(|m| layers.iter().filter(|(_, ms)| ms.contains(m)).count() != 1)
        .map(|m| m.to_string())
        .collect();
    for (_, ms) in layers {
        out.extend(
            ms.iter()
                .filter(|m| !modules.contains(m))
                .map(|m| format!("{m} (no such module)")),
        );
    }
    out
}

/// `from -> to` for each import going up: `to`'s module in a higher layer than `from`'s.
fn upward_imports(graph: &[(String, Vec<String>)], layers: &[(&str, &[&str])]) -> Vec<String> {
    let mut found = Vec::new();
    for (from, to) in graph {
        let Some(mine) = layer_of(top_module(from), layers) else {
            continue;
        };
        for t in to {
            if layer_of(top_module(t), layers).is_some_and(|theirs| theirs > mine) {
                found.push(format!("{from} -> {t}"));
            }
        }
    }
    found
}

/// The import graph between top-level modules (from the one between files).
fn module_graph(graph: &[(String, Vec<String>)]) -> Vec<(String, Vec<String>)> {
    let mut modules: Vec<(String, Vec<String>)> = Vec::new();
    for (from, to) in graph {
        let m = top_module(from).to_string();
        let mut to: Vec<String> = to
            .iter()
            .map(|t| top_module(t).to_string())
            .filter(|t| *t != m)
            .collect();
        match modules.iter_mut().find(|(n, _)| *n == m) {
            Some((_, all)) => all.append(&mut to),
            None => modules.push((m, to)),
        }
    }
    for (_, to) in &mut modules {
        to.sort();
        to.dedup();
    }
    modules
}

#[test]
fn the_daemon_s_modules_form_layers() {
    let files = under(&crate_sources(), "origin/src/");
    let graph = import_graph(&files);
    let missing = unlayered(&files, LAYERS);
    assert!(
        missing.is_empty(),
        "top-level modules of origin/src in no layer or in two, or LAYERS entries naming none (origin/tests/tidy.rs): {missing:?}"
    );
    let up = upward_imports(&graph, LAYERS);
    assert!(
        up.is_empty(),
        "imports going up a layer (move what is named down to the layer that owns it): {up:#?}"
    );
    let circles = cycles(&module_graph(&graph));
    assert!(
        circles.is_empty(),
        "top-level modules naming each other, in a circle: {circles:?}"
    );
}

#[test]
fn the_layer_check_catches_an_upward_import() {
    let file = |p: &str, t: &str| (p.to_string(), t.to_string());
    let layers: &[(&str, &[&str])] = &[
        ("low", &["model", "health", "gone"]),
        ("mid", &["dispatch", "metrics"]),
        ("top", &["lib"]),
    ];
    let files = vec![
        file("lib.rs", "pub mod dispatch;\nuse crate::dispatch::run;"),
        file(
            "model.rs",
            "pub struct M;\n#[cfg(test)]\nmod tests {\n    use crate::lib::X;\n}",
        ),
        // Up through a `pub use`: `dispatch/mod.rs` passes `Heartbeat` on from `executor.rs`.
        file(
            "health.rs",
            "use crate::dispatch::Heartbeat;\npub struct Problem;",
        ),
        file(
            "dispatch/mod.rs",
            "mod executor;\npub use executor::Heartbeat;\npub fn run() {}",
        ),
        file(
            "dispatch/executor.rs",
            "use crate::metrics::M;\npub struct Heartbeat;",
        ),
        file(
            "metrics.rs",
            "use crate::health::Problem;\nuse crate::model::M;\npub struct M;",
        ),
        file("stray.rs", "use crate::model::M;"),
    ];
    let graph = import_graph(&files);
    assert_eq!(
        upward_imports(&graph, layers),
        [
            "health.rs -> dispatch/executor.rs",
            "health.rs -> dispatch/mod.rs"
        ]
    );
    assert_eq!(
        unlayered(&files, layers),
        ["stray", "gone (no such module)"]
    );
    assert_eq!(
        cycles(&module_graph(&graph)),
        [["dispatch", "health", "metrics"]]
    );
}

// ---------------------------------------------------------------------------------------------
// e. Sizes: at most 800 lines of code per file before its tests, 120 lines per function.
// ---------------------------------------------------------------------------------------------

/// Lines of code a file may hold before its tests (non-blank lines that are not only a `//`
/// comment, from the top to the first line starting with `#[cfg(test)]`).
const MAX_FILE_CODE: usize = 800;
/// Lines a function may span, from the line holding `fn name` to its closing brace.
const MAX_FN_LINES: usize = 120;
/// Where sizes are checked, from the repository's root.
const SIZED: &[&str] = &["origin/src", "src", "bench/ingest/src", "bench/sink/src"];

/// Offenders still allowed, as `(file, function)` (`""`: the file's lines of code): none since
/// issue 23 cut every one down. The list may only shrink: an entry that no longer offends fails
/// the test until it is removed.
const SIZE_ALLOWLIST: &[(&str, &str)] = &[];

/// `file` for a file over `MAX_FILE_CODE` lines of code, `file: fn name` for a function over
/// `MAX_FN_LINES` lines, each with its size.
fn oversized(files: &[(String, String)]) -> Vec<(String, String, usize)> {
    let mut found = Vec::new();
    for (path, text) in files {
        let lines: Vec<&str> = text.lines().collect();
        let code_lines = lines
            .iter()
            .take_while(|l| !l.starts_with("#[cfg(test)]"))
            .filter(|l| {
                let t = l.trim();
                !t.is_empty() && !t.starts_with("//")
            })
            .count();
        if code_lines > MAX_FILE_CODE {
            found.push((path.clone(), String::new(), code_lines));
        }
        for (i, line) in lines.iter().enumerate() {
            let Some(name) = fn_name(line) else { continue };
            let end = item_end(&lines, i);
            if !lines[end].trim_end().ends_with('}') {
                continue; // a declaration without a body
            }
            if end + 1 - i > MAX_FN_LINES {
                found.push((path.clone(), name, end + 1 - i));
            }
        }
    }
    found
}

/// The name of the function a line starts (`pub(crate) async fn name…`), if it does.
fn fn_name(line: &str) -> Option<String> {
    let mut rest = line.trim_start();
    loop {
        let before = rest;
        for q in [
            "pub(crate) ",
            "pub(super) ",
            "pub ",
            "async ",
            "const ",
            "unsafe ",
            "extern \"C\" ",
        ] {
            rest = rest.strip_prefix(q).unwrap_or(rest);
        }
        if rest == before {
            break;
        }
    }
    let name: String = rest
        .strip_prefix("fn ")?
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

/// The offenders not on `allow`, and the entries of `allow` that no longer offend.
fn size_verdict(
    found: &[(String, String, usize)],
    allow: &[(&str, &str)],
) -> (Vec<String>, Vec<String>) {
    let new = found
        .iter()
        .filter(|(p, f, _)| !allow.iter().any(|(ap, af)| ap == p && af == f))
        .map(|(p, f, n)| format!("{p}:{f} {n} lines"))
        .collect();
    let gone = allow
        .iter()
        .filter(|(ap, af)| !found.iter().any(|(p, f, _)| ap == p && af == f))
        .map(|(p, f)| format!("{p}:{f}"))
        .collect();
    (new, gone)
}

#[test]
fn files_and_functions_stay_small() {
    let mut files = Vec::new();
    for dir in SIZED {
        files.extend(rust_tree(dir));
    }
    let (new, gone) = size_verdict(&oversized(&files), SIZE_ALLOWLIST);
    assert!(
        new.is_empty(),
        "over {MAX_FILE_CODE} lines of code in a file (before its tests) or {MAX_FN_LINES} lines in a function: {new:?}"
    );
    assert!(
        gone.is_empty(),
        "SIZE_ALLOWLIST entries that no longer offend (remove them from origin/tests/tidy.rs): {gone:?}"
    );
}

#[test]
fn the_size_check_catches_a_long_function_and_a_stale_allowance() {
    let long_fn = format!(
        "pub(crate) async fn long() {{\n{}}}\n\nfn short() {{}}\n\ntrait T {{\n    fn decl(\n        &self,\n    ) -> u8;\n    fn two(&self) {{\n        x();\n    }}\n}}\n",
        "    x();\n".repeat(MAX_FN_LINES - 1)
    );
    let big_file = format!(
        "{}// a comment\n\n#[cfg(test)]\nmod tests {{\n{}}}\n",
        "let x = 1;\n".repeat(MAX_FILE_CODE + 1),
        "    fn t() {}\n".repeat(10)
    );
    let files = vec![
        ("src/a.rs".to_string(), long_fn),
        ("src/b.rs".to_string(), big_file),
        ("src/c.rs".to_string(), "fn ok() {\n}\n".to_string()),
    ];
    let found = oversized(&files);
    assert_eq!(
        found,
        [
            ("src/a.rs".to_string(), "long".to_string(), MAX_FN_LINES + 1),
            ("src/b.rs".to_string(), String::new(), MAX_FILE_CODE + 1),
        ]
    );
    let (new, gone) = size_verdict(&found, &[("src/a.rs", "long"), ("src/c.rs", "ok")]);
    assert_eq!(new, [format!("src/b.rs: {} lines", MAX_FILE_CODE + 1)]);
    assert_eq!(gone, ["src/c.rs:ok"]);
}

// ---------------------------------------------------------------------------------------------
// f. Every path ARCHITECTURE.md names exists.
// ---------------------------------------------------------------------------------------------

/// The backticked tokens of a document that look like paths: no space, only path characters,
/// and ending in a known extension or `/`, or starting with a folder of `top` (the repository's
/// top-level folders and origin/src's). Routes (`/metrics`), URLs and `../` are not paths here.
fn named_paths_in(doc: &str, top: &[String]) -> Vec<String> {
    doc.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| {
            !t.is_empty()
                && t.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '/'))
                && !t.starts_with('/')
                && !t.starts_with("../")
        })
        .filter(|t| {
            [".rs", ".mjs", ".js", ".md", ".toml", ".sh", "/"]
                .iter()
                .any(|e| t.ends_with(e))
                || t.split_once('/')
                    .is_some_and(|(first, _)| top.iter().any(|d| d == first))
        })
        .map(str::to_string)
        .collect()
}

/// The tokens naming no tracked file or folder, whole from the root or origin/src, or as the
/// tail of one (a map lists `bucket.rs` in a table under its folder).
fn missing_paths(tokens: &[String], tracked: &[String]) -> Vec<String> {
    let exists = |t: &str| {
        let t = t.trim_end_matches('/');
        tracked.iter().any(|p| {
            p == t
                || p.starts_with(&format!("{t}/"))
                || p.ends_with(&format!("/{t}"))
                || p.contains(&format!("/{t}/"))
        })
    };
    let mut out: Vec<String> = tokens.iter().filter(|t| !exists(t)).cloned().collect();
    out.dedup();
    out
}

fn tracked_paths() -> Vec<String> {
    let out = std::process::Command::new("git")
        .arg("-C")
        .arg(root())
        .args(["ls-files", "-z"])
        .output()
        .expect("git ls-files");
    assert!(out.status.success(), "git ls-files failed");
    String::from_utf8_lossy(&out.stdout)
        .split('\0')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

/// The first segments of tracked paths (from the root and from origin/src).
fn top_folders(tracked: &[String]) -> Vec<String> {
    let mut top: Vec<String> = tracked
        .iter()
        .flat_map(|p| [Some(p.as_str()), p.strip_prefix("origin/src/")])
        .flatten()
        .filter_map(|p| Some(p.split_once('/')?.0.to_string()))
        .collect();
    top.sort();
    top.dedup();
    top
}

#[test]
fn every_path_the_architecture_names_exists() {
    let doc = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let tracked = tracked_paths();
    let missing = missing_paths(&named_paths_in(&doc, &top_folders(&tracked)), &tracked);
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md names paths that do not exist: {missing:?}"
    );
}

#[test]
fn the_map_check_catches_a_stale_path() {
    let tracked: Vec<String> = [
        "origin/src/ledger/mod.rs",
        "src/bucket.rs",
        "tests/lib/harness.mjs",
    ]
    .map(String::from)
    .to_vec();
    let doc =
        "`origin/src/ledger/` `ledger/mod.rs` `bucket.rs` `lib/harness.mjs` `ledger/pg/ops.rs` \
               `gone.rs` `/metrics` `GET /v1/x` `LISTEN/NOTIFY` `scheme://host` `../x.md` `src/`";
    let top = top_folders(&tracked);
    assert_eq!(
        missing_paths(&named_paths_in(doc, &top), &tracked),
        ["ledger/pg/ops.rs", "gone.rs"]
    );
}

// ---------------------------------------------------------------------------------------------
// g. No lane compared as a string.
// ---------------------------------------------------------------------------------------------

/// Files under origin/src that may turn a lane's name into a `Lane`, with the reason.
const LANE_STRINGS_ALLOWED: &[(&str, &str)] = &[(
    "model.rs",
    "`Lane::parse`: the one conversion from the API's and the ledger's text",
)];

/// `path:line` for each comparison with `"edge"` or `"origin"` (`==`, `!=`, a match arm).
fn lane_strings(files: &[(String, String)], allowed: &[(&str, &str)]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, text) in files {
        if allowed.iter().any(|(f, _)| f == path) {
            continue;
        }
        for (i, line) in strip_comments(text).lines().enumerate() {
            let hit = ["\"edge\"", "\"origin\""].iter().any(|lit| {
                [
                    format!("== {lit}"),
                    format!("!= {lit}"),
                    format!("{lit} =="),
                    format!("{lit} !="),
                    format!("{lit} =>"),
                    format!("{lit} |"),
                    format!("| {lit}"),
                ]
                .iter()
                .any(|p| line.contains(p.as_str()))
            });
            if hit {
                found.push(format!("{path}:{}", i + 1));
            }
        }
    }
    found
}

#[test]
fn no_lane_is_compared_as_a_string() {
    let found = lane_strings(&sources(), LANE_STRINGS_ALLOWED);
    assert!(
        found.is_empty(),
        "a lane compared as a string (use `model::Lane`): {found:?}"
    );
}

#[test]
fn the_lane_check_catches_a_string_lane() {
    let files = vec![
        (
            "model.rs".to_string(),
            "match s { \"edge\" => Some(Lane::Edge), _ => None }".to_string(),
        ),
        (
            "metrics.rs".to_string(),
            "let s = \"edge\";\nif lane == \"edge\" {}".to_string(),
        ),
        (
            "dispatch/x.rs".to_string(),
            "match l { \"origin\" | \"auto\" => 1, _ => 2 } // == \"edge\"".to_string(),
        ),
    ];
    assert_eq!(
        lane_strings(&files, LANE_STRINGS_ALLOWED),
        ["metrics.rs:2", "dispatch/x.rs:1"]
    );
}

// ---------------------------------------------------------------------------------------------
// h. No test passes without running.
// ---------------------------------------------------------------------------------------------

/// `path:line` for each test that returns early when not run as root (it would pass having
/// checked nothing): a `!…is_root()` condition followed by a `return` within a few lines.
fn skipped_unless_root(files: &[(String, String)]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, text) in files {
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let unless_root = line.contains("is_root()")
                && (line.contains("if !")
                    || line.contains("!is_root")
                    || line.contains("!common::pg::is_root"));
            let returns = lines
                .iter()
                .skip(i)
                .take(4)
                .any(|l| l.trim_start().starts_with("return"));
            if unless_root && returns {
                found.push(format!("{path}:{}", i + 1));
            }
        }
    }
    found
}

#[test]
fn no_test_returns_early_when_not_root() {
    let found = skipped_unless_root(&rust_tree("origin/tests"));
    assert!(
        found.is_empty(),
        "tests that pass without running when not root (fail loudly instead): {found:?}"
    );
}

#[test]
fn the_root_check_catches_a_silent_skip() {
    let files = vec![(
        "origin/tests/x.rs".to_string(),
        "fn a() {\n    if !common::pg::is_root() {\n        eprintln!(\"skipped\");\n        return;\n    }\n}\nfn b() {\n    assert!(is_root(), \"needs root\");\n    if is_root() {\n        chown();\n    }\n}\n"
            .to_string(),
    )];
    assert_eq!(skipped_unless_root(&files), ["origin/tests/x.rs:2"]);
}

/// Sleeps a test may assert after, by file and a piece of the sleep's line, with the reason: each
/// waits for a time the system under test stated, which is what the test checks.
const SLEEPS_ALLOWED: &[(&str, &str, &str)] = &[
    (
        "tests/edge_limits.test.mjs",
        "sleep(results[20].retry_after_ms)",
        "obeys the wait the edge advertised, then checks it was enough",
    ),
    (
        "tests/edge_failures.test.mjs",
        "sleep(lastWait)",
        "obeys the last wait the edge advertised during a pause, then checks it was enough",
    ),
    (
        "tests/portal.test.mjs",
        "short.expires_at_ms",
        "waits for the expiry the portal link states, then checks it is refused",
    ),
];

/// `path:line` for each sleep followed within three lines by an assertion: a test that waits a
/// guessed time and then asserts what it sees (often that nothing more happened) passes when
/// nothing happened at all. A sleep closing a polling loop (the next line ends the block) is a
/// poll, not a guess.
fn sleeps_then_asserts(files: &[(String, String)], allowed: &[(&str, &str, &str)]) -> Vec<String> {
    let mut found = Vec::new();
    for (path, text) in files {
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let t = line.trim();
            if !t.contains("sleep(")
                || t.starts_with("//")
                || t.contains("fn sleep")
                || t.contains("const sleep")
                || allowed.iter().any(|(f, s, _)| f == path && t.contains(s))
            {
                continue;
            }
            let next: Vec<&str> = lines[i + 1..]
                .iter()
                .map(|l| l.trim())
                .filter(|l| !l.is_empty())
                .take(3)
                .collect();
            let polls = next.first().is_some_and(|l| *l == "}" || *l == "};");
            if !polls && next.iter().any(|l| l.starts_with("assert")) {
                found.push(format!("{path}:{}", i + 1));
            }
        }
    }
    found
}

/// Every file under `dir` (from the root) whose name ends with `ext`, as (path, text).
fn text_tree(dir: &str, ext: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut todo = vec![root().join(dir)];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).expect("a readable directory") {
            let p = entry.expect("a directory entry").path();
            if p.is_dir() {
                todo.push(p);
            } else if p.to_string_lossy().ends_with(ext) {
                let rel = p
                    .strip_prefix(root())
                    .expect("under the root")
                    .to_string_lossy()
                    .replace('\\', "/");
                out.push((rel, std::fs::read_to_string(&p).expect("a readable file")));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn no_test_sleeps_and_then_asserts() {
    let mut files = text_tree("origin/tests", ".rs");
    files.extend(text_tree("tests", ".mjs"));
    let found = sleeps_then_asserts(&files, SLEEPS_ALLOWED);
    assert!(
        found.is_empty(),
        "tests that sleep and then assert (wait for an event: a count, a status, a later marker): {found:?}"
    );
}

#[test]
fn the_sleep_check_catches_a_guessed_wait() {
    let files = vec![
        (
            "origin/tests/x.rs".to_string(),
            "    run.api.events(e).await;\n    tokio::time::sleep(Duration::from_secs(3)).await;\n    let sent = sub.count();\n    assert!(sent <= 4);\n    loop {\n        if done() {\n            break;\n        }\n        tokio::time::sleep(Duration::from_millis(50)).await;\n    }\n    assert!(done());\n".to_string(),
        ),
        (
            "tests/y.test.mjs".to_string(),
            "import { sleep } from './lib/harness.mjs';\n  await sleep(300);\n\n  assert.equal(sub.requests.length, 1);\n  await sleep(results[20].retry_after_ms);\n  assert.equal(n, 2);\n".to_string(),
        ),
    ];
    let allowed = [(
        "tests/y.test.mjs",
        "retry_after_ms",
        "obeys the stated wait",
    )];
    assert_eq!(
        sleeps_then_asserts(&files, &allowed),
        ["origin/tests/x.rs:2", "tests/y.test.mjs:2"]
    );
}

// ---------------------------------------------------------------------------------------------
// OpenTelemetry is named only by the daemon's `trace.rs`: not by the core, not by the Worker,
// not by another module of the daemon (they speak `crate::trace`).
// ---------------------------------------------------------------------------------------------

/// The one file, under the repository, that may name `opentelemetry`.
const TELEMETRY: &str = "origin/src/trace.rs";

/// Files (paths from the repository's root) that name `opentelemetry` in code, besides
/// [`TELEMETRY`].
fn telemetry_out_of_place(files: &[(String, String)]) -> Vec<String> {
    files
        .iter()
        .filter(|(p, t)| p != TELEMETRY && strip_comments(t).contains("opentelemetry"))
        .map(|(p, _)| p.clone())
        .collect()
}

#[test]
fn only_trace_rs_names_opentelemetry() {
    let found = telemetry_out_of_place(&crate_sources());
    assert!(
        found.is_empty(),
        "opentelemetry named outside {TELEMETRY} (use crate::trace): {found:?}"
    );
    let caught = telemetry_out_of_place(&[
        (
            "src/wire.rs".to_string(),
            "use opentelemetry::trace::Span;".to_string(),
        ),
        (
            TELEMETRY.to_string(),
            "use opentelemetry::KeyValue;".to_string(),
        ),
    ]);
    assert_eq!(caught, ["src/wire.rs"]);
}
