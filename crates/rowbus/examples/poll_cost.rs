//! What an emulated LISTEN's polls cost: row reads per notification written.
//!
//! Notifier connections write about `rate` notifications a second on one channel of a
//! notify table of its own; a listener connection drives the notify-table core as rowbus's
//! listener does (one statement per poll, the retention cleanup when due) and receives them.
//!
//! - MySQL/MariaDB: the listener connection's own `Handler_read_%` counters (session
//!   status, summed) over the measured period, divided by the notifications written in it;
//!   and the global counters' rise with the listener minus their rise over as long without
//!   it, divided the same way (exposed to whatever else runs on the server).
//! - SQLite: the rows each poll returned (its plan, printed, is index range scans only, so
//!   these are the rows it examined) and the time a poll took.
//!
//! The notifiers write for `lead` seconds, then `measure` seconds without the listener
//! (by default together a lookback and two seconds, so that the listener subscribes to a
//! stream whose window is full), then the listener subscribes. The measured period starts
//! `warmup` seconds after the subscribe (by default past its first lookback; `warmup=0`
//! counts from the subscribe statement on, that statement included). The subscribe
//! statement's own reads are printed apart. Every notification written after the subscribe
//! must arrive exactly once.
//!
//! ```text
//! cargo run --release -p rowbus --example poll_cost -- mysql://root@127.0.0.1:3306/test
//! cargo run --release -p rowbus --example poll_cost -- sqlite:///tmp/poll_cost.sqlite \
//!     rate=1000 lookback=60 poll=1 warmup=65 measure=20 lead=42
//! ```
//! `benches/poll-cost/run.sh` runs it interleaved with the build of another commit.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use notify_table::{Config, Dialect, NotifyTable, Row, Statement, Value};
use sqlx::mysql::MySqlConnection;
use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection, SqliteJournalMode};
use sqlx::{AssertSqlSafe, ConnectOptions as _, Connection as _, Row as _};

const CHANNEL: &str = "poll_cost";

type Failure = Box<dyn std::error::Error + Send + Sync>;

struct Settings {
    url: String,
    rate: u64,
    lookback: Duration,
    poll: Duration,
    warmup: Duration,
    measure: Duration,
    lead: Option<Duration>,
}

fn settings() -> Result<Settings, Failure> {
    let mut args = std::env::args().skip(1);
    let url =
        args.next().ok_or("usage: poll_cost URL [rate=N lookback=S poll=S warmup=S measure=S lead=S]")?;
    let mut s = Settings {
        url,
        rate: 1000,
        lookback: Duration::from_secs(60),
        poll: Duration::from_secs(1),
        warmup: Duration::from_secs(65),
        measure: Duration::from_secs(20),
        lead: None,
    };
    for arg in args {
        let (key, value) = arg.split_once('=').ok_or_else(|| format!("expected key=value, got {arg:?}"))?;
        // Durations as every rowbus flag reads them: plain seconds or one unit (250ms, 1m, 1d).
        let secs = || rowbus::duration::parse_duration(value);
        match key {
            "rate" => s.rate = value.parse()?,
            "lookback" => s.lookback = secs()?,
            "poll" => s.poll = secs()?,
            "warmup" => s.warmup = secs()?,
            "measure" => s.measure = secs()?,
            "lead" => s.lead = Some(secs()?),
            _ => {
                return Err(
                    format!("unknown setting {key:?}: rate, lookback, poll, warmup, measure, lead").into()
                );
            }
        }
    }
    Ok(s)
}

/// The statements the core builds, run on one database's connection.
trait Conn: Sized + Send + 'static {
    fn open(url: &str) -> impl Future<Output = Result<Self, Failure>> + Send;
    fn fetch(&mut self, stmt: &Statement) -> impl Future<Output = Result<Vec<Row>, Failure>> + Send;
    fn execute(&mut self, stmt: &Statement) -> impl Future<Output = Result<u64, Failure>> + Send;
    /// The sum of `Handler_read_%`, `scope` GLOBAL or SESSION; `None` where there is none.
    fn handler_reads(&mut self, scope: &str) -> impl Future<Output = Result<Option<u64>, Failure>> + Send;
    /// The plan of `stmt`, one line per step; empty where not shown.
    fn plan(&mut self, stmt: &Statement) -> impl Future<Output = Result<Vec<String>, Failure>> + Send;
}

