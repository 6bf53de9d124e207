//! [`Workflows`]: the registered workflows of one queue, and starting, running, reading,
//! emitting to and cancelling them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::FutureExt as _;
use futures::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tracing::{Instrument as _, debug, warn};

use super::context::Context;
use super::start::{Starter, check_len};
use super::store;
use super::{Status, StepInfo, WorkflowCounts, WorkflowError, WorkflowInfo, now_us};
use crate::broker::{BrokerTx, Delivery, Outcome, Queue, SubscriptionBuilder};
use crate::deploy::columns_on;
use crate::driver::Arg;
use crate::error::{Error, is_missing_table};
use crate::sql::{Db, WORKFLOWS_SUFFIX, WorkflowSql};

/// A registered workflow, its input and output as JSON.
type Run<DB> =
    Arc<dyn Fn(Context<DB>, String) -> BoxFuture<'static, Result<String, WorkflowError>> + Send + Sync>;

struct Registration<DB: Db> {
    version: String,
    run: Run<DB>,
}

/// How [`Workflows::start_with`] starts a workflow.
///
/// ```
/// let start = rowbus::workflow::Start::default().idempotency_key("order-42");
/// assert_eq!(start.key.as_deref(), Some("order-42"));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Start {
    /// Its idempotency key: a second start with the same key (in this queue, in any
    /// process, also racing) starts nothing and returns the first start's id.
    pub key: Option<String>,
}

impl Start {
    /// These options with idempotency key `key`.
    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }
}

/// The workflows of one queue: registered by name, started (also inside a
/// [`BrokerTx`]), run by the queue's subscriptions, read back. Clones share everything.
///
/// ```no_run
/// # async fn f(queue: rowbus::Queue<sqlx::Postgres>) -> Result<(), rowbus::workflow::WorkflowError> {
/// use rowbus::workflow::{Context, WorkflowError, Workflows};
///
/// let workflows = Workflows::new(queue.clone());
/// workflows.register("greet", |ctx: Context<sqlx::Postgres>, name: String| async move {
///     let greeting = ctx.step("compose", || async { Ok::<_, std::io::Error>(format!("hello {name}")) }).await?;
///     ctx.sleep(std::time::Duration::from_secs(1)).await?;
///     Ok::<_, WorkflowError>(greeting)
/// });
/// workflows.deploy().await?;
/// let id = workflows.start("greet", &"ada").await?;
/// tokio::spawn({
///     let workflows = workflows.clone();
///     async move { workflows.run(queue.subscribe().workers(8)).await }
/// });
/// let greeting: String = workflows.result(&id).await?;
/// # Ok(()) }
/// ```
pub struct Workflows<DB: Db> {
    inner: Arc<Inner<DB>>,
}

impl<DB: Db> Clone for Workflows<DB> {
    fn clone(&self) -> Self {
        Workflows { inner: self.inner.clone() }
    }
}

impl<DB: Db> std::fmt::Debug for Workflows<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<String> = self
            .inner
            .registered
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .keys()
            .cloned()
            .collect();
        f.debug_struct("Workflows")
            .field("queue", self.inner.queue.table())
            .field("registered", &names)
            .finish()
    }
}

struct Inner<DB: Db> {
    queue: Queue<DB>,
    group: String,
    sql: Arc<WorkflowSql>,
    starter: Arc<Starter<DB>>,
    registered: RwLock<HashMap<String, Arc<Registration<DB>>>>,
    /// Told when a workflow ends in this process: [`Workflows::result`] looks again.
    ended: Notify,
    recheck: RwLock<Duration>,
}

/// How long a wait for an event stays put off before it looks again by default.
const DEFAULT_RECHECK: Duration = Duration::from_secs(60);
/// How long a runner puts off a workflow it cannot run: of a name not registered in its
/// process, or of another version than the one registered (see
/// [`WorkflowError::Version`]).
pub const REFUSED_WAIT: Duration = Duration::from_secs(2);
/// The longest [`Workflows::result`] waits between two reads of a workflow still running.
const RESULT_POLL_MAX: Duration = Duration::from_millis(100);

impl<DB: Db> Workflows<DB> {
    /// The workflows of `queue`, run in its default group.
    pub fn new(queue: Queue<DB>) -> Self {
        Self::in_group(queue, "")
    }

