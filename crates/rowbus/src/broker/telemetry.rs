//! Traces from publish to handler. A publish runs in a `rowbus.publish` span and a
//! handler in a `rowbus.message` span (a batch handler in `rowbus.batch`), each with the
//! attributes of OpenTelemetry's messaging conventions as fields. With the
//! `opentelemetry` feature, and `tracing-opentelemetry`'s layer in the subscriber, the
//! publish span's W3C trace context goes into each message's headers (`traceparent`,
//! `tracestate`), and the handler's span continues that trace as its child (a batch's
//! span links to each message's), across processes through the database. Without them
//! nothing is written and the spans are plain `tracing` spans.

use tracing::Span;

use crate::broker::Headers;
#[cfg(feature = "opentelemetry")]
use crate::broker::Message;
use crate::names::QueueTable;

/// The W3C header that carries the trace and the parent span.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C header that carries vendors' trace state, beside [`TRACEPARENT`].
pub const TRACESTATE: &str = "tracestate";

/// `messaging.system`: rowbus, not one of the conventions' named brokers.
const SYSTEM: &str = "rowbus";

/// The span of a publish of `count` messages to `queue`.
pub(in crate::broker) fn publish_span(queue: &QueueTable, count: usize) -> Span {
    tracing::info_span!(
        "rowbus.publish",
        otel.name = %format!("send {queue}"),
        otel.kind = "producer",
        messaging.system = SYSTEM,
        messaging.destination.name = %queue,
        messaging.operation.type = "send",
        messaging.operation.name = "publish",
        messaging.batch.message_count = count,
    )
}

/// The span of a handler of message `id` of `queue`, at its `attempt`, continuing the
/// trace its `headers` carry.
pub(in crate::broker) fn message_span(queue: &QueueTable, id: i64, attempt: u32, headers: &Headers) -> Span {
    let span = tracing::info_span!(
        "rowbus.message",
        id,
        attempt,
        otel.name = %format!("process {queue}"),
        otel.kind = "consumer",
        messaging.system = SYSTEM,
        messaging.destination.name = %queue,
        messaging.operation.type = "process",
        messaging.operation.name = "handle",
        messaging.message.id = %id,
        messaging.rowbus.attempt = attempt,
    );
    #[cfg(feature = "opentelemetry")]
    if !span.is_disabled() {
        otel::continue_trace(&span, headers);
    }
    #[cfg(not(feature = "opentelemetry"))]
    let _ = headers;
    span
}

/// The span of a batch handler of `size` messages of `queue`, linked to the trace each
/// message's headers carry.
pub(in crate::broker) fn batch_span<'h>(
    queue: &QueueTable,
    size: usize,
    headers: impl Iterator<Item = &'h Headers>,
) -> Span {
    let span = tracing::info_span!(
        "rowbus.batch",
        size,
        otel.name = %format!("process {queue}"),
        otel.kind = "consumer",
        messaging.system = SYSTEM,
        messaging.destination.name = %queue,
        messaging.operation.type = "process",
        messaging.operation.name = "handle",
        messaging.batch.message_count = size,
    );
    #[cfg(feature = "opentelemetry")]
    if !span.is_disabled() {
        otel::link_traces(&span, headers);
    }
    #[cfg(not(feature = "opentelemetry"))]
    let _ = headers;
    span
}

/// Writes `span`'s trace context into each message's headers, but for a message that
/// carries one already (set by its caller, or published again from a handler).
#[cfg(feature = "opentelemetry")]
pub(in crate::broker) fn inject(span: &Span, messages: &mut [Message]) {
    otel::inject(span, messages);
}

#[cfg(feature = "opentelemetry")]
mod otel {
    use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
    use opentelemetry::trace::TraceContextExt as _;
    use opentelemetry_sdk::propagation::TraceContextPropagator;
    use tracing::Span;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;

    use super::{TRACEPARENT, TRACESTATE};
    use crate::broker::{Headers, Message};

    struct Writer<'a>(&'a mut Headers);

    impl Injector for Writer<'_> {
        fn set(&mut self, key: &str, value: String) {
            self.0.insert(key.to_owned(), value);
        }
    }

    struct Reader<'a>(&'a Headers);

    impl Extractor for Reader<'_> {
        fn get(&self, key: &str) -> Option<&str> {
            self.0.get(key).map(String::as_str)
        }

        fn keys(&self) -> Vec<&str> {
            [TRACEPARENT, TRACESTATE].into_iter().filter(|k| self.0.contains_key(*k)).collect()
        }
    }

    pub(super) fn inject(span: &Span, messages: &mut [Message]) {
        let context = span.context();
        if !context.span().span_context().is_valid() {
            return;
        }
        let propagator = TraceContextPropagator::new();
        for message in messages.iter_mut().filter(|m| !m.headers.contains_key(TRACEPARENT)) {
            propagator.inject_context(&context, &mut Writer(&mut message.headers));
        }
    }

    pub(super) fn continue_trace(span: &Span, headers: &Headers) {
        if headers.contains_key(TRACEPARENT) {
            let parent = TraceContextPropagator::new().extract(&Reader(headers));
            // Refused only for a span already entered: this one is new.
            let _ = span.set_parent(parent);
        }
    }

    pub(super) fn link_traces<'h>(span: &Span, headers: impl Iterator<Item = &'h Headers>) {
        let propagator = TraceContextPropagator::new();
        for headers in headers.filter(|h| h.contains_key(TRACEPARENT)) {
            let context = propagator.extract(&Reader(headers));
            let linked = context.span().span_context().clone();
            if linked.is_valid() {
                span.add_link(linked);
            }
        }
    }
}
