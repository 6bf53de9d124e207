//! `rowbus relay` end to end, in child processes against the real databases and the local
//! NATS, Redis, RabbitMQ and Mosquitto servers: `--help` shows each broker's options; bad
//! flags are refused in one line before anything connects; a relay SIGKILLed mid-stream and
//! started again loses nothing (JetStream drops the messages sent twice by their
//! Nats-Msg-Id; in Redis, RabbitMQ and MQTT a message that arrives twice carries the same id
//! and content); `rowbus stats` shows what the relays did.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{
    Database, Kind, Running, assert_error, assert_mentions, on_each_database, rowbus, run, run_with, show,
    text, unique,
};
use futures::StreamExt as _;

const NATS: &str = "nats://127.0.0.1:4222";
const REDIS: &str = "redis://127.0.0.1:6379";
/// How long a test waits for what should happen.
const DEADLINE: Duration = Duration::from_secs(60);

/// A runtime for the brokers' own clients.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
}

/// `rowbus --database-url URL ARGS...`, which must succeed quietly; its stdout.
fn ok(database: &Database, args: &[&str], input: Option<&[u8]>) -> String {
    let mut cmd = rowbus();
    cmd.args(["--database-url", &database.url]).args(args);
    let (output, _) = run_with(cmd, input, Duration::from_secs(60));
    assert!(
        output.status.success() && output.stderr.is_empty(),
        "`rowbus {}`\n{}",
        args.join(" "),
        show(&output)
    );
    text(&output.stdout)
}

/// A deployed queue of the test's own, holding `n` messages `m1`, `m2`, ...
fn filled(kind: Kind, name: &str, n: usize) -> (Database, String) {
    let q = unique(name);
    let database = Database::new(kind, &q);
    database.cleanup.queue(&q);
    ok(&database, &["deploy", "--queue", &q], None);
    let lines: String = (1..=n).map(|i| format!("m{i}\n")).collect();
    ok(&database, &["publish", &q, "-"], Some(lines.as_bytes()));
    (database, q)
}

/// The queue's messages left (every group, every state).
fn depth(database: &Database, q: &str) -> i64 {
    let json: serde_json::Value = serde_json::from_str(&ok(database, &["stats", "--json", q], None)).unwrap();
    json["queues"].as_array().unwrap().iter().map(|g| g["depth"].as_i64().unwrap()).sum()
}

/// The queue's counts, from `rowbus stats --json`.
fn counts(database: &Database, q: &str) -> serde_json::Value {
    let json: serde_json::Value = serde_json::from_str(&ok(database, &["stats", "--json", q], None)).unwrap();
    json["counts"][q].clone()
}

/// `rowbus relay Q ARGS...` started.
fn relay(database: &Database, q: &str, args: &[&str]) -> Running {
    let mut cmd = rowbus();
    cmd.args(["--database-url", &database.url, "relay", q]).args(args);
    let mut running = Running::spawn(cmd, Duration::from_secs(20));
    running.await_stderr("relaying", Duration::from_secs(20), |l| l.starts_with("rowbus: relaying"));
    running
}

/// Waits until `check` holds, or fails saying `what`.
fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < DEADLINE, "{what}: not within {DEADLINE:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A JetStream stream of the test's own covering `<name>.>`, deleted when dropped.
struct Stream {
    runtime: tokio::runtime::Runtime,
    context: async_nats::jetstream::Context,
    name: String,
}

impl Stream {
    fn new() -> Stream {
        let runtime = runtime();
        let name = unique("relaycli");
        let context = runtime.block_on(async {
            let client = async_nats::connect(NATS).await.unwrap_or_else(|e| panic!("NATS at {NATS}: {e}"));
            let context = async_nats::jetstream::new(client);
            context
                .create_stream(async_nats::jetstream::stream::Config {
                    name: name.clone(),
                    subjects: vec![format!("{name}.>")],
                    ..Default::default()
                })
                .await
                .unwrap();
            context
        });
        Stream { runtime, context, name }
    }

