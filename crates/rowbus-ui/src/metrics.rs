//! `GET /metrics`: the queues and the serving process's counters in the Prometheus text
//! exposition format (version 0.0.4). Every series is listed in docs/operating.md.

use std::fmt::Write as _;
use std::time::Duration;

use rowbus::QueueTable;
use rowbus::stats::{Counted, NotifyTableStats, Paused, QueueHealth, Stats};

use crate::figures::{Counts, Line};

/// The `Content-Type` of the text format.
pub(crate) const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// A label value as the format wants it: backslash, double quote and line feed escaped.
fn label_value(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            c => escaped.push(c),
        }
    }
    escaped
}

/// The exposition being written: one family (HELP, TYPE, its samples) after another, as
/// the format requires of a family's samples.
struct Exposition(String);

impl Exposition {
    /// Starts family `name`. HELP texts are this file's own: none has a backslash or a line
    /// feed, which HELP would need escaped.
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        debug_assert!(!help.contains(['\\', '\n']), "{name}: HELP needs escaping");
        let _ = writeln!(self.0, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    /// One sample of the current family.
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: impl std::fmt::Display) {
        self.0.push_str(name);
        if !labels.is_empty() {
            let pairs: Vec<String> =
                labels.iter().map(|(k, v)| format!("{k}=\"{}\"", label_value(v))).collect();
            let _ = write!(self.0, "{{{}}}", pairs.join(","));
        }
        let _ = writeln!(self.0, " {value}");
    }
}

/// A counter of [`Stats`] exported: its series name, its HELP, and how to read it.
type Counter = (&'static str, &'static str, fn(&Stats) -> u64);

/// The counters of [`Stats`] exported.
const COUNTERS: [Counter; 10] = [
    ("rowbus_published_total", "Messages this process published.", |s| s.published),
    (
        "rowbus_publish_statements_total",
        "INSERT statements that carried this process's publishes (a batch shares one, and so do publishes made at the same moment).",
        |s| s.publishes,
    ),
    ("rowbus_acknowledged_total", "Messages this process acknowledged (deleted after handling).", |s| {
        s.acked
    }),
    ("rowbus_retried_total", "Failed attempts this process scheduled to run again.", |s| s.retried),
    ("rowbus_dead_lettered_total", "Messages this process moved to a dead-letter table.", |s| {
        s.dead_lettered
    }),
    (
        "rowbus_dead_letter_failures_total",
        "Dead-letter moves this process tried that failed (the dead-letter table missing, say); each message stayed in its queue, to run again.",
        |s| s.dead_letter_failures,
    ),
    (
        "rowbus_snoozed_total",
        "Messages this process's handlers snoozed (put back for later, the attempt not counted).",
        |s| s.snoozed,
    ),
    ("rowbus_claims_total", "Claims this process ran.", |s| s.claims),
    (
        "rowbus_handed_off_total",
        "Messages this process published straight to one of its runners waiting for work, leased in their insert: no claim ran for them.",
        |s| s.handed_off,
    ),
    ("rowbus_claim_failures_total", "Claims this process ran that failed.", |s| s.claim_errors),
];

