//! Durable workflows: an async function registered by name, run as a message of a queue,
//! whose steps run at most once per workflow and whose results are recorded before the
//! next step, so that a run after a crash, a lease expiry or a deploy replays the
//! recorded steps and goes on from the first that is not recorded.
//!
//! Entered through [`Workflows`] (register, deploy, start, run, read a result, emit an
//! event, cancel, list), whose runner hands each workflow a [`Context`] (steps, durable
//! sleeps, events). The rooms: `registry` is [`Workflows`]; `context` the [`Context`] a
//! workflow runs with; `replay` the pure matching of the running code's steps against
//! the recorded ones (the determinism guard); `spans` the tracing spans of runs and
//! steps; `start` starts and ends workflows (a child's end told to its parent) for
//! both; `store` the statements on the workflow
//! tables (`sql::WorkflowSql`); `testing` runs workflows inline for tests (feature
//! `testing`). A layer above `broker`: a workflow run is a broker message, put off with a
//! snooze while it sleeps or waits and made due at once (`Queue::make_due_now`) when an
//! event it may wait for arrives. docs/workflows.md is the guide.

mod context;
mod registry;
mod replay;
mod spans;
mod start;
mod store;
#[cfg(feature = "testing")]
mod testing;

use std::time::SystemTime;

pub use context::Context;
pub use registry::{REFUSED_WAIT, Start, Workflows};
pub use start::MAX_NAME_CHARS;

use crate::error::Error;

/// Why a workflow, a step or an operation on workflows failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkflowError {
    /// A step used its attempts and failed: recorded, so a replay returns this same
    /// error without running it. The workflow may handle it; returned from the workflow,
    /// it fails the workflow.
    #[error("step `{name}` (#{seq}) failed: {error}")]
    Step {
        /// The step's name.
        name: String,
        /// Its position in the workflow, from 0.
        seq: u32,
        /// Its last error.
        error: String,
    },
    /// The code asked for a step another name was recorded under at its position: the
    /// workflow's code changed under a running workflow (see docs/workflows.md,
    /// "Versions"). The workflow fails with this error.
    #[error(
        "workflow `{workflow}` is not deterministic: step #{seq} was recorded as `{recorded}`, \
         and this code asks for `{found}` there (its code changed while it ran; version it)"
    )]
    Nondeterministic {
        /// The workflow's id.
        workflow: String,
        /// The position.
        seq: u32,
        /// The name recorded there.
        recorded: String,
        /// The name this code gave.
        found: String,
    },
    /// A child workflow ([`Context::start_child`]) ended failed or cancelled: its id and
    /// its error. The parent may handle it.
    #[error("child workflow `{id}` failed: {error}")]
    Child {
        /// The child's id.
        id: String,
        /// Its error as recorded (`cancelled` for a cancelled one).
        error: String,
    },
    /// The workflow failed: its error as recorded (the text of the error it returned).
    #[error("workflow failed: {0}")]
    Failed(String),
    /// The workflow was cancelled before it ended.
    #[error("workflow `{0}` was cancelled")]
    Cancelled(String),
    /// No workflow has this id in this queue.
    #[error("no workflow `{0}` in this queue")]
    NotFound(String),
    /// No workflow of this name is registered in this process: a runner logs this error
    /// as a warning and puts the workflow's message off for [`REFUSED_WAIT`] (its attempt
    /// not counted), for a process that registered it.
    #[error("no workflow named `{0}` is registered here")]
    Unregistered(String),
    /// The workflow was started under another version than the one registered here: this
    /// process refuses to run it, so that code of one version never replays the record of
    /// another. A runner logs this error as a warning and puts the workflow's message off
    /// for [`REFUSED_WAIT`] (its attempt not counted), for a process of its version.
    #[error(
        "workflow `{id}` was started as `{name}` version `{recorded}`; this process runs version `{registered}`"
    )]
    Version {
        /// The workflow's id.
        id: String,
        /// Its name.
        name: String,
        /// The version recorded at its start.
        recorded: String,
        /// The version registered here.
        registered: String,
    },
    /// A name or key longer than the workflow tables hold.
    #[error("the {what} is over {max} characters")]
    TooLong {
        /// What it names.
        what: &'static str,
        /// The most characters.
        max: usize,
    },
    /// A value could not be written or read as JSON (an input, output or event payload).
    #[error("JSON: {0}")]
    Json(String),
    /// The database, or the broker, refused: transient, so a runner runs the workflow
    /// again (replaying what was recorded).
    #[error(transparent)]
    Db(#[from] Error),
}

impl WorkflowError {
    /// A workflow's own failure, with this text: what a workflow returns to fail.
    pub fn failed(reason: impl std::fmt::Display) -> Self {
        WorkflowError::Failed(reason.to_string())
    }
}

