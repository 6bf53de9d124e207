//! The positions table of durable listeners, `<notify table>_positions`: one row per
//! `(channel, name)`, holding the stored [`Position`](notify_table::Position) (its text
//! form), the lowest id it may still deliver (`first_unread`, what the cleanup keeps),
//! the owner's token, its last check-in (microseconds since the Unix epoch, server
//! time) and its lease (µs; 0 in a row an older rowbus wrote). Deploying the notify table
//! creates it, and adds the lease to a table made before.

use std::marker::PhantomData;
use std::sync::Arc;

use notify_table::{MAX_TABLE_LEN, Value};

use super::Naming;
use crate::error::Error;

/// The suffix of the positions table: `rowbus_notify_positions`.
pub(crate) const POSITIONS_SUFFIX: &str = "_positions";

/// The positions table's statements for one notify table.
#[derive(Debug)]
pub(crate) struct PositionsSql<DB> {
    /// The `CREATE TABLE IF NOT EXISTS`.
    pub create: Arc<str>,
    /// Binds: channel, name. Adds the row, with no owner and nothing stored, if missing.
    pub insert: Arc<str>,
    /// Binds: token, lease µs, channel, name, token, lease µs. Takes the row for `token`
    /// (storing its lease) when it has no owner, is `token`'s already, or its owner's
    /// check-in is older than the owner's lease (the caller's, where none is stored).
    pub take: Arc<str>,
    /// Binds: channel, name. The stored position (`''` for none), then the owner, the µs
    /// since its check-in and its lease (µs, 0 when unknown).
    pub read: Arc<str>,
    /// Binds: position, first unread, channel, name, token. Stores a position and checks in.
    pub store: Arc<str>,
    /// Binds: channel, name, token. Checks in.
    pub check_in: Arc<str>,
    /// Binds: channel, name, token. Gives the name up.
    pub release: Arc<str>,
    /// Binds: channel, name, lease µs. Deletes the name's row unless a process holds it
    /// and checked in within its lease (the bound one, where none is stored).
    pub forget: Arc<str>,
    /// Binds: live µs. Per channel, the lowest `first_unread` of the positions checked in
    /// within it: what the cleanup keeps of the channel.
    pub held: Arc<str>,
    /// No binds: every row as channel, name, position, then first unread, owner, µs since
    /// its check-in, the owner's lease (µs, 0 when unknown).
    pub list: Arc<str>,
    /// `list` for a table made before the lease was stored: 0 for it.
    pub list_without_lease: Arc<str>,
    /// Whether the table has the lease column (fails when it has not).
    pub probe_lease: Arc<str>,
    /// Adds the lease column to a table made before it was stored.
    pub add_lease: Arc<str>,
    db: PhantomData<fn() -> DB>,
}

impl<DB: Positions> PositionsSql<DB> {
    /// The statements for the positions table of notify table `table` (a validated
    /// identifier); refuses a name too long for the database with the suffix.
    pub fn new(table: &str) -> Result<Self, Error> {
        let name = format!("{table}{POSITIONS_SUFFIX}");
        if name.len() > MAX_TABLE_LEN {
            return Err(Error::PositionsTableName {
                table: table.to_owned(),
                max: MAX_TABLE_LEN - POSITIONS_SUFFIX.len(),
            });
        }
        let t = DB::quote(&name);
        let now = DB::micros_of(DB::NOW);
        let p = |n| DB::param(n);
        let key = format!("channel = {} AND name = {}", p(1), p(2));
        // The owner's lease; the bound one where an older rowbus stored none.
        let expired = |param: usize| {
            format!("checked_in < {now} - CASE WHEN lease > 0 THEN lease ELSE {} END", p(param))
        };
        let list = |lease: &str| {
            format!(
                "SELECT {}, {}, position, first_unread, owner, {now} - checked_in, {lease} FROM {t} ORDER BY channel, name",
                DB::text_of("channel"),
                DB::text_of("name")
            )
        };
        Ok(PositionsSql {
            create: DB::create_positions(&t).into(),
            insert: DB::insert_ignore(
                &t,
                "channel, name, position, first_unread, owner, checked_in",
                &format!("{}, {}, '', 0, 0, 0", p(1), p(2)),
            )
            .into(),
            take: format!(
                "UPDATE {t} SET owner = {}, checked_in = {now}, lease = {} WHERE channel = {} AND name = {} \
                 AND (owner = 0 OR owner = {} OR {})",
                p(1),
                p(2),
                p(3),
                p(4),
                p(5),
                expired(6)
            )
            .into(),
            read: format!("SELECT position, owner, {now} - checked_in, lease FROM {t} WHERE {key}").into(),
            store: format!(
                "UPDATE {t} SET position = {}, first_unread = {}, checked_in = {now} \
                 WHERE channel = {} AND name = {} AND owner = {}",
                p(1),
                p(2),
                p(3),
                p(4),
                p(5)
            )
            .into(),
            check_in: format!("UPDATE {t} SET checked_in = {now} WHERE {key} AND owner = {}", p(3)).into(),
            release: format!("UPDATE {t} SET owner = 0 WHERE {key} AND owner = {}", p(3)).into(),
            forget: format!("DELETE FROM {t} WHERE {key} AND (owner = 0 OR {})", expired(3)).into(),
            held: format!(
                "SELECT {}, MIN(first_unread) FROM {t} WHERE checked_in >= {now} - {} GROUP BY channel",
                DB::text_of("channel"),
                p(1)
            )
            .into(),
            list: list("lease").into(),
            list_without_lease: list("0").into(),
            probe_lease: format!("SELECT lease FROM {t} WHERE 1 = 0").into(),
            add_lease: DB::add_positions_lease(&t).into(),
            db: PhantomData,
        })
    }
}

/// A text bind.
pub(crate) fn text(s: &str) -> Value {
    Value::Text(Arc::from(s))
}

/// A duration as a µs bind.
pub(crate) fn micros(d: std::time::Duration) -> Value {
    Value::Int(i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// Durable listeners: their positions table.
pub trait Positions: Naming {
    /// The positions table of durable listeners (see [`PositionsSql`]), quoted as `t`, if
    /// missing: `channel` and `name` as the notify table holds a channel (the key),
    /// `position` (text), `first_unread`, `owner`, `checked_in`, `lease` (BIGINT, default 0).
    fn create_positions(t: &str) -> String;

    /// Adds the `lease` column to positions table `t` made before it was stored.
    fn add_positions_lease(t: &str) -> String {
        format!("ALTER TABLE {t} ADD COLUMN lease BIGINT NOT NULL DEFAULT 0")
    }
}