    fn count(&self) -> u64 {
        self.runtime.block_on(async {
            let mut stream = self.context.get_stream(&self.name).await.unwrap();
            stream.info().await.unwrap().state.messages
        })
    }

    /// The Nats-Msg-Id of every message, in the stream's order.
    fn ids(&self) -> Vec<String> {
        let total = self.count() as usize;
        self.runtime.block_on(async {
            use async_nats::jetstream::consumer;
            let stream = self.context.get_stream(&self.name).await.unwrap();
            let reader = stream
                .create_consumer(consumer::pull::Config {
                    ack_policy: consumer::AckPolicy::None,
                    ..Default::default()
                })
                .await
                .unwrap();
            let mut messages = reader.messages().await.unwrap();
            let mut ids = Vec::with_capacity(total);
            while ids.len() < total {
                let message = tokio::time::timeout(Duration::from_secs(10), messages.next())
                    .await
                    .expect("a message within 10 s")
                    .unwrap()
                    .unwrap();
                let id = message.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id")).map(|v| v.to_string());
                ids.push(id.unwrap_or_default());
            }
            ids
        })
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Err(e) = self.runtime.block_on(self.context.delete_stream(&self.name)) {
            eprintln!("cleanup: cannot delete stream {}, delete it by hand: {e}", self.name);
        }
    }
}

/// `--help` shows every broker's options under its own heading.
#[test]
fn help_shows_each_brokers_options() {
    let mut cmd = rowbus();
    cmd.args(["relay", "--help"]);
    let output = run(cmd);
    assert!(output.status.success(), "{}", show(&output));
    assert_mentions(
        &text(&output.stdout),
        &[
            "NATS JetStream (--to nats://",
            "--subject <S>",
            "--id-prefix <P>",
            "Redis Streams (--to redis://",
            "--stream <S>",
            "--maxlen <N>",
            "RabbitMQ (--to amqp://",
            "--exchange <E>",
            "--routing-key <K>",
            "MQTT (--to mqtt://",
            "--topic <T>",
            "--batch <N>",
            "--ordered",
            "--group <G>",
            "--leased",
            "--lease <DURATION>",
        ],
        "rowbus relay --help",
    );
}

/// What cannot work is refused in one line, before the database or the broker is asked.
#[test]
fn bad_flags_are_refused_in_one_line() {
    let file = std::env::temp_dir().join(format!("{}.sqlite", unique("relay_refused")));
    let url = format!("sqlite://{}", file.display());
    for (args, says) in [
        (vec!["--to", NATS], "relaying to NATS needs --subject"),
        (vec!["--to", REDIS], "relaying to Redis needs --stream"),
        (vec!["--to", REDIS, "--stream", "s", "--topic", "t"], "--topic is not for redis://127.0.0.1:6379"),
        (vec!["--to", NATS, "--subject", "a", "--maxlen", "5"], "--maxlen is not for nats://"),
        (vec!["--to", "kafka://127.0.0.1:9092"], "names no broker rowbus relays to"),
        (vec!["--to", "nats://u:secret@127.0.0.1:4222"], "relaying to NATS needs --subject"),
        (vec!["--to", NATS, "--subject", "orders.*"], "subject \"orders.*\" has a wildcard"),
        (vec!["--to", NATS, "--subject", "orders.>"], "subject \"orders.>\" has a wildcard"),
        (vec!["--to", NATS, "--subject", "{group}.>"], "subject \"{group}.>\" has a wildcard"),
        (vec!["--to", NATS, "--subject", "new orders"], "has white space"),
        (vec!["--to", NATS, "--subject", "orders..{key}"], "has an empty token"),
        (vec!["--to", "mqtt://127.0.0.1:1883", "--topic", "orders/#"], "topic \"orders/#\" has a wildcard"),
        (vec!["--to", "mqtt://127.0.0.1:1883", "--topic", "orders/+/{group}"], "has a wildcard"),
    ] {
        let mut cmd = rowbus();
        cmd.args(["--database-url", &url, "relay", "jobs"]).args(&args);
        let line = assert_error(&run(cmd), &args.join(" "));
        assert!(line.contains(says), "{args:?}: {line}");
        assert!(!line.contains("secret"), "a password is never printed: {line}");
    }
    // A template that cannot be read is clap's refusal, naming the flag.
    let mut cmd = rowbus();
    cmd.args(["--database-url", &url, "relay", "jobs", "--to", NATS, "--subject", "orders.{id}"]);
    let output = run(cmd);
    assert_eq!(output.status.code(), Some(2), "{}", show(&output));
    assert_mentions(&text(&output.stderr), &["--subject", "unknown placeholder {id}"], "a bad template");
    assert!(!file.exists(), "no SQLite file is made");
}

