//! Creating what rowbus needs in the database: each deploy on one connection, under a lock
//! (every replica of an app may deploy at start-up, at once), and never over a table that
//! is not what it would create.

use notify_table::{Config, Statement};
use sqlx::pool::PoolConnection;
use sqlx::{Connection as _, Pool};

use crate::driver::TextsAndInts;
use crate::driver::{Arg, args_of};
use crate::error::{Error, is_missing_column};
use crate::names::QueueTable;
use crate::sql::Db;
use crate::sql::Notifier;
use crate::sql::{
    DEAD_FEATURE_COLUMNS, FEATURE_COLUMNS, LIMITS_FEATURE_COLUMNS, LIMITS_SUFFIX, PositionsSql,
    QUEUE_COLUMNS, quoted,
};
use crate::sql::{DbPool, OnPool};
use std::sync::Arc;

/// How [`Queue::deploy_with`](crate::Queue::deploy_with) deploys a queue.
///
/// ```
/// use std::time::Duration;
/// let options = rowbus::DeployOptions::default().create_schema(true).keep(Duration::from_secs(7 * 86_400));
/// assert!(options.create_schema && options.keep.is_some());
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeployOptions {
    /// On PostgreSQL, create the schema of a schema-qualified queue (`app.jobs`) when it
    /// does not exist. Off by default: a missing schema is refused
    /// ([`Error::MissingSchema`]), so that a mistyped qualifier creates nothing. On
    /// MySQL/MariaDB the qualifier is a database, which rowbus never creates
    /// ([`Error::MissingMySqlDatabase`]), this set or not.
    pub create_schema: bool,
    /// Set how long the queue keeps handled messages, as
    /// [`Queue::deploy_keeping`](crate::Queue::deploy_keeping) does; `None` leaves the
    /// setting as it is.
    pub keep: Option<std::time::Duration>,
}

impl DeployOptions {
    /// These options with [`create_schema`](Self::create_schema) set to `create`.
    pub fn create_schema(mut self, create: bool) -> Self {
        self.create_schema = create;
        self
    }

    /// These options keeping handled messages for `keep` ([`keep`](Self::keep)).
    pub fn keep(mut self, keep: std::time::Duration) -> Self {
        self.keep = Some(keep);
        self
    }
}

/// What [`DbPool::deploy_notify_table`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotifyDeploy {
    /// The notify table exists now (it was created, or was there already).
    TableReady {
        /// Its name.
        table: String,
    },
    /// PostgreSQL has LISTEN/NOTIFY built in: nothing to create (durable listeners
    /// need [`DbPool::deploy_durable_notify_table`]).
    Native,
}

impl std::fmt::Display for NotifyDeploy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotifyDeploy::TableReady { table } => write!(f, "notify table `{table}` is ready"),
            NotifyDeploy::Native => {
                write!(
                    f,
                    "PostgreSQL has LISTEN/NOTIFY built in: no notify table needed, nothing to do \
                     (durable listeners need one: `rowbus deploy --durable`)"
                )
            }
        }
    }
}

impl DbPool {
    /// Creates the notify table and its indexes, and the positions table of durable
    /// listeners (`<table>_positions`), if they do not exist (MySQL/MariaDB, SQLite); on
    /// PostgreSQL does nothing and says so.
    pub async fn deploy_notify_table(&self, config: &Config) -> Result<NotifyDeploy, Error> {
        self.run(Deploy(config, Notifier::new)).await
    }

    /// [`deploy_notify_table`](Self::deploy_notify_table), and on PostgreSQL the same
    /// tables for its durable mode (see [`Notifier::durable`]).
    pub async fn deploy_durable_notify_table(&self, config: &Config) -> Result<NotifyDeploy, Error> {
        self.run(Deploy(config, Notifier::durable)).await
    }
}

/// Deploys the notify table of the notifier made from the configuration.
struct Deploy<'a>(&'a Config, fn(Config) -> Result<Notifier, Error>);

impl OnPool for Deploy<'_> {
    type Output = Result<NotifyDeploy, Error>;
    async fn run<DB: Db>(self, pool: Pool<DB>) -> Self::Output {
        notify_table(&pool, &(self.1)(self.0.clone())?).await
    }
}

