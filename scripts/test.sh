#!/usr/bin/env bash
# The test command: starts the database services if they are down, then runs every test
# of the workspace against them (PostgreSQL and MariaDB on 127.0.0.1, SQLite in temp files;
# the cluster tests start their own Galera cluster and PostgreSQL standby, stopped after).
# Every test drops the tables and schemas it makes: this fails when the `test` databases
# hold a table or schema of this run's (its names carry the run's tag) after the run.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/services.sh

# Shared and long-lived, not any test's own: the default notify table and its durable
# listeners' positions table, which the broker tests with listen_notify on MariaDB deploy
# (and the first run on a new server creates).
shared=$'MariaDB table rowbus_notify\nMariaDB table rowbus_notify_positions'

# Every table and schema (but `public`) in the `test` databases, one per line, sorted.
test_tables() {
  {
    psql -X -h 127.0.0.1 -U postgres -d test -tA -v ON_ERROR_STOP=1 -c "
      SELECT 'PostgreSQL table ' || schemaname || '.' || tablename FROM pg_tables
       WHERE schemaname NOT IN ('pg_catalog', 'information_schema')
      UNION ALL
      SELECT 'PostgreSQL schema ' || nspname FROM pg_namespace
       WHERE nspname NOT LIKE 'pg\_%' AND nspname NOT IN ('information_schema', 'public')"
    mariadb -h 127.0.0.1 -P 3306 -u root -N -B -e "
      SELECT CONCAT('MariaDB table ', table_name) FROM information_schema.tables
       WHERE table_schema = 'test'"
  } | LC_ALL=C sort
}

# This run's tag: every name the tests make carries it (`unique()` in the tests' common
# module), so the leftover check below looks at this run's tables only, and tables other
# programs make on the same servers during the run are not taken for leftovers.
ROWBUS_TEST_RUN="r$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')"
export ROWBUS_TEST_RUN

before=$(test_tables)
status=0
# The cluster tests (rowbus-cli's galera and failover) start a three-node Galera cluster
# (scripts/galera.sh) and a PostgreSQL primary and standby (scripts/pg-standby.sh) when
# they are down; they are throwaway and CPU-heavy: stopped after the run, however it went,
# unless they were already running before it (another program's, in the same directory:
# left as they were).
was_running() { "$@" status 2>/dev/null | grep ': running' >/dev/null; }
stop_after=()
was_running scripts/galera.sh || stop_after+=(scripts/galera.sh)
was_running scripts/pg-standby.sh || stop_after+=(scripts/pg-standby.sh)
# The MariaDB with a binary log that the push path's tests share (scripts/binlog.sh): up
# for the whole run, as each test runs in a process of its own and none of them may stop
# it under another.
was_running scripts/binlog.sh || stop_after+=(scripts/binlog.sh)
stop_clusters() {
  local script
  for script in ${stop_after[@]+"${stop_after[@]}"}; do
    "$script" down >/dev/null 2>&1 || true
  done
}
trap stop_clusters EXIT
scripts/binlog.sh up >/dev/null
# cargo-nextest runs the tests of every binary at once, each in a process of its own
# (.config/nextest.toml: how many at once, and those that take turns): most of a test's
# time is spent waiting on a server, a lease or a child process, and the binaries one
# after the other, as `cargo test` runs them, took 1,100 s where nextest takes 410 s.
# Without cargo-nextest, `cargo test` runs the same tests. Doctests run apart: nextest
# does not run them.
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --all-features --no-fail-fast "$@" || status=$?
  cargo test --workspace --all-features --doc "$@" || status=$?
else
  echo "test.sh: cargo-nextest is not installed (cargo install --locked cargo-nextest): running cargo test" >&2
  cargo test --workspace --all-features --no-fail-fast "$@" || status=$?