/// The exposition of `lines` (every group of every queue table), the notify table's
/// figures (`None` on PostgreSQL or when it does not exist), what is paused in each queue
/// table, what each one's consumers did (`counts`) and the serving process's counters.
pub(crate) fn render(
    lines: &[Line],
    notify: Option<&NotifyTableStats>,
    pauses: &[(QueueTable, Paused)],
    counts: &[Counts],
    stats: &Stats,
) -> String {
    let mut out = Exposition(String::new());
    out.family(
        "rowbus_messages",
        "gauge",
        "Messages of a queue table's group by state: ready (claimable now), delayed (waiting for a retry's backoff or a publish delay), in_flight (claimed under a lease), dead (in the dead-letter table).",
    );
    for Line { table, group: g } in lines {
        let (queue, group) = (table.channel(), g.group.as_str());
        for (state, n) in [
            ("ready", Some(g.ready)),
            ("delayed", Some(g.delayed())),
            ("in_flight", Some(g.in_flight)),
            ("dead", g.dead),
        ] {
            // No dead-letter table, no dead series: zero would claim one was counted.
            if let Some(n) = n {
                out.sample("rowbus_messages", &[("queue", queue), ("group", group), ("state", state)], n);
            }
        }
    }
    out.family(
        "rowbus_oldest_message_age_seconds",
        "gauge",
        "Age of the oldest message in a queue table's group (absent when the group has none).",
    );
    for Line { table, group: g } in lines {
        if let Some(age) = g.oldest {
            out.sample(
                "rowbus_oldest_message_age_seconds",
                &[("queue", table.channel()), ("group", &g.group)],
                age.as_secs_f64(),
            );
        }
    }
    out.family(
        "rowbus_oldest_ready_age_seconds",
        "gauge",
        "Age of the oldest ready (claimable now) message in a queue table's group: how far behind its consumers or relays are (absent when none is ready).",
    );
    for Line { table, group: g } in lines {
        if let Some(age) = g.oldest_ready {
            out.sample(
                "rowbus_oldest_ready_age_seconds",
                &[("queue", table.channel()), ("group", &g.group)],
                age.as_secs_f64(),
            );
        }
    }
    out.family(
        "rowbus_paused",
        "gauge",
        "Whether a queue table's group is held by a pause, its own or the whole queue's: 1 paused, 0 not (group \"\" is the default group).",
    );
    for Line { table, group: g } in lines {
        out.sample("rowbus_paused", &[("queue", table.channel()), ("group", &g.group)], u8::from(g.paused));
    }
    out.family(
        "rowbus_queue_paused",
        "gauge",
        "Whether a queue table is paused as a whole (every group held): 1 paused, 0 not.",
    );
    for (table, paused) in pauses {
        out.sample("rowbus_queue_paused", &[("queue", table.channel())], u8::from(paused.queue));
    }
    out.family(
        "rowbus_queue_events_total",
        "counter",
        "What a queue's consumers and relays did, in every process, from its counts table: event cancelled, snoozed, timed_out or lease_lost (consumers), relayed, confirmed, resent or refused (relays to a message broker); absent for a queue without a counts table or whose counts table this role may not read.",
    );
    for Counts { table, counts, .. } in counts {
        if let Ok(Some(counts)) = counts {
            for kind in Counted::ALL {
                let labels = [("queue", table.channel()), ("event", kind.as_str())];
                out.sample("rowbus_queue_events_total", &labels, counts.get(kind));
            }
        }
    }
    out.family(
        "rowbus_workflows",
        "gauge",
        "A queue's workflows by status: running (including sleeping or waiting for an event), succeeded, failed, cancelled; absent for a queue without workflow tables.",
    );
    for c in counts {
        if let Some(workflows) = &c.workflows {
            for (status, n) in workflows.by_status() {
                out.sample(
                    "rowbus_workflows",
                    &[("queue", c.table.channel()), ("status", status.as_str())],
                    n,
                );
            }
        }
    }
    out.family(
        "rowbus_queue_limited",
        "gauge",
        "A queue's messages ready but held back by a limit now (rowbus limit; absent for a queue without a limits table).",
    );
    for c in counts {
        if let Some(held) = c.limited {
            out.sample("rowbus_queue_limited", &[("queue", c.table.channel())], held);
        }
    }
    if let Some(n) = notify {
        out.family(
            "rowbus_notify_table_rows",
            "gauge",
            "Rows in the notify table (MySQL/MariaDB and SQLite).",
        );
        out.sample("rowbus_notify_table_rows", &[("table", &n.table)], n.rows);
        if let Some(age) = n.oldest {
            out.family(
                "rowbus_notify_table_oldest_age_seconds",
                "gauge",
                "Age of the notify table's oldest row: how far behind its cleanup is.",
            );
            out.sample("rowbus_notify_table_oldest_age_seconds", &[("table", &n.table)], age.as_secs_f64());
        }
    }
    for (name, help, get) in COUNTERS {
        out.family(name, "counter", help);
        out.sample(name, &[], get(stats));
    }
    out.0
}

