//! The [`Context`] a workflow runs with: its steps, durable sleeps and events.
//!
//! Each step takes the next position of the workflow (0, 1, 2, ...). A position recorded
//! already returns its record (the determinism guard checks its name first); a fresh one
//! runs and is recorded before the step returns. A sleep or a wait that cannot end now
//! suspends the run: the context tells the runner when to run it again and never
//! resolves, and the runner drops the workflow's future and puts its message off (see
//! `registry`).

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tracing::Instrument as _;

use super::replay::{Recorded, Replay, remember, replay};
use super::spans;
use super::start::{CHILD_EVENT, ChildEnd, Starter};
use super::store::{self, NewStep};
use super::{StepState, WorkflowError, micros_of, now_us};
use crate::broker::{Queue, RetryPolicy};
use crate::sql::{Db, WorkflowSql, begin};

/// The name a sleep is recorded under.
pub(crate) const SLEEP_STEP: &str = "rowbus.sleep";
/// The prefix of the name a wait for an event is recorded under (then the event's name).
pub(crate) const EVENT_STEP: &str = "rowbus.event:";
/// The name a wait for the first of several children is recorded under.
pub(crate) const ANY_STEP: &str = "rowbus.any";

/// Why and until when a run stopped before its workflow ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Suspension {
    /// When to run it again (µs since the Unix epoch).
    pub until_us: i64,
    /// The events it waits for, if it does: one of these emitted while the run stops
    /// makes it due at once.
    pub events: Vec<String>,
}

/// What a workflow's steps run with; cloned freely (all clones are the one run).
///
/// Call its steps one after another (not several at once): their positions are their
/// order. Everything a workflow does that must not run twice, or whose result must not
/// change on a replay (a payment, a read of the clock, a random number), goes in a step.
pub struct Context<DB: Db> {
    inner: Arc<Inner<DB>>,
}

impl<DB: Db> Clone for Context<DB> {
    fn clone(&self) -> Self {
        Context { inner: self.inner.clone() }
    }
}

impl<DB: Db> std::fmt::Debug for Context<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("workflow", &self.inner.id).finish()
    }
}

struct Inner<DB: Db> {
    queue: Queue<DB>,
    sql: Arc<WorkflowSql>,
    starter: Arc<Starter<DB>>,
    id: String,
    /// The next step's position and what is recorded.
    state: Mutex<State>,
    /// Set once a sleep or a wait suspends the run.
    suspended: Mutex<Option<Suspension>>,
    /// Told when `suspended` is set.
    suspend: Arc<Notify>,
    /// The longest a wait stays put off before it looks for its event again, for events
    /// emitted by plain SQL (which wakes nobody).
    recheck: Duration,
}

struct State {
    next: u32,
    recorded: Vec<Recorded>,
}

impl<DB: Db> Context<DB> {
    pub(crate) fn new(
        starter: Arc<Starter<DB>>,
        id: String,
        recorded: Vec<Recorded>,
        recheck: Duration,
    ) -> Self {
        Context {
            inner: Arc::new(Inner {
                queue: starter.queue.clone(),
                sql: starter.sql.clone(),
                starter,
                id,
                state: Mutex::new(State { next: 0, recorded }),
                suspended: Mutex::new(None),
                suspend: Arc::new(Notify::new()),
                recheck,
            }),
        }
    }

    /// The workflow's id.
    pub fn workflow_id(&self) -> &str {
        &self.inner.id
    }

    /// The queue the workflow runs in.
    pub fn queue(&self) -> &Queue<DB> {
        &self.inner.queue
    }

    /// What the runner waits on besides the workflow: told once the run suspended.
    pub(crate) fn suspend_signal(&self) -> Arc<Notify> {
        self.inner.suspend.clone()
    }