/// Creates the notify table `notifier` writes to, where this database uses one.
pub(crate) async fn notify_table<DB: Db>(
    pool: &Pool<DB>,
    notifier: &Notifier,
) -> Result<NotifyDeploy, Error> {
    let Some(table) = DB::notify_table(notifier) else { return Ok(NotifyDeploy::Native) };
    let name = &notifier.config().table;
    let mut statements = table.create_table_sql();
    // The positions table of durable listeners; a notify table whose name leaves no room
    // for its suffix gets none (durable listeners on it say so).
    if let Ok(positions) = PositionsSql::<DB>::new(name) {
        statements.push(Statement { sql: positions.create.clone(), binds: Vec::new() });
        // One made before the owner's lease was stored gets the column.
        let probed = DB::fetch_rows(&mut *pool.acquire().await?, &positions.probe_lease, &[], 0).await;
        if probed.as_ref().is_err_and(is_missing_column) {
            statements.push(Statement { sql: positions.add_lease.clone(), binds: Vec::new() });
        }
    }
    locked(pool, name, None, &statements).await?;
    Ok(NotifyDeploy::TableReady { table: name.clone() })
}

/// The deploying connection: closed, rather than returned to the pool, when the deploy
/// stops (its future dropped) while it holds the lock, since a session's lock (MySQL's
/// `GET_LOCK`) would go on holding every other deploy off for as long as the pooled
/// connection lives.
struct Deploying<DB: Db> {
    conn: PoolConnection<DB>,
    holds_lock: bool,
}

impl<DB: Db> Drop for Deploying<DB> {
    fn drop(&mut self) {
        if self.holds_lock {
            self.conn.close_on_drop();
        }
    }
}

/// A queue to deploy: its name, and whether a missing schema may be created.
pub(crate) struct QueueDeploy<'a> {
    pub table: &'a QueueTable,
    pub create_schema: bool,
}

/// Runs `statements` (which create `table`) on one connection of `pool`, in a
/// transaction, under the dialect's deploy lock for `table`. With `queue`, first refuses
/// a missing schema (unless it may be created), a queue that would share a table with
/// another queue ([`refuse_shared`]) and a table of that name that is not a queue table,
/// before anything is created, and brings one made by an older rowbus up to date (the
/// columns it lacks, first).
pub(crate) async fn locked<DB: Db>(
    pool: &Pool<DB>,
    table: &str,
    queue: Option<QueueDeploy<'_>>,
    statements: &[Statement],
) -> Result<(), Error> {
    let mut deploying = Deploying { conn: pool.acquire().await?, holds_lock: false };
    // A `SqlStr` already: a `&'static str` here trips the compiler's proof that callers'
    // futures are `Send` (its lifetime is erased in the generic future).
    let begin = sqlx::SqlSafeStr::into_sql_str(DB::DEPLOY_BEGIN);
    let mut tx = deploying.conn.begin_with(begin).await?;
    // Set first: a lock statement stopped half-way may have taken the lock.
    deploying.holds_lock = true;
    DB::lock_deploy(&mut tx, table).await?;
    let created = async {
        if let Some(QueueDeploy { table, create_schema }) = &queue
            && let Some(schema) = table.schema()
        {
            refuse_missing_schema::<DB>(&mut tx, schema, *create_schema).await?;
        }
        if let Some(QueueDeploy { table: queue, .. }) = &queue {
            refuse_shared::<DB>(&mut tx, queue).await?;
        }
        if let Some(QueueDeploy { table: queue, .. }) = queue
            && refuse_foreign(queue, find_on::<DB>(&mut tx, queue.schema(), queue.name()).await?)?
        {
            for sql in migration::<DB>(&mut tx, queue).await? {
                DB::execute(&mut tx, &sql.into(), &[]).await?;
            }
        }
        for stmt in statements {
            DB::execute(&mut tx, &stmt.sql, &args_of(stmt)).await?;
        }
        Ok::<_, Error>(())
    }
    .await;
    DB::unlock_deploy(&mut tx, table).await?;
    if created.is_ok() {
        tx.commit().await?
    } else {
        tx.rollback().await?
    }
    deploying.holds_lock = false;
    created
}

