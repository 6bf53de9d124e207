//! PostgreSQL's queue table: a ring of partitions that a broker empties by `TRUNCATE`, and
//! claims that start at their group's floor; the conversion of a table deployed before;
//! deduplication ids checked under an advisory lock (a partitioned table has no unique
//! index that is not per partition).
//!
//! Why: under a transaction held open elsewhere (a REPEATABLE READ report, `pg_dump`, a
//! replica's feedback), VACUUM removes none of the two dead row versions each message
//! leaves (the claim's update, the acknowledgement's delete). Measured on a plain queue
//! table with 1,000 messages a second: +16 MB a minute and 2 dead tuples per message, for
//! as long as the transaction stayed open, and a claim of 8 rows after 32,000 settled
//! messages read 5,600 buffers in 5.9 ms, stepping over each dead index entry to check
//! its row. `TRUNCATE` frees a partition's space whatever holds the horizon; a claim that
//! starts at `(priority, visible_at) >= floor` reads 3 buffers in 0.05 ms over the same
//! index (see `sql::rotation`).

use std::sync::Arc;

use sqlx::Postgres;

use super::super::rotation::{Retire, RotationSql};
use super::super::{DEDUP, KEYS, Limiting, Naming, Pausing, READY, quoted};
use crate::names::QueueTable;

/// A primary key on `id` alone per partition, rather than one on `(id, slot)` across them
/// (a key of a partitioned table must hold its partition key): with ids unique in the
/// index, the planner takes a statement by ids (an acknowledgement of 200 messages) for
/// one row an id, and reads the partition's key. Keyed by `(id, slot)`, unanalyzed (the
/// partitions are emptied every few seconds) it guessed 92 rows for the 200 ids and read
/// the whole partition instead, dead rows included, at every acknowledgement: a drain of
/// 40,000 messages ran 214 sequential scans reading 4.3 million rows, and took 2.5 s
/// where a plain table took 1.9 s; keyed by `id`, 1.9 s.
///
/// The conversion of a partitioned table deployed with the key across partitions: whether
/// it is one (binds: the table, quoted), and the statement that moves its key.
pub(super) fn key_per_partition(table: &QueueTable) -> (String, Vec<String>, Vec<String>) {
    let t = quoted::<Postgres>(table, "");
    let check = "SELECT COUNT(*) FROM pg_constraint c JOIN pg_class r ON r.oid = c.conrelid \
                 WHERE c.conrelid = to_regclass($1) AND c.contype = 'p' AND r.relkind = 'p'"
        .to_owned();
    let adds: String = PARTITIONS
        .iter()
        .map(|p| format!("\x20 ALTER TABLE {} ADD PRIMARY KEY (id);\n", quoted::<Postgres>(table, p)))
        .collect();
    // Identifiers are validated (no quotes in them), so they go into literals as they are.
    let convert = format!(
        "DO $rowbus$\n\
         DECLARE\n\
         \x20 key name;\n\
         BEGIN\n\
         \x20 SELECT conname INTO key FROM pg_constraint WHERE conrelid = {tl}::regclass AND contype = 'p';\n\
         \x20 EXECUTE format('ALTER TABLE %s DROP CONSTRAINT %I', {tl}, key);\n\
         {adds}\
         END $rowbus$",
        tl = literal(&t),
    );
    (check, vec![t], vec![convert])
}

/// The partitions of a queue table: publishes fill each in turn for [`SLOT_SECONDS`], so
/// each is filled again every `SLOTS * SLOT_SECONDS`. A partition is retired (emptied)
/// once it is neither the one filled now nor the one filled just before, so each gets
/// two periods to be retired before it is filled again.
pub(in crate::sql) const SLOTS: usize = 4;

/// How long publishes fill one partition. At 1,000 messages a second a partition takes in
/// 5,000 messages, 10,000 dead row versions once they are handled, about 1.5 MB: within
/// the dead rows and size a queue table keeps between two autovacuum runs when nothing
/// holds the horizon. Shorter periods retire more often, and each `TRUNCATE` writes new
/// catalog rows (the partition's and its indexes' `pg_class` rows), which a held horizon
/// keeps too.
const SLOT_SECONDS: u32 = 5;

