//! End-to-end tests of `rowbus workflow list|show|cancel|emit`: real processes against real
//! PostgreSQL, MariaDB and SQLite. The workflows are started and run by the library in the
//! test process (as an application would), read and acted on by the command.
//!
//! The servers must be up (`scripts/services.sh` starts them); a test fails, never skips,
//! when one is unreachable. Every test uses its own tables, dropped at the end.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::{Database, Kind, assert_error, on_each_database, rowbus, run, run_quietly, unique};
use rowbus::workflow::{Context, Status, WorkflowError, Workflows};
use rowbus::{Broker, BrokerOptions, Db, DbPool, OnPool};
use serde_json::Value;

/// The longest a workflow takes to reach its wait, or its end.
const WITHIN: Duration = Duration::from_secs(20);

/// One test's database and queue, its tables (the queue's and the workflow tables) dropped
/// at the end.
struct Setup {
    database: Database,
    queue: String,
}

impl Setup {
    fn new(kind: Kind) -> Setup {
        let queue = unique("wfcli");
        Setup { database: Database::new(kind, &queue), queue }
    }

    /// `rowbus --database-url URL ARGS...`
    fn rowbus(&self, args: &[&str]) -> Command {
        let mut cmd = rowbus();
        cmd.args(["--database-url", &self.database.url]).args(args);
        cmd
    }

    /// Runs a command that must succeed without a word on stderr; its stdout.
    fn ok(&self, args: &[&str]) -> String {
        run_quietly(self.rowbus(args), None, self.database.server())
    }

    /// `rowbus workflow ARGS... --json`, each line parsed.
    fn json(&self, args: &[&str]) -> Vec<Value> {
        let mut all = vec!["workflow"];
        all.extend(args);
        all.push("--json");
        self.ok(&all)
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
            .collect()
    }

    /// Runs `job` on the database with the library, in a runtime of its own.
    fn library(&self, job: Job) -> Vec<String> {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let db = DbPool::connect_with_size(&self.database.url, 4).await.unwrap();
            let done = db.run(job).await;
            db.close().await;
            done
        })
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        for suffix in ["_wfe", "_wfs", "_wf"] {
            self.database.cleanup.table(&format!("{}{suffix}", self.queue));
        }
        self.database.cleanup.queue(&self.queue);
    }
}

/// What the test process does with the library.
enum Job {
    /// Deploys the workflow tables, starts two `order` workflows and runs them until both
    /// wait for `go`: their ids.
    StartTwo(String),
    /// Runs the queue's workflows until `id` ended: its result.
    RunToEnd(String, String),
}

/// The workflows of `queue` on `broker`: `order`, a step `reserve`, a wait for `go`, a
/// step `ship` returning the event's payload.
fn orders<DB: Db>(broker: &Broker<DB>, queue: &str) -> Workflows<DB> {
    let workflows = Workflows::new(broker.queue(queue).unwrap());
    workflows.register("order", |ctx: Context<DB>, n: u32| async move {
        let _: u32 = ctx.step("reserve", || async move { Ok::<_, std::io::Error>(n) }).await?;
        let go: Option<String> = ctx.wait_for_event("go", None).await?;
        let shipped = ctx.step("ship", || async { Ok::<_, std::io::Error>(go.clone()) }).await?;
        Ok::<_, WorkflowError>(shipped.unwrap_or_default())
    });
    workflows
}

/// Runs `workflows` in the background until the broker shuts down.
fn runner<DB: Db>(workflows: &Workflows<DB>) {
    let (workflows, queue) = (workflows.clone(), workflows.queue().clone());
    tokio::spawn(async move { workflows.run(queue.subscribe().workers(2)).await });
}

impl OnPool for Job {
    type Output = Vec<String>;

