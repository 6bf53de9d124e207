//! Queue table names and the SQL of each database for them.

use std::fmt;
use std::sync::Arc;

use crate::backend::Backend;
use crate::error::Error;

/// Longest part of a queue table's name, in bytes: PostgreSQL keeps 63, and the dead-letter
/// table and the claim index add `_dead` and `_claim`.
pub const MAX_TABLE_NAME: usize = 57;
/// Longest group name, in characters.
pub const MAX_GROUP_CHARS: usize = 255;

/// A queue table's name: `jobs`, or schema-qualified `app.jobs` where the database has
/// schemas (PostgreSQL; on MySQL/MariaDB the qualifier is a database). Each part is a plain
/// identifier `[A-Za-z_][A-Za-z0-9_]*`; the table part at most 57 bytes.
///
/// ```
/// use rowbus::QueueTable;
/// let t: QueueTable = "app.jobs".parse().unwrap();
/// assert_eq!(t.channel(), "app.jobs");
/// assert!("jobs; DROP TABLE x".parse::<QueueTable>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct QueueTable {
    schema: Option<String>,
    name: String,
    channel: Arc<str>,
}

fn is_identifier(part: &str) -> bool {
    let mut bytes = part.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

impl std::str::FromStr for QueueTable {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        let invalid = |reason: &str| Error::InvalidName { name: text.to_owned(), reason: reason.to_owned() };
        let (schema, name) = match text.split_once('.') {
            Some((schema, name)) => (Some(schema), name),
            None => (None, text),
        };
        for part in schema.iter().chain([&name]) {
            if !is_identifier(part) {
                return Err(invalid("each part must be a plain identifier [A-Za-z_][A-Za-z0-9_]*"));
            }
            if part.len() > MAX_TABLE_NAME {
                return Err(invalid("each part must be at most 57 characters"));
            }
        }
        Ok(QueueTable { schema: schema.map(str::to_owned), name: name.to_owned(), channel: Arc::from(text) })
    }
}

impl fmt::Display for QueueTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.channel)
    }
}

impl QueueTable {
    /// The name as written (`app.jobs`): also its wake-up channel.
    pub fn channel(&self) -> &str {
        &self.channel
    }

    pub(crate) fn channel_arc(&self) -> &Arc<str> {
        &self.channel
    }

    fn quote(&self, backend: Backend, suffix: &str) -> String {
        let q = |part: &str| match backend {
            Backend::Postgres => format!("\"{part}\""),
            Backend::MySql | Backend::Sqlite => format!("`{part}`"),
        };
        match &self.schema {
            Some(schema) => format!("{}.{}", q(schema), q(&format!("{}{suffix}", self.name))),
            None => q(&format!("{}{suffix}", self.name)),
        }
    }

    fn check_for(&self, backend: Backend) -> Result<(), Error> {
        if backend == Backend::Sqlite && self.schema.is_some() {
            return Err(Error::InvalidName {
                name: self.channel.to_string(),
                reason: "SQLite has no schemas: use an unqualified table name".into(),
            });
        }
        Ok(())
    }
}

/// Checks a group name: at most 255 characters and no trailing space (MySQL's collation
/// would make `a ` and `a` the same group).
pub(crate) fn check_group(group: &str) -> Result<(), Error> {
    let invalid = |reason: &str| Error::InvalidName { name: group.to_owned(), reason: reason.to_owned() };
    if group.chars().count() > MAX_GROUP_CHARS {
        return Err(invalid("a group name has at most 255 characters"));
    }
    if group.ends_with(' ') {
        return Err(invalid("a group name must not end with a space"));
    }
    Ok(())
}

/// The statements of one queue table on one database. `$n` on PostgreSQL, `?` elsewhere;
/// the binds are documented with each builder in `broker::ops`.
#[derive(Debug)]
pub(crate) struct TableSql {
    pub backend: Backend,
    pub table: QueueTable,
    pub quoted: String,
    pub dead: String,
    pub create: Vec<String>,
    /// Binds: group, limit, lease µs, token. Returns the claimed rows.
    pub claim: Arc<str>,
    /// MySQL's claim, in a transaction: this SELECT ... FOR UPDATE SKIP LOCKED (group,
    /// limit), then `claim_mark` of the ids.
    pub claim_select: Arc<str>,
    /// A transactional handler's claim, in the caller's transaction: up to `limit` ready
    /// rows, locked and already deleted (the transaction's commit acknowledges them).
    /// Binds: group, limit. Returns the rows. On MySQL, which cannot delete from the table
    /// it selects the rows from, this only locks them; `delete_locked` follows.
    pub claim_locked: Arc<str>,
    /// Binds: id, token.
    pub ack: Arc<str>,
    /// Binds: delay µs, error, id, token.
    pub retry: Arc<str>,
    /// Binds: id, token. Gives a claimed, unstarted message back without counting it.
    pub release: Arc<str>,
    /// Binds: lease µs, id, token.
    pub extend: Arc<str>,
    /// Binds: error, id, token: copies the row into the dead-letter table.
    pub dead_insert: Arc<str>,
}

