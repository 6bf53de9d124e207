//! A PgBouncer of the test's own in transaction pooling mode, in front of the test
//! PostgreSQL server, on a free loopback port; stopped when the guard is dropped (also when
//! the test panics).
//!
//! Shared, by `#[path]`, by the integration tests of rowbus and rowbus-cli. PgBouncer must
//! be installed (scripts/services.sh installs Debian's `pgbouncer`): a test that needs it
//! fails without it, it does not skip.
#![allow(dead_code)]

use std::fs;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// How long PgBouncer may take to accept connections.
const START_TIMEOUT: Duration = Duration::from_secs(15);

/// A running PgBouncer, killed when dropped.
pub struct PgBouncer {
    child: Child,
    dir: PathBuf,
    port: u16,
}

impl PgBouncer {
    /// Starts one in transaction pooling mode with a pool of two server connections (so
    /// that clients share them), database `test` on the test server, every user let in.
    /// A port taken between choosing it and PgBouncer's bind is chosen again.
    pub fn start() -> PgBouncer {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rowbus-pgbouncer-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        fs::create_dir_all(&dir).unwrap();
        // Readable by the user PgBouncer runs as, when started as root.
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
        let binary = ["pgbouncer", "/usr/sbin/pgbouncer"]
            .into_iter()
            .find(|b| Command::new(b).arg("--version").output().is_ok_and(|o| o.status.success()))
            .expect("pgbouncer is not installed: scripts/services.sh installs it (Debian's `pgbouncer`)");
        let mut tries = 0;
        loop {
            tries += 1;
            let port = free_port();
            let ini = dir.join("pgbouncer.ini");
            fs::write(
                &ini,
                format!(
                    "[databases]\n\
                     test = host=127.0.0.1 port=5432 dbname=test user=postgres\n\
                     [pgbouncer]\n\
                     listen_addr = 127.0.0.1\n\
                     listen_port = {port}\n\
                     unix_socket_dir =\n\
                     auth_type = any\n\
                     pool_mode = transaction\n\
                     ignore_startup_parameters = extra_float_digits\n\
                     max_client_conn = 200\n\
                     default_pool_size = 2\n"
                ),
            )
            .unwrap();
            fs::set_permissions(&ini, fs::Permissions::from_mode(0o644)).unwrap();
            let log = fs::File::create(dir.join("pgbouncer.log")).unwrap();
            let mut command = Command::new(binary);
            // PgBouncer refuses to run as root: it switches to the server's user.
            if fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(1) == 0 {
                command.args(["-u", "postgres"]);
            }
            let mut child = command
                .arg(&ini)
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("pgbouncer starts");
            match wait_until_up(&mut child, port, &dir) {
                Ok(()) => return PgBouncer { child, dir, port },
                Err(why) => {
                    let _ = child.kill();
                    let _ = child.wait();
                    if tries == 5 {
                        let _ = fs::remove_dir_all(&dir);
                        panic!("pgbouncer did not start: {why}");
                    }
                    eprintln!("pgbouncer on port {port} did not start ({why}): trying another port");
                }
            }
        }
    }

    /// The URL of database `test` through it (without `pgbouncer=true`).
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/test", self.port)
    }

    /// What it logged so far.
    pub fn log(&self) -> String {
        log_in(&self.dir)
    }
}

/// What the PgBouncer started in `dir` logged so far.
fn log_in(dir: &Path) -> String {
    fs::read_to_string(dir.join("pgbouncer.log")).unwrap_or_default()
}

/// Waits until the PgBouncer `child` says it listens on `port` and accepts a connection
/// there; else why not, with its log.
fn wait_until_up(child: &mut Child, port: u16, dir: &Path) -> Result<(), String> {
    let deadline = Instant::now() + START_TIMEOUT;
    let listening = format!("listening on 127.0.0.1:{port}");
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Err(format!("it exited {status}:\n{}", log_in(dir)));
        }
        if log_in(dir).contains(&listening) && TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!("not accepting within {START_TIMEOUT:?}:\n{}", log_in(dir)));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// A loopback port free a moment ago.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
