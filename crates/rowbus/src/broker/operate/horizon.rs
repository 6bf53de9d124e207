//! A queue's health as an operator reads it ([`Queue::health`]): its dead rows, its size
//! on disk, and what holds the database's horizon.
//!
//! A queue deletes every row it handles. The database cleans up what was deleted only
//! once no snapshot can still see it; a transaction left open elsewhere (a report, a
//! shell in `BEGIN`, a replication slot) holds that horizon back, and the dead rows pile
//! up until it ends. rowbus keeps a queue's claims fast while that happens (see
//! docs/claims-and-leases.md, "A held horizon"), but the database grows, and only the
//! operator can end the holder: these figures name it before the disk fills.

use std::time::Duration;

use crate::broker::Queue;
use crate::broker::exec::queue_error;
use crate::driver::{Arg, TextsAndInts};
use crate::error::{Error, is_privilege_missing};
use crate::sql::{Db, kind};

/// A figure the database would not give this user, and why: said in place of the
/// figure, never as a wrong one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unreadable {
    /// What is missing, in words (`needs the PROCESS privilege`, say).
    pub why: String,
}

impl std::fmt::Display for Unreadable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "not readable: {}", self.why)
    }
}

/// A figure as [`QueueHealth`] reads it: `Ok(None)` where the database keeps no such
/// figure, [`Unreadable`] where this user may not read it.
pub type Reading<T> = Result<Option<T>, Unreadable>;

/// How a queue stands towards the database's cleanup ([`Queue::health`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct QueueHealth {
    /// The queue table.
    pub table: String,
    /// Rows deleted and not yet cleaned up; `None` on SQLite, which reuses their space
    /// at once.
    pub dead_rows: Reading<DeadRows>,
    /// The queue table's size on disk in bytes (PostgreSQL: every partition with its
    /// indexes and TOAST; MySQL/MariaDB: data and indexes as the table's statistics
    /// estimate them; SQLite: the database file and its WAL).
    pub bytes: Reading<u64>,
    /// What holds the horizon back the longest; `Ok(None)` when nothing does.
    pub holder: Reading<Holder>,
    /// SQLite's WAL, where the database keeps one.
    pub wal: Option<Wal>,
}

/// Dead rows as the database counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeadRows {
    /// How many.
    pub rows: u64,
    /// Whether the figure is the whole server's rather than the queue table's
    /// (MySQL/MariaDB's history list length: InnoDB keeps no figure per table).
    pub server_wide: bool,
}

/// What holds the horizon: the oldest snapshot, slot or transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// Which kind of holder.
    pub kind: HolderKind,
    /// The server process (PostgreSQL's pid) or thread id (MySQL/MariaDB) to end it
    /// (`pg_terminate_backend(pid)`, `KILL id`); for a slot, the process using it, if
    /// any.
    pub pid: Option<i64>,
    /// Who: the role of a PostgreSQL session, `user@host` of a MySQL/MariaDB one, the
    /// name of a replication slot.
    pub name: Option<String>,
    /// The application name the session set (PostgreSQL's `application_name`).
    pub application: Option<String>,
    /// How long its transaction has been open; `Ok(None)` where there is no transaction
    /// to time (a replication slot, a SQLite reader).
    pub age: Reading<Duration>,
    /// How many transactions old its snapshot is (PostgreSQL's `age(xmin)`).
    pub xid_age: Option<u64>,
}

/// The kinds of [`Holder`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum HolderKind {
    /// A PostgreSQL session's snapshot (`backend_xmin` in `pg_stat_activity`).
    Session,
    /// A replication slot's `xmin` (a standby's feedback, say).
    ReplicationSlot,
    /// A replication slot's `catalog_xmin` (a logical decoding slot): it holds back the
    /// catalog's cleanup, and the queue's only with the others.
    ReplicationSlotCatalog,
    /// An open InnoDB transaction (MySQL/MariaDB).
    Transaction,
    /// A reader of SQLite's database whose read transaction keeps the WAL from being
    /// checkpointed to its end.
    WalReader,
}