/// The name suffixes of the partitions, in slot order.
pub(in crate::sql) const PARTITIONS: [&str; SLOTS] = ["_p0", "_p1", "_p2", "_p3"];

/// Half of each page of a partition is left free at insert, so that a claim writes each
/// row's leased version beside it: no column a claim sets is indexed, and an update that
/// finds room on its page is a heap-only one, which inserts into no index. With pages
/// filled, a claim moves every row to another page and inserts it into the primary key
/// and the ready index again. Measured here, 30 claims of 1,000 rows from 100,000, each
/// committed and its rows deleted: 23-26 ms a claim at the default 100, 10-12 ms at 50
/// (87% heap-only: a claimed row grows by its lease columns), 9 ms at 30 (all of them),
/// 20-21 ms at 70.
const QUEUE_FILLFACTOR: u8 = 50;

/// The priority column: lower is claimed sooner.
pub(super) const PRIORITY: &str = "SMALLINT NOT NULL DEFAULT 0";

/// What a claim returns: id, group, payload, attempts, created_at µs, priority, key,
/// dedup id, headers.
const CLAIMED: &str = "id, group_name, payload, attempts::BIGINT, (EXTRACT(EPOCH FROM created_at) * 1000000)::BIGINT, \
     priority::BIGINT, msg_key, dedup_id, headers";

/// Every column of a queue table but `slot`: what moves with a row.
const COLUMNS: &str = "id, group_name, priority, msg_key, dedup_id, headers, payload, attempts, visible_at, lease, \
     lease_until, created_at, last_error";

/// The name a table deployed before partitions takes while it is converted (deploys run
/// one at a time, under one advisory key for the whole database).
const CONVERTING: &str = "rowbus_converting";

/// How long a retiring transaction waits for its partition's lock: while it waits,
/// statements on the queue queue behind it, so briefly; a partition it could not lock is
/// tried again at a later pass.
const RETIRE_LOCK_WAIT: &str = "BEGIN; SET LOCAL lock_timeout = '50ms'";

/// The slot publishes fill now, by the database's clock: `slot`'s default.
fn slot_now() -> String {
    format!("(floor(extract(epoch FROM clock_timestamp()) / {SLOT_SECONDS})::BIGINT % {SLOTS})::SMALLINT")
}

/// The table, its partitions, its indexes and its dead-letter table, if missing.
pub(super) fn create_queue(table: &QueueTable) -> Vec<String> {
    let (t, dead) = (quoted::<Postgres>(table, ""), quoted::<Postgres>(table, "_dead"));
    // PostgreSQL puts the index in the table's schema by itself.
    let index = |suffix: &str| Postgres::quote(&format!("{}{suffix}", table.name()));
    let mut create: Vec<String> = table
        .schema()
        .map(|s| format!("CREATE SCHEMA IF NOT EXISTS {}", Postgres::quote(s)))
        .into_iter()
        .collect();
    create.push(format!(
        "CREATE TABLE IF NOT EXISTS {t} (\n\
         \x20 id BIGINT GENERATED BY DEFAULT AS IDENTITY,\n\
         \x20 group_name TEXT NOT NULL DEFAULT '',\n\
         \x20 priority {PRIORITY},\n\
         \x20 msg_key TEXT,\n\
         \x20 dedup_id TEXT,\n\
         \x20 headers TEXT,\n\
         \x20 payload BYTEA NOT NULL,\n\
         \x20 attempts INTEGER NOT NULL DEFAULT 0,\n\
         \x20 visible_at TIMESTAMPTZ NOT NULL DEFAULT now(),\n\
         \x20 lease BIGINT,\n\
         \x20 lease_until TIMESTAMPTZ,\n\
         \x20 created_at TIMESTAMPTZ NOT NULL DEFAULT now(),\n\
         \x20 last_error TEXT,\n\
         \x20 slot SMALLINT NOT NULL DEFAULT {}\n\
         ) PARTITION BY LIST (slot)",
        slot_now()
    ));
    for (slot, suffix) in PARTITIONS.iter().enumerate() {
        create.push(format!(
            "CREATE TABLE IF NOT EXISTS {} PARTITION OF {t} (PRIMARY KEY (id)) FOR VALUES IN ({slot}) \
             WITH (fillfactor = {QUEUE_FILLFACTOR})",
            quoted::<Postgres>(table, suffix)
        ));
    }
    create.extend([
        format!("CREATE INDEX IF NOT EXISTS {} ON {t} (group_name, priority, visible_at, id)", index(READY)),
        format!("CREATE INDEX IF NOT EXISTS {} ON {t} (msg_key, id) WHERE msg_key IS NOT NULL", index(KEYS)),
        format!("CREATE INDEX IF NOT EXISTS {} ON {t} (dedup_id) WHERE dedup_id IS NOT NULL", index(DEDUP)),
        format!(
            "CREATE TABLE IF NOT EXISTS {dead} (\n\
             \x20 id BIGINT PRIMARY KEY,\n\
             \x20 group_name TEXT NOT NULL,\n\
             \x20 priority {PRIORITY},\n\
             \x20 msg_key TEXT,\n\
             \x20 headers TEXT,\n\
             \x20 payload BYTEA NOT NULL,\n\
             \x20 attempts INTEGER NOT NULL,\n\
             \x20 created_at TIMESTAMPTZ NOT NULL,\n\
             \x20 failed_at TIMESTAMPTZ NOT NULL DEFAULT now(),\n\
             \x20 last_error TEXT\n\
             )"
        ),
    ]);
    create
}

