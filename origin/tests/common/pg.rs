//! A throwaway PostgreSQL server per test: a data directory in a temp dir (copied from a cluster
//! initialised once per build, under `CARGO_TARGET_TMPDIR`, or the temp dir for the crate's own
//! tests that include this file), a free port on 127.0.0.1, its unix
//! socket in the same temp dir; stopped and removed when the handle drops. No service is assumed
//! to be running. PostgreSQL refuses to run as root: as root, the files belong to `postgres` and
//! every server command runs through `runuser -u postgres --`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The directory holding `initdb`, `pg_ctl` and `postgres`: `FANOUT_PG_BIN`, or the newest
/// `/usr/lib/postgresql/*/bin` (`scripts/setup.sh` installs it when missing).
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FANOUT_PG_BIN") {
        return PathBuf::from(dir);
    }
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is not installed (run scripts/setup.sh)")
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let v: u32 = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("postgres").exists().then_some((v, bin))
        })
        .collect();
    found.sort();
    found
        .pop()
        .expect("no /usr/lib/postgresql/*/bin/postgres (run scripts/setup.sh)")
        .1
}

pub fn is_root() -> bool {
    // The effective uid, without libc: /proc/self/status has "Uid: real effective …".
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|u| u == "0"))
        })
        .unwrap_or(false)
}

/// `program args…` as the user PostgreSQL runs as.
fn server_command(program: &str) -> Command {
    let path = bin_dir().join(program);
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(path);
        c
    } else {
        Command::new(path)
    }
}

fn run(mut c: Command, what: &str) {
    let out = c
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn give_to_postgres(path: &Path) {
    if is_root() {
        let mut c = Command::new("chown");
        c.args(["-R", "postgres:postgres"]).arg(path);
        run(c, "chown");
    }
}

/// A cluster initialised once per build and copied for each server (initdb is the slow part).
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        // Integration tests get a scratch directory of their own; the crate's unit tests
        // (`ledger/postgres/tests/`, which include this file) keep theirs under the temp dir.
        let root = option_env!("CARGO_TARGET_TMPDIR").map_or_else(
            || std::env::temp_dir().join("fanout-pg-tests"),
            PathBuf::from,
        );
        std::fs::create_dir_all(&root).unwrap();
        let version = bin_dir()
            .parent()
            .and_then(|p| p.file_name())
            .map(|v| v.to_string_lossy().into_owned())
            .unwrap_or_default();
        let done = root.join(format!("pg{version}-template"));
        if done.join("PG_VERSION").exists() {
            return done;
        }
        // initdb in /tmp (the server user can reach it), then move it into place atomically.
        let scratch = tempfile::tempdir().unwrap();
        give_to_postgres(scratch.path());
        let data = scratch.path().join("data");
        let mut init = server_command("initdb");
        init.arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"])
            .arg("--locale=C");
        run(init, "initdb");
        let staged = root.join(format!("pg{version}-template.{}", std::process::id()));
        let mut cp = Command::new("cp");
        cp.arg("-a").arg(&data).arg(&staged);
        run(cp, "copying the template cluster");
        if std::fs::rename(&staged, &done).is_err() {
            // Another test binary got there first.
            let _ = std::fs::remove_dir_all(&staged);
        }
        done
    })
}

/// A free TCP port on 127.0.0.1 (free when asked; the caller binds it soon after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A running throwaway server. Dropping it stops the server and removes its files.
#[derive(Debug)]
pub struct PgServer {
    pub port: u16,
    dir: tempfile::TempDir,
    stopped: bool,
}

impl PgServer {
    /// Start a server with `fsync` off (tests): its data does not outlive it anyway.
    pub fn start() -> PgServer {
        PgServer::start_with(&["-c", "fsync=off", "-c", "synchronous_commit=off"])
    }

    /// Start a server with extra `postgres` options (`-c name=value` …).
    pub fn start_with(options: &[&str]) -> PgServer {
        PgServer::start_env(options, &[])
    }