    /// Why the run suspended, once it did.
    pub(crate) fn suspension(&self) -> Option<Suspension> {
        self.inner.suspended.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// The next position, and what is recorded there against `name`.
    fn next(&self, name: &str) -> Result<(u32, Option<Recorded>), WorkflowError> {
        let mut state = self.inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let seq = state.next;
        state.next += 1;
        match replay(&state.recorded, seq, name) {
            Replay::Fresh => Ok((seq, None)),
            Replay::Recorded(r) => Ok((seq, Some(r.clone()))),
            Replay::Mismatch { recorded } => Err(self.mismatch(seq, recorded, name)),
        }
    }

    fn mismatch(&self, seq: u32, recorded: &str, found: &str) -> WorkflowError {
        WorkflowError::Nondeterministic {
            workflow: self.inner.id.clone(),
            seq,
            recorded: recorded.to_owned(),
            found: found.to_owned(),
        }
    }

    fn remember(&self, step: Recorded) {
        let mut state = self.inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        remember(&mut state.recorded, step);
    }

    /// Remembers that this run moved step `seq` to `state` with `output`.
    fn moved(&self, seq: u32, state: StepState, output: Option<String>) {
        let mut st = self.inner.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(r) = st.recorded.iter_mut().find(|r| r.seq == seq) {
            r.state = state.as_str().to_owned();
            r.output = output;
        }
    }

    /// Records `new`, or, where another run recorded its position first, returns theirs.
    async fn insert_or_theirs(&self, new: &NewStep<'_>) -> Result<Recorded, WorkflowError> {
        let mut conn = self.inner.queue.broker().pool().acquire().await?;
        if store::insert_step::<DB>(&mut conn, &self.inner.sql, new).await? {
            return Ok(self.record(new));
        }
        drop(conn);
        self.theirs(new.seq, new.name).await
    }

    /// The step at `seq` as another run recorded it (its record took the position
    /// first), checked against `name`.
    async fn theirs(&self, seq: u32, name: &str) -> Result<Recorded, WorkflowError> {
        let mut conn = self.inner.queue.broker().pool().acquire().await?;
        let found = store::recorded_at::<DB>(&mut conn, &self.inner.sql, &self.inner.id, seq).await?;
        let found =
            found.ok_or_else(|| WorkflowError::failed(format!("step #{seq} vanished from the record")))?;
        if found.name != name {
            return Err(self.mismatch(seq, &found.name, name));
        }
        self.remember(found.clone());
        Ok(found)
    }

    /// Runs `step` once for this workflow and records its output (as JSON) before it
    /// returns; on a replay, returns the recorded output without running it. One attempt:
    /// its error is recorded and returned as [`WorkflowError::Step`] (and returned again
    /// on every replay). See [`step_with`](Self::step_with) for retries.
    ///
    /// A step whose process crashes after it ran and before its output was recorded runs
    /// again on the next run: make its effects idempotent, or use
    /// [`transaction_step`](Self::transaction_step) for database writes.
    pub async fn step<T, F, Fut, E>(&self, name: &str, step: F) -> Result<T, WorkflowError>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: std::fmt::Display,
    {
        let once = RetryPolicy { max_attempts: 1, ..RetryPolicy::default() };
        self.step_with(name, &once, step).await
    }

    /// [`step`](Self::step) with retries: up to `policy.max_attempts` attempts, waiting
    /// `policy.delay(attempt)` after each failed one (in this run, holding its worker).
    /// Only the last error is recorded.
    pub async fn step_with<T, F, Fut, E>(
        &self,
        name: &str,
        policy: &RetryPolicy,
        mut step: F,
    ) -> Result<T, WorkflowError>
    where
        T: Serialize + DeserializeOwned,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: std::fmt::Display,
    {
        let (seq, recorded) = self.next(name)?;
        if let Some(r) = recorded {
            return self.output_of(&r);
        }
        let started_us = now_us();
        let span = spans::step_span(self.inner.queue.table(), &self.inner.id, name, seq);
        let mut attempt = 0;
        let result: Result<T, String> = async {
            loop {
                attempt += 1;
                match step().await {
                    Ok(value) => break Ok(value),
                    Err(error) if policy.exhausted(attempt) => break Err(error.to_string()),
                    Err(_) => tokio::time::sleep(policy.delay(attempt)).await,
                }
            }
        }
        .instrument(span.clone())
        .await;
        spans::step_ended(&span, attempt, result.is_ok());
        let result = match result {
            Ok(value) => Ok(serde_json::to_string(&value)?),
            Err(error) => Err(error),
        };
        let (state, output, error) = match &result {
            Ok(output) => (StepState::Done, Some(output.as_str()), None),
            Err(error) => (StepState::Failed, None, Some(error.as_str())),
        };
        let new = NewStep {
            id: &self.inner.id,
            seq,
            name,
            state,
            output,
            error,
            attempts: attempt,
            started_us,
            ended_us: Some(now_us()),
        };
        let recorded = self.insert_or_theirs(&new).await?;
        self.output_of(&recorded)
    }

    /// Runs `step` inside a database transaction that also records its output: its
    /// writes on the connection it is given commit with the record or not at all, so they
    /// happen exactly once however often the workflow runs again. `Err` rolls back its
    /// writes, records the error and returns [`WorkflowError::Step`].
    pub async fn transaction_step<T, F, E>(&self, name: &str, step: F) -> Result<T, WorkflowError>
    where
        T: Serialize + DeserializeOwned,
        F: for<'c> FnOnce(&'c mut DB::Connection) -> BoxFuture<'c, Result<T, E>>,
        E: std::fmt::Display,
    {
        let (seq, recorded) = self.next(name)?;
        if let Some(r) = recorded {
            return self.output_of(&r);
        }
        let started_us = now_us();
        let mut tx = begin(self.inner.queue.broker().pool(), DB::WRITE_BEGIN).await?;
        let span = spans::step_span(self.inner.queue.table(), &self.inner.id, name, seq);
        let result = step(&mut *tx).instrument(span.clone()).await;
        spans::step_ended(&span, 1, result.is_ok());
        let mut new = NewStep {
            id: &self.inner.id,
            seq,
            name,
            state: StepState::Done,
            output: None,
            error: None,
            attempts: 1,
            started_us,
            ended_us: Some(now_us()),
        };
        let (output, error);
        match &result {
            Ok(value) => {
                output = serde_json::to_string(value)?;
                new.output = Some(&output);
                if store::insert_step::<DB>(&mut tx, &self.inner.sql, &new).await? {
                    tx.commit().await?;
                    let recorded = self.record(&new);
                    return self.output_of(&recorded);
                }
                tx.rollback().await?;
            }
            Err(e) => {
                tx.rollback().await?;
                error = e.to_string();
                new.state = StepState::Failed;
                new.error = Some(&error);
                let mut conn = self.inner.queue.broker().pool().acquire().await?;
                if store::insert_step::<DB>(&mut conn, &self.inner.sql, &new).await? {
                    let recorded = self.record(&new);
                    return self.output_of(&recorded);
                }
            }
        }
        let theirs = self.theirs(seq, name).await?;
        self.output_of(&theirs)
    }