macro_rules! bind_all {
    ($sql:expr, $binds:expr) => {{
        // The core's statements: the table name validated and quoted, every value bound.
        let sql: Arc<str> = Arc::from($sql);
        let mut query = sqlx::query(AssertSqlSafe(sql));
        for value in $binds {
            query = match value {
                Value::Int(i) => query.bind(*i),
                Value::Text(t) => query.bind(t.to_string()),
            };
        }
        query
    }};
}

impl Conn for MySqlConnection {
    async fn open(url: &str) -> Result<Self, Failure> {
        Ok(MySqlConnection::connect(url).await?)
    }

    async fn fetch(&mut self, stmt: &Statement) -> Result<Vec<Row>, Failure> {
        let rows = bind_all!(stmt.sql.clone(), &stmt.binds).fetch_all(&mut *self).await?;
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            out.push(Row {
                id: r.try_get(0)?,
                channel: r.try_get(1)?,
                payload: r.try_get(2)?,
                pid: r.try_get(3)?,
                cutoff: r.try_get(4)?,
                at: r.try_get(5)?, // the head row's time; benches/poll-cost/run.sh drops this line for older cores, which had none
            });
        }
        Ok(out)
    }

    async fn execute(&mut self, stmt: &Statement) -> Result<u64, Failure> {
        Ok(bind_all!(stmt.sql.clone(), &stmt.binds).execute(&mut *self).await?.rows_affected())
    }

    async fn handler_reads(&mut self, scope: &str) -> Result<Option<u64>, Failure> {
        let sql = format!("SHOW {scope} STATUS LIKE 'Handler\\_read\\_%'");
        // `scope` is one of two constants.
        let rows = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_all(&mut *self).await?;
        let mut sum = 0u64;
        for r in rows {
            let value: String = r.try_get(1)?;
            sum += value.parse::<u64>()?;
        }
        Ok(Some(sum))
    }

    async fn plan(&mut self, _stmt: &Statement) -> Result<Vec<String>, Failure> {
        Ok(Vec::new())
    }
}

impl Conn for SqliteConnection {
    async fn open(url: &str) -> Result<Self, Failure> {
        let options: SqliteConnectOptions = url.parse()?;
        let options = options
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .busy_timeout(Duration::from_secs(10));
        Ok(options.connect().await?)
    }

    async fn fetch(&mut self, stmt: &Statement) -> Result<Vec<Row>, Failure> {
        let rows = bind_all!(stmt.sql.clone(), &stmt.binds).fetch_all(&mut *self).await?;
        let unsigned = |v: i64| u64::try_from(v).unwrap_or_default();
        let mut out = Vec::with_capacity(rows.len());
        for r in rows {
            out.push(Row {
                id: unsigned(r.try_get(0)?),
                channel: r.try_get(1)?,
                payload: r.try_get(2)?,
                pid: unsigned(r.try_get(3)?),
                cutoff: r.try_get(4)?,
                at: r.try_get(5)?, // the head row's time; benches/poll-cost/run.sh drops this line for older cores, which had none
            });
        }
        Ok(out)
    }

    async fn execute(&mut self, stmt: &Statement) -> Result<u64, Failure> {
        Ok(bind_all!(stmt.sql.clone(), &stmt.binds).execute(&mut *self).await?.rows_affected())
    }

    async fn handler_reads(&mut self, _scope: &str) -> Result<Option<u64>, Failure> {
        Ok(None)
    }

    async fn plan(&mut self, stmt: &Statement) -> Result<Vec<String>, Failure> {
        let sql = format!("EXPLAIN QUERY PLAN {}", stmt.sql);
        let rows = bind_all!(sql, &stmt.binds).fetch_all(&mut *self).await?;
        rows.iter().map(|r| Ok(r.try_get::<String, _>(3)?)).collect()
    }
}

/// Writes notifications on `conns` connections at `rate` a second in all until `stop`;
/// counts them in `written`.
async fn notifiers<C: Conn>(
    s: &Settings,
    nt: &NotifyTable,
    conns: u64,
    written: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
) -> Result<Vec<tokio::task::JoinHandle<Result<(), Failure>>>, Failure> {
    let mut tasks = Vec::new();
    for k in 0..conns {
        let mut conn = C::open(&s.url).await?;
        let period = Duration::from_secs_f64(conns as f64 / s.rate as f64);
        let (nt, written, stop) =
            (NotifyTable::new(nt.config().clone(), nt.dialect())?, written.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(period);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                ticker.tick().await;
                conn.execute(&nt.notify_sql(CHANNEL, &format!("{k}-{i}"))?).await?;
                written.fetch_add(1, Ordering::Relaxed);
                i += 1;
            }
            Ok(())
        }));
    }
    Ok(tasks)
}

