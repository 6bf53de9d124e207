//! One queue table's statements on one database ([`TableSql`], defined in `statements`),
//! built once per table from the dialect traits. Binds are documented with each statement.

use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use super::{
    ById, Claiming, HistorySql, InsertForm, Keeping, LimitSql, Limiting, PauseSql, Pausing, Publishing,
    ScheduleSql, Scheduling, Schema, TableSql, placeholders, quoted,
};
use super::{Counting, CountsSql, Rotating};
use crate::error::Error;
use crate::names::QueueTable;

/// The columns every queue table has (the broker's claim needs them all): how the
/// catalog recognises a queue table.
pub(crate) const QUEUE_COLUMNS: [&str; 7] =
    ["id", "group_name", "payload", "attempts", "visible_at", "lease", "lease_until"];

/// The columns a queue table gained after its first version (priorities, ordering keys,
/// deduplication ids, headers): a deploy adds those an older table lacks.
pub(crate) const FEATURE_COLUMNS: [&str; 4] = ["priority", "msg_key", "dedup_id", "headers"];

/// The same for the dead-letter table (a dead letter holds no deduplication id: once a
/// message is dead-lettered its id publishes again).
pub(crate) const DEAD_FEATURE_COLUMNS: [&str; 3] = ["priority", "msg_key", "headers"];

/// The columns of a queue's limits table that a deploy adds to one made before them.
pub(crate) const LIMITS_FEATURE_COLUMNS: [&str; 2] = ["rate_burst", "rate_next_us"];

