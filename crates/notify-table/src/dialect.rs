//! The SQL of each dialect. Built once per [`NotifyTable`](crate::NotifyTable); the table
//! name is the only identifier and is validated before it gets here.

use std::sync::Arc;
use std::time::Duration;

use crate::statement::Value;

/// The database a [`NotifyTable`](crate::NotifyTable) writes SQL for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Dialect {
    /// MySQL 8.0 and MariaDB 10.6 or later: server time `UTC_TIMESTAMP(6)`, sender
    /// `CONNECTION_ID()`, InnoDB.
    MySql,
    /// SQLite 3.35 or later. SQLite has no server session, so the sender id written with
    /// each notification is `pid`, normally the notifying process's id.
    Sqlite {
        /// The id written as the sender of this process's notifications.
        pid: u32,
    },
    /// PostgreSQL 12 or later: server time `statement_timestamp()` in UTC, sender
    /// `pg_backend_pid()`. PostgreSQL has LISTEN/NOTIFY of its own; the notify table
    /// there is what a listener that must not lose anything reads, woken by a `pg_notify`
    /// the notification statement sends in the same transaction.
    Postgres,
}

impl Dialect {
    /// Whether ids become visible in the order they were handed out (one writer at a
    /// time: SQLite). Elsewhere a transaction that took a lower id may commit later, and a
    /// listener watches for it.
    pub fn ordered(self) -> bool {
        matches!(self, Dialect::Sqlite { .. })
    }
}

/// What a durable notification's `pg_notify` payload starts with on PostgreSQL (the
/// payload follows): `chr(30) || 'rowbus' || chr(30)`, so that a durable listener tells a
/// durable notification, whose row it reads from the table, from a plain `pg_notify`.
pub const PG_DURABLE_MARK: &str = "\u{1e}rowbus\u{1e}";

/// The longest notify-table name on PostgreSQL: an identifier is at most 63 bytes, and
/// the longest index name adds `_channel_id` to the table's.
pub const PG_MAX_TABLE_LEN: usize = 63 - PG_LONGEST_SUFFIX.len();
const PG_LONGEST_SUFFIX: &str = "_channel_id";

/// Server time minus a bind, formatted as text that sorts like the time it stands for.
const MYSQL_CUTOFF: &str = "DATE_FORMAT(UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND, '%Y-%m-%d %H:%i:%s.%f')";
/// Server time, formatted like [`MYSQL_CUTOFF`]: the head row's `at`.
const MYSQL_NOW: &str = "DATE_FORMAT(UTC_TIMESTAMP(6), '%Y-%m-%d %H:%i:%s.%f')";
const SQLITE_NOW: &str = "strftime('%Y-%m-%d %H:%M:%f', 'now')";
const SQLITE_CUTOFF: &str = "strftime('%Y-%m-%d %H:%M:%f', 'now', ?)";
/// The statement's start in UTC (constant within a statement, as MySQL's
/// `UTC_TIMESTAMP(6)` is): what `created_at` holds and the cutoffs are taken from.
const PG_TIME: &str = "(statement_timestamp() AT TIME ZONE 'UTC')";
/// The text form of a time, sorting like it: the same as MySQL's.
const PG_FORMAT: &str = "'YYYY-MM-DD HH24:MI:SS.US'";

/// PostgreSQL's server time minus the bind `$n` (µs), formatted like [`MYSQL_CUTOFF`].
fn pg_cutoff(n: usize) -> String {
    format!("to_char({PG_TIME} - ${n} * interval '1 microsecond', {PG_FORMAT})")
}

/// PostgreSQL's cleanup SELECT with `held` channels' holds (see [`Sql::cleanup_holding`]).
fn pg_cleanup(t: &str, held: usize) -> String {
    use std::fmt::Write as _;
    let mut sql = format!("SELECT id FROM {t} WHERE created_at < {PG_TIME} - $1 * interval '1 microsecond'");
    for i in 0..held {
        let (channel, id) = (2 + 2 * i, 3 + 2 * i);
        write!(sql, " AND NOT (channel = ${channel} AND id >= ${id})").expect("writing to a String");
    }
    write!(sql, " ORDER BY created_at LIMIT ${}", 2 + 2 * held).expect("writing to a String");
    sql
}

/// PostgreSQL's server time, formatted like [`MYSQL_NOW`].
fn pg_now() -> String {
    format!("to_char({PG_TIME}, {PG_FORMAT})")
}