#[derive(Default)]
struct Counted {
    polls: u64,
    rows: u64,
    poll_time: Vec<Duration>,
}

async fn run<C: Conn>(s: Settings, dialect: Dialect) -> Result<(), Failure> {
    let config = Config {
        table: format!("poll_cost_{}", std::process::id()),
        poll_interval: s.poll,
        lookback: s.lookback,
        ..Config::default()
    };
    let mut nt = NotifyTable::new(config, dialect)?;
    let mut conn = C::open(&s.url).await?;
    let mut monitor = C::open(&s.url).await?;
    for stmt in nt.create_table_sql() {
        conn.execute(&stmt).await?;
    }
    let result = measure(&s, &mut nt, &mut conn, &mut monitor).await;
    conn.execute(&nt.drop_table_sql()).await?;
    result
}

async fn measure<C: Conn>(
    s: &Settings,
    nt: &mut NotifyTable,
    conn: &mut C,
    monitor: &mut C,
) -> Result<(), Failure> {
    let written = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let conns = if matches!(nt.dialect(), Dialect::MySql) { 4 } else { 1 };
    let tasks = notifiers::<C>(s, nt, conns, written.clone(), stop.clone()).await?;
    let full_window = (s.lookback + Duration::from_secs(2)).saturating_sub(s.measure);
    tokio::time::sleep(s.lead.unwrap_or(full_window.max(Duration::from_secs(2)))).await;

    // Without the listener: the global counters over `measure`.
    let (g0, w0) = (monitor.handler_reads("GLOBAL").await?, written.load(Ordering::Relaxed));
    tokio::time::sleep(s.measure).await;
    let (g1, w1) = (monitor.handler_reads("GLOBAL").await?, written.load(Ordering::Relaxed));

    // With it. A SHOW's own reads: the difference of two in a row.
    let mut marks = None;
    let mark = async |conn: &mut C, monitor: &mut C| -> Result<_, Failure> {
        let first = conn.handler_reads("SESSION").await?;
        let second = conn.handler_reads("SESSION").await?;
        let show = second.zip(first).map(|(b, a)| b - a);
        let global = monitor.handler_reads("GLOBAL").await?;
        Ok((second, show, global, written.load(Ordering::Relaxed), Instant::now()))
    };
    if s.warmup.is_zero() {
        marks = Some(mark(conn, monitor).await?);
    }
    let before_subscribe = written.load(Ordering::Relaxed);
    let stmt = nt.subscribe_sql(CHANNEL)?;
    let session_before = conn.handler_reads("SESSION").await?;
    let rows = conn.fetch(&stmt).await?;
    let session_after = conn.handler_reads("SESSION").await?;
    let after_subscribe = written.load(Ordering::Relaxed);
    let subscribe_rows = rows.len() - 1;
    nt.subscribed(CHANNEL, rows)?;
    if let (Some(before), Some(after), Some((_, Some(show), _, _, _))) =
        (session_before, session_after, marks)
    {
        println!(
            "subscribe: rows_returned={subscribe_rows} handler_reads={} (in the measured period)",
            after.saturating_sub(before).saturating_sub(show)
        );
    } else {
        println!("subscribe: rows_returned={subscribe_rows}");
    }
    // The first window in the position's text form (its last part), the same in every core.
    if let Some(text) = nt.position(CHANNEL).map(|p| p.to_string()) {
        let window = text.rsplit('|').next().unwrap_or_default();
        let shown: String = window.chars().take(120).collect();
        println!("first window: {} bytes in the position's text: {shown}", window.len());
    }
    let started = Instant::now();
    let mut ticker = tokio::time::interval(s.poll);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut payloads: HashSet<String> = HashSet::new();
    let (mut counted, mut plan) = (Counted::default(), Vec::new());
    loop {
        ticker.tick().await;
        let elapsed = started.elapsed();
        if marks.is_none() && elapsed >= s.warmup {
            marks = Some(mark(conn, monitor).await?);
        }
        if elapsed >= s.warmup + s.measure {
            break;
        }
        let Some((stmt, token)) = nt.poll_sql() else { unreachable!("subscribed") };
        if marks.is_some() && plan.is_empty() {
            plan = conn.plan(&stmt).await?;
        }
        let t = Instant::now();
        let rows = conn.fetch(&stmt).await?;
        let took = t.elapsed();
        if marks.is_some() {
            counted.polls += 1;
            counted.rows += rows.len() as u64 - 1;
            counted.poll_time.push(took);
        }
        for n in nt.polled(token, rows)? {
            if !payloads.insert(n.payload.clone()) {
                return Err(format!("{} delivered twice", n.payload).into());
            }
        }
        if let Some(select) = nt.cleanup_sql() {
            let expired: Vec<u64> = conn.fetch(&select).await?.iter().map(|r| r.id).collect();
            let deleted = match nt.delete_sql(&expired) {
                Some(delete) => conn.execute(&delete).await?,
                None => 0,
            };
            nt.cleaned(Some(deleted));
        }
    }
    let session_end = conn.handler_reads("SESSION").await?;
    let global_end = monitor.handler_reads("GLOBAL").await?;
    let Some((session_start, show, global_start, w2, measured_from)) = marks else {
        return Err("measured nothing".into());
    };
    let measured = measured_from.elapsed();
    let w3 = written.load(Ordering::Relaxed);

    // Stop writing, then poll until every notification written since the subscribe is in.
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await??;
    }
    let total = written.load(Ordering::Relaxed);
    // Written after the subscribe statement's snapshot: between these two, as the
    // notifications counted while it ran may be on either side of it, plus one write in
    // flight per notifier.
    let (fewest, most) = ((total - after_subscribe).saturating_sub(conns), total - before_subscribe + conns);
    for _ in 0..5 {
        tokio::time::sleep(s.poll).await;
        let Some((stmt, token)) = nt.poll_sql() else { unreachable!("subscribed") };
        let rows = conn.fetch(&stmt).await?;
        for n in nt.polled(token, rows)? {
            if !payloads.insert(n.payload.clone()) {
                return Err(format!("{} delivered twice", n.payload).into());
            }
        }
    }
    let delivered = payloads.len() as u64;
    if !(fewest..=most).contains(&delivered) {
        return Err(format!("{delivered} delivered, {fewest}..={most} written after the subscribe").into());
    }

    let notes = (w3 - w2) as f64;
    let mut times = counted.poll_time.clone();
    times.sort_unstable();
    let median = times.get(times.len() / 2).copied().unwrap_or_default();
    println!(
        "dialect={:?} rate={:.0}/s lookback={}s poll={}s measured={:.1}s notifications={} polls={} \
         rows_returned_per_poll={:.0} rows_returned_per_notification={:.2} median_poll_ms={:.2} \
         delivered={delivered} (written after the subscribe: {fewest}..={most})",
        nt.dialect(),
        notes / measured.as_secs_f64(),
        s.lookback.as_secs_f64(),
        s.poll.as_secs_f64(),
        measured.as_secs_f64(),
        w3 - w2,
        counted.polls,
        counted.rows as f64 / counted.polls.max(1) as f64,
        counted.rows as f64 / notes,
        median.as_secs_f64() * 1e3,
    );
    if let (Some(end), Some(start), Some(show)) = (session_end, session_start, show) {
        let listener = end.saturating_sub(start).saturating_sub(show);
        println!(
            "listener_handler_reads={listener} per_notification={:.2} (session Handler_read_% of the listener connection)",
            listener as f64 / notes
        );
    }
    if let (Some(g0), Some(g1), Some(g2), Some(g3)) = (g0, g1, global_start, global_end) {
        let without = (g1 - g0) as f64 / (w1 - w0) as f64;
        let with = (g3 - g2) as f64 / notes;
        println!(
            "global_handler_reads_per_notification: without_listener={without:.2} with_listener={with:.2} \
             added={:.2} (global Handler_read_%, other sessions included)",
            with - without
        );
    }
    for line in plan {
        println!("plan: {line}");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let s = settings()?;
    if s.url.starts_with("mysql:") || s.url.starts_with("mariadb:") {
        run::<MySqlConnection>(s, Dialect::MySql).await
    } else if s.url.starts_with("sqlite:") {
        run::<SqliteConnection>(s, Dialect::Sqlite { pid: std::process::id() }).await
    } else {
        Err("the notify table is for mysql:// and sqlite:// URLs".into())
    }
}
