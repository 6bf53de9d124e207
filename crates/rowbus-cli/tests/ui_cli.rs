//! End-to-end tests of `rowbus ui`: the binary serving a queue with known contents, read
//! over plain HTTP (`/metrics`, `/api/queues`, the token on operations) and in a real
//! browser (headless Chromium, which `scripts/services.sh` installs; the browser test
//! fails when it is missing). The browser test writes its screenshot under target/ (the
//! test's temporary folder); with `ROWBUS_UPDATE_SCREENSHOT=1` it also replaces
//! docs/dashboard.png, the picture the docs show, which a test run otherwise leaves alone.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    Database, Kind, LINE_TIMEOUT, RUN_TIMEOUT, Running, assert_error, on_each_database, read_all, rowbus,
    run, show, text, unique, wait_timeout,
};
use serde_json::{Value, json};

/// The error of the dead letter [`Db::fill`] makes.
const ERROR: &str = "exit status 3; stderr: cannot open invoice 42";

/// How long `rowbus ui` may take to exit after SIGINT/SIGTERM, and to say where it serves.
const EXIT_TIMEOUT: Duration = Duration::from_secs(15);

/// One test's database, notify table and queue tables, dropped at the end.
struct Db {
    database: Database,
    notify_table: String,
    queues: Vec<String>,
}

impl Db {
    /// On SQLite the file is the test's own, so `queues` and the notify table keep their
    /// names (the browser test shows them); elsewhere they are made unique.
    fn new(kind: Kind, test: &str, queues: &[&str]) -> Db {
        let notify_table = if kind == Kind::Sqlite {
            "rowbus_notify".to_owned()
        } else {
            unique(&format!("ui_{test}_notify"))
        };
        let queues = queues
            .iter()
            .map(|q| if kind == Kind::Sqlite { (*q).to_owned() } else { unique(&format!("ui_{q}")) })
            .collect();
        Db { database: Database::new(kind, &unique(&format!("ui_{test}"))), notify_table, queues }
    }

    fn rowbus(&self, args: &[&str]) -> Command {
        let mut cmd = rowbus();
        cmd.args(["--database-url", &self.database.url, "--notify-table", &self.notify_table]).args(args);
        cmd
    }

    /// Runs a command that must succeed; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        let output = run(self.rowbus(args));
        assert!(
            output.status.success(),
            "`rowbus {}` on {} failed (is the server up? scripts/services.sh starts it)\n{}",
            args.join(" "),
            self.database.server(),
            show(&output)
        );
        text(&output.stdout)
    }

    /// The groups of `queue` that `rowbus stats --json` says are paused.
    fn paused_groups(&self, queue: &str) -> Vec<String> {
        let stats: Value = serde_json::from_str(&self.ok(&["stats", "--json", queue])).unwrap();
        let groups = stats["queues"].as_array().unwrap_or_else(|| panic!("no queues: {stats}"));
        groups
            .iter()
            .filter(|g| g["paused"] == true)
            .map(|g| g["group"].as_str().unwrap().to_owned())
            .collect()
    }

    /// Deploys the queues and fills the first: in the default group 3 ready messages and 1
    /// delayed for an hour; in group `g"x` 1 ready; in group `gone` 1 dead letter (payload
    /// `doomed`, 5 attempts, error [`ERROR`]) and nothing else.
    fn fill(&self) -> &str {
        let mut deploy = vec!["deploy"];
        for q in &self.queues {
            deploy.extend(["--queue", q]);
        }
        self.ok(&deploy);
        let q = self.queues[0].as_str();
        for payload in ["a", "b", "c"] {
            self.ok(&["publish", q, payload]);
        }
        self.ok(&["publish", q, "--delay", "1h", "later"]);
        self.ok(&["publish", q, "--group", "g\"x", "quoted"]);
        self.ok(&["publish", q, "--group", "gone", "doomed"]);
        self.kill("gone", ERROR);
        q
    }

    /// Moves group `group`'s messages in the first queue to its dead-letter table, with 5
    /// attempts and `error`, by SQL as a consumer giving up would.
    fn kill(&self, group: &str, error: &str) {
        let q = &self.queues[0];
        self.database.exec(&format!(
            "INSERT INTO {q}_dead (id, group_name, payload, attempts, created_at, last_error) \
             SELECT id, group_name, payload, 5, created_at, '{error}' FROM {q} WHERE group_name = '{group}'; \
             DELETE FROM {q} WHERE group_name = '{group}'"
        ));
    }
}

impl Drop for Db {
    /// Hands the queues (with their dead-letter and pause tables) and the notify table to
    /// the database's cleanup guard, which drops them right after.
    fn drop(&mut self) {
        for q in &self.queues {
            self.database.cleanup.queue(q);
        }
        self.database.cleanup.notify_table(&self.notify_table);
    }
}

/// A running `rowbus ui`, where it serves and the token it printed (none when read-only).
struct Served {
    running: Running,
    address: String,
    token: Option<String>,
}

impl Served {
    /// Starts `cmd` (a `rowbus ui --listen 127.0.0.1:0 ...`) and reads its first line.
    fn start(cmd: Command) -> Served {
        let mut running = Running::spawn(cmd, EXIT_TIMEOUT);
        let line = running.await_stderr("dashboard on http://", EXIT_TIMEOUT, |l| {
            l.starts_with("rowbus: dashboard on http://")
        });
        let url = line["rowbus: dashboard on http://".len()..].split(' ').next().unwrap().to_owned();
        let (address, rest) = url.split_once('/').unwrap_or_else(|| panic!("no path in {line:?}"));
        let token = rest.strip_prefix("#token=").map(str::to_owned);
        Served { running, address: address.to_owned(), token }
    }

    /// `METHOD path` with `headers`; the status, the response's headers (lowercase) and body.
    fn request(&self, method: &str, path: &str, headers: &[(&str, &str)]) -> (u16, String, String) {
        self.send(method, path, headers, "")
    }

    /// `POST path` with `body` as the page's `operation()` sends it: JSON, with the token
    /// `token` (none: no header); the status and the body.
    fn operation(&self, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
        let mut headers = vec![("content-type", "application/json")];
        headers.extend(token.map(|t| ("x-rowbus-token", t)));
        let (status, _, body) = self.send("POST", path, &headers, body);
        (status, body)
    }

