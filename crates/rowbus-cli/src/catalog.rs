//! The CLI's own SQL, per database: which queue tables exist, per-group statistics, the
//! notify table's size and lag, and dropping the demo's table. The library has no
//! per-group statistics nor a catalog, so they are written here.
//!
//! Identifiers spliced into a statement come from a validated [`QueueTable`] (or the
//! validated notify-table name): plain `[A-Za-z_][A-Za-z0-9_]*` parts, quoted. Every value
//! is bound.

use std::time::Duration;

use futures::future::BoxFuture;
use rowbus::{Backend, Db, QueueTable};
use sqlx::{AssertSqlSafe, MySql, Pool, Postgres, Row as _, Sqlite};

/// A bind value.
#[derive(Debug, Clone)]
pub(crate) enum Bind {
    /// Text.
    Text(String),
}

/// A result row: its first columns as text, the rest as integers (`None` for NULL).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Row {
    /// The text columns.
    pub(crate) texts: Vec<String>,
    /// The integer columns after them.
    pub(crate) ints: Vec<Option<i64>>,
}

impl Row {
    /// Integer column `i` (after the text columns), 0 for NULL or a missing column.
    fn int(&self, i: usize) -> i64 {
        self.ints.get(i).copied().flatten().unwrap_or(0)
    }
}

/// The statements the CLI runs itself, on each database's pool.
pub(crate) trait Sql: Db {
    /// Runs `sql` with `binds`; decodes the first `texts` columns of each row as text and
    /// the rest as integers.
    fn fetch<'a>(
        pool: &'a Pool<Self>,
        sql: String,
        binds: Vec<Bind>,
        texts: usize,
    ) -> BoxFuture<'a, Result<Vec<Row>, sqlx::Error>>;

    /// Runs a statement without binds.
    fn run_statement<'a>(pool: &'a Pool<Self>, sql: String) -> BoxFuture<'a, Result<(), sqlx::Error>>;
}

/// Implements [`Sql`] for one concrete database.
macro_rules! sql_for {
    ($db:ty) => {
        impl Sql for $db {
            fn fetch<'a>(
                pool: &'a Pool<Self>,
                sql: String,
                binds: Vec<Bind>,
                texts: usize,
            ) -> BoxFuture<'a, Result<Vec<Row>, sqlx::Error>> {
                Box::pin(async move {
                    let mut query = sqlx::query(AssertSqlSafe(sql));
                    for bind in binds {
                        query = match bind {
                            Bind::Text(text) => query.bind(text),
                        };
                    }
                    let rows = query.fetch_all(pool).await?;
                    rows.iter()
                        .map(|row| {
                            Ok(Row {
                                texts: (0..texts)
                                    .map(|i| row.try_get::<String, _>(i))
                                    .collect::<Result<_, _>>()?,
                                ints: (texts..row.len())
                                    .map(|i| row.try_get::<Option<i64>, _>(i))
                                    .collect::<Result<_, _>>()?,
                            })
                        })
                        .collect()
                })
            }

            fn run_statement<'a>(
                pool: &'a Pool<Self>,
                sql: String,
            ) -> BoxFuture<'a, Result<(), sqlx::Error>> {
                Box::pin(async move { sqlx::query(AssertSqlSafe(sql)).execute(pool).await.map(drop) })
            }
        }
    };
}
sql_for!(Postgres);
sql_for!(MySql);
sql_for!(Sqlite);

/// The columns every queue table has (the broker's claim needs them all).
pub(crate) const QUEUE_COLUMNS: [&str; 7] =
    ["id", "group_name", "payload", "attempts", "visible_at", "lease", "lease_until"];

/// `'id', 'group_name', ...`: constants, not input.
fn queue_column_list() -> String {
    QUEUE_COLUMNS.map(|c| format!("'{c}'")).join(", ")
}

/// The schema (if qualified) and the table name of a queue table.
pub(crate) fn parts(table: &QueueTable) -> (Option<&str>, &str) {
    match table.channel().split_once('.') {
        Some((schema, name)) => (Some(schema), name),
        None => (None, table.channel()),
    }
}