/// Refuses with [`Error::QueueNameCollides`] deploying `queue` when a name it takes (its
/// table, side tables and, where they share the tables' names, indexes:
/// [`Schema::queue_names`](crate::sql::Schema::queue_names)) is one a deployed queue of its
/// schema takes: `jobs_dead` beside `jobs`, either way round.
async fn refuse_shared<DB: Db>(conn: &mut DB::Connection, queue: &QueueTable) -> Result<(), Error> {
    let qualified = |name: &str| match queue.schema() {
        Some(schema) => format!("{schema}.{name}"),
        None => name.to_owned(),
    };
    for (table, other) in shared_names(queue.name(), &DB::queue_names(), DB::NAMES_FOLD_CASE) {
        if find_on::<DB>(conn, queue.schema(), &other).await? == TableState::Deployed {
            return Err(Error::QueueNameCollides {
                queue: queue.to_string(),
                table: qualified(&table),
                other: qualified(&other),
            });
        }
    }
    Ok(())
}

/// The queues whose names would overlap those of queue `name`, each with a name both
/// would take: `(name + mine, other)` wherever `name + mine` is `other + theirs` for two
/// different suffixes of `suffixes` (`""` among them). With `fold`, names match without
/// regard to ASCII case.
fn shared_names(name: &str, suffixes: &[&str], fold: bool) -> Vec<(String, String)> {
    let ends_with = |text: &str, end: &str| {
        text.len() >= end.len() && {
            let tail = &text.as_bytes()[text.len() - end.len()..];
            if fold { tail.eq_ignore_ascii_case(end.as_bytes()) } else { tail == end.as_bytes() }
        }
    };
    let mut shared = Vec::new();
    for mine in suffixes {
        let taken = format!("{name}{mine}");
        for theirs in suffixes {
            // The same suffix would make the other queue this one; an empty rest no name.
            if mine != theirs && taken.len() > theirs.len() && ends_with(&taken, theirs) {
                shared.push((taken.clone(), taken[..taken.len() - theirs.len()].to_owned()));
            }
        }
    }
    shared
}

/// Refuses a `schema` that does not exist, unless `create` and the qualifier is a schema
/// (PostgreSQL; on MySQL/MariaDB it is a database, never created).
async fn refuse_missing_schema<DB: Db>(
    conn: &mut DB::Connection,
    schema: &str,
    create: bool,
) -> Result<(), Error> {
    let binds = [schema.to_owned()];
    let row = fetch_on::<DB>(conn, DB::schema_exists_sql().to_owned(), &binds, 0).await?;
    if row.first().is_some_and(|row| row.int(0) > 0) {
        return Ok(());
    }
    if DB::QUALIFIER_IS_DATABASE {
        Err(Error::MissingMySqlDatabase { database: schema.to_owned() })
    } else if create {
        Ok(())
    } else {
        Err(Error::MissingSchema { schema: schema.to_owned() })
    }
}

/// What an existing queue table (and its dead-letter table) needs to have every column
/// this version uses.
async fn migration<DB: Db>(conn: &mut DB::Connection, queue: &QueueTable) -> Result<Vec<String>, Error> {
    let present = columns_on::<DB>(conn, queue.schema(), queue.name()).await?.unwrap_or_default();
    let dead = format!("{}_dead", queue.name());
    let dead_missing = match columns_on::<DB>(conn, queue.schema(), &dead).await? {
        Some(present) => lacking(&present, &DEAD_FEATURE_COLUMNS),
        None => Vec::new(),
    };
    let mut statements = DB::migrate_queue(queue, &lacking(&present, &FEATURE_COLUMNS), &dead_missing);
    // A limits table made before rates had a burst: its new columns (NULL, unset).
    let limits = format!("{}{LIMITS_SUFFIX}", queue.name());
    if let Some(present) = columns_on::<DB>(conn, queue.schema(), &limits).await? {
        for column in lacking(&present, &LIMITS_FEATURE_COLUMNS) {
            let table = quoted::<DB>(queue, LIMITS_SUFFIX);
            statements.push(format!("ALTER TABLE {table} ADD COLUMN {} BIGINT", DB::quote(column)));
        }
    }
    for (check, binds, upgrade) in DB::index_upgrades(queue) {
        let args: Vec<Arg<'_>> = binds.iter().map(|b| Arg::Text(b)).collect();
        let rows = DB::fetch_rows(conn, &check.into(), &args, 0).await?;
        if rows.first().is_some_and(|row| row.int(0) > 0) {
            statements.extend(upgrade);
        }
    }
    Ok(statements)
}

