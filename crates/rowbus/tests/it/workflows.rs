//! Durable workflows against the real PostgreSQL and MariaDB and a temporary SQLite file:
//! steps that run once across crashed runs (side effects counted), a step's retries and
//! its recorded failure, a transactional step's write made once, idempotent starts and a
//! start rolled back with its transaction, a result read by another broker, a sleep that
//! outlives its broker, events emitted before, after and twice, a wait's timeout, and the
//! determinism error of code changed under a running workflow. One harness for all:
//! [`Setup`], a broker, a queue and its deployed workflows, dropped at the end.

use crate::common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Brokers, Cleanup, Place, on_each_database, unique};
use rowbus::workflow::{Context, Start, Status, StepState, WorkflowError, Workflows};
use rowbus::{Broker, BrokerOptions, Db, Queue, RetryPolicy};
use sqlx::{Encode, Executor, IntoArguments, Type};

use common::place_test as database_test;

/// The longest a workflow that should end may take to.
const ENDS: Duration = Duration::from_secs(30);

/// Quick polls and retries: a crashed run comes back within tens of milliseconds.
fn options() -> BrokerOptions {
    BrokerOptions {
        poll_interval: Duration::from_millis(50),
        retry: RetryPolicy { max_attempts: 10, base: Duration::from_millis(10), ..RetryPolicy::default() },
        ..BrokerOptions::default()
    }
}

/// A broker, a queue of the test's own and its workflows, deployed; what they made is
/// dropped at the end (or by the guard, should the test fail).
struct Setup<DB: Db> {
    broker: Broker<DB>,
    queue: Queue<DB>,
    workflows: Workflows<DB>,
    cleanup: Cleanup,
    name: String,
}

impl<DB: Brokers> Setup<DB> {
    async fn new(place: &Place, prefix: &str) -> Self {
        Self::with(place, prefix, options()).await
    }

    async fn with(place: &Place, prefix: &str, options: BrokerOptions) -> Self {
        let broker = DB::broker(place, options).await;
        let cleanup = Cleanup::new(DB::BACKEND);
        let name = cleanup.queue(&unique(prefix));
        for suffix in ["_wf", "_wfs", "_wfe"] {
            cleanup.table(&format!("{name}{suffix}"));
        }
        let queue = broker.queue(&name).unwrap();
        queue.deploy().await.unwrap();
        let workflows = Workflows::new(queue.clone());
        workflows.deploy().await.unwrap();
        Setup { broker, queue, workflows, cleanup, name }
    }

    /// The same queue's workflows through another broker on the same database (another
    /// process, as far as the database can tell).
    async fn other(&self, place: &Place) -> (Broker<DB>, Workflows<DB>) {
        let broker = DB::broker(place, options()).await;
        let workflows = Workflows::new(broker.queue(&self.name).unwrap());
        (broker, workflows)
    }

    /// Runs `workflows`' runner with four workers in the background.
    fn run(&self, workflows: &Workflows<DB>) -> tokio::task::JoinHandle<()> {
        let (workflows, queue) = (workflows.clone(), workflows.queue().clone());
        tokio::spawn(async move {
            workflows
                .run(queue.subscribe().workers(4).poll_interval(Duration::from_millis(50)))
                .await
                .unwrap();
        })
    }

    async fn result<O: serde::de::DeserializeOwned>(&self, id: &str) -> Result<O, WorkflowError> {
        tokio::time::timeout(ENDS, self.workflows.result(id)).await.expect("the workflow ends in time")
    }

    /// The ids of the children of workflow `parent`, of `status` (`None`: any).
    async fn children(&self, parent: &str, status: Option<Status>) -> Vec<String> {
        let all = self.workflows.list(status, 1000).await.unwrap();
        all.into_iter().filter(|w| w.parent.as_deref() == Some(parent)).map(|w| w.id).collect()
    }

    async fn finish(self) {
        self.broker.shutdown(Duration::from_secs(5)).await;
        self.workflows.drop_tables().await.unwrap();
        self.queue.undeploy().await.unwrap();
        drop(self.cleanup);
    }
}

/// How often each side effect ran, by name.
#[derive(Clone, Default)]
struct Effects(Arc<Mutex<HashMap<String, u32>>>);

impl Effects {
    fn count(&self, what: &str) {
        *self.0.lock().unwrap().entry(what.to_owned()).or_default() += 1;
    }

    fn of(&self, what: &str) -> u32 {
        self.0.lock().unwrap().get(what).copied().unwrap_or(0)
    }
}

/// Crashes (panics) a run once per workflow and place: the first time `at` is reached.
#[derive(Clone, Default)]
struct Crashes(Arc<Mutex<HashSet<String>>>);