impl HolderKind {
    /// Its name in words: `session`, `replication slot`, `replication slot (catalog)`,
    /// `transaction`, `WAL reader`.
    pub fn as_str(self) -> &'static str {
        match self {
            HolderKind::Session => "session",
            HolderKind::ReplicationSlot => "replication slot",
            HolderKind::ReplicationSlotCatalog => "replication slot (catalog)",
            HolderKind::Transaction => "transaction",
            HolderKind::WalReader => "WAL reader",
        }
    }
}

/// SQLite's WAL as a passive checkpoint leaves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Wal {
    /// The WAL file's size in bytes.
    pub bytes: u64,
    /// Frames in it.
    pub frames: u64,
    /// Frames a checkpoint could not copy into the database: a reader's transaction holds
    /// them, and the WAL cannot start over, while there are any.
    pub frames_left: u64,
}

impl QueueHealth {
    /// Whether the horizon is held past `threshold`: a holder whose transaction is at
    /// least that old, or on SQLite a reader that keeps WAL frames from their checkpoint
    /// (SQLite does not say since when, so any such reader counts).
    pub fn held_past(&self, threshold: Duration) -> bool {
        match &self.holder {
            Ok(Some(h)) if h.kind == HolderKind::WalReader => true,
            Ok(Some(Holder { age: Ok(Some(age)), .. })) => *age >= threshold,
            _ => false,
        }
    }
}

impl<DB: Db> Queue<DB> {
    /// How the queue stands towards the database's cleanup: its dead rows, its size on
    /// disk and what holds the horizon (the oldest snapshot, slot or transaction keeping
    /// deleted rows from being cleaned up), for an operator to see a held horizon before
    /// the disk fills. A figure this user may not read says why instead
    /// ([`Unreadable`]); any other failure is an error.
    ///
    /// What it reads, and the rights it needs:
    /// - PostgreSQL: `n_dead_tup` and `pg_total_relation_size` over the queue table's
    ///   partitions, the oldest `backend_xmin` of this database's sessions in
    ///   `pg_stat_activity` and the replication slots' `xmin` and `catalog_xmin`. Any
    ///   role sees them, except when another role's transaction started: that needs
    ///   membership of `pg_read_all_stats` (or of that role).
    /// - MySQL/MariaDB: the history list length (`information_schema.innodb_metrics`),
    ///   the table's `data_length + index_length`, the oldest transaction in
    ///   `information_schema.innodb_trx`; the first and last need the PROCESS privilege.
    /// - SQLite: the database file and its WAL, and a passive checkpoint (the one the
    ///   broker runs once a second) for the WAL's frames a reader holds; where it cannot
    ///   run (a file opened read-only), the holder says so.
    pub async fn health(&self) -> Result<QueueHealth, Error> {
        let mut conn = self.inner().pool.acquire().await?;
        let table = self.table();
        let dead_rows = match DB::dead_rows_sql(table) {
            None => Ok(None),
            Some((sql, binds)) => self.read(&mut conn, &sql, &binds, 0).await?.map(|rows| {
                rows.first()
                    .map(|r| DeadRows { rows: unsigned(r.int(0)), server_wide: DB::DEAD_ROWS_SERVER_WIDE })
            }),
        };
        let (sql, binds) = DB::size_sql(table);
        let (bytes, file) = match self.read(&mut conn, &sql, &binds, 1).await? {
            Ok(rows) => match rows.first() {
                Some(row) if row.text(0).is_empty() => (Ok(Some(unsigned(row.int(0)))), None),
                Some(row) => {
                    let file = row.text(0).to_owned();
                    (Ok(Some(file_len(&file) + file_len(&format!("{file}-wal")))), Some(file))
                }
                None => (
                    Err(Unreadable { why: "the table's statistics are not visible to this user".into() }),
                    None,
                ),
            },
            Err(denied) => (Err(denied), None),
        };
        let holder = match DB::holders_sql() {
            Some(sql) => self.read(&mut conn, sql, &[], 3).await?.map(|rows| rows.first().map(holder)),
            None => Ok(None),
        };
        let (holder, wal) = match &self.sql.checkpoint {
            // A checkpoint writes: on a file opened read-only it cannot run, and the WAL's
            // frames are what is missing, not the rest.
            Some(sql) => match DB::fetch_rows(&mut conn, sql, &[], 0).await {
                Ok(rows) => {
                    let wal_bytes = file.map_or(0, |f| file_len(&format!("{f}-wal")));
                    let wal = rows.first().and_then(|row| wal(row, wal_bytes));
                    match wal {
                        Some(w) if w.frames_left > 0 => (Ok(Some(wal_reader())), Some(w)),
                        _ => (holder, wal),
                    }
                }
                Err(e) => {
                    let why =
                        format!("a checkpoint of the WAL could not run: {}", queue_error(self, e).one_line());
                    (Err(Unreadable { why }), None)
                }
            },
            None => (holder, None),
        };
        Ok(QueueHealth { table: table.to_string(), dead_rows, bytes, holder, wal })
    }