/// A subject no JetStream stream covers is refused at start, saying how to make one,
/// rather than every message dead-lettered; once a stream covers it, the relay runs.
#[test]
fn a_subject_without_a_stream_is_refused_at_start() {
    let (database, q) = filled(Kind::Sqlite, "relay_nostream", 2);
    let uncovered = format!("{}.jobs", unique("nostream"));
    let mut cmd = rowbus();
    cmd.args(["--database-url", &database.url, "relay", &q, "--to", NATS, "--subject", &uncovered]);
    let line = assert_error(&run(cmd), "relay to a subject without a stream");
    assert_mentions(
        &line,
        &[&format!("no JetStream stream covers subject \"{uncovered}\""), "nats stream add", "--subjects"],
        "relay to a subject without a stream",
    );
    assert_eq!(depth(&database, &q), 2, "nothing was taken");
    // With the group in it: the group relayed is known, so is its subject.
    let mut cmd = rowbus();
    cmd.args(["--database-url", &database.url, "relay", &q, "--to", NATS, "--subject", "nostream_x.{group}"]);
    let line = assert_error(&run(cmd), "relay to a subject template without a stream");
    assert_mentions(&line, &["\"nostream_x._\""], "relay to a subject template without a stream");

    let stream = Stream::new();
    let subject = format!("{}.{{group}}", stream.name);
    let mut running = relay(&database, &q, &["--to", NATS, "--subject", &subject]);
    eventually("the queue is drained", || depth(&database, &q) == 0);
    let (status, _, stderr) = running.stop("TERM");
    assert!(status.success(), "{stderr:?}");
    assert_eq!(stream.count(), 2);
}

/// A broker's warning on stderr is plain text when stderr is no terminal (a pipe here, a
/// log file in production): no colour codes.
#[test]
fn warnings_off_a_terminal_have_no_colour_codes() {
    let q = unique("relay_plain");
    let database = Database::new(Kind::Sqlite, &q);
    database.cleanup.queue(&q);
    ok(&database, &["deploy", "--queue", &q], None);
    // A key with a space makes a subject NATS refuses: the message is dead-lettered, and
    // the relay warns.
    ok(&database, &["publish", &q, "--key", "a b", "refused"], None);
    let stream = Stream::new();
    let subject = format!("{}.{{key}}", stream.name);
    let mut running = relay(&database, &q, &["--to", NATS, "--subject", &subject]);
    eventually("the message is dead-lettered", || depth(&database, &q) == 0);
    let (status, _, stderr) = running.stop("TERM");
    assert!(status.success(), "{stderr:?}");
    assert!(stderr.iter().any(|l| l.contains("refused a message")), "no warning: {stderr:#?}");
    assert!(!stderr.iter().any(|l| l.contains('\u{1b}')), "colour codes off a terminal: {stderr:#?}");
}

