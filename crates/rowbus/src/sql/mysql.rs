//! MySQL 8.0+ and MariaDB 10.6+: `?` placeholders, `DATETIME(6)` in UTC, no `UPDATE ...
//! RETURNING` (a claim locks with a `SELECT` and marks with an `UPDATE`), the notify table.
//!
//! Longer than most files: one dialect's implementations of the statement traits side by
//! side, each a few statements, read against the other dialects' files of the same
//! shape; what stands apart (deduplication, keys, floors, the side connections) is in
//! the modules below.

use std::str::FromStr as _;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use notify_table::{Dialect as NotifyDialect, NotifyTable, Row, Statement};
use sqlx::mysql::{MySqlConnectOptions, MySqlConnection};
use sqlx::{ConnectOptions as _, Connection as _, MySql, Pool, Row as _};

use super::{
    ById, Catalog, Claiming, Connecting, DEDUP, DEPLOY_LOCK_WAIT, Db, Floor, Keeping, Limiting, Naming,
    Pausing, Positions, Publishing, QUEUE_NAMES, Scheduling, Schema, Waking, placeholders,
};
use crate::backend::{Backend, connect_error, invalid_url, pool_options, redact};
use crate::driver::sealed::Driver as _;
use crate::driver::{Arg, ClaimedRow};
use crate::error::Error;
use crate::hosts::{Hosts, connect_first, follow, unbracket};
use crate::names::QueueTable;
use crate::sql::ACK_BATCH;
use crate::sql::DbPool;
use crate::sql::Notifier;
use crate::sql::TableConn;
use crate::sql::TableSql;
use crate::sql::push::PushHandle;

mod dedup;
mod floors;
mod keys;
mod side;

use side::SHORT_TEXT;

crate::driver::driver!(MySql);

impl Db for MySql {
    const BACKEND: Backend = Backend::MySql;
}

/// A queue's tables of its own on MySQL/MariaDB (see the `dedup` and `keys` modules): their
/// statements, built once, and what their cleanups keep between two runs.
#[derive(Debug)]
pub struct SideTables {
    dedup: dedup::State,
    keys: keys::State,
}

/// What a claim returns: id, group, payload, attempts, created_at µs, priority, key,
/// dedup id, headers.
const CLAIMED: &str = "CAST(id AS SIGNED), group_name, payload, CAST(attempts AS SIGNED), \
     CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', created_at) AS SIGNED), CAST(priority AS SIGNED), \
     msg_key, dedup_id, headers";

/// The headers, a JSON object.
const HEADERS: &str = "LONGTEXT CHARACTER SET utf8mb4 NULL";
/// The priority: lower is claimed sooner.
const PRIORITY: &str = "SMALLINT NOT NULL DEFAULT 0";
/// The clustered key, which is the claim order (see [`MySql::create_queue`]).
const CLAIM_ORDER: &str = "PRIMARY KEY (`group_name`, `priority`, `visible_at`, `id`)";

/// Strict mode, so the server refuses an over-long value rather than truncating it, and
/// READ COMMITTED, which claims with `SKIP LOCKED` want.
const SESSION: [&str; 2] = [
    "SET SESSION sql_mode = TRIM(BOTH ',' FROM CONCAT(@@SESSION.sql_mode, ',STRICT_ALL_TABLES'))",
    "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
];

async fn session(conn: &mut MySqlConnection) -> Result<(), sqlx::Error> {
    for statement in SESSION {
        sqlx::Executor::execute(&mut *conn, statement).await?;
    }
    let (increment, mariadb): (i64, bool) =
        sqlx::query_as("SELECT CAST(@@auto_increment_increment AS SIGNED), VERSION() LIKE '%MariaDB%'")
            .fetch_one(&mut *conn)
            .await?;
    if increment > 1 && mariadb {
        LANES.store(true, Ordering::Relaxed);
    }
    Ok(())
}

/// Whether a connection of this process has seen `auto_increment_increment` above 1 on
/// MariaDB (a Galera node, where it is the cluster's size): claims then go lane first
/// ([`claim_in_lanes`]). Until one has, every claim is the plain one, which on a server
/// whose increment is 1 is all one lane anyway; once set, a short claim costs a second
/// statement, which on such a server finds nothing. MariaDB only: the lane claim bounds
/// its walk with MariaDB's `LIMIT ... ROWS EXAMINED` (MySQL's multi-primary group
/// replication also raises the increment, and gets the plain claim).
static LANES: AtomicBool = AtomicBool::new(false);

/// This node's lane of a queue table. Galera's row locks are local to a node: claims on
/// two nodes that lock the same first ready rows both succeed until one of them loses
/// certification at `COMMIT` (1213) and claims again. Galera gives each node its own
/// `auto_increment_offset` (1..n) and all the same `auto_increment_increment` (n), so
/// `id DIV n` counts the rows one node inserts and `MOD(id DIV n, n)` spreads every node's
/// rows over n lanes; a claim first takes its own node's lane, in claim order, and only
/// when that is short of its limit the other lanes'. Several consumers on one node share
/// its lane and skip each other's locked rows as on one server.
const LANE: &str =
    "MOD(id DIV @@auto_increment_increment, @@auto_increment_increment) = @@auto_increment_offset - 1";

/// `claim`, a claim statement of the table `quoted`, kept to this node's lane (`mine`),
/// reading at most [`lane_scan`]`(limit)` rows, or to the other lanes.
fn lane_claim(claim: &str, quoted: &str, mine: bool, limit: i64) -> Arc<str> {
    // Every part of the claim: a row one part of a statement locked, another part of the
    // same transaction's next statement would not skip.
    let at = format!("FROM {quoted} AS q WHERE ");
    let lane = if mine { format!("{LANE} AND ") } else { format!("NOT ({LANE}) AND ") };
    let claim = claim.replace(&at, &format!("{at}{lane}"));
    if !mine {
        return claim.into();
    }
    // The statement's last LIMIT is the outer one, which MariaDB lets bound the rows read.
    match claim.rfind("LIMIT ?") {
        Some(at) => {
            format!("{}LIMIT ? ROWS EXAMINED {}{}", &claim[..at], lane_scan(limit), &claim[at + 7..]).into()
        }
        None => claim.into(),
    }
}

/// The first part of claim `claim` ([`MySql::claim_sql`]) as a statement of its own: the
/// rows of the floor's priority.
fn floor_part(claim: &str) -> Arc<str> {
    claim.split(" UNION ALL ").next().unwrap_or(claim).into()
}

/// The most rows a lane claim of `limit` reads. The rows of the lanes no consumer takes
/// (nodes without consumers, or every consumer on one node) pile up at the head of the
/// claim order, and an unbounded lane claim walked all of them on every claim: three
/// consumers on one node drained at half their rate. Past this many, the claim returns
/// what it found (a warning, not an error), which is short, and the head is taken instead.
fn lane_scan(limit: i64) -> i64 {
    limit.saturating_mul(16).saturating_add(64)
}

/// When this process may try its lane again (µs after [`lane_clock`]'s start): set
/// [`DRY_FOR`] ahead when a lane claim came back short. A lane that has run dry would
/// otherwise make every claim read up to [`lane_scan`] of the other lanes' rows to find
/// nothing, and then claim again.
static LANE_DRY_UNTIL: AtomicU64 = AtomicU64::new(0);

