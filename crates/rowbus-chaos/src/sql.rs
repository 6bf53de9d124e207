//! The harness's own SQL: its record tables, and integer-only statements run on a
//! connection of any of the three databases (`?` placeholders, numbered on PostgreSQL).

use futures::future::BoxFuture;
use rowbus::{Backend, Db, DbPool};
use sqlx::{AssertSqlSafe, MySql, Pool, Postgres, Row as _, Sqlite};

/// Statements with integer binds and integer columns, on each database.
pub(crate) trait Exec: Db {
    /// Runs a statement; the rows it affected.
    fn exec<'c>(
        conn: &'c mut Self::Connection,
        sql: &str,
        args: &[i64],
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>>;
    /// Runs a query; every column of every row as an integer.
    fn rows<'c>(
        conn: &'c mut Self::Connection,
        sql: &str,
        args: &[i64],
    ) -> BoxFuture<'c, Result<Vec<Vec<i64>>, sqlx::Error>>;
    /// The typed pool inside `db`, if it is one of this database.
    fn typed(db: &DbPool) -> Option<Pool<Self>>;
}

/// `?` placeholders as `$1, $2, ...` (the harness's SQL has no `?` elsewhere).
fn numbered(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len() + 8);
    let mut n = 0;
    for c in sql.chars() {
        if c == '?' {
            n += 1;
            out.push_str(&format!("${n}"));
        } else {
            out.push(c);
        }
    }
    out
}

macro_rules! exec {
    ($db:ident, $placeholders:expr) => {
        impl Exec for $db {
            fn typed(db: &DbPool) -> Option<Pool<Self>> {
                match db {
                    DbPool::$db(pool) => Some(pool.clone()),
                    _ => None,
                }
            }

            fn exec<'c>(
                conn: &'c mut Self::Connection,
                sql: &str,
                args: &[i64],
            ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
                let mut query = sqlx::query::<$db>(AssertSqlSafe($placeholders(sql)));
                for &arg in args {
                    query = query.bind(arg);
                }
                Box::pin(async move { Ok(query.execute(conn).await?.rows_affected()) })
            }

            fn rows<'c>(
                conn: &'c mut Self::Connection,
                sql: &str,
                args: &[i64],
            ) -> BoxFuture<'c, Result<Vec<Vec<i64>>, sqlx::Error>> {
                let mut query = sqlx::query::<$db>(AssertSqlSafe($placeholders(sql)));
                for &arg in args {
                    query = query.bind(arg);
                }
                Box::pin(async move {
                    let rows = query.fetch_all(conn).await?;
                    rows.iter()
                        .map(|row| (0..row.len()).map(|i| row.try_get::<i64, _>(i)).collect())
                        .collect()
                })
            }
        }
    };
}
exec!(Postgres, numbered);
exec!(MySql, str::to_owned);
exec!(Sqlite, str::to_owned);

/// Runs a query on a connection of `db`'s pool.
pub(crate) async fn rows(db: &DbPool, sql: &str, args: &[i64]) -> Result<Vec<Vec<i64>>, sqlx::Error> {
    match db {
        DbPool::Postgres(pool) => Postgres::rows(&mut *pool.acquire().await?, sql, args).await,
        DbPool::MySql(pool) => MySql::rows(&mut *pool.acquire().await?, sql, args).await,
        DbPool::Sqlite(pool) => Sqlite::rows(&mut *pool.acquire().await?, sql, args).await,
    }
}

/// The first column of the first row (a `COUNT(*)`).
pub(crate) async fn count(db: &DbPool, sql: &str, args: &[i64]) -> Result<i64, sqlx::Error> {
    Ok(rows(db, sql, args).await?.first().and_then(|row| row.first().copied()).unwrap_or(0))
}

/// Runs several statements in one go (DDL, role scripts).
pub(crate) async fn batch(db: &DbPool, sql: &str) -> Result<(), sqlx::Error> {
    let sql = sqlx::raw_sql(AssertSqlSafe(sql.to_owned()));
    match db {
        DbPool::Postgres(pool) => {
            sql.execute(pool).await?;
        }
        DbPool::MySql(pool) => {
            sql.execute(pool).await?;
        }
        DbPool::Sqlite(pool) => {
            sql.execute(pool).await?;
        }
    }
    Ok(())
}

