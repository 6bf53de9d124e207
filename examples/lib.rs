//! What the examples share: a SQLite database file of their own.
//!
//! Each example runs on SQLite so that it runs anywhere with no server; the same code
//! runs on PostgreSQL or MySQL/MariaDB with `Postgres` or `MySql` in place of `Sqlite`
//! (and the database's own placeholders, `$1` or `?`, in the SQL an example writes).

use std::net::SocketAddr;
use std::path::PathBuf;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

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

/// A response as [`http`] reads it.
#[derive(Debug)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The head: the status line and the headers.
    pub head: String,
    /// The body.
    pub body: String,
}

/// Sends one HTTP/1.1 request to `address` (a client with no crate of its own, enough for
/// the examples' own servers): `method` `path` with `headers` and `body`, sent as JSON when
/// not empty; the response.
pub async fn http(
    address: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> std::io::Result<Response> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() {
        request.push_str(&format!("Content-Type: application/json\r\nContent-Length: {}\r\n", body.len()));
    }
    request.push_str("\r\n");
    request.push_str(body);
    stream.write_all(request.as_bytes()).await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    Ok(Response { status, head: head.to_owned(), body: body.to_owned() })
}
