//! The throwaway MariaDB with a binary log (scripts/binlog.sh, 127.0.0.1:3361) that the
//! push path's tests need: the shared server runs without one. The first test that needs
//! it starts it when it is down; the last one of the process to finish stops it (when
//! this process started it), also when a test fails. What a test made on it (tables,
//! users) is dropped by its guard.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// The server's URL.
pub const BINLOG_URL: &str = "mysql://root@127.0.0.1:3361/test";
const PORT: &str = "3361";

/// Tests of this process using the server, and whether this process started it.
static USERS: Mutex<(usize, bool)> = Mutex::new((0, false));

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/binlog.sh")
}

fn running() -> bool {
    sql("SELECT 1").is_ok()
}

/// Runs `statement` on the server as root with the `mariadb` client.
pub fn sql(statement: &str) -> Result<String, String> {
    let out = Command::new("mariadb")
        .args(["-h", "127.0.0.1", "-P", PORT, "-u", "root", "-N", "-B", "test", "-e", statement])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("the mariadb client: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

/// A test's hold on the server: started if down; what the test made, dropped.
pub struct BinlogServer {
    tables: Mutex<Vec<String>>,
    users: Mutex<Vec<String>>,
}

impl BinlogServer {
    /// Starts the server when it is down (panics, loudly, when it cannot).
    pub fn hold() -> BinlogServer {
        let mut users = USERS.lock().unwrap_or_else(|e| e.into_inner());
        if !running() {
            let status = Command::new(script()).arg("up").status().expect("run scripts/binlog.sh up");
            assert!(
                status.success(),
                "scripts/binlog.sh up failed: the push tests need a MariaDB with log_bin"
            );
            users.1 = true;
        }
        users.0 += 1;
        BinlogServer { tables: Mutex::default(), users: Mutex::default() }
    }

    /// Drops table `name` with this guard.
    pub fn table(&self, name: &str) {
        self.tables.lock().unwrap_or_else(|e| e.into_inner()).push(name.to_owned());
    }

    /// Makes user `name` (password `name`) with `grants` (each `PRIV ON what`), dropped
    /// with this guard; returns its URL.
    pub fn user(&self, name: &str, grants: &[&str]) -> String {
        self.users.lock().unwrap_or_else(|e| e.into_inner()).push(name.to_owned());
        sql(&format!("CREATE USER '{name}'@'%' IDENTIFIED BY '{name}'")).expect("create the user");
        for grant in grants {
            sql(&format!("GRANT {grant} TO '{name}'@'%'")).expect("grant");
        }
        format!("mysql://{name}:{name}@127.0.0.1:{PORT}/test")
    }
}

impl Drop for BinlogServer {
    fn drop(&mut self) {
        for table in self.tables.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = sql(&format!("DROP TABLE IF EXISTS `{table}_positions`, `{table}`"));
        }
        for user in self.users.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            let _ = sql(&format!("DROP USER IF EXISTS '{user}'@'%'"));
        }
        let mut users = USERS.lock().unwrap_or_else(|e| e.into_inner());
        users.0 -= 1;
        if users.0 == 0 && users.1 {
            users.1 = false;
            let _ = Command::new(script()).arg("down").stderr(Stdio::null()).status();
        }
    }
}