/// How long claims take from the head, as on one server, after a short lane claim.
const DRY_FOR: Duration = Duration::from_secs(1);

/// Until when (µs after [`lane_clock`]'s start) a lane claim that found some rows of its
/// lane, but fewer than its limit, is not topped up from the other lanes (nor starts
/// claiming from the head). Set [`HOLD`] ahead when a claim of this process lost to a
/// conflict ([`MySql::claim_conflicted`]).
static HELP_HELD_UNTIL: AtomicU64 = AtomicU64::new(0);

/// How long a process that lost a claim to a conflict keeps to its own lane while that
/// lane has rows. A lane claim comes back short both when the node's lane is done and
/// when the node is merely ahead: every node's rows are spread evenly over the lanes, but
/// the nodes drain at their own pace, and a node a few dozen rows ahead in its lane walks
/// past [`lane_scan`] rows of the others'. Taking the head then takes the rows the other
/// nodes' consumers are claiming: 60-120 conflicts per 1,000 messages with one consumer
/// per node (a second of head claims after every short lane claim). A conflict is what
/// tells the cases apart: rows nobody else claims (a node without consumers, or down;
/// every consumer on one node) never conflict, so the head is taken as before; rows
/// another node's consumers claim do, and then this process leaves them to those
/// consumers for a while, its short claims letting the others catch up. A claim that
/// found nothing in its lane still takes the others' rows: with one node's consumers
/// gone, the other nodes share its lane, colliding now and then; holding those back too
/// (for a second) halved the rate at which they drained it (740 msg/s against 1,650-1,940).
/// Measured with scripts/galera-bench.sh (12,000 messages; docs/scaling.md): with this
/// 250 ms hold 6-12 conflicts per 1,000 and 2,090-2,200 msg/s spread, 1,610-2,130 msg/s
/// with no consumer on node 3; with a 1 s hold 3-5 per 1,000 and about the same spread
/// rate, but 1,370-1,520 msg/s with no consumer on node 3.
const HOLD: Duration = Duration::from_millis(250);

/// Microseconds since this process first asked.
fn lane_clock() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    u64::try_from(START.get_or_init(Instant::now).elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// `d` in microseconds, as [`lane_clock`] counts.
fn span_us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Where a claim on a Galera node takes its rows.
#[derive(Debug, PartialEq, Eq)]
enum Plan {
    /// From the head of the claim order, as on one server.
    Head,
    /// From this node's lane; what that leaves short of the limit from the other lanes
    /// (and the next [`DRY_FOR`] from the head), unless `held` and the lane gave some.
    Lane { held: bool },
}

/// The plan of a claim at `now` after earlier claims set [`LANE_DRY_UNTIL`] (`dry_until`)
/// and [`HELP_HELD_UNTIL`] (`held_until`).
fn plan(now: u64, dry_until: u64, held_until: u64) -> Plan {
    if now < dry_until { Plan::Head } else { Plan::Lane { held: now < held_until } }
}

/// Runs the claim `claim` (binds: group, group, limit) lane first when [`LANES`] says this
/// may be a Galera node, as [`plan`] says: the rows of this node's lane, then, for what is
/// left of `limit`, the other lanes' (a node whose consumers stopped, or is down, leaves
/// its lane to them); for [`DRY_FOR`] after a short lane claim, from the head, as on one
/// server; for [`HOLD`] after a conflict, from this node's lane alone while it has rows.
async fn claim_in_lanes(
    conn: &mut MySqlConnection,
    claim: &Arc<str>,
    quoted: &str,
    group: &str,
    limit: i64,
    floor: Floor,
) -> Result<Vec<ClaimedRow>, sqlx::Error> {
    let (priority, others) = (i64::from(floor.priority), i64::from(floor.others));
    let (g, p) = (Arg::Text(group), Arg::Int(priority));
    // With no other priority waiting, the floor's part alone: the union of the two parts
    // sorts its rows, payloads included, in a temporary table of its own (Aria's, for the
    // BLOBs), at every claim.
    let one = !floor.others;
    let claim: &Arc<str> = &if one { floor_part(claim) } else { claim.clone() };
    let binds = |limit| {
        let l = Arg::Int(limit);
        let mut binds = vec![g, g, p, Arg::Int(floor.visible_us), g, l];
        if !one {
            binds.extend([g, g, p, Arg::Int(floor.others_us), g, Arg::Int(others), l, l]);
        }
        binds
    };
    if !LANES.load(Ordering::Relaxed) {
        return MySql::fetch_claimed(conn, claim, &binds(limit)).await;
    }
    let now = lane_clock();
    let held =
        match plan(now, LANE_DRY_UNTIL.load(Ordering::Relaxed), HELP_HELD_UNTIL.load(Ordering::Relaxed)) {
            Plan::Head => return MySql::fetch_claimed(conn, claim, &binds(limit)).await,
            Plan::Lane { held } => held,
        };
    let mut rows = MySql::fetch_claimed(conn, &lane_claim(claim, quoted, true, limit), &binds(limit)).await?;
    let short = limit.saturating_sub(i64::try_from(rows.len()).unwrap_or(i64::MAX));
    if short > 0 && (!held || rows.is_empty()) {
        LANE_DRY_UNTIL.store(now.saturating_add(span_us(DRY_FOR)), Ordering::Relaxed);
        rows.extend(
            MySql::fetch_claimed(conn, &lane_claim(claim, quoted, false, short), &binds(short)).await?,
        );
    }
    Ok(rows)
}

/// The connect options of a single-host URL (`mariadb:` read as `mysql:`).
fn options(url: &str) -> Result<MySqlConnectOptions, Error> {
    let url = match url.strip_prefix("mariadb:") {
        Some(rest) => format!("mysql:{rest}"),
        None => url.to_owned(),
    };
    let options = MySqlConnectOptions::from_str(&url).map_err(|e| invalid_url(&url, e))?;
    // sqlx keeps an IPv6 address's brackets, and would look `[::1]` up as a name.
    match unbracket(options.get_host()).map(str::to_owned) {
        Some(address) => Ok(options.host(&address)),
        None => Ok(options),
    }
}

/// One connection in rowbus's session settings, to the first host of `url` that accepts
/// it, and that host's URL.
async fn connect(url: &str) -> Result<(MySqlConnection, String), Error> {
    connect_first(url, |host, read_write| async move {
        if read_write {
            return Err(Error::InvalidUrl {
                url: redact(url),
                reason: "target_session_attrs is PostgreSQL's: on MySQL/MariaDB list hosts that take writes"
                    .into(),
            });
        }
        let mut conn = options(&host)?.connect().await.map_err(connect_error(&host))?;
        session(&mut conn).await.map_err(connect_error(&host))?;
        Ok((conn, host))
    })
    .await
}

/// The rows of the table `quoted`, aliased `q`, that `which` names, each found by the
/// `id` index: `JSON_TABLE(JSON_ARRAY(?, ...), ...) AS s STRAIGHT_JOIN ... ON q.id =
/// s.rowbus_id` (a claim's token first, in a table of its own, as its bind is), for the
/// statements that lock, copy or delete rows the caller holds or names. Written `WHERE id
/// IN (...)`, MariaDB read the whole table instead once the ids were a fair share of it
/// (10 of 40 rows: a queue near the end of its backlog, or one just made), and a locking
/// read or a DELETE waits for whoever locked each row it reads: transactional batches in
/// flight then waited for each other's commits, and deadlocked (two of them holding rows
/// the other's DELETE read), until each claim came back short and its runner slept out
/// its poll interval; a kept queue's moves into its history and a cancel waited the same
/// way for rows they do not name. The ids as a table of `SELECT ? UNION ALL ...` did the
/// same, and cost a 256-row DELETE 2.8 ms more than `IN` on a 20,000-row table; this
/// shape costs it 0.6 ms more (`SHOW PROFILES`, five runs each). JSON_TABLE is in every
/// MariaDB and MySQL with `SKIP LOCKED`, which the claims need anyway.
fn by_ids(quoted: &str, which: ById) -> String {
    let ids = |n| {
        format!(
            "JSON_TABLE(JSON_ARRAY({}), '$[*]' COLUMNS (rowbus_id BIGINT PATH '$')) AS s \
             STRAIGHT_JOIN {quoted} AS q ON q.id = s.rowbus_id",
            vec!["?"; n].join(", ")
        )
    };
    match which {
        ById::Ids(n) => ids(n),
        ById::Claim(n) => {
            format!("(SELECT ? AS rowbus_lease) AS l STRAIGHT_JOIN {} AND q.lease = l.rowbus_lease", ids(n))
        }
        ById::Pairs(n) => format!("{} WHERE (q.id, q.lease) IN ({})", ids(n), vec!["(?, ?)"; n].join(", ")),
    }
}

/// Marks the rows a claim locked. Binds: lease µs, token, then the ids.
fn claim_mark(t: &str, ids: usize) -> String {
    format!(
        "UPDATE {t} SET lease_until = {}, lease = ?, attempts = attempts + 1 WHERE id IN ({})",
        MySql::later("?"),
        placeholders::<MySql>(3, ids)
    )
}

/// The `GET_LOCK` name of a deploy of `table`, as an expression and its bind: one name
/// per database (the qualifier of `app.jobs`, else the connection's), so that deploys of
/// queues whose names meet (`jobs` and `jobs_dead`, see `deploy::refuse_shared`) take turns
/// and the second sees the first's tables. MySQL refuses names over 64 characters; two
/// long names cut to the same one only make their deploys take turns.
fn lock_name(table: &str) -> (&'static str, Arg<'_>) {
    let database = match table.split_once('.') {
        Some((database, _)) => Arg::Text(database),
        None => Arg::Null,
    };
    ("LEFT(CONCAT('rowbus deploy ', COALESCE(?, DATABASE(), '')), 64)", database)
}

/// A lease claim with `claim` (binds: group, group, limit), keyed rows checked again with
/// `per_key` messages of a key at once (see `keys::recheck`), then marked with the lease:
/// in the caller's transaction.
#[allow(clippy::too_many_arguments)]
fn lease_claim<'c>(
    conn: &'c mut MySqlConnection,
    sql: &'c TableSql<MySql>,
    claim: &'c Arc<str>,
    per_key: i64,
    group: &'c str,
    limit: i64,
    lease: i64,
    token: i64,
    floor: Floor,
) -> BoxFuture<'c, Result<Vec<ClaimedRow>, sqlx::Error>> {
    Box::pin(async move {
        let rows = claim_in_lanes(conn, claim, &sql.quoted, group, limit, floor).await?;
        let mut rows = keys::recheck(conn, sql, rows, per_key).await?;
        if !rows.is_empty() {
            let mark = Arc::from(claim_mark(&sql.quoted, rows.len()));
            let mut args = vec![Arg::Int(lease), Arg::Int(token)];
            args.extend(rows.iter().map(|r| Arg::Int(r.id)));
            MySql::execute(conn, &mark, &args).await?;
            // The rows were read before the mark counted this attempt.
            for row in &mut rows {
                row.attempts += 1;
            }
        }
        Ok(rows)
    })
}