/// Microseconds since the Unix epoch, as each database computes "now".
fn now(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => "now()",
        Backend::MySql => "UTC_TIMESTAMP(6)",
        Backend::Sqlite => "CAST(unixepoch('subsec') * 1000000 AS INTEGER)",
    }
}

/// "now plus the microseconds in placeholder `p`".
fn later(backend: Backend, p: &str) -> String {
    match backend {
        Backend::Postgres => format!("now() + {p} * interval '1 microsecond'"),
        Backend::MySql => format!("UTC_TIMESTAMP(6) + INTERVAL {p} MICROSECOND"),
        Backend::Sqlite => format!("CAST(unixepoch('subsec') * 1000000 AS INTEGER) + {p}"),
    }
}

/// The timestamp `p` microseconds after the Unix epoch, as the table stores it.
fn from_micros(backend: Backend, p: &str) -> String {
    match backend {
        Backend::Postgres => format!("(TIMESTAMPTZ 'epoch' + {p} * interval '1 microsecond')"),
        Backend::MySql => format!("TIMESTAMPADD(MICROSECOND, {p}, '1970-01-01 00:00:00')"),
        Backend::Sqlite => p.to_owned(),
    }
}

/// The columns a claim returns: id, group, payload, attempts, created_at (µs since epoch).
fn claimed_columns(backend: Backend) -> &'static str {
    match backend {
        Backend::Postgres => {
            "id, group_name, payload, attempts::BIGINT, (EXTRACT(EPOCH FROM created_at) * 1000000)::BIGINT"
        }
        Backend::MySql => {
            "CAST(id AS SIGNED), group_name, payload, CAST(attempts AS SIGNED), \
             CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', created_at) AS SIGNED)"
        }
        Backend::Sqlite => "id, group_name, payload, attempts, created_at",
    }
}