    /// Remembers `new` as recorded; the record.
    fn record(&self, new: &NewStep<'_>) -> Recorded {
        let recorded = Recorded {
            seq: new.seq,
            name: new.name.to_owned(),
            state: new.state.as_str().to_owned(),
            output: new.output.map(str::to_owned),
            error: new.error.map(str::to_owned),
        };
        self.remember(recorded.clone());
        recorded
    }

    /// A recorded step's output, or its error.
    fn output_of<T: DeserializeOwned>(&self, r: &Recorded) -> Result<T, WorkflowError> {
        match StepState::parse(&r.state) {
            Some(StepState::Failed) => Err(WorkflowError::Step {
                name: r.name.clone(),
                seq: r.seq,
                error: r.error.clone().unwrap_or_default(),
            }),
            _ => Ok(serde_json::from_str(r.output.as_deref().unwrap_or("null"))?),
        }
    }

    /// Sleeps for `duration`, durably: the wake time is recorded, so a run after a crash
    /// or a restart wakes at the same time. The run stops meanwhile without holding a
    /// worker; its message is put off to that time.
    pub async fn sleep(&self, duration: Duration) -> Result<(), WorkflowError> {
        self.sleep_until(SystemTime::now() + duration).await
    }

    /// Sleeps until `at`, durably (see [`sleep`](Self::sleep)).
    pub async fn sleep_until(&self, at: SystemTime) -> Result<(), WorkflowError> {
        let (seq, recorded) = self.next(SLEEP_STEP)?;
        let wake_us = match recorded {
            Some(r) => r.output.as_deref().and_then(|o| o.parse().ok()).unwrap_or(0),
            None => {
                let wake_us = micros_of(at);
                let output = wake_us.to_string();
                let now = now_us();
                let new = NewStep {
                    id: &self.inner.id,
                    seq,
                    name: SLEEP_STEP,
                    state: StepState::Sleep,
                    output: Some(&output),
                    error: None,
                    attempts: 1,
                    started_us: now,
                    ended_us: None,
                };
                let recorded = self.insert_or_theirs(&new).await?;
                recorded.output.as_deref().and_then(|o| o.parse().ok()).unwrap_or(wake_us)
            }
        };
        if now_us() >= wake_us {
            return Ok(());
        }
        self.suspend(Suspension { until_us: wake_us, events: Vec::new() }).await
    }

