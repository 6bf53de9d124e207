//! The type of one queue table's statements, [`TableSql`], apart from how they are built
//! (in `table`), so that the dialect traits whose methods take it need nothing else.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use super::{CountsSql, HistorySql, LimitSql, PauseSql, RotationSql, ScheduleSql, Schema};
use crate::names::QueueTable;

/// The statements of one queue table.
#[derive(Debug)]
pub struct TableSql<DB: Schema> {
    pub table: QueueTable,
    /// The table, quoted.
    pub quoted: String,
    /// Its dead-letter table, quoted.
    pub dead: String,
    pub create: Vec<String>,
    /// The lease claim (see [`Claiming::claim_sql`](super::Claiming::claim_sql)).
    pub claim: Arc<str>,
    /// The transactional claim (see [`Claiming::claim_locked_sql`](super::Claiming::claim_locked_sql)).
    pub claim_locked: Arc<str>,
    /// Binds: id, token.
    pub ack: Arc<str>,
    /// Binds: delay µs, error, id, token.
    pub retry: Arc<str>,
    /// Binds: id, token. Gives a claimed, unstarted message back without counting it.
    pub release: Arc<str>,
    /// Binds: lease µs, id, token. Renews a lease that still runs, by the database's
    /// clock: one that ran out is not renewed, even where nobody claimed the message since
    /// (a limit counts only unexpired leases, so a renewed one would run uncounted).
    pub extend: Arc<str>,
    /// Binds: delay µs, id, token. Gives a leased message back to run after the delay,
    /// its attempt not counted, its last error as it was: a snooze.
    pub snooze: Arc<str>,
    /// Binds: delay µs, error, id, token. Gives a leased message back to run again after
    /// the delay, its attempt not counted: where dead-lettering it failed.
    pub release_later: Arc<str>,
    /// Binds: error, id, token: copies the row into the dead-letter table.
    pub dead_insert: Arc<str>,
    /// Binds: group, group. Messages in the table, then in the dead-letter table.
    pub depth: Arc<str>,
    /// The pause table's statements.
    pub pause: PauseSql<DB>,
    /// The limits table's and the start log's statements.
    pub limits: LimitSql<DB>,
    /// The schedule and tick tables' statements.
    pub schedule: ScheduleSql<DB>,
    /// The kept history's statements.
    pub history: HistorySql<DB>,
    /// The counts table's statements.
    pub counts: CountsSql<DB>,
    /// One message with a deduplication id, refused while a message with the id is in the
    /// queue (see [`insert_dedup_sql`](Self::insert_dedup_sql)).
    pub insert_dedup: Arc<str>,
    /// One message stored already leased to a runner of this process (a hand-off), and
    /// only if neither a pause nor a limit holds its group: what a claim checks besides
    /// readiness. Binds: group, payload, priority, headers, token, lease µs, group, group.
    /// Returns its id and `created_at` µs where the database returns inserted rows
    /// ([`Publishing::RETURNS_INSERTED`](super::Publishing::RETURNS_INSERTED)).
    pub hand_off: Arc<str>,
    /// What the dialect keeps for this queue ([`Schema::TableState`]).
    pub state: DB::TableState,
    /// The ring of partitions, where the queue table is one
    /// ([`Rotating::rotation`](super::Rotating::rotation)).
    pub rotation: Option<RotationSql>,
    /// Binds: group. Where claims of the group start
    /// ([`Rotating::floor_sql`](super::Rotating::floor_sql)).
    pub floor: Option<Arc<str>>,
    /// A cheaper step of the floor between two whole ones
    /// ([`Rotating::floor_step_sql`](super::Rotating::floor_step_sql)).
    pub floor_step: Option<Arc<str>>,
    /// The earliest lease end of the rows a step moved the floor over
    /// ([`Rotating::floor_leases_sql`](super::Rotating::floor_leases_sql)).
    pub floor_leases: Option<Arc<str>>,
    /// The database's log checkpoint, where a held reader stops it
    /// ([`Rotating::checkpoint_sql`](super::Rotating::checkpoint_sql)).
    pub checkpoint: Option<Arc<str>>,
    /// The INSERTs publishes used, by form and rows (see [`insert_sql`](Self::insert_sql)).
    pub(super) inserts: Mutex<HashMap<(InsertForm, usize), Arc<str>>>,
    pub(super) db: PhantomData<fn() -> DB>,
}

/// Which columns an INSERT of messages binds; the others take their defaults. Each
/// form binds a superset of the one before: a statement takes its rows' greatest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum InsertForm {
    /// [`TableSql::insert_payload`]: the payload.
    Payload,
    /// [`TableSql::insert_plain`]: group, payload, delay.
    Plain,
    /// [`TableSql::insert`]: every column a message sets.
    Full,
}