/// A table deployed before queue tables were partitioned, converted in the deploy's
/// transaction: whether it is one (binds: the table, quoted), and the one statement that
/// converts it. Rows keep every column (ids, leases, attempts, errors), so a message in
/// flight is acknowledged by its holder as before; the id sequence goes on from where it
/// was; the table's grants and triggers (a wake-up trigger, say) are made again on the
/// new one, the grants on its partitions too. The old table is dropped: a view on it
/// makes the conversion fail, and the deploy with it, leaving the table as it was.
pub(super) fn conversion(table: &QueueTable) -> (String, Vec<String>, Vec<String>) {
    let t = quoted::<Postgres>(table, "");
    let check = "SELECT COUNT(*) FROM pg_class WHERE oid = to_regclass($1) AND relkind = 'r'".to_owned();
    let old = match table.schema() {
        Some(schema) => format!("{}.{}", Postgres::quote(schema), Postgres::quote(CONVERTING)),
        None => Postgres::quote(CONVERTING),
    };
    let index = |suffix: &str| quoted::<Postgres>(table, suffix);
    let indexes = [READY, KEYS, DEDUP, super::super::OLD_CLAIM].map(index).join(", ");
    let create: String =
        create_queue(table).iter().map(|sql| format!("EXECUTE {};\n", literal(sql))).collect();
    let partitions: Vec<String> = PARTITIONS.iter().map(|p| literal(&quoted::<Postgres>(table, p))).collect();
    // Identifiers are validated (no quotes in them), so they go into literals as they are.
    let convert = format!(
        "DO $rowbus$\n\
         DECLARE\n\
         \x20 triggers text[];\n\
         \x20 grants aclitem[];\n\
         \x20 owner oid;\n\
         \x20 d text;\n\
         \x20 g record;\n\
         \x20 target text;\n\
         \x20 last bigint;\n\
         \x20 called boolean;\n\
         BEGIN\n\
         \x20 SELECT COALESCE(array_agg(pg_get_triggerdef(oid)), '{{}}') INTO triggers\n\
         \x20   FROM pg_trigger WHERE tgrelid = {tl}::regclass AND NOT tgisinternal;\n\
         \x20 SELECT relacl, relowner INTO grants, owner FROM pg_class WHERE oid = {tl}::regclass;\n\
         \x20 ALTER TABLE {t} RENAME TO {converting};\n\
         \x20 DROP INDEX IF EXISTS {indexes};\n\
         {create}\
         \x20 INSERT INTO {t} ({COLUMNS}) SELECT {COLUMNS} FROM {old};\n\
         \x20 IF pg_get_serial_sequence({ol}, 'id') IS NOT NULL THEN\n\
         \x20   EXECUTE format('SELECT last_value, is_called FROM %s', pg_get_serial_sequence({ol}, 'id'))\n\
         \x20     INTO last, called;\n\
         \x20   PERFORM setval(pg_get_serial_sequence({tl}, 'id'), last, called);\n\
         \x20 ELSE\n\
         \x20   SELECT max(id) INTO last FROM {old};\n\
         \x20   IF last IS NOT NULL THEN PERFORM setval(pg_get_serial_sequence({tl}, 'id'), last); END IF;\n\
         \x20 END IF;\n\
         \x20 FOR g IN SELECT a.grantee, a.privilege_type, a.is_grantable FROM aclexplode(grants) AS a\n\
         \x20     WHERE a.grantee <> owner LOOP\n\
         \x20   FOREACH target IN ARRAY ARRAY[{tl}, {parts}] LOOP\n\
         \x20     EXECUTE format('GRANT %s ON %s TO %s%s', g.privilege_type, target,\n\
         \x20       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE g.grantee::regrole::text END,\n\
         \x20       CASE WHEN g.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END);\n\
         \x20   END LOOP;\n\
         \x20 END LOOP;\n\
         \x20 DROP TABLE {old};\n\
         \x20 FOREACH d IN ARRAY triggers LOOP EXECUTE d; END LOOP;\n\
         END $rowbus$",
        tl = literal(&t),
        ol = literal(&old),
        converting = Postgres::quote(CONVERTING),
        parts = partitions.join(", "),
    );
    (check, vec![t], vec![convert])
}

