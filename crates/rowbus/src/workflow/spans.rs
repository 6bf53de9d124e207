//! The spans of workflows: a run in a `rowbus.workflow` span, the child of its message's
//! handler span (`rowbus.message`, which continues the starter's trace), and each step
//! that runs (not one a replay returns from the record) in a `rowbus.step` span, its
//! child. With the `opentelemetry` feature and `tracing-opentelemetry`'s layer they are
//! exported as OpenTelemetry spans; otherwise they are plain `tracing` spans.

use tracing::Span;
use tracing::field::Empty;

use crate::names::QueueTable;

/// The span of a run of workflow `id` (`name`, `version`) of `queue`, at its message's
/// `attempt`; its `rowbus.workflow.outcome` is recorded once the run ends.
pub(super) fn run_span(queue: &QueueTable, name: &str, version: &str, id: &str, attempt: u32) -> Span {
    tracing::info_span!(
        "rowbus.workflow",
        otel.name = %format!("workflow {name}"),
        otel.kind = "internal",
        rowbus.queue = %queue,
        rowbus.workflow.name = name,
        rowbus.workflow.version = version,
        rowbus.workflow.id = id,
        rowbus.workflow.attempt = attempt,
        rowbus.workflow.outcome = Empty,
    )
}

/// The span of step `name` at position `seq` of workflow `id` of `queue`, as it runs; its
/// `rowbus.step.attempts` and `rowbus.step.outcome` are recorded once it ends.
pub(super) fn step_span(queue: &QueueTable, id: &str, name: &str, seq: u32) -> Span {
    tracing::info_span!(
        "rowbus.step",
        otel.name = %format!("step {name}"),
        otel.kind = "internal",
        rowbus.queue = %queue,
        rowbus.workflow.id = id,
        rowbus.step.name = name,
        rowbus.step.seq = seq,
        rowbus.step.attempts = Empty,
        rowbus.step.outcome = Empty,
    )
}

/// Records on a step's span how it ended: after `attempts`, `done` or failed.
pub(super) fn step_ended(span: &Span, attempts: u32, done: bool) {
    span.record("rowbus.step.attempts", attempts);
    span.record("rowbus.step.outcome", if done { "done" } else { "failed" });
}
