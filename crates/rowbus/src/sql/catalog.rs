//! The catalog and statistics: finding queue tables and their columns, and the figures
//! `rowbus stats` and the dashboard show.

use super::Naming;
use crate::names::QueueTable;

/// How a database's catalog is read and a queue's figures are counted.
pub trait Catalog: Naming {
    /// Which of [`QUEUE_COLUMNS`] table `name` (in `schema`, or where an unqualified name
    /// resolves) has, and whether it exists: a statement returning one row, the names
    /// present joined by commas (`''` for none) and an integer, 0 when there is no table.
    fn find_table_sql(schema: Option<&str>, name: &str) -> (String, Vec<String>);

    /// Whether schema `schema` exists (on MySQL/MariaDB: database): a statement binding
    /// the name and returning one row, one integer, 0 when there is none.
    fn schema_exists_sql() -> &'static str;

    /// Whether a queue's qualifier names a database rather than a schema (MySQL/MariaDB):
    /// a deploy never creates one, even when asked to create a missing schema.
    const QUALIFIER_IS_DATABASE: bool = false;

    /// Whether [`find_table_sql`](Self::find_table_sql) leaves out tables the user has no
    /// privilege on (MySQL/MariaDB's `information_schema` does), so that a table it does
    /// not find may exist all the same, unreadable.
    const CATALOG_HIDES_UNGRANTED: bool = false;

    /// The queue tables where unqualified names resolve: one text column, the name as
    /// a statement would write it.
    fn queue_tables_sql() -> String;

    /// Per group of a queue table (quoted as `t`): group, then depth, ready, in flight
    /// and the oldest message's age in µs.
    fn group_stats_sql(t: &str) -> String {
        let now = Self::NOW;
        let is_ready = format!("visible_at <= {now} AND (lease_until IS NULL OR lease_until <= {now})");
        let (ready, in_flight) = Self::states(&is_ready, &format!("lease_until > {now}"));
        format!(
            "SELECT group_name, {count}, {ready}, {in_flight}, {age}, {ready_age} FROM {t} \
             GROUP BY group_name ORDER BY group_name",
            count = Self::COUNT,
            age = Self::age_of("MIN(created_at)"),
            ready_age = Self::age_of(&format!("MIN(CASE WHEN {is_ready} THEN created_at END)")),
        )
    }

    /// Counts of the rows matching `ready` and `in_flight`, as signed integers.
    fn states(ready: &str, in_flight: &str) -> (String, String);

    /// `now` minus the stored time `expr`, in µs.
    fn age_of(expr: &str) -> String;

    /// The notify table's row count and its oldest row's age in µs.
    fn notify_stats_sql(t: &str) -> String {
        format!("SELECT {}, {} FROM {t}", Self::COUNT, Self::notify_age("MIN(created_at)"))
    }

    /// `now` minus the notify table's `created_at` expression `expr`, in µs.
    fn notify_age(expr: &str) -> String {
        Self::age_of(expr)
    }

    /// How many ids queue table `table` has handed out: the last value of the sequence its
    /// ids come from, 0 before the first. A statement returning it as one integer, in one
    /// row when the table exists and none when it does not, and its binds (text).
    fn published_total_sql(table: &QueueTable) -> (String, Vec<String>);

    /// A statement run before [`published_total_sql`](Self::published_total_sql) on the
    /// same connection, its failure ignored: what makes the figure current where the server
    /// serves it from a cache.
    const PUBLISHED_TOTAL_FRESH: Option<&'static str> = None;
}
