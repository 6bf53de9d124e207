//! How rowbus's SQLite connections wait for the database's one write lock.
//!
//! SQLite's own busy handler (what `busy_timeout` installs) sleeps 1, 2, 5, 10, 15, 20,
//! 25 ms and on up to 100 ms between tries. Between processes sharing one file that
//! decides who works: a process whose claims keep coming back at once takes the lock
//! again and again, while one that missed it a few times sleeps 25-100 ms at a time and
//! rarely finds it free. Measured with three `rowbus consume --workers 8` processes
//! draining a backlog of 20,000 (`ORDER=backlog-first benches/fairness/run.sh`), the
//! shares were 17,977 / 2,015 / 8 with SQLite's handler, and 6,030 / 8,022 / 5,948 with
//! this one, which tries again every 50 µs at first, then at most every 500 µs, for as
//! long as the busy timeout the connection would otherwise have had.
//!
//! SQLite's C API is the only way to set a busy handler, so this is the one place in
//! rowbus that uses `unsafe`.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::os::raw::{c_int, c_void};
use std::time::{Duration, Instant};

use sqlx::sqlite::SqliteConnection;

/// How long a statement waits for the lock before SQLite answers "database is locked".
pub(in crate::sql) const TIMEOUT: Duration = Duration::from_secs(10);
/// The first wait; each next one is as long again, up to [`MOST`].
const FIRST: Duration = Duration::from_micros(50);
const MOST: Duration = Duration::from_micros(500);

/// The wait before the next try, after `tries` tries that found the lock taken and
/// `waited` since the first; `None` once the wait would end past [`TIMEOUT`].
fn next_wait(tries: u32, waited: Duration) -> Option<Duration> {
    let wait = FIRST.saturating_mul(tries.saturating_add(1)).min(MOST);
    (waited + wait <= TIMEOUT).then_some(wait)
}

thread_local! {
    /// When the current wait for the lock began, on this thread: sqlx runs each SQLite
    /// connection on a thread of its own, and SQLite calls the handler on it.
    static SINCE: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// The handler SQLite calls when the lock is taken: `tries` counts the calls for this
/// one lock request, from 0. Returns non-zero to try again, zero to give up.
unsafe extern "C" fn retry(_: *mut c_void, tries: c_int) -> c_int {
    let now = Instant::now();
    let since = SINCE
        .try_with(|since| {
            if tries == 0 || since.get().is_none() {
                since.set(Some(now));
            }
            since.get().unwrap_or(now)
        })
        .unwrap_or(now);
    match next_wait(u32::try_from(tries).unwrap_or(0), now - since) {
        Some(wait) => {
            std::thread::sleep(wait);
            1
        }
        None => 0,
    }
}

/// Replaces `conn`'s busy handler (the `busy_timeout` it was opened with) with this one.
pub(in crate::sql) async fn install(conn: &mut SqliteConnection) -> Result<(), sqlx::Error> {
    let mut handle = conn.lock_handle().await?;
    let db = handle.as_raw_handle().as_ptr();
    // SAFETY: `db` is the connection's open handle, locked away from sqlx's worker thread
    // while `handle` lives. `retry` keeps no state behind its argument (null) and cannot
    // unwind: it only reads the clock, a thread-local and sleeps.
    let rc = unsafe { libsqlite3_sys::sqlite3_busy_handler(db, Some(retry), std::ptr::null_mut()) };
    if rc == libsqlite3_sys::SQLITE_OK {
        Ok(())
    } else {
        Err(sqlx::Error::Protocol(format!("sqlite3_busy_handler returned {rc}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_grow_to_the_most_and_end_at_the_timeout() {
        assert_eq!(next_wait(0, Duration::ZERO), Some(FIRST));
        assert_eq!(next_wait(1, FIRST), Some(FIRST * 2));
        assert_eq!(next_wait(9, Duration::from_millis(3)), Some(MOST));
        assert_eq!(next_wait(u32::MAX, Duration::from_secs(1)), Some(MOST));
        assert_eq!(next_wait(50, TIMEOUT - MOST), Some(MOST));
        assert_eq!(next_wait(50, TIMEOUT - MOST + Duration::from_micros(1)), None);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_second_writer_gets_in_while_the_first_keeps_taking_the_lock() {
        use sqlx::{Connection as _, Executor as _};
        let path = std::env::temp_dir().join(format!("rowbus-busy-{}.sqlite", std::process::id()));
        let url = format!("sqlite://{}", path.display());
        let options = super::super::options(&url, true).expect("options");
        let mut first = SqliteConnection::connect_with(&options).await.expect("open");
        let mut second = SqliteConnection::connect_with(&options).await.expect("open");
        install(&mut second).await.expect("install");
        first.execute("CREATE TABLE t (n INTEGER)").await.expect("create");

        // The first connection holds the write lock 2 ms at a time with 0.2 ms between:
        // SQLite's own handler would sleep 25-100 ms between its tries by the time it
        // found a gap; this one finds one within a few.
        let holder = tokio::spawn(async move {
            let end = Instant::now() + Duration::from_secs(3);
            while Instant::now() < end {
                first.execute("BEGIN IMMEDIATE").await.expect("begin");
                first.execute("INSERT INTO t VALUES (1)").await.expect("insert");
                std::thread::sleep(Duration::from_millis(2));
                first.execute("COMMIT").await.expect("commit");
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        let started = Instant::now();
        let mut writes = 0;
        while started.elapsed() < Duration::from_secs(1) {
            second.execute("INSERT INTO t VALUES (2)").await.expect("insert");
            writes += 1;
        }
        holder.abort();
        let _ = holder.await;
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
        }
        assert!(writes >= 100, "the second writer got in {writes} times in a second");
    }
}
