//! What `rowbus stats` shows of durable listeners: each one's position and lag.

use std::time::Duration;

use notify_table::{Config, Position};
use sqlx::Pool;

use super::options::ListenerOptions;
use crate::driver::Arg;
use crate::error::{Error, is_missing_column, is_missing_table};
use crate::names::check_durable_name;
use crate::sql::Db;
use crate::sql::Notifier;
use crate::sql::{POSITIONS_SUFFIX, PositionsSql};

/// A durable listener's stored position, as [`durable_listeners`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DurableListener {
    /// The channel it listens on.
    pub channel: String,
    /// Its name.
    pub name: String,
    /// The highest id its stored position has read (see [`Position`]); `None` before
    /// its first store.
    pub mark: Option<u64>,
    /// Rows of the channel above its mark: committed after what it acknowledged (late
    /// commits below the mark aside).
    pub lag_rows: u64,
    /// How old the oldest of those is; `None` when there is none.
    pub lag: Option<Duration>,
    /// Time since it last checked in (server time).
    pub checked_in: Duration,
    /// Whether a process holds the name: it took it and checked in within its lease. One
    /// that stopped without giving the name up (a crash) holds it until its lease runs out.
    pub owned: bool,
    /// The lease of the name's last owner (the default
    /// [`durable_lease`](crate::ListenerOptions::durable_lease) where an older rowbus
    /// stored none).
    pub lease: Duration,
}

/// Every durable listener of the notify table `config` names, with its lag, by channel
/// and name. Empty where the positions table does not exist. A user who may not read the
/// positions table (or, for the lag, the notify table) gets the database's refusal
/// ([`Error::is_permission_denied`]).
///
/// ```no_run
/// # async fn f(pool: sqlx::MySqlPool) -> Result<(), rowbus::Error> {
/// for d in rowbus::durable::durable_listeners(&pool, &Default::default()).await? {
///     println!("{} {}: {} rows behind, checked in {:?} ago", d.channel, d.name, d.lag_rows, d.checked_in);
/// }
/// # Ok(()) }
/// ```
pub async fn durable_listeners<DB: Db>(
    pool: &Pool<DB>,
    config: &Config,
) -> Result<Vec<DurableListener>, Error> {
    let notifier = Notifier::durable(config.clone())?;
    let Some(table) = DB::notify_table(&notifier) else { return Ok(Vec::new()) };
    let sql = PositionsSql::<DB>::new(&config.table)?;
    let mut conn = pool.acquire().await?;
    let rows = match DB::fetch_rows(&mut conn, &sql.list, &[], 3).await {
        Ok(rows) => rows,
        Err(e) if is_missing_table(&e) => return Ok(Vec::new()),
        // Made before the lease was stored: the default one is assumed.
        Err(e) if is_missing_column(&e) => DB::fetch_rows(&mut conn, &sql.list_without_lease, &[], 3).await?,
        Err(e) => return Err(e.into()),
    };
    let lag_sql = format!(
        "SELECT {}, {} FROM {} WHERE channel = {} AND id > {}",
        DB::COUNT,
        DB::notify_age("MIN(created_at)"),
        table.quoted_table(),
        DB::param(1),
        DB::param(2)
    )
    .into();
    let micros = |v: i64| Duration::from_micros(u64::try_from(v).unwrap_or(0));
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let (owner, since) = (row.int(1), row.int(2));
        let lease = match row.int(3) {
            0 => ListenerOptions::default().durable_lease,
            stored => micros(stored),
        };
        let mark = row.text(2).parse::<Position>().ok().map(|p| p.mark);
        let above = i64::try_from(mark.unwrap_or(0)).unwrap_or(i64::MAX);
        let lag = DB::fetch_rows(&mut conn, &lag_sql, &[Arg::Text(row.text(0)), Arg::Int(above)], 0).await?;
        let lag = lag.into_iter().next().unwrap_or_default();
        out.push(DurableListener {
            channel: row.text(0).to_owned(),
            name: row.text(1).to_owned(),
            mark,
            lag_rows: u64::try_from(lag.int(0)).unwrap_or(0),
            lag: lag.ints.get(1).copied().flatten().map(micros),
            checked_in: micros(since),
            owned: owner != 0 && micros(since) <= lease,
            lease,
        });
    }
    Ok(out)
}

/// Deletes durable listener `name`'s stored position on `channel`, so that it no longer
/// shows in [`durable_listeners`] and a listener taking the name next starts afresh
/// ([`Resume::New`](crate::durable::Resume::New)). Refuses ([`Error::DurableNameTaken`]) a name
/// a process holds and checked in within its lease (the one it stored; `lease`, its
/// [`durable_lease`](crate::ListenerOptions::durable_lease), where an older rowbus stored
/// none): stop it first. Returns
/// whether there was a position to delete.
///
/// ```no_run
/// # async fn f(pool: sqlx::MySqlPool) -> Result<(), rowbus::Error> {
/// let lease = rowbus::ListenerOptions::default().durable_lease;
/// rowbus::durable::forget_durable_listener(&pool, &Default::default(), "jobs", "old-mailer", lease).await?;
/// # Ok(()) }
/// ```
pub async fn forget_durable_listener<DB: Db>(
    pool: &Pool<DB>,
    config: &Config,
    channel: &str,
    name: &str,
    lease: Duration,
) -> Result<bool, Error> {
    check_durable_name(name)?;
    let sql = PositionsSql::<DB>::new(&config.table)?;
    let mut conn = pool.acquire().await?;
    let key = [Arg::Text(channel), Arg::Text(name)];
    let lease_micros = i64::try_from(lease.as_micros()).unwrap_or(i64::MAX);
    match DB::execute(&mut conn, &sql.forget, &[key[0], key[1], Arg::Int(lease_micros)]).await {
        Ok(deleted) if deleted > 0 => return Ok(true),
        Ok(_) => {}
        Err(e) if is_missing_table(&e) => return Ok(false),
        Err(e) if is_missing_column(&e) => {
            return Err(Error::PositionsTableOutdated {
                table: format!("{}{POSITIONS_SUFFIX}", config.table),
            });
        }
        Err(e) => return Err(e.into()),
    }
    // Nothing deleted: no such name, or one a process holds.
    let held = DB::fetch_rows(&mut conn, &sql.read, &key, 1).await?;
    match held.first() {
        Some(row) => {
            let since = Duration::from_micros(u64::try_from(row.int(1)).unwrap_or(0));
            let lease = match row.int(2) {
                0 => lease,
                stored => Duration::from_micros(u64::try_from(stored).unwrap_or(0)),
            };
            let (channel, name) = (channel.to_owned(), name.to_owned());
            Err(Error::DurableNameTaken { channel, name, since, expires_in: lease.saturating_sub(since) })
        }
        None => Ok(false),
    }
}