impl From<sqlx::Error> for WorkflowError {
    fn from(e: sqlx::Error) -> Self {
        WorkflowError::Db(Error::from(e))
    }
}

impl From<serde_json::Error> for WorkflowError {
    fn from(e: serde_json::Error) -> Self {
        WorkflowError::Json(e.to_string())
    }
}

/// Where a workflow stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Status {
    /// Started and not ended: running, sleeping or waiting for an event.
    Running,
    /// Ended with an output.
    Succeeded,
    /// Ended with an error.
    Failed,
    /// Cancelled before it ended.
    Cancelled,
}

/// How many workflows of a queue are in each [`Status`]
/// ([`Workflows::counts`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkflowCounts {
    /// Running, sleeping or waiting for an event.
    pub running: u64,
    /// Ended with an output.
    pub succeeded: u64,
    /// Ended with an error.
    pub failed: u64,
    /// Cancelled before they ended.
    pub cancelled: u64,
}

impl WorkflowCounts {
    /// Each status with its count, in [`Status`]'s order.
    pub fn by_status(&self) -> [(Status, u64); 4] {
        [
            (Status::Running, self.running),
            (Status::Succeeded, self.succeeded),
            (Status::Failed, self.failed),
            (Status::Cancelled, self.cancelled),
        ]
    }
}

impl Status {
    /// Its name as stored: `running`, `succeeded`, `failed`, `cancelled`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Running => "running",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::Cancelled => "cancelled",
        }
    }

    /// The status of a stored name.
    pub fn parse(name: &str) -> Option<Self> {
        [Status::Running, Status::Succeeded, Status::Failed, Status::Cancelled]
            .into_iter()
            .find(|s| s.as_str() == name)
    }

    /// Whether it is an end (not running).
    pub fn is_end(self) -> bool {
        self != Status::Running
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A recorded step's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StepState {
    /// Ran and recorded its output.
    Done,
    /// Used its attempts and recorded its error.
    Failed,
    /// A durable sleep; its output is the wake time (µs since the Unix epoch).
    Sleep,
    /// Waiting for an event; its output is the deadline (µs), or none.
    Wait,
    /// A wait whose deadline passed with no event.
    TimedOut,
}

impl StepState {
    /// Its name as stored: `done`, `failed`, `sleep`, `wait`, `timeout`.
    pub fn as_str(self) -> &'static str {
        match self {
            StepState::Done => "done",
            StepState::Failed => "failed",
            StepState::Sleep => "sleep",
            StepState::Wait => "wait",
            StepState::TimedOut => "timeout",
        }
    }

    /// The state of a stored name.
    pub fn parse(name: &str) -> Option<Self> {
        [StepState::Done, StepState::Failed, StepState::Sleep, StepState::Wait, StepState::TimedOut]
            .into_iter()
            .find(|s| s.as_str() == name)
    }
}

/// A workflow as its row records it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkflowInfo {
    /// Its id.
    pub id: String,
    /// The name it was started under.
    pub name: String,
    /// The version it was started under (`""`: none).
    pub version: String,
    /// Where it stands.
    pub status: Status,
    /// Its input, as JSON.
    pub input: String,
    /// Its output as JSON, once it succeeded.
    pub output: Option<String>,
    /// Its error, once it failed.
    pub error: Option<String>,
    /// The idempotency key it was started with, if any.
    pub idempotency_key: Option<String>,
    /// The workflow that started it as a child, if one did.
    pub parent: Option<String>,
    /// The id of the message of the queue that runs it.
    pub message_id: Option<i64>,
    /// When it was started.
    pub created_at: SystemTime,
    /// When its row last changed (its start, or its end).
    pub updated_at: SystemTime,
}

/// A recorded step of a workflow.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StepInfo {
    /// Its position, from 0.
    pub seq: u32,
    /// Its name (`rowbus.sleep` for a sleep, `rowbus.event:NAME` for a wait).
    pub name: String,
    /// Its state.
    pub state: StepState,
    /// Its output as JSON (a time in µs for a sleep or a waiting wait), if any.
    pub output: Option<String>,
    /// Its error, if it failed.
    pub error: Option<String>,
    /// How many attempts it took.
    pub attempts: u32,
    /// When its first attempt began (for a sleep or a wait: when it began waiting).
    pub started_at: SystemTime,
    /// When it ended, if it did.
    pub ended_at: Option<SystemTime>,
}

/// Microseconds since the Unix epoch, by this process's clock.
pub(crate) fn now_us() -> i64 {
    micros_of(SystemTime::now())
}

/// `at` in microseconds since the Unix epoch (0 before it).
pub(crate) fn micros_of(at: SystemTime) -> i64 {
    at.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
}

/// The time `us` microseconds after the Unix epoch.
pub(crate) fn time_of(us: i64) -> SystemTime {
    SystemTime::UNIX_EPOCH + std::time::Duration::from_micros(u64::try_from(us).unwrap_or(0))
}
