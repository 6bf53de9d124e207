#!/usr/bin/env bash
# Durable workflows side by side on one PostgreSQL: rowbus, DBOS Transact and Absurd, interleaved
# in ROUNDS rounds so that the ratios are measured under the same conditions. Per system, mode and
# round (README.md beside this script says what and how):
#   throughput  WORKFLOWS workflows of STEPS no-op steps, started one by one while WORKERS workers
#               run them, timed from the first start to the last end (workflows/s, steps/s);
#   latency     LATENCY_SAMPLES workflows started one at a time on the idle worker, start to
#               result (p50, p99).
# Modes: `defaults` (each system as shipped) and `poll10ms` (the polling peers with a 10 ms poll;
# DBOS's queue polls every 1 s by default, Absurd's worker every 0.25 s).
# Each run gets a database of its own on the server (wfbench_<system>_<pid>), dropped at its end.
# Prints each run's JSON line as it comes, then the table of summary.py.
#
#   benches/workflows/run.sh
#   ROUNDS=3 WORKFLOWS=1000 STEPS=5 WORKERS=8 LATENCY_SAMPLES=50 SYSTEMS="rowbus dbos absurd" \
#     MODES="defaults poll10ms" PG_URL=postgresql://postgres@127.0.0.1:5432/postgres \
#     ROWBUS=target/release/rowbus PAUSE_FILE=/path/to/file ABSURD_LAYOUT=pool benches/workflows/run.sh
# ABSURD_LAYOUT: pool (one client, start_worker(concurrency=WORKERS)) or clients (WORKERS clients
# of one task at a time, each with its own connection); see absurd_bench.py.
#
# PAUSE_FILE: while that file exists, no run starts (checked every 30 s); a peer's run under way
# when it appears is stopped (SIGTERM, its database dropped) and run again once the file is gone,
# for a machine shared with someone measuring latency.
# Needs python3 (venv), psql (absurdctl init and rowbus's scratch database) and, for the rowbus
# side, a release build (`cargo build --release -p rowbus-cli`; this script does not build it).
# The peers' venvs are made once under $WFBENCH_CACHE (default ~/.cache/rowbus-bench), outside
# the repository, from the pinned requirements-*.txt; nothing is installed while measuring.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
ROUNDS=${ROUNDS:-3}
WORKFLOWS=${WORKFLOWS:-1000}
STEPS=${STEPS:-5}
WORKERS=${WORKERS:-8}
LATENCY_SAMPLES=${LATENCY_SAMPLES:-50}
SYSTEMS=${SYSTEMS:-rowbus dbos absurd}
MODES=${MODES:-defaults poll10ms}
PG_URL=${PG_URL:-postgresql://postgres@127.0.0.1:5432/postgres}
PAUSE_FILE=${PAUSE_FILE:-}
ABSURD_LAYOUT=${ABSURD_LAYOUT:-pool}
cache=${WFBENCH_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rowbus-bench}
rowbus=${ROWBUS:-$root/target/release/rowbus}

# venv PEER: the venv of requirements-PEER.txt, made (and filled) once; its path in $venv_dir.
# The name carries a hash of the requirements, so a change of a pin makes a new one.
venv() {
  local req="$here/requirements-$1.txt" sum
  sum=$(sha256sum "$req" | cut -c1-12)
  venv_dir="$cache/workflows-$1-$sum"
  if [ ! -x "$venv_dir/bin/python" ] || [ ! -f "$venv_dir/.complete" ]; then
    rm -rf "$venv_dir"
    python3 -m venv "$venv_dir"
    "$venv_dir/bin/pip" install -q --disable-pip-version-check -r "$req"
    touch "$venv_dir/.complete"
  fi
}

pause_if_asked() {
  [ -n "$PAUSE_FILE" ] || return 0
  while [ -e "$PAUSE_FILE" ]; do
    echo "waiting: $PAUSE_FILE exists" >&2
    sleep 30
  done
}

work=$(mktemp -d /tmp/wfbench.XXXXXX)
results="$work/results.jsonl"
: >"$results"
rowbus_db=""
driver=""
cleanup() {
  if [ -n "$driver" ]; then kill -TERM "$driver" 2>/dev/null || true; wait "$driver" 2>/dev/null || true; fi
  if [ -n "$rowbus_db" ]; then
    psql -q -X "$PG_URL" -c "drop database if exists \"$rowbus_db\" with (force)" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

# peer SYSTEM MODE: one run of benches/workflows/SYSTEM_bench.py in its venv; run again from
# the start if PAUSE_FILE appeared while it ran.
peer() {
  venv "$1"
  local status extra=()
  [ "$1" = absurd ] && extra=(--layout "$ABSURD_LAYOUT")
  while :; do
    pause_if_asked
    (cd "$here" && exec "$venv_dir/bin/python" "$1_bench.py" --url "$PG_URL" --mode "$2" \
      --workflows "$WORKFLOWS" --steps "$STEPS" --workers "$WORKERS" \
      --latency-samples "$LATENCY_SAMPLES" ${extra[@]+"${extra[@]}"}) >"$work/run.out" &
    driver=$!
    while kill -0 "$driver" 2>/dev/null; do
      if [ -n "$PAUSE_FILE" ] && [ -e "$PAUSE_FILE" ]; then
        echo "$1 $2: stopped, $PAUSE_FILE appeared; it runs again once the file is gone" >&2
        kill -TERM "$driver" 2>/dev/null || true
      fi
      sleep 1
    done
    status=0
    wait "$driver" || status=$?
    driver=""
    if [ "$status" = 143 ]; then continue; fi
    [ "$status" = 0 ] || { echo "$1 $2: exited with $status" >&2; exit 1; }
    grep '^{' "$work/run.out" | tee -a "$results"
    return 0
  done
}

# ---------------------------------------------------------------------------------------------
# rowbus's side. The command is to be provided with rowbus's workflow library:
#   rowbus --database-url URL bench workflows --workflows N --steps S --workers W \
#     --latency-samples L --json
# runs the same two measurements as the peers' drivers (README.md) on URL at rowbus's defaults
# and prints one JSON line {system: "rowbus", version, mode: "defaults", workers, workflows,
# steps_per_workflow, seconds, workflows_per_s, steps_per_s, p50_ms, p99_ms, latency_samples}.
# Until the binary has that subcommand, this function says so and records nothing.
# rowbus wakes its workers at once on a start (no poll to shorten), so it runs in mode
# `defaults` only.
# ---------------------------------------------------------------------------------------------
rowbus_has_workflows_bench() {
  [ -x "$rowbus" ] && "$rowbus" bench workflows --help >/dev/null 2>&1
}
rowbus_side() { # MODE
  [ "$1" = defaults ] || return 0
  if ! rowbus_has_workflows_bench; then
    echo "rowbus: skipped, \`$rowbus bench workflows\` is not in this build (cargo build --release -p rowbus-cli)" >&2
    return 0
  fi
  rowbus_db="wfbench_rowbus_$$"
  psql -q -X "$PG_URL" -c "create database \"$rowbus_db\"" >/dev/null
  local url="${PG_URL%/*}/$rowbus_db"
  "$rowbus" --database-url "$url" bench workflows --workflows "$WORKFLOWS" --steps "$STEPS" \
    --workers "$WORKERS" --latency-samples "$LATENCY_SAMPLES" --json | grep '^{' | tee -a "$results"
  psql -q -X "$PG_URL" -c "drop database if exists \"$rowbus_db\" with (force)" >/dev/null
  rowbus_db=""
}

run_one() { # SYSTEM MODE
  pause_if_asked
  case "$1" in
    rowbus) rowbus_side "$2" ;;
    dbos | absurd) peer "$1" "$2" ;;
    *) echo "unknown system $1" >&2; exit 2 ;;
  esac
}

# Make the venvs before the first measurement, so that no install runs between two of them.
for s in $SYSTEMS; do
  case "$s" in dbos | absurd) venv "$s" ;; esac
done

read -r -a systems <<<"$SYSTEMS"
read -r -a modes <<<"$MODES"
n=${#systems[@]}
for ((round = 1; round <= ROUNDS; round++)); do
  echo "round $round of $ROUNDS" >&2
  for mode in "${modes[@]}"; do
    # Interleaved: each round starts with the next system, so none always runs first.
    for ((k = 0; k < n; k++)); do
      run_one "${systems[(k + round - 1) % n]}" "$mode"
    done
  done
done

python3 "$here/summary.py" "$results"
