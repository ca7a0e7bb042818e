//! The ledger's files against the real binary: one owner per file whatever path names it, a
//! copy that never runs beside a daemon, files only their owner can read, and backups that
//! leave nothing half-written.
// The helpers below belong to the tests: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::pg::{is_root, PgServer, SmallDisk};
use common::*;
use serde_json::json;

fn fanout() -> Command {
    Command::new(env!("CARGO_BIN_EXE_fanout"))
}

/// `fanout args…` run under umask 022 (what most services get): files it creates that are not
/// explicitly private come out 0644.
fn fanout_umask_022(args: &[&str]) -> Command {
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("umask 022; exec \"$0\" \"$@\"")
        .arg(env!("CARGO_BIN_EXE_fanout"))
        .args(args)
        .env("FANOUT_API_TOKEN", TOKEN)
        .env("FANOUT_LOG", "warn");
    c
}

fn serve_args(db: &Path, port: u16) -> Vec<String> {
    vec![
        "serve".into(),
        "--db".into(),
        db.to_str().unwrap().into(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--allow-loopback".into(),
    ]
}

async fn healthy(port: u16) -> bool {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    matches!(
        http.get(format!("http://127.0.0.1:{port}/healthz")).send().await,
        Ok(r) if r.status() == 200
    )
}

/// A second `fanout serve` on `db`: it must exit refusing; one that answers `/healthz`
/// instead (or is still running after 30 s) started beside the owner.
async fn second_daemon(db: &Path) -> Output {
    let port = free_port();
    let mut child: Child = fanout()
        .args(serve_args(db, port))
        .env("FANOUT_API_TOKEN", TOKEN)
        .env("FANOUT_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if healthy(port).await || Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "a second daemon started on {} beside the owner",
                db.display()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn with_suffix(db: &Path, suffix: &str) -> PathBuf {
    let mut name = db.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_file_has_one_owner_under_any_name() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fanout.db");
    let owner = Binary::start(&db, &[]).await;
    let link = dir.path().join("link.db");
    std::os::unix::fs::symlink(&db, &link).unwrap();
    let hard = dir.path().join("hard.db");
    std::fs::hard_link(&db, &hard).unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let spelled = dir.path().join("sub").join("..").join("fanout.db");
    let pid = format!("pid {}", owner.child.id());
    for (path, names_owner) in [(&link, true), (&spelled, true), (&hard, false), (&db, true)] {
        let out = second_daemon(path).await;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{}: {stderr}", path.display());
        assert!(
            stderr.contains("owned by another daemon"),
            "{}: {stderr}",
            path.display()
        );
        if names_owner {
            assert!(stderr.contains(&pid), "{}: {stderr}", path.display());
        } else {
            assert!(stderr.contains("under another name"), "{stderr}");
        }
    }
    // The owner still serves.
    assert!(healthy(owner.api.base.rsplit(':').next().unwrap().parse().unwrap()).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_copy_refuses_while_a_daemon_owns_the_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fanout.db");
    let mut daemon = Binary::start(&db, &[]).await;
    let sink = Subscriber::ok().await;
    daemon
        .api
        .subscriber(sub_spec("sub_a", &format!("{}/h", sink.url), &["*"]))
        .await;
    daemon.api.events(events("evt", 50, "t.x")).await;
    let server = PgServer::start();
    let url = server.database("copy").await;
    let copy = || {
        fanout()
            .args(["ledger", "copy", "--from"])
            .arg(&db)
            .args(["--to", &url])
            .output()
            .unwrap()
    };
    let out = copy();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "copied beside a daemon: {stderr}");
    assert!(
        stderr.contains(&format!("pid {}", daemon.child.id())) && stderr.contains("stop it"),
        "{stderr}"
    );
    // Stopped, the daemon's ledger copies whole, into a target the refusal left empty.
    daemon.terminate();
    let out = copy();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("events: 50/50"), "{stderr}");
    // And the copy let go of the ledger: a daemon starts on it again.
    drop(Binary::start(&db, &[]).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ledger_files_and_backups_are_private_whatever_the_umask() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fanout.db");
    let files = [
        db.clone(),
        with_suffix(&db, "-wal"),
        with_suffix(&db, "-shm"),
        with_suffix(&db, ".lock"),
    ];
    let start = || async {
        let port = free_port();
        let child = fanout_umask_022(
            &serve_args(&db, port)
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
        let d = Binary {
            api: Api::new(format!("http://127.0.0.1:{port}")),
            child,
        };
        wait_for("healthz", Duration::from_secs(20), || healthy(port)).await;
        d
    };
    let mut d = start().await;
    let sink = Subscriber::ok().await;
    d.api
        .subscriber(sub_spec("sub_a", &format!("{}/h", sink.url), &["*"]))
        .await;
    d.api.events(events("evt", 5, "t.x")).await;
    for f in &files {
        assert_eq!(mode(f), 0o600, "{}", f.display());
    }
    let backup = dir.path().join("backup.db");
    let out = fanout_umask_022(&["backup", "--db", db.to_str().unwrap(), "--to"])
        .arg(&backup)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(mode(&backup), 0o600);

    // Files an earlier version left world-readable are made private when the daemon opens them
    // (killed, so that its -wal and -shm stay).
    d.kill9();
    for f in &files {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let _d = start().await;
    for f in &files {
        assert_eq!(mode(f), 0o600, "{} after a restart", f.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_without_room_leaves_nothing_and_names_its_destination() {
    assert!(
        is_root(),
        "this test mounts a 1 MiB tmpfs, which needs root: run the tests as root (scripts/test.sh and CI do)"
    );
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("fanout.db");
    let daemon = Binary::start(&db, &[]).await;
    let sink = Subscriber::ok().await;
    daemon
        .api
        .subscriber(sub_spec("sub_a", &format!("{}/h", sink.url), &["*"]))
        .await;
    // About 4 MiB of events: more than the small disk holds.
    let pad = "x".repeat(60_000);
    for batch in 0..7 {
        let events: Vec<_> = (0..10)
            .map(|i| json!({ "id": format!("evt_{batch}_{i}"), "type": "t.x", "pad": pad }))
            .collect();
        daemon.api.events(json!(events)).await;
    }
    let disk = SmallDisk::mount(1);
    let to = disk.path().join("fanout-backup.db");
    let backup = || {
        fanout()
            .args(["backup", "--db", db.to_str().unwrap(), "--to"])
            .arg(&to)
            .output()
            .unwrap()
    };
    let out = backup();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&to.display().to_string()) && stderr.contains("no space left"),
        "names the destination and why: {stderr}"
    );
    assert!(
        !stderr.contains("the ledger cannot write"),
        "the ledger is not what failed: {stderr}"
    );
    let left: Vec<_> = std::fs::read_dir(disk.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    // With room, the same command succeeds: nothing blocks the retry.
    disk.grow(32);
    let out = backup();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let c = rusqlite::Connection::open(&to).unwrap();
    let n: i64 = c
        .query_row("SELECT COUNT(*) FROM events", [], |r| r.get(0))
        .unwrap();
    assert_eq!(n, 70);
    assert_eq!(mode(&to), 0o600);
}
