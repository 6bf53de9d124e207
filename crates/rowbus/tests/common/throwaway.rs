//! Throwaway servers with production settings, each on a port of the test's own and
//! stopped when its guard is dropped, also when the test fails: a PostgreSQL with
//! autovacuum on (scripts/pg-throwaway.sh), a MariaDB with a binary log
//! (scripts/binlog.sh, in a directory of the port's own). What the shared servers
//! (autovacuum off, no binary log, shared with other programs) must not be used for, such
//! as a horizon held open for tens of seconds.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// A running throwaway server; dropping it stops the server and removes its data.
pub struct ThrowawayPg {
    port: u16,
}

fn script(args: &[&str]) -> std::process::Output {
    run("pg-throwaway.sh", args, &[])
}

/// Runs scripts/`name` with `args` and the environment `env`.
fn run(name: &str, args: &[&str], env: &[(&str, String)]) -> std::process::Output {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts").join(name);
    Command::new(&path)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()))
}

/// A running throwaway MariaDB (with a binary log, as production servers run); dropping
/// it stops the server and removes its data.
pub struct ThrowawayMariaDb {
    port: u16,
}

impl ThrowawayMariaDb {
    fn env(port: u16) -> [(&'static str, String); 2] {
        [("BINLOG_PORT", port.to_string()), ("BINLOG_DIR", format!("/tmp/rowbus-mariadb-{port}"))]
    }

    /// Starts the server on `port` (a new one), or panics with the script's output.
    pub fn start(port: u16) -> ThrowawayMariaDb {
        let _ = run("binlog.sh", &["down"], &Self::env(port));
        let out = run("binlog.sh", &["up"], &Self::env(port));
        assert!(
            out.status.success(),
            "scripts/binlog.sh up on {port} failed (it needs root and Debian's mariadb-server):\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ThrowawayMariaDb { port }
    }

    /// Its `test` database's URL.
    pub fn url(&self) -> String {
        format!("mysql://root@127.0.0.1:{}/test", self.port)
    }
}

impl Drop for ThrowawayMariaDb {
    fn drop(&mut self) {
        let out = run("binlog.sh", &["down"], &Self::env(self.port));
        if !out.status.success() {
            eprintln!(
                "throwaway: stopping MariaDB on {} failed: {}",
                self.port,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}

impl ThrowawayPg {
    /// Starts the server on `port` (a new one: one left running by a crashed run is
    /// replaced), or panics with the script's output.
    pub fn start(port: u16) -> ThrowawayPg {
        let port_text = port.to_string();
        let _ = script(&["down", &port_text]);
        let out = script(&["up", &port_text]);
        assert!(
            out.status.success(),
            "scripts/pg-throwaway.sh up {port} failed (it needs root and Debian's postgresql):\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        ThrowawayPg { port }
    }

    /// Its `test` database's URL.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/test", self.port)
    }
}

impl Drop for ThrowawayPg {
    fn drop(&mut self) {
        let out = script(&["down", &self.port.to_string()]);
        if !out.status.success() {
            eprintln!(
                "throwaway: stopping the server on {} failed: {}",
                self.port,
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
}