    async fn run<DB: Db>(self, pool: rowbus::sqlx::Pool<DB>) -> Vec<String> {
        let options = BrokerOptions { poll_interval: Duration::from_millis(50), ..BrokerOptions::default() };
        let broker = Broker::new(pool, options).await.unwrap();
        let out = match self {
            Job::StartTwo(queue) => {
                let workflows = orders(&broker, &queue);
                workflows.deploy().await.unwrap();
                let ids = vec![
                    workflows.start("order", &1u32).await.unwrap(),
                    workflows.start("order", &2u32).await.unwrap(),
                ];
                runner(&workflows);
                let began = Instant::now();
                for id in &ids {
                    while workflows.steps(id).await.unwrap().len() < 2 {
                        assert!(began.elapsed() < WITHIN, "workflow {id} did not reach its wait");
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
                ids
            }
            Job::RunToEnd(queue, id) => {
                let workflows = orders(&broker, &queue);
                runner(&workflows);
                let result = tokio::time::timeout(WITHIN, workflows.result::<String>(&id)).await;
                vec![result.expect("the workflow ends in time").unwrap()]
            }
        };
        broker.shutdown(Duration::from_secs(5)).await;
        out
    }
}

/// Two workflows waiting for `go`: `list` shows both running, `show` their recorded step
/// (state, attempts, output size) and the wait (its event, no deadline); `emit` sends one
/// its event and `cancel` ends the other; once run, `list --status` finds each where it
/// ended and `show` the event's step done. A missing workflow or queue is an error, a
/// second cancel says nothing was running, a wrong `--status` is clap's.
fn list_show_emit_cancel(kind: Kind) {
    let db = Setup::new(kind);
    let q = db.queue.clone();
    db.ok(&["deploy", "--queue", &q]);
    let ids = db.library(Job::StartTwo(q.clone()));
    let (first, second) = (&ids[0], &ids[1]);

    let listed = db.json(&["list", &q]);
    assert_eq!(listed.len(), 2, "{listed:?}");
    assert!(listed.iter().all(|w| w["status"] == "running" && w["name"] == "order"), "{listed:?}");
    let text = db.ok(&["workflow", "list", &q]);
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(text.contains(first.as_str()) && text.contains("running"), "{text}");

    let shown = &db.json(&["show", &q, first])[0];
    assert_eq!((shown["id"].as_str(), shown["input"].clone()), (Some(first.as_str()), Value::from(1)));
    let steps = shown["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2, "{shown}");
    assert_eq!(
        (steps[0]["name"].as_str(), steps[0]["state"].as_str(), steps[0]["attempts"].as_u64()),
        (Some("reserve"), Some("done"), Some(1))
    );
    assert_eq!((steps[0]["output"].clone(), steps[0]["output_bytes"].as_u64()), (Value::from(1), Some(1)));
    assert_eq!(
        (steps[1]["state"].as_str(), steps[1]["event"].as_str(), steps[1]["deadline"].clone()),
        (Some("wait"), Some("go"), Value::Null)
    );
    let text = db.ok(&["workflow", "show", &q, first]);
    assert!(text.contains("\"reserve\" done") && text.contains("for event \"go\"  deadline none"), "{text}");

    let said = db.ok(&["workflow", "emit", &q, first, "go", "parcel"]);
    assert!(said.contains(&format!("emitted `go` to workflow `{first}`")), "{said}");
    let said = db.ok(&["workflow", "cancel", &q, second]);
    assert!(said.contains(&format!("cancelled workflow `{second}`")), "{said}");
    let said = db.ok(&["workflow", "cancel", &q, second]);
    assert!(said.contains("had ended (cancelled): nothing cancelled"), "{said}");

    let result = db.library(Job::RunToEnd(q.clone(), first.clone()));
    assert_eq!(result, ["parcel"]);
    let ended = |status: &str| -> Vec<String> {
        db.json(&["list", &q, "--status", status])
            .iter()
            .map(|w| w["id"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(ended("succeeded"), [first.as_str()]);
    assert_eq!(ended("cancelled"), [second.as_str()]);
    assert!(ended("running").is_empty());
    // `stats` counts them by status.
    let stats = db.ok(&["stats", &q]);
    assert!(
        stats.contains(&format!("workflows of `{q}`: running 0, succeeded 1, failed 0, cancelled 1")),
        "{stats}"
    );
    let json: Value = serde_json::from_str(&db.ok(&["stats", "--json", &q])).unwrap();
    assert_eq!(
        json["counts"][q.as_str()]["workflows"],
        serde_json::json!({"running": 0, "succeeded": 1, "failed": 0, "cancelled": 1}),
        "{json}"
    );
    let shown = &db.json(&["show", &q, first])[0];
    assert_eq!((shown["status"].as_str(), shown["output"].as_str()), (Some("succeeded"), Some("parcel")));
    let steps = shown["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 3, "{shown}");
    assert_eq!((steps[1]["state"].as_str(), steps[1]["output"].as_str()), (Some("done"), Some("parcel")));
    assert_eq!(Status::parse(shown["status"].as_str().unwrap()), Some(Status::Succeeded));

    for args in [["show", &q, "nope"], ["cancel", &q, "nope"]] {
        let mut all = vec!["workflow"];
        all.extend(args);
        let line = assert_error(&run(db.rowbus(&all)), "a missing workflow");
        assert!(line.contains(&format!("no workflow `nope` in `{q}`")), "{line}");
    }
    let line = assert_error(&run(db.rowbus(&["workflow", "emit", &q, "nope", "go"])), "a missing workflow");
    assert!(line.contains("no workflow `nope`"), "{line}");
    let missing = unique("wfcli_missing");
    let line = assert_error(&run(db.rowbus(&["workflow", "list", &missing])), "a missing queue");
    assert!(line.contains("does not exist"), "{line}");
    let output = run(db.rowbus(&["workflow", "list", &q, "--status", "done"]));
    assert_eq!(output.status.code(), Some(2), "{}", common::show(&output));
}
on_each_database!(list_show_emit_cancel);