impl Naming for MySql {
    fn quote(part: &str) -> String {
        format!("`{part}`")
    }

    /// Through [`by_ids`]: see there.
    fn by_id(quoted: &str, which: ById) -> String {
        by_ids(quoted, which)
    }

    /// MySQL names the joined table it deletes from.
    fn delete_by_id(quoted: &str, which: ById) -> String {
        format!("DELETE q FROM {}", by_ids(quoted, which))
    }

    fn param(_: usize) -> String {
        "?".to_owned()
    }

    const NOW: &'static str = "UTC_TIMESTAMP(6)";

    fn later(p: &str) -> String {
        format!("UTC_TIMESTAMP(6) + INTERVAL {p} MICROSECOND")
    }

    fn from_micros(p: &str) -> String {
        format!("TIMESTAMPADD(MICROSECOND, {p}, '1970-01-01 00:00:00')")
    }

    fn micros_of(column: &str) -> String {
        format!("CAST(TIMESTAMPDIFF(MICROSECOND, '1970-01-01', {column}) AS SIGNED)")
    }

    const COUNT: &'static str = "CAST(COUNT(*) AS SIGNED)";

    fn bigint(expr: &str) -> String {
        format!("CAST({expr} AS SIGNED)")
    }

    fn insert_ignore(table: &str, columns: &str, values: &str) -> String {
        format!("INSERT IGNORE INTO {table} ({columns}) VALUES ({values})")
    }

    fn insert_select_ignore(table: &str, columns: &str, select: &str) -> String {
        format!("INSERT IGNORE INTO {table} ({columns}) {select}")
    }

    /// `ON DUPLICATE KEY UPDATE`: MySQL has no `ON CONFLICT` (MariaDB has no `AS new`
    /// row alias either, so the values are named with `VALUES()`).
    fn upsert_add(table: &str, columns: &str, values: &str, _key: &str, column: &str) -> String {
        format!(
            "INSERT INTO {table} ({columns}) VALUES ({values}) \
             ON DUPLICATE KEY UPDATE {column} = {column} + VALUES({column})"
        )
    }

    fn upsert(table: &str, columns: &str, values: &str, _key: &str, updates: &[&str]) -> String {
        let set: Vec<String> = updates.iter().map(|c| format!("{c} = VALUES({c})")).collect();
        format!(
            "INSERT INTO {table} ({columns}) VALUES ({values}) ON DUPLICATE KEY UPDATE {}",
            set.join(", ")
        )
    }

    /// The bytes of a `VARBINARY` column as the UTF-8 text they hold (the driver decodes
    /// no binary column as a string).
    fn text_of(expr: &str) -> String {
        format!("CAST({expr} AS CHAR CHARACTER SET utf8mb4)")
    }
}

impl Schema for MySql {
    type TableState = SideTables;

    fn table_state(table: &QueueTable) -> SideTables {
        SideTables { dedup: dedup::State::of(table), keys: keys::State::of(table) }
    }

