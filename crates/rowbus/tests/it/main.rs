//! The library's integration tests against the real PostgreSQL and MariaDB and temporary
//! SQLite files, one module per subject, in one test binary. Each test binary compiles the
//! library's code generic over the database again for what it calls, and links it all
//! again: as 25 binaries they took 312 s of compile time, as this one and the
//! OpenTelemetry tests' 145 s (`CARGO_INCREMENTAL=0 cargo test --no-run --timings`, the
//! workspace's crates built again). The OpenTelemetry tests keep a binary of their own:
//! they install a process-wide tracing subscriber.

#[path = "../common/mod.rs"]
mod common;
// Not in `common`: other crates' tests include that, without tracing-subscriber.
#[path = "../common/statements.rs"]
mod statements;

mod bad_input;
mod broker;
mod claim_cost;
mod control;
#[cfg(feature = "testing")]
mod dead_letters;
mod deploy;
mod dropped_futures;
mod durable;
mod features;
mod hand_off;
mod health;
mod history;
mod horizon;
mod layout;
mod limits;
mod listener;
mod multi_host;
mod pause;
mod pgbouncer;
mod published_total;
mod publishing;
mod push;
mod run_tx_recovers;
mod schedules;
mod settle_many;
mod snooze;
mod spawned_notify;
#[cfg(feature = "testing")]
mod testing;
mod transactional_effects;
mod wake_after_commit;
mod workflows;
