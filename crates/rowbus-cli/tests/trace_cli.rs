//! A trace across processes through the database: the test process publishes inside a
//! traced span (the library's `opentelemetry` feature, the SDK's in-memory exporter), and
//! `rowbus consume --exec` in another process hands the command the publisher's context
//! in `TRACEPARENT`: the publish span's trace and id. On each database.

mod common;

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{Database, Kind, LINE_TIMEOUT, Running, on_each_database, rowbus, run_quietly, unique};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use rowbus::{Broker, BrokerOptions, Db, DbPool, Message, OnPool};
use tracing::Instrument as _;
use tracing_subscriber::layer::SubscriberExt as _;

fn exporter() -> &'static (SdkTracerProvider, InMemorySpanExporter) {
    static INSTALLED: OnceLock<(SdkTracerProvider, InMemorySpanExporter)> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        let exporter = InMemorySpanExporter::default();
        let provider = SdkTracerProvider::builder().with_simple_exporter(exporter.clone()).build();
        let layer = tracing_opentelemetry::layer().with_tracer(provider.tracer("rowbus-cli-tests"));
        tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
            .expect("the only global subscriber");
        (provider, exporter)
    })
}

/// Publishes one message to `queue` inside a traced span.
struct PublishTraced<'a> {
    queue: &'a str,
}

impl OnPool for PublishTraced<'_> {
    type Output = ();

    async fn run<DB: Db>(self, pool: rowbus::sqlx::Pool<DB>) {
        let broker = Broker::new(pool, BrokerOptions::default()).await.unwrap();
        let q = broker.queue(self.queue).unwrap();
        let request = tracing::info_span!("request");
        q.publish(Message::text("traced")).instrument(request).await.unwrap();
        broker.shutdown(Duration::from_secs(1)).await;
    }
}

fn the_command_gets_the_publishers_trace(kind: Kind) {
    exporter();
    let notify_table = unique("tcli_notify");
    let database = Database::new(kind, &notify_table);
    database.cleanup.notify_table(&notify_table);
    let queue = database.cleanup.queue(&unique("tcli"));
    let out = std::env::temp_dir().join(unique("rowbus_tcli"));
    let rowbus_with = |args: &[&str]| {
        let mut cmd = rowbus();
        cmd.args(["--database-url", &database.url, "--notify-table", &notify_table]).args(args);
        cmd.env("OUT", &out);
        cmd
    };
    run_quietly(rowbus_with(&["deploy", "--queue", &queue]), None, database.server());

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let db = DbPool::connect(&database.url).await.unwrap();
        db.run(PublishTraced { queue: &queue }).await;
        db.close().await;
    });
    let (provider, exporter) = exporter();
    provider.force_flush().unwrap();
    let publish = exporter
        .get_finished_spans()
        .unwrap()
        .into_iter()
        .find(|s| s.name == format!("send {queue}"))
        .expect("the publish span");

    let mut consumer = Running::spawn(
        rowbus_with(&[
            "consume",
            &queue,
            "--exec",
            r#"printf '%s' "$TRACEPARENT" > "$OUT.tmp" && mv "$OUT.tmp" "$OUT""#,
        ]),
        Duration::from_secs(20),
    );
    consumer.await_stderr("consuming", LINE_TIMEOUT, |line| line.starts_with("rowbus: consuming "));
    let deadline = Instant::now() + LINE_TIMEOUT;
    let traceparent = loop {
        if let Ok(written) = std::fs::read_to_string(&out) {
            break written;
        }
        assert!(Instant::now() < deadline, "the command never ran");
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = consumer.stop("INT");
    let _ = std::fs::remove_file(&out);
    let context = publish.span_context;
    assert_eq!(traceparent, format!("00-{}-{}-01", context.trace_id(), context.span_id()));
}
on_each_database!(the_command_gets_the_publishers_trace);
