//! A queue's kept history, `<table>_hist`, and its keep setting, `<table>_keep`.
//!
//! A queue deployed with a keep duration moves each handled message (acknowledged,
//! dropped by its handler, or dead-lettered) into its history table in the transaction
//! that deletes it, instead of only deleting it; the brokers that consume the queue delete
//! history rows older than the keep duration in bounded batches. The keep setting is one
//! row in the keep table, so that every process consuming the queue reads the same one.
//! Binds are documented with each statement.

use std::marker::PhantomData;
use std::sync::Arc;

use super::{ById, Naming, quoted};
use crate::names::QueueTable;

/// The suffix of a queue's history table: `jobs_hist`. At most six characters, so that the
/// longest table name (57) still fits PostgreSQL's 63 with it.
pub(crate) const HISTORY_SUFFIX: &str = "_hist";
/// The suffix of a queue's keep setting table: `jobs_keep`.
pub(crate) const KEEP_SUFFIX: &str = "_keep";
/// The suffix of the history table's index on `handled_at`: `jobs_hidx` (index names share
/// one namespace per schema on PostgreSQL and SQLite).
#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(crate) const HISTORY_INDEX_SUFFIX: &str = "_hidx";

/// The history columns a move writes; `handled_at` is the column's default, "now".
pub(crate) const HISTORY_COLUMNS: &str = "id, group_name, payload, attempts, created_at, outcome, last_error";

/// How a history row's message was settled, as its `outcome` column stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moved {
    Acked,
    Dropped,
    Dead,
    /// Cancelled by an operator ([`Queue::cancel`](crate::broker::Queue::cancel)).
    Cancelled,
}

impl Moved {
    /// The stored text: constants, never input.
    pub fn as_sql(self) -> &'static str {
        match self {
            Moved::Acked => "acked",
            Moved::Dropped => "dropped",
            Moved::Dead => "dead",
            Moved::Cancelled => "cancelled",
        }
    }
}

/// The history statements of one queue.
#[derive(Debug)]
pub struct HistorySql<DB> {
    /// The history table, quoted.
    pub quoted: String,
    /// The keep setting table, quoted.
    pub keep: String,
    /// The queue table, quoted.
    queue: String,
    /// No binds: the keep setting in µs (no row: never set; 0: turned off).
    pub read_keep: Arc<str>,
    /// No binds: forgets the keep setting (before [`insert_keep`](Self::insert_keep)).
    pub clear_keep: Arc<str>,
    /// Binds: keep µs.
    pub insert_keep: Arc<str>,
    /// Binds: µs from now to the oldest time kept (negative), limit. Deletes up to `limit`
    /// of the oldest rows handled before that time.
    pub prune: Arc<str>,
    /// An acknowledgement under a lease, kept: statements run in one transaction, the last
    /// one's count the rows moved. Binds (each): id, token.
    pub ack: Vec<Arc<str>>,
    /// The same for a message its handler dropped.
    pub drop: Vec<Arc<str>>,
    /// Binds: error, id, token. Copies a leased row in as dead-lettered, before the
    /// dead-letter move deletes it.
    pub dead: Arc<str>,
    /// Where the database takes them so: rows a transactional claim took, as one JSON
    /// text (see [`Keeping::history_json_insert`](crate::sql::Keeping::history_json_insert)). Binds: the rows, the outcome.
    pub insert_json: Option<Arc<str>>,
    db: PhantomData<fn() -> DB>,
}

impl<DB: Keeping> HistorySql<DB> {
    pub fn new(table: &QueueTable) -> Self {
        let (h, k, t) =
            (quoted::<DB>(table, HISTORY_SUFFIX), quoted::<DB>(table, KEEP_SUFFIX), quoted::<DB>(table, ""));
        let p = DB::param;
        let leased = format!("id = {} AND lease = {}", p(1), p(2));
        let arcs = |v: Vec<String>| v.into_iter().map(Arc::from).collect::<Vec<Arc<str>>>();
        HistorySql {
            read_keep: format!("SELECT {} FROM {k}", DB::bigint("keep_us")).into(),
            clear_keep: format!("DELETE FROM {k}").into(),
            insert_keep: format!("INSERT INTO {k} (id, keep_us) VALUES (1, {})", p(1)).into(),
            prune: DB::prune_history_sql(&h, &DB::later(&p(1)), &p(2)).into(),
            ack: arcs(DB::move_to_history(&t, &h, &leased, Moved::Acked.as_sql(), "last_error")),
            drop: arcs(DB::move_to_history(&t, &h, &leased, Moved::Dropped.as_sql(), "last_error")),
            dead: format!(
                "INSERT INTO {h} ({HISTORY_COLUMNS}) SELECT id, group_name, payload, attempts, created_at, '{}', {} \
                 FROM {t} WHERE id = {} AND lease = {}",
                Moved::Dead.as_sql(),
                p(1),
                p(2),
                p(3)
            )
            .into(),
            insert_json: DB::history_json_insert(&h).map(Arc::from),
            quoted: h,
            keep: k,
            queue: t,
            db: PhantomData,
        }
    }

