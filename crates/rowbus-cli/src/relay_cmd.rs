//! `rowbus relay QUEUE --to URL`: the transactional outbox's relay. Hands a queue's
//! messages to NATS JetStream, Redis Streams, RabbitMQ or MQTT, and removes each only once
//! the broker confirmed it (docs/relay.md).

use std::time::Duration;

use clap::Args;
use rowbus::sqlx::Pool;
use rowbus::{Broker, BrokerOptions, Db, NotifyConfig, Queue};
use rowbus_relay::sink::Sink;
use rowbus_relay::{Relay, RelayError, Template};

use crate::cli_error::CliError;
use crate::queue_cmd::{self, positive_duration};

/// What `rowbus relay --help` adds.
pub(crate) const AFTER_HELP: &str = "\
The scheme of --to picks the broker: nats:// (NATS JetStream: --subject), redis:// (Redis \
Streams: --stream, --maxlen), amqp:// (RabbitMQ: --exchange, --routing-key), mqtt:// (MQTT: \
--topic). {group} and {key} in a subject, stream, routing key or topic stand for the message's \
group and ordering key (`_` for the default group and for a message without a key).

A message leaves the queue only once the broker confirmed it. One the broker could not take \
(unreachable, no confirmation within --ack-timeout) is given back and sent again, with the same \
id, while the relay waits for the broker (100ms, doubling up to 5s); one it refused for good \
(no stream for the subject, too large) goes to the dead letters with the broker's reason. \
Several relays of one queue share its messages. `rowbus stats` counts what relays did: \
relayed, confirmed, resent, refused. A broker's warnings go to stderr (RUST_LOG=rowbus_relay=... \
sets the level). Ctrl-C stops after the batches in flight are settled.";

/// The heading of NATS's flags in `--help`.
const NATS: &str = "NATS JetStream (--to nats://HOST:PORT)";
/// The heading of Redis's flags in `--help`.
const REDIS: &str = "Redis Streams (--to redis://HOST:PORT[/DB])";
/// The heading of RabbitMQ's flags in `--help`.
const AMQP: &str = "RabbitMQ (--to amqp://USER:PASSWORD@HOST:PORT/VHOST)";
/// The heading of MQTT's flags in `--help`.
const MQTT: &str = "MQTT (--to mqtt://HOST:PORT)";

fn template(text: &str) -> Result<Template, String> {
    Template::parse(text).map_err(|e| e.to_string())
}

/// Options of `rowbus relay`.
#[derive(Debug, Args)]
pub(crate) struct RelayArgs {
    /// The queue table whose messages are relayed (create it with `rowbus deploy --queue TABLE`)
    pub(crate) table: String,
    /// The broker: nats://, redis://, amqp:// or mqtt:// (a password in it is never printed)
    #[arg(long, value_name = "URL")]
    to: String,
    /// Relay this group's messages [default: the default group]
    #[arg(long, value_name = "G", default_value = "", hide_default_value = true)]
    group: String,
    /// Messages claimed, sent and confirmed together
    #[arg(long, value_name = "N", default_value_t = rowbus_relay::DEFAULT_BATCH as u32,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    batch: u32,
    /// Batches between claim and confirmation at once (1 with --ordered)
    #[arg(long, value_name = "N", default_value_t = rowbus_relay::DEFAULT_IN_FLIGHT as u32,
          value_parser = clap::value_parser!(u32).range(1..=64))]
    in_flight: u32,
    /// Keep the group's order at the broker: one batch at a time, the next claimed once the
    /// last is confirmed (messages of one --key are always in order)
    #[arg(long)]
    ordered: bool,
    /// Claim under a lease and delete what the broker confirmed afterwards, instead of
    /// deleting each batch in a transaction held open until the broker answers (always so on
    /// SQLite, where that transaction would hold every publisher)
    #[arg(long)]
    leased: bool,
    /// With --leased (or on SQLite): how long a claimed message stays with this relay before
    /// another may take it, e.g. 30s
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = positive_duration)]
    lease: Duration,
    /// How long the broker may take to confirm a message before it is sent again later
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = positive_duration)]
    ack_timeout: Duration,
    /// Be woken by publishers in other processes at once rather than at the next poll
    /// (PostgreSQL LISTEN/NOTIFY, or the notify table `rowbus deploy` creates)
    #[arg(long)]
    listen_notify: bool,

    /// The subject each message is published to, e.g. orders.{group}; a JetStream stream of
    /// yours must cover it (the relay creates none)
    #[arg(long, value_name = "S", value_parser = template, help_heading = NATS)]
    subject: Option<Template>,
    /// What Nats-Msg-Id (RabbitMQ: message_id; MQTT: the rowbus-id property) starts with,
    /// before `:` and the message's id [default: the queue table]
    #[arg(long, value_name = "P", help_heading = NATS)]
    id_prefix: Option<String>,

    /// The stream each message is added to (XADD; fields payload, id, group, headers, key)
    #[arg(long, value_name = "S", value_parser = template, help_heading = REDIS)]
    stream: Option<Template>,
    /// Trim each stream to about N entries (XADD ... MAXLEN ~ N) [default: no trimming]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..), help_heading = REDIS)]
    maxlen: Option<u64>,

    /// The exchange each message is published to ('' is the default exchange, which routes
    /// by queue name)
    #[arg(long, value_name = "E", help_heading = AMQP)]
    exchange: Option<String>,
    /// The routing key of each message, e.g. orders.{group} (with --exchange '': a queue name)
    #[arg(long, value_name = "K", value_parser = template, help_heading = AMQP)]
    routing_key: Option<Template>,

    /// The topic each message is published to (QoS 1), e.g. orders/{group}
    #[arg(long, value_name = "T", value_parser = template, help_heading = MQTT)]
    topic: Option<Template>,
}