impl Crashes {
    fn once(&self, id: &str, at: &str) {
        if self.0.lock().unwrap().insert(format!("{id}:{at}")) {
            panic!("a simulated crash of workflow {id} at {at}");
        }
    }
}

/// Workflows of three steps, each counting its side effect; input `k` (0 to 2) crashes
/// the first run right after step `k` was recorded, and input 9 crashes inside step 1,
/// after its side effect and before its result is recorded. After the crashed run, the
/// workflow runs again: every recorded step returns its result without running (each
/// side effect once), the step that crashed unrecorded runs again (its side effect
/// twice), and each ends with the outputs of all three.
async fn steps_run_once_across_crashed_runs<DB: Brokers>(place: Place) {
    let setup = Setup::<DB>::new(&place, "wfonce").await;
    let (effects, crashes) = (Effects::default(), Crashes::default());
    let (e, c) = (effects.clone(), crashes.clone());
    setup.workflows.register("three", move |ctx: Context<DB>, k: u32| {
        let (effects, crashes) = (e.clone(), c.clone());
        async move {
            let id = ctx.workflow_id().to_owned();
            let mut outputs = Vec::new();
            for step in 0..3u32 {
                let (e, c, i) = (effects.clone(), crashes.clone(), id.clone());
                let name = format!("s{step}");
                let out: u32 = ctx
                    .step(&name, move || {
                        let (effects, crashes, id) = (e.clone(), c.clone(), i.clone());
                        async move {
                            effects.count(&format!("{id}:s{step}"));
                            if k == 9 && step == 1 {
                                crashes.once(&id, "inside s1");
                            }
                            Ok::<_, std::io::Error>(step * 10)
                        }
                    })
                    .await?;
                outputs.push(out);
                if k == step {
                    crashes.once(&id, &name);
                }
            }
            Ok::<_, WorkflowError>(outputs)
        }
    });
    let mut ids = Vec::new();
    for k in [0u32, 1, 2, 9] {
        ids.push((k, setup.workflows.start("three", &k).await.unwrap()));
    }
    let runner = setup.run(&setup.workflows);
    for (k, id) in &ids {
        let outputs: Vec<u32> = setup.result(id).await.unwrap();
        assert_eq!(outputs, [0, 10, 20], "workflow {k}");
        for step in 0..3 {
            let ran = effects.of(&format!("{id}:s{step}"));
            let expected = if *k == 9 && step == 1 { 2 } else { 1 };
            assert_eq!(ran, expected, "workflow {k}, step {step} ran {ran} times");
        }
        let steps = setup.workflows.steps(id).await.unwrap();
        let recorded: Vec<(u32, &str, StepState)> =
            steps.iter().map(|s| (s.seq, s.name.as_str(), s.state)).collect();
        assert_eq!(
            recorded,
            [(0, "s0", StepState::Done), (1, "s1", StepState::Done), (2, "s2", StepState::Done)]
        );
        let info = setup.workflows.get(id).await.unwrap().unwrap();
        assert_eq!(
            (info.status, info.name.as_str(), info.output.as_deref()),
            (Status::Succeeded, "three", Some("[0,10,20]"))
        );
    }
    assert_eq!(crashes.0.lock().unwrap().len(), 4, "each workflow crashed once");
    runner.abort();
    setup.finish().await;
}
on_each_database!(steps_run_once_across_crashed_runs);