    /// Start a server with extra `postgres` options and these variables in its environment
    /// (libfaketime's, to shift the time the server reads).
    pub fn start_env(options: &[&str], env: &[(&str, &str)]) -> PgServer {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut cp = Command::new("cp");
        cp.arg("-a").arg(template()).arg(&data);
        run(cp, "copying the template cluster");
        std::fs::create_dir(dir.path().join("sock")).unwrap();
        give_to_postgres(dir.path());
        // A port that was free a moment ago: retry on the rare collision.
        for _ in 0..5 {
            let port = free_port();
            let mut opts = format!(
                "-p {port} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200",
                dir.path().join("sock").display()
            );
            for o in options {
                opts.push(' ');
                opts.push_str(o);
            }
            let mut start = server_command("pg_ctl");
            start
                .arg("-D")
                .arg(&data)
                .arg("-l")
                .arg(dir.path().join("log"))
                .args(["-w", "-t", "60", "-o", &opts, "start"])
                .envs(env.iter().copied());
            let ok = start
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                return PgServer {
                    port,
                    dir,
                    stopped: false,
                };
            }
        }
        let log = std::fs::read_to_string(dir.path().join("log")).unwrap_or_default();
        panic!("the throwaway PostgreSQL server did not start:\n{log}");
    }

    /// `postgres://postgres@127.0.0.1:PORT/DB`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// A new, empty database on this server; returns its URL.
    pub async fn database(&self, name: &str) -> String {
        let client = self.connect("postgres").await;
        client
            .batch_execute(&format!("CREATE DATABASE \"{name}\""))
            .await
            .unwrap();
        self.url(name)
    }

    /// A plain client (the tests' own view of the database).
    pub async fn connect(&self, db: &str) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.url(db), tokio_postgres::NoTls)
            .await
            .unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        client
    }

    /// The server's log so far (for failure messages).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("log")).unwrap_or_default()
    }

    /// The server's processes: the postmaster (its `postmaster.pid`) and its children.
    fn processes(&self) -> Vec<u32> {
        let pid_file = self.dir.path().join("data/postmaster.pid");
        let Some(main) = std::fs::read_to_string(pid_file)
            .ok()
            .and_then(|t| t.lines().next()?.trim().parse::<u32>().ok())
        else {
            return Vec::new();
        };
        let mut pids = vec![main];
        for e in std::fs::read_dir("/proc").unwrap().filter_map(|e| e.ok()) {
            let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            // /proc/PID/stat: "pid (comm) state ppid …"; comm may hold spaces, so after ')'.
            let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
            if ppid == Some(main) {
                pids.push(pid);
            }
        }
        pids
    }

    fn signal(&self, sig: &str) {
        let pids = self.processes();
        assert!(!pids.is_empty(), "no server process to signal");
        let mut c = Command::new("kill");
        c.arg(format!("-{sig}"))
            .args(pids.iter().map(|p| p.to_string()));
        run(c, "kill");
    }

    /// Freeze the server (SIGSTOP to every one of its processes): its connections stay open
    /// and nothing answers, as a server stalled on its disk looks from a client.
    pub fn stall(&self) {
        self.signal("STOP");
    }

    /// Let a stalled server go on (SIGCONT).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    /// Stop now (also done on drop).
    pub fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        // A stalled server would not hear pg_ctl.
        let pids = self.processes();
        if !pids.is_empty() {
            let _ = Command::new("kill")
                .arg("-CONT")
                .args(pids.iter().map(|p| p.to_string()))
                .stdin(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
        let mut stop = server_command("pg_ctl");
        stop.arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let _ = stop.status();
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A small disk for the server: a tmpfs of a few MiB mounted on a temp dir the server may
/// write, unmounted when dropped (drop the server first). Mounting needs root, which the test
/// command has in CI.
#[derive(Debug)]
pub struct SmallDisk {
    dir: tempfile::TempDir,
}

impl SmallDisk {
    pub fn mount(mib: u32) -> SmallDisk {
        assert!(is_root(), "mounting a tmpfs needs root");
        let dir = tempfile::tempdir().unwrap();
        let mut c = Command::new("mount");
        c.args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir.path());
        run(c, "mount -t tmpfs");
        give_to_postgres(dir.path());
        SmallDisk { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Make room: the same tmpfs, `mib` MiB now (its files stay).
    pub fn grow(&self, mib: u32) {
        let mut c = Command::new("mount");
        c.args(["-o", &format!("remount,size={mib}m")])
            .arg(self.dir.path());
        run(c, "mount -o remount");
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .stdin(Stdio::null())
            .status();
    }
}

/// A TCP proxy in front of a server that can go silent on the connections that listen: what a
/// load balancer that drops idle connections without a word looks like from the daemon (its
/// socket stays open, nothing it sends arrives, nothing comes back). Each connection's bytes are
/// passed through as they come; one whose client sent `LISTEN ` is a listening connection.
pub struct SilencingProxy {
    pub port: u16,
    conns: std::sync::Arc<std::sync::Mutex<Vec<std::sync::Arc<ProxiedConn>>>>,
    accept: tokio::task::JoinHandle<()>,
}

#[derive(Default)]
struct ProxiedConn {
    listens: std::sync::atomic::AtomicBool,
    silent: std::sync::atomic::AtomicBool,
}

impl SilencingProxy {
    pub async fn start(target_port: u16) -> SilencingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let conns: std::sync::Arc<std::sync::Mutex<Vec<std::sync::Arc<ProxiedConn>>>> =
            Default::default();
        let all = conns.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", target_port)).await
                else {
                    continue;
                };
                let conn = std::sync::Arc::new(ProxiedConn::default());
                all.lock().unwrap().push(conn.clone());
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(pump(cr, sw, conn.clone(), true));
                tokio::spawn(pump(sr, cw, conn, false));
            }
        });
        SilencingProxy {
            port,
            conns,
            accept,
        }
    }

    /// Silence every listening connection open now (later ones pass); how many.
    pub fn silence_listeners(&self) -> usize {
        use std::sync::atomic::Ordering;
        let conns = self.conns.lock().unwrap();
        let mut n = 0;
        for c in conns.iter().filter(|c| c.listens.load(Ordering::SeqCst)) {
            c.silent.store(true, Ordering::SeqCst);
            n += 1;
        }
        n
    }
}

/// One direction of a proxied connection, passed through until either side closes; once the
/// connection is silenced it parks with its sockets open. From the client (`from_client`), a
/// `LISTEN ` marks the connection as a listening one.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    conn: std::sync::Arc<ProxiedConn>,
    from_client: bool,
) {
    use std::sync::atomic::Ordering;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        if from_client && buf[..n].windows(7).any(|w| w == b"LISTEN ") {
            conn.listens.store(true, Ordering::SeqCst);
        }
        if conn.silent.load(Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
}

impl Drop for SilencingProxy {
    fn drop(&mut self) {
        self.accept.abort();
    }
}
