//! What a queue's health reads ([`Horizon`]): its dead rows, its size on disk, and what
//! holds the database's horizon (the oldest snapshot, slot or transaction that keeps rows
//! a queue deleted from being cleaned up). The three databases' statements sit here
//! together, each behind its feature: they are read by one operator view and nowhere
//! else, and seen side by side they say how differently each database keeps old rows.

use super::Naming;
use crate::names::QueueTable;

/// Which kind of holder a [`Horizon::holders_sql`] row names: its first text column
/// (`session` for a session's snapshot, PostgreSQL's `backend_xmin`, or any other).
pub(crate) mod kind {
    /// A replication slot's `xmin`.
    pub const SLOT: &str = "slot";
    /// A replication slot's `catalog_xmin`.
    pub const SLOT_CATALOG: &str = "slot catalog";
    /// An open InnoDB transaction.
    pub const TRANSACTION: &str = "transaction";
}

/// How a database tells what keeps a queue's deleted rows from being cleaned up.
pub trait Horizon: Naming {
    /// The rows deleted but not yet cleaned up: a statement returning one row, one
    /// integer, and its binds (text); `None` where the database keeps no such figure
    /// (SQLite reuses a deleted row's space at once).
    fn dead_rows_sql(table: &QueueTable) -> Option<(String, Vec<String>)>;

    /// The queue table's size on disk: a statement returning one row, a text (a file
    /// whose size, with its `-wal` beside it, counts too; `''` for none) and an integer
    /// (bytes), and its binds (text). No row: the table is not visible to this user.
    fn size_sql(table: &QueueTable) -> (String, Vec<String>);

    /// What holds the horizon, oldest first: a statement, no binds, returning per holder
    /// the texts kind (see [`kind`]), name and application, then the integers pid (or
    /// thread id), age in transactions, age in µs and whether this user may see when it
    /// started (1 or 0). `None` where the database has no such holder (SQLite, whose WAL
    /// checkpoint tells it instead).
    fn holders_sql() -> Option<&'static str>;

    /// Whether [`dead_rows_sql`](Self::dead_rows_sql) counts the whole server's rather
    /// than the table's.
    const DEAD_ROWS_SERVER_WIDE: bool = false;

    /// What a user refused these figures lacks, in words.
    const HORIZON_RIGHTS: &'static str = "permission denied";
}

#[cfg(feature = "postgres")]
impl Horizon for sqlx::Postgres {
    /// Summed over the partitions (`pg_partition_tree`), and the table itself when it is
    /// not partitioned (an older queue table). `n_dead_tup` is the statistics' count: it
    /// lags a moment behind.
    fn dead_rows_sql(table: &QueueTable) -> Option<(String, Vec<String>)> {
        let sql = format!(
            "SELECT COALESCE(SUM(s.n_dead_tup), 0)::bigint FROM ({}) t \
             JOIN pg_stat_all_tables s ON s.relid = t.relid",
            pg_tree()
        );
        Some((sql, vec![pg_name(table)]))
    }

    fn size_sql(table: &QueueTable) -> (String, Vec<String>) {
        let sql = format!(
            "SELECT '', COALESCE(SUM(pg_total_relation_size(t.relid)), 0)::bigint FROM ({}) t",
            pg_tree()
        );
        (sql, vec![pg_name(table)])
    }

    /// Sessions of this database (and those of none: a standby's walsender) with a
    /// snapshot, and replication slots; the oldest `xmin` first. A session of another role
    /// shows its pid, application and `backend_xmin` to anyone, but when its transaction
    /// started only to a member of that role or of `pg_read_all_stats`.
    fn holders_sql() -> Option<&'static str> {
        Some(
            "SELECT kind, name, application, pid, xid_age, age_us, seen FROM ( \
               SELECT 'session' AS kind, COALESCE(usename::text, '') AS name, \
                 COALESCE(application_name, '') AS application, pid::bigint AS pid, \
                 age(backend_xmin)::bigint AS xid_age, \
                 (EXTRACT(EPOCH FROM clock_timestamp() - xact_start) * 1000000)::bigint AS age_us, \
                 CASE WHEN usesysid IS NULL OR pg_has_role(usesysid, 'USAGE') \
                   OR pg_has_role('pg_read_all_stats', 'USAGE') THEN 1 ELSE 0 END::bigint AS seen \
               FROM pg_stat_activity \
               WHERE backend_xmin IS NOT NULL AND pid <> pg_backend_pid() \
                 AND (datname IS NULL OR datname = current_database()) \
               UNION ALL \
               SELECT 'slot', slot_name::text, '', active_pid::bigint, age(xmin)::bigint, NULL, 1 \
               FROM pg_replication_slots WHERE xmin IS NOT NULL \
               UNION ALL \
               SELECT 'slot catalog', slot_name::text, '', active_pid::bigint, age(catalog_xmin)::bigint, NULL, 1 \
               FROM pg_replication_slots WHERE catalog_xmin IS NOT NULL \
             ) h ORDER BY xid_age DESC, age_us DESC NULLS LAST",
        )
    }

    const HORIZON_RIGHTS: &'static str = "permission denied reading the statistics views";
}