/// The names of one run's tables, all starting with the run's prefix.
#[derive(Debug, Clone)]
pub(crate) struct Tables {
    /// The queue table (its dead letters: `<queue>_dead`).
    pub queue: String,
    /// The notify table of the broker's `listen_notify` (MySQL/MariaDB, SQLite).
    pub wake: String,
    /// The notify table of the notify scenario.
    pub notify: String,
    /// A row per handled message (no unique constraint: duplicates show).
    pub handled: String,
    /// A row per transactional handler's effect, unique per message.
    pub effects: String,
    /// A row per effect a transactional handler found already there.
    pub dups: String,
}

impl Tables {
    pub(crate) fn new(prefix: &str) -> Self {
        Tables {
            queue: format!("{prefix}_q"),
            wake: format!("{prefix}_wake"),
            notify: format!("{prefix}_nt"),
            handled: format!("{prefix}_handled"),
            effects: format!("{prefix}_effects"),
            dups: format!("{prefix}_dups"),
        }
    }

    /// The record tables' DDL.
    pub(crate) fn create(&self, backend: Backend) -> String {
        let (handled, effects, dups) = (&self.handled, &self.effects, &self.dups);
        let engine = if backend == Backend::MySql { " ENGINE=InnoDB" } else { "" };
        format!(
            "CREATE TABLE IF NOT EXISTS {handled} (run_id BIGINT NOT NULL, msg BIGINT NOT NULL, \
             proc BIGINT NOT NULL, incarnation BIGINT NOT NULL, attempt BIGINT NOT NULL, \
             at_us BIGINT NOT NULL){engine};\n\
             CREATE INDEX IF NOT EXISTS {handled}_run ON {handled} (run_id, msg);\n\
             CREATE TABLE IF NOT EXISTS {effects} (run_id BIGINT NOT NULL, msg BIGINT NOT NULL, \
             PRIMARY KEY (run_id, msg)){engine};\n\
             CREATE TABLE IF NOT EXISTS {dups} (run_id BIGINT NOT NULL, msg BIGINT NOT NULL, \
             proc BIGINT NOT NULL, at_us BIGINT NOT NULL){engine};\n"
        )
    }

    /// Empties every table of the run: the queue, its dead letters, the notify tables and
    /// the records.
    pub(crate) fn truncate(&self, backend: Backend) -> String {
        let mut tables = vec![
            self.queue.clone(),
            format!("{}_dead", self.queue),
            self.handled.clone(),
            self.effects.clone(),
            self.dups.clone(),
        ];
        if backend != Backend::Postgres {
            tables.extend([self.wake.clone(), self.notify.clone()]);
        }
        match backend {
            Backend::Postgres => format!("TRUNCATE {}", tables.join(", ")),
            Backend::MySql => tables.iter().map(|t| format!("TRUNCATE TABLE {t};\n")).collect(),
            Backend::Sqlite => tables.iter().map(|t| format!("DELETE FROM {t};\n")).collect(),
        }
    }

    /// Records a handled message. Binds: run, msg, proc, incarnation, attempt, at.
    pub(crate) fn insert_handled(&self) -> String {
        format!(
            "INSERT INTO {} (run_id, msg, proc, incarnation, attempt, at_us) VALUES (?, ?, ?, ?, ?, ?)",
            self.handled
        )
    }

    /// A transactional handler's effect; affects no row when it is there already.
    /// Binds: run, msg.
    pub(crate) fn insert_effect(&self, backend: Backend) -> String {
        match backend {
            Backend::MySql => format!("INSERT IGNORE INTO {} (run_id, msg) VALUES (?, ?)", self.effects),
            _ => format!("INSERT INTO {} (run_id, msg) VALUES (?, ?) ON CONFLICT DO NOTHING", self.effects),
        }
    }

    /// Records a duplicated effect. Binds: run, msg, proc, at.
    pub(crate) fn insert_dup(&self) -> String {
        format!("INSERT INTO {} (run_id, msg, proc, at_us) VALUES (?, ?, ?, ?)", self.dups)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_are_numbered_on_postgres() {
        assert_eq!(numbered("INSERT INTO t VALUES (?, ?)"), "INSERT INTO t VALUES ($1, $2)");
        assert_eq!(numbered("SELECT 1"), "SELECT 1");
    }
}