    /// The workflows of `queue`, run in `group`: their messages go there and
    /// [`run`](Self::run) claims there (a way to route workflows of one version to the
    /// processes that run it; see docs/workflows.md, "Versions").
    pub fn in_group(queue: Queue<DB>, group: &str) -> Self {
        let sql = Arc::new(WorkflowSql::new::<DB>(queue.table()));
        let starter = Arc::new(Starter::new(queue.clone(), sql.clone(), group));
        Workflows {
            inner: Arc::new(Inner {
                queue,
                group: group.to_owned(),
                sql,
                starter,
                registered: RwLock::default(),
                ended: Notify::new(),
                recheck: RwLock::new(DEFAULT_RECHECK),
            }),
        }
    }

    /// The queue.
    pub fn queue(&self) -> &Queue<DB> {
        &self.inner.queue
    }

    /// Registers workflow `name` (version `""`): `run` gets a [`Context`] and the input
    /// given to [`start`](Self::start), and returns the workflow's output, or
    /// [`WorkflowError`] to fail it. A second registration of a name replaces the first.
    pub fn register<I, O, F, Fut>(&self, name: &str, run: F) -> &Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + Send + 'static,
        F: Fn(Context<DB>, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, WorkflowError>> + Send + 'static,
    {
        self.register_version(name, "", run)
    }

    /// Registers workflow `name` at `version`: a workflow started here records the
    /// version, and a runner refuses one recorded under another version
    /// ([`WorkflowError::Version`]). A name or version over [`MAX_NAME_CHARS`](super::MAX_NAME_CHARS) characters
    /// is refused when a workflow is started with it.
    pub fn register_version<I, O, F, Fut>(&self, name: &str, version: &str, run: F) -> &Self
    where
        I: DeserializeOwned + Send + 'static,
        O: Serialize + Send + 'static,
        F: Fn(Context<DB>, I) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<O, WorkflowError>> + Send + 'static,
    {
        let run = Arc::new(run);
        let erased: Run<DB> = Arc::new(move |ctx, input: String| {
            let run = run.clone();
            Box::pin(async move {
                let input: I = serde_json::from_str(&input)?;
                let output = run(ctx, input).await?;
                Ok(serde_json::to_string(&output)?)
            })
        });
        let registration = Arc::new(Registration { version: version.to_owned(), run: erased });
        self.inner
            .starter
            .versions
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name.to_owned(), version.to_owned());
        self.inner
            .registered
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(name.to_owned(), registration);
        self
    }

    /// How long a wait for an event stays put off before it looks for its event again
    /// (60 s by default): how soon an event inserted by plain SQL is found. An event
    /// emitted with [`emit_event`](Self::emit_event) is found at once.
    pub fn recheck(&self, every: Duration) -> &Self {
        *self.inner.recheck.write().unwrap_or_else(std::sync::PoisonError::into_inner) = every;
        self
    }

    /// The queue's workflow statements.
    #[cfg(feature = "testing")]
    pub(super) fn inner_sql(&self) -> &Arc<WorkflowSql> {
        &self.inner.sql
    }

    fn registration(&self, name: &str) -> Option<Arc<Registration<DB>>> {
        self.inner.registered.read().unwrap_or_else(std::sync::PoisonError::into_inner).get(name).cloned()
    }

    /// Creates the queue's workflow tables (`<table>_wf`, `_wfs`, `_wfe`) where they are
    /// missing. Deploy the queue itself first ([`Queue::deploy`]).
    pub async fn deploy(&self) -> Result<(), WorkflowError> {
        let mut conn = self.inner.queue.broker().pool().acquire().await?;
        for statement in &self.inner.sql.create {
            DB::execute(&mut conn, &Arc::from(statement.as_str()), &[]).await?;
        }
        Ok(())
    }

    /// Drops the queue's workflow tables, with every workflow in them.
    pub async fn drop_tables(&self) -> Result<(), WorkflowError> {
        let mut conn = self.inner.queue.broker().pool().acquire().await?;
        for statement in &self.inner.sql.drop {
            DB::execute(&mut conn, &Arc::from(statement.as_str()), &[]).await?;
        }
        Ok(())
    }

    /// Starts workflow `name` with `input` (serialized as JSON) in a transaction of its
    /// own; its id.
    pub async fn start<I: Serialize + ?Sized>(&self, name: &str, input: &I) -> Result<String, WorkflowError> {
        self.start_with(name, input, &Start::default()).await
    }