    /// Whether a move is one statement (no transaction of its own needed).
    pub fn moves_in_one(&self) -> bool {
        self.ack.len() == 1
    }

    /// Acknowledged rows of any claims, each under its own lease, moved in. Binds (each
    /// statement): the ids, then (id, token) pairs.
    pub fn ack_pairs(&self, pairs: usize) -> Vec<String> {
        DB::move_by_id(&self.queue, &self.quoted, ById::Pairs(pairs), Moved::Acked.as_sql())
    }

    /// Rows of one claim, acknowledged or dropped by their handler (`outcome`), moved in.
    /// Binds (each statement): token, then the ids.
    pub fn of_claim(&self, ids: usize, outcome: Moved) -> Vec<String> {
        DB::move_by_id(&self.queue, &self.quoted, ById::Claim(ids), outcome.as_sql())
    }

    /// Rows cancelled whatever their state, moved in. Binds (each statement): the ids.
    pub fn cancel_ids(&self, ids: usize) -> Vec<String> {
        DB::move_by_id(&self.queue, &self.quoted, ById::Ids(ids), Moved::Cancelled.as_sql())
    }

    /// `rows` rows a transactional claim took, written in as `outcome`. Binds per row: id,
    /// group, payload, attempts, created_at µs, then the error when `with_error` (else the
    /// row has none).
    pub fn insert(&self, rows: usize, outcome: Moved, with_error: bool) -> String {
        let per = 5 + usize::from(with_error);
        let values: Vec<String> = (0..rows)
            .map(|row| {
                let p = |k: usize| DB::param(row * per + k);
                let error = if with_error { p(6) } else { "NULL".to_owned() };
                format!(
                    "({}, {}, {}, {}, {}, '{}', {error})",
                    p(1),
                    p(2),
                    p(3),
                    p(4),
                    DB::from_micros(&p(5)),
                    outcome.as_sql()
                )
            })
            .collect();
        format!("INSERT INTO {} ({HISTORY_COLUMNS}) VALUES {}", self.quoted, values.join(", "))
    }

    /// History rows, newest first (the latest handled, then the highest id), as
    /// [`HistoryRow`](crate::driver::HistoryRow) reads them. Binds: the group when `by_group`,
    /// then limit, offset.
    pub fn list(&self, by_group: bool) -> String {
        let filter = if by_group { format!(" WHERE group_name = {}", DB::param(1)) } else { String::new() };
        let first = usize::from(by_group) + 1;
        format!(
            "SELECT {}, group_name, payload, {}, {}, {}, last_error, outcome FROM {}{filter} \
             ORDER BY handled_at DESC, id DESC LIMIT {} OFFSET {}",
            DB::bigint("id"),
            DB::bigint("attempts"),
            DB::micros_of("created_at"),
            DB::micros_of("handled_at"),
            self.quoted,
            DB::param(first),
            DB::param(first + 1)
        )
    }
}

/// The statements that move the rows of queue table `t` matching `filter` into history
/// table `h` as `outcome`, with `error` (a placeholder, or `last_error`: the row's own) as
/// their last error: copy, then delete, in one transaction. The last statement's count is
/// the rows moved.
pub(crate) fn copy_then_delete<DB: Naming>(
    t: &str,
    h: &str,
    filter: &str,
    outcome: &str,
    error: &str,
) -> Vec<String> {
    copy_then::<DB>(
        h,
        &format!("{t} WHERE {filter}"),
        format!("DELETE FROM {t} WHERE {filter}"),
        outcome,
        error,
    )
}

/// The copy of the rows `from` (what follows `FROM`: a queue table and a condition, its
/// columns unqualified) into history table `h` as `outcome` with `error`, then `delete`,
/// which deletes the same rows with the same binds. The copy locks what it reads (`FOR
/// UPDATE` where rows are locked one by one), so that the delete removes what was copied.
pub(crate) fn copy_then<DB: Naming>(
    h: &str,
    from: &str,
    delete: String,
    outcome: &str,
    error: &str,
) -> Vec<String> {
    vec![
        format!(
            "INSERT INTO {h} ({HISTORY_COLUMNS}) SELECT id, group_name, payload, attempts, created_at, '{outcome}', {error} \
             FROM {from}{}",
            DB::FOR_UPDATE
        ),
        delete,
    ]
}