impl RelayArgs {
    /// Connections for the pool: the claims', the settlements', the counts' and a spare
    /// per batch in flight.
    pub(crate) fn pool_size(&self) -> u32 {
        (self.in_flight + 3).min(32)
    }

    /// The broker `--to` names, with the flags it needs; refused before any connection.
    pub(crate) fn target(&self) -> Result<Target, CliError> {
        let scheme = self.to.split_once("://").map(|(scheme, _)| scheme.to_ascii_lowercase());
        let missing = |flag: &str, broker: &str| {
            CliError::Message(format!("relaying to {broker} needs {flag} (see `rowbus relay --help`)"))
        };
        let others = |allowed: &[&str]| {
            let given = [
                ("--subject", self.subject.is_some()),
                ("--id-prefix", self.id_prefix.is_some()),
                ("--stream", self.stream.is_some()),
                ("--maxlen", self.maxlen.is_some()),
                ("--exchange", self.exchange.is_some()),
                ("--routing-key", self.routing_key.is_some()),
                ("--topic", self.topic.is_some()),
            ];
            match given.iter().find(|(flag, on)| *on && !allowed.contains(flag)) {
                Some((flag, _)) => Err(CliError::Message(format!(
                    "{flag} is not for {} (see `rowbus relay --help`)",
                    rowbus_relay::sink::redact(&self.to)
                ))),
                None => Ok(()),
            }
        };
        match scheme.as_deref() {
            Some("nats") | Some("tls") => {
                others(&["--subject", "--id-prefix"])?;
                let subject = self.subject.clone().ok_or_else(|| missing("--subject", "NATS"))?;
                rowbus_relay::sink::nats::check_subject_template(&subject)?;
                Ok(Target::Nats(subject))
            }
            Some("redis") | Some("rediss") => {
                others(&["--stream", "--maxlen"])?;
                let stream = self.stream.clone().ok_or_else(|| missing("--stream", "Redis"))?;
                Ok(Target::Redis(stream))
            }
            Some("amqp") | Some("amqps") => {
                others(&["--exchange", "--routing-key", "--id-prefix"])?;
                let exchange = self.exchange.clone().ok_or_else(|| missing("--exchange", "RabbitMQ"))?;
                let routing_key =
                    self.routing_key.clone().ok_or_else(|| missing("--routing-key", "RabbitMQ"))?;
                Ok(Target::Amqp(exchange, routing_key))
            }
            Some("mqtt") | Some("mqtts") => {
                others(&["--topic", "--id-prefix"])?;
                let topic = self.topic.clone().ok_or_else(|| missing("--topic", "MQTT"))?;
                rowbus_relay::sink::mqtt::check_topic_template(&topic)?;
                Ok(Target::Mqtt(topic))
            }
            _ => Err(CliError::Message(format!(
                "--to {} names no broker rowbus relays to: nats://, redis://, amqp:// or mqtt://",
                rowbus_relay::sink::redact(&self.to)
            ))),
        }
    }
}

/// The broker `--to` names, with what it needs.
pub(crate) enum Target {
    /// NATS JetStream, to this subject.
    Nats(Template),
    /// Redis Streams, to this stream.
    Redis(Template),
    /// RabbitMQ, to this exchange with this routing key.
    Amqp(String, Template),
    /// MQTT, to this topic.
    Mqtt(Template),
}

impl From<RelayError> for CliError {
    fn from(error: RelayError) -> Self {
        match error {
            RelayError::Rowbus(e) => CliError::Rowbus(e),
            other => CliError::Message(other.to_string()),
        }
    }
}

/// `rowbus relay`: connects to the broker, then relays until interrupted.
pub(crate) async fn relay<DB: Db>(
    pool: Pool<DB>,
    url: &str,
    config: &NotifyConfig,
    args: RelayArgs,
) -> Result<(), CliError> {
    queue_cmd::parse_tables(std::slice::from_ref(&args.table))?;
    rowbus::limits::check_group(&args.group)?;
    let target = args.target()?;
    // `--poll-interval` is the subscription's here; the notify table that wakes it is
    // polled at the broker's fast default.
    let notify_table =
        NotifyConfig { poll_interval: BrokerOptions::default().notify_table.poll_interval, ..config.clone() };
    let options = BrokerOptions {
        poll_interval: config.poll_interval,
        lease: args.lease,
        listen_notify: args.listen_notify,
        notify_table,
        listen_url: crate::listen_url(url),
        ..BrokerOptions::default()
    };
    let broker = Broker::new(pool, options).await?;
    let result = match queue_cmd::existing_queue(&broker, &args.table, url).await {
        Ok(queue) => connect_and_run(&broker, queue, target, &args).await,
        Err(e) => Err(e),
    };
    broker.shutdown(Duration::ZERO).await;
    result
}