impl<DB: Schema + Publishing + Claiming + Pausing + Scheduling + Keeping + Counting + Limiting + Rotating>
    TableSql<DB>
{
    pub fn new(table: &QueueTable) -> Result<Self, Error> {
        DB::check_table(table)?;
        let t = quoted::<DB>(table, "");
        let dead = quoted::<DB>(table, "_dead");
        let p = DB::param;
        let dead_cols =
            "id, group_name, payload, attempts, created_at, priority, msg_key, headers, last_error";
        Ok(TableSql {
            table: table.clone(),
            create: [
                DB::create_queue(table),
                vec![DB::create_pause(table)],
                DB::create_schedules(table),
                DB::create_history(table),
                vec![DB::create_counts(table)],
                DB::create_limits(table),
            ]
            .concat(),
            claim: DB::claim_sql(table).into(),
            claim_locked: DB::claim_locked_sql(table).into(),
            ack: format!("DELETE FROM {t} WHERE id = {} AND lease = {}", p(1), p(2)).into(),
            retry: format!(
                "UPDATE {t} SET visible_at = {}, lease = NULL, lease_until = NULL, last_error = {} \
                 WHERE id = {} AND lease = {}",
                DB::later(&p(1)),
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
            release_later: format!(
                "UPDATE {t} SET visible_at = {}, lease = NULL, lease_until = NULL, attempts = attempts - 1, \
                 last_error = {} WHERE id = {} AND lease = {}",
                DB::later(&p(1)),
                p(2),
                p(3),
                p(4)
            )
            .into(),
            snooze: format!(
                "UPDATE {t} SET visible_at = {}, lease = NULL, lease_until = NULL, attempts = attempts - 1 \
                 WHERE id = {} AND lease = {}",
                DB::later(&p(1)),
                p(2),
                p(3)
            )
            .into(),
            extend: format!(
                "UPDATE {t} SET lease_until = {} WHERE id = {} AND lease = {} AND lease_until > {}",
                DB::later(&p(1)),
                p(2),
                p(3),
                DB::NOW
            )
            .into(),
            dead_insert: format!(
                "INSERT INTO {dead} ({dead_cols}) SELECT id, group_name, payload, attempts, created_at, \
                 priority, msg_key, headers, {} FROM {t} WHERE id = {} AND lease = {}",
                p(1),
                p(2),
                p(3)
            )
            .into(),
            depth: format!(
                "SELECT (SELECT {count} FROM {t} WHERE group_name = {}), \
                 (SELECT {count} FROM {dead} WHERE group_name = {})",
                p(1),
                p(2),
                count = DB::COUNT,
            )
            .into(),
            pause: PauseSql::new(table),
            limits: LimitSql::new(table),
            schedule: ScheduleSql::new(table),
            history: HistorySql::new(table),
            counts: CountsSql::new(table),
            insert_dedup: Self::insert_dedup_sql(&t).into(),
            hand_off: Self::hand_off_sql(table, &t).into(),
            state: DB::table_state(table),
            rotation: DB::rotation(table),
            floor: DB::floor_sql(table).map(Arc::from),
            floor_step: DB::floor_step_sql(table).map(Arc::from),
            floor_leases: DB::floor_leases_sql(table).map(Arc::from),
            checkpoint: DB::checkpoint_sql().map(Arc::from),
            inserts: Mutex::default(),
            quoted: t,
            dead,
            db: PhantomData,
        })
    }

    /// [`hand_off`](TableSql::hand_off) of the table `t` (quoted).
    fn hand_off_sql(table: &QueueTable, t: &str) -> String {
        let p = DB::param;
        let returning = match DB::RETURNS_INSERTED {
            true => format!(" RETURNING id, {}", DB::micros_of("created_at")),
            false => String::new(),
        };
        format!(
            "INSERT INTO {t} (group_name, payload, priority, headers, attempts, lease, lease_until) \
             SELECT {}, {}, {}, {}, 1, {}, {}{} WHERE {} AND {}{returning}",
            p(1),
            p(2),
            p(3),
            p(4),
            p(5),
            DB::later(&p(6)),
            DB::FROM_NOTHING,
            DB::not_paused(table, &p(7)),
            DB::not_limited(table, &p(8)),
        )
    }

    /// `INSERT` of `rows` messages. Binds per row: group, payload, delay µs, priority,
    /// key, headers (NULL for none).
    pub fn insert(&self, rows: usize) -> String {
        let values = self.values(rows, INSERT_BINDS, |p| {
            format!("({}, {}, {}, {}, {}, {})", p(1), p(2), DB::later(&p(3)), p(4), p(5), p(6))
        });
        format!(
            "INSERT INTO {} (group_name, payload, visible_at, priority, msg_key, headers) VALUES {values}",
            self.quoted
        )
    }

    /// `INSERT` of `rows` messages of the default priority, with no key and no headers:
    /// half the binds of [`insert`](Self::insert). Binds per row: group, payload, delay µs.
    pub fn insert_plain(&self, rows: usize) -> String {
        let values =
            self.values(rows, PLAIN_INSERT_BINDS, |p| format!("({}, {}, {})", p(1), p(2), DB::later(&p(3))));
        format!("INSERT INTO {} (group_name, payload, visible_at) VALUES {values}", self.quoted)
    }

    /// `INSERT` of `rows` messages with only a payload: the default group, no delay, the
    /// default priority, no key, no headers (the columns' defaults). Binds per row: payload.
    pub fn insert_payload(&self, rows: usize) -> String {
        let values = self.values(rows, 1, |p| format!("({})", p(1)));
        format!("INSERT INTO {} (payload) VALUES {values}", self.quoted)
    }

    /// The `INSERT` of `rows` messages in `form`, built once and kept: a publisher sends
    /// the same few sizes again and again.
    pub(crate) fn insert_sql(&self, form: InsertForm, rows: usize) -> Arc<str> {
        let mut kept = self.inserts.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(sql) = kept.get(&(form, rows)) {
            return sql.clone();
        }
        let sql: Arc<str> = match form {
            InsertForm::Payload => self.insert_payload(rows),
            InsertForm::Plain => self.insert_plain(rows),
            InsertForm::Full => self.insert(rows),
        }
        .into();
        // Sizes beyond a few come from publishers of changing batch sizes: start over.
        if kept.len() >= KEPT_INSERTS {
            kept.clear();
        }
        kept.insert((form, rows), sql.clone());
        sql
    }

    /// `INSERT` of one message with a deduplication id into table `t` that stores nothing
    /// (and counts no row) while a message with that id is in the table. Binds: those of
    /// [`insert`](Self::insert), then the id.
    fn insert_dedup_sql(t: &str) -> String {
        DB::insert_ignore(
            t,
            "group_name, payload, visible_at, priority, msg_key, headers, dedup_id",
            &Self::dedup_values(),
        )
    }

    /// `INSERT` of one message with a deduplication id into table `t`, no conflict clause:
    /// where the dialect checks the id itself. Binds: those of [`insert`](Self::insert),
    /// then the id.
    pub fn insert_with_dedup_sql(t: &str) -> String {
        format!(
            "INSERT INTO {t} (group_name, payload, visible_at, priority, msg_key, headers, dedup_id) VALUES ({})",
            Self::dedup_values()
        )
    }

    fn dedup_values() -> String {
        let p = DB::param;
        format!("{}, {}, {}, {}, {}, {}, {}", p(1), p(2), DB::later(&p(3)), p(4), p(5), p(6), p(7))
    }

    /// Deletes acknowledged rows, each under its own lease. Binds: the ids, then (id, token) pairs.
    pub fn ack_pairs(&self, pairs: usize) -> String {
        DB::delete_by_id(&self.quoted, ById::Pairs(pairs))
    }

    /// Deletes rows the caller's transaction took (locked, or under SQLite's write lock).
    /// Binds: the ids.
    pub fn delete_ids(&self, ids: usize) -> Arc<str> {
        DB::delete_by_id(&self.quoted, ById::Ids(ids)).into()
    }

    /// Deletes acknowledged rows of one claim. Binds: token, then the ids.
    pub fn ack_many(&self, ids: usize) -> String {
        DB::delete_by_id(&self.quoted, ById::Claim(ids))
    }

    /// Gives back rows of one claim unstarted: claimable at once, their attempt not
    /// counted. Binds: token, then the ids.
    pub fn release_many(&self, ids: usize) -> String {
        format!(
            "UPDATE {} SET lease = NULL, lease_until = NULL, attempts = attempts - 1 WHERE lease = {} AND id IN ({})",
            self.quoted,
            DB::param(1),
            placeholders::<DB>(2, ids)
        )
    }

    /// After a failed transactional handler, in its transaction: puts `rows` rows a claim
    /// took back, their attempt counted, in one statement (one "now" for all). Binds per
    /// row: id, group, payload, attempts, delay µs, created_at µs, error, priority, key,
    /// headers, dedup id.
    pub fn restore(&self, rows: usize) -> String {
        let values = self.values(rows, 11, |p| {
            let (later, created) = (DB::later(&p(5)), DB::from_micros(&p(6)));
            let rest = format!("{}, {}, {}, {}, {}", p(7), p(8), p(9), p(10), p(11));
            format!("({}, {}, {}, {}, {later}, {created}, {rest})", p(1), p(2), p(3), p(4))
        });
        format!(
            "INSERT INTO {} (id, group_name, payload, attempts, visible_at, created_at, last_error, \
             priority, msg_key, headers, dedup_id) VALUES {values}",
            self.quoted
        )
    }

    /// Dead-letters `rows` rows a transactional claim took. Binds per row: id, group,
    /// payload, attempts, created_at µs, error, priority, key, headers.
    pub fn dead_restore(&self, rows: usize) -> String {
        let values = self.values(rows, 9, |p| {
            let created = DB::from_micros(&p(5));
            let rest = format!("{}, {}, {}, {}", p(6), p(7), p(8), p(9));
            format!("({}, {}, {}, {}, {created}, {rest})", p(1), p(2), p(3), p(4))
        });
        format!(
            "INSERT INTO {} (id, group_name, payload, attempts, created_at, last_error, priority, msg_key, headers) \
             VALUES {values}",
            self.dead
        )
    }

    /// `rows` comma-separated tuples of `per` binds each; `tuple` writes one, given the
    /// placeholder of its k-th bind (from 1).
    fn values(&self, rows: usize, per: usize, tuple: impl Fn(&dyn Fn(usize) -> String) -> String) -> String {
        (0..rows).map(|row| tuple(&|k| DB::param(row * per + k))).collect::<Vec<_>>().join(", ")
    }
}

/// Binds per row of [`TableSql::insert`].
const INSERT_BINDS: usize = 6;
/// Binds per row of [`TableSql::insert_plain`]: the first three of [`INSERT_BINDS`].
const PLAIN_INSERT_BINDS: usize = 3;

/// How many INSERTs (forms and sizes) a table keeps built.
const KEPT_INSERTS: usize = 32;

impl InsertForm {
    /// Binds per row, in [`TableSql::insert`]'s order from the first or (payload only)
    /// the second: `(skip, take)`.
    pub(crate) const fn binds(self) -> (usize, usize) {
        match self {
            InsertForm::Payload => (1, 1),
            InsertForm::Plain => (0, PLAIN_INSERT_BINDS),
            InsertForm::Full => (0, INSERT_BINDS),
        }
    }
}

/// `'id', 'group_name', ...`: constants, not input.
pub(crate) fn column_list(columns: &[&str]) -> String {
    columns.iter().map(|c| format!("'{c}'")).collect::<Vec<_>>().join(", ")
}

/// Every column the catalog is asked about: the queue table's, and those a deploy adds
/// to older tables.
pub(crate) fn known_columns() -> String {
    column_list(&[&QUEUE_COLUMNS[..], &FEATURE_COLUMNS[..], &LIMITS_FEATURE_COLUMNS[..]].concat())
}