impl TableSql {
    pub fn new(backend: Backend, table: &QueueTable) -> Result<Self, Error> {
        table.check_for(backend)?;
        let t = table.quote(backend, "");
        let dead = table.quote(backend, "_dead");
        // On MySQL/MariaDB the claim order is the clustered primary key itself and this
        // index holds `id` alone: InnoDB's locking reads through a secondary index visit
        // every delete-marked entry the purge has not removed yet, and a busy queue
        // leaves thousands in front of its first ready row (a claim grew from 0.3 ms to
        // 1.3 ms over 8,000 acknowledged rows; walking the clustered index it stays flat).
        let index = match backend {
            // PostgreSQL puts the index in the table's schema by itself.
            Backend::Postgres => format!("\"{}_claim\"", table.name),
            Backend::MySql => format!("`{}_id`", table.name),
            Backend::Sqlite => format!("`{}_claim`", table.name),
        };
        let p = |n: usize| match backend {
            Backend::Postgres => format!("${n}"),
            _ => "?".to_owned(),
        };
        let now = now(backend);
        let cols = claimed_columns(backend);
        // A lease lives in its own column, outside the claim index: a claim then changes
        // no indexed column, so it neither moves index entries (which MySQL's readers step
        // over until purge) nor defeats PostgreSQL's HOT updates.
        let unleased = format!("(lease_until IS NULL OR lease_until <= {now})");
        let create = match backend {
            Backend::Postgres => vec![
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\n\
                     \x20 id BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY,\n\
                     \x20 group_name TEXT NOT NULL DEFAULT '',\n\
                     \x20 payload BYTEA NOT NULL,\n\
                     \x20 attempts INTEGER NOT NULL DEFAULT 0,\n\
                     \x20 visible_at TIMESTAMPTZ NOT NULL DEFAULT now(),\n\
                     \x20 lease BIGINT,\n\
                     \x20 lease_until TIMESTAMPTZ,\n\
                     \x20 created_at TIMESTAMPTZ NOT NULL DEFAULT now(),\n\
                     \x20 last_error TEXT\n\
                     )"
                ),
                format!("CREATE INDEX IF NOT EXISTS {index} ON {t} (group_name, visible_at, id)"),
                format!(
                    "CREATE TABLE IF NOT EXISTS {dead} (\n\
                     \x20 id BIGINT PRIMARY KEY,\n\
                     \x20 group_name TEXT NOT NULL,\n\
                     \x20 payload BYTEA NOT NULL,\n\
                     \x20 attempts INTEGER NOT NULL,\n\
                     \x20 created_at TIMESTAMPTZ NOT NULL,\n\
                     \x20 failed_at TIMESTAMPTZ NOT NULL DEFAULT now(),\n\
                     \x20 last_error TEXT\n\
                     )"
                ),
            ],
            Backend::MySql => vec![
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\n\
                     \x20 `id` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,\n\
                     \x20 `group_name` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '',\n\
                     \x20 `payload` LONGBLOB NOT NULL,\n\
                     \x20 `attempts` INT NOT NULL DEFAULT 0,\n\
                     \x20 `visible_at` DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),\n\
                     \x20 `lease` BIGINT NULL,\n\
                     \x20 `lease_until` DATETIME(6) NULL,\n\
                     \x20 `created_at` DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),\n\
                     \x20 `last_error` TEXT NULL,\n\
                     \x20 PRIMARY KEY (`group_name`, `visible_at`, `id`),\n\
                     \x20 UNIQUE KEY {index} (`id`)\n\
                     ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
                ),
                format!(
                    "CREATE TABLE IF NOT EXISTS {dead} (\n\
                     \x20 `id` BIGINT UNSIGNED NOT NULL,\n\
                     \x20 `group_name` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,\n\
                     \x20 `payload` LONGBLOB NOT NULL,\n\
                     \x20 `attempts` INT NOT NULL,\n\
                     \x20 `created_at` DATETIME(6) NOT NULL,\n\
                     \x20 `failed_at` DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),\n\
                     \x20 `last_error` TEXT NULL,\n\
                     \x20 PRIMARY KEY (`id`)\n\
                     ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
                ),
            ],
            Backend::Sqlite => vec![
                format!(
                    "CREATE TABLE IF NOT EXISTS {t} (\n\
                     \x20 `id` INTEGER PRIMARY KEY AUTOINCREMENT,\n\
                     \x20 `group_name` TEXT NOT NULL DEFAULT '',\n\
                     \x20 `payload` BLOB NOT NULL,\n\
                     \x20 `attempts` INTEGER NOT NULL DEFAULT 0,\n\
                     \x20 `visible_at` INTEGER NOT NULL DEFAULT ({now}),\n\
                     \x20 `lease` INTEGER,\n\
                     \x20 `lease_until` INTEGER,\n\
                     \x20 `created_at` INTEGER NOT NULL DEFAULT ({now}),\n\
                     \x20 `last_error` TEXT\n\
                     )"
                ),
                format!("CREATE INDEX IF NOT EXISTS {index} ON {t} (`group_name`, `visible_at`, `id`)"),
                format!(
                    "CREATE TABLE IF NOT EXISTS {dead} (\n\
                     \x20 `id` INTEGER PRIMARY KEY,\n\
                     \x20 `group_name` TEXT NOT NULL,\n\
                     \x20 `payload` BLOB NOT NULL,\n\
                     \x20 `attempts` INTEGER NOT NULL,\n\
                     \x20 `created_at` INTEGER NOT NULL,\n\
                     \x20 `failed_at` INTEGER NOT NULL DEFAULT ({now}),\n\
                     \x20 `last_error` TEXT\n\
                     )"
                ),
            ],
        };
        let select_ready = format!(
            "SELECT id FROM {t} WHERE group_name = {} AND visible_at <= {now} AND {unleased} ORDER BY visible_at, id LIMIT {}",
            p(1),
            p(2)
        );
        let claim = match backend {
            // `= ANY(ARRAY(...))` rather than `IN (...)`: as a prepared statement, PostgreSQL's
            // generic plan for `IN` (LIMIT unknown, guessed at 10% of the table) hash-joins a
            // sequential scan of the whole table against the locked ids on every claim.
            Backend::Postgres => format!(
                "UPDATE {t} SET lease_until = {}, lease = $4, attempts = attempts + 1 \
                 WHERE id = ANY(ARRAY({select_ready} FOR UPDATE SKIP LOCKED)) RETURNING {cols}",
                later(backend, "$3")
            ),
            // SQLite has one writer: the UPDATE's own read is the lock.
            Backend::Sqlite => format!(
                "UPDATE {t} SET lease_until = {}, lease = ?, attempts = attempts + 1 \
                 WHERE id IN ({select_ready}) RETURNING {cols}",
                later(backend, "?")
            ),
            // MySQL has no UPDATE ... RETURNING: see claim_select.
            Backend::MySql => String::new(),
        };
        let claim_select: Arc<str> = format!(
            "SELECT {cols} FROM {t} WHERE group_name = ? AND visible_at <= {now} AND {unleased} \
             ORDER BY visible_at, id LIMIT ? FOR UPDATE SKIP LOCKED"
        )
        .into();
        let claim_locked: Arc<str> = match backend {
            // The deletion is the lock: other claims skip the rows until this transaction
            // ends, and a commit needs no second statement.
            Backend::Postgres => format!(
                "DELETE FROM {t} WHERE id = ANY(ARRAY({select_ready} FOR UPDATE SKIP LOCKED)) RETURNING {cols}"
            )
            .into(),
            Backend::Sqlite => format!("DELETE FROM {t} WHERE id IN ({select_ready}) RETURNING {cols}").into(),
            Backend::MySql => claim_select.clone(),
        };
        let dead_cols = "id, group_name, payload, attempts, created_at, last_error";
        let sql = TableSql {
            backend,
            table: table.clone(),
            create,
            claim: claim.into(),
            claim_select,
            claim_locked,
            ack: format!("DELETE FROM {t} WHERE id = {} AND lease = {}", p(1), p(2)).into(),
            retry: format!(
                "UPDATE {t} SET visible_at = {}, lease = NULL, lease_until = NULL, last_error = {} WHERE id = {} AND lease = {}",
                later(backend, &p(1)),
                p(2),
                p(3),
                p(4)
            )
            .into(),
            release: format!(
                "UPDATE {t} SET lease = NULL, lease_until = NULL, attempts = attempts - 1 \
                 WHERE id = {} AND lease = {}",
                p(1),
                p(2)
            )
            .into(),
            extend: format!(
                "UPDATE {t} SET lease_until = {} WHERE id = {} AND lease = {}",
                later(backend, &p(1)),
                p(2),
                p(3)
            )
            .into(),
            dead_insert: format!(
                "INSERT INTO {dead} ({dead_cols}) SELECT id, group_name, payload, attempts, created_at, {} \
                 FROM {t} WHERE id = {} AND lease = {}",
                p(1),
                p(2),
                p(3)
            )
            .into(),
            quoted: t,
            dead,
        };
        Ok(sql)
    }

    /// `INSERT` of `rows` messages. Binds per row: group, payload, delay µs.
    pub fn insert(&self, rows: usize) -> String {
        let mut sql = format!("INSERT INTO {} (group_name, payload, visible_at) VALUES ", self.quoted);
        for i in 0..rows {
            if i > 0 {
                sql.push_str(", ");
            }
            match self.backend {
                Backend::Postgres => {
                    let n = i * 3;
                    sql.push_str(&format!(
                        "(${}, ${}, {})",
                        n + 1,
                        n + 2,
                        later(self.backend, &format!("${}", n + 3))
                    ));
                }
                _ => sql.push_str(&format!("(?, ?, {})", later(self.backend, "?"))),
            }
        }
        sql
    }

    /// MySQL: marks the rows a `claim_select` locked. Binds: lease µs, token, then the ids.
    pub fn claim_mark(&self, ids: usize) -> String {
        format!(
            "UPDATE {} SET lease_until = {}, lease = ?, attempts = attempts + 1 WHERE id IN ({})",
            self.quoted,
            later(self.backend, "?"),
            placeholders(self.backend, 3, ids)
        )
    }

    /// Deletes acknowledged rows, each under its own lease. Binds: the ids, then (id, token) pairs.
    pub fn ack_pairs(&self, pairs: usize) -> String {
        // `id IN (...)` finds the rows by index everywhere; a row-value `(id, lease) IN`
        // alone is a full table scan on SQLite at any length and on MariaDB at length one.
        let pairs_list: Vec<String> = (0..pairs)
            .map(|i| match self.backend {
                Backend::Postgres => format!("(${}, ${})", pairs + 2 * i + 1, pairs + 2 * i + 2),
                _ => "(?, ?)".to_owned(),
            })
            .collect();
        format!(
            "DELETE FROM {} WHERE id IN ({}) AND (id, lease) IN ({})",
            self.quoted,
            placeholders(self.backend, 1, pairs),
            pairs_list.join(", ")
        )
    }

    /// Deletes rows the caller's transaction holds locked. Binds: the ids.
    pub fn delete_locked(&self, ids: usize) -> String {
        format!("DELETE FROM {} WHERE id IN ({})", self.quoted, placeholders(self.backend, 1, ids))
    }

    /// After a failed transactional handler, in its transaction: puts `rows` rows a claim
    /// took back, their attempt counted, in one statement (one "now" for all). Binds per
    /// row: id, group, payload, attempts, delay µs, created_at µs, error.
    pub fn restore(&self, rows: usize) -> String {
        let b = self.backend;
        let values = self.values(rows, 7, |p| {
            let later = later(b, &p(5));
            let created = from_micros(b, &p(6));
            format!("({}, {}, {}, {}, {later}, {created}, {})", p(1), p(2), p(3), p(4), p(7))
        });
        format!(
            "INSERT INTO {} (id, group_name, payload, attempts, visible_at, created_at, last_error) VALUES {values}",
            self.quoted
        )
    }

    /// Dead-letters `rows` rows a transactional claim took. Binds per row: id, group,
    /// payload, attempts, created_at µs, error.
    pub fn dead_restore(&self, rows: usize) -> String {
        let b = self.backend;
        let values = self.values(rows, 6, |p| {
            let created = from_micros(b, &p(5));
            format!("({}, {}, {}, {}, {created}, {})", p(1), p(2), p(3), p(4), p(6))
        });
        format!(
            "INSERT INTO {} (id, group_name, payload, attempts, created_at, last_error) VALUES {values}",
            self.dead
        )
    }

    /// `rows` comma-separated tuples of `per` binds each; `tuple` writes one, given the
    /// placeholder of its k-th bind (from 1).
    fn values(&self, rows: usize, per: usize, tuple: impl Fn(&dyn Fn(usize) -> String) -> String) -> String {
        let mut out = Vec::with_capacity(rows);
        for row in 0..rows {
            let p = |k: usize| match self.backend {
                Backend::Postgres => format!("${}", row * per + k),
                _ => "?".to_owned(),
            };
            out.push(tuple(&p));
        }
        out.join(", ")
    }

    /// Deletes acknowledged rows of one claim. Binds: token, then the ids.
    pub fn ack_many(&self, ids: usize) -> String {
        let token = match self.backend {
            Backend::Postgres => "$1",
            _ => "?",
        };
        format!(
            "DELETE FROM {} WHERE lease = {token} AND id IN ({})",
            self.quoted,
            placeholders(self.backend, 2, ids)
        )
    }
}

