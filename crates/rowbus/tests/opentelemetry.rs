//! Traces from publish to handler (feature `opentelemetry`), against the real PostgreSQL
//! and MariaDB and a temporary SQLite file, with the SDK's in-memory exporter behind
//! `tracing-opentelemetry`: a publish inside a traced span writes `traceparent` into the
//! message's headers, and the handler's span is the publish span's child in the same
//! trace, with the messaging attributes; a batch handler's span links to each message's
//! trace; a publish outside any span starts a trace of its own, which its handler
//! continues. A workflow's runs are spans under its message's handler span, and the steps
//! that run are spans under their run's.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use common::place_test as database_test;
use common::{Brokers, Cleanup, Place, on_each_database, unique};
use opentelemetry::trace::{SpanKind, TraceId, TracerProvider as _};
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use rowbus::telemetry::TRACEPARENT;
use rowbus::{BrokerOptions, Message};
use tokio::sync::Notify;
use tracing::Instrument as _;
use tracing_subscriber::layer::SubscriberExt as _;

/// The process's tracer provider and its exporter, installed once behind a global
/// subscriber (the runner's tasks run on the runtime's threads): each test picks its own
/// spans out by its queue's name.
fn exporter() -> &'static (SdkTracerProvider, InMemorySpanExporter) {
    static INSTALLED: OnceLock<(SdkTracerProvider, InMemorySpanExporter)> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("rowbus-tests"));
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .expect("the only global subscriber");
        (provider, exporter)
    })
}

/// The finished spans of this test: those whose name or attributes name `queue`, or
/// named `root`.
fn spans(queue: &str, root: &str) -> Vec<SpanData> {
    let (provider, exporter) = exporter();
    provider.force_flush().expect("flushed");
    exporter
        .get_finished_spans()
        .expect("the exported spans")
        .into_iter()
        .filter(|s| {
            s.name == root
                || s.name.ends_with(&format!(" {queue}"))
                || attribute(s, "rowbus.queue").as_deref() == Some(queue)
        })
        .collect()
}

fn attribute(span: &SpanData, key: &str) -> Option<String> {
    span.attributes.iter().find(|kv| kv.key.as_str() == key).map(|kv| kv.value.to_string())
}

fn named<'a>(spans: &'a [SpanData], name: &str) -> Vec<&'a SpanData> {
    spans.iter().filter(|s| s.name == name).collect()
}