/// The statement texts of one table in one dialect.
#[derive(Debug, Clone)]
pub(crate) struct Sql {
    pub dialect: Dialect,
    pub quoted: String,
    pub create: Vec<Arc<str>>,
    pub drop: Arc<str>,
    pub notify: Arc<str>,
    pub subscribe: Arc<str>,
    pub cleanup: Arc<str>,
    /// The cleanup that keeps the ids at or above a floor.
    pub cleanup_below: Arc<str>,
    /// The resume statement's head row: the retention's cutoff.
    pub resume: Arc<str>,
}

impl Sql {
    pub fn new(dialect: Dialect, table: &str) -> Self {
        let t = match dialect {
            Dialect::Postgres => format!("\"{table}\""),
            _ => format!("`{table}`"),
        };
        let (create, notify, subscribe, cleanup) = match dialect {
            Dialect::MySql => (
                vec![format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\n\
                     \x20 `id` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,\n\
                     \x20 `channel` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,\n\
                     \x20 `payload` TEXT CHARACTER SET utf8mb4 NOT NULL,\n\
                     \x20 `pid` BIGINT UNSIGNED NOT NULL,\n\
                     \x20 `created_at` DATETIME(6) NOT NULL,\n\
                     \x20 PRIMARY KEY (`id`),\n\
                     \x20 KEY `channel_id` (`channel`, `id`),\n\
                     \x20 KEY `channel_created_at` (`channel`, `created_at`),\n\
                     \x20 KEY `created_at` (`created_at`)\n\
                     ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
                )],
                format!(
                    "INSERT INTO {t} (`channel`, `payload`, `pid`, `created_at`) \
                     VALUES (?, ?, CONNECTION_ID(), UTC_TIMESTAMP(6))"
                ),
                // The mark row comes first and its subquery matches the channel exactly:
                // the column's collation pads trailing spaces, `CAST(? AS BINARY)` does not.
                // Then the floor, the id of the last row inserted before the window (0 when
                // there is none; one step back on the `created_at` index), and the ids of
                // every channel inside the window (an index range, `id` read from the
                // index): in one statement, so one consistent read with the mark.
                format!(
                    "SELECT COALESCE((SELECT `id` FROM {t} WHERE `channel` = ? AND `channel` = CAST(? AS BINARY) \
                     ORDER BY `id` DESC LIMIT 1), CAST(0 AS UNSIGNED)) AS `id`, '' AS `channel`, '' AS `payload`, \
                     CAST(0 AS UNSIGNED) AS `pid`, {MYSQL_CUTOFF} AS `cutoff`, {MYSQL_NOW} AS `at` \
                     UNION ALL SELECT COALESCE((SELECT `id` FROM {t} WHERE `created_at` < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
                     ORDER BY `created_at` DESC LIMIT 1), CAST(0 AS UNSIGNED)), '', '', CAST(0 AS UNSIGNED), NULL, NULL \
                     UNION ALL SELECT `id`, '', '', CAST(0 AS UNSIGNED), NULL, NULL FROM {t} \
                     WHERE `created_at` >= UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND"
                ),
                // A consistent read: a locking range DELETE would wait for an open
                // notifier's row at the end of the created_at index, stalling the listener.
                format!(
                    "SELECT `id` FROM {t} WHERE `created_at` < UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND \
                     ORDER BY `created_at` LIMIT ?"
                ),
            ),
            Dialect::Sqlite { .. } => (
                vec![
                    format!(
                        "CREATE TABLE IF NOT EXISTS {t} (\n\
                         \x20 `id` INTEGER PRIMARY KEY AUTOINCREMENT,\n\
                         \x20 `channel` TEXT NOT NULL CHECK (length(`channel`) BETWEEN 1 AND 255),\n\
                         \x20 `payload` TEXT NOT NULL CHECK (length(CAST(`payload` AS BLOB)) <= 65535),\n\
                         \x20 `pid` INTEGER NOT NULL,\n\
                         \x20 `created_at` TEXT NOT NULL\n\
                         )"
                    ),
                    format!("CREATE INDEX IF NOT EXISTS `{table}_channel_id` ON {t} (`channel`, `id`)"),
                    format!(
                        "CREATE INDEX IF NOT EXISTS `{table}_channel_created_at` ON {t} (`channel`, `created_at`)"
                    ),
                    format!("CREATE INDEX IF NOT EXISTS `{table}_created_at` ON {t} (`created_at`)"),
                ],
                format!(
                    "INSERT INTO {t} (`channel`, `payload`, `pid`, `created_at`) VALUES (?, ?, ?, {SQLITE_NOW})"
                ),
                // The mark row alone: one writer hands out ids in commit order, so nothing
                // below the mark can become visible later and no window is read.
                format!(
                    "SELECT COALESCE((SELECT MAX(`id`) FROM {t} WHERE `channel` = ?), 0), '', '', 0, \
                     {SQLITE_CUTOFF}, {SQLITE_NOW}"
                ),
                format!(
                    "SELECT `id` FROM {t} WHERE `created_at` < {SQLITE_CUTOFF} ORDER BY `created_at` LIMIT ?"
                ),
            ),
            Dialect::Postgres => (
                vec![
                    format!(
                        "CREATE TABLE IF NOT EXISTS {t} (\n\
                         \x20 id BIGSERIAL PRIMARY KEY,\n\
                         \x20 channel TEXT NOT NULL CHECK (length(channel) BETWEEN 1 AND 255),\n\
                         \x20 payload TEXT NOT NULL,\n\
                         \x20 pid BIGINT NOT NULL,\n\
                         \x20 created_at TIMESTAMP(6) NOT NULL\n\
                         )"
                    ),
                    format!("CREATE INDEX IF NOT EXISTS \"{table}_channel_id\" ON {t} (channel, id)"),
                    format!("CREATE INDEX IF NOT EXISTS \"{table}_channel_at\" ON {t} (channel, created_at)"),
                    format!("CREATE INDEX IF NOT EXISTS \"{table}_at\" ON {t} (created_at)"),
                ],
                // The row, and a NOTIFY on the channel in the same transaction, its payload
                // behind `PG_DURABLE_MARK`: a durable listener wakes and reads the row (and
                // tells it from a plain `pg_notify`, which has no row), rowbus's plain
                // LISTENers drop the mark. Both are delivered at commit, never on rollback.
                format!(
                    "WITH n AS (INSERT INTO {t} (channel, payload, pid, created_at) \
                     VALUES ($1, $2, pg_backend_pid(), {PG_TIME}) RETURNING id) \
                     SELECT pg_notify($1, chr(30) || 'rowbus' || chr(30) || $2) FROM n"
                ),
                // As MySQL's: the mark, the floor, the window's ids of every channel.
                format!(
                    "SELECT COALESCE((SELECT id FROM {t} WHERE channel = $1 ORDER BY id DESC LIMIT 1), 0) AS id, \
                     '' AS channel, '' AS payload, 0::BIGINT AS pid, {} AS cutoff, {} AS at \
                     UNION ALL SELECT COALESCE((SELECT id FROM {t} WHERE created_at < {PG_TIME} - $3 * interval '1 microsecond' \
                     ORDER BY created_at DESC LIMIT 1), 0), '', '', 0, NULL, NULL \
                     UNION ALL SELECT id, '', '', 0, NULL, NULL FROM {t} \
                     WHERE created_at >= {PG_TIME} - $3 * interval '1 microsecond'",
                    pg_cutoff(2),
                    pg_now()
                ),
                pg_cleanup(&t, 0),
            ),
        };
        // The cleanup's ORDER BY stays last; the floor goes before it.
        let cleanup_below = match dialect {
            Dialect::Postgres => format!(
                "SELECT id FROM {t} WHERE created_at < {PG_TIME} - $1 * interval '1 microsecond' AND id < $2 \
                 ORDER BY created_at LIMIT $3"
            ),
            _ => cleanup.replace(" ORDER BY", " AND `id` < ? ORDER BY"),
        };
        let resume = match dialect {
            Dialect::MySql => format!(
                "SELECT CAST(0 AS UNSIGNED) AS `id`, '' AS `channel`, '' AS `payload`, CAST(0 AS UNSIGNED) AS `pid`, \
                 {MYSQL_CUTOFF} AS `cutoff`, {MYSQL_NOW} AS `at`"
            ),
            Dialect::Sqlite { .. } => format!("SELECT 0, '', '', 0, {SQLITE_CUTOFF}, {SQLITE_NOW}"),
            Dialect::Postgres => format!(
                "SELECT 0::BIGINT AS id, '' AS channel, '' AS payload, 0::BIGINT AS pid, {} AS cutoff, {} AS at",
                pg_cutoff(1),
                pg_now()
            ),
        };
        Sql {
            dialect,
            cleanup_below: Arc::from(cleanup_below),
            resume: Arc::from(resume),
            create: create.into_iter().map(Arc::from).collect(),
            drop: Arc::from(format!("DROP TABLE IF EXISTS {t}")),
            notify: Arc::from(notify),
            subscribe: Arc::from(subscribe),
            cleanup: Arc::from(cleanup),
            quoted: t,
        }
    }

    /// The cleanup's SELECT keeping, for each of `held` channels, its rows from an id on.
    /// Binds: [`Sql::age_bind`] of the retention, a channel and an id per held channel,
    /// the limit.
    pub fn cleanup_holding(&self, held: usize) -> String {
        match self.dialect {
            Dialect::Postgres => pg_cleanup(&self.quoted, held),
            // MySQL's comparison pads trailing spaces: `jobs` holds `jobs ` too, which
            // only keeps more.
            _ => self.cleanup.replace(
                " ORDER BY",
                &format!("{} ORDER BY", " AND NOT (`channel` = ? AND `id` >= ?)".repeat(held)),
            ),
        }
    }

    /// The DELETE of `ids` rows by primary key.
    pub fn delete(&self, ids: usize) -> String {
        use std::fmt::Write as _;
        let mut sql = match self.dialect {
            Dialect::Postgres => format!("DELETE FROM {} WHERE id IN (", self.quoted),
            _ => format!("DELETE FROM {} WHERE `id` IN (", self.quoted),
        };
        for i in 0..ids {
            if i > 0 {
                sql.push_str(", ");
            }
            match self.dialect {
                Dialect::Postgres => write!(sql, "${}", i + 1).expect("writing to a String"),
                _ => sql.push('?'),
            }
        }
        sql.push(')');
        sql
    }

    /// The poll statement over `channels` subscriptions and `gap_slots` id ranges (gaps
    /// and first windows). Its binds are [`Sql::age_bind`] of the lookback, then the first
    /// and last id of each slot (not on SQLite, which has neither), then per channel those
    /// of [`Sql::poll_binds`].
    pub fn poll(&self, channels: usize, gap_slots: usize) -> String {
        let t = &self.quoted;
        let mut sql = String::with_capacity(256 + channels * 320 + gap_slots * 24);
        match self.dialect {
            Dialect::MySql => {
                sql.push_str("SELECT CAST(0 AS UNSIGNED) AS `id`, '' AS `channel`, '' AS `payload`, CAST(0 AS UNSIGNED) AS `pid`, ");
                sql.push_str(MYSQL_CUTOFF);
                sql.push_str(" AS `cutoff`, ");
                sql.push_str(MYSQL_NOW);
                sql.push_str(" AS `at`");
                if gap_slots > 0 {
                    // The open gaps and first windows of every channel, as primary-key
                    // ranges of any channel: a row of another channel closes the gap it sits
                    // in; one of the gap's own channel is a late commit. Its `created_at`
                    // decides a first window's. Unused slots bind an empty range.
                    sql.push_str(" UNION ALL SELECT `id`, `channel`, `payload`, `pid`, NULL, ");
                    sql.push_str("DATE_FORMAT(`created_at`, '%Y-%m-%d %H:%i:%s.%f') FROM ");
                    sql.push_str(t);
                    sql.push_str(" WHERE ");
                    for i in 0..gap_slots {
                        sql.push_str(if i == 0 {
                            "`id` BETWEEN ? AND ?"
                        } else {
                            " OR `id` BETWEEN ? AND ?"
                        });
                    }
                }
                for _ in 0..channels {
                    // Rows above the mark, a (channel, id) range. The collation pads
                    // trailing spaces; the binary comparison keeps `jobs ` rows out of
                    // `jobs`'s branch.
                    sql.push_str(" UNION ALL SELECT `id`, `channel`, `payload`, `pid`, NULL, NULL FROM ");
                    sql.push_str(t);
                    sql.push_str(" WHERE `channel` = ? AND `channel` = CAST(? AS BINARY) AND `id` > ?");
                }
            }
            Dialect::Sqlite { .. } => {
                // One writer: ids become visible in commit order, so the rows above the
                // mark are all a poll can find new. SQLite caps a compound SELECT at 500
                // terms: the channels travel as a VALUES list joined against the table.
                sql.push_str("WITH `c`(`cutoff`) AS MATERIALIZED (SELECT ");
                sql.push_str(SQLITE_CUTOFF);
                sql.push_str("), `s`(`channel`, `mark`) AS (VALUES ");
                for i in 0..channels {
                    sql.push_str(if i == 0 { "(?, ?)" } else { ", (?, ?)" });
                }
                sql.push_str(") SELECT 0, '', '', 0, `cutoff`, ");
                sql.push_str(SQLITE_NOW);
                sql.push_str(" FROM `c` UNION ALL SELECT `n`.`id`, `n`.`channel`, `n`.`payload`, `n`.`pid`, NULL, NULL FROM `s` CROSS JOIN ");
                sql.push_str(t);
                sql.push_str(" AS `n` ON `n`.`channel` = `s`.`channel` AND `n`.`id` > `s`.`mark`");
            }
            Dialect::Postgres => {
                use std::fmt::Write as _;
                // The same branches as MySQL's; numbered binds let a channel's branches
                // share its channel and mark, and text compares exactly.
                let w = "writing to a String";
                write!(
                    sql,
                    "SELECT 0::BIGINT AS id, '' AS channel, '' AS payload, 0::BIGINT AS pid, {} AS cutoff, {} AS at",
                    pg_cutoff(1),
                    pg_now()
                )
                .expect(w);
                let mut n = 2;
                if gap_slots > 0 {
                    write!(
                        sql,
                        " UNION ALL SELECT id, channel, payload, pid, NULL, to_char(created_at, {PG_FORMAT}) \
                         FROM {t} WHERE "
                    )
                    .expect(w);
                    for i in 0..gap_slots {
                        let or = if i == 0 { "" } else { " OR " };
                        write!(sql, "{or}id BETWEEN ${n} AND ${}", n + 1).expect(w);
                        n += 2;
                    }
                }
                for _ in 0..channels {
                    let (channel, mark) = (n, n + 1);
                    write!(
                        sql,
                        " UNION ALL SELECT id, channel, payload, pid, NULL, NULL FROM {t} \
                         WHERE channel = ${channel} AND id > ${mark}"
                    )
                    .expect(w);
                    n += 2;
                }
            }
        }
        sql
    }

    /// Appends one subscription's binds to a poll statement's: its channel and its mark.
    pub fn poll_binds(&self, binds: &mut Vec<Value>, channel: &Arc<str>, mark: u64) {
        let mark = Value::Int(id_to_int(mark));
        let channel = Value::Text(channel.clone());
        match self.dialect {
            Dialect::MySql => binds.extend([channel.clone(), channel, mark]),
            Dialect::Sqlite { .. } | Dialect::Postgres => binds.extend([channel, mark]),
        }
    }

    /// The bind that stands for "now minus `age`" in this dialect: microseconds for
    /// MySQL's `INTERVAL` and PostgreSQL's `interval`, a time modifier for SQLite's
    /// `strftime`.
    pub fn age_bind(&self, age: Duration) -> Value {
        match self.dialect {
            Dialect::MySql | Dialect::Postgres => {
                Value::Int(i64::try_from(age.as_micros()).unwrap_or(i64::MAX))
            }
            Dialect::Sqlite { .. } => {
                Value::Text(Arc::from(format!("-{}.{:06} seconds", age.as_secs(), age.subsec_micros())))
            }
        }
    }
}

