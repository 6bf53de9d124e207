//! Naming and quoting: how a database writes an identifier, a placeholder, a time and the
//! few statement forms (insert-or-ignore, upsert) whose shape differs between databases.
//! Every other dialect trait builds its statements from these.

use crate::driver::sealed::Driver;
use crate::error::Error;
use crate::names::QueueTable;

/// How one database writes names, values and the statement forms the others build on.
/// Sealed: implemented for [`sqlx::Postgres`], [`sqlx::MySql`] and [`sqlx::Sqlite`].
pub trait Naming: Driver + Sized {
    /// What a `SELECT` ends with to lock the rows it returns until its transaction ends
    /// (`""` where [`WRITE_BEGIN`](Self::WRITE_BEGIN) already holds every row).
    const FOR_UPDATE: &'static str = " FOR UPDATE";

    /// One identifier part, quoted. Only for validated plain identifiers.
    fn quote(part: &str) -> String;

    /// The placeholder of the `n`-th bind (from 1).
    fn param(n: usize) -> String;

    /// "Now" as the queue table stores times.
    const NOW: &'static str;

    /// "Now plus the microseconds in placeholder `p`".
    fn later(p: &str) -> String;

    /// The stored time `p` microseconds after the Unix epoch.
    fn from_micros(p: &str) -> String;

    /// The stored time `column` as microseconds since the Unix epoch, a BIGINT.
    fn micros_of(column: &str) -> String;

    /// `COUNT(*)` as a signed 64-bit integer.
    const COUNT: &'static str = "COUNT(*)";

    /// Refuses a name this database cannot hold.
    fn check_table(_table: &QueueTable) -> Result<(), Error> {
        Ok(())
    }

    /// `expr` (a text column, or a binary one holding UTF-8) as text, as the driver
    /// decodes a string.
    fn text_of(expr: &str) -> String {
        expr.to_owned()
    }

    /// `expr` (an integer column) as a signed 64-bit integer, as the driver decodes one.
    fn bigint(expr: &str) -> String {
        format!("CAST({expr} AS BIGINT)")
    }

    /// `INSERT INTO table (columns) VALUES (values)` that does nothing (and counts no
    /// row) where the key is taken.
    fn insert_ignore(table: &str, columns: &str, values: &str) -> String {
        format!("INSERT INTO {table} ({columns}) VALUES ({values}) ON CONFLICT DO NOTHING")
    }

    /// `INSERT INTO table (columns) select` that skips (and counts no row for) a row
    /// whose key is taken. `select` has a `WHERE` (SQLite needs one before `ON CONFLICT`).
    fn insert_select_ignore(table: &str, columns: &str, select: &str) -> String {
        format!("INSERT INTO {table} ({columns}) {select} ON CONFLICT DO NOTHING")
    }

    /// `INSERT INTO table (columns) VALUES (values)` that, where `key` is taken, sets
    /// `updates` to the values given instead.
    fn upsert(table: &str, columns: &str, values: &str, key: &str, updates: &[&str]) -> String {
        let set: Vec<String> = updates.iter().map(|c| format!("{c} = excluded.{c}")).collect();
        format!(
            "INSERT INTO {table} ({columns}) VALUES ({values}) ON CONFLICT ({key}) DO UPDATE SET {}",
            set.join(", ")
        )
    }

    /// What follows `FROM` in a statement on the rows of the queue table `quoted` that
    /// `which` names by id: the table and its condition. Its columns are read unqualified
    /// (`id`, `lease`, ...). By default `quoted WHERE` [`ById::filter`].
    fn by_id(quoted: &str, which: ById) -> String {
        format!("{quoted} WHERE {}", which.filter::<Self>())
    }

    /// Deletes the rows of [`by_id`](Self::by_id). Binds: as `which` says.
    fn delete_by_id(quoted: &str, which: ById) -> String {
        format!("DELETE FROM {}", Self::by_id(quoted, which))
    }