async fn connect_and_run<DB: Db>(
    broker: &Broker<DB>,
    queue: Queue<DB>,
    target: Target,
    args: &RelayArgs,
) -> Result<(), CliError> {
    let notify_table = &broker.options().notify_table;
    if args.listen_notify && !broker.notify_ready(notify_table).await? {
        return Err(rowbus::Error::MissingNotifyTable { table: notify_table.table.clone() }.into());
    }
    match target {
        Target::Nats(subject) => {
            use rowbus_relay::sink::nats::{NatsOptions, NatsSink};
            let prefix = args.id_prefix.clone().unwrap_or_else(|| queue.table().to_string());
            let options = NatsOptions { ack_timeout: args.ack_timeout, ..NatsOptions::new(subject, prefix) };
            let sink = NatsSink::connect(&args.to, options.clone()).await?;
            stream_covers(&sink, &options.subject, &args.group).await?;
            run(queue, sink, args).await
        }
        Target::Redis(stream) => {
            use rowbus_relay::sink::redis::{RedisOptions, RedisSink};
            let options =
                RedisOptions { maxlen: args.maxlen, timeout: args.ack_timeout, ..RedisOptions::new(stream) };
            let sink = RedisSink::connect(&args.to, options).await?;
            run(queue, sink, args).await
        }
        Target::Amqp(exchange, routing_key) => {
            use rowbus_relay::sink::amqp::{AmqpOptions, AmqpSink};
            let prefix = args.id_prefix.clone().unwrap_or_else(|| queue.table().to_string());
            let options = AmqpOptions {
                confirm_timeout: args.ack_timeout,
                ..AmqpOptions::new(exchange, routing_key, prefix)
            };
            let sink = AmqpSink::connect(&args.to, options).await?;
            run(queue, sink, args).await
        }
        Target::Mqtt(topic) => {
            use rowbus_relay::sink::mqtt::{MqttOptions, MqttSink};
            let prefix = args.id_prefix.clone().unwrap_or_else(|| queue.table().to_string());
            let options = MqttOptions { ack_timeout: args.ack_timeout, ..MqttOptions::new(topic, prefix) };
            let sink = MqttSink::connect(&args.to, options).await?;
            run(queue, sink, args).await
        }
    }
}

/// Refuses a relay whose messages no JetStream stream would take (each would be
/// dead-lettered), saying how to make one: the subject is known at start unless it names
/// the key.
async fn stream_covers(
    sink: &rowbus_relay::sink::nats::NatsSink,
    subject: &Template,
    group: &str,
) -> Result<(), CliError> {
    if subject.names_key() {
        return Ok(());
    }
    let subject = subject.render(group, None);
    match sink.stream_for(&subject).await? {
        Some(_) => Ok(()),
        None => Err(CliError::Message(format!(
            "nats: no JetStream stream covers subject {subject:?}, so every message would be dead-lettered: \
             make one first, e.g. `nats stream add OUTBOX --subjects '{subject}' --defaults`"
        ))),
    }
}

/// Relays until interrupted; says what it did.
async fn run<DB: Db, S: Sink>(queue: Queue<DB>, sink: S, args: &RelayArgs) -> Result<(), CliError> {
    let mut interrupted = Box::pin(crate::interrupted());
    // Install the signal handlers (on first poll) before announcing anything.
    if futures::poll!(interrupted.as_mut()).is_ready() {
        return Ok(());
    }
    let group = if args.group.is_empty() {
        "the default group".to_owned()
    } else {
        format!("group {:?}", args.group)
    };
    let order = if args.ordered { ", ordered" } else { "" };
    eprintln!(
        "rowbus: relaying `{}` ({group}, batches of up to {}{order}) to {}; Ctrl-C stops",
        queue.table(),
        args.batch,
        rowbus_relay::sink::redact(&args.to)
    );
    let relay = match args.leased {
        true => Relay::new(queue, sink).transactional(false),
        false => Relay::new(queue, sink),
    };
    let report = relay
        .group(args.group.clone())
        .batch(args.batch as usize)
        .in_flight(args.in_flight as usize)
        .ordered(args.ordered)
        .lease(args.lease)
        .until(interrupted)
        .run()
        .await?;
    eprintln!(
        "rowbus: stopped: {} relayed, {} confirmed, {} resent, {} refused (dead-lettered)",
        report.relayed, report.confirmed, report.resent, report.refused
    );
    Ok(())
}