    /// The claim order is the clustered primary key itself and the `_id` index holds `id`
    /// alone: InnoDB's locking reads through a secondary index visit every delete-marked
    /// entry the purge has not removed yet, and a busy queue leaves thousands in front of
    /// its first ready row (a claim grew from 0.3 ms to 1.3 ms over 8,000 acknowledged
    /// rows; walking the clustered index it stays flat).
    fn create_queue(table: &QueueTable) -> Vec<String> {
        let (t, dead) = (super::quoted::<Self>(table, ""), super::quoted::<Self>(table, "_dead"));
        let index = |suffix: &str| Self::quote(&format!("{}{suffix}", table.name()));
        let group = format!("{SHORT_TEXT} NOT NULL");
        vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (\n\
                 \x20 `id` BIGINT UNSIGNED NOT NULL AUTO_INCREMENT,\n\
                 \x20 `group_name` {group} DEFAULT '',\n\
                 \x20 `priority` {PRIORITY},\n\
                 \x20 `msg_key` {SHORT_TEXT} NULL,\n\
                 \x20 `dedup_id` {SHORT_TEXT} NULL,\n\
                 \x20 `headers` {HEADERS},\n\
                 \x20 `payload` LONGBLOB NOT NULL,\n\
                 \x20 `attempts` INT NOT NULL DEFAULT 0,\n\
                 \x20 `visible_at` DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),\n\
                 \x20 `lease` BIGINT NULL,\n\
                 \x20 `lease_until` DATETIME(6) NULL,\n\
                 \x20 `created_at` DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),\n\
                 \x20 `last_error` TEXT NULL,\n\
                 \x20 {CLAIM_ORDER},\n\
                 \x20 UNIQUE KEY {} (`id`)\n\
                 ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
                index("_id")
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {dead} (\n\
                 \x20 `id` BIGINT UNSIGNED NOT NULL,\n\
                 \x20 `group_name` {group},\n\
                 \x20 `priority` {PRIORITY},\n\
                 \x20 `msg_key` {SHORT_TEXT} NULL,\n\
                 \x20 `headers` {HEADERS},\n\
                 \x20 `payload` LONGBLOB NOT NULL,\n\
                 \x20 `attempts` INT NOT NULL,\n\
                 \x20 `created_at` DATETIME(6) NOT NULL,\n\
                 \x20 `failed_at` DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),\n\
                 \x20 `last_error` TEXT NULL,\n\
                 \x20 PRIMARY KEY (`id`)\n\
                 ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
            ),
            dedup::create(table),
            keys::create(table),
        ]
    }

    fn column_def(column: &str) -> &'static str {
        match column {
            "priority" => PRIORITY,
            "headers" => HEADERS,
            _ => "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL",
        }
    }

    /// One `ALTER TABLE` per table (each rebuilds it): the columns, and with the priority
    /// the clustered key that orders claims by it (keys and deduplication ids have tables
    /// of their own: see [`index_upgrades`](Self::index_upgrades)).
    fn migrate_queue(table: &QueueTable, missing: &[&str], dead_missing: &[&str]) -> Vec<String> {
        let add = |c: &&str| format!("ADD COLUMN {} {}", Self::quote(c), Self::column_def(c));
        let mut statements = Vec::new();
        if !missing.is_empty() {
            let mut changes: Vec<String> = missing.iter().map(add).collect();
            if missing.contains(&"priority") {
                changes.push(format!("DROP PRIMARY KEY, ADD {CLAIM_ORDER}"));
            }
            statements.push(format!(
                "ALTER TABLE {} {}",
                super::quoted::<Self>(table, ""),
                changes.join(", ")
            ));
        }
        if !dead_missing.is_empty() {
            let changes: Vec<String> = dead_missing.iter().map(add).collect();
            statements.push(format!(
                "ALTER TABLE {} {}",
                super::quoted::<Self>(table, "_dead"),
                changes.join(", ")
            ));
        }
        statements
    }

    /// The keys' table and the deduplication ids' table.
    fn side_tables(table: &QueueTable) -> Vec<String> {
        vec![super::quoted::<Self>(table, DEDUP), super::quoted::<Self>(table, keys::KEYS_TABLE)]
    }

    /// Besides the shared ones, the deduplication ids' and the keys' tables (indexes are
    /// named per table here).
    fn queue_names() -> Vec<&'static str> {
        [&QUEUE_NAMES[..], &[DEDUP, keys::KEYS_TABLE]].concat()
    }

    /// A queue table of an older rowbus kept its keys and deduplication ids in indexes.
    fn index_upgrades(table: &QueueTable) -> Vec<(String, Vec<String>, Vec<String>)> {
        vec![dedup::upgrade(table), keys::upgrade(table)]
    }

    /// `GET_LOCK`, a session's named lock (DDL commits at once here, so no transaction
    /// could hold one): one name per database, server-wide (see `lock_name`).
    /// [`unlock_deploy`](Self::unlock_deploy) releases it.
    fn lock_deploy<'c>(conn: &'c mut Self::Connection, table: &'c str) -> BoxFuture<'c, Result<(), Error>> {
        Box::pin(async move {
            let wait = i64::try_from(DEPLOY_LOCK_WAIT.as_secs()).unwrap_or(i64::MAX);
            let (name, database) = lock_name(table);
            let sql = Arc::<str>::from(format!("SELECT CAST(GET_LOCK({name}, ?) AS SIGNED)"));
            let rows = Self::fetch_rows(conn, &sql, &[database, Arg::Int(wait)], 0).await?;
            // 1 taken; 0 the wait ran out (NULL, an error, is not expected here).
            match rows.first().map(|row| row.int(0)) {
                Some(1) => Ok(()),
                _ => Err(Error::DeployLocked { table: table.to_owned(), waited: DEPLOY_LOCK_WAIT }),
            }
        })
    }

    fn unlock_deploy<'c>(
        conn: &'c mut Self::Connection,
        table: &'c str,
    ) -> BoxFuture<'c, Result<(), sqlx::Error>> {
        Box::pin(async move {
            let (name, database) = lock_name(table);
            let sql = Arc::<str>::from(format!("SELECT RELEASE_LOCK({name})"));
            Self::execute(conn, &sql, &[database]).await.map(drop)
        })
    }
}

impl Publishing for MySql {
    /// A statement and its binds travel in one packet: the server refuses (and drops the
    /// connection of) one over `max_allowed_packet`, 16 MiB by default.
    const STATEMENT_LIMIT: (u64, &'static str) = (16 << 20, "the server's max_allowed_packet");

    const STATEMENT_LIMIT_SQL: Option<&'static str> = Some("SELECT CAST(@@max_allowed_packet AS SIGNED)");

    /// The side tables' inserts write the id they are given: they leave it as it was.
    const LAST_ID_SQL: &'static str = "SELECT CAST(LAST_INSERT_ID() AS SIGNED)";

    /// MySQL has no `INSERT ... RETURNING` (MariaDB has).
    const RETURNS_INSERTED: bool = false;

    const FROM_NOTHING: &'static str = " FROM DUAL";

    /// The id is the one the server's answer to the insert carries (its
    /// `LAST_INSERT_ID`): no second round trip. Without `RETURNING`, the message's
    /// publish time as its handler sees it ([`Received::published_at`](crate::Received::published_at))
    /// is this process's clock as the insert left, where the row keeps the server's.
    fn insert_handed<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c super::TableSql<Self>,
        args: &'c [Arg<'c>],
    ) -> BoxFuture<'c, Result<Option<(i64, i64)>, sqlx::Error>> {
        Box::pin(async move {
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
            let at = i64::try_from(now.as_micros()).unwrap_or(i64::MAX);
            let done = crate::driver::query::<MySql>(&sql.hand_off, args, true).execute(&mut *conn).await?;
            let id = i64::try_from(done.last_insert_id()).unwrap_or(i64::MAX);
            Ok((done.rows_affected() > 0).then_some((id, at)))
        })
    }

    /// In the ids' table `<queue>_dedup`: see the `dedup` module.
    fn insert_deduplicated<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c super::TableSql<Self>,
        args: &'c [Arg<'c>],
        alone: bool,
    ) -> BoxFuture<'c, Result<bool, sqlx::Error>> {
        dedup::insert(conn, sql, args, alone)
    }

    /// Into the keys' table too, in one transaction: see the `keys` module.
    fn insert_messages<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c super::TableSql<Self>,
        insert: &'c Arc<str>,
        args: &'c [Arg<'c>],
        keyed: bool,
    ) -> BoxFuture<'c, Result<u64, sqlx::Error>> {
        keys::insert(conn, sql, insert, args, keyed)
    }

    fn keyed_gone<'c>(
        pool: &'c Pool<Self>,
        sql: &'c Arc<super::TableSql<Self>>,
        ids: &'c [i64],
    ) -> BoxFuture<'c, Result<(), sqlx::Error>> {
        keys::gone(pool, sql, ids)
    }

    fn requeued<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c super::TableSql<Self>,
        ids: &'c [Arg<'c>],
    ) -> BoxFuture<'c, Result<(), sqlx::Error>> {
        keys::requeued(conn, sql, ids)
    }
}