/// What the database holds under a queue's table name.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TableState {
    /// No such table.
    Missing,
    /// A queue table: it has every column the broker needs.
    Deployed,
    /// Some other table.
    NotAQueue {
        /// The queue table's columns it lacks.
        missing: Vec<&'static str>,
    },
}

/// Runs catalog query `sql` (binds: texts) on `conn`: its rows, `texts` text columns first.
pub(crate) async fn fetch_on<DB: Db>(
    conn: &mut DB::Connection,
    sql: String,
    binds: &[String],
    texts: usize,
) -> Result<Vec<TextsAndInts>, sqlx::Error> {
    let args: Vec<Arg<'_>> = binds.iter().map(|b| Arg::Text(b)).collect();
    DB::fetch_rows(conn, &Arc::from(sql), &args, texts).await
}

/// Whether `name` (in `schema`, or where an unqualified name resolves) is a table on
/// `conn`, and which queue columns it lacks.
pub(crate) async fn find_on<DB: Db>(
    conn: &mut DB::Connection,
    schema: Option<&str>,
    name: &str,
) -> Result<TableState, Error> {
    Ok(match columns_on::<DB>(conn, schema, name).await? {
        None => TableState::Missing,
        Some(present) => {
            let missing = lacking(&present, &QUEUE_COLUMNS);
            if missing.is_empty() { TableState::Deployed } else { TableState::NotAQueue { missing } }
        }
    })
}

/// Which of the columns rowbus knows table `name` has (`None`: no such table).
pub(crate) async fn columns_on<DB: Db>(
    conn: &mut DB::Connection,
    schema: Option<&str>,
    name: &str,
) -> Result<Option<Vec<String>>, Error> {
    let (sql, binds) = DB::find_table_sql(schema, name);
    let row = fetch_on::<DB>(conn, sql, &binds, 1).await?.into_iter().next().unwrap_or_default();
    if row.int(0) == 0 {
        return Ok(None);
    }
    Ok(Some(row.text(0).split(',').filter(|c| !c.is_empty()).map(str::to_owned).collect()))
}

/// The `wanted` columns missing from `present`, matched as the catalog matched them:
/// without regard to case on MySQL/MariaDB and SQLite.
pub(crate) fn lacking(present: &[String], wanted: &[&'static str]) -> Vec<&'static str> {
    wanted.iter().copied().filter(|column| !present.iter().any(|p| p.eq_ignore_ascii_case(column))).collect()
}

/// Whether `state` is a deployed queue table: `false` when missing, and
/// [`Error::NotAQueueTable`] when `table` names some other table.
pub(crate) fn refuse_foreign(table: &QueueTable, state: TableState) -> Result<bool, Error> {
    match state {
        TableState::Missing => Ok(false),
        TableState::Deployed => Ok(true),
        TableState::NotAQueue { missing } => Err(Error::NotAQueueTable { table: table.to_string(), missing }),
    }
}

#[cfg(test)]
mod tests {
    use super::shared_names;

    const SUFFIXES: [&str; 4] = ["", "_dead", "_pause", "_keys"];

    #[test]
    fn a_queue_and_its_side_tables_meet_other_queues_both_ways() {
        let pairs = |name: &str| shared_names(name, &SUFFIXES, false);
        let owned = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs.iter().map(|&(a, b)| (a.to_owned(), b.to_owned())).collect()
        };
        assert_eq!(
            pairs("jobs"),
            owned(&[("jobs_dead", "jobs_dead"), ("jobs_pause", "jobs_pause"), ("jobs_keys", "jobs_keys")])
        );
        // A queue named as `jobs`'s dead-letter table takes `jobs`'s name for that table.
        let dead = pairs("jobs_dead");
        assert!(dead.contains(&("jobs_dead".to_owned(), "jobs".to_owned())), "{dead:?}");
        assert!(dead.contains(&("jobs_dead_dead".to_owned(), "jobs_dead_dead".to_owned())), "{dead:?}");
        assert!(!dead.iter().any(|(_, other)| other == "jobs_dead"), "never itself: {dead:?}");
    }

    #[test]
    fn folding_case_finds_names_that_differ_in_case() {
        assert!(shared_names("JOBS_DEAD", &SUFFIXES, false).iter().all(|(_, other)| other != "JOBS"));
        let folded = shared_names("JOBS_DEAD", &SUFFIXES, true);
        assert!(folded.contains(&("JOBS_DEAD".to_owned(), "JOBS".to_owned())), "{folded:?}");
    }
}