    /// Waits for the event `name` emitted to this workflow
    /// ([`Workflows::emit_event`](super::Workflows::emit_event), or the plain SQL of
    /// docs/workflows.md), at most `timeout` (`None`: for ever): its payload, or `None`
    /// when the timeout passed first. Each emitted event is delivered to one wait, once;
    /// one emitted before the wait is kept for it. The run stops while it waits, without
    /// holding a worker; an event emitted through [`Workflows`](super::Workflows) makes it
    /// due at once, one inserted by plain SQL is found within the recheck interval
    /// ([`Workflows::recheck`](super::Workflows::recheck)).
    pub async fn wait_for_event<T: DeserializeOwned>(
        &self,
        name: &str,
        timeout: Option<Duration>,
    ) -> Result<Option<T>, WorkflowError> {
        let step_name = format!("{EVENT_STEP}{name}");
        let (seq, recorded) = self.next(&step_name)?;
        let recorded = match recorded {
            Some(r) => r,
            None => {
                let now = now_us();
                let deadline =
                    timeout.map(|t| now.saturating_add(i64::try_from(t.as_micros()).unwrap_or(i64::MAX)));
                let output = deadline.map(|d| d.to_string());
                let new = NewStep {
                    id: &self.inner.id,
                    seq,
                    name: &step_name,
                    state: StepState::Wait,
                    output: output.as_deref(),
                    error: None,
                    attempts: 1,
                    started_us: now,
                    ended_us: None,
                };
                self.insert_or_theirs(&new).await?
            }
        };
        match StepState::parse(&recorded.state) {
            Some(StepState::Done) => {
                return Ok(Some(serde_json::from_str(recorded.output.as_deref().unwrap_or("null"))?));
            }
            Some(StepState::TimedOut) => return Ok(None),
            _ => {}
        }
        let deadline: Option<i64> = recorded.output.as_deref().and_then(|o| o.parse().ok());
        match self.take_event(seq, name, deadline).await? {
            Taken::Event(payload) => Ok(Some(serde_json::from_str(&payload)?)),
            Taken::TimedOut => Ok(None),
            Taken::Again => {
                // Another run moved the step meanwhile: its record decides.
                let theirs = self.theirs(seq, &step_name).await?;
                match StepState::parse(&theirs.state) {
                    Some(StepState::Done) => {
                        Ok(Some(serde_json::from_str(theirs.output.as_deref().unwrap_or("null"))?))
                    }
                    _ => Ok(None),
                }
            }
            Taken::Nothing => {
                let recheck = now_us()
                    .saturating_add(i64::try_from(self.inner.recheck.as_micros()).unwrap_or(i64::MAX));
                let until_us = deadline.map_or(recheck, |d| d.min(recheck));
                self.suspend(Suspension { until_us, events: vec![name.to_owned()] }).await
            }
        }
    }

