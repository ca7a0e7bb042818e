//! The daemon reaches PostgreSQL over TLS: a throwaway server with `ssl=on` and a certificate
//! made here by a throwaway CA. No `sslmode` (prefer, as libpq) connects encrypted to it (and
//! in plain text to every other test's server, which has no TLS); `sslmode=require` connects
//! (encrypted, unchecked),
//! `verify-full` with that CA connects, `verify-full` with another CA is refused naming the
//! certificate.
// The helpers below belong to the tests: a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::pg::{is_root, PgServer};
use common::*;

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA `name.pem` (key `name.key`) in `dir`.
fn ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN={name}"),
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.pem"),
        ],
    );
}

/// `server.crt`/`server.key` for 127.0.0.1, signed by the CA `issuer`.
fn server_cert(dir: &Path, issuer: &str) {
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            &format!("{issuer}.pem"),
            "-CAkey",
            &format!("{issuer}.key"),
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            "server.crt",
        ],
    );
}

/// `fanout serve` on `db` that must fail to start: its stderr.
async fn refused(db: &str) -> String {
    let port = free_port();
    let mut child = Command::new(env!("CARGO_BIN_EXE_fanout"))
        .args([
            "serve",
            "--db",
            db,
            "--listen",
            &format!("127.0.0.1:{port}"),
        ])
        .env("FANOUT_API_TOKEN", TOKEN)
        .env("FANOUT_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("fanout serve --db {db} is still running");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_over_tls_require_and_verify_full() {
    let certs = tempfile::tempdir().unwrap();
    let dir = certs.path();
    ca(dir, "right_ca");
    ca(dir, "other_ca");
    server_cert(dir, "right_ca");
    std::fs::set_permissions(
        dir.join("server.key"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    if is_root() {
        // The server runs as postgres: its certificate and key must be its own.
        let ok = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(ok.success());
    }
    let server = PgServer::start_with(&[
        "-c",
        "fsync=off",
        "-c",
        "ssl=on",
        "-c",
        &format!("ssl_cert_file={}", dir.join("server.crt").display()),
        "-c",
        &format!("ssl_key_file={}", dir.join("server.key").display()),
    ]);
    let url = server.database("tls").await;
    let watcher = server.connect("postgres").await;
    // How many of the daemons' connections to the ledger are (not) encrypted.
    let connections = || async {
        let row = watcher
            .query_one(
                "SELECT count(*) FILTER (WHERE s.ssl), count(*) FILTER (WHERE NOT s.ssl)
                 FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid)
                 WHERE a.datname = 'tls'",
                &[],
            )
            .await
            .unwrap();
        (row.get::<_, i64>(0), row.get::<_, i64>(1))
    };

    let sink = Subscriber::ok().await;
    let right = dir.join("right_ca.pem");
    // No sslmode (libpq's default, prefer), then require, then verify-full: each encrypted.
    for (i, db) in [
        url.clone(),
        format!("{url}?sslmode=require"),
        format!("{url}?sslmode=verify-full&sslrootcert={}", right.display()),
    ]
    .iter()
    .enumerate()
    {
        let daemon = Binary::start(Path::new(db), &[]).await;
        daemon
            .api
            .subscriber(sub_spec(
                &format!("sub_{i}"),
                &sink.url,
                &[&format!("t{i}.*")],
            ))
            .await;
        daemon
            .api
            .events(events(&format!("evt{i}"), 3, &format!("t{i}.x")))
            .await;
        wait_for("delivered", Duration::from_secs(20), || async {
            daemon
                .api
                .count(&format!("status=sent&subscriber=sub_{i}"))
                .await
                == 3
        })
        .await;
        let (encrypted, plain) = connections().await;
        assert!(encrypted > 0, "{db}: no TLS connection");
        assert_eq!(plain, 0, "{db}: {plain} connections without TLS");
    }

    let other = dir.join("other_ca.pem");
    let stderr = refused(&format!(
        "{url}?sslmode=verify-full&sslrootcert={}",
        other.display()
    ))
    .await;
    assert!(
        stderr.contains("TLS handshake") && stderr.contains("invalid peer certificate"),
        "a clear refusal: {stderr}"
    );
    // The right CA, but the certificate is not for the name the URL gives: refused too.
    let stderr = refused(&format!(
        "{}?sslmode=verify-full&sslrootcert={}",
        url.replace("127.0.0.1", "localhost"),
        right.display()
    ))
    .await;
    assert!(
        stderr.contains("invalid peer certificate") && stderr.contains("not valid for name"),
        "{stderr}"
    );
    let stderr = refused(&format!("{url}?sslmode=verify-ca")).await;
    assert!(stderr.contains("verify-full"), "{stderr}");
}
