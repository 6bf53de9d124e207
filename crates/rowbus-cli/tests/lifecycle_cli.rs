//! The end of the lifecycle, in child processes against the real PostgreSQL and MariaDB
//! and a SQLite file: `rowbus undeploy --queue Q` drops every table of a queue's own,
//! refuses while a consumer holds a message (unless `--force`) and never drops a table
//! that is not a queue; `rowbus listen CHANNEL --forget NAME` deletes a durable listener's
//! position, and refuses while a process holds the name.

mod common;

use std::time::Duration;

use common::{
    Database, Kind, LINE_TIMEOUT, Running, assert_error, on_each_database, rowbus, run, show, text, unique,
};
use serde_json::Value;

/// A database with a notify table of the test's own (dropped at the end, with every
/// queue the test names through `queue`).
struct Db {
    database: Database,
    notify_table: String,
}

impl Db {
    fn new(kind: Kind) -> Db {
        let notify_table = unique("lcli_notify");
        let database = Database::new(kind, &notify_table);
        database.cleanup.notify_table(&notify_table);
        Db { database, notify_table }
    }

    /// A queue name of the test's own, dropped at the end if the test did not.
    fn queue(&self) -> String {
        self.database.cleanup.queue(&unique("lcli"))
    }

    fn rowbus(&self, args: &[&str]) -> std::process::Command {
        let mut cmd = rowbus();
        cmd.args(["--database-url", &self.database.url, "--notify-table", &self.notify_table]).args(args);
        cmd
    }

    /// Runs `rowbus ARGS`, which must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let output = run(self.rowbus(args));
        assert!(output.status.success(), "`rowbus {}` failed\n{}", args.join(" "), show(&output));
        text(&output.stdout)
    }

    /// The tables of queue `q` that exist.
    fn tables_of(&self, q: &str) -> Vec<String> {
        common::queue_tables_on(self.database.kind.backend(), q)
            .into_iter()
            .filter(|t| self.database.table_exists(t))
            .collect()
    }
}

fn undeploy_drops_every_table_of_the_queue(kind: Kind) {
    let db = Db::new(kind);
    let (q, other) = (db.queue(), db.queue());
    db.ok(&["deploy", "--queue", &q, "--queue", &other, "--keep", "1h"]);
    db.ok(&["schedule", &q, "sweep", "--every", "1h", "--payload", "x"]);
    db.ok(&["publish", &q, "a message"]);
    db.ok(&["publish", &q, "x", "--dedup", "d-1", "--key", "k"]);
    assert!(db.tables_of(&q).len() >= 6, "deployed: {:?}", db.tables_of(&q));

    assert_eq!(
        db.ok(&["undeploy", "--queue", &q]),
        format!("queue `{q}` dropped, with its dead letters, schedules and history\n")
    );
    assert_eq!(db.tables_of(&q), Vec::<String>::new(), "every table of `{q}` is gone");
    assert!(db.database.table_exists(&other), "the other queue stays");

    let again = run(db.rowbus(&["undeploy", "--queue", &q]));
    let line = assert_error(&again, "undeploy of a dropped queue");
    assert!(line.contains("does not exist"), "{line}");
}
on_each_database!(undeploy_drops_every_table_of_the_queue);

fn undeploy_refuses_a_queue_at_work_unless_forced(kind: Kind) {
    let db = Db::new(kind);
    let q = db.queue();
    db.ok(&["deploy", "--queue", &q]);
    db.ok(&["publish", &q, "slow"]);
    let mut consumer = Running::spawn(
        db.rowbus(&["consume", &q, "--exec", "exec sleep 60 >/dev/null 2>&1"]),
        Duration::from_secs(20),
    );
    consumer.await_stderr("consuming", LINE_TIMEOUT, |line| line.starts_with("rowbus: consuming "));
    let deadline = std::time::Instant::now() + LINE_TIMEOUT;
    loop {
        let stats: Value = serde_json::from_str(&db.ok(&["stats", "--json", &q])).unwrap();
        if stats["queues"][0]["in_flight"].as_i64() == Some(1) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the consumer never claimed: {stats}");
        std::thread::sleep(Duration::from_millis(100));
    }

    let refused = run(db.rowbus(&["undeploy", "--queue", &q]));
    let line = assert_error(&refused, "undeploy of a queue at work");
    assert_eq!(
        line,
        format!(
            "rowbus: error: queue `{q}` has 1 message in flight: a consumer is at work on it; stop its \
             consumers first, or drop it anyway with `rowbus undeploy --force`"
        )
    );
    assert!(db.database.table_exists(&q), "refused: nothing dropped");

    db.ok(&["undeploy", "--queue", &q, "--force"]);
    assert_eq!(db.tables_of(&q), Vec::<String>::new());
    let _ = consumer.stop("KILL");
}
on_each_database!(undeploy_refuses_a_queue_at_work_unless_forced);

fn undeploy_leaves_a_table_that_is_not_a_queue(kind: Kind) {
    let db = Db::new(kind);
    let name = db.database.cleanup.table(&unique("lcli_orders"));
    db.database.exec(&format!("CREATE TABLE {name} (id INTEGER PRIMARY KEY, note TEXT)"));
    let refused = run(db.rowbus(&["undeploy", "--queue", &name]));
    let line = assert_error(&refused, "undeploy of a table that is not a queue");
    assert!(line.contains("is not a rowbus queue table"), "{line}");
    assert!(db.database.table_exists(&name), "the table stays");
}
on_each_database!(undeploy_leaves_a_table_that_is_not_a_queue);

fn listen_forget_deletes_a_durable_listeners_position(kind: Kind) {
    let db = Db::new(kind);
    db.ok(&["deploy", "--durable"]);
    let channel = unique("lcli_ch");
    let listen =
        |args: &[&str]| db.rowbus(&[&["--poll-interval", "0.05", "listen", &channel], args].concat());
    // Stats of a queue of the test's own: the durable listeners are listed beside it,
    // and other programs' queues on the server are not read.
    let q = db.queue();
    db.ok(&["deploy", "--queue", &q]);
    let durable_names = || -> Vec<String> {
        let stats: Value = serde_json::from_str(&db.ok(&["stats", "--json", &q])).unwrap();
        stats["durable_listeners"]
            .as_array()
            .unwrap_or_else(|| panic!("no durable listeners in {stats}"))
            .iter()
            .filter(|d| d["channel"] == channel.as_str())
            .map(|d| d["name"].as_str().unwrap().to_owned())
            .collect()
    };

    let mut listener = Running::spawn(listen(&["--durable", "audit", "--lease", "1s"]), LINE_TIMEOUT);
    listener.await_stderr("listening on", LINE_TIMEOUT, |line| line.contains("listening on"));
    assert_eq!(durable_names(), ["audit"]);
    let held = run(listen(&["--forget", "audit"]));
    let line = assert_error(&held, "forgetting a name a process holds");
    assert!(line.contains("audit"), "{line}");
    let (status, _, stderr) = listener.stop("INT");
    assert!(status.success(), "{status} {stderr:?}");
    assert_eq!(durable_names(), ["audit"], "kept after the listener stopped");

    assert_eq!(
        db.ok(&["listen", &channel, "--forget", "audit"]),
        format!("durable listener \"audit\" on {channel:?} forgotten\n")
    );
    assert_eq!(durable_names(), Vec::<String>::new());
    assert_eq!(
        db.ok(&["listen", &channel, "--forget", "audit"]),
        format!("no durable listener \"audit\" on {channel:?}: nothing to forget\n")
    );
}
on_each_database!(listen_forget_deletes_a_durable_listeners_position);