/// A broker that cannot be reached when the relay starts is one error line.
fn an_unreachable_broker_is_one_line(kind: Kind) {
    let (database, q) = filled(kind, "relay_unreach", 1);
    for (to, flag, value) in
        [("nats://127.0.0.1:1", "--subject", "s"), ("redis://:secret@127.0.0.1:1", "--stream", "s")]
    {
        let mut cmd = rowbus();
        cmd.args(["--database-url", &database.url, "relay", &q, "--to", to, flag, value]);
        let line = assert_error(&run(cmd), to);
        assert!(line.contains("cannot connect to") && !line.contains("secret"), "{line}");
    }
    assert_eq!(depth(&database, &q), 1, "nothing was taken");
}
on_each_database!(an_unreachable_broker_is_one_line);

/// A relay to Redis says what it did when stopped, and `rowbus stats` shows it.
fn stats_show_what_relays_did(kind: Kind) {
    let (database, q) = filled(kind, "relay_stats", 30);
    let streams_key = unique("relaycli");
    let mut running = relay(&database, &q, &["--to", REDIS, "--stream", &streams_key, "--batch", "7"]);
    eventually("the queue is drained", || depth(&database, &q) == 0);
    let (status, _, stderr) = running.stop("TERM");
    assert!(status.success(), "{stderr:?}");
    assert_eq!(
        stderr.last().map(String::as_str),
        Some("rowbus: stopped: 30 relayed, 30 confirmed, 0 resent, 0 refused (dead-lettered)")
    );
    let stats = ok(&database, &["stats", &q], None);
    assert!(
        stats
            .lines()
            .any(|l| l == format!("relays of `{q}`: relayed 30, confirmed 30, resent 0, refused 0, lag -")),
        "{stats}"
    );
    let mut connection = redis::Client::open(REDIS).unwrap().get_connection().unwrap();
    let len: u64 = redis::cmd("XLEN").arg(&streams_key).query(&mut connection).unwrap();
    redis::cmd("DEL").arg(&streams_key).exec(&mut connection).unwrap();
    assert_eq!(len, 30);
}
on_each_database!(stats_show_what_relays_did);

/// The messages to relay in the SIGKILL tests: enough that the kill comes mid-stream.
const MANY: usize = 10_000;

/// Starts `rowbus relay Q ARGS` with its broker behind a [`LosingProxy`], lets a few
/// hundred messages arrive there (`arrived` counts them at the broker), then loses the
/// broker's answers on their way back: the relay's next batches reach the broker and stay
/// in the queue (unconfirmed: leased, or deleted in a transaction not yet committed). Once
/// the broker holds a message the queue still holds, the relay is SIGKILLed.
fn kill_mid_stream(database: &Database, q: &str, args: &[&str], mut arrived: impl FnMut() -> u64) {
    let at = args.iter().position(|a| *a == "--to").expect("--to in the relay's arguments") + 1;
    let to = args[at];
    let authority = to.rsplit('@').next().unwrap().split("://").last().unwrap().split('/').next().unwrap();
    let proxy = LosingProxy::start(authority);
    let proxied = to.replacen(authority, &proxy.address, 1);
    let mut args = args.to_vec();
    args[at] = &proxied;

    let mut running = relay(database, q, &args);
    eventually("some messages arrive", || arrived() >= 300);
    proxy.lose_answers();
    // Read the broker first: a message it holds that is still queued later was sent and
    // not removed (neither count goes back).
    let sent_not_removed = |arrived: u64| arrived as i64 + depth(database, q) > MANY as i64;
    eventually("a message is at the broker and in the queue", || sent_not_removed(arrived()));
    running.stop("KILL");
    let at_kill = arrived();
    assert!(at_kill < MANY as u64, "the relay was killed mid-stream ({at_kill} at the broker)");
    assert!(sent_not_removed(at_kill), "the kill left a message sent and not removed");
}

/// A TCP proxy in front of a broker that, once told, loses everything the broker sends
/// back (what the client sends still reaches the broker): a relay behind it sends, and
/// never hears that the broker took it.
struct LosingProxy {
    /// `127.0.0.1:port`, where the proxy listens.
    address: String,
    losing: Arc<AtomicBool>,
    closed: Arc<AtomicBool>,
}