    /// [`start`](Self::start) with `options` (an idempotency key).
    pub async fn start_with<I: Serialize + ?Sized>(
        &self,
        name: &str,
        input: &I,
        options: &Start,
    ) -> Result<String, WorkflowError> {
        let mut tx = self.inner.queue.broker().begin().await?;
        let id = self.start_in(&mut tx, name, input, options).await?;
        tx.commit().await?;
        Ok(id)
    }

    /// Starts workflow `name` inside `tx`, with your own writes: it exists, and runs,
    /// only if `tx` commits. With an idempotency key taken already (or by a transaction
    /// that commits while this one waits for it), starts nothing and returns the first
    /// start's id. The version recorded is the one registered here under `name` (`""`
    /// when it is not registered here).
    pub async fn start_in<I: Serialize + ?Sized>(
        &self,
        tx: &mut BrokerTx<DB>,
        name: &str,
        input: &I,
        options: &Start,
    ) -> Result<String, WorkflowError> {
        let input = serde_json::to_string(input)?;
        self.inner.starter.start_in(tx, name, &input, options.key.as_deref(), None).await
    }

    /// Workflow `id` as its row stands, if there is one.
    pub async fn get(&self, id: &str) -> Result<Option<WorkflowInfo>, WorkflowError> {
        let mut conn = self.inner.queue.broker().pool().acquire().await?;
        store::load::<DB>(&mut conn, &self.inner.sql, id).await
    }

    /// The recorded steps of workflow `id`, in order.
    pub async fn steps(&self, id: &str) -> Result<Vec<StepInfo>, WorkflowError> {
        let mut conn = self.inner.queue.broker().pool().acquire().await?;
        store::steps::<DB>(&mut conn, &self.inner.sql, id).await
    }

    /// Up to `limit` workflows of the queue, newest first, of `status` (`None`: any).
    pub async fn list(&self, status: Option<Status>, limit: u32) -> Result<Vec<WorkflowInfo>, WorkflowError> {
        let mut conn = self.inner.queue.broker().pool().acquire().await?;
        store::list::<DB>(&mut conn, &self.inner.sql, status, limit).await
    }