async fn a_handlers_span_continues_the_publishers_trace<DB: Brokers>(place: Place) {
    exporter();
    let cleanup = Cleanup::new(place.backend());
    let options = BrokerOptions { poll_interval: Duration::from_millis(20), ..BrokerOptions::default() };
    let broker = DB::broker(&place, options).await;
    let name = cleanup.queue(&unique("otel"));
    let root = format!("request {name}");
    let q = broker.queue(&name).unwrap();
    q.deploy().await.unwrap();

    // One publish alone and one in a transaction, inside the request's span; one outside
    // any span.
    let request = tracing::info_span!("request", otel.name = %root);
    async {
        q.publish(Message::text("alone")).await.unwrap();
        let mut tx = broker.begin().await.unwrap();
        tx.publish(&q, Message::text("in a transaction")).await.unwrap();
        tx.commit().await.unwrap();
    }
    .instrument(request)
    .await;
    q.publish(Message::text("untraced")).await.unwrap();

    let handled = Arc::new(AtomicUsize::new(0));
    let all = Arc::new(Notify::new());
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop = {
        let all = all.clone();
        async move { all.notified().await }
    };
    let (h, a, s) = (handled.clone(), all.clone(), seen.clone());
    q.subscribe()
        .until(stop)
        .run(move |delivery| {
            let (h, a, s) = (h.clone(), a.clone(), s.clone());
            async move {
                s.lock()
                    .unwrap()
                    .push((delivery.text()?.to_owned(), delivery.header(TRACEPARENT).map(str::to_owned)));
                if h.fetch_add(1, Ordering::SeqCst) + 1 == 3 {
                    a.notify_one();
                }
                Ok::<_, rowbus::Error>(())
            }
        })
        .await
        .unwrap();

    let spans = spans(&name, &root);
    let request = named(&spans, &root);
    assert_eq!(request.len(), 1, "{spans:#?}");
    let trace = request[0].span_context.trace_id();
    let publishes = named(&spans, &format!("send {name}"));
    let handlers = named(&spans, &format!("process {name}"));
    assert_eq!((publishes.len(), handlers.len()), (3, 3), "{spans:#?}");

    for (payload, header) in seen.lock().unwrap().iter() {
        match payload.as_str() {
            // Its publish span was a root: a trace of its own.
            "untraced" => {
                let header = header.as_deref().expect("the untraced publish's own traceparent");
                assert!(!header.contains(&trace.to_string()), "{header} is not of the request's trace");
            }
            _ => {
                let header = header.as_deref().unwrap_or_else(|| panic!("{payload}: no traceparent"));
                assert!(
                    header.starts_with(&format!("00-{trace}-")),
                    "{payload}: {header} is not of trace {trace}"
                );
            }
        }
    }
    let traced_publishes: Vec<_> = publishes.iter().filter(|p| p.span_context.trace_id() == trace).collect();
    assert_eq!(traced_publishes.len(), 2, "the two publishes in the request: {publishes:#?}");
    for publish in &traced_publishes {
        assert_eq!(publish.parent_span_id, request[0].span_context.span_id());
        assert_eq!(publish.span_kind, SpanKind::Producer);
        assert_eq!(attribute(publish, "messaging.destination.name").as_deref(), Some(name.as_str()));
        // Each handler is the child of its publish.
        let child = handlers
            .iter()
            .find(|h| h.parent_span_id == publish.span_context.span_id())
            .unwrap_or_else(|| panic!("no handler span under {publish:#?}: {handlers:#?}"));
        assert_eq!(child.span_context.trace_id(), trace);
        assert_eq!(child.span_kind, SpanKind::Consumer);
        for (key, value) in [
            ("messaging.system", "rowbus"),
            ("messaging.destination.name", name.as_str()),
            ("messaging.operation.type", "process"),
            ("messaging.rowbus.attempt", "1"),
        ] {
            assert_eq!(attribute(child, key).as_deref(), Some(value), "{key} of {child:#?}");
        }
        assert!(attribute(child, "messaging.message.id").is_some(), "{child:#?}");
    }
    let untraced: Vec<_> = handlers.iter().filter(|h| h.span_context.trace_id() != trace).collect();
    assert_eq!(untraced.len(), 1, "the untraced message's handler is in its publish's trace");
    let own = publishes.iter().find(|p| p.span_context.trace_id() != trace).expect("the untraced publish");
    assert_eq!(untraced[0].parent_span_id, own.span_context.span_id());
    assert_ne!(untraced[0].span_context.trace_id(), TraceId::INVALID);
    broker.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(a_handlers_span_continues_the_publishers_trace);

async fn a_batch_handlers_span_links_each_messages_trace<DB: Brokers>(place: Place) {
    exporter();
    let cleanup = Cleanup::new(place.backend());
    let broker = DB::broker(&place, BrokerOptions::default()).await;
    let name = cleanup.queue(&unique("otelb"));
    let root = format!("request {name}");
    let q = broker.queue(&name).unwrap();
    q.deploy().await.unwrap();
    let request = tracing::info_span!("request", otel.name = %root);
    q.publish_batch([Message::text("a"), Message::text("b")]).instrument(request).await.unwrap();

    let done = Arc::new(Notify::new());
    let stop = {
        let done = done.clone();
        async move { done.notified().await }
    };
    q.subscribe()
        .batch(10)
        .until(stop)
        .run_batch(move |batch| {
            let done = done.clone();
            async move {
                assert_eq!(batch.len(), 2, "published in one statement, claimed in one batch");
                done.notify_one();
                Ok::<_, rowbus::Error>(())
            }
        })
        .await
        .unwrap();

    let spans = spans(&name, &root);
    let trace = named(&spans, &root)[0].span_context.trace_id();
    let publish = named(&spans, &format!("send {name}"));
    assert_eq!(publish.len(), 1, "{spans:#?}");
    assert_eq!(attribute(publish[0], "messaging.batch.message_count").as_deref(), Some("2"));
    let batch = named(&spans, &format!("process {name}"));
    assert_eq!(batch.len(), 1, "{spans:#?}");
    let links: Vec<_> = batch[0].links.iter().map(|l| l.span_context.clone()).collect();
    assert_eq!(links.len(), 2, "{batch:#?}");
    for link in links {
        assert_eq!((link.trace_id(), link.span_id()), (trace, publish[0].span_context.span_id()));
    }
    broker.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(a_batch_handlers_span_links_each_messages_trace);

/// The transactional runners' handlers too: `run_tx`'s span is the publish span's child,
/// `run_batch_tx`'s links to each message's trace.
async fn a_transactional_handlers_span_continues_the_publishers_trace<DB: Brokers>(place: Place) {
    exporter();
    let cleanup = Cleanup::new(place.backend());
    let broker = DB::broker(&place, BrokerOptions::default()).await;
    let name = cleanup.queue(&unique("otelt"));
    let root = format!("request {name}");
    let q = broker.queue(&name).unwrap();
    q.deploy().await.unwrap();
    let request = tracing::info_span!("request", otel.name = %root);
    q.publish(Message::text("one")).instrument(request.clone()).await.unwrap();

    let done = Arc::new(Notify::new());
    let stop = {
        let done = done.clone();
        async move { done.notified().await }
    };
    let d = done.clone();
    q.subscribe()
        .until(stop)
        .run_tx(move |_conn, _message| {
            let d = d.clone();
            Box::pin(async move {
                d.notify_one();
                Ok::<_, rowbus::Error>(())
            })
        })
        .await
        .unwrap();
    q.publish_batch([Message::text("a"), Message::text("b")]).instrument(request).await.unwrap();
    let stop = {
        let done = done.clone();
        async move { done.notified().await }
    };
    q.subscribe()
        .batch(10)
        .until(stop)
        .run_batch_tx(move |_conn, batch| {
            let done = done.clone();
            Box::pin(async move {
                assert_eq!(batch.len(), 2, "published in one statement, claimed in one batch");
                done.notify_one();
                Ok::<_, rowbus::Error>(())
            })
        })
        .await
        .unwrap();

    let spans = spans(&name, &root);
    let trace = named(&spans, &root)[0].span_context.trace_id();
    let publishes = named(&spans, &format!("send {name}"));
    let handlers = named(&spans, &format!("process {name}"));
    assert_eq!((publishes.len(), handlers.len()), (2, 2), "{spans:#?}");
    let count = |n: &str| {
        let found =
            publishes.iter().find(|p| attribute(p, "messaging.batch.message_count").as_deref() == Some(n));
        found.unwrap_or_else(|| panic!("no publish of {n}: {publishes:#?}"))
    };
    let (one, two) = (count("1"), count("2"));
    let child = handlers.iter().find(|h| h.parent_span_id == one.span_context.span_id());
    let child = child.unwrap_or_else(|| panic!("no handler span under the publish: {spans:#?}"));
    assert_eq!((child.span_context.trace_id(), child.span_kind.clone()), (trace, SpanKind::Consumer));
    assert_eq!(attribute(child, "messaging.rowbus.attempt").as_deref(), Some("1"));
    let batch = handlers.iter().find(|h| h.links.len() == 2).unwrap_or_else(|| panic!("{handlers:#?}"));
    for link in batch.links.iter() {
        assert_eq!(
            (link.span_context.trace_id(), link.span_context.span_id()),
            (trace, two.span_context.span_id())
        );
    }
    broker.shutdown(Duration::from_secs(1)).await;
}
on_each_database!(a_transactional_handlers_span_continues_the_publishers_trace);

/// A workflow started inside a traced request: each run is a `workflow NAME` span, the
/// child of its message's handler span in the request's trace, with its outcome (the
/// first suspended by a sleep, the second succeeded); each step that runs is a
/// `step NAME` span under its run's, with its attempts; the steps the second run replays
/// from the record make none.
async fn a_workflows_runs_and_steps_are_spans_in_its_starters_trace<DB: Brokers>(place: Place) {
    use rowbus::RetryPolicy;
    use rowbus::workflow::{Context, WorkflowError, Workflows};

    exporter();
    let cleanup = Cleanup::new(place.backend());
    let options = BrokerOptions { poll_interval: Duration::from_millis(20), ..BrokerOptions::default() };
    let broker = DB::broker(&place, options).await;
    let name = cleanup.queue(&unique("otelw"));
    for suffix in ["_wf", "_wfs", "_wfe"] {
        cleanup.table(&format!("{name}{suffix}"));
    }
    let root = format!("request {name}");
    let q = broker.queue(&name).unwrap();
    q.deploy().await.unwrap();
    let workflows = Workflows::new(q.clone());
    workflows.deploy().await.unwrap();
    let flaky = Arc::new(AtomicUsize::new(0));
    let f = flaky.clone();
    workflows.register("order", move |ctx: Context<DB>, (): ()| {
        let flaky = f.clone();
        async move {
            ctx.step("charge", || async { Ok::<_, std::io::Error>(1) }).await?;
            let retry =
                RetryPolicy { max_attempts: 3, base: Duration::from_millis(5), ..RetryPolicy::default() };
            ctx.step_with("reserve", &retry, || {
                let flaky = flaky.clone();
                async move {
                    match flaky.fetch_add(1, Ordering::SeqCst) {
                        0 => Err("not yet".to_owned()),
                        _ => Ok(2),
                    }
                }
            })
            .await?;
            ctx.sleep(Duration::from_millis(200)).await?;
            ctx.step("ship", || async { Ok::<_, std::io::Error>(3) }).await?;
            Ok::<_, WorkflowError>(())
        }
    });
    let request = tracing::info_span!("request", otel.name = %root);
    let id = workflows.start("order", &()).instrument(request).await.unwrap();
    let runner = {
        let (workflows, q) = (workflows.clone(), q.clone());
        tokio::spawn(async move { workflows.run(q.subscribe().workers(2)).await })
    };
    tokio::time::timeout(Duration::from_secs(30), workflows.result::<()>(&id))
        .await
        .expect("the workflow ends in time")
        .unwrap();
    broker.shutdown(Duration::from_secs(1)).await;
    runner.await.unwrap().unwrap();

    let spans = spans(&name, &root);
    let trace = named(&spans, &root)[0].span_context.trace_id();
    let handlers = named(&spans, &format!("process {name}"));
    let runs = named(&spans, "workflow order");
    assert_eq!(runs.len(), 2, "{spans:#?}");
    for run in &runs {
        assert_eq!(run.span_context.trace_id(), trace, "{run:#?}");
        assert!(handlers.iter().any(|h| h.span_context.span_id() == run.parent_span_id), "{run:#?}");
        assert_eq!(attribute(run, "rowbus.workflow.id").as_deref(), Some(id.as_str()));
    }
    let mut outcomes: Vec<_> =
        runs.iter().map(|r| attribute(r, "rowbus.workflow.outcome").unwrap()).collect();
    outcomes.sort();
    assert_eq!(outcomes, ["succeeded", "suspended"]);
    for (step, attempts) in [("charge", "1"), ("reserve", "2"), ("ship", "1")] {
        let ran = named(&spans, &format!("step {step}"));
        assert_eq!(ran.len(), 1, "{step} ran once, replayed without a span: {spans:#?}");
        assert!(runs.iter().any(|r| r.span_context.span_id() == ran[0].parent_span_id), "{ran:#?}");
        assert_eq!(attribute(ran[0], "rowbus.step.attempts").as_deref(), Some(attempts), "{ran:#?}");
        assert_eq!(attribute(ran[0], "rowbus.step.outcome").as_deref(), Some("done"));
    }
    workflows.drop_tables().await.unwrap();
}
on_each_database!(a_workflows_runs_and_steps_are_spans_in_its_starters_trace);