fi
# The examples (examples/, built by `cargo test`), each run to its end on a SQLite file of
# its own; the web one serves on a free port, places its own orders and exits. Each removes
# its file (and the file's -wal and -shm) when it ends: what is left in the temporary
# directory fails the run.
tmp=${TMPDIR:-/tmp}
example_files() { find "$tmp" -maxdepth 1 -name 'rowbus-example-*' -printf '%f\n' 2>/dev/null | LC_ALL=C sort; }
examples_before=$(example_files)
for example in typed_jobs cron_schedule durable_listener "web_outbox --demo" "dashboard --demo"; do
  echo "test.sh: running example $example" >&2
  # shellcheck disable=SC2086 # the example's flags
  timeout 120 target/debug/examples/$example >/dev/null || { echo "test.sh: example $example failed" >&2; status=1; }
done
# The checkout workflow across crashes: 6 workflows started, the process aborted after a
# step 2, run again and aborted after a step 4 (the sleep between 3 and 4 outlives it), then
# run with `paid` emitted to every workflow until all ended; the log must hold each
# `STEP <n> <id>` line exactly once per workflow.
checkout_example() {
  local db="$tmp/rowbus-example-checkout-$$.sqlite" log="$tmp/rowbus-example-checkout-$$.log"
  local ids="$tmp/rowbus-example-checkout-$$.ids" ok=0 id n run=(timeout 120 target/debug/examples/checkout_workflow)
  run+=(--database-url "sqlite://$db" --log "$log" --sleep 1s)
  # Aborts are expected: no core files for them.
  (ulimit -c 0; "${run[@]}" --start 6 --abort-after-step 2 >"$ids" 2>/dev/null) && ok=1
  (ulimit -c 0; "${run[@]}" --abort-after-step 4 >/dev/null 2>&1) && ok=1
  "${run[@]}" --emit-paid >/dev/null 2>&1 || ok=1
  [ "$(grep -c . "$ids")" = 6 ] || ok=1
  for id in $(cat "$ids"); do
    for n in 1 2 3 4 5; do
      [ "$(grep -cxF "STEP $n $id" "$log")" = 1 ] || { echo "test.sh: checkout_workflow: STEP $n $id not once" >&2; ok=1; }
    done
  done
  [ "$(grep -c . "$log")" = 30 ] || ok=1
  rm -f "$db" "$db-wal" "$db-shm" "$db-journal" "$log" "$ids"
  return "$ok"
}
echo "test.sh: running example checkout_workflow (aborted twice, then run to its end)" >&2
checkout_example || { echo "test.sh: example checkout_workflow failed" >&2; status=1; }
left=$(LC_ALL=C comm -13 <(printf '%s\n' "$examples_before") <(example_files) | grep . || true)
if [ -n "$left" ]; then
  echo "test.sh: the examples left $(wc -l <<<"$left") files in $tmp:" >&2
  sed 's/^/  /' <<<"$left" >&2
  status=1
fi
after=$(test_tables)

new=$(LC_ALL=C comm -13 <(printf '%s\n' "$before") <(printf '%s\n' "$after") | grep -vxF "$shared" || true)
extra=$(grep -F "_${ROWBUS_TEST_RUN}" <<<"$new" || true)
others=$(grep -vF "_${ROWBUS_TEST_RUN}" <<<"$new" | grep . || true)
if [ -n "$others" ]; then
  echo "test.sh: $(wc -l <<<"$others") tables or schemas appeared during the run without this run's tag" \
    "($ROWBUS_TEST_RUN): made by other programs on the same servers, not checked:" >&2
  sed 's/^/  /' <<<"$others" >&2
fi
if [ -n "$extra" ]; then
  {
    echo "test.sh: the tests left $(wc -l <<<"$extra") tables or schemas behind in the test databases" \
      "($(grep -c . <<<"$before" || true) before the run, $(grep -c . <<<"$after" || true) after):"
    sed 's/^/  /' <<<"$extra"
    echo "test.sh: every test must drop what it makes, also when it fails (the Cleanup guard of"
    echo "  crates/rowbus/tests/common/cleanup.rs). Only names with this run's tag ($ROWBUS_TEST_RUN)"
    echo "  are counted: make every name with unique() so that it carries it."
  } >&2
  if [ "$status" -eq 0 ]; then status=1; fi
fi
exit "$status"
