//! The positions table of durable listeners, `<notify table>_positions`: one row per
//! `(channel, name)`, holding the stored [`Position`](notify_table::Position) (its text
//! form), the lowest id it may still deliver (`first_unread`, what the cleanup keeps),
//! the owner's token and its last check-in (microseconds since the Unix epoch, server
//! time). Deploying the notify table creates it.

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
    /// Binds: token, channel, name, token, lease µs. Takes the row for `token` when it
    /// has no owner, is `token`'s already, or its owner's check-in is older than the lease.
    pub take: Arc<str>,
    /// Binds: channel, name. The stored position (`''` for none), then the owner and the
    /// µs since its check-in.
    pub read: Arc<str>,
    /// Binds: position, first unread, channel, name, token. Stores a position and checks in.
    pub store: Arc<str>,
    /// Binds: channel, name, token. Checks in.
    pub check_in: Arc<str>,
    /// Binds: channel, name, token. Gives the name up.
    pub release: Arc<str>,
    /// Binds: channel, name, lease µs. Deletes the name's row unless a process holds it
    /// and checked in within the lease.
    pub forget: Arc<str>,
    /// Binds: live µs. Per channel, the lowest `first_unread` of the positions checked in
    /// within it: what the cleanup keeps of the channel.
    pub held: Arc<str>,
    /// No binds: every row as channel, name, position, then first unread, owner, µs since
    /// its check-in.
    pub list: Arc<str>,
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
        Ok(PositionsSql {
            create: DB::create_positions(&t).into(),
            insert: DB::insert_ignore(&t, "channel, name, position, first_unread, owner, checked_in", &format!("{}, {}, '', 0, 0, 0", p(1), p(2)))
                .into(),
            take: format!(
                "UPDATE {t} SET owner = {}, checked_in = {now} WHERE channel = {} AND name = {} \
                 AND (owner = 0 OR owner = {} OR checked_in < {now} - {})",
                p(1),
                p(2),
                p(3),
                p(4),
                p(5)
            )
            .into(),
            read: format!("SELECT position, owner, {now} - checked_in FROM {t} WHERE {key}").into(),
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
            forget: format!("DELETE FROM {t} WHERE {key} AND (owner = 0 OR checked_in < {now} - {})", p(3)).into(),
            held: format!(
                "SELECT {}, MIN(first_unread) FROM {t} WHERE checked_in >= {now} - {} GROUP BY channel",
                DB::text_of("channel"),
                p(1)
            )
            .into(),
            list: format!(
                "SELECT {}, {}, position, first_unread, owner, {now} - checked_in FROM {t} ORDER BY channel, name",
                DB::text_of("channel"),
                DB::text_of("name")
            )
            .into(),
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
    /// `position` (text), `first_unread`, `owner`, `checked_in` (BIGINT).
    fn create_positions(t: &str) -> String;
}