/// One identifier part quoted for `backend`. Only for validated plain identifiers.
fn quote(backend: Backend, part: &str) -> String {
    debug_assert!(part.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    match backend {
        Backend::Postgres => format!("\"{part}\""),
        Backend::MySql | Backend::Sqlite => format!("`{part}`"),
    }
}

/// A queue table's name with `suffix` (`""`, or `_dead` for its dead-letter table), quoted.
pub(crate) fn quoted(backend: Backend, table: &QueueTable, suffix: &str) -> String {
    match parts(table) {
        (Some(schema), name) => {
            format!("{}.{}", quote(backend, schema), quote(backend, &format!("{name}{suffix}")))
        }
        (None, name) => quote(backend, &format!("{name}{suffix}")),
    }
}

/// What the catalog says about a table name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    /// No such table.
    Missing,
    /// A table with every queue column.
    Queue,
    /// A table without them (`columns` of the seven).
    Other {
        /// How many of the queue columns it has.
        columns: i64,
    },
}

/// Looks `name` (in `schema`, or the current one) up in the catalog.
pub(crate) async fn find<DB: Sql>(
    pool: &Pool<DB>,
    schema: Option<&str>,
    name: &str,
) -> Result<Found, sqlx::Error> {
    let columns = queue_column_list();
    let rows = match DB::BACKEND {
        Backend::Postgres => {
            // to_regclass resolves the name as a statement would (the search path), and
            // takes it quoted: validated identifiers, bound as a value.
            let regclass = match schema {
                Some(schema) => {
                    format!("{}.{}", quote(Backend::Postgres, schema), quote(Backend::Postgres, name))
                }
                None => quote(Backend::Postgres, name),
            };
            let sql = format!(
                "SELECT (SELECT COUNT(*) FROM pg_class WHERE oid = to_regclass($1) AND relkind IN ('r', 'p')), \
                 (SELECT COUNT(*) FROM pg_attribute WHERE attrelid = to_regclass($1) AND attnum > 0 \
                 AND NOT attisdropped AND attname IN ({columns}))"
            );
            DB::fetch(pool, sql, vec![Bind::Text(regclass)], 0).await?
        }
        Backend::MySql => {
            let (in_schema, mut binds) = match schema {
                Some(schema) => ("?", vec![Bind::Text(schema.to_owned())]),
                None => ("DATABASE()", vec![]),
            };
            binds.push(Bind::Text(name.to_owned()));
            let mut binds2 = binds.clone();
            binds.append(&mut binds2);
            let sql = format!(
                "SELECT (SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.tables \
                 WHERE table_schema = {in_schema} AND table_name = ? AND table_type = 'BASE TABLE'), \
                 (SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.columns \
                 WHERE table_schema = {in_schema} AND table_name = ? AND column_name IN ({columns}))"
            );
            DB::fetch(pool, sql, binds, 0).await?
        }
        Backend::Sqlite => {
            let sql = format!(
                "SELECT (SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ? COLLATE NOCASE), \
                 (SELECT COUNT(*) FROM pragma_table_info(?) WHERE name IN ({columns}))"
            );
            DB::fetch(pool, sql, vec![Bind::Text(name.to_owned()), Bind::Text(name.to_owned())], 0).await?
        }
    };
    let (exists, columns) = rows.first().map(|r| (r.int(0), r.int(1))).unwrap_or((0, 0));
    Ok(match (exists, columns) {
        (0, _) => Found::Missing,
        (_, n) if n == QUEUE_COLUMNS.len() as i64 => Found::Queue,
        (_, columns) => Found::Other { columns },
    })
}