    /// How many workflows of the queue are in each status, or `None` where the queue's
    /// workflow tables are not deployed ([`deploy`](Self::deploy)).
    pub async fn counts(&self) -> Result<Option<WorkflowCounts>, WorkflowError> {
        let mut conn = self.inner.queue.broker().pool().acquire().await?;
        // Looked up first: a statement on a missing table is an error in the server's log,
        // and the dashboard asks at every refresh of every queue.
        let table = self.inner.queue.table();
        let name = format!("{}{WORKFLOWS_SUFFIX}", table.name());
        if columns_on::<DB>(&mut conn, table.schema(), &name).await?.is_none() {
            return Ok(None);
        }
        let rows = match DB::fetch_rows(&mut conn, &self.inner.sql.counts, &[], 1).await {
            Ok(rows) => rows,
            // Dropped since.
            Err(e) if is_missing_table(&e) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let mut counts = WorkflowCounts::default();
        for row in rows {
            let n = u64::try_from(row.int(0)).unwrap_or(0);
            match Status::parse(row.text(0)) {
                Some(Status::Running) => counts.running += n,
                Some(Status::Succeeded) => counts.succeeded += n,
                Some(Status::Failed) => counts.failed += n,
                Some(Status::Cancelled) => counts.cancelled += n,
                None => {}
            }
        }
        Ok(Some(counts))
    }

    /// Waits for workflow `id` to end, in this process or any other: its output, or
    /// [`WorkflowError::Failed`] with its recorded error, [`WorkflowError::Cancelled`],
    /// [`WorkflowError::NotFound`]. Reads the row again when a workflow ends in this
    /// process, and otherwise at least every 100 ms (sooner at first).
    pub async fn result<O: DeserializeOwned>(&self, id: &str) -> Result<O, WorkflowError> {
        let mut wait = Duration::from_millis(1);
        loop {
            let ended = self.inner.ended.notified();
            tokio::pin!(ended);
            // Registered before the read: an end in this process after it is not missed.
            ended.as_mut().enable();
            let Some(info) = self.get(id).await? else { return Err(WorkflowError::NotFound(id.to_owned())) };
            match info.status {
                Status::Succeeded => {
                    return Ok(serde_json::from_str(info.output.as_deref().unwrap_or("null"))?);
                }
                Status::Failed => return Err(WorkflowError::Failed(info.error.unwrap_or_default())),
                Status::Cancelled => return Err(WorkflowError::Cancelled(id.to_owned())),
                Status::Running => {}
            }
            let _ = tokio::time::timeout(wait, ended).await;
            wait = (wait * 2).min(RESULT_POLL_MAX);
        }
    }

    /// Emits event `name` with `payload` (as JSON) to workflow `id`, from any process:
    /// kept until a wait for `name` takes it (each event is delivered to one wait, once),
    /// and the workflow made due at once if it is put off. [`WorkflowError::NotFound`]
    /// when the queue has no such workflow.
    pub async fn emit_event<P: Serialize + ?Sized>(
        &self,
        id: &str,
        name: &str,
        payload: &P,
    ) -> Result<(), WorkflowError> {
        check_len("event name", name)?;
        let payload = serde_json::to_string(payload)?;
        let mut conn = self.inner.queue.broker().pool().acquire().await?;
        let Some(info) = store::load::<DB>(&mut conn, &self.inner.sql, id).await? else {
            return Err(WorkflowError::NotFound(id.to_owned()));
        };
        DB::execute(&mut conn, &self.inner.sql.emit, &[Arg::Text(id), Arg::Text(name), Arg::Text(&payload)])
            .await?;
        drop(conn);
        if let (Some(message), false) = (info.message_id, info.status.is_end()) {
            self.inner.queue.make_due_now(message, &self.inner.group).await?;
        }
        Ok(())
    }

    /// Cancels workflow `id` if it is running: marked cancelled, its message cancelled (a
    /// run in flight is asked to stop; see [`Queue::cancel`]), its parent told (as a
    /// [`WorkflowError::Child`] error), and its running children cancelled the same way,
    /// down the tree. Whether it was running.
    pub async fn cancel(&self, id: &str) -> Result<bool, WorkflowError> {
        let Some(info) = self.get(id).await? else { return Err(WorkflowError::NotFound(id.to_owned())) };
        let ended = self.finish(id, Status::Cancelled, None, Some(Status::Cancelled.as_str())).await?;
        if let Some(message) = info.message_id {
            self.inner.queue.cancel(&[message]).await?;
        }
        let children = {
            let mut conn = self.inner.queue.broker().pool().acquire().await?;
            DB::fetch_rows(&mut conn, &self.inner.sql.children, &[Arg::Text(id)], 1).await?
        };
        for child in children {
            Box::pin(self.cancel(child.text(0))).await?;
        }
        Ok(ended)
    }

    /// Ends running workflow `id` as `status` says, telling its parent: whether it was
    /// running.
    async fn finish(
        &self,
        id: &str,
        status: Status,
        output: Option<&str>,
        error: Option<&str>,
    ) -> Result<bool, WorkflowError> {
        let ended = self.inner.starter.finish(id, status, output, error).await?;
        self.inner.ended.notify_waiters();
        Ok(ended)
    }

    /// Runs the workflows of this queue on `subscription`'s workers (in this registry's
    /// group) until the broker shuts down: each claimed message runs its workflow from
    /// the top, replaying what is recorded.
    pub async fn run(&self, subscription: SubscriptionBuilder<DB>) -> Result<(), Error> {
        let workflows = self.clone();
        subscription
            .group(self.inner.group.clone())
            .run(move |delivery| {
                let workflows = workflows.clone();
                async move { workflows.handle(delivery).await }
            })
            .await
    }

    /// Runs the workflow of one claimed message (see [`run`](Self::run)). `Err` (a
    /// database error) or a panic leaves the message to run again after the broker's
    /// backoff, except at its last attempt, which ends the workflow failed with that
    /// error. A workflow of a name not registered here, or of another version, is put off
    /// for [`REFUSED_WAIT`] (its attempt not counted), with a warning.
    pub async fn handle(&self, delivery: Delivery<DB>) -> Result<Outcome, WorkflowError> {
        let id = delivery.text()?.to_owned();
        let sql = &self.inner.sql;
        let (info, recorded) = {
            let mut conn = self.inner.queue.broker().pool().acquire().await?;
            let Some(info) = store::load::<DB>(&mut conn, sql, &id).await? else {
                warn!(table = %self.inner.queue.table(), id, "a workflow message names no workflow; dropped");
                return Ok(Outcome::Drop);
            };
            if info.status.is_end() {
                return Ok(Outcome::Ack);
            }
            let recorded = store::recorded::<DB>(&mut conn, sql, &id).await?;
            (info, recorded)
        };
        let Some(registration) = self.registration(&info.name) else {
            let refused = WorkflowError::Unregistered(info.name);
            warn!(table = %self.inner.queue.table(), id, error = %refused, "workflow refused; put off for a process that runs it");
            return Ok(Outcome::Snooze(REFUSED_WAIT));
        };
        if !info.version.is_empty() && info.version != registration.version {
            let refused = WorkflowError::Version {
                id,
                name: info.name,
                recorded: info.version,
                registered: registration.version.clone(),
            };
            warn!(table = %self.inner.queue.table(), error = %refused, "workflow refused; put off for a process of its version");
            return Ok(Outcome::Snooze(REFUSED_WAIT));
        }
        let recheck = *self.inner.recheck.read().unwrap_or_else(std::sync::PoisonError::into_inner);
        let ctx = Context::new(self.inner.starter.clone(), id.clone(), recorded, recheck);
        let signal = ctx.suspend_signal();
        let suspended = signal.notified();
        let span = super::spans::run_span(
            self.inner.queue.table(),
            &info.name,
            &registration.version,
            &id,
            delivery.attempt(),
        );
        let run = std::panic::AssertUnwindSafe((registration.run)(ctx.clone(), info.input.clone()))
            .catch_unwind()
            .instrument(span.clone());
        let ended = tokio::select! {
            biased;
            () = suspended => None,
            ended = run => Some(ended),
        };
        span.record(
            "rowbus.workflow.outcome",
            match &ended {
                None => "suspended",
                Some(Ok(Ok(_))) => "succeeded",
                Some(Ok(Err(WorkflowError::Db(_)))) => "database error",
                Some(Ok(Err(_))) => "failed",
                Some(Err(_)) => "panicked",
            },
        );
        // The message's last attempt: a run that crashes or cannot reach the database ends
        // the workflow failed rather than leave it running with its message dead-lettered.
        let last = self.inner.queue.broker().options().retry.exhausted(delivery.attempt());
        match ended {
            None => self.put_off(&ctx, delivery, info.message_id).await,
            Some(Err(panic)) if last => {
                let error = format!("its last run panicked: {}", panic_text(panic.as_ref()));
                self.finish(&id, Status::Failed, None, Some(&error)).await?;
                Ok(Outcome::Ack)
            }
            Some(Err(panic)) => std::panic::resume_unwind(panic),
            Some(Ok(Ok(output))) => {
                self.finish(&id, Status::Succeeded, Some(&output), None).await?;
                Ok(Outcome::Ack)
            }
            Some(Ok(Err(WorkflowError::Db(error)))) if last => {
                let error = format!("its last run failed: {error}");
                self.finish(&id, Status::Failed, None, Some(&error)).await?;
                Ok(Outcome::Ack)
            }
            Some(Ok(Err(WorkflowError::Db(error)))) => Err(WorkflowError::Db(error)),
            Some(Ok(Err(error))) => {
                debug!(table = %self.inner.queue.table(), id, %error, "workflow failed");
                self.finish(&id, Status::Failed, None, Some(&error.to_string())).await?;
                Ok(Outcome::Ack)
            }
        }
    }

    /// A run that suspended: its message put off to the time it asked for; then, if it
    /// waits for an event that is there already (emitted while it ran), made due at once.
    async fn put_off(
        &self,
        ctx: &Context<DB>,
        delivery: Delivery<DB>,
        message: Option<i64>,
    ) -> Result<Outcome, WorkflowError> {
        let why = ctx.suspension().expect("the signal is sent after the suspension is set");
        let after = Duration::from_micros(u64::try_from(why.until_us - now_us()).unwrap_or(0));
        let id = delivery.id();
        delivery.snooze(after).await?;
        if !why.events.is_empty() {
            let mut conn = self.inner.queue.broker().pool().acquire().await?;
            let mut there = false;
            for event in &why.events {
                there = store::event::<DB>(&mut conn, &self.inner.sql, ctx.workflow_id(), event, false)
                    .await?
                    .is_some();
                if there {
                    break;
                }
            }
            drop(conn);
            if there {
                self.inner.queue.make_due_now(message.unwrap_or(id), &self.inner.group).await?;
            }
        }
        // Settled by the snooze: the runner leaves it.
        Ok(Outcome::Ack)
    }
}

/// A panic's message, where it has one.
fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic")
}