impl LosingProxy {
    /// A proxy to `target` (`host:port`) on a free port, passing everything until told.
    fn start(target: &str) -> LosingProxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        listener.set_nonblocking(true).unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let (losing, closed) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let (target, accepting_losing, accepting_closed) =
            (target.to_owned(), losing.clone(), closed.clone());
        std::thread::spawn(move || {
            while !accepting_closed.load(Ordering::SeqCst) {
                let client = match listener.accept() {
                    Ok((client, _)) => client,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    }
                    Err(e) => panic!("the proxy's accept: {e}"),
                };
                client.set_nonblocking(false).unwrap();
                let server =
                    TcpStream::connect(&target).unwrap_or_else(|e| panic!("the broker at {target}: {e}"));
                let (client_read, server_write) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || pass(client_read, server_write, None));
                let losing = accepting_losing.clone();
                std::thread::spawn(move || pass(server, client, Some(losing)));
            }
        });
        LosingProxy { address, losing, closed }
    }

    /// From now on, what the broker sends back is lost.
    fn lose_answers(&self) {
        self.losing.store(true, Ordering::SeqCst);
    }
}

impl Drop for LosingProxy {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
    }
}

/// Copies `from` to `to` until `from` ends (dropping what it reads once `losing`), then
/// ends `to`.
fn pass(mut from: TcpStream, mut to: TcpStream, losing: Option<Arc<AtomicBool>>) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        let lose = losing.as_ref().is_some_and(|l| l.load(Ordering::SeqCst));
        if !lose && to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// Whether a relay of `kind` claims under leases (the default on SQLite) unless `args` say.
fn leased(kind: Kind, args: &[&str]) -> bool {
    kind == Kind::Sqlite || args.contains(&"--leased")
}

/// A relay to JetStream SIGKILLed mid-stream, then started again: every message is in the
/// stream once. What the killed relay had sent but not removed goes again with the same
/// Nats-Msg-Id and JetStream's duplicate window drops it.
fn a_killed_relay_to_nats_loses_nothing(kind: Kind) {
    killed_relay_to_nats(kind, &[]);
}
on_each_database!(a_killed_relay_to_nats_loses_nothing);

/// The same with `--leased`: the killed relay's messages are claimed again once their
/// lease ran out, counted resent.
fn a_killed_leased_relay_to_nats_loses_nothing(kind: Kind) {
    killed_relay_to_nats(kind, &["--leased"]);
}
on_each_database!(a_killed_leased_relay_to_nats_loses_nothing);

fn killed_relay_to_nats(kind: Kind, more: &[&str]) {
    let (database, q) = filled(kind, "relay_kill_nats", MANY);
    let stream = Stream::new();
    let subject = format!("{}.{{group}}", stream.name);
    let mut args = vec!["--to", NATS, "--subject", &subject, "--batch", "20", "--lease", "2s"];
    args.extend(more);
    kill_mid_stream(&database, &q, &args, || stream.count());

    let mut second = relay(&database, &q, &args);
    eventually("the queue is drained", || depth(&database, &q) == 0);
    let (status, _, stderr) = second.stop("TERM");
    assert!(status.success(), "{stderr:?}");

    let ids = stream.ids();
    let unique_ids: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(ids.len(), MANY, "every message once in the stream");
    assert_eq!(unique_ids.len(), MANY);
    assert!(unique_ids.iter().all(|id| id.starts_with(&format!("{q}:"))), "ids are prefixed with the queue");
    let counts = counts(&database, &q);
    if leased(kind, &args) {
        // The killed relay's leased messages were claimed again after their lease.
        assert!(counts["resent"].as_u64().unwrap() > 0, "{counts}");
    }
    assert_eq!(counts["refused"], 0, "{counts}");
}