/// The queue table's partitions and itself (binds: its quoted name).
#[cfg(feature = "postgres")]
fn pg_tree() -> &'static str {
    "SELECT relid FROM pg_partition_tree($1::regclass) UNION SELECT $1::regclass"
}

/// The queue table's name as `regclass` reads it: quoted, qualified when it is.
#[cfg(feature = "postgres")]
fn pg_name(table: &QueueTable) -> String {
    super::quoted::<sqlx::Postgres>(table, "")
}

#[cfg(feature = "mysql")]
impl Horizon for sqlx::MySql {
    /// InnoDB's history list length: undo records of committed changes not yet purged,
    /// for the whole server (InnoDB keeps no per-table figure). Needs the PROCESS
    /// privilege.
    fn dead_rows_sql(_table: &QueueTable) -> Option<(String, Vec<String>)> {
        Some((
            "SELECT CAST(count AS SIGNED) FROM information_schema.innodb_metrics \
             WHERE name = 'trx_rseg_history_len'"
                .to_owned(),
            vec![],
        ))
    }

    /// The data and indexes as the table's statistics say (an estimate InnoDB refreshes
    /// now and then).
    fn size_sql(table: &QueueTable) -> (String, Vec<String>) {
        let (in_schema, mut binds) = match table.schema() {
            Some(schema) => ("?", vec![schema.to_owned()]),
            None => ("DATABASE()", vec![]),
        };
        binds.push(table.name().to_owned());
        let sql = format!(
            "SELECT '', CAST(COALESCE(data_length, 0) + COALESCE(index_length, 0) AS SIGNED) \
             FROM information_schema.tables WHERE table_schema = {in_schema} AND table_name = ?"
        );
        (sql, binds)
    }

    /// The open InnoDB transactions other than this connection's, the oldest first. Needs
    /// the PROCESS privilege; `trx_started` has whole seconds.
    fn holders_sql() -> Option<&'static str> {
        Some(
            "SELECT 'transaction', COALESCE(CONCAT(p.user, '@', p.host), ''), '', \
               CAST(t.trx_mysql_thread_id AS SIGNED), NULL, \
               CAST(TIMESTAMPDIFF(MICROSECOND, t.trx_started, NOW(6)) AS SIGNED), 1 \
             FROM information_schema.innodb_trx t \
             LEFT JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id \
             WHERE t.trx_mysql_thread_id <> CONNECTION_ID() \
             ORDER BY t.trx_started, t.trx_id",
        )
    }

    const DEAD_ROWS_SERVER_WIDE: bool = true;

    const HORIZON_RIGHTS: &'static str =
        "needs the PROCESS privilege (information_schema.innodb_metrics and innodb_trx)";
}

#[cfg(feature = "sqlite")]
impl Horizon for sqlx::Sqlite {
    fn dead_rows_sql(_table: &QueueTable) -> Option<(String, Vec<String>)> {
        None
    }

    /// The main database's file (whose size and its WAL's are read from the disk), and
    /// its pages' bytes for one in memory.
    fn size_sql(_table: &QueueTable) -> (String, Vec<String>) {
        (
            "SELECT COALESCE((SELECT file FROM pragma_database_list WHERE name = 'main'), ''), \
             (SELECT page_count FROM pragma_page_count()) * (SELECT page_size FROM pragma_page_size())"
                .to_owned(),
            vec![],
        )
    }

    fn holders_sql() -> Option<&'static str> {
        None
    }
}