/// Ids are BIGINT UNSIGNED on MySQL but never reach 2^63 in practice; clamp rather than wrap.
pub(crate) fn id_to_int(id: u64) -> i64 {
    i64::try_from(id).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn placeholders(sql: &str) -> usize {
        sql.matches('?').count()
    }

    #[test]
    fn mysql_table_matches_the_seed_column_for_column() {
        let sql = Sql::new(Dialect::MySql, "rowbus_notify");
        let ddl = &sql.create[0];
        for part in [
            "CREATE TABLE IF NOT EXISTS `rowbus_notify`",
            "`id` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT",
            "`channel` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL",
            "`payload` TEXT CHARACTER SET utf8mb4 NOT NULL",
            "`pid` BIGINT UNSIGNED NOT NULL",
            "`created_at` DATETIME(6) NOT NULL",
            "PRIMARY KEY (`id`)",
            "KEY `channel_id` (`channel`, `id`)",
            "KEY `channel_created_at` (`channel`, `created_at`)",
            "KEY `created_at` (`created_at`)",
            ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
        ] {
            assert!(ddl.contains(part), "missing {part:?} in {ddl}");
        }
        assert_eq!(&*sql.drop, "DROP TABLE IF EXISTS `rowbus_notify`");
    }

    #[test]
    fn sqlite_table_has_the_same_columns_and_indexes() {
        let sql = Sql::new(Dialect::Sqlite { pid: 1 }, "n");
        assert_eq!(sql.create.len(), 4);
        assert!(sql.create[0].contains("`id` INTEGER PRIMARY KEY AUTOINCREMENT"));
        assert!(sql.create[1].ends_with("ON `n` (`channel`, `id`)"));
        assert!(sql.create[2].ends_with("ON `n` (`channel`, `created_at`)"));
        assert!(sql.create[3].ends_with("ON `n` (`created_at`)"));
    }

    #[test]
    fn placeholder_counts_match_bind_layouts() {
        let mysql = Sql::new(Dialect::MySql, "t");
        assert_eq!(placeholders(&mysql.notify), 2);
        assert!(mysql.notify.contains("CONNECTION_ID(), UTC_TIMESTAMP(6)"));
        assert_eq!(placeholders(&mysql.subscribe), 5);
        assert_eq!(placeholders(&mysql.cleanup), 2);
        assert_eq!(mysql.delete(3), "DELETE FROM `t` WHERE `id` IN (?, ?, ?)");
        assert_eq!(placeholders(&mysql.poll(3, 0)), 1 + 3 * 3);
        assert_eq!(placeholders(&mysql.poll(3, 4)), 1 + 4 * 2 + 3 * 3);

        let sqlite = Sql::new(Dialect::Sqlite { pid: 1 }, "t");
        assert_eq!(placeholders(&sqlite.notify), 3);
        assert_eq!(placeholders(&sqlite.subscribe), 2);
        assert_eq!(placeholders(&sqlite.cleanup), 2);
        assert_eq!(placeholders(&sqlite.poll(3, 0)), 1 + 3 * 2);
    }

    /// The highest `$n` in `sql`, and whether every one up to it appears.
    fn numbered(sql: &str) -> (usize, bool) {
        let used: Vec<usize> = sql
            .split('$')
            .skip(1)
            .filter_map(|rest| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
            .collect();
        let max = used.iter().copied().max().unwrap_or(0);
        (max, (1..=max).all(|n| used.contains(&n)))
    }

    #[test]
    fn postgres_statements_number_their_binds_as_the_layouts_say() {
        let pg = Sql::new(Dialect::Postgres, "t");
        assert_eq!(&*pg.drop, "DROP TABLE IF EXISTS \"t\"");
        assert!(pg.create[0].contains("id BIGSERIAL PRIMARY KEY"));
        assert!(pg.create[3].ends_with("ON \"t\" (created_at)"));
        for (sql, binds) in [
            (&*pg.notify, 2),
            (&*pg.subscribe, 3),
            (&*pg.cleanup, 2),
            (&*pg.cleanup_below, 3),
            (&pg.cleanup_holding(2), 6),
            (&*pg.resume, 1),
            (&pg.poll(3, 0), 1 + 3 * 2),
            (&pg.poll(3, 4), 1 + 4 * 2 + 3 * 2),
            (&pg.delete(3), 3),
        ] {
            assert_eq!(numbered(sql), (binds, true), "{sql}");
            assert!(!sql.contains('?') && !sql.contains('`'), "{sql}");
        }
        assert!(
            pg.notify.contains("pg_notify($1, chr(30) || 'rowbus' || chr(30) || $2)"),
            "LISTENers on the channel are woken, the payload marked durable: {PG_DURABLE_MARK:?}"
        );
        assert_eq!(pg.delete(2), "DELETE FROM \"t\" WHERE id IN ($1, $2)");
    }

    #[test]
    fn only_sqlite_hands_out_ids_in_commit_order() {
        assert!(Dialect::Sqlite { pid: 1 }.ordered());
        assert!(!Dialect::MySql.ordered() && !Dialect::Postgres.ordered());
    }

    #[test]
    fn poll_text_depends_only_on_the_channel_count_and_gap_slots() {
        let sql = Sql::new(Dialect::MySql, "t");
        assert_eq!(sql.poll(2, 4), sql.poll(2, 4));
        assert_ne!(sql.poll(2, 0), sql.poll(3, 0));
        assert_ne!(sql.poll(2, 0), sql.poll(2, 1));
        assert!(!sql.poll(2, 0).contains("BETWEEN"), "no gap branch without gaps");
    }

    #[test]
    fn age_binds() {
        let age = Duration::from_millis(60_250);
        assert_eq!(Sql::new(Dialect::MySql, "t").age_bind(age), Value::Int(60_250_000));
        assert_eq!(Sql::new(Dialect::Postgres, "t").age_bind(age), Value::Int(60_250_000));
        assert_eq!(
            Sql::new(Dialect::Sqlite { pid: 1 }, "t").age_bind(age),
            Value::Text(Arc::from("-60.250000 seconds"))
        );
    }
}