/// The same with Redis, which keeps what is added twice: every message is there, and an
/// id that is there twice is the same message (its payload and fields).
fn a_killed_relay_to_redis_loses_nothing(kind: Kind) {
    let (database, q) = filled(kind, "relay_kill_redis", MANY);
    let key = unique("relaycli");
    let args = ["--to", REDIS, "--stream", &key, "--batch", "20", "--lease", "2s"];
    let mut connection = redis::Client::open(REDIS).unwrap().get_connection().unwrap();
    let len = || -> u64 { redis::cmd("XLEN").arg(&key).query(&mut connection).unwrap() };
    kill_mid_stream(&database, &q, &args, len);

    let mut second = relay(&database, &q, &args);
    eventually("the queue is drained", || depth(&database, &q) == 0);
    second.stop("TERM");

    let mut connection = redis::Client::open(REDIS).unwrap().get_connection().unwrap();
    let entries: Vec<(String, Vec<Vec<u8>>)> =
        redis::cmd("XRANGE").arg(&key).arg("-").arg("+").query(&mut connection).unwrap();
    redis::cmd("DEL").arg(&key).exec(&mut connection).unwrap();
    let copies = entries.into_iter().map(|(_, fields)| {
        let id = fields.chunks(2).find(|f| f[0] == b"id").map(|f| String::from_utf8(f[1].clone()).unwrap());
        (id.expect("an id field"), fields.concat())
    });
    each_once_and_resent(kind, &database, &q, copies);
}
on_each_database!(a_killed_relay_to_redis_loses_nothing);

/// What arrived, as (id, everything sent with it): every one of the [`MANY`] messages is
/// there, an id that came twice came with the same content, and the killed relay's
/// messages went again: counted resent when they were claimed again after their lease;
/// in a transaction, the kill left some at the broker and in the queue (see
/// [`kill_mid_stream`]), and those arrived twice.
fn each_once_and_resent(
    kind: Kind,
    database: &Database,
    q: &str,
    arrived: impl IntoIterator<Item = Arrived>,
) {
    let mut by_id: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
    for (id, content) in arrived {
        by_id.entry(id).or_default().push(content);
    }
    assert_eq!(by_id.len(), MANY, "every message arrived");
    for (id, copies) in &by_id {
        assert!(copies.iter().all(|c| c == &copies[0]), "message {id} sent twice differs: {copies:?}");
    }
    let counts = counts(database, q);
    match leased(kind, &[]) {
        true => assert!(counts["resent"].as_u64().unwrap() > 0, "{counts}"),
        false => assert!(by_id.values().any(|copies| copies.len() > 1), "no message arrived twice"),
    }
    assert_eq!(counts["refused"], 0, "{counts}");
}

/// A message as it arrived: its id and everything sent with it.
type Arrived = (String, Vec<u8>);

const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// The same with RabbitMQ, through the default exchange to a queue of the test's own
/// (exclusive to the test's connection, so it goes with it): every message_id is there,
/// and one that is there twice is the same message.
fn a_killed_relay_to_amqp_loses_nothing(kind: Kind) {
    use lapin::options::{BasicGetOptions, QueueDeclareOptions};
    use lapin::types::FieldTable;

    let (database, q) = filled(kind, "relay_kill_amqp", MANY);
    let rt = runtime();
    let name = unique("relaycli");
    let (connection, channel) = rt.block_on(async {
        let connection = lapin::Connection::connect(AMQP, lapin::ConnectionProperties::default())
            .await
            .unwrap_or_else(|e| panic!("RabbitMQ at {AMQP}: {e}"));
        let channel = connection.create_channel().await.unwrap();
        let options = QueueDeclareOptions { exclusive: true, ..QueueDeclareOptions::default() };
        channel.queue_declare(name.as_str().into(), options, FieldTable::default()).await.unwrap();
        (connection, channel)
    });
    let waiting = || -> u64 {
        let options = QueueDeclareOptions { passive: true, ..QueueDeclareOptions::default() };
        let queue = rt.block_on(channel.queue_declare(name.as_str().into(), options, FieldTable::default()));
        u64::from(queue.unwrap().message_count())
    };
    let args = ["--to", AMQP, "--exchange", "", "--routing-key", &name, "--batch", "20", "--lease", "2s"];
    kill_mid_stream(&database, &q, &args, waiting);

    let mut second = relay(&database, &q, &args);
    eventually("the queue is drained", || depth(&database, &q) == 0);
    second.stop("TERM");

    let arrived = rt.block_on(async {
        let mut arrived = Vec::new();
        while let Some(got) =
            channel.basic_get(name.as_str().into(), BasicGetOptions { no_ack: true }).await.unwrap()
        {
            let id = got.delivery.properties.message_id().as_ref().map(|id| id.to_string());
            arrived.push((id.expect("a message_id"), got.delivery.data));
        }
        connection.close(200, "OK".into()).await.unwrap();
        arrived
    });
    each_once_and_resent(kind, &database, &q, arrived);
}
on_each_database!(a_killed_relay_to_amqp_loses_nothing);