/// The queue tables of the current schema(s) (PostgreSQL: the search path, unqualified in
/// the current schema) or the current database (MySQL/MariaDB, SQLite): tables having
/// every queue column. Names as the catalog spells them, to be validated by the caller.
pub(crate) async fn discover<DB: Sql>(pool: &Pool<DB>) -> Result<Vec<String>, sqlx::Error> {
    let (columns, n) = (queue_column_list(), QUEUE_COLUMNS.len());
    Ok(match DB::BACKEND {
        Backend::Postgres => {
            let sql = format!(
                "SELECT c.table_schema::text, c.table_name::text, COALESCE(current_schema()::text, '') \
                 FROM information_schema.columns c \
                 JOIN information_schema.tables t \
                 ON t.table_schema = c.table_schema AND t.table_name = c.table_name AND t.table_type = 'BASE TABLE' \
                 WHERE c.table_schema::name = ANY (current_schemas(false)) AND c.column_name IN ({columns}) \
                 GROUP BY c.table_schema, c.table_name \
                 HAVING COUNT(DISTINCT c.column_name) = {n} \
                 ORDER BY 1, 2"
            );
            DB::fetch(pool, sql, vec![], 3)
                .await?
                .into_iter()
                .map(|row| match row.texts.as_slice() {
                    [schema, name, current] if schema == current => name.clone(),
                    [schema, name, _] => format!("{schema}.{name}"),
                    _ => String::new(),
                })
                .collect()
        }
        Backend::MySql => {
            let sql = format!(
                "SELECT CAST(c.table_name AS CHAR) FROM information_schema.columns c \
                 JOIN information_schema.tables t \
                 ON t.table_schema = c.table_schema AND t.table_name = c.table_name AND t.table_type = 'BASE TABLE' \
                 WHERE c.table_schema = DATABASE() AND c.column_name IN ({columns}) \
                 GROUP BY c.table_name \
                 HAVING COUNT(DISTINCT c.column_name) = {n} \
                 ORDER BY 1"
            );
            DB::fetch(pool, sql, vec![], 1).await?.into_iter().flat_map(|row| row.texts).collect()
        }
        Backend::Sqlite => {
            let sql = format!(
                "SELECT m.name FROM sqlite_master AS m, pragma_table_info(m.name) AS p \
                 WHERE m.type = 'table' AND p.name IN ({columns}) \
                 GROUP BY m.name \
                 HAVING COUNT(DISTINCT p.name) = {n} \
                 ORDER BY m.name"
            );
            DB::fetch(pool, sql, vec![], 1).await?.into_iter().flat_map(|row| row.texts).collect()
        }
    })
}

/// One group of one queue table, as it stands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct GroupStats {
    /// The group (`""` is the default group).
    pub(crate) group: String,
    /// Messages in the table: ready, delayed (a retry's backoff or a publish delay) and
    /// in flight.
    pub(crate) depth: i64,
    /// Claimable now (including those whose lease ran out).
    pub(crate) ready: i64,
    /// Claimed, under a lease that has not run out.
    pub(crate) in_flight: i64,
    /// Age of the oldest message in the table, if any.
    pub(crate) oldest: Option<Duration>,
    /// Messages in the dead-letter table (`None` when it does not exist).
    pub(crate) dead: Option<i64>,
}

impl GroupStats {
    /// Waiting for their time: a retry's backoff or a publish delay.
    pub(crate) fn delayed(&self) -> i64 {
        (self.depth - self.ready - self.in_flight).max(0)
    }
}

/// Microseconds as a duration (negative ones as zero).
fn micros(us: Option<i64>) -> Option<Duration> {
    us.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0)))
}

/// Per-group figures of a queue table and its dead-letter table; a table with no message
/// and no dead letter has one all-zero line for the default group.
pub(crate) async fn queue_stats<DB: Sql>(
    pool: &Pool<DB>,
    table: &QueueTable,
) -> Result<Vec<GroupStats>, sqlx::Error> {
    let t = quoted(DB::BACKEND, table, "");
    let sql = match DB::BACKEND {
        Backend::Postgres => format!(
            "SELECT group_name, COUNT(*), \
             COUNT(*) FILTER (WHERE visible_at <= now() AND (lease_until IS NULL OR lease_until <= now())), \
             COUNT(*) FILTER (WHERE lease_until > now()), \
             (EXTRACT(EPOCH FROM now() - MIN(created_at)) * 1000000)::BIGINT \
             FROM {t} GROUP BY group_name ORDER BY group_name"
        ),
        Backend::MySql => format!(
            "SELECT group_name, CAST(COUNT(*) AS SIGNED), \
             CAST(SUM(visible_at <= UTC_TIMESTAMP(6) AND (lease_until IS NULL OR lease_until <= UTC_TIMESTAMP(6))) AS SIGNED), \
             CAST(SUM(COALESCE(lease_until > UTC_TIMESTAMP(6), 0)) AS SIGNED), \
             CAST(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)) AS SIGNED) \
             FROM {t} GROUP BY group_name ORDER BY group_name"
        ),
        Backend::Sqlite => {
            let now = "CAST(unixepoch('subsec') * 1000000 AS INTEGER)";
            format!(
                "SELECT group_name, COUNT(*), \
                 SUM(visible_at <= {now} AND (lease_until IS NULL OR lease_until <= {now})), \
                 SUM(COALESCE(lease_until > {now}, 0)), {now} - MIN(created_at) \
                 FROM {t} GROUP BY group_name ORDER BY group_name"
            )
        }
    };
    let mut groups: Vec<GroupStats> = DB::fetch(pool, sql, vec![], 1)
        .await?
        .into_iter()
        .map(|row| GroupStats {
            group: row.texts.first().cloned().unwrap_or_default(),
            depth: row.int(0),
            ready: row.int(1),
            in_flight: row.int(2),
            oldest: micros(row.ints.get(3).copied().flatten()),
            dead: None,
        })
        .collect();

    let (schema, name) = parts(table);
    let dead_name = format!("{name}_dead");
    let dead_exists = find(pool, schema, &dead_name).await? != Found::Missing;
    if dead_exists {
        let dead = quoted(DB::BACKEND, table, "_dead");
        let count = match DB::BACKEND {
            Backend::MySql => "CAST(COUNT(*) AS SIGNED)",
            _ => "COUNT(*)",
        };
        let sql = format!("SELECT group_name, {count} FROM {dead} GROUP BY group_name ORDER BY group_name");
        for g in &mut groups {
            g.dead = Some(0);
        }
        for row in DB::fetch(pool, sql, vec![], 1).await? {
            let group = row.texts.first().cloned().unwrap_or_default();
            match groups.iter_mut().find(|g| g.group == group) {
                Some(g) => g.dead = Some(row.int(0)),
                None => groups.push(GroupStats { group, dead: Some(row.int(0)), ..GroupStats::default() }),
            }
        }
        groups.sort_by(|a, b| a.group.cmp(&b.group));
    }
    if groups.is_empty() {
        groups.push(GroupStats { dead: dead_exists.then_some(0), ..GroupStats::default() });
    }
    Ok(groups)
}