impl Claiming for MySql {
    /// The keys' table: see the `keys` module.
    fn key_free(table: &QueueTable) -> String {
        keys::key_free(table)
    }

    const LEASE_CLAIM_BEGIN: &'static str = "BEGIN";

    const LOCKED_CLAIM_BEGIN: &'static str = "BEGIN";

    /// The locking read of a claim, from the group's floor, unless paused or held behind
    /// an earlier message of its key; [`claim`](Self::claim) marks the rows it returns.
    /// InnoDB reads the key check's subquery without locking it (checked: a locked earlier
    /// row still holds its key), so `SKIP LOCKED` skips only candidates; and from the
    /// statement's snapshot, so the claim checks its keyed rows again (`keys::recheck`).
    ///
    /// Two parts in claim order: the rows of the floor's priority from its time, and,
    /// while the floor says some may wait, those of other priorities (each with binds
    /// group, group, priority, floor µs, group, [others 1 or 0,] limit; then the limit).
    /// Under a consistent snapshot held elsewhere the purge removes no acknowledged row,
    /// and InnoDB steps over delete-marked records one by one, also past the end of a
    /// range until it meets a live record: a claim of 8 after 50,000 acknowledged messages
    /// read every page of them (7-15 ms) from the group's start, 6 pages from the floor.
    /// The group is written as a range, `group_name >= ? AND group_name <= ?`: with an
    /// equality MariaDB read it with `ref` on (group, priority) and filtered `visible_at`,
    /// the statistics seeing no delete-marked record; and the other priorities are a part of
    /// their own, read only while rows wait there (`? = 1`), since the range of the more
    /// urgent ones ends where the floor's priority's delete-marked records begin. While
    /// none waits there, the first part runs alone (`floor_part`).
    fn claim_sql(table: &QueueTable) -> String {
        let (t, since) = (super::quoted::<Self>(table, ""), Self::from_micros("?"));
        let part = |priority: &str, only: &str| {
            format!(
                "(SELECT {CLAIMED}, visible_at AS claim_at FROM {t} AS q WHERE group_name >= ? AND group_name <= ? \
                 AND {priority} AND visible_at >= {since} AND {} AND visible_at <= UTC_TIMESTAMP(6) \
                 AND (lease_until IS NULL OR lease_until <= UTC_TIMESTAMP(6)) AND {} AND {}{only} \
                 ORDER BY group_name, priority, visible_at, id LIMIT ? FOR UPDATE SKIP LOCKED)",
                Self::not_paused(table, "?"),
                Self::not_limited_in_claim(table),
                Self::key_free(table)
            )
        };
        format!(
            "{} UNION ALL {} ORDER BY 6, claim_at, 1 LIMIT ?",
            part("priority = ?", ""),
            part("priority <> ?", " AND ? = 1")
        )
    }

    /// Only locks: MySQL cannot delete from the table it selects the rows from, so
    /// [`take_locked`](Self::take_locked) deletes them next.
    fn claim_locked_sql(table: &QueueTable) -> String {
        Self::claim_sql(table)
    }

    /// No `UPDATE ... RETURNING`: `SELECT ... FOR UPDATE SKIP LOCKED`, then a mark of
    /// the rows, in the caller's transaction.
    fn claim<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c super::TableSql<Self>,
        group: &'c str,
        limit: i64,
        lease: i64,
        token: i64,
        floor: Floor,
    ) -> BoxFuture<'c, Result<Vec<ClaimedRow>, sqlx::Error>> {
        lease_claim(conn, sql, &sql.claim, 1, group, limit, lease, token, floor)
    }

    /// The plain claim's shape: the locking read, the keyed rows checked again with
    /// `per_key`, the mark.
    fn claim_limited<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c TableSql<Self>,
        claim: &'c Arc<str>,
        per_key: i64,
        group: &'c str,
        limit: i64,
        lease: i64,
        token: i64,
        floor: Floor,
    ) -> BoxFuture<'c, Result<Vec<ClaimedRow>, sqlx::Error>> {
        lease_claim(conn, sql, claim, per_key, group, limit, lease, token, floor)
    }

    /// Claims on a Galera node stop taking from the head and keep to their lane for
    /// [`HOLD`]: see there.
    fn claim_conflicted() {
        if LANES.load(Ordering::Relaxed) {
            LANE_DRY_UNTIL.store(0, Ordering::Relaxed);
            HELP_HELD_UNTIL.store(lane_clock().saturating_add(span_us(HOLD)), Ordering::Relaxed);
        }
    }

    fn take_locked<'c>(
        conn: &'c mut Self::Connection,
        sql: &'c super::TableSql<Self>,
        group: &'c str,
        limit: i64,
        floor: Floor,
    ) -> BoxFuture<'c, Result<Vec<ClaimedRow>, sqlx::Error>> {
        Box::pin(async move {
            let rows = claim_in_lanes(conn, &sql.claim_locked, &sql.quoted, group, limit, floor).await?;
            let rows = keys::recheck(conn, sql, rows, 1).await?;
            for chunk in rows.chunks(ACK_BATCH) {
                let delete = sql.delete_ids(chunk.len());
                let args: Vec<Arg<'_>> = chunk.iter().map(|row| Arg::Int(row.id)).collect();
                Self::execute(conn, &delete, &args).await?;
            }
            if !rows.is_empty() {
                Self::simple(conn, Self::HANDLER_SAVEPOINT).await?;
            }
            Ok(rows)
        })
    }
}

impl Waking for MySql {
    fn check_channel(channel: &str) -> Result<(), Error> {
        Ok(notify_table::check_channel(channel).map(drop)?)
    }

    fn notify_sql(notifier: &Notifier, channel: &str, payload: &str) -> Result<Statement, Error> {
        Ok(notifier.mysql.notify_sql(channel, payload)?)
    }

    fn notify_table(notifier: &Notifier) -> Option<&NotifyTable> {
        Some(&notifier.mysql)
    }
}