    /// In one transaction: consumes the oldest event `name` into step `seq` and records
    /// its payload as the step's output; or, with none and the deadline passed, records
    /// the timeout.
    async fn take_event(&self, seq: u32, name: &str, deadline: Option<i64>) -> Result<Taken, WorkflowError> {
        let (sql, id) = (&self.inner.sql, self.inner.id.as_str());
        let mut tx = begin(self.inner.queue.broker().pool(), DB::WRITE_BEGIN).await?;
        let now = now_us();
        let found = store::event::<DB>(&mut tx, sql, id, name, true).await?;
        let taken = match found {
            Some((event, payload)) => {
                let consumed = DB::execute(
                    &mut tx,
                    &sql.consume_event,
                    &[crate::driver::Arg::Int(seq.into()), crate::driver::Arg::Int(event)],
                )
                .await?;
                let moved = consumed == 1
                    && store::move_step::<DB>(
                        &mut tx,
                        sql,
                        (id, seq),
                        StepState::Wait,
                        StepState::Done,
                        Some(&payload),
                        now,
                    )
                    .await?;
                match moved {
                    true => Taken::Event(payload),
                    false => Taken::Again,
                }
            }
            None if deadline.is_some_and(|d| now >= d) => {
                match store::move_step::<DB>(
                    &mut tx,
                    sql,
                    (id, seq),
                    StepState::Wait,
                    StepState::TimedOut,
                    None,
                    now,
                )
                .await?
                {
                    true => Taken::TimedOut,
                    false => Taken::Again,
                }
            }
            None => Taken::Nothing,
        };
        match taken {
            Taken::Event(_) | Taken::TimedOut => tx.commit().await?,
            Taken::Again | Taken::Nothing => tx.rollback().await?,
        }
        match &taken {
            Taken::Event(payload) => self.moved(seq, StepState::Done, Some(payload.clone())),
            Taken::TimedOut => self.moved(seq, StepState::TimedOut, None),
            Taken::Again | Taken::Nothing => {}
        }
        Ok(taken)
    }

    /// Starts workflow `name` with `input` as a child of this one, once (a step: a replay
    /// returns the same child's id, and a crash between the start and its record starts
    /// no second child). The child runs as any workflow of this queue; its end is told to
    /// this workflow, for [`child_result`](Self::child_result) and
    /// [`join_all`](Self::join_all); cancelling this workflow cancels it.
    pub async fn start_child<I: Serialize + ?Sized>(
        &self,
        name: &str,
        input: &I,
    ) -> Result<String, WorkflowError> {
        let step_name = format!("{CHILD_EVENT}{name}");
        let (seq, recorded) = self.next(&step_name)?;
        if let Some(r) = recorded {
            return self.output_of(&r);
        }
        let started_us = now_us();
        let input = serde_json::to_string(input)?;
        let key = format!("{}/{seq}", self.inner.id);
        let mut tx = self.inner.queue.broker().begin().await?;
        let child =
            self.inner.starter.start_in(&mut tx, name, &input, Some(&key), Some(&self.inner.id)).await?;
        tx.commit().await?;
        let output = serde_json::to_string(&child)?;
        let new = NewStep {
            id: &self.inner.id,
            seq,
            name: &step_name,
            state: StepState::Done,
            output: Some(&output),
            error: None,
            attempts: 1,
            started_us,
            ended_us: Some(now_us()),
        };
        let recorded = self.insert_or_theirs(&new).await?;
        self.output_of(&recorded)
    }

    /// Waits for child `child` (of [`start_child`](Self::start_child)) to end: its
    /// output, or [`WorkflowError::Child`] with its error when it failed or was
    /// cancelled. The run stops meanwhile without holding a worker; the child's end makes
    /// it due at once.
    pub async fn child_result<O: DeserializeOwned>(&self, child: &str) -> Result<O, WorkflowError> {
        let end: Option<ChildEnd> = self.wait_for_event(&format!("{CHILD_EVENT}{child}"), None).await?;
        match end {
            Some(ChildEnd::Ok(value)) => Ok(serde_json::from_value(value)?),
            Some(ChildEnd::Err(error)) => Err(WorkflowError::Child { id: child.to_owned(), error }),
            None => Err(WorkflowError::Child { id: child.to_owned(), error: "no end recorded".to_owned() }),
        }
    }

    /// Waits for every child of `children` to end (fan-in): each one's output or
    /// [`WorkflowError::Child`], in the order given. Other errors (the database's) end
    /// the wait.
    pub async fn join_all<O: DeserializeOwned>(
        &self,
        children: &[String],
    ) -> Result<Vec<Result<O, WorkflowError>>, WorkflowError> {
        let mut ends = Vec::with_capacity(children.len());
        for child in children {
            match self.child_result(child).await {
                Err(error @ WorkflowError::Child { .. }) => ends.push(Err(error)),
                Err(error) => return Err(error),
                Ok(output) => ends.push(Ok(output)),
            }
        }
        Ok(ends)
    }