    /// Rows of `sql`, or why this user may not read them.
    async fn read(
        &self,
        conn: &mut DB::Connection,
        sql: &str,
        binds: &[String],
        texts: usize,
    ) -> Result<Result<Vec<TextsAndInts>, Unreadable>, Error> {
        let args: Vec<Arg<'_>> = binds.iter().map(|b| Arg::Text(b)).collect();
        match DB::fetch_rows(conn, &sql.into(), &args, texts).await {
            Ok(rows) => Ok(Ok(rows)),
            Err(e) if is_privilege_missing(&e) => Ok(Err(Unreadable { why: DB::HORIZON_RIGHTS.to_owned() })),
            Err(e) => Err(queue_error(self, e)),
        }
    }
}

/// A count as the database gives it, never below 0.
fn unsigned(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// The size of file `path`, 0 where there is none (a WAL not yet made, or gone).
fn file_len(path: &str) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

/// A holder from a row of [`Horizon::holders_sql`](crate::sql::Horizon::holders_sql).
fn holder(row: &TextsAndInts) -> Holder {
    let kind = match row.text(0) {
        kind::SLOT => HolderKind::ReplicationSlot,
        kind::SLOT_CATALOG => HolderKind::ReplicationSlotCatalog,
        kind::TRANSACTION => HolderKind::Transaction,
        _ => HolderKind::Session,
    };
    let text = |i: usize| Some(row.text(i).to_owned()).filter(|t| !t.is_empty());
    let int = |i: usize| row.ints.get(i).copied().flatten();
    let age = match (int(2), int(3)) {
        (_, Some(0)) => Err(Unreadable { why: HIDDEN_START.to_owned() }),
        (Some(us), _) => Ok(Some(Duration::from_micros(unsigned(us)))),
        (None, _) => Ok(None),
    };
    Holder { kind, pid: int(0), name: text(1), application: text(2), age, xid_age: int(1).map(unsigned) }
}

/// Why a PostgreSQL session's age is not shown to a role without the right.
const HIDDEN_START: &str = "pg_stat_activity shows when another role's transaction started only to members of \
                            that role or of pg_read_all_stats";

/// The holder SQLite's WAL has: a reader, unnamed (SQLite does not say who).
fn wal_reader() -> Holder {
    Holder {
        kind: HolderKind::WalReader,
        pid: None,
        name: None,
        application: None,
        age: Ok(None),
        xid_age: None,
    }
}

/// The WAL from a checkpoint's row `(busy, frames, frames copied)`; `None` when the
/// database is not in WAL mode (`-1`s).
fn wal(row: &TextsAndInts, bytes: u64) -> Option<Wal> {
    let (frames, copied) = match row.ints[..] {
        [_, Some(frames), Some(copied)] if frames >= 0 && copied >= 0 => (frames, copied),
        _ => return None,
    };
    Some(Wal { bytes, frames: unsigned(frames), frames_left: unsigned(frames - copied) })
}