impl Connecting for MySql {
    fn connect_pool(url: &str, max: u32, _create: bool) -> BoxFuture<'static, Result<Pool<Self>, Error>> {
        let url = url.to_owned();
        Box::pin(async move {
            // A direct connection first fails fast with the real cause (a pool would
            // report only its acquire timeout).
            // It also picks the host: sqlx pools take one set of connect options, so the
            // pool starts on that host (and moves, with several hosts: `follow`).
            let (conn, host) = connect(&url).await?;
            conn.close().await.map_err(connect_error(&host))?;
            let pool = pool_options::<Self>(max).after_connect(|conn, _| Box::pin(session(conn)));
            let pool = pool.connect_with(options(&host)?).await.map_err(connect_error(&host))?;
            if Hosts::parse(&url)?.hosts.len() > 1 {
                follow(
                    pool.clone(),
                    |pool| async move { sqlx::query("SELECT 1").execute(&pool).await.is_ok() },
                    move || {
                        let url = url.clone();
                        async move {
                            let (conn, host) = connect(&url).await?;
                            conn.close().await.map_err(connect_error(&host))?;
                            options(&host)
                        }
                    },
                );
            }
            Ok(pool)
        })
    }

    fn wrap(pool: Pool<Self>) -> DbPool {
        DbPool::MySql(pool)
    }

    type ListenConn = MySqlConnection;
}

impl Catalog for MySql {
    const QUALIFIER_IS_DATABASE: bool = true;
    const CATALOG_HIDES_UNGRANTED: bool = true;

    fn schema_exists_sql() -> &'static str {
        "SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.schemata WHERE schema_name = ?"
    }

    fn find_table_sql(schema: Option<&str>, name: &str) -> (String, Vec<String>) {
        let (in_schema, mut binds) = match schema {
            Some(schema) => ("?", vec![schema.to_owned()]),
            None => ("DATABASE()", vec![]),
        };
        binds.push(name.to_owned());
        binds.extend(binds.clone());
        let sql = format!(
            "SELECT CAST(COALESCE((SELECT GROUP_CONCAT(column_name) FROM information_schema.columns \
             WHERE table_schema = {in_schema} AND table_name = ? AND column_name IN ({})), '') AS CHAR), \
             (SELECT CAST(COUNT(*) AS SIGNED) FROM information_schema.tables \
             WHERE table_schema = {in_schema} AND table_name = ? AND table_type = 'BASE TABLE')",
            super::table::known_columns()
        );
        (sql, binds)
    }

    fn queue_tables_sql() -> String {
        format!(
            "SELECT CAST(c.table_name AS CHAR) FROM information_schema.columns c \
             JOIN information_schema.tables t \
             ON t.table_schema = c.table_schema AND t.table_name = c.table_name AND t.table_type = 'BASE TABLE' \
             WHERE c.table_schema = DATABASE() AND c.column_name IN ({}) \
             GROUP BY c.table_name \
             HAVING COUNT(DISTINCT c.column_name) = {} \
             ORDER BY 1",
            super::table::column_list(&super::QUEUE_COLUMNS),
            super::QUEUE_COLUMNS.len()
        )
    }

    fn states(ready: &str, in_flight: &str) -> (String, String) {
        (format!("CAST(SUM({ready}) AS SIGNED)"), format!("CAST(SUM(COALESCE({in_flight}, 0)) AS SIGNED)"))
    }

    fn age_of(expr: &str) -> String {
        format!("CAST(TIMESTAMPDIFF(MICROSECOND, {expr}, UTC_TIMESTAMP(6)) AS SIGNED)")
    }

    /// The table's `AUTO_INCREMENT` (the next id) less one. MariaDB reads it from InnoDB
    /// each time; MySQL 8 caches it for `information_schema_stats_expiry` seconds (a day by
    /// default), hence [`PUBLISHED_TOTAL_FRESH`](Self::PUBLISHED_TOTAL_FRESH).
    fn published_total_sql(table: &QueueTable) -> (String, Vec<String>) {
        let (in_schema, mut binds) = match table.schema() {
            Some(schema) => ("?", vec![schema.to_owned()]),
            None => ("DATABASE()", vec![]),
        };
        binds.push(table.name().to_owned());
        let sql = format!(
            "SELECT CAST(COALESCE(auto_increment, 1) - 1 AS SIGNED) FROM information_schema.tables \
             WHERE table_schema = {in_schema} AND table_name = ? AND table_type = 'BASE TABLE'"
        );
        (sql, binds)
    }

    /// MySQL 8 reads the statistics from the storage engine with this; MariaDB has no such
    /// variable (and needs none), and refuses it.
    const PUBLISHED_TOTAL_FRESH: Option<&'static str> =
        Some("SET SESSION information_schema_stats_expiry = 0");
}

impl Keeping for MySql {
    /// Through [`by_ids`], which see.
    fn move_by_id(t: &str, h: &str, which: ById, outcome: &str) -> Vec<String> {
        super::history::copy_then::<Self>(
            h,
            &by_ids(t, which),
            Self::delete_by_id(t, which),
            outcome,
            "last_error",
        )
    }

    /// `INSERT IGNORE`: MySQL has no `ON CONFLICT`.
    /// Clustered on `(handled_at, id)`: the order the cleanup deletes in and `history`
    /// reads in, with no secondary index to write and no hidden row id (InnoDB hands
    /// those out under one server-wide mutex). A message is in one settlement at a time,
    /// and a settlement's rows share its statement's time, so no key repeats.
    fn create_history(table: &QueueTable) -> Vec<String> {
        let group = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL";
        vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {} (\n\
                 \x20 `id` BIGINT UNSIGNED NOT NULL,\n\
                 \x20 `group_name` {group},\n\
                 \x20 `payload` LONGBLOB NOT NULL,\n\
                 \x20 `attempts` INT NOT NULL,\n\
                 \x20 `created_at` DATETIME(6) NOT NULL,\n\
                 \x20 `outcome` VARCHAR(16) NOT NULL,\n\
                 \x20 `handled_at` DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),\n\
                 \x20 `last_error` TEXT NULL,\n\
                 \x20 PRIMARY KEY (`handled_at`, `id`)\n\
                 ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
                super::quoted::<Self>(table, super::HISTORY_SUFFIX)
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {} (`id` SMALLINT NOT NULL PRIMARY KEY, `keep_us` BIGINT NOT NULL) \
                 ENGINE=InnoDB",
                super::quoted::<Self>(table, super::KEEP_SUFFIX)
            ),
        ]
    }

    fn prune_history_sql(h: &str, cutoff: &str, limit: &str) -> String {
        format!("DELETE FROM {h} WHERE `handled_at` < {cutoff} ORDER BY `handled_at` LIMIT {limit}")
    }
}

impl super::Counting for MySql {
    fn create_counts(table: &QueueTable) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\n\
             \x20 `name` VARCHAR(64) CHARACTER SET ascii COLLATE ascii_bin NOT NULL PRIMARY KEY,\n\
             \x20 `n` BIGINT NOT NULL\n\
             ) ENGINE=InnoDB",
            super::quoted::<Self>(table, super::COUNTS_SUFFIX)
        )
    }
}

impl Pausing for MySql {
    fn create_pause(table: &QueueTable) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (\n\
             \x20 `whole_queue` BIGINT NOT NULL,\n\
             \x20 `group_name` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,\n\
             \x20 `paused_at` DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),\n\
             \x20 PRIMARY KEY (`whole_queue`, `group_name`)\n\
             ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
            super::quoted::<Self>(table, super::PAUSE_SUFFIX)
        )
    }
}

