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
}