/// The notify table's size and lag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NotifyStats {
    /// Its name.
    pub(crate) table: String,
    /// Rows in it.
    pub(crate) rows: i64,
    /// Age of its oldest row, if any.
    pub(crate) oldest: Option<Duration>,
}

/// The notify table `name`'s figures, `None` on PostgreSQL or when it does not exist.
/// `name` must be a validated notify-table name (a plain identifier).
pub(crate) async fn notify_stats<DB: Sql>(
    pool: &Pool<DB>,
    name: &str,
) -> Result<Option<NotifyStats>, sqlx::Error> {
    if DB::BACKEND == Backend::Postgres || find(pool, None, name).await? == Found::Missing {
        return Ok(None);
    }
    let t = quote(DB::BACKEND, name);
    let sql = match DB::BACKEND {
        Backend::MySql => format!(
            "SELECT CAST(COUNT(*) AS SIGNED), \
             CAST(TIMESTAMPDIFF(MICROSECOND, MIN(created_at), UTC_TIMESTAMP(6)) AS SIGNED) FROM {t}"
        ),
        _ => format!(
            "SELECT COUNT(*), CAST((julianday('now') - julianday(MIN(created_at))) * 86400000000.0 AS INTEGER) \
             FROM {t}"
        ),
    };
    let row = DB::fetch(pool, sql, vec![], 0).await?.into_iter().next();
    Ok(Some(NotifyStats {
        table: name.to_owned(),
        rows: row.as_ref().map_or(0, |r| r.int(0)),
        oldest: micros(row.and_then(|r| r.ints.get(1).copied().flatten())),
    }))
}

/// Drops a queue table and its dead-letter table.
pub(crate) async fn drop_queue<DB: Sql>(pool: &Pool<DB>, table: &QueueTable) -> Result<(), sqlx::Error> {
    for suffix in ["", "_dead"] {
        DB::run_statement(pool, format!("DROP TABLE IF EXISTS {}", quoted(DB::BACKEND, table, suffix)))
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A valid queue table name.
    fn t(name: &str) -> QueueTable {
        name.parse().unwrap()
    }

    #[test]
    fn quoting() {
        assert_eq!(quoted(Backend::Postgres, &t("app.jobs"), "_dead"), "\"app\".\"jobs_dead\"");
        assert_eq!(quoted(Backend::Postgres, &t("Jobs"), ""), "\"Jobs\"");
        assert_eq!(quoted(Backend::MySql, &t("jobs"), ""), "`jobs`");
        assert_eq!(quoted(Backend::Sqlite, &t("jobs"), "_dead"), "`jobs_dead`");
        assert_eq!(parts(&t("app.jobs")), (Some("app"), "jobs"));
        assert_eq!(parts(&t("jobs")), (None, "jobs"));
    }

    #[test]
    fn delayed_is_the_rest() {
        let g = GroupStats { depth: 10, ready: 4, in_flight: 3, ..GroupStats::default() };
        assert_eq!(g.delayed(), 3);
    }
}