/// `text` as a string literal (it holds no quote of its own but those it doubles).
fn literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The rows a claim may take, in claim order, as a query of their ids (binds: group `$1`,
/// limit `$2`; the floor's priority and time in `priority` and `floor`): those more
/// urgent than the floor's priority visible since its time, then those at or after
/// `(priority, time)`, each part read from where the ready index holds it, and not paused,
/// not limited, not held behind an earlier message of their key.
///
/// Two parts because the floor's start is a btree position, `(group, priority,
/// visible_at)`: the rows of the priority most messages have are read from their floor,
/// more urgent ones (rarer) from their priority's start, filtered by time in the index.
/// The second is read only when the first leaves room: the outer `LIMIT` stops the
/// `UNION ALL` there, and a locking CTE runs only when read.
fn select_ready(table: &QueueTable, priority: &str, floor: &str) -> String {
    let t = quoted::<Postgres>(table, "");
    let since = Postgres::from_micros(floor);
    let ready = format!(
        "group_name = $1 AND visible_at >= {since} AND visible_at <= now() \
         AND (lease_until IS NULL OR lease_until <= now()) AND {} AND {} AND {}",
        Postgres::not_paused(table, "$1"),
        Postgres::not_limited_in_claim(table),
        <Postgres as super::super::Claiming>::key_free(table),
    );
    format!(
        "WITH urgent AS (SELECT id FROM {t} AS q WHERE priority < {priority}::SMALLINT AND {ready} \
         ORDER BY priority, visible_at, id LIMIT $2 FOR UPDATE SKIP LOCKED), \
         rest AS (SELECT id FROM {t} AS q WHERE (priority, visible_at) >= ({priority}::SMALLINT, {since}) AND {ready} \
         ORDER BY priority, visible_at, id LIMIT $2 FOR UPDATE SKIP LOCKED) \
         SELECT id FROM urgent UNION ALL SELECT id FROM rest LIMIT $2"
    )
}

/// The lease claim: binds group, limit, lease µs, token, floor priority, floor µs.
///
/// `= ANY(ARRAY(...))` rather than `IN (...)`: as a prepared statement, PostgreSQL's
/// generic plan for `IN` (LIMIT unknown, guessed at 10% of the table) hash-joined a
/// sequential scan of the whole table against the locked ids on every claim.
pub(super) fn claim_sql(table: &QueueTable) -> String {
    let t = quoted::<Postgres>(table, "");
    format!(
        "UPDATE {t} SET lease_until = {}, lease = $4, attempts = attempts + 1 \
         WHERE id = ANY(ARRAY({})) RETURNING {CLAIMED}",
        Postgres::later("$3"),
        select_ready(table, "$5", "$6")
    )
}

/// The transactional claim: binds group, limit, floor priority, floor µs. The deletion
/// is the lock: other claims skip the rows until this transaction ends, and a commit
/// needs no second statement.
pub(super) fn claim_locked_sql(table: &QueueTable) -> String {
    let t = quoted::<Postgres>(table, "");
    format!("DELETE FROM {t} WHERE id = ANY(ARRAY({})) RETURNING {CLAIMED}", select_ready(table, "$3", "$4"))
}

/// See [`Rotating::floor_sql`](super::super::Rotating::floor_sql). Reads every row of the
/// group (the dead versions a held horizon keeps among them), once a pass of the broker's
/// upkeep rather than once a claim.
pub(super) fn floor_sql(table: &QueueTable) -> String {
    let t = quoted::<Postgres>(table, "");
    format!(
        "SELECT priority::BIGINT, COUNT(*) FILTER (WHERE visible_at <= now()), {} FROM {t} \
         WHERE group_name = $1 AND (lease_until IS NULL OR lease_until <= now()) GROUP BY priority \
         UNION ALL SELECT NULL, NULL, {}",
        Postgres::micros_of("min(visible_at)"),
        Postgres::micros_of("now()")
    )
}

/// The ring's statements (see [`RotationSql`]). A partition's size is its heap's, read
/// from the file without a scan; `to_regclass` makes it NULL where the table is not (yet)
/// partitioned, and the broker then leaves it alone.
pub(super) fn rotation(table: &QueueTable) -> RotationSql {
    let t = quoted::<Postgres>(table, "");
    let sizes: Vec<String> = PARTITIONS
        .iter()
        .map(|p| format!("pg_relation_size(to_regclass({}))", literal(&quoted::<Postgres>(table, p))))
        .collect();
    let look = format!("SELECT {}::BIGINT, {}", slot_now(), sizes.join(", "));
    let retire = PARTITIONS
        .iter()
        .enumerate()
        .map(|(slot, suffix)| {
            let p = quoted::<Postgres>(table, suffix);
            // Never into itself, whatever the clock did meanwhile: into the next slot then.
            let into = format!(
                "CASE WHEN {now} = {slot} THEN {} ELSE {now} END",
                (slot + 1) % SLOTS,
                now = slot_now()
            );
            Retire {
                lock: format!("LOCK TABLE {p} IN ACCESS EXCLUSIVE MODE").into(),
                count: format!(
                    "SELECT pg_relation_size({}), (SELECT COUNT(*) FROM (SELECT 1 FROM {p} LIMIT $1) AS l)",
                    literal(&p)
                )
                .into(),
                moves: format!(
                    "WITH m AS (DELETE FROM {p} RETURNING {COLUMNS}) \
                     INSERT INTO {t} ({COLUMNS}, slot) SELECT {COLUMNS}, {into} FROM m"
                )
                .into(),
                truncate: format!("TRUNCATE {p}").into(),
            }
        })
        .collect();
    RotationSql { slots: SLOTS, begin: RETIRE_LOCK_WAIT, look: look.into(), retire }
}

/// A deduplicated publish's statements, kept with the queue's others.
#[derive(Debug)]
pub struct Dedup {
    /// Binds: the table (quoted), the id. Takes the id's advisory lock until the
    /// transaction ends.
    pub lock: Arc<str>,
    /// Binds: those of `TableSql::insert`, then the id. Stores the message unless one with
    /// the id is in the table.
    pub insert: Arc<str>,
}

/// The statements of [`Dedup`], run one after the other in one transaction at READ
/// COMMITTED: the insert's snapshot, taken after the lock, sees the message of a
/// publisher of the same id that held the lock before (a caller's transaction at
/// REPEATABLE READ took its snapshot earlier, and may store a second message with an id
/// a concurrent publisher stored).
pub(super) fn dedup(table: &QueueTable) -> Dedup {
    let t = quoted::<Postgres>(table, "");
    let p = Postgres::param;
    let lock = "SELECT pg_advisory_xact_lock(hashtextextended($1 || ' ' || $2, 0))";
    let insert = format!(
        "INSERT INTO {t} (group_name, payload, visible_at, priority, msg_key, headers, dedup_id) \
         SELECT {}, {}, {}, {}, {}, {}, {} WHERE NOT EXISTS (SELECT 1 FROM {t} WHERE dedup_id = {})",
        p(1),
        p(2),
        Postgres::later(&p(3)),
        p(4),
        p(5),
        p(6),
        p(7),
        p(7)
    );
    Dedup { lock: lock.into(), insert: insert.into() }
}
