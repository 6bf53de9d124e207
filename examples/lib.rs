//! What the examples share: a SQLite database file of their own.
//!
//! Each example runs on SQLite so that it runs anywhere with no server; the same code
//! runs on PostgreSQL or MySQL/MariaDB with `Postgres` or `MySql` in place of `Sqlite`
//! (and the database's own placeholders, `$1` or `?`, in the SQL an example writes).

use std::path::PathBuf;

/// A SQLite database file in the temporary directory, made afresh and removed (with its
/// `-wal` and `-shm` files) when dropped.
#[derive(Debug)]
pub struct TempDatabase {
    path: PathBuf,
}

impl TempDatabase {
    /// A database file named after `example` and this process.
    pub fn new(example: &str) -> TempDatabase {
        let path =
            std::env::temp_dir().join(format!("rowbus-example-{example}-{}.sqlite", std::process::id()));
        let database = TempDatabase { path };
        database.remove();
        database
    }

    /// Its URL, for [`rowbus::connect_creating`] and [`rowbus::Listener::connect`].
    pub fn url(&self) -> String {
        format!("sqlite://{}", self.path.display())
    }

    fn remove(&self) {
        for suffix in ["", "-wal", "-shm", "-journal"] {
            let mut path = self.path.clone().into_os_string();
            path.push(suffix);
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for TempDatabase {
    fn drop(&mut self) {
        self.remove();
    }
}