impl Limiting for MySql {
    fn create_limits(table: &QueueTable) -> Vec<String> {
        let group = "VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL";
        vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {} (\n\
                 \x20 `whole_queue` BIGINT NOT NULL,\n\
                 \x20 `group_name` {group},\n\
                 \x20 `max_running` BIGINT NULL,\n\
                 \x20 `per_key` BIGINT NULL,\n\
                 \x20 `rate_count` BIGINT NULL,\n\
                 \x20 `rate_period_us` BIGINT NULL,\n\
                 \x20 `rate_burst` BIGINT NULL,\n\
                 \x20 `rate_next_us` BIGINT NULL,\n\
                 \x20 PRIMARY KEY (`whole_queue`, `group_name`)\n\
                 ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
                super::quoted::<Self>(table, super::LIMITS_SUFFIX)
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {} (\n\
                 \x20 `whole_queue` BIGINT NOT NULL,\n\
                 \x20 `group_name` {group},\n\
                 \x20 `started_us` BIGINT NOT NULL,\n\
                 \x20 `id` BIGINT NOT NULL,\n\
                 \x20 `lease` BIGINT NOT NULL,\n\
                 \x20 PRIMARY KEY (`whole_queue`, `group_name`, `started_us`, `id`)\n\
                 ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
                super::quoted::<Self>(table, super::STARTS_SUFFIX)
            ),
        ]
    }

    /// The candidate's own group: the claim's binds are positional, and the group's
    /// placeholder is bound twice already.
    fn not_limited_in_claim(table: &QueueTable) -> String {
        Self::not_limited(table, "q.group_name")
    }

    /// Against the keys' table, as [`key_free`](Claiming::key_free) is here.
    fn key_within(table: &QueueTable, n: i64) -> String {
        keys::key_within(table, n)
    }
}

impl Scheduling for MySql {
    fn create_schedules(table: &QueueTable) -> Vec<String> {
        vec![
            format!(
                "CREATE TABLE IF NOT EXISTS {} (\n\
                 \x20 `name` VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,\n\
                 \x20 `cron` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,\n\
                 \x20 `payload` MEDIUMTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,\n\
                 \x20 `group_name` VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,\n\
                 \x20 `every_us` BIGINT NOT NULL,\n\
                 \x20 `since_us` BIGINT NOT NULL,\n\
                 \x20 `version` BIGINT NOT NULL,\n\
                 \x20 PRIMARY KEY (`name`)\n\
                 ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
                super::quoted::<Self>(table, super::SCHED_SUFFIX)
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {} (\n\
                 \x20 `schedule_name` VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,\n\
                 \x20 `tick_us` BIGINT NOT NULL,\n\
                 \x20 `published_at` DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)),\n\
                 \x20 PRIMARY KEY (`schedule_name`, `tick_us`)\n\
                 ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4",
                super::quoted::<Self>(table, super::TICKS_SUFFIX)
            ),
        ]
    }
}

impl Positions for MySql {
    /// `channel` and `name` are binary: their comparisons are exact (the notify table's
    /// `utf8mb4_bin` pads trailing spaces, and would make `jobs ` and `jobs` one key).
    fn create_positions(t: &str) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {t} (\n\
             \x20 `channel` VARBINARY(1020) NOT NULL,\n\
             \x20 `name` VARBINARY(1020) NOT NULL,\n\
             \x20 `position` MEDIUMTEXT CHARACTER SET utf8mb4 NOT NULL,\n\
             \x20 `first_unread` BIGINT NOT NULL,\n\
             \x20 `owner` BIGINT NOT NULL,\n\
             \x20 `checked_in` BIGINT NOT NULL,\n\
             \x20 `lease` BIGINT NOT NULL DEFAULT 0,\n\
             \x20 PRIMARY KEY (`channel`, `name`)\n\
             ) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4"
        )
    }
}

impl TableConn for MySqlConnection {
    type Db = MySql;

    async fn rows(
        &mut self,
        stmt: &Statement,
        texts: usize,
    ) -> Result<Vec<crate::driver::TextsAndInts>, sqlx::Error> {
        MySql::fetch_rows(self, &stmt.sql, &crate::driver::args_of(stmt), texts).await
    }

    fn dialect() -> NotifyDialect {
        NotifyDialect::MySql
    }

    async fn open(url: &str) -> Result<(Self, String), Error> {
        connect(url).await
    }

    /// The binary log, where the `binlog` feature is on (see `push/binlog.rs`).
    fn push(_at: &str, _table: &str, _retry: (Duration, Duration)) -> Option<PushHandle> {
        #[cfg(feature = "binlog")]
        {
            let target = super::push::binlog::Target { url: _at.to_owned(), table: _table.to_owned() };
            Some(super::push::spawn::<super::push::binlog::Binlog>(
                "the binary log",
                target,
                _retry.0,
                _retry.1,
            ))
        }
        #[cfg(not(feature = "binlog"))]
        None
    }

    async fn session_id(&mut self) -> Result<Option<u64>, Error> {
        Ok(Some(sqlx::query_scalar("SELECT CONNECTION_ID()").fetch_one(self).await?))
    }

    async fn fetch(&mut self, stmt: &Statement) -> Result<Vec<Row>, sqlx::Error> {
        let rows = MySql::statement(stmt).fetch_all(self).await?;
        rows.iter()
            .map(|r| {
                Ok(Row {
                    id: r.try_get(0)?,
                    channel: r.try_get(1)?,
                    payload: r.try_get(2)?,
                    pid: r.try_get(3)?,
                    cutoff: r.try_get(4)?,
                    at: r.try_get(5)?,
                })
            })
            .collect()
    }

    async fn execute(&mut self, stmt: &Statement) -> Result<u64, sqlx::Error> {
        Ok(MySql::statement(stmt).execute(self).await?.rows_affected())
    }