/// `n` placeholders, numbered from `first` on PostgreSQL.
fn placeholders(backend: Backend, first: usize, n: usize) -> String {
    let mut out = String::with_capacity(n * 4);
    for i in 0..n {
        if i > 0 {
            out.push_str(", ");
        }
        match backend {
            Backend::Postgres => out.push_str(&format!("${}", first + i)),
            _ => out.push('?'),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(name: &str) -> QueueTable {
        name.parse().unwrap()
    }

    #[test]
    fn names_are_validated() {
        for ok in ["jobs", "app.jobs", "_a1", &"x".repeat(57)] {
            assert!(ok.parse::<QueueTable>().is_ok(), "{ok}");
        }
        for bad in [
            "",
            "a.b.c",
            "1jobs",
            "jobs;",
            "jo bs",
            "jo`bs",
            "jo\"bs",
            ".jobs",
            "jobs.",
            "é",
            &"x".repeat(58),
        ] {
            assert!(matches!(bad.parse::<QueueTable>(), Err(Error::InvalidName { .. })), "{bad}");
        }
    }

    #[test]
    fn quoting_per_backend() {
        assert_eq!(t("app.jobs").quote(Backend::Postgres, ""), "\"app\".\"jobs\"");
        assert_eq!(t("app.jobs").quote(Backend::Postgres, "_dead"), "\"app\".\"jobs_dead\"");
        assert_eq!(t("jobs").quote(Backend::MySql, ""), "`jobs`");
        assert!(TableSql::new(Backend::Sqlite, &t("app.jobs")).is_err());
        assert!(TableSql::new(Backend::Sqlite, &t("jobs")).is_ok());
    }

    #[test]
    fn groups_are_checked() {
        assert!(check_group("").is_ok());
        assert!(check_group("tenant-42").is_ok());
        assert!(check_group(&"g".repeat(255)).is_ok());
        assert!(check_group(&"g".repeat(256)).is_err());
        assert!(check_group("a ").is_err());
    }

    #[test]
    fn placeholder_numbering() {
        let pg = TableSql::new(Backend::Postgres, &t("jobs")).unwrap();
        assert_eq!(pg.ack_many(3), "DELETE FROM \"jobs\" WHERE lease = $1 AND id IN ($2, $3, $4)");
        assert!(pg.insert(2).contains("($4, $5, now() + $6 * interval '1 microsecond')"));
        let my = TableSql::new(Backend::MySql, &t("jobs")).unwrap();
        assert_eq!(my.claim_mark(2).matches('?').count(), 4);
        assert_eq!(pg.delete_locked(2), "DELETE FROM \"jobs\" WHERE id IN ($1, $2)");
    }

    #[test]
    fn transactional_claims_delete_what_they_lock() {
        let pg = TableSql::new(Backend::Postgres, &t("jobs")).unwrap();
        assert!(
            pg.claim_locked.starts_with("DELETE FROM \"jobs\" WHERE id = ANY(ARRAY(SELECT id FROM \"jobs\"")
        );
        assert!(pg.claim_locked.contains("LIMIT $2 FOR UPDATE SKIP LOCKED)) RETURNING id, group_name"));
        let lite = TableSql::new(Backend::Sqlite, &t("jobs")).unwrap();
        assert!(lite.claim_locked.starts_with("DELETE FROM `jobs` WHERE id IN (SELECT id FROM `jobs`"));
        assert!(lite.claim_locked.contains("LIMIT ?) RETURNING id, group_name"));
        let my = TableSql::new(Backend::MySql, &t("jobs")).unwrap();
        assert!(my.claim_locked.starts_with("SELECT CAST(id AS SIGNED)"));
        assert!(my.claim_locked.ends_with("LIMIT ? FOR UPDATE SKIP LOCKED"));
        // A failed handler's rows go back with every column they had, bound.
        assert_eq!(
            pg.restore(2),
            "INSERT INTO \"jobs\" (id, group_name, payload, attempts, visible_at, created_at, last_error) VALUES \
             ($1, $2, $3, $4, now() + $5 * interval '1 microsecond', (TIMESTAMPTZ 'epoch' + $6 * interval '1 microsecond'), $7), \
             ($8, $9, $10, $11, now() + $12 * interval '1 microsecond', (TIMESTAMPTZ 'epoch' + $13 * interval '1 microsecond'), $14)"
        );
        assert_eq!(my.dead_restore(3).matches('?').count(), 18);
        assert!(
            my.dead_restore(1)
                .starts_with("INSERT INTO `jobs_dead` (id, group_name, payload, attempts, created_at")
        );
        assert_eq!(lite.restore(1).matches('?').count(), 7);
        assert_eq!(my.insert(3).matches('?').count(), 9);
    }

    #[test]
    fn acknowledgements_of_several_claims() {
        let pg = TableSql::new(Backend::Postgres, &t("jobs")).unwrap();
        assert_eq!(
            pg.ack_pairs(2),
            "DELETE FROM \"jobs\" WHERE id IN ($1, $2) AND (id, lease) IN (($3, $4), ($5, $6))"
        );
        let my = TableSql::new(Backend::MySql, &t("jobs")).unwrap();
        assert_eq!(my.ack_pairs(1), "DELETE FROM `jobs` WHERE id IN (?) AND (id, lease) IN ((?, ?))");
    }

    #[test]
    fn mysql_claims_walk_the_clustered_key() {
        let my = TableSql::new(Backend::MySql, &t("jobs")).unwrap();
        assert!(my.create[0].contains("PRIMARY KEY (`group_name`, `visible_at`, `id`)"));
        assert!(my.create[0].contains("UNIQUE KEY `jobs_id` (`id`)"));
        assert!(my.claim_select.contains("ORDER BY visible_at, id LIMIT ? FOR UPDATE SKIP LOCKED"));
    }
}