#[cfg(all(test, feature = "sqlite", feature = "postgres"))]
mod tests {
    use super::*;

    fn table() -> QueueTable {
        "jobs".parse().unwrap()
    }

    #[test]
    fn postgres_moves_in_one_statement() {
        let h = HistorySql::<sqlx::Postgres>::new(&table());
        assert!(h.moves_in_one());
        assert_eq!(
            h.ack[0].as_ref(),
            "WITH d AS (DELETE FROM \"jobs\" WHERE id = $1 AND lease = $2 RETURNING id, group_name, payload, attempts, created_at, last_error) \
             INSERT INTO \"jobs_hist\" (id, group_name, payload, attempts, created_at, outcome, last_error) \
             SELECT id, group_name, payload, attempts, created_at, 'acked', last_error FROM d"
        );
        assert!(h.of_claim(2, Moved::Dropped)[0].contains("WHERE lease = $1 AND id IN ($2, $3) RETURNING"));
    }

    #[test]
    fn sqlite_copies_then_deletes_with_the_same_binds() {
        let h = HistorySql::<sqlx::Sqlite>::new(&table());
        assert!(!h.moves_in_one());
        let pairs = h.ack_pairs(2);
        assert_eq!(pairs.len(), 2);
        assert!(pairs[0].starts_with("INSERT INTO `jobs_hist`"), "{}", pairs[0]);
        assert!(pairs[0].contains(
            "'acked', last_error FROM `jobs` WHERE id IN (?, ?) AND (id, lease) IN ((?, ?), (?, ?))"
        ));
        assert_eq!(pairs[1], "DELETE FROM `jobs` WHERE id IN (?, ?) AND (id, lease) IN ((?, ?), (?, ?))");
    }

    #[test]
    fn transactional_rows_bind_every_value() {
        let h = HistorySql::<sqlx::Sqlite>::new(&table());
        let sql = h.insert(2, Moved::Dead, true);
        assert!(sql.ends_with("VALUES (?, ?, ?, ?, ?, 'dead', ?), (?, ?, ?, ?, ?, 'dead', ?)"), "{sql}");
        let sql = h.insert(1, Moved::Acked, false);
        assert!(sql.ends_with("VALUES (?, ?, ?, ?, ?, 'acked', NULL)"), "{sql}");
    }
}

/// Kept history: the history table and the statements that move, write and prune it.
pub trait Keeping: Naming {
    /// The queue's history table (see [`HistorySql`]), its index on `handled_at` and its
    /// keep setting table, if missing. History: `id`, `group_name`, `payload`, `attempts`,
    /// `created_at` as the queue table has them, `outcome` (short text), `handled_at`
    /// (defaults to now), `last_error`; no key (a requeued dead letter comes back under its
    /// id and may be handled again). Keep setting: `id` (the key, always 1) and `keep_us`
    /// (a BIGINT).
    fn create_history(table: &QueueTable) -> Vec<String>;

    /// Deletes up to `limit` (a placeholder) of history table `h`'s oldest rows handled
    /// before the time `cutoff` (an expression), oldest first.
    fn prune_history_sql(h: &str, cutoff: &str, limit: &str) -> String;

    /// One statement that writes rows a transactional claim took into history table `h`,
    /// given as one JSON text (binds: the rows, then their outcome): an array of
    /// `{"i": id, "g": group, "p": payload in hex, "a": attempts, "c": created_at µs,
    /// "e": error or null}`. `None` where the rows go as binds, a `VALUES` tuple each.
    fn history_json_insert(_h: &str) -> Option<String> {
        None
    }

    /// The statements that move the rows of queue table `t` matching `filter` into history
    /// table `h` as `outcome`, with `error` (a placeholder, or `last_error`: the row's own)
    /// as their last error, run in one transaction; the last one's count is the rows moved.
    /// By default a copy, then a delete, with the same binds.
    fn move_to_history(t: &str, h: &str, filter: &str, outcome: &str, error: &str) -> Vec<String> {
        copy_then_delete::<Self>(t, h, filter, outcome, error)
    }

    /// [`move_to_history`](Self::move_to_history) of the rows `which` names (binds: as it
    /// says), with their own last error. By default through [`ById::filter`]; where the
    /// database finds such rows better another way ([`Naming::by_id`]), that way.
    fn move_by_id(t: &str, h: &str, which: ById, outcome: &str) -> Vec<String> {
        Self::move_to_history(t, h, &which.filter::<Self>(), outcome, "last_error")
    }
}