    async fn fetch_ids(&mut self, stmt: &Statement) -> Result<Vec<u64>, sqlx::Error> {
        MySql::statement(stmt).fetch_all(self).await?.iter().map(|r| r.try_get(0)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::{InsertForm, TableSql};

    fn sql(name: &str) -> TableSql<MySql> {
        TableSql::new(&name.parse().unwrap()).unwrap()
    }

    #[test]
    fn claims_walk_the_clustered_key() {
        let t = sql("jobs");
        assert!(t.create[0].contains("PRIMARY KEY (`group_name`, `priority`, `visible_at`, `id`)"));
        assert!(t.create[0].contains("UNIQUE KEY `jobs_id` (`id`)"));
        assert!(!t.create[0].contains("`jobs_dedup`"), "deduplication ids have a table of their own");
        assert!(t.create[2].starts_with("CREATE TABLE IF NOT EXISTS `jobs_dedup`"));
        assert!(!t.create[0].contains("msg_key`, `id`"), "keys have a table of their own");
        assert!(t.create[3].starts_with("CREATE TABLE IF NOT EXISTS `jobs_keys`"));
        assert!(
            t.claim.contains("ORDER BY group_name, priority, visible_at, id LIMIT ? FOR UPDATE SKIP LOCKED)")
        );
        assert!(t.claim.ends_with(") ORDER BY 6, claim_at, 1 LIMIT ?"));
        assert!(t.claim_locked.starts_with("(SELECT CAST(id AS SIGNED)"));
        // The binds: group, group, priority, floor, group (pause), limit for the floor's
        // priority; the same and the flag for the others; the limit.
        assert_eq!(t.claim.matches('?').count(), 14);
        assert_eq!(claim_mark("`jobs`", 2).matches('?').count(), 4);
        assert_eq!(
            &*t.delete_ids(2),
            "DELETE q FROM JSON_TABLE(JSON_ARRAY(?, ?), '$[*]' COLUMNS (rowbus_id BIGINT PATH '$')) AS s \
             STRAIGHT_JOIN `jobs` AS q ON q.id = s.rowbus_id"
        );
    }

    #[test]
    fn a_lane_claim_adds_the_lane_to_the_claim_of_the_table() {
        let t = sql("app.jobs");
        let mine = lane_claim(&t.claim, &t.quoted, true, 4);
        let others = lane_claim(&t.claim, &t.quoted, false, 4);
        // Every part keeps to the lane; the outer limit bounds what the statement reads.
        let expected = t
            .claim
            .replace("WHERE group_name", &format!("WHERE {LANE} AND group_name"))
            .replace("claim_at, 1 LIMIT ?", "claim_at, 1 LIMIT ? ROWS EXAMINED 128");
        assert_eq!(*mine, *expected);
        assert_eq!(
            *others,
            *t.claim.replace("WHERE group_name", &format!("WHERE NOT ({LANE}) AND group_name"))
        );
        // The binds are the claim's: the lane reads the session's variables.
        assert_eq!(mine.matches('?').count(), t.claim.matches('?').count());
        assert_eq!(lane_claim(&t.claim_locked, &t.quoted, true, 4), mine);
        assert_eq!(lane_scan(100), 1_664);
    }

    #[test]
    fn a_conflict_keeps_claims_to_their_lane_until_the_hold_ends() {
        // Nothing set: the lane, topped up from the other lanes when short.
        assert_eq!(plan(5, 0, 0), Plan::Lane { held: false });
        // A short lane claim at 5 (dry until 10): from the head meanwhile.
        assert_eq!(plan(7, 10, 0), Plan::Head);
        assert_eq!(plan(10, 10, 0), Plan::Lane { held: false });
        // A conflict at 7 (head claims end; held until 12): the lane alone until then.
        assert_eq!(plan(8, 0, 12), Plan::Lane { held: true });
        assert_eq!(plan(12, 0, 12), Plan::Lane { held: false });
    }

    #[test]
    fn acknowledgements_find_rows_by_id() {
        let t = sql("app.jobs");
        assert_eq!(t.quoted, "`app`.`jobs`");
        assert_eq!(
            t.ack_pairs(2),
            "DELETE q FROM JSON_TABLE(JSON_ARRAY(?, ?), '$[*]' COLUMNS (rowbus_id BIGINT PATH '$')) AS s \
             STRAIGHT_JOIN `app`.`jobs` AS q ON q.id = s.rowbus_id WHERE (q.id, q.lease) IN ((?, ?), (?, ?))"
        );
        // The token's bind comes first, as the other databases' statement has it.
        assert_eq!(
            t.ack_many(1),
            "DELETE q FROM (SELECT ? AS rowbus_lease) AS l STRAIGHT_JOIN JSON_TABLE(JSON_ARRAY(?), '$[*]' \
             COLUMNS (rowbus_id BIGINT PATH '$')) AS s STRAIGHT_JOIN `app`.`jobs` AS q ON q.id = s.rowbus_id \
             AND q.lease = l.rowbus_lease"
        );
        assert_eq!(t.dead_restore(3).matches('?').count(), 27);
        assert!(
            t.dead_restore(1)
                .starts_with("INSERT INTO `app`.`jobs_dead` (id, group_name, payload, attempts, created_at")
        );
        assert_eq!(t.insert(3).matches('?').count(), 18);
        assert!(t.insert_dedup.starts_with("INSERT IGNORE INTO `app`.`jobs` ("));
        assert_eq!(
            t.insert_plain(1),
            "INSERT INTO `app`.`jobs` (group_name, payload, visible_at) VALUES (?, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)"
        );
        assert_eq!(t.insert_payload(2), "INSERT INTO `app`.`jobs` (payload) VALUES (?), (?)");
    }

    #[test]
    fn history_moves_and_cancels_find_rows_by_id() {
        let t = sql("jobs");
        let ids = "JSON_TABLE(JSON_ARRAY(?, ?), '$[*]' COLUMNS (rowbus_id BIGINT PATH '$')) AS s \
                   STRAIGHT_JOIN `jobs` AS q ON q.id = s.rowbus_id";
        let moved = t.history.of_claim(2, super::super::Moved::Dropped);
        let claim =
            format!("(SELECT ? AS rowbus_lease) AS l STRAIGHT_JOIN {ids} AND q.lease = l.rowbus_lease");
        assert_eq!(
            moved,
            [
                format!(
                    "INSERT INTO `jobs_hist` (id, group_name, payload, attempts, created_at, outcome, last_error) \
                     SELECT id, group_name, payload, attempts, created_at, 'dropped', last_error FROM {claim} FOR UPDATE"
                ),
                format!("DELETE q FROM {claim}"),
            ]
        );
        // Both statements take the same binds: the token, then the ids.
        assert!(moved.iter().all(|s| s.matches('?').count() == 3));
        let pairs = t.history.ack_pairs(2);
        assert!(
            pairs[0].ends_with(&format!("FROM {ids} WHERE (q.id, q.lease) IN ((?, ?), (?, ?)) FOR UPDATE"))
        );
        assert_eq!(pairs[1], format!("DELETE q FROM {ids} WHERE (q.id, q.lease) IN ((?, ?), (?, ?))"));
        assert_eq!(t.history.cancel_ids(2)[1], format!("DELETE q FROM {ids}"));
        assert!(t.cancel_lock_ids(2).ends_with(&format!("FROM {ids} FOR UPDATE")));
    }

    /// The hand-off's insert: leased, and only where the pause and the limits tables say
    /// nothing of its group; without `RETURNING`, which MySQL lacks.
    #[test]
    fn a_hand_off_stores_leased_unless_paused_or_limited() {
        let t = sql("jobs");
        assert_eq!(
            &*t.hand_off,
            "INSERT INTO `jobs` (group_name, payload, priority, headers, attempts, lease, lease_until) \
             SELECT ?, ?, ?, ?, 1, ?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND FROM DUAL \
             WHERE NOT EXISTS (SELECT 1 FROM `jobs_pause` WHERE whole_queue = 1 OR group_name = ?) \
             AND NOT EXISTS (SELECT 1 FROM `jobs_limits` WHERE whole_queue = 1 OR group_name = ?)"
        );
    }

    #[test]
    fn inserts_are_built_once_per_form_and_size() {
        let t = sql("jobs");
        for form in [InsertForm::Payload, InsertForm::Plain, InsertForm::Full] {
            let sql = t.insert_sql(form, 3);
            assert!(Arc::ptr_eq(&sql, &t.insert_sql(form, 3)), "{form:?} kept");
            assert_eq!(sql.matches('?').count(), 3 * form.binds().1, "{form:?}: {sql}");
        }
        assert_eq!(&*t.insert_sql(InsertForm::Full, 2), t.insert(2));
        assert_eq!(&*t.insert_sql(InsertForm::Payload, 1), t.insert_payload(1));
        // Beyond what is kept, still the right statement.
        for rows in 1..100 {
            assert_eq!(&*t.insert_sql(InsertForm::Plain, rows), t.insert_plain(rows));
        }
    }
}
