//! A throwaway PostgreSQL with production settings (autovacuum on), started by
//! scripts/pg-throwaway.sh on a port of the test's own and stopped when the guard is
//! dropped, also when the test fails: what the shared server (autovacuum off, shared with
//! other programs) must not be used for, such as a horizon held open for tens of seconds.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::Command;

/// A running throwaway server; dropping it stops the server and removes its data.
pub struct ThrowawayPg {
    port: u16,
}

fn script(args: &[&str]) -> std::process::Output {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/pg-throwaway.sh");
    Command::new(&path).args(args).output().unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()))
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