/// A workflow whose every run crashes is run again until its message's last attempt,
/// which ends it failed with the crash's message (not left running, its message
/// dead-lettered).
async fn a_workflow_whose_last_run_crashes_ends_failed<DB: Brokers>(place: Place) {
    let retry = RetryPolicy { max_attempts: 2, base: Duration::from_millis(10), ..RetryPolicy::default() };
    let setup = Setup::<DB>::with(&place, "wfdoom", BrokerOptions { retry, ..options() }).await;
    let effects = Effects::default();
    let e = effects.clone();
    setup.workflows.register("doomed", move |_ctx: Context<DB>, (): ()| {
        let effects = e.clone();
        async move {
            effects.count("run");
            if effects.of("run") < 100 {
                panic!("a simulated crash, every run");
            }
            Ok::<_, WorkflowError>(())
        }
    });
    let id = setup.workflows.start("doomed", &()).await.unwrap();
    let runner = setup.run(&setup.workflows);
    let error = setup.result::<()>(&id).await.unwrap_err().to_string();
    assert!(error.contains("its last run panicked: a simulated crash, every run"), "{error}");
    assert_eq!(effects.of("run"), 2, "one run per attempt");
    let ended = Instant::now();
    while setup.queue.depth("").await.unwrap() != (0, 0) {
        assert!(ended.elapsed() < ENDS, "acknowledged, not dead-lettered: {:?}", setup.queue.depth("").await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    runner.abort();
    setup.finish().await;
}
on_each_database!(a_workflow_whose_last_run_crashes_ends_failed);

/// A step with retries fails twice and succeeds at its third attempt, recorded with its
/// attempts; a step that fails every attempt is recorded as failed and returned as
/// [`WorkflowError::Step`], which the workflow handles; a crash after it replays the
/// failure without running the step again.
async fn a_step_retries_and_its_failure_is_recorded<DB: Brokers>(place: Place) {
    let setup = Setup::<DB>::new(&place, "wfretry").await;
    let (effects, crashes) = (Effects::default(), Crashes::default());
    let (e, c) = (effects.clone(), crashes.clone());
    setup.workflows.register("retrying", move |ctx: Context<DB>, (): ()| {
        let (effects, crashes) = (e.clone(), c.clone());
        async move {
            let policy =
                RetryPolicy { max_attempts: 3, base: Duration::from_millis(1), ..RetryPolicy::default() };
            let flaky = effects.clone();
            let got: String = ctx
                .step_with("flaky", &policy, move || {
                    let effects = flaky.clone();
                    async move {
                        effects.count("flaky");
                        match effects.of("flaky") {
                            3 => Ok("third time".to_owned()),
                            n => Err(format!("attempt {n} fails")),
                        }
                    }
                })
                .await?;
            let broken = effects.clone();
            let failed = ctx
                .step_with("broken", &RetryPolicy { max_attempts: 2, ..policy }, move || {
                    let effects = broken.clone();
                    async move {
                        effects.count("broken");
                        Err::<u32, _>("always")
                    }
                })
                .await;
            crashes.once(ctx.workflow_id(), "after broken");
            match failed {
                Err(WorkflowError::Step { name, seq, error }) => Ok(format!("{got}; {name} #{seq}: {error}")),
                other => Err(WorkflowError::failed(format!("expected a step error, got {other:?}"))),
            }
        }
    });
    let id = setup.workflows.start("retrying", &()).await.unwrap();
    let runner = setup.run(&setup.workflows);
    let output: String = setup.result(&id).await.unwrap();
    assert_eq!(output, "third time; broken #1: always");
    assert_eq!((effects.of("flaky"), effects.of("broken")), (3, 2), "no attempt ran again on the replay");
    let steps = setup.workflows.steps(&id).await.unwrap();
    let seen: Vec<(StepState, u32, Option<&str>)> =
        steps.iter().map(|s| (s.state, s.attempts, s.error.as_deref())).collect();
    assert_eq!(seen, [(StepState::Done, 3, None), (StepState::Failed, 2, Some("always"))]);
    runner.abort();
    setup.finish().await;
}
on_each_database!(a_step_retries_and_its_failure_is_recorded);

/// A transactional step writes a row in the transaction that records it; the run crashes
/// right after, and the replay does not write it again: one row. A transactional step
/// that fails after its write leaves no row, and its error is the workflow's to handle.
async fn a_transaction_step_writes_once<DB: Brokers>(place: Place)
where
    DB::Arguments: IntoArguments<DB>,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> i64: Encode<'q, DB> + Type<DB>,
{
    let setup = Setup::<DB>::new(&place, "wftx").await;
    let effects = setup.cleanup.table(&format!("{}_fx", setup.name));
    place.exec(format!("CREATE TABLE {effects} (n BIGINT NOT NULL)")).await;
    let insert = match DB::BACKEND {
        rowbus::Backend::Postgres => format!("INSERT INTO {effects} (n) VALUES ($1)"),
        _ => format!("INSERT INTO {effects} (n) VALUES (?)"),
    };
    let crashes = Crashes::default();
    let c = crashes.clone();
    setup.workflows.register("pay", move |ctx: Context<DB>, n: i64| {
        let (crashes, insert) = (c.clone(), insert.clone());
        async move {
            let write = insert.clone();
            let written: i64 = ctx
                .transaction_step("write", move |conn| {
                    Box::pin(async move {
                        sqlx::query(sqlx::AssertSqlSafe(write)).bind(n).execute(&mut *conn).await?;
                        Ok::<_, sqlx::Error>(n)
                    })
                })
                .await?;
            crashes.once(ctx.workflow_id(), "after write");
            let refused = ctx
                .transaction_step("refused", move |conn| {
                    Box::pin(async move {
                        sqlx::query(sqlx::AssertSqlSafe(insert))
                            .bind(-n)
                            .execute(&mut *conn)
                            .await
                            .map_err(|e| e.to_string())?;
                        Err::<i64, _>("refused after its write".to_owned())
                    })
                })
                .await;
            Ok::<_, WorkflowError>((written, refused.is_err()))
        }
    });
    let id = setup.workflows.start("pay", &7i64).await.unwrap();
    let runner = setup.run(&setup.workflows);
    let output: (i64, bool) = setup.result(&id).await.unwrap();
    assert_eq!(output, (7, true));
    assert_eq!(
        place.ints(format!("SELECT n FROM {effects} ORDER BY n")).await,
        [7],
        "written once, the refused write undone"
    );
    runner.abort();
    setup.finish().await;
}
on_each_database!(a_transaction_step_writes_once);

/// A start with an idempotency key returns the first start's id on a second start, and on
/// two racing ones; a start inside a transaction that rolls back leaves no workflow and no
/// message; one inside a transaction that commits runs.
async fn starts_are_idempotent_and_go_with_their_transaction<DB: Brokers>(place: Place) {
    let setup = Setup::<DB>::new(&place, "wfstart").await;
    setup
        .workflows
        .register("echo", |_ctx: Context<DB>, text: String| async move { Ok::<_, WorkflowError>(text) });
    let keyed = Start::default().idempotency_key("order-1");
    let first = setup.workflows.start_with("echo", &"one", &keyed).await.unwrap();
    let again = setup.workflows.start_with("echo", &"two", &keyed).await.unwrap();
    assert_eq!(first, again, "a second start with the key returns the first's id");
    let raced = Start::default().idempotency_key("order-2");
    let (a, b) = tokio::join!(
        setup.workflows.start_with("echo", &"a", &raced),
        setup.workflows.start_with("echo", &"b", &raced)
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a, b, "racing starts with one key start one workflow");

    let mut tx = setup.broker.begin().await.unwrap();
    let rolled_back = setup.workflows.start_in(&mut tx, "echo", &"never", &Start::default()).await.unwrap();
    tx.rollback().await.unwrap();
    assert!(setup.workflows.get(&rolled_back).await.unwrap().is_none(), "rolled back with its transaction");
    let mut tx = setup.broker.begin().await.unwrap();
    let committed = setup.workflows.start_in(&mut tx, "echo", &"kept", &Start::default()).await.unwrap();
    tx.commit().await.unwrap();

    let all = setup.workflows.list(None, 100).await.unwrap();
    assert_eq!(all.len(), 3, "two keyed workflows and the committed one: {all:#?}");
    assert_eq!(setup.queue.depth("").await.unwrap(), (3, 0), "one message each");
    let runner = setup.run(&setup.workflows);
    assert_eq!(setup.result::<String>(&first).await.unwrap(), "one");
    assert_eq!(setup.result::<String>(&committed).await.unwrap(), "kept");
    assert!(["a", "b"].contains(&setup.result::<String>(&a).await.unwrap().as_str()));
    assert!(matches!(setup.workflows.result::<String>(&rolled_back).await, Err(WorkflowError::NotFound(_))));
    assert_eq!(setup.workflows.list(Some(Status::Succeeded), 100).await.unwrap().len(), 3);
    runner.abort();
    setup.finish().await;
}
on_each_database!(starts_are_idempotent_and_go_with_their_transaction);

/// A workflow sleeps between two steps; its first broker runs it to the sleep and shuts
/// down; a new broker (a restarted process) runs it on after the sleep's time, the steps
/// before it not again; the result is read through a third broker that runs nothing.
async fn a_sleep_outlives_its_broker_and_the_result_is_read_elsewhere<DB: Brokers>(place: Place) {
    const SLEEP: Duration = Duration::from_millis(1500);
    let setup = Setup::<DB>::new(&place, "wfsleep").await;
    let effects = Effects::default();
    let register = |workflows: &Workflows<DB>| {
        let e = effects.clone();
        workflows.register("nap", move |ctx: Context<DB>, (): ()| {
            let effects = e.clone();
            async move {
                let before = effects.clone();
                let started: u64 = ctx
                    .step("before", move || {
                        let effects = before.clone();
                        async move {
                            effects.count("before");
                            Ok::<_, std::io::Error>(now_ms())
                        }
                    })
                    .await?;
                ctx.sleep(SLEEP).await?;
                let after = effects.clone();
                let woke: u64 = ctx
                    .step("after", move || {
                        let effects = after.clone();
                        async move {
                            effects.count("after");
                            Ok::<_, std::io::Error>(now_ms())
                        }
                    })
                    .await?;
                Ok::<_, WorkflowError>(woke - started)
            }
        });
    };
    let (first, first_workflows) = setup.other(&place).await;
    register(&first_workflows);
    let id = setup.workflows.start("nap", &()).await.unwrap();
    let runner = setup.run(&first_workflows);
    let asleep = Instant::now();
    while effects.of("before") == 0 {
        assert!(asleep.elapsed() < ENDS, "the first step did not run");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.shutdown(Duration::from_secs(5)).await;
    runner.abort();
    let g = &setup.queue.group_stats().await.unwrap()[0];
    assert_eq!((g.depth, g.in_flight), (1, 0), "put off, holding no worker: {g:?}");
    assert_eq!(setup.workflows.steps(&id).await.unwrap()[1].state, StepState::Sleep);

    let (second, second_workflows) = setup.other(&place).await;
    register(&second_workflows);
    let runner = setup.run(&second_workflows);
    let slept: u64 = setup.result(&id).await.unwrap();
    assert!(slept >= SLEEP.as_millis() as u64 - 50, "woke after {slept} ms, before its time");
    assert_eq!((effects.of("before"), effects.of("after")), (1, 1));
    second.shutdown(Duration::from_secs(5)).await;
    runner.abort();
    setup.finish().await;
}
on_each_database!(a_sleep_outlives_its_broker_and_the_result_is_read_elsewhere);

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Waits for event `go` twice (the second with a short timeout), then for `never` with a
/// short timeout. Emitted before the first wait, the event is kept for it; emitted while
/// the workflow waits, it runs it on at once (well within the 60 s recheck); emitted once,
/// it is delivered to one wait only (the second times out); emitted twice, to both, in
/// order; `never` times out.
async fn events_are_delivered_once_whenever_emitted<DB: Brokers>(place: Place) {
    let setup = Setup::<DB>::new(&place, "wfevent").await;
    setup.workflows.register("listen", |ctx: Context<DB>, (): ()| async move {
        let first: Option<String> = ctx.wait_for_event("go", None).await?;
        let second: Option<String> = ctx.wait_for_event("go", Some(Duration::from_millis(800))).await?;
        let never: Option<String> = ctx.wait_for_event("never", Some(Duration::from_millis(300))).await?;
        Ok::<_, WorkflowError>((first, second, never))
    });
    let w = &setup.workflows;
    let once_before = w.start("listen", &()).await.unwrap();
    w.emit_event(&once_before, "go", &"early").await.unwrap();
    let twice_before = w.start("listen", &()).await.unwrap();
    w.emit_event(&twice_before, "go", &"1").await.unwrap();
    w.emit_event(&twice_before, "go", &"2").await.unwrap();
    let after = w.start("listen", &()).await.unwrap();
    let runner = setup.run(w);
    // Until it waits: its first wait recorded.
    let waiting = Instant::now();
    while w.steps(&after).await.unwrap().is_empty() {
        assert!(waiting.elapsed() < ENDS, "the workflow never waited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let emitted = Instant::now();
    w.emit_event(&after, "go", &"late").await.unwrap();

    type Got = (Option<String>, Option<String>, Option<String>);
    let got: Got = setup.result(&after).await.unwrap();
    assert_eq!(got, (Some("late".into()), None, None));
    assert!(emitted.elapsed() < Duration::from_secs(10), "woken by the emit: {:?}", emitted.elapsed());
    let got: Got = setup.result(&once_before).await.unwrap();
    assert_eq!(got, (Some("early".into()), None, None), "one event, one delivery");
    let got: Got = setup.result(&twice_before).await.unwrap();
    assert_eq!(got, (Some("1".into()), Some("2".into()), None), "two events, one delivery each");
    let states: Vec<StepState> = w.steps(&once_before).await.unwrap().iter().map(|s| s.state).collect();
    assert_eq!(states, [StepState::Done, StepState::TimedOut, StepState::TimedOut]);
    assert!(matches!(w.emit_event("no-such-workflow", "go", &1).await, Err(WorkflowError::NotFound(_))));
    runner.abort();
    setup.finish().await;
}
on_each_database!(events_are_delivered_once_whenever_emitted);

/// A workflow records step `charge` and waits; the code changes under it (its first step
/// now `refund`); the run the event brings fails the workflow with the determinism error,
/// which names the workflow, the position and both names. A workflow started under
/// version `v1` is refused by a process that registered `v2`, and runs once `v1` is back.
async fn code_changed_under_a_workflow_fails_it_clearly<DB: Brokers>(place: Place) {
    let setup = Setup::<DB>::new(&place, "wfdet").await;
    let w = &setup.workflows;
    w.register("evolving", |ctx: Context<DB>, (): ()| async move {
        ctx.step("charge", || async { Ok::<_, std::io::Error>(1) }).await?;
        ctx.wait_for_event::<()>("go", None).await?;
        Ok::<_, WorkflowError>(())
    });
    let id = w.start("evolving", &()).await.unwrap();
    let runner = setup.run(w);
    let waiting = Instant::now();
    // Until its run stopped at the wait: recorded, and the message put off.
    while w.steps(&id).await.unwrap().len() < 2 || setup.queue.group_stats().await.unwrap()[0].in_flight > 0 {
        assert!(waiting.elapsed() < ENDS, "the workflow never waited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    w.register("evolving", |ctx: Context<DB>, (): ()| async move {
        ctx.step("refund", || async { Ok::<_, std::io::Error>(1) }).await?;
        Ok::<_, WorkflowError>(())
    });
    w.emit_event(&id, "go", &()).await.unwrap();
    let error = setup.result::<()>(&id).await.unwrap_err().to_string();
    for part in [id.as_str(), "#0", "`charge`", "`refund`", "not deterministic"] {
        assert!(error.contains(part), "{part} is not in: {error}");
    }

    w.register_version(
        "versioned",
        "v1",
        |_ctx: Context<DB>, (): ()| async move { Ok::<_, WorkflowError>(1) },
    );
    let id = w.start("versioned", &()).await.unwrap();
    assert_eq!(w.get(&id).await.unwrap().unwrap().version, "v1");
    runner.abort();
    // Only a process of another version runs: the workflow is refused (put off), not run.
    w.register_version(
        "versioned",
        "v2",
        |_ctx: Context<DB>, (): ()| async move { Ok::<_, WorkflowError>(2) },
    );
    let runner = setup.run(w);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(w.get(&id).await.unwrap().unwrap().status, Status::Running, "refused by version v2");
    runner.abort();
    w.register_version(
        "versioned",
        "v1",
        |_ctx: Context<DB>, (): ()| async move { Ok::<_, WorkflowError>(1) },
    );
    let runner = setup.run(w);
    assert_eq!(setup.result::<i32>(&id).await.unwrap(), 1, "run by v1");
    runner.abort();
    setup.finish().await;
}
on_each_database!(code_changed_under_a_workflow_fails_it_clearly);

/// The harness (feature `testing`): `drain` runs a workflow inline up to its durable
/// sleep, `make_sleeps_due` moves the sleep's wake time to now, and the next `drain` runs
/// it to its end; a workflow of another version is put off, not run.
#[cfg(feature = "testing")]
mod harness {
    use super::*;
    use rowbus::testing::{Handled, TestBroker};

    async fn sleeps_are_made_due_and_drained<DB: Db>(test: TestBroker<DB>) {
        let workflows = Workflows::new(test.queue("wfharness").await.unwrap());
        workflows.deploy().await.unwrap();
        workflows.register("nap", |ctx: Context<DB>, n: u32| async move {
            let a: u32 = ctx.step("a", || async move { Ok::<_, std::io::Error>(n + 1) }).await?;
            ctx.sleep(Duration::from_secs(3600)).await?;
            ctx.step("b", || async move { Ok::<_, std::io::Error>(a * 10) }).await
        });
        let id = workflows.start("nap", &1u32).await.unwrap();
        let drained = workflows.drain(&test).await.unwrap();
        assert_eq!(drained.len(), 1, "one run, up to the sleep: {drained:?}");
        let states: Vec<StepState> = workflows.steps(&id).await.unwrap().iter().map(|s| s.state).collect();
        assert_eq!(states, [StepState::Done, StepState::Sleep]);
        assert!(workflows.drain(&test).await.unwrap().is_empty(), "asleep: nothing due");
        assert_eq!(workflows.make_sleeps_due(&test).await.unwrap(), 1);
        workflows.drain(&test).await.unwrap();
        assert_eq!(workflows.result::<u32>(&id).await.unwrap(), 20);

        workflows.register_version("old", "v1", |_ctx: Context<DB>, (): ()| async move {
            Ok::<_, WorkflowError>(())
        });
        let old = workflows.start("old", &()).await.unwrap();
        workflows.register_version("old", "v2", |_ctx: Context<DB>, (): ()| async move {
            Ok::<_, WorkflowError>(())
        });
        let drained = workflows.drain(&test).await.unwrap();
        assert_eq!(drained[0].handled, Handled::Snoozed { after: rowbus::workflow::REFUSED_WAIT });
        assert_eq!(workflows.get(&old).await.unwrap().unwrap().status, Status::Running);
        test.cleanup().await.unwrap();
    }

    mod sleeps_are_made_due_and_drained {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn postgres() {
            let test =
                rowbus::testing::TestBroker::<sqlx::Postgres>::connect(crate::common::PG).await.unwrap();
            super::sleeps_are_made_due_and_drained(test).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn mariadb() {
            let test =
                rowbus::testing::TestBroker::<sqlx::MySql>::connect(crate::common::MARIADB).await.unwrap();
            super::sleeps_are_made_due_and_drained(test).await;
        }
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn sqlite() {
            super::sleeps_are_made_due_and_drained(rowbus::testing::TestBroker::sqlite().await.unwrap())
                .await;
        }
    }
}

/// Fan-out and fan-in: a workflow starts 100 children, one of which fails, and joins
/// them: each child once, the failure reaching the parent as an error it handles.
/// Cancelling a parent cancels its running children, down the tree.
async fn children_fan_out_join_and_cancel_with_their_parent<DB: Brokers>(place: Place) {
    let setup = Setup::<DB>::new(&place, "wfkids").await;
    let effects = Effects::default();
    let e = effects.clone();
    setup.workflows.register("square", move |ctx: Context<DB>, n: i64| {
        let effects = e.clone();
        async move {
            effects.count(&format!("square {n}"));
            match n {
                13 => Err(WorkflowError::failed("thirteen")),
                n => Ok(ctx.step("square", move || async move { Ok::<_, std::io::Error>(n * n) }).await?),
            }
        }
    });
    setup.workflows.register("fan", |ctx: Context<DB>, n: i64| async move {
        let mut children = Vec::new();
        for i in 0..n {
            children.push(ctx.start_child("square", &i).await?);
        }
        let mut sum = 0;
        let mut failed = Vec::new();
        for end in ctx.join_all::<i64>(&children).await? {
            match end {
                Ok(square) => sum += square,
                Err(WorkflowError::Child { error, .. }) => failed.push(error),
                Err(other) => return Err(other),
            }
        }
        Ok::<_, WorkflowError>((sum, failed))
    });
    setup.workflows.register("parent", |ctx: Context<DB>, (): ()| async move {
        let children = [ctx.start_child("idle", &()).await?, ctx.start_child("idle", &()).await?];
        ctx.join_all::<()>(&children).await?;
        Ok::<_, WorkflowError>(())
    });
    setup.workflows.register("idle", |ctx: Context<DB>, (): ()| async move {
        ctx.wait_for_event::<()>("never", None).await?;
        Ok::<_, WorkflowError>(())
    });
    let fan = setup.workflows.start("fan", &100i64).await.unwrap();
    let runner = setup.run(&setup.workflows);
    let (sum, failed): (i64, Vec<String>) = setup.result(&fan).await.unwrap();
    let expected: i64 = (0..100i64).filter(|n| *n != 13).map(|n| n * n).sum();
    assert_eq!((sum, failed), (expected, vec!["workflow failed: thirteen".to_owned()]));
    for n in 0..100 {
        assert_eq!(effects.of(&format!("square {n}")), 1, "child {n} ran once");
    }
    assert_eq!(setup.children(&fan, None).await.len(), 100);

    let parent = setup.workflows.start("parent", &()).await.unwrap();
    let started = Instant::now();
    let kids = loop {
        let kids = setup.children(&parent, Some(Status::Running)).await;
        if kids.len() == 2 {
            break kids;
        }
        assert!(started.elapsed() < ENDS, "the children did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(setup.workflows.cancel(&parent).await.unwrap());
    for kid in &kids {
        assert!(
            matches!(setup.result::<()>(kid).await, Err(WorkflowError::Cancelled(_))),
            "child {kid} cancelled"
        );
    }
    assert!(matches!(setup.result::<()>(&parent).await, Err(WorkflowError::Cancelled(_))));
    runner.abort();
    setup.finish().await;
}
on_each_database!(children_fan_out_join_and_cancel_with_their_parent);

/// The documented plain-SQL emit: a row inserted into `<queue>_wfe` by another program
/// (which wakes nobody) is found by the waiting workflow within the recheck interval.
async fn an_event_inserted_by_plain_sql_is_found_at_the_recheck<DB: Brokers>(place: Place) {
    let setup = Setup::<DB>::new(&place, "wfsql").await;
    setup.workflows.recheck(Duration::from_millis(300));
    setup.workflows.register("await", |ctx: Context<DB>, (): ()| async move {
        ctx.wait_for_event::<String>("paid", None).await
    });
    let id = setup.workflows.start("await", &()).await.unwrap();
    let runner = setup.run(&setup.workflows);
    let waiting = Instant::now();
    while setup.workflows.steps(&id).await.unwrap().is_empty() {
        assert!(waiting.elapsed() < ENDS, "the workflow never waited");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The statement of docs/workflows.md; the id is hexadecimal, safe as a literal here.
    place
        .exec(format!(
            "INSERT INTO {}_wfe (workflow_id, name, payload) VALUES ('{id}', 'paid', '\"by sql\"')",
            setup.name
        ))
        .await;
    assert_eq!(setup.result::<Option<String>>(&id).await.unwrap().as_deref(), Some("by sql"));
    runner.abort();
    setup.finish().await;
}
on_each_database!(an_event_inserted_by_plain_sql_is_found_at_the_recheck);

/// Fan-in, any: a workflow starts three children, two of which wait for an event, and
/// takes the first to end; the step records which, so the run after a later sleep (a
/// replay from the top, once every child has ended) gets the same child, and the
/// others' ends are then joined as usual. A failing first child reaches the parent as
/// an error it handles.
async fn join_any_takes_the_first_child_to_end<DB: Brokers>(place: Place) {
    let setup = Setup::<DB>::new(&place, "wfany").await;
    let effects = Effects::default();
    setup.workflows.register("child", |ctx: Context<DB>, (n, wait): (i64, bool)| async move {
        if wait {
            ctx.wait_for_event::<()>("go", None).await?;
        }
        match n {
            13 => Err(WorkflowError::failed("thirteen")),
            n => Ok(n),
        }
    });
    let e = effects.clone();
    setup.workflows.register("race", move |ctx: Context<DB>, first: i64| {
        let effects = e.clone();
        async move {
            let children = vec![
                ctx.start_child("child", &(1i64, true)).await?,
                ctx.start_child("child", &(first, false)).await?,
                ctx.start_child("child", &(3i64, true)).await?,
            ];
            let (winner, end) = ctx.join_any::<i64>(&children).await?;
            effects.count(&format!("joined {}", winner == children[1]));
            let first = match end {
                Ok(n) => n.to_string(),
                Err(WorkflowError::Child { error, .. }) => error,
                Err(other) => return Err(other),
            };
            // Replayed from the top after this sleep, with every child ended by then.
            ctx.sleep(Duration::from_millis(300)).await?;
            let all: Vec<String> = ctx
                .join_all::<i64>(&children)
                .await?
                .into_iter()
                .map(|end| match end {
                    Ok(n) => n.to_string(),
                    Err(WorkflowError::Child { error, .. }) => error,
                    Err(other) => other.to_string(),
                })
                .collect();
            Ok::<_, WorkflowError>((first, all))
        }
    });
    let runner = setup.run(&setup.workflows);
    for (first, expected) in [(2i64, "2"), (13, "workflow failed: thirteen")] {
        let race = setup.workflows.start("race", &first).await.unwrap();
        // The waiting children are told to go once the race took its first.
        let started = Instant::now();
        let kids = loop {
            let kids = setup.children(&race, None).await;
            let steps = setup.workflows.steps(&race).await.unwrap();
            if kids.len() == 3 && steps.iter().any(|s| s.name == "rowbus.sleep") {
                break kids;
            }
            assert!(started.elapsed() < ENDS, "the race did not take its first child");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        for kid in &kids {
            setup.workflows.emit_event(kid, "go", &()).await.unwrap();
        }
        let (got, all): (String, Vec<String>) = setup.result(&race).await.unwrap();
        assert_eq!(got, expected);
        assert_eq!(all, ["1".to_owned(), expected.to_owned(), "3".to_owned()]);
    }
    // Every run of both races past the join (at least two each: before and after the
    // sleep) got the same child.
    assert!(effects.of("joined true") >= 4, "{:?}", effects.0);
    assert_eq!(effects.of("joined false"), 0, "the same child on every run: {:?}", effects.0);
    runner.abort();
    setup.finish().await;
}
on_each_database!(join_any_takes_the_first_child_to_end);

/// A queue's workflows counted by status; `None` once its workflow tables are dropped.
async fn workflows_are_counted_by_status<DB: Brokers>(place: Place) {
    let setup = Setup::<DB>::new(&place, "wfcount").await;
    setup.workflows.register("noop", |_ctx: Context<DB>, (): ()| async move { Ok::<_, WorkflowError>(()) });
    assert_eq!(setup.workflows.counts().await.unwrap(), Some(rowbus::workflow::WorkflowCounts::default()));
    let first = setup.workflows.start("noop", &()).await.unwrap();
    setup.workflows.start("noop", &()).await.unwrap();
    assert!(setup.workflows.cancel(&first).await.unwrap());
    let counts = setup.workflows.counts().await.unwrap().expect("the tables are there");
    assert_eq!((counts.running, counts.succeeded, counts.failed, counts.cancelled), (1, 0, 0, 1));
    setup.workflows.drop_tables().await.unwrap();
    assert_eq!(setup.workflows.counts().await.unwrap(), None);
    setup.finish().await;
}
on_each_database!(workflows_are_counted_by_status);
