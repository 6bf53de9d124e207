//! Counts the statements a future sends, as sqlx reports each one it ran (its
//! `sqlx::query` events): a subscriber scoped to the future, so that statements of other
//! tests and of tasks the future does not poll itself are not counted.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tracing::field::{Field, Visit};
use tracing::{Dispatch, Event, Subscriber};
use tracing_subscriber::layer::{Context as LayerContext, Layer, SubscriberExt};

/// Each statement's text (its summary, or the whole statement where sqlx shortened it)
/// and the rows it returned, in the order they ran.
#[derive(Debug, Clone, Default)]
pub struct Statements(Arc<Mutex<Vec<Ran>>>);

/// One statement run.
#[derive(Debug, Clone, Default)]
pub struct Ran {
    pub sql: String,
    pub rows_returned: u64,
}

impl Statements {
    /// The statements run so far.
    pub fn ran(&self) -> Vec<Ran> {
        self.0.lock().unwrap().clone()
    }

    /// How many statements named `table` (any of its tables: `table_limits`...).
    pub fn naming(&self, table: &str) -> usize {
        self.ran().iter().filter(|r| r.sql.contains(table)).count()
    }

    /// Forgets what ran so far.
    pub fn clear(&self) {
        self.0.lock().unwrap().clear();
    }
}

struct Counter(Statements);

#[derive(Default)]
struct Fields {
    summary: String,
    statement: String,
    rows_returned: u64,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        match field.name() {
            "summary" => self.summary = format!("{value:?}"),
            "db.statement" => self.statement = format!("{value:?}"),
            _ => {}
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "summary" => self.summary = value.to_owned(),
            "db.statement" => self.statement = value.to_owned(),
            _ => {}
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        if field.name() == "rows_returned" {
            self.rows_returned = value;
        }
    }
}

impl<S: Subscriber> Layer<S> for Counter {
    fn on_event(&self, event: &Event<'_>, _: LayerContext<'_, S>) {
        if event.metadata().target() != "sqlx::query" {
            return;
        }
        let mut fields = Fields::default();
        event.record(&mut fields);
        let sql = if fields.statement.trim().is_empty() { fields.summary } else { fields.statement };
        self.0.0.lock().unwrap().push(Ran { sql, rows_returned: fields.rows_returned });
    }
}

/// `future`, counting the statements it runs while polled into `statements`.
pub fn counted<F: Future>(statements: &Statements, future: F) -> Counted<F> {
    let subscriber = tracing_subscriber::registry().with(Counter(statements.clone()));
    Counted { dispatch: Dispatch::new(subscriber), future: Box::pin(future) }
}

/// A future polled under a statement counter (see [`counted`]).
pub struct Counted<F> {
    dispatch: Dispatch,
    future: Pin<Box<F>>,
}

impl<F: Future> Future for Counted<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        tracing::dispatcher::with_default(&this.dispatch, || this.future.as_mut().poll(cx))
    }
}