    /// `METHOD path` with `headers` and `body`; the status, the response's headers
    /// (lowercase) and body.
    fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> (u16, String, String) {
        let mut request = format!("{method} {path} HTTP/1.1\r\nHost: {}\r\n", self.address);
        for (name, value) in headers {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str(&format!("Content-Length: {}\r\n", body.len()));
        self.raw(&request, body)
    }

    /// `GET path` as a page at `host` (none: no Host header) would send it, on HTTP/1.1;
    /// the status and the body.
    fn get_as(&self, host: Option<&str>, path: &str) -> (u16, String) {
        let host = host.map(|h| format!("Host: {h}\r\n")).unwrap_or_default();
        let (status, _, body) = self.raw(&format!("GET {path} HTTP/1.1\r\n{host}"), "");
        (status, body)
    }

    /// Sends `head` and `body` to the server, as [`exchange`] does.
    fn raw(&self, head: &str, body: &str) -> (u16, String, String) {
        exchange(&self.address, head, body)
    }

    /// Sends SIGTERM: the server must exit cleanly, saying nothing more.
    fn stop(mut self) {
        let (status, _, stderr) = self.running.stop("TERM");
        assert!(status.success(), "`rowbus ui` exited {status} after SIGTERM:\n{}", stderr.join("\n"));
        assert_eq!(stderr.len(), 1, "more than the address on stderr:\n{}", stderr.join("\n"));
    }

    /// Waits (at most [`RUN_TIMEOUT`]) until the server has taken `n` samples of `table`.
    fn await_samples(&self, table: &str, n: usize) {
        let deadline = std::time::Instant::now() + RUN_TIMEOUT;
        loop {
            let data: Value = serde_json::from_str(&self.get("/api/queues").1).unwrap();
            if data["history"][table].as_array().is_some_and(|s| s.len() >= n) {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "fewer than {n} samples of {table} within {RUN_TIMEOUT:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Waits (at most [`RUN_TIMEOUT`]) until `/api/queues` has a throughput interval of
    /// `table`.
    fn await_throughput(&self, table: &str) {
        let deadline = std::time::Instant::now() + RUN_TIMEOUT;
        loop {
            let data: Value = serde_json::from_str(&self.get("/api/queues").1).unwrap();
            if data["throughput"][table].as_array().is_some_and(|r| !r.is_empty()) {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "no throughput of {table} within {RUN_TIMEOUT:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The dashboard's dead letters of `queue` (`GET /api/queues/{queue}/dead`).
    fn dead(&self, queue: &str) -> Vec<Value> {
        let body = self.get(&format!("/api/queues/{queue}/dead")).1;
        let list: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        list["dead_letters"].as_array().unwrap_or_else(|| panic!("no dead_letters: {body}")).clone()
    }

    /// `[depth, dead]` of `group` in `queue` as `/api/queues` has them; null when the
    /// group has neither messages nor dead letters.
    fn figures(&self, queue: &str, group: &str) -> Value {
        let data: Value = serde_json::from_str(&self.get("/api/queues").1).unwrap();
        let line =
            data["queues"].as_array().unwrap().iter().find(|g| g["table"] == queue && g["group"] == group);
        line.map_or(Value::Null, |g| json!([g["depth"], g["dead"]]))
    }

    /// What `/api/queues` says is paused in `queue`: `{"queue": bool, "groups": [...]}`.
    fn pauses(&self, queue: &str) -> Value {
        let data: Value = serde_json::from_str(&self.get("/api/queues").1).unwrap();
        data["pauses"][queue].clone()
    }

    /// The `/metrics` lines of `queue`'s pauses: `rowbus_paused` and `rowbus_queue_paused`.
    fn paused_metrics(&self, queue: &str) -> Vec<String> {
        let metrics = self.get("/metrics").1;
        let ours = [
            format!("rowbus_paused{{queue=\"{queue}\","),
            format!("rowbus_queue_paused{{queue=\"{queue}\"}}"),
        ];
        metrics
            .lines()
            .filter(|l| ours.iter().any(|o| l.starts_with(o.as_str())))
            .map(str::to_owned)
            .collect()
    }

    /// `GET path`, which must answer 200; its headers and body.
    fn get(&self, path: &str) -> (String, String) {
        let (status, head, body) = self.request("GET", path, &[]);
        assert_eq!(status, 200, "GET {path}:\n{head}\n\n{body}");
        (head, body)
    }
}

/// Sends `head` (the request line and headers, each ending in CRLF, without the empty
/// line) and `body` to `address`, closing the connection after; the status, the
/// response's headers (lowercase) and body.
fn exchange(address: &str, head: &str, body: &str) -> (u16, String, String) {
    let mut stream =
        TcpStream::connect(address).unwrap_or_else(|e| panic!("cannot connect to {address}: {e}"));
    stream.set_read_timeout(Some(RUN_TIMEOUT)).unwrap();
    let request = format!("{head}Connection: close\r\n\r\n{body}");
    stream.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) =
        response.split_once("\r\n\r\n").unwrap_or_else(|| panic!("no header end: {response:?}"));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or_else(|| panic!("{head}"));
    assert!(!head.to_lowercase().contains("transfer-encoding"), "a chunked response:\n{head}");
    (status, head.to_lowercase(), body.to_owned())
}

/// The dashboard's JSON and the metrics show each group's figures as the database has
/// them, label values escaped; the metrics have HELP and TYPE for each family. SIGTERM
/// stops the server cleanly.
fn figures_and_metrics(kind: Kind) {
    let db = Db::new(kind, "figures", &["jobs"]);
    let q = db.fill();
    // Two snoozes counted by consumers elsewhere.
    db.database.exec(&format!("INSERT INTO {q}_count (name, n) VALUES ('snoozed', 2)"));
    let served = Served::start(db.rowbus(&["ui", q, "--listen", "127.0.0.1:0"]));

    let (head, metrics) = served.get("/metrics");
    assert!(head.contains("content-type: text/plain; version=0.0.4"), "{head}");
    let ours: Vec<&str> =
        metrics.lines().filter(|l| l.starts_with(&format!("rowbus_messages{{queue=\"{q}\""))).collect();
    let expected: Vec<String> = [
        ("", "ready", 3),
        ("", "delayed", 1),
        ("", "in_flight", 0),
        ("", "dead", 0),
        ("g\\\"x", "ready", 1),
        ("g\\\"x", "delayed", 0),
        ("g\\\"x", "in_flight", 0),
        ("g\\\"x", "dead", 0),
        ("gone", "ready", 0),
        ("gone", "delayed", 0),
        ("gone", "in_flight", 0),
        ("gone", "dead", 1),
    ]
    .iter()
    .map(|(group, state, n)| {
        format!("rowbus_messages{{queue=\"{q}\",group=\"{group}\",state=\"{state}\"}} {n}")
    })
    .collect();
    assert_eq!(ours, expected, "\n{metrics}");
    for family in
        ["rowbus_messages gauge", "rowbus_published_total counter", "rowbus_claim_failures_total counter"]
    {
        let name = family.split(' ').next().unwrap();
        assert!(metrics.contains(&format!("# HELP {name} ")), "no HELP of {name}:\n{metrics}");
        assert!(metrics.contains(&format!("# TYPE {family}\n")), "no TYPE {family}:\n{metrics}");
    }
    // The serving process published nothing: its counters say so.
    assert!(metrics.lines().any(|l| l == "rowbus_published_total 0"), "{metrics}");
    // What the queue's consumers did, from its counts table.
    let events: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with(&format!("rowbus_queue_events_total{{queue=\"{q}\"")))
        .collect();
    let expected: Vec<String> = [
        ("cancelled", 0),
        ("snoozed", 2),
        ("timed_out", 0),
        ("lease_lost", 0),
        ("relayed", 0),
        ("confirmed", 0),
        ("resent", 0),
        ("refused", 0),
    ]
    .iter()
    .map(|(event, n)| format!("rowbus_queue_events_total{{queue=\"{q}\",event=\"{event}\"}} {n}"))
    .collect();
    assert_eq!(events, expected, "\n{metrics}");
    let notify_rows = metrics.lines().any(|l| l.starts_with("rowbus_notify_table_rows{"));
    assert_eq!(notify_rows, kind != Kind::Postgres, "a notify table only off PostgreSQL:\n{metrics}");

    let (head, body) = served.get("/api/queues");
    assert!(head.contains("content-type: application/json"), "{head}");
    let data: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let groups: Vec<Value> = data["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            json!([g["table"], g["group"], g["depth"], g["ready"], g["delayed"], g["in_flight"], g["dead"]])
        })
        .collect();
    assert_eq!(
        groups,
        [json!([q, "", 4, 3, 1, 0, 0]), json!([q, "g\"x", 1, 1, 0, 0, 0]), json!([q, "gone", 0, 0, 0, 0, 1])],
        "{body}"
    );
    // The sample the sampler takes at start is in the chart's history once taken (on its
    // own task: a loaded machine can answer the request above first): 5 messages, 1 dead,
    // 6 ever published (the dead letter's included).
    served.await_samples(q, 1);
    let body = served.get("/api/queues").1;
    let data: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
    let samples = data["history"][q].as_array().unwrap_or_else(|| panic!("no history of {q}: {body}"));
    assert_eq!(samples[0].as_array().unwrap()[1..], [json!(5), json!(1), json!(6)], "{body}");
    // A sample begun after this publish has finished counts it: the one after the next.
    let taken = samples.len();
    db.ok(&["publish", q, "one more"]);
    served.await_samples(q, taken + 2);
    let data: Value = serde_json::from_str(&served.get("/api/queues").1).unwrap();
    let samples = data["history"][q].as_array().unwrap();
    let published: Vec<&Value> = samples.iter().map(|s| &s[3]).collect();
    assert_eq!(published.last(), Some(&&json!(7)), "{data}");
    assert!(published.windows(2).all(|w| w[0].as_u64() <= w[1].as_u64()), "{data}");
    assert!(data["throughput"][q].is_array() && data["rate_step_s"] == json!(10.0), "{data}");
    assert_eq!(data["read_only"], json!(false));
    assert_eq!(data["notify_table"].is_null(), kind == Kind::Postgres, "{body}");
    assert_eq!(
        data["counts"][q],
        json!({
            "cancelled": 0, "snoozed": 2, "timed_out": 0, "lease_lost": 0, "limited": 0,
            "relayed": 0, "confirmed": 0, "resent": 0, "refused": 0
        }),
        "{data}"
    );

    // The queue's messages, page by page, lowest id first: six in the table (the dead
    // letter is not), the delayed one said so.
    let (mut seen, mut after) = (Vec::new(), None::<i64>);
    for _ in 0..5 {
        let path = match after {
            Some(id) => format!("/api/queues/{q}/messages?limit=2&after={id}"),
            None => format!("/api/queues/{q}/messages?limit=2"),
        };
        let body = served.get(&path).1;
        let page: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"));
        assert_eq!((&page["queue"], &page["limit"]), (&json!(q), &json!(2)), "{body}");
        seen.extend(
            page["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| json!([m["payload"], m["group"], m["state"]])),
        );
        match page["next"].as_i64() {
            Some(id) => after = Some(id),
            None => break,
        }
    }
    assert_eq!(
        seen,
        [
            json!(["a", "", "queued"]),
            json!(["b", "", "queued"]),
            json!(["c", "", "queued"]),
            json!(["later", "", "delayed"]),
            json!(["quoted", "g\"x", "queued"]),
            json!(["one more", "", "queued"]),
        ]
    );
    let (status, _, body) = served.request("GET", &format!("/api/queues/{q}/messages?limit=0"), &[]);
    assert!(status == 400 && body.contains("limit"), "{status}: {body}");
    served.stop();
}
on_each_database!(figures_and_metrics);

/// The page's JSON and the metrics show each queue's health: its size, whether the
/// horizon is held past `--horizon-warn`; on PostgreSQL a transaction held open by psql
/// is timed in `rowbus_horizon_age_seconds` (it, or another program's older one).
fn health_in_the_json_and_the_metrics(kind: Kind) {
    let db = Db::new(kind, "health", &["jobs"]);
    let q = db.fill().to_owned();
    let holder = (kind == Kind::Postgres).then(|| {
        Command::new("psql")
            .args(["-h", "127.0.0.1", "-U", "postgres", "-d", "test", "-c"])
            .arg("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class; SELECT pg_sleep(15)")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("psql")
    });
    std::thread::sleep(Duration::from_millis(1500));
    let served = Served::start(db.rowbus(&["ui", &q, "--listen", "127.0.0.1:0", "--horizon-warn", "1s"]));
    let data: Value = serde_json::from_str(&served.get("/api/queues").1).unwrap();
    assert_eq!(data["horizon_warn_s"], 1.0, "{data}");
    let health = &data["health"][q.as_str()];
    assert!(health["bytes"].as_u64() > Some(0), "{data}");
    let metrics = served.get("/metrics").1;
    for family in ["rowbus_queue_bytes", "rowbus_horizon_held", "rowbus_horizon_age_seconds"] {
        assert!(metrics.contains(&format!("# TYPE {family} gauge")), "{family}:\n{metrics}");
    }
    let held = format!("rowbus_horizon_held{{queue=\"{q}\"}} {}", u8::from(health["held_past_warn"] == true));
    assert!(metrics.lines().any(|l| l == held), "{held}:\n{metrics}");
    assert!(
        metrics.lines().any(|l| l.starts_with(&format!("rowbus_queue_bytes{{queue=\"{q}\"}} "))),
        "{metrics}"
    );
    if let Some(mut holder) = holder {
        assert_eq!(health["held_past_warn"], true, "a snapshot held 1.5 s: {health}");
        let timed = format!("rowbus_horizon_age_seconds{{queue=\"{q}\",kind=\"session\",pid=");
        assert!(metrics.lines().any(|l| l.starts_with(&timed)), "{timed}:\n{metrics}");
        let _ = holder.kill();
        let _ = holder.wait();
    }
    assert!(served.get("/").1.contains("HORIZON HELD"), "the page marks a held horizon");
    served.stop();
}
on_each_database!(health_in_the_json_and_the_metrics);

/// An operation needs a POST carrying the token printed at start: without it, with
/// another, or by GET it is refused before reaching any operation; with it, the request
/// gets through (here to "no such operation"). A token given in ROWBUS_UI_TOKEN is the one
/// printed and required; --read-only serves no operation, the dead letters' neither.
#[test]
fn operations_need_the_token() {
    let db = Db::new(Kind::Sqlite, "token", &["jobs"]);
    let q = db.fill();
    let served = Served::start(db.rowbus(&["ui", q, "--listen", "127.0.0.1:0"]));
    let token = served.token.clone().expect("a token in the printed URL");
    assert_eq!(token.len(), 32, "{token}");
    let op = "/api/ops/anything";
    assert_eq!(served.request("POST", op, &[]).0, 403);
    assert_eq!(served.request("POST", op, &[("x-rowbus-token", "0123456789abcdef0123456789abcdef")]).0, 403);
    assert_eq!(served.request("GET", op, &[("x-rowbus-token", &token)]).0, 405);
    let (status, _, body) = served.request("POST", op, &[("x-rowbus-token", &token)]);
    assert_eq!((status, body.as_str()), (404, "no such operation\n"));
    drop(served);

    let given = "given-token-0123456789";
    let mut cmd = db.rowbus(&["ui", q, "--listen", "127.0.0.1:0"]);
    cmd.env("ROWBUS_UI_TOKEN", given);
    let served = Served::start(cmd);
    assert_eq!(served.token.as_deref(), Some(given));
    assert_eq!(served.request("POST", op, &[("x-rowbus-token", &token)]).0, 403);
    assert_eq!(served.request("POST", op, &[("x-rowbus-token", given)]).0, 404);
    drop(served);

    let served = Served::start(db.rowbus(&["ui", q, "--listen", "127.0.0.1:0", "--read-only"]));
    assert_eq!(served.token, None);
    let (status, _, body) = served.request("POST", op, &[]);
    assert_eq!((status, body.as_str()), (404, ""), "no operation route when read-only");
    let (status, body) =
        served.operation(&format!("/api/ops/queues/{q}/dead/requeue"), None, r#"{"all":true}"#);
    assert_eq!((status, body.as_str()), (404, ""), "no requeue when read-only");
    let (status, body) = served.operation(&format!("/api/ops/queues/{q}/pause"), None, "{}");
    assert_eq!((status, body.as_str()), (404, ""), "no pause when read-only");
    assert_eq!(served.dead(q).len(), 1, "the dead letters are still listed");
    let data: Value = serde_json::from_str(&served.get("/api/queues").1).unwrap();
    assert_eq!(data["read_only"], json!(true));
}

/// The dashboard lists a queue's dead letters with their errors, and its operations put
/// them back and purge them: only a POST carrying the token moves anything (without it,
/// or with another, 403 and nothing changes); with it a requeue moves the dead letter
/// back into its group (the depth up, the dead count down) once, a purge deletes it.
/// Bodies that do not name dead letters by integer ids or `all`, queue names the library
/// refuses, and queues the dashboard does not show are refused, changing nothing.
fn dead_letter_operations(kind: Kind) {
    let db = Db::new(kind, "deadops", &["jobs", "other"]);
    let q = db.fill();
    let other = db.queues[1].clone();
    let served = Served::start(db.rowbus(&["ui", q, "--listen", "127.0.0.1:0"]));
    let token = served.token.clone().expect("a token");

    let list = served.dead(q);
    assert_eq!(list.len(), 1, "{list:?}");
    let letter = &list[0];
    assert_eq!(
        [&letter["group"], &letter["attempts"], &letter["last_error"], &letter["payload"]],
        [&json!("gone"), &json!(5), &json!(ERROR), &json!("doomed")],
        "{letter}"
    );
    assert!(letter["published_at"].is_string() && letter["died_at"].is_string(), "{letter}");
    let id = letter["id"].as_i64().expect("an integer id");

    let requeue = format!("/api/ops/queues/{q}/dead/requeue");
    let purge = format!("/api/ops/queues/{q}/dead/purge");
    let one = format!(r#"{{"ids":[{id}]}}"#);
    for (path, body) in [(&requeue, one.as_str()), (&purge, r#"{"all":true}"#)] {
        assert_eq!(served.operation(path, None, body).0, 403, "POST {path} without the token");
        let wrong = Some("0123456789abcdef0123456789abcdef");
        assert_eq!(served.operation(path, wrong, body).0, 403, "POST {path} with another token");
    }
    let token = Some(token.as_str());
    for (path, body, status) in [
        (requeue.clone(), r#"{"ids":["1"]}"#.to_owned(), 400),
        (requeue.clone(), format!(r#"{{"ids":[{id}.5]}}"#), 400),
        (requeue.clone(), r#"{"ids":[]}"#.to_owned(), 400),
        (purge.clone(), format!(r#"{{"all":true,"ids":[{id}]}}"#), 400),
        (purge.clone(), "not json".to_owned(), 400),
        ("/api/ops/queues/jobs%3B%20drop/dead/purge".to_owned(), r#"{"all":true}"#.to_owned(), 400),
        (format!("/api/ops/queues/{other}/dead/purge"), r#"{"all":true}"#.to_owned(), 404),
    ] {
        let (got, text) = served.operation(&path, token, &body);
        assert_eq!(got, status, "POST {path} {body}: {text}");
    }
    // An id out of range is refused as one, not as "not an integer".
    for big in ["1e20", "100000000000000000000", "0", "-3"] {
        let (got, text) = served.operation(&requeue, token, &format!(r#"{{"ids":[{big}]}}"#));
        assert_eq!(got, 400, "{big}: {text}");
        assert!(text.contains("is not a whole number from 1 to 9223372036854775807"), "{big}: {text}");
    }
    assert_eq!(served.figures(q, "gone"), json!([0, 1]), "a refused operation changed something");
    assert_eq!(served.dead(q).len(), 1);

    let (status, body) = served.operation(&requeue, token, &one);
    assert_eq!(
        (status, serde_json::from_str::<Value>(&body).ok()),
        (200, Some(json!({ "requeued": 1 }))),
        "{body}"
    );
    assert_eq!(served.figures(q, "gone"), json!([1, 0]), "the dead letter is back in its group");
    assert!(served.dead(q).is_empty());
    let (status, body) = served.operation(&requeue, token, &one);
    assert_eq!((status, body.as_str()), (200, r#"{"requeued":0}"#), "requeued twice");
    assert_eq!(served.figures(q, "gone"), json!([1, 0]));

    db.kill("gone", "again");
    assert_eq!(served.figures(q, "gone"), json!([0, 1]));
    let (status, body) = served.operation(&purge, token, r#"{"all":true}"#);
    assert_eq!((status, body.as_str()), (200, r#"{"purged":1}"#));
    assert_eq!(served.figures(q, "gone"), Value::Null, "purged: group `gone` has nothing left");
    assert!(served.dead(q).is_empty());
    served.stop();
}
on_each_database!(dead_letter_operations);

/// The dashboard cancels a message by id, behind the token: refused without it and for a
/// body that names no ids; with it, the message leaves the queue (and its messages page),
/// and a second cancel of the id finds nothing.
fn cancel_from_the_dashboard(kind: Kind) {
    let db = Db::new(kind, "cancelui", &["jobs"]);
    let q = db.fill();
    let served = Served::start(db.rowbus(&["ui", q, "--listen", "127.0.0.1:0"]));
    let token = served.token.clone().expect("a token");
    let ids = |served: &Served| -> Vec<i64> {
        let (_, body) = served.get(&format!("/api/queues/{q}/messages?limit=100"));
        let page: Value = serde_json::from_str(&body).unwrap();
        page["messages"].as_array().unwrap().iter().map(|m| m["id"].as_i64().unwrap()).collect()
    };
    let before = ids(&served);
    let id = before[0];
    let cancel = format!("/api/ops/queues/{q}/cancel");
    let one = format!(r#"{{"ids":[{id}]}}"#);
    assert_eq!(served.operation(&cancel, None, &one).0, 403, "without the token");
    for body in [r#"{"ids":[]}"#, r#"{"all":true}"#, r#"{"ids":[0]}"#] {
        assert_eq!(served.operation(&cancel, Some(&token), body).0, 400, "{body}");
    }
    assert_eq!(ids(&served), before, "a refused cancel changed nothing");
    let (status, body) = served.operation(&cancel, Some(&token), &one);
    assert_eq!((status, body.as_str()), (200, r#"{"cancelled":1,"running":0}"#));
    assert_eq!(ids(&served), before[1..].to_vec(), "message {id} left the queue");
    let (status, body) = served.operation(&cancel, Some(&token), &one);
    assert_eq!((status, body.as_str()), (200, r#"{"cancelled":0,"running":0}"#), "cancelled twice");
    served.stop();
}
on_each_database!(cancel_from_the_dashboard);

/// The dashboard pauses and resumes a group or the whole queue, as `rowbus pause` and
/// `rowbus resume` do: only a POST carrying the token does anything (without it, or with
/// another, 403 and nothing is paused); bodies other than `{}` or a string `group` the
/// library accepts are refused, as is a queue the dashboard does not show. With the token,
/// `rowbus stats --json`, `/api/queues` and `/metrics` show the group, then the whole
/// queue, paused, and a resume clears it. A running consumer elsewhere, listening and
/// polling every ten minutes, takes nothing published while its queue is paused and gets
/// it at once when the dashboard resumes the queue: the resume woke it.
fn pause_operations(kind: Kind) {
    let db = Db::new(kind, "pauseops", &["jobs", "mail", "hidden"]);
    let q = db.fill().to_owned();
    let (mail, hidden) = (db.queues[1].clone(), db.queues[2].clone());
    let served = Served::start(db.rowbus(&["ui", &q, &mail, "--listen", "127.0.0.1:0"]));
    let token = served.token.clone().expect("a token");
    let nothing = json!({ "queue": false, "groups": [] });
    let (pause, resume) = (format!("/api/ops/queues/{q}/pause"), format!("/api/ops/queues/{q}/resume"));
    let group = r#"{"group":"g\"x"}"#;

    for (path, body) in [(&pause, group), (&pause, "{}"), (&resume, "{}")] {
        assert_eq!(served.operation(path, None, body).0, 403, "POST {path} without the token");
        let wrong = Some("0123456789abcdef0123456789abcdef");
        assert_eq!(served.operation(path, wrong, body).0, 403, "POST {path} with another token");
    }
    let token = Some(token.as_str());
    for (path, body, status) in [
        (pause.clone(), r#"{"group":1}"#, 400),
        (pause.clone(), r#"{"group":null}"#, 400),
        (pause.clone(), r#"{"all":true}"#, 400),
        (pause.clone(), r#"{"group":"trailing "}"#, 400),
        (pause.clone(), "[]", 400),
        (pause.clone(), "not json", 400),
        ("/api/ops/queues/jobs%3B%20drop/pause".to_owned(), "{}", 400),
        (format!("/api/ops/queues/{hidden}/pause"), "{}", 404),
    ] {
        let (got, text) = served.operation(&path, token, body);
        assert_eq!(got, status, "POST {path} {body}: {text}");
    }
    assert!(db.paused_groups(&q).is_empty(), "a refused operation paused something");
    assert!(db.paused_groups(&hidden).is_empty(), "a queue not shown was paused");
    assert_eq!(served.pauses(&q), nothing);

    assert_eq!(served.operation(&pause, token, group), (200, r#"{"paused":true}"#.to_owned()));
    assert_eq!(served.operation(&pause, token, group), (200, r#"{"paused":false}"#.to_owned()), "twice");
    assert_eq!(db.paused_groups(&q), ["g\"x"]);
    assert_eq!(served.pauses(&q), json!({ "queue": false, "groups": ["g\"x"] }));
    assert_eq!(
        served.paused_metrics(&q),
        [
            format!(r#"rowbus_paused{{queue="{q}",group=""}} 0"#),
            format!(r#"rowbus_paused{{queue="{q}",group="g\"x"}} 1"#),
            format!(r#"rowbus_paused{{queue="{q}",group="gone"}} 0"#),
            format!(r#"rowbus_queue_paused{{queue="{q}"}} 0"#),
        ]
    );
    assert_eq!(served.operation(&resume, token, group), (200, r#"{"resumed":1}"#.to_owned()));
    assert!(db.paused_groups(&q).is_empty(), "the group's resume left it paused");
    assert_eq!(served.pauses(&q), nothing);

    assert_eq!(served.operation(&pause, token, "{}"), (200, r#"{"paused":true}"#.to_owned()));
    assert_eq!(db.paused_groups(&q), ["", "g\"x", "gone"], "the whole queue holds every group");
    assert_eq!(served.pauses(&q), json!({ "queue": true, "groups": [] }));
    assert!(served.paused_metrics(&q).iter().all(|l| l.ends_with(" 1")), "{:?}", served.paused_metrics(&q));
    assert_eq!(served.operation(&resume, token, "{}"), (200, r#"{"resumed":1}"#.to_owned()));
    assert!(db.paused_groups(&q).is_empty(), "the queue's resume left something paused");
    assert_eq!(served.operation(&resume, token, "{}"), (200, r#"{"resumed":0}"#.to_owned()), "twice");

    // A consumer in another process, listening: a publish while paused wakes it and it
    // takes nothing; only the dashboard's resume can bring the message before its poll.
    let cmd = db.rowbus(&["consume", &mail, "--json", "--listen-notify", "--poll-interval", "10m"]);
    let mut consumer = Running::spawn(cmd, EXIT_TIMEOUT);
    consumer.await_stderr("consuming", LINE_TIMEOUT, |l| l.starts_with("rowbus: consuming "));
    let mail_pause = format!("/api/ops/queues/{mail}/pause");
    assert_eq!(served.operation(&mail_pause, token, "{}"), (200, r#"{"paused":true}"#.to_owned()));
    db.ok(&["publish", &mail, "during"]);
    consumer.no_line(Duration::from_secs(2), "the queue is paused");
    let stats = db.ok(&["stats", "--json", &mail]);
    assert_eq!(db.paused_groups(&mail), [""], "the message held, paused: {stats}");
    let mail_resume = format!("/api/ops/queues/{mail}/resume");
    assert_eq!(served.operation(&mail_resume, token, "{}"), (200, r#"{"resumed":1}"#.to_owned()));
    let line: Value =
        serde_json::from_str(&consumer.next_line("the message published while paused")).unwrap();
    assert_eq!(line["payload"], "during", "{line}");
    let (status, rest, stderr) = consumer.stop("INT");
    assert!(status.success() && rest.is_empty(), "{status} {rest:?} {stderr:?}");
    served.stop();
}
on_each_database!(pause_operations);

/// Refusals before serving, each one `rowbus: error:` line: a queue table that does not
/// exist, a token too short to be safe, an address already in use.
#[test]
fn refusals() {
    let db = Db::new(Kind::Sqlite, "refusals", &["jobs"]);
    let q = db.fill();
    let line = assert_error(&run(db.rowbus(&["ui", "nosuch", "--listen", "127.0.0.1:0"])), "a missing table");
    assert!(line.contains("nosuch"), "{line}");
    let line = assert_error(&run(db.rowbus(&["ui", q, "--token", "short"])), "a short token");
    assert!(line.contains("at least 16"), "{line}");
    let served = Served::start(db.rowbus(&["ui", q, "--listen", "127.0.0.1:0"]));
    let taken = served.address.clone();
    let line = assert_error(&run(db.rowbus(&["ui", q, "--listen", &taken])), "an address in use");
    assert!(line.contains(&format!("cannot listen on {taken}")), "{line}");
}

/// The dashboard answers only requests naming a host it serves, so that a page elsewhere
/// cannot read it through a name of its own resolved to this machine (DNS rebinding):
/// every route, the page, the JSON, the dead letters, the metrics, the operations and
/// unknown paths, refuses a foreign `Host` (with or without a port), one with another
/// port, one smuggled behind userinfo or in an absolute request line, and a request
/// without one (HTTP/1.0 or 1.1), saying so in a short text; `localhost`, `127.0.0.1` and
/// `[::1]` (with the listening port or none, in any case) and the `--allow-host` names
/// pass. A malformed `--allow-host` is one error line.
#[test]
fn foreign_hosts_are_refused() {
    let db = Db::new(Kind::Sqlite, "hosts", &["jobs"]);
    let q = db.fill();
    let served = Served::start(db.rowbus(&[
        "ui",
        q,
        "--listen",
        "127.0.0.1:0",
        "--allow-host",
        "dash.example",
        "--allow-host",
        "proxy.example:8443",
    ]));
    let token = served.token.clone().expect("a token");
    let port = served.address.rsplit(':').next().unwrap().to_owned();
    let other_port = if port == "7474" { "7475" } else { "7474" };
    let dead = format!("/api/queues/{q}/dead");
    let requeue = format!("/api/ops/queues/{q}/dead/requeue");

    let foreign = [
        format!("attacker.example:{port}"),
        "attacker.example".to_owned(),
        format!("dash.example.attacker.example:{port}"),
        format!("localhost:{other_port}"),
        format!("127.0.0.1:{other_port}"),
        format!("dash.example:{other_port}"),
        "proxy.example".to_owned(),
        format!("proxy.example:{port}"),
        format!("localhost:{port}@attacker.example"),
        "".to_owned(),
    ];
    for host in &foreign {
        for path in ["/", "/api/queues", dead.as_str(), "/metrics", "/nosuch"] {
            let (status, body) = served.get_as(Some(host), path);
            assert_eq!(status, 403, "GET {path} with Host {host:?}: {body}");
            assert!(body.ends_with('\n') && body.lines().count() == 1, "GET {path}: {body:?}");
            assert!(!body.contains("doomed") && !body.contains(ERROR), "{body}");
        }
        let head = format!(
            "POST {requeue} HTTP/1.1\r\nHost: {host}\r\nx-rowbus-token: {token}\r\n\
             content-type: application/json\r\nContent-Length: 12\r\n"
        );
        let (status, _, body) = served.raw(&head, r#"{"all":true}"#);
        assert_eq!(status, 403, "POST {requeue} with Host {host:?}: {body}");
    }
    assert_eq!(served.dead(q).len(), 1, "a refused requeue moved the dead letter");
    // No Host at all: HTTP/1.0 and 1.1.
    for version in ["1.0", "1.1"] {
        let (status, _, body) = served.raw(&format!("GET {dead} HTTP/{version}\r\n"), "");
        assert_eq!(status, 403, "GET {dead} over HTTP/{version} without Host: {body}");
        assert!(!body.contains("doomed"), "{body}");
    }
    // The request line's authority is checked too, whatever the Host header says.
    let head = format!("GET http://attacker.example:{port}{dead} HTTP/1.1\r\nHost: {}\r\n", served.address);
    let (status, _, body) = served.raw(&head, "");
    assert_eq!(status, 403, "an absolute request line naming another host: {body}");

    let allowed = [
        format!("127.0.0.1:{port}"),
        "127.0.0.1".to_owned(),
        format!("localhost:{port}"),
        "localhost".to_owned(),
        format!("LocalHost:{port}"),
        format!("[::1]:{port}"),
        "[::1]".to_owned(),
        format!("dash.example:{port}"),
        "dash.example".to_owned(),
        "DASH.example".to_owned(),
        "proxy.example:8443".to_owned(),
    ];
    for host in &allowed {
        for path in ["/", "/api/queues", dead.as_str(), "/metrics"] {
            let (status, body) = served.get_as(Some(host), path);
            assert_eq!(status, 200, "GET {path} with Host {host:?}: {body}");
        }
        assert_eq!(served.get_as(Some(host), "/nosuch").0, 404, "Host {host:?}");
    }
    let (status, body) = served.operation(&requeue, Some(&token), r#"{"all":true}"#);
    assert_eq!((status, body.as_str()), (200, r#"{"requeued":1}"#), "an allowed host's operation");
    served.stop();

    for bad in ["", "two words", "a/b", "user@host", "host:port", "http://host"] {
        let line = assert_error(
            &run(db.rowbus(&["ui", q, "--listen", "127.0.0.1:0", "--allow-host", bad])),
            &format!("--allow-host {bad:?}"),
        );
        assert!(line.contains("--allow-host"), "{line}");
    }
}

/// On an IPv6 address, its literal in brackets is served; on every address of the
/// machine (0.0.0.0), the address a client reached (here loopback) is served as well as
/// the localhost names, a foreign name is not.
#[test]
fn hosts_of_the_listening_address() {
    let db = Db::new(Kind::Sqlite, "listenhosts", &["jobs"]);
    let q = db.fill();
    let served = Served::start(db.rowbus(&["ui", q, "--listen", "[::1]:0", "--read-only"]));
    let port = served.address.rsplit(':').next().unwrap().to_owned();
    assert_eq!(served.address, format!("[::1]:{port}"));
    for host in [format!("[::1]:{port}"), format!("[0:0:0:0:0:0:0:1]:{port}"), format!("localhost:{port}")] {
        assert_eq!(served.get_as(Some(&host), "/api/queues").0, 200, "Host {host}");
    }
    assert_eq!(served.get_as(Some(&format!("[::2]:{port}")), "/api/queues").0, 403);
    served.stop();

    let served = Served::start(db.rowbus(&["ui", q, "--listen", "0.0.0.0:0", "--read-only"]));
    let port = served.address.strip_prefix("0.0.0.0:").unwrap_or_else(|| panic!("{}", served.address));
    let get = |address: &str, host: &str| {
        exchange(address, &format!("GET /api/queues HTTP/1.1\r\nHost: {host}\r\n"), "").0
    };
    let loopback = format!("127.0.0.1:{port}");
    assert_eq!(get(&loopback, &loopback), 200);
    assert_eq!(get(&loopback, &format!("localhost:{port}")), 200);
    assert_eq!(get(&loopback, &served.address), 200, "the address printed");
    assert_eq!(get(&loopback, &format!("attacker.example:{port}")), 403);
    // (The address a client reached on another interface is served too: tests send
    // nothing beyond loopback, so that rule is checked by the unit tests of `ui::host`.)
    // Stopped when dropped: its stderr has the warning about serving beyond loopback.
    drop(served);
}

/// A path the dashboard does not serve is 404 by any method, with or without operations;
/// a path it serves, by a method it does not take, is 405.
#[test]
fn unknown_paths_are_not_found() {
    let db = Db::new(Kind::Sqlite, "paths", &["jobs"]);
    let q = db.fill();
    for args in
        [&["ui", q, "--listen", "127.0.0.1:0"][..], &["ui", q, "--listen", "127.0.0.1:0", "--read-only"]]
    {
        let served = Served::start(db.rowbus(args));
        let token = served.token.clone();
        let mut headers = vec![];
        headers.extend(token.as_deref().map(|t| ("x-rowbus-token", t)));
        for path in
            ["/nosuch", "/api", "/api/nosuch", "/api/queues/x/dead/more", "/metrics/more", "/index.html"]
        {
            for method in ["GET", "POST", "PUT"] {
                let (status, _, body) = served.request(method, path, &[]);
                assert_eq!(status, 404, "{method} {path} ({args:?}): {body}");
                let (status, _, body) = served.request(method, path, &headers);
                assert_eq!(status, 404, "{method} {path} with the token ({args:?}): {body}");
            }
        }
        for (method, path) in
            [("POST", "/"), ("POST", "/api/queues"), ("DELETE", "/metrics"), ("POST", "/api/queues/x/dead")]
        {
            assert_eq!(served.request(method, path, &[]).0, 405, "{method} {path} ({args:?})");
        }
        served.stop();
    }
}

/// Each table written in the page (the queues', the durable listeners') names each of its
/// columns once: no two headers alike (the buttons' column has none). The durable
/// listeners' headers say what their columns hold.
#[test]
fn page_tables_name_each_column() {
    let db = Db::new(Kind::Sqlite, "page", &["jobs"]);
    let q = db.fill();
    let served = Served::start(db.rowbus(&["ui", q, "--listen", "127.0.0.1:0"]));
    let page = served.get("/").1;
    let heads: Vec<&str> =
        page.split("<thead>").skip(1).map(|rest| &rest[..rest.find("</thead>").unwrap()]).collect();
    assert_eq!(heads.len(), 2, "the queues' and durable listeners' tables:\n{page}");
    let mut durable = None;
    for head in heads {
        let names: Vec<&str> = head
            .split("<th")
            .skip(1)
            .map(|th| &th[th.find('>').unwrap() + 1..th.find("</th>").unwrap()])
            .filter(|name| !name.is_empty())
            .collect();
        for (i, name) in names.iter().enumerate() {
            assert!(!names[..i].contains(name), "two {name:?} headers in {head}");
        }
        if names.first() == Some(&"Channel") {
            durable = Some(names);
        }
    }
    assert_eq!(
        durable.expect("the durable listeners' table"),
        ["Channel", "Name", "Rows behind", "Oldest unread", "Last check-in", "Name held"]
    );
    served.stop();
}

/// Chromium, from PATH; the test fails loudly without it.
fn chromium() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .flat_map(|dir| ["chromium", "chromium-browser"].map(|name| dir.join(name)))
        .find(|candidate| candidate.is_file())
        .expect("chromium is not installed: run scripts/services.sh, which installs Debian's `chromium`")
}

/// Runs headless Chromium on `url` with `args`; its stdout.
fn browse(url: &str, args: &[&str]) -> String {
    let mut cmd = Command::new(chromium());
    cmd.args(["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000"])
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap_or_else(|e| panic!("cannot start chromium: {e}"));
    let stdout = read_all(child.stdout.take().unwrap());
    let stderr = read_all(child.stderr.take().unwrap());
    let Some(status) = wait_timeout(&mut child, Duration::from_secs(60)) else {
        let _ = child.kill();
        let _ = child.wait();
        panic!("chromium {args:?} did not finish within 60 s");
    };
    let (stdout, stderr) = (text(&stdout.join().unwrap()), text(&stderr.join().unwrap()));
    assert!(status.success(), "chromium {args:?}: {status}\n{stderr}");
    stdout
}

/// The value of attribute `name` in the dumped DOM's tag `tag`, its entities undone.
fn attribute(tag: &str, name: &str) -> String {
    let start =
        tag.find(&format!(" {name}=\"")).unwrap_or_else(|| panic!("no {name} in {tag}")) + name.len() + 3;
    let value = &tag[start..start + tag[start..].find('"').unwrap()];
    value.replace("&quot;", "\"").replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
}

/// The operation and body (`data-op`, `data-body`) of the button labelled `label` in the
/// dumped DOM's row that starts with `row`: what a click on it sends.
fn button(dom: &str, row: &str, label: &str) -> (String, String) {
    let tr = &dom[dom.find(row).unwrap_or_else(|| panic!("no row {row} in\n{dom}"))..];
    let tr = &tr[..tr.find("</tr>").unwrap()];
    let tag = tr
        .split("<button ")
        .find(|tag| tag.contains(&format!(">{label}</button>")))
        .unwrap_or_else(|| panic!("no {label} button in the row: {tr}"));
    (attribute(tag, "data-op"), attribute(tag, "data-body"))
}

/// In a real browser, the page fetches the figures and renders them: the queue's row
/// with its depth, its groups, the dead letter's count, and the dead letter itself with
/// its error and its requeue button; queue `mail`, paused by the dashboard, PAUSED with a
/// button to resume it. Its screenshot is the one in docs/dashboard.png (see the module's
/// doc for how to renew it). The requests
/// the buttons send (their operation and body, as the page's `operation()` sends them)
/// put the dead letter back and resume `mail`: the page, loaded again, shows the dead
/// letter's group's depth up by one, no dead letter and nothing paused. A link opening
/// jobs' messages shows them, a payload's markup as text.
#[test]
fn browser_shows_the_queue() {
    let db = Db::new(Kind::Sqlite, "browser", &["jobs", "mail"]);
    db.fill();
    db.ok(&["publish", "mail", "hello"]);
    let served = Served::start(db.rowbus(&["ui", "--listen", "127.0.0.1:0"]));
    // A few of the server's samples, the queues moving in between, for the chart.
    for (n, queue) in [(2, "jobs"), (3, "mail"), (4, "mail")] {
        db.ok(&["publish", queue, "more"]);
        served.await_samples("jobs", n);
    }
    served.await_throughput("jobs");
    let id = served.dead("jobs")[0]["id"].as_i64().unwrap();
    let token = served.token.as_deref();
    let (status, answer) = served.operation("/api/ops/queues/mail/pause", token, "{}");
    assert_eq!((status, answer.as_str()), (200, r#"{"paused":true}"#));
    // A durable listener holding its name while the page is read.
    let mut listener = db
        .rowbus(&["listen", "events", "--durable", "watcher"])
        .stdout(Stdio::null())
        .spawn()
        .expect("rowbus listen runs");
    let deadline = Instant::now() + Duration::from_secs(20);
    let checked_in = || {
        let stats: Value = serde_json::from_str(&db.ok(&["stats", "--json"])).expect("stats --json");
        stats["durable_listeners"].as_array().is_some_and(|all| all.iter().any(|d| d["name"] == "watcher"))
    };
    while !checked_in() {
        assert!(Instant::now() < deadline, "the durable listener never checked in");
        std::thread::sleep(Duration::from_millis(50));
    }
    let url = format!("http://{}/#token={}", served.address, served.token.as_deref().unwrap());
    let dom = browse(&url, &["--dump-dom"]);
    let _ = listener.kill();
    let _ = listener.wait();
    let letter = format!(
        r#"<tr data-id="{id}"><td class="id">{id}</td><td class="group">gone</td><td class="attempts">5</td>"#
    );
    for (needle, what) in [
        (
            r#"<tr data-queue="jobs" data-group=""><td class="queue"></td><td class="group">-</td><td class="depth">5</td><td class="ready">4</td><td class="delayed">1</td>"#,
            "jobs' default group: depth 5, 4 ready, 1 delayed",
        ),
        (
            r#"<tr data-queue="jobs" data-group="gone"><td class="queue"></td><td class="group">gone</td><td class="depth">0</td>"#,
            "the group of the dead letter, empty",
        ),
        (r#"<td class="dead some">1</td>"#, "the dead letter's count"),
        (r#"<td class="group">g"x</td><td class="depth">1</td>"#, "group g\"x, depth 1"),
        (
            r#"<tr data-queue="mail" data-group=""><td class="queue"></td><td class="group">-</td><td class="depth">3</td>"#,
            "mail, depth 3",
        ),
        (
            r#"<tr class="queue-head" data-queue="mail" data-paused="true"><td colspan="9"><strong>mail</strong><span class="badge paused">PAUSED</span>"#,
            "mail paused as a whole",
        ),
        (
            r#"<td class="state" title="the whole queue is paused"><span class="badge paused">PAUSED</span></td>"#,
            "mail's group held by the queue's pause",
        ),
        (r#"<tr class="queue-head" data-queue="jobs" data-paused="false">"#, "jobs not paused"),
        (
            r#"<tr class="queue-head" data-queue="jobs" data-paused="false"><td colspan="9"><strong>jobs</strong>"#,
            "the queue named once, on its head row (its group rows leave the queue's cell empty)",
        ),
        (r#"<div class="chart" data-queue="jobs">"#, "jobs' chart"),
        (r#"class="published_per_min""#, "a published rate drawn"),
        ("operations on", "the token taken from the URL"),
        (r#"<section id="dead-section">"#, "the dead letters shown"),
        (&letter, "the dead letter's row: id, group, attempts"),
        (&format!(r#"<pre class="error">{ERROR}</pre>"#), "the dead letter's error"),
        (r#"<code>doomed</code>"#, "the dead letter's payload"),
        (
            r#"<tr data-channel="events" data-name="watcher"><td class="channel">events</td><td class="name">watcher</td><td class="lag-rows">0</td><td class="lag">up to date</td>"#,
            "the durable listener, up to date",
        ),
        (r#"<td class="state">held</td>"#, "its name held"),
        (r#"<span class="health muted" data-held="#, "each queue's health"),
        (" on disk ", "the queue's size"),
    ] {
        assert!(dom.contains(needle), "the rendered page lacks {what} ({needle}):\n{dom}");
    }
    let screenshot =
        Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("dashboard-{}.png", std::process::id()));
    // The last run's screenshot must not pass for this one's.
    let _ = std::fs::remove_file(&screenshot);
    browse(&url, &[&format!("--screenshot={}", screenshot.display()), "--window-size=1200,900"]);
    let png = std::fs::read(&screenshot)
        .unwrap_or_else(|e| panic!("no screenshot at {}: {e}", screenshot.display()));
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} is not a screenshot",
        screenshot.display()
    );
    if std::env::var_os("ROWBUS_UPDATE_SCREENSHOT").is_some_and(|v| v == "1") {
        let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/dashboard.png");
        std::fs::write(&docs, &png).unwrap_or_else(|e| panic!("{}: {e}", docs.display()));
    }
    let _ = std::fs::remove_file(&screenshot);

    // The dead letter's requeue button, as rendered: what a click sends.
    let (op, body) = button(&dom, &letter, "Requeue");
    assert_eq!(
        (op.as_str(), body.as_str()),
        ("queues/jobs/dead/requeue", format!(r#"{{"ids":[{id}]}}"#).as_str())
    );
    let (status, answer) = served.operation(&format!("/api/ops/{op}"), token, &body);
    assert_eq!((status, answer.as_str()), (200, r#"{"requeued":1}"#));
    // mail's resume button, as rendered.
    let (op, body) = button(&dom, r#"<tr class="queue-head" data-queue="mail""#, "Resume queue");
    assert_eq!((op.as_str(), body.as_str()), ("queues/mail/resume", "{}"));
    let (status, answer) = served.operation(&format!("/api/ops/{op}"), token, &body);
    assert_eq!((status, answer.as_str()), (200, r#"{"resumed":1}"#));

    let dom = browse(&url, &["--dump-dom"]);
    for (needle, what) in [
        (
            r#"<tr data-queue="jobs" data-group="gone"><td class="queue"></td><td class="group">gone</td><td class="depth">1</td><td class="ready">1</td>"#,
            "the requeued message in its group: depth 1, ready",
        ),
        (r#"<section id="dead-section" hidden="">"#, "no dead letter left to show"),
        (r#"<tr class="queue-head" data-queue="mail" data-paused="false">"#, "mail resumed"),
    ] {
        assert!(dom.contains(needle), "after the requeue, the page lacks {what} ({needle}):\n{dom}");
    }
    assert!(!dom.contains(&letter) && !dom.contains(ERROR), "the dead letter still shown:\n{dom}");
    assert!(!dom.contains(r#"<span class="badge paused">"#), "something still shown paused:\n{dom}");
    assert!(
        dom.contains(r#"<button type="button" class="view-messages" data-queue="jobs">Messages</button>"#),
        "no button opening jobs' messages:\n{dom}"
    );
    assert!(
        dom.contains("cancelled 0 · snoozed 0 · timed out 0 · lease lost 0"),
        "no events of jobs' consumers:\n{dom}"
    );

    // jobs' messages, opened by a link: each row as text, markup in a payload included.
    db.ok(&["publish", "jobs", "<img src=x onerror=alert(1)>"]);
    let dom = browse(&format!("{url}&messages=jobs"), &["--dump-dom"]);
    let row = |state: &str| format!(r#"data-state="{state}"><td class="id">"#);
    for (needle, what) in [
        (r#"<section id="messages-section">"#.to_owned(), "the messages shown"),
        (r#"<div class="messages-head" data-queue="jobs"><strong>jobs</strong>"#.to_owned(), "of jobs"),
        (row("queued"), "a queued message"),
        (row("delayed"), "the delayed message"),
        (r#"<td class="state delayed">delayed</td><td class="when">in "#.to_owned(), "when it is due"),
        ("<code>later</code>".to_owned(), "its payload"),
        (format!(r#"<pre class="error">{ERROR}</pre>"#), "the requeued message's last error"),
        // Escaped, with break opportunities after `=` (long payloads wrap there, not mid-word).
        ("<code>&lt;img src=<wbr>x onerror=<wbr>alert(1)&gt;</code>".to_owned(), "markup shown as text"),
        (r#"data-op="queues/jobs/cancel""#.to_owned(), "a Cancel button on its rows"),
    ] {
        assert!(dom.contains(&needle), "the messages view lacks {what} ({needle}):\n{dom}");
    }
    assert!(!dom.contains("<img"), "a payload's markup made an element:\n{dom}");
}
