//! The test binary's one process-wide tracing subscriber: warnings and above of every
//! test, as text ([`warnings`]), and the statements that name a table, as sqlx reports each
//! one it ran (its `sqlx::query` events), recorded only while a [`Statements`] counts.
//! Process-wide because SQLite's statements run on a thread of sqlx's own, where no
//! subscriber scoped to the test's future sees them; statements of other tests running
//! meanwhile are told apart by the (unique) table they name.

use std::io::Write;
use std::sync::{Arc, Mutex, Once, OnceLock};

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Where the statements go while counters count.
static COUNTING: Mutex<Vec<Arc<Mutex<Vec<String>>>>> = Mutex::new(Vec::new());

static INSTALL: Once = Once::new();

/// Warnings and above of every test of this process, as text.
static WARNINGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();

/// Installs the subscriber, once.
fn install() {
    INSTALL.call_once(|| {
        use tracing_subscriber::Layer as _;
        let sink = WARNINGS.get_or_init(Arc::default).clone();
        let text = tracing_subscriber::fmt::layer()
            .with_writer(move || Sink(sink.clone()))
            .with_ansi(false)
            .with_filter(tracing_subscriber::filter::LevelFilter::WARN);
        let statements = Recorder.with_filter(tracing_subscriber::filter::filter_fn(|m| {
            m.target() == "sqlx::query" && counting()
        }));
        let subscriber = tracing_subscriber::registry().with(text).with(statements);
        tracing::subscriber::set_global_default(subscriber).expect("the only global subscriber of the tests");
    });
}

/// Warnings and above of every test of this process since the first call (of this or of
/// [`Statements::start`]), as text.
pub fn warnings() -> Arc<Mutex<Vec<u8>>> {
    let logs = WARNINGS.get_or_init(Arc::default).clone();
    install();
    logs
}

struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A counter of statements, counting from [`start`](Self::start) until dropped.
pub struct Statements {
    ran: Arc<Mutex<Vec<String>>>,
}

impl Statements {
    /// Counts from now on.
    pub fn start() -> Statements {
        install();
        let ran = Arc::new(Mutex::new(Vec::new()));
        COUNTING.lock().unwrap().push(ran.clone());
        // Callsites seen before any counter were told nobody listens: ask them again.
        tracing::callsite::rebuild_interest_cache();
        Statements { ran }
    }

    /// How many statements that name `table` (any of its tables: `table_limits`...) ran
    /// since the last call (or the start).
    pub fn take_naming(&self, table: &str) -> usize {
        self.take_texts_naming(table).len()
    }

    /// The statements that name `table` that ran since the last call (or the start).
    pub fn take_texts_naming(&self, table: &str) -> Vec<String> {
        let ran = std::mem::take(&mut *self.ran.lock().unwrap());
        ran.into_iter().filter(|sql| sql.contains(table)).collect()
    }
}

impl Drop for Statements {
    fn drop(&mut self) {
        COUNTING.lock().unwrap().retain(|c| !Arc::ptr_eq(c, &self.ran));
    }
}

struct Recorder;

fn counting() -> bool {
    !COUNTING.lock().unwrap().is_empty()
}

#[derive(Default)]
struct Sql {
    summary: String,
    statement: String,
}

impl Visit for Sql {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record_str(field, &format!("{value:?}"));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "summary" => self.summary = value.to_owned(),
            "db.statement" => self.statement = value.to_owned(),
            _ => {}
        }
    }
}

impl<S: Subscriber> Layer<S> for Recorder {
    fn on_event(&self, event: &Event<'_>, _: Context<'_, S>) {
        let mut sql = Sql::default();
        event.record(&mut sql);
        // sqlx gives the whole statement where its summary shortened it.
        let sql = if sql.statement.trim().is_empty() { sql.summary } else { sql.statement };
        for counter in COUNTING.lock().unwrap().iter() {
            counter.lock().unwrap().push(sql.clone());
        }
    }
}
