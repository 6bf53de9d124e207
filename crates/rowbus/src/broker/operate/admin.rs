//! Administration: creating and dropping a queue's tables, and reading how queues stand
//! (the catalog, per-group figures, the notify table's size and lag).

use std::sync::Arc;
use std::time::Duration;

use notify_table::{Config as NotifyConfig, Statement};

use crate::broker::exec::{micros as micros_of, queue_error};
use crate::broker::operate::history::keep_statements;
use crate::broker::operate::pause::Paused;
use crate::broker::{Broker, Queue};
use crate::deploy;
pub use crate::deploy::TableState;
use crate::deploy::{DeployOptions, QueueDeploy, fetch_on, find_on, refuse_foreign};
use crate::driver::{Arg, TextsAndInts};
use crate::error::{Error, is_missing_table};
use crate::sql::Db;
use crate::sql::Notifier;
use crate::sql::quoted;
use crate::sql::{EVENTS_SUFFIX, STEPS_SUFFIX, WORKFLOWS_SUFFIX};

/// One group of one queue table, as it stands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GroupStats {
    /// The group (`""` is the default group).
    pub group: String,
    /// Messages in the table: ready, delayed (a retry's backoff or a publish delay) and
    /// in flight.
    pub depth: i64,
    /// Claimable now (including those whose lease ran out).
    pub ready: i64,
    /// Claimed, under a lease that has not run out.
    pub in_flight: i64,
    /// Age of the oldest message in the table, if any.
    pub oldest: Option<Duration>,
    /// Age of the oldest ready message (claimable now), if any: how far behind the
    /// group's consumers, or the relay to a message broker, are.
    pub oldest_ready: Option<Duration>,
    /// Messages in the dead-letter table (`None` when it does not exist).
    pub dead: Option<i64>,
    /// Claims of the group are held: it or the whole queue is paused
    /// ([`Queue::pause`]).
    pub paused: bool,
}

impl GroupStats {
    /// Waiting for their time: a retry's backoff or a publish delay.
    pub fn delayed(&self) -> i64 {
        (self.depth - self.ready - self.in_flight).max(0)
    }
}

/// The notify table's size and lag.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct NotifyTableStats {
    /// Its name.
    pub table: String,
    /// Rows in it.
    pub rows: i64,
    /// Age of its oldest row, if any.
    pub oldest: Option<Duration>,
}

/// Microseconds as a duration (negative ones as zero).
fn micros(us: Option<i64>) -> Option<Duration> {
    us.map(|us| Duration::from_micros(u64::try_from(us).unwrap_or(0)))
}

async fn fetch<DB: Db>(
    broker: &Broker<DB>,
    sql: String,
    binds: &[String],
    texts: usize,
) -> Result<Vec<TextsAndInts>, sqlx::Error> {
    fetch_on::<DB>(&mut *broker.pool().acquire().await?, sql, binds, texts).await
}

/// Whether `name` (in `schema`, or where an unqualified name resolves) is a table, and
/// which queue columns it lacks.
async fn find<DB: Db>(broker: &Broker<DB>, schema: Option<&str>, name: &str) -> Result<TableState, Error> {
    find_on::<DB>(&mut *broker.pool().acquire().await?, schema, name).await
}

impl<DB: Db> Broker<DB> {
    /// The queue tables where unqualified names resolve (PostgreSQL: the search path's
    /// schemas, qualified unless in the current one; MySQL/MariaDB: the current
    /// database): tables having every queue column, by name.
    pub async fn queue_tables(&self) -> Result<Vec<String>, Error> {
        let rows = fetch(self, DB::queue_tables_sql(), &[], 1).await?;
        Ok(rows.into_iter().flat_map(|row| row.texts).collect())
    }

    /// Whether notifications can wake other processes through `config`: always on
    /// PostgreSQL (LISTEN/NOTIFY is built in), elsewhere when the notify table exists.
    pub async fn notify_ready(&self, config: &NotifyConfig) -> Result<bool, Error> {
        let notifier = Notifier::new(config.clone())?;
        Ok(DB::notify_table(&notifier).is_none()
            || find(self, None, &config.table).await? != TableState::Missing)
    }