/// The exposition of each queue's health ([`QueueHealth`]): its dead rows, its size on
/// disk, what holds the horizon and for how long, whether that is past `warn`, SQLite's
/// WAL; and per figure this user may not read, a sample saying so (the series is absent
/// rather than wrong).
pub(crate) fn render_health(healths: &[QueueHealth], warn: Duration) -> String {
    let mut out = Exposition(String::new());
    out.family(
        "rowbus_queue_dead_rows",
        "gauge",
        "Rows deleted from a queue table and not yet cleaned up (PostgreSQL n_dead_tup over its partitions; MySQL/MariaDB the server's InnoDB history list length, scope=\"server\"); absent on SQLite.",
    );
    for h in healths {
        if let Ok(Some(d)) = &h.dead_rows {
            let scope = if d.server_wide { "server" } else { "table" };
            out.sample("rowbus_queue_dead_rows", &[("queue", &h.table), ("scope", scope)], d.rows);
        }
    }
    out.family(
        "rowbus_queue_bytes",
        "gauge",
        "A queue table's size on disk in bytes (PostgreSQL its partitions with indexes; MySQL/MariaDB data and index length; SQLite the database file and its WAL).",
    );
    for h in healths {
        if let Ok(Some(bytes)) = &h.bytes {
            out.sample("rowbus_queue_bytes", &[("queue", &h.table)], bytes);
        }
    }
    out.family(
        "rowbus_horizon_age_seconds",
        "gauge",
        "How long the transaction holding the database's horizon (keeping deleted rows from cleanup) has been open, by kind, pid (or thread id) and application; absent when nothing holds it or its age is not readable.",
    );
    for h in healths {
        if let Ok(Some(holder)) = &h.holder
            && let Ok(Some(age)) = &holder.age
        {
            let pid = holder.pid.map(|p| p.to_string()).unwrap_or_default();
            let labels = [
                ("queue", h.table.as_str()),
                ("kind", holder.kind.as_str()),
                ("pid", pid.as_str()),
                ("application", holder.application.as_deref().unwrap_or("")),
            ];
            out.sample("rowbus_horizon_age_seconds", &labels, age.as_secs_f64());
        }
    }
    out.family(
        "rowbus_horizon_held",
        "gauge",
        "Whether the horizon is held past the dashboard's threshold (--horizon-warn): 1 held, 0 not; on SQLite 1 while a reader keeps WAL frames from their checkpoint.",
    );
    for h in healths {
        out.sample("rowbus_horizon_held", &[("queue", &h.table)], u8::from(h.held_past(warn)));
    }
    out.family(
        "rowbus_wal_frames_held",
        "gauge",
        "SQLite: frames of the WAL a checkpoint could not copy into the database because a reader holds them.",
    );
    for h in healths {
        if let Some(wal) = &h.wal {
            out.sample("rowbus_wal_frames_held", &[("queue", &h.table)], wal.frames_left);
        }
    }
    out.family(
        "rowbus_health_unreadable",
        "gauge",
        "A figure of a queue's health this role may not read (figure dead_rows, bytes, holder or holder_age): 1, its series absent; see docs/operating.md for the rights it needs.",
    );
    for h in healths {
        let holder_age = matches!(&h.holder, Ok(Some(holder)) if holder.age.is_err());
        for (figure, unreadable) in [
            ("dead_rows", h.dead_rows.is_err()),
            ("bytes", h.bytes.is_err()),
            ("holder", h.holder.is_err()),
            ("holder_age", holder_age),
        ] {
            if unreadable {
                out.sample("rowbus_health_unreadable", &[("queue", &h.table), ("figure", figure)], 1);
            }
        }
    }
    out.0
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use rowbus::QueueTable;
    use rowbus::stats::{GroupStats, QueueCounts};
    use rowbus::workflow::WorkflowCounts;

    use super::*;

    fn line(table: &str, group: GroupStats) -> Line {
        Line { table: table.parse::<QueueTable>().unwrap(), group }
    }

    /// Backslash, double quote and line feed are escaped in label values; nothing else is.
    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label_value(r#"a\b"c"#), r#"a\\b\"c"#);
        assert_eq!(label_value("two\nlines"), "two\\nlines");
        assert_eq!(label_value("tab\tü{}=,"), "tab\tü{}=,");
    }

    /// Each state of each group is a sample of one family, with the group's name escaped,
    /// and a group without a dead-letter table has no dead sample.
    #[test]
    fn messages_by_state() {
        let lines = [
            line("jobs", {
                let mut g = GroupStats::default();
                (g.group, g.depth, g.ready, g.in_flight) = ("we\"ird\\\n".into(), 10, 4, 3);
                g.oldest = Some(Duration::from_millis(1500));
                g.oldest_ready = Some(Duration::from_millis(500));
                g.dead = Some(2);
                g
            }),
            line("other", {
                let mut g = GroupStats::default();
                (g.depth, g.ready) = (1, 1);
                g
            }),
        ];
        let text = render(&lines, None, &[], &[], &Stats::default());
        let samples: Vec<&str> = text.lines().filter(|l| l.starts_with("rowbus_messages{")).collect();
        assert_eq!(
            samples,
            [
                r#"rowbus_messages{queue="jobs",group="we\"ird\\\n",state="ready"} 4"#,
                r#"rowbus_messages{queue="jobs",group="we\"ird\\\n",state="delayed"} 3"#,
                r#"rowbus_messages{queue="jobs",group="we\"ird\\\n",state="in_flight"} 3"#,
                r#"rowbus_messages{queue="jobs",group="we\"ird\\\n",state="dead"} 2"#,
                r#"rowbus_messages{queue="other",group="",state="ready"} 1"#,
                r#"rowbus_messages{queue="other",group="",state="delayed"} 0"#,
                r#"rowbus_messages{queue="other",group="",state="in_flight"} 0"#,
            ]
        );
        assert!(text.contains(
            "\nrowbus_oldest_message_age_seconds{queue=\"jobs\",group=\"we\\\"ird\\\\\\n\"} 1.5\n"
        ));
        assert!(!text.contains("rowbus_oldest_message_age_seconds{queue=\"other\""));
        assert!(
            text.contains(
                "\nrowbus_oldest_ready_age_seconds{queue=\"jobs\",group=\"we\\\"ird\\\\\\n\"} 0.5\n"
            )
        );
        assert!(!text.contains("rowbus_oldest_ready_age_seconds{queue=\"other\""));
    }

    /// Every family has one HELP then one TYPE line right before its samples, and every
    /// sample belongs to the family announced last.
    #[test]
    fn every_family_has_help_and_type() {
        let mut notify = NotifyTableStats::default();
        (notify.table, notify.rows, notify.oldest) =
            ("rowbus_notify".into(), 7, Some(Duration::from_secs(3)));
        let mut stats = Stats::default();
        (stats.published, stats.publishes, stats.acked, stats.retried) = (5, 2, 4, 3);
        (stats.dead_lettered, stats.dead_letter_failures, stats.claims) = (2, 6, 9);
        (stats.handed_off, stats.claim_errors, stats.snoozed) = (11, 1, 8);
        let pauses = [("jobs".parse().unwrap(), Paused::default())];
        let mut events = QueueCounts::default();
        events.snoozed = 3;
        events.lease_lost = 1;
        let mut workflows = WorkflowCounts::default();
        (workflows.running, workflows.failed) = (4, 1);
        let counts = [
            Counts {
                table: "jobs".parse().unwrap(),
                counts: Ok(Some(events)),
                limited: Some(2),
                limits: Vec::new(),
                workflows: Some(workflows),
            },
            Counts {
                table: "old".parse().unwrap(),
                counts: Ok(None),
                limited: None,
                limits: Vec::new(),
                workflows: None,
            },
            Counts {
                table: "secret".parse().unwrap(),
                counts: Err(()),
                limited: None,
                limits: Vec::new(),
                workflows: None,
            },
        ];
        let text = render(&[line("jobs", GroupStats::default())], Some(&notify), &pauses, &counts, &stats);
        let mut current: Option<(String, String)> = None;
        let mut families = Vec::new();
        let mut lines = text.lines().peekable();
        while let Some(l) = lines.next() {
            if let Some(rest) = l.strip_prefix("# HELP ") {
                let name = rest.split(' ').next().unwrap().to_owned();
                let kind = lines
                    .next()
                    .and_then(|t| t.strip_prefix(&format!("# TYPE {name} ")))
                    .unwrap_or_else(|| panic!("no TYPE after HELP of {name}"));
                assert!(kind == "gauge" || kind == "counter", "{name}: {kind}");
                assert!(!families.contains(&name), "{name} announced twice");
                families.push(name.clone());
                current = Some((name, kind.to_owned()));
            } else {
                let (name, kind) =
                    current.as_ref().unwrap_or_else(|| panic!("sample before any family: {l}"));
                let sample = l.split(['{', ' ']).next().unwrap();
                assert_eq!(sample, name, "{l}");
                assert_eq!(kind == "counter", name.ends_with("_total"), "{name} is a {kind}");
            }
        }
        assert_eq!(
            families,
            [
                "rowbus_messages",
                "rowbus_oldest_message_age_seconds",
                "rowbus_oldest_ready_age_seconds",
                "rowbus_paused",
                "rowbus_queue_paused",
                "rowbus_queue_events_total",
                "rowbus_workflows",
                "rowbus_queue_limited",
                "rowbus_notify_table_rows",
                "rowbus_notify_table_oldest_age_seconds",
                "rowbus_published_total",
                "rowbus_publish_statements_total",
                "rowbus_acknowledged_total",
                "rowbus_retried_total",
                "rowbus_dead_lettered_total",
                "rowbus_dead_letter_failures_total",
                "rowbus_snoozed_total",
                "rowbus_claims_total",
                "rowbus_handed_off_total",
                "rowbus_claim_failures_total",
            ]
        );
        for expected in [
            "rowbus_workflows{queue=\"jobs\",status=\"running\"} 4",
            "rowbus_workflows{queue=\"jobs\",status=\"succeeded\"} 0",
            "rowbus_workflows{queue=\"jobs\",status=\"failed\"} 1",
            "rowbus_paused{queue=\"jobs\",group=\"\"} 0",
            "rowbus_queue_paused{queue=\"jobs\"} 0",
            "rowbus_notify_table_rows{table=\"rowbus_notify\"} 7",
            "rowbus_notify_table_oldest_age_seconds{table=\"rowbus_notify\"} 3",
            "rowbus_published_total 5",
            "rowbus_publish_statements_total 2",
            "rowbus_acknowledged_total 4",
            "rowbus_retried_total 3",
            "rowbus_dead_lettered_total 2",
            "rowbus_dead_letter_failures_total 6",
            "rowbus_snoozed_total 8",
            "rowbus_queue_limited{queue=\"jobs\"} 2",
            "rowbus_queue_events_total{queue=\"jobs\",event=\"cancelled\"} 0",
            "rowbus_queue_events_total{queue=\"jobs\",event=\"snoozed\"} 3",
            "rowbus_queue_events_total{queue=\"jobs\",event=\"timed_out\"} 0",
            "rowbus_queue_events_total{queue=\"jobs\",event=\"lease_lost\"} 1",
            "rowbus_claims_total 9",
            "rowbus_handed_off_total 11",
            "rowbus_claim_failures_total 1",
        ] {
            assert!(text.lines().any(|l| l == expected), "no line {expected:?} in\n{text}");
        }
        // A queue without a counts table, or whose table this role may not read: no sample.
        assert!(!text.contains("queue=\"old\"") && !text.contains("queue=\"secret\""), "{text}");
    }

    /// A pause as `Queue::paused` reads it.
    fn paused(queue: bool, groups: &[&str]) -> Paused {
        let mut paused = Paused::default();
        paused.queue = queue;
        paused.groups = groups.iter().map(|g| (*g).to_owned()).collect();
        paused
    }

    /// Each group has a `rowbus_paused` sample, 1 when a pause holds it (its own or the
    /// whole queue's, as `GroupStats::paused` says), its name escaped; each queue table a
    /// `rowbus_queue_paused` sample, 1 when paused as a whole, those without a group too.
    #[test]
    fn paused_groups_and_queues() {
        let held = |group: &str, paused| {
            let mut g = GroupStats::default();
            (g.group, g.paused) = (group.into(), paused);
            g
        };
        let lines = [
            line("jobs", held("", false)),
            line("jobs", held("a\"b", true)),
            line("mail", held("", true)),
            line("mail", held("x", true)),
        ];
        let pauses = [
            ("jobs".parse().unwrap(), paused(false, &["a\"b"])),
            ("mail".parse().unwrap(), paused(true, &[])),
            ("empty".parse().unwrap(), paused(true, &[])),
        ];
        let text = render(&lines, None, &pauses, &[], &Stats::default());
        let samples: Vec<&str> = text.lines().filter(|l| l.contains("paused")).collect();
        assert_eq!(
            samples,
            [
                "# HELP rowbus_paused Whether a queue table's group is held by a pause, its own or the whole queue's: 1 paused, 0 not (group \"\" is the default group).",
                "# TYPE rowbus_paused gauge",
                r#"rowbus_paused{queue="jobs",group=""} 0"#,
                r#"rowbus_paused{queue="jobs",group="a\"b"} 1"#,
                r#"rowbus_paused{queue="mail",group=""} 1"#,
                r#"rowbus_paused{queue="mail",group="x"} 1"#,
                "# HELP rowbus_queue_paused Whether a queue table is paused as a whole (every group held): 1 paused, 0 not.",
                "# TYPE rowbus_queue_paused gauge",
                r#"rowbus_queue_paused{queue="jobs"} 0"#,
                r#"rowbus_queue_paused{queue="mail"} 1"#,
                r#"rowbus_queue_paused{queue="empty"} 1"#,
            ]
        );
    }
}
