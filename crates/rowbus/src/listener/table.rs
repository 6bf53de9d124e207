//! The notify-table core driven on one connection: every listener on MySQL/MariaDB and
//! SQLite, PostgreSQL's durable channels (each database's [`TableConn`] is in its
//! dialect's module).

use std::time::Duration;

use notify_table::{NotifyTable, Position, Statement, Value};
use tokio::time::{Interval, MissedTickBehavior};
use tracing::{debug, warn};

use super::driver::{Claimed, Command, Control, Session, Wake};
use super::event::Event;
use super::options::ListenerOptions;
use crate::error::{Error, is_missing_column, is_missing_table};
use crate::notify::missing;
use crate::sql::TableConn;
use crate::sql::{POSITIONS_SUFFIX, PositionsSql, micros, text};

/// One listen connection and its own core object: a new connection starts a new core,
/// resumed from the positions the old one reached.
pub(crate) struct TableSession<C: TableConn> {
    pub(super) conn: C,
    table: NotifyTable,
    /// Every poll interval; on PostgreSQL only a fallback to LISTEN's wake-ups.
    pub(super) ticker: Interval,
    /// The positions table's statements; `None` when the notify table's name leaves no
    /// room for its suffix.
    positions: Option<PositionsSql<C::Db>>,
    /// How recently a durable listener must have checked in for the cleanup to keep
    /// what it has not read.
    durable_live: Duration,
    /// Whether the cleanup found no positions table (an older deploy): it stops asking.
    no_positions_table: bool,
}

/// Awaits `statement` while answering the listener's commands: an unlisten is bookkeeping
/// and takes effect on the rows in flight; a listen waits for the connection. `None` when
/// the handle is gone.
async fn answering<T>(
    statement: impl std::future::Future<Output = T>,
    table: &mut NotifyTable,
    control: &mut Control,
) -> Option<T> {
    tokio::pin!(statement);
    loop {
        tokio::select! {
            biased;
            done = &mut statement => return Some(done),
            command = control.commands.recv() => match command {
                Some(Command::Unlisten { channel, reply }) => {
                    table.unsubscribe(&channel);
                    if control.forget(&channel) {
                        control.after_release.push(reply);
                    } else {
                        let _ = reply.send(());
                    }
                }
                Some(Command::Listen { channel, reply }) => control.deferred.push((channel, reply)),
                Some(command) => control.later.push(command),
                None => return None,
            },
        }
    }
}

impl<C: TableConn> Session for TableSession<C> {
    async fn connect(url: &str, options: &ListenerOptions) -> Result<Self, Error> {
        let table = NotifyTable::new(options.notify_table.clone(), C::dialect())?;
        let conn = C::open(url).await?;
        let mut ticker = tokio::time::interval(table.config().poll_interval);
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let positions = PositionsSql::new(&table.config().table).ok();
        Ok(TableSession {
            conn,
            table,
            ticker,
            positions,
            durable_live: options.durable_live,
            no_positions_table: false,
        })
    }

    async fn session_id(&mut self) -> Result<Option<u64>, Error> {
        self.conn.session_id().await
    }

    async fn listen(&mut self, channel: &str) -> Result<(), Error> {
        let stmt = self.table.subscribe_sql(channel)?;
        let rows = match self.conn.fetch(&stmt).await {
            Ok(rows) => rows,
            Err(e) if is_missing_table(&e) => return Err(missing(&self.table)),
            Err(e) => return Err(e.into()),
        };
        Ok(self.table.subscribed(channel, rows)?)
    }

    async fn unlisten(&mut self, channel: &str) -> Result<(), Error> {
        self.table.unsubscribe(channel);
        Ok(())
    }

    async fn resume(&mut self, channel: &str, position: Position) -> Result<bool, Error> {
        let rows = self.conn.fetch(&self.table.resume_sql()).await?;
        Ok(self.table.resumed(channel, position, rows)?)
    }

    fn position(&self, channel: &str) -> Option<Position> {
        self.table.position(channel)
    }

    async fn claim(
        &mut self,
        channel: &str,
        name: &str,
        token: i64,
        lease: Duration,
    ) -> Result<Claimed, Error> {
        let sql = self.positions_sql()?;
        let key = || vec![text(channel), text(name)];
        let insert = Statement { sql: sql.insert.clone(), binds: key() };
        let read = Statement { sql: sql.read.clone(), binds: key() };
        let mut take = vec![Value::Int(token), micros(lease)];
        take.extend(key());
        take.extend([Value::Int(token), micros(lease)]);
        let take = Statement { sql: sql.take.clone(), binds: take };
        let table = format!("{}{POSITIONS_SUFFIX}", self.table.config().table);
        match self.conn.execute(&insert).await {
            Err(e) if is_missing_table(&e) => return Err(Error::MissingPositionsTable { table }),
            other => other?,
        };
        let row = match self.conn.rows(&read, 1).await {
            Err(e) if is_missing_column(&e) => return Err(Error::PositionsTableOutdated { table }),
            other => other?.pop().unwrap_or_default(),
        };
        let since = Duration::from_micros(u64::try_from(row.int(1)).unwrap_or(0));
        // The owner's lease; this listener's where an older rowbus stored none.
        let owners = match row.int(2) {
            0 => lease,
            stored => Duration::from_micros(u64::try_from(stored).unwrap_or(0)),
        };
        if self.conn.execute(&take).await? == 0 {
            return Err(Error::DurableNameTaken {
                channel: channel.to_owned(),
                name: name.to_owned(),
                since,
                expires_in: owners.saturating_sub(since),
            });
        }
        let position = match row.text(0) {
            "" => None,
            stored => Some(stored.parse::<Position>()?),
        };
        Ok(Claimed { position, since })
    }