    /// `INSERT INTO table (columns) VALUES (values)` that, where `key` is taken, adds the
    /// value given for `column` to the stored one: an increment, one statement.
    fn upsert_add(table: &str, columns: &str, values: &str, key: &str, column: &str) -> String {
        // The alias: PostgreSQL finds an unqualified column ambiguous beside `excluded`.
        format!(
            "INSERT INTO {table} AS c ({columns}) VALUES ({values}) ON CONFLICT ({key}) \
             DO UPDATE SET {column} = c.{column} + excluded.{column}"
        )
    }
}

/// The name suffix of a queue table's claim index: (group, priority, visible_at, id)
/// (MySQL/MariaDB's claim order is the primary key instead).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) const READY: &str = "_ready";
/// The name suffix of the claim index of a queue table made before priorities, which a
/// deploy replaces with [`READY`].
pub(crate) const OLD_CLAIM: &str = "_claim";
/// The name suffix of a queue table's ordering-key index: (key, id).
pub(crate) const KEYS: &str = "_key";
/// The name suffix of a queue table's unique index on deduplication ids.
pub(crate) const DEDUP: &str = "_dedup";

/// The suffix of a queue's limits table: `jobs_limits`. Seven characters: the longest
/// queue name (57) with it is 64, past PostgreSQL's 63, so the queue name check allows
/// for it (see `names`).
pub(crate) const LIMITS_SUFFIX: &str = "_limits";

/// The suffix of a queue's start log: `jobs_starts`.
pub(crate) const STARTS_SUFFIX: &str = "_starts";

/// How long a deploy waits for another deploy's lock before it gives up: a deploy holds
/// it for a few statements of DDL, so a longer wait means one is stuck. (SQLite's deploys
/// wait for the write lock, as long as its busy timeout.)
#[cfg(any(feature = "postgres", feature = "mysql"))]
pub(crate) const DEPLOY_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// `n` placeholders, numbered from `first`.
pub(crate) fn placeholders<DB: Naming>(first: usize, n: usize) -> String {
    (first..first + n).map(DB::param).collect::<Vec<_>>().join(", ")
}

/// A queue table's name with `suffix` (`""`, or `_dead` for its dead-letter table), quoted.
pub(crate) fn quoted<DB: Naming>(table: &QueueTable, suffix: &str) -> String {
    let name = DB::quote(&format!("{}{suffix}", table.name()));
    match table.schema() {
        Some(schema) => format!("{}.{name}", DB::quote(schema)),
        None => name,
    }
}

/// Rows of a queue table named by id, for [`Naming::by_id`], and their binds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ById {
    /// This many rows, whatever their lease. Binds: the ids.
    Ids(usize),
    /// This many rows of one claim, under its lease. Binds: the token, then the ids.
    Claim(usize),
    /// This many rows, each under its own lease. Binds: the ids, then (id, token) pairs.
    Pairs(usize),
}

impl ById {
    /// The condition on the queue table's columns, unqualified.
    pub fn filter<DB: Naming>(self) -> String {
        match self {
            ById::Ids(ids) => format!("id IN ({})", placeholders::<DB>(1, ids)),
            ById::Claim(ids) => {
                format!("lease = {} AND id IN ({})", DB::param(1), placeholders::<DB>(2, ids))
            }
            ById::Pairs(pairs) => pairs_filter::<DB>(pairs),
        }
    }
}

/// The rows of `pairs` `(id, token)` pairs. Binds: the ids, then the pairs.
pub(crate) fn pairs_filter<DB: Naming>(pairs: usize) -> String {
    pairs_filter_from::<DB>(1, pairs)
}

/// [`pairs_filter`] whose first bind is the `first`-th of its statement.
pub(crate) fn pairs_filter_from<DB: Naming>(first: usize, pairs: usize) -> String {
    // `id IN (...)` finds the rows by index everywhere; a row-value `(id, lease) IN`
    // alone is a full table scan on SQLite at any length and on MariaDB at length one.
    let tokens = first + pairs;
    let pairs_list: Vec<String> = (0..pairs)
        .map(|i| format!("({}, {})", DB::param(tokens + 2 * i), DB::param(tokens + 2 * i + 1)))
        .collect();
    format!("id IN ({}) AND (id, lease) IN ({})", placeholders::<DB>(first, pairs), pairs_list.join(", "))
}