/// The same with MQTT (QoS 1): a subscriber of the test's own, there before the first
/// relay starts, receives every message by its `rowbus-id`, one that came twice the same.
/// It subscribes at QoS 0, which Mosquitto sends at once rather than queueing (it drops
/// QoS 1 messages past 1,000 held for a subscriber that falls behind).
fn a_killed_relay_to_mqtt_loses_nothing(kind: Kind) {
    use std::sync::Mutex;

    use rumqttc::v5::mqttbytes::QoS;
    use rumqttc::v5::mqttbytes::v5::Packet;
    use rumqttc::v5::{AsyncClient, Event, MqttOptions};

    let (database, q) = filled(kind, "relay_kill_mqtt", MANY);
    let topic = unique("relaycli");
    let received: Arc<Mutex<Vec<Arrived>>> = Arc::default();
    // The subscriber runs on a thread of its own, beside the relays it watches.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let subscribed = {
        let (topic, received) = (topic.clone(), received.clone());
        let (subscribed_tx, subscribed) = std::sync::mpsc::channel();
        rt.spawn(async move {
            let (client, mut eventloop) =
                AsyncClient::new(MqttOptions::new(topic.clone(), "127.0.0.1", 1883), 64);
            client.subscribe(topic.as_str(), QoS::AtMostOnce).await.unwrap();
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        let _ = subscribed_tx.send(());
                    }
                    Ok(Event::Incoming(Packet::Publish(publish))) => {
                        let id = publish.properties.as_ref().and_then(|p| {
                            p.user_properties.iter().find(|(n, _)| n == "rowbus-id").map(|(_, v)| v.clone())
                        });
                        let entry = (id.expect("a rowbus-id"), publish.payload.to_vec());
                        received.lock().unwrap().push(entry);
                    }
                    Ok(_) => {}
                    Err(e) => panic!("Mosquitto at 127.0.0.1:1883: {e}"),
                }
            }
        });
        subscribed
    };
    subscribed.recv_timeout(Duration::from_secs(20)).expect("a SUBACK within 20 s");
    let args = ["--to", "mqtt://127.0.0.1:1883", "--topic", &topic, "--batch", "20", "--lease", "2s"];
    kill_mid_stream(&database, &q, &args, || received.lock().unwrap().len() as u64);

    let mut second = relay(&database, &q, &args);
    eventually("the queue is drained", || depth(&database, &q) == 0);
    second.stop("TERM");
    let distinct =
        || received.lock().unwrap().iter().map(|(id, _)| id.clone()).collect::<BTreeSet<_>>().len();
    eventually("every message reached the subscriber", || distinct() >= MANY);
    rt.shutdown_background();
    let arrived = std::mem::take(&mut *received.lock().unwrap());
    each_once_and_resent(kind, &database, &q, arrived);
}
on_each_database!(a_killed_relay_to_mqtt_loses_nothing);