    /// Waits for the first of `children` (of [`start_child`](Self::start_child)) to end
    /// (fan-in, any): its id, and its output or [`WorkflowError::Child`] with its error.
    /// The first is the one whose end was told first; a step records which, so a replay
    /// returns the same child whatever ended since. The others run on, and their ends stay
    /// for [`child_result`](Self::child_result) and [`join_all`](Self::join_all), as does
    /// this one's. The run stops meanwhile without holding a worker; a child's end makes
    /// it due at once.
    pub async fn join_any<O: DeserializeOwned>(
        &self,
        children: &[String],
    ) -> Result<(String, Result<O, WorkflowError>), WorkflowError> {
        if children.is_empty() {
            return Err(WorkflowError::failed("join_any of no child"));
        }
        let (seq, recorded) = self.next(ANY_STEP)?;
        let recorded = match recorded {
            Some(r) => r,
            None => {
                let new = NewStep {
                    id: &self.inner.id,
                    seq,
                    name: ANY_STEP,
                    state: StepState::Wait,
                    output: None,
                    error: None,
                    attempts: 1,
                    started_us: now_us(),
                    ended_us: None,
                };
                self.insert_or_theirs(&new).await?
            }
        };
        let output = match (StepState::parse(&recorded.state), recorded.output) {
            (Some(StepState::Done), Some(output)) => output,
            _ => match self.take_first_end(seq, children).await? {
                Some(output) => output,
                None => {
                    let until_us = now_us()
                        .saturating_add(i64::try_from(self.inner.recheck.as_micros()).unwrap_or(i64::MAX));
                    let events = children.iter().map(|c| format!("{CHILD_EVENT}{c}")).collect();
                    return self.suspend(Suspension { until_us, events }).await;
                }
            },
        };
        let first: FirstEnd = serde_json::from_str(&output)?;
        let end = match first.end {
            ChildEnd::Ok(value) => Ok(serde_json::from_value(value)?),
            ChildEnd::Err(error) => Err(WorkflowError::Child { id: first.child.clone(), error }),
        };
        Ok((first.child, end))
    }

    /// Records in step `seq` the first end of `children` told (the event of the lowest
    /// id, left for the child's own wait): the step's output, or `None` with no end yet.
    /// Where another run recorded it first, theirs.
    async fn take_first_end(&self, seq: u32, children: &[String]) -> Result<Option<String>, WorkflowError> {
        let (sql, id) = (&self.inner.sql, self.inner.id.as_str());
        let mut conn = self.inner.queue.broker().pool().acquire().await?;
        let mut first: Option<(i64, &String, String)> = None;
        for child in children {
            let name = format!("{CHILD_EVENT}{child}");
            if let Some((event, payload)) = store::event::<DB>(&mut conn, sql, id, &name, false).await?
                && first.as_ref().is_none_or(|(at, _, _)| event < *at)
            {
                first = Some((event, child, payload));
            }
        }
        let Some((_, child, payload)) = first else { return Ok(None) };
        let end: serde_json::Value = serde_json::from_str(&payload)?;
        let output = serde_json::to_string(&serde_json::json!({ "child": child, "end": end }))?;
        let moved = store::move_step::<DB>(
            &mut conn,
            sql,
            (id, seq),
            StepState::Wait,
            StepState::Done,
            Some(&output),
            now_us(),
        )
        .await?;
        drop(conn);
        if moved {
            self.moved(seq, StepState::Done, Some(output.clone()));
            return Ok(Some(output));
        }
        // Another run moved the step meanwhile: its record decides.
        Ok(self.theirs(seq, ANY_STEP).await?.output)
    }

    /// Stops the run: tells the runner why, and never resolves (the runner drops it).
    async fn suspend<T>(&self, why: Suspension) -> Result<T, WorkflowError> {
        *self.inner.suspended.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(why);
        self.inner.suspend.notify_one();
        std::future::pending().await
    }
}

/// What a [`Context::join_any`] step records: the first child to end, and how.
#[derive(serde::Serialize, serde::Deserialize)]
struct FirstEnd {
    child: String,
    end: ChildEnd,
}

/// What [`Context::take_event`] did.
enum Taken {
    /// Consumed an event: its payload.
    Event(String),
    /// Recorded the timeout.
    TimedOut,
    /// Found the step moved by another run.
    Again,
    /// Found no event before the deadline.
    Nothing,
}