    /// The size and lag of the notify table `config` names; `None` where it does not
    /// exist (on PostgreSQL, unless deployed for durable listeners). A user who may not
    /// read it gets the database's refusal ([`Error::is_permission_denied`]), also on
    /// MySQL/MariaDB, whose catalog does not show such a user the table.
    pub async fn notify_table_stats(&self, config: &NotifyConfig) -> Result<Option<NotifyTableStats>, Error> {
        // On PostgreSQL: the table of the durable mode, where it was deployed.
        let notifier = Notifier::durable(config.clone())?;
        if DB::notify_table(&notifier).is_none() {
            return Ok(None);
        }
        let found = find(self, None, &config.table).await? != TableState::Missing;
        if !found && !DB::CATALOG_HIDES_UNGRANTED {
            return Ok(None);
        }
        let sql = DB::notify_stats_sql(&DB::quote(&config.table));
        let rows = match fetch(self, sql, &[], 0).await {
            Ok(rows) => rows,
            // Not in the catalog and not there: no notify table.
            Err(e) if !found && is_missing_table(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let row = rows.into_iter().next().unwrap_or_default();
        Ok(Some(NotifyTableStats {
            table: config.table.clone(),
            rows: row.int(0),
            oldest: micros(row.ints.get(1).copied().flatten()),
        }))
    }
}

impl<DB: Db> Queue<DB> {
    /// Creates the queue table, its claim index, its dead-letter table (`<table>_dead`),
    /// its pause table (`<table>_pause`, see [`pause`](Self::pause)), its schedule and
    /// tick tables (`<table>_sched`, `<table>_ticks`, see [`schedule`](Self::schedule)) and
    /// its history tables (`<table>_hist` and `<table>_keep`, see
    /// [`deploy_keeping`](Self::deploy_keeping)), its counts table (`<table>_count`, see
    /// [`counts`](Self::counts)) and its limits tables (`<table>_limits` and
    /// `<table>_starts`, see [`set_limit`](Self::set_limit)) if they do not exist.
    /// Deploying a queue made by an older rowbus
    /// adds what it lacks. With `listen_notify` on
    /// MySQL/MariaDB or SQLite, also the notify table.
    ///
    /// Safe to run from every replica of an app at once: deploys take turns under a lock.
    /// A table of this name that is not a queue table is refused
    /// ([`Error::NotAQueueTable`]) and nothing is created; so is a schema-qualified queue
    /// (`app.jobs`) whose schema does not exist ([`Error::MissingSchema`]; on MySQL/MariaDB
    /// [`Error::MissingMySqlDatabase`]): [`deploy_with`](Self::deploy_with) can create the schema.
    pub async fn deploy(&self) -> Result<(), Error> {
        self.deploy_with(&DeployOptions::default()).await
    }

    /// [`deploy`](Self::deploy) as `options` say: on PostgreSQL creating a missing schema
    /// ([`DeployOptions::create_schema`]), setting how long handled messages are kept
    /// ([`DeployOptions::keep`], as [`deploy_keeping`](Self::deploy_keeping)).
    ///
    /// ```no_run
    /// # async fn f(queue: rowbus::Queue<sqlx::Postgres>) -> Result<(), rowbus::Error> {
    /// queue.deploy_with(&rowbus::DeployOptions::default().create_schema(true)).await?;
    /// # Ok(()) }
    /// ```
    pub async fn deploy_with(&self, options: &DeployOptions) -> Result<(), Error> {
        let mut statements: Vec<Statement> = self
            .sql
            .create
            .iter()
            .map(|sql| Statement { sql: Arc::from(sql.as_str()), binds: Vec::new() })
            .collect();
        if let Some(keep) = options.keep {
            statements.extend(keep_statements(self, keep)?);
        }
        let pool = &self.inner().pool;
        let queue = QueueDeploy { table: self.table(), create_schema: options.create_schema };
        deploy::locked(pool, &self.table().to_string(), Some(queue), &statements).await?;
        if let Some(notifier) = &self.inner().notifier {
            deploy::notify_table(pool, notifier).await?;
        }
        if let Some(keep) = options.keep {
            self.keeping.set(micros_of(keep));
        }
        Ok(())
    }

    /// Drops the queue table, its dead-letter table, its pause table, its schedule and
    /// tick tables, its history tables, its counts table, its limits table and start log
    /// and (on MySQL/MariaDB) its deduplication ids' table, and its workflow tables where
    /// its workflows deployed them, with every message, schedule and workflow in them. A table of the queue's name that is not a queue table is left alone:
    /// [`Error::NotAQueueTable`], and nothing is dropped.
    pub async fn undeploy(&self) -> Result<(), Error> {
        refuse_foreign(self.table(), self.state().await?)?;
        let mut conn = self.inner().pool.acquire().await?;
        let (schedule, history) = (&self.sql.schedule, &self.sql.history);
        for table in [
            &self.sql.quoted,
            &self.sql.dead,
            &self.sql.pause.quoted,
            &self.sql.limits.limits,
            &self.sql.limits.starts,
            &schedule.sched,
            &schedule.ticks,
            &history.quoted,
            &history.keep,
            &self.sql.counts.quoted,
        ]
        .into_iter()
        .cloned()
        .chain(DB::side_tables(self.table()))
        .chain(
            [WORKFLOWS_SUFFIX, STEPS_SUFFIX, EVENTS_SUFFIX].map(|suffix| quoted::<DB>(self.table(), suffix)),
        ) {
            DB::execute(&mut conn, &Arc::from(format!("DROP TABLE IF EXISTS {table}")), &[]).await?;
        }
        Ok(())
    }

    /// What the database holds under this queue's table name: nothing, a queue table, or
    /// another table.
    pub async fn state(&self) -> Result<TableState, Error> {
        find(self.broker(), self.table().schema(), self.table().name()).await
    }

    /// Whether the queue table exists; [`Error::NotAQueueTable`] when a table of its name
    /// exists that is not a queue table.
    pub async fn is_deployed(&self) -> Result<bool, Error> {
        refuse_foreign(self.table(), self.state().await?)
    }

    /// Messages in the table (ready, delayed or leased) and messages dead-lettered, in
    /// `group`.
    pub async fn depth(&self, group: &str) -> Result<(i64, i64), Error> {
        let mut conn = self.inner().pool.acquire().await?;
        let rows = DB::fetch_rows(&mut conn, &self.sql.depth, &[Arg::Text(group), Arg::Text(group)], 0)
            .await
            .map_err(|e| queue_error(self, e))?;
        let row = rows.into_iter().next().unwrap_or_default();
        Ok((row.int(0), row.int(1)))
    }

    /// Per-group figures of the queue table and its dead-letter table, by group; a table
    /// with no message and no dead letter has one all-zero line for the default group.
    pub async fn group_stats(&self) -> Result<Vec<GroupStats>, Error> {
        let rows = fetch(self.broker(), DB::group_stats_sql(&self.sql.quoted), &[], 1)
            .await
            .map_err(|e| queue_error(self, e))?;
        let mut groups: Vec<GroupStats> = rows
            .into_iter()
            .map(|row| GroupStats {
                group: row.text(0).to_owned(),
                depth: row.int(0),
                ready: row.int(1),
                in_flight: row.int(2),
                oldest: micros(row.ints.get(3).copied().flatten()),
                oldest_ready: micros(row.ints.get(4).copied().flatten()),
                dead: None,
                paused: false,
            })
            .collect();
        let dead_name = format!("{}_dead", self.table().name());
        let dead_exists =
            find(self.broker(), self.table().schema(), &dead_name).await? != TableState::Missing;
        if dead_exists {
            let sql = format!(
                "SELECT group_name, {} FROM {} GROUP BY group_name ORDER BY group_name",
                DB::COUNT,
                quoted::<DB>(self.table(), "_dead")
            );
            for g in &mut groups {
                g.dead = Some(0);
            }
            for row in fetch(self.broker(), sql, &[], 1).await? {
                match groups.iter_mut().find(|g| g.group == row.text(0)) {
                    Some(g) => g.dead = Some(row.int(0)),
                    None => groups.push(GroupStats {
                        group: row.text(0).to_owned(),
                        dead: Some(row.int(0)),
                        ..GroupStats::default()
                    }),
                }
            }
            groups.sort_by(|a, b| a.group.cmp(&b.group));
        }
        if groups.is_empty() {
            groups.push(GroupStats { dead: dead_exists.then_some(0), ..GroupStats::default() });
        }
        mark_paused(&mut groups, &paused_for_stats(self).await?);
        Ok(groups)
    }
}

/// Marks the groups of `stats` that `paused` covers, and adds an all-zero line for each
/// group paused without a message or dead letter (`dead` as the other lines have it).
fn mark_paused(stats: &mut Vec<GroupStats>, paused: &Paused) {
    for g in stats.iter_mut() {
        g.paused = paused.covers(&g.group);
    }
    let dead = stats.first().and_then(|g| g.dead.map(|_| 0));
    for group in &paused.groups {
        if !stats.iter().any(|g| &g.group == group) {
            stats.push(GroupStats { group: group.clone(), dead, paused: true, ..GroupStats::default() });
        }
    }
    stats.sort_by(|a, b| a.group.cmp(&b.group));
}

/// [`Queue::paused`] for the figures: a queue deployed before pause tables existed has
/// nothing paused.
async fn paused_for_stats<DB: Db>(queue: &Queue<DB>) -> Result<Paused, Error> {
    match queue.paused().await {
        Err(Error::MissingPauseTable { .. }) => Ok(Paused::default()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delayed_is_the_rest() {
        let g = GroupStats { depth: 10, ready: 4, in_flight: 3, ..GroupStats::default() };
        assert_eq!(g.delayed(), 3);
    }
}