    async fn store(
        &mut self,
        channel: &str,
        name: &str,
        token: i64,
        position: Option<&Position>,
    ) -> Result<bool, Error> {
        let sql = self.positions_sql()?;
        let key = [text(channel), text(name), Value::Int(token)];
        let stmt = match position {
            Some(p) => {
                let first_unread = Value::Int(i64::try_from(p.first_unread()).unwrap_or(i64::MAX));
                let mut binds = vec![text(&p.to_string()), first_unread];
                binds.extend(key);
                Statement { sql: sql.store.clone(), binds }
            }
            None => Statement { sql: sql.check_in.clone(), binds: key.to_vec() },
        };
        Ok(self.conn.execute(&stmt).await? == 1)
    }

    async fn release(&mut self, channel: &str, name: &str, token: i64) -> Result<(), Error> {
        let sql = self.positions_sql()?;
        let binds = vec![text(channel), text(name), Value::Int(token)];
        self.conn.execute(&Statement { sql: sql.release.clone(), binds }).await?;
        Ok(())
    }

    async fn next(&mut self, control: &mut Control) -> Result<Wake, Error> {
        tokio::select! {
            biased;
            command = control.commands.recv() => return Ok(Wake::Command(command)),
            _ = self.ticker.tick() => {}
        }
        self.poll(control).await
    }
}

// What PostgreSQL's session, which reads only some channels from the table, asks.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
impl<C: TableConn> TableSession<C> {
    /// Whether `channel` is read from the table.
    pub(super) fn is_subscribed(&self, channel: &str) -> bool {
        self.table.is_subscribed(channel)
    }

    /// Whether any channel is read from the table.
    pub(super) fn is_polling(&self) -> bool {
        self.table.channel_count() > 0
    }

    /// Polls the table now (then cleans up when due): what was committed since.
    pub(super) async fn poll(&mut self, control: &mut Control) -> Result<Wake, Error> {
        let Some((stmt, token)) = self.table.poll_sql() else {
            return Ok(Wake::Notifications(Vec::new()));
        };
        let Some(rows) = answering(self.conn.fetch(&stmt), &mut self.table, control).await else {
            return Ok(Wake::Command(None));
        };
        let notifications = self.table.polled(token, rows?)?.into_iter().map(Event::Notification).collect();
        if self.table.cleanup_sql().is_some() {
            let held = self.held().await;
            self.clean_up(held, control).await;
        }
        Ok(Wake::Notifications(notifications))
    }

    fn positions_sql(&self) -> Result<&PositionsSql<C::Db>, Error> {
        self.positions.as_ref().ok_or_else(|| Error::PositionsTableName {
            table: self.table.config().table.clone(),
            max: notify_table::MAX_TABLE_LEN - POSITIONS_SUFFIX.len(),
        })
    }

    /// Per channel, the lowest id a live durable listener of it has not read: the
    /// cleanup keeps those rows. `Err` when that cannot be known: the cleanup waits.
    async fn held(&mut self) -> Result<Vec<(String, u64)>, ()> {
        let Some(sql) = self.positions.as_ref().filter(|_| !self.no_positions_table) else {
            return Ok(Vec::new());
        };
        let stmt = Statement { sql: sql.held.clone(), binds: vec![micros(self.durable_live)] };
        match self.conn.rows(&stmt, 1).await {
            Ok(rows) => Ok(rows
                .iter()
                .map(|r| (r.text(0).to_owned(), u64::try_from(r.int(0)).unwrap_or(0)))
                .collect()),
            Err(e) if is_missing_table(&e) => {
                // Deployed before durable listeners: nothing holds the cleanup back.
                self.no_positions_table = true;
                Ok(Vec::new())
            }
            Err(error) => {
                warn!(%error, "reading the durable listeners' positions failed; the cleanup waits");
                Err(())
            }
        }
    }

    /// Runs the retention cleanup, keeping what `held` holds (`Err`: none this time).
    async fn clean_up(&mut self, held: Result<Vec<(String, u64)>, ()>, control: &mut Control) {
        let Ok(held) = held else {
            self.table.cleaned(None);
            return;
        };
        let held: Vec<(&str, u64)> = held.iter().map(|(channel, id)| (channel.as_str(), *id)).collect();
        if let Some(select) = self.table.cleanup_sql_holding(&held) {
            // The cleanup, too, answers commands while it waits (a table lock stalls it).
            let deleted = match answering(self.conn.fetch_ids(&select), &mut self.table, control).await {
                Some(Ok(expired)) => match self.table.delete_sql(&expired) {
                    Some(delete) => answering(self.conn.execute(&delete), &mut self.table, control).await,
                    None => Some(Ok(0)),
                },
                other => other.map(|result| result.map(|_| 0)),
            };
            match deleted {
                Some(Ok(deleted)) => {
                    debug!(deleted, "notify table cleanup");
                    self.table.cleaned(Some(deleted));
                }
                Some(Err(error)) => {
                    warn!(%error, "notify table cleanup failed; retrying in a minute of polling");
                    self.table.cleaned(None);
                }
                // The handle is gone: deliver what was polled; the next wait ends the task.
                None => {}
            }
        }
    }
}
