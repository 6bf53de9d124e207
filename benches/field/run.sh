#!/usr/bin/env bash
# rowbus side by side with the field: graphile-worker, pg-boss and PGQueuer (PostgreSQL only)
# and apalis (PostgreSQL, MariaDB, SQLite), interleaved in ROUNDS rounds per database so that
# the ratios are measured under the same conditions. Per system and round:
#   drain    MESSAGES no-op jobs put in with the system's own bulk insert first (not timed), then
#            a worker of 8 handlers (or the system's equivalent) timed from its start until the
#            last job is handled;
#   publish  PUBLISHES single publishes from 8 concurrent publishers (where the system has it);
#   latency  publish-to-handler p50/p99 in one process, LATENCY_SAMPLES jobs one at a time, on an
#            idle worker (rowbus, graphile-worker, PGQueuer: the ones woken at once for free).
# rowbus is measured twice: the CLI (`rowbus consume --workers 8`, the backlog from
# `rowbus publish TABLE -`, time until N lines were printed) and the library figures of
# `rowbus bench broker` (drain8: `run` with 8 workers; raw16: the raw 16-row claim loop on 8
# connections, the ceiling; publish1; latency).
# Each system's run gets a database of its own (named after this script's PID; SQLite: a file
# /tmp/field-*.sqlite), dropped at its end. Prints the medians and the ratios rowbus / peer.
#
#   benches/field/run.sh [URL...]   (default: the PostgreSQL, MariaDB and SQLite below)
#   MESSAGES=20000 PUBLISHES=5000 ROUNDS=3 LATENCY_SAMPLES=100 ROWBUS=target/release/rowbus \
#     SYSTEMS="rowbus-cli rowbus-lib graphile pgboss pgqueuer apalis" benches/field/run.sh
#
# Needs psql and the mysql client (to create and drop the databases), node and npm (installed
# here: js/node_modules), python3 (a venv here: .venv), cargo (the apalis drains, built in
# target/ here; apalis-mysql is a build of its own), and a release build of rowbus
# (`cargo build --release -p rowbus-cli`; this script does not build it).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
MESSAGES=${MESSAGES:-20000}
PUBLISHES=${PUBLISHES:-5000}
ROUNDS=${ROUNDS:-3}
LATENCY_SAMPLES=${LATENCY_SAMPLES:-100}
SYSTEMS=${SYSTEMS:-rowbus-cli rowbus-lib graphile pgboss pgqueuer apalis}
APALIS_FETCH_MYSQL=${APALIS_FETCH_MYSQL:-500}
rowbus=${ROWBUS:-$root/target/release/rowbus}
if [ $# -eq 0 ]; then
  set -- postgres://postgres@127.0.0.1:5432/test mysql://root@127.0.0.1:3306/test sqlite:///tmp/field.sqlite
fi
[ -x "$rowbus" ] || { echo "no rowbus binary at $rowbus (set ROWBUS)" >&2; exit 1; }
want() { [[ " $SYSTEMS " == *" $1 "* ]]; }

# The peers, installed here (js/node_modules, .venv and target/ are not committed).
if want graphile || want pgboss; then
  [ -d "$here/js/node_modules" ] || (cd "$here/js" && npm ci --no-audit --no-fund --loglevel=error)
fi
if want pgqueuer; then
  [ -x "$here/.venv/bin/python" ] || python3 -m venv "$here/.venv"
  "$here/.venv/bin/pip" install -q -r "$here/requirements.txt"
fi
target=${CARGO_TARGET_DIR:-$here/target}
if want apalis; then
  (cd "$here/apalis" && CARGO_TARGET_DIR=$target cargo build --release -q)
  (cd "$here/apalis-mysql" && CARGO_TARGET_DIR=$target cargo build --release -q)
fi

work=$(mktemp -d /tmp/field-work.XXXXXX)
results="$work/results"
: >"$results"
dbs=()
consumer=""
cleanup() {
  [ -n "$consumer" ] && kill "$consumer" 2>/dev/null || true
  for db in ${dbs[@]+"${dbs[@]}"}; do python3 "$here/db.py" drop "${db%% *}" "${db#* }" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

seq_no=0
# fresh URL: a new database on URL's server, its URL in $fresh_url; drop_last drops it.
fresh() {
  seq_no=$((seq_no + 1))
  local name="field_$$_$seq_no"
  dbs+=("$1 $name")
  fresh_url=$(python3 "$here/db.py" create "$1" "$name")
}
drop_last() {
  local last=${dbs[${#dbs[@]}-1]}
  python3 "$here/db.py" drop "${last%% *}" "${last#* }"
  unset 'dbs[${#dbs[@]}-1]'
}
# record DB WHO JSON-LINE: the system's figures, one JSON line in the results.
record() {
  python3 -c '
import json, sys
db, who, line = sys.argv[1:4]
d = json.loads(line)
print(json.dumps({"db": db, "who": who, "drain": d.get("drain_msgs_per_s"), "publish": d.get("publish_msgs_per_s"),
                  "p50": d.get("latency_p50_ms"), "p99": d.get("latency_p99_ms")}))' "$1" "$2" "$3" | tee -a "$results" >&2
}

rowbus_cli() { # URL DB
  local url
  fresh "$1"
  url=$fresh_url
  "$rowbus" --database-url "$url" deploy --queue field >/dev/null
  seq 1 "$MESSAGES" | "$rowbus" --database-url "$url" publish field - >/dev/null
  local started ended handled
  : >"$work/consumed"
  started=$(date +%s.%N)
  "$rowbus" --database-url "$url" consume field --workers 8 >"$work/consumed" 2>"$work/consume.err" &
  consumer=$!
  while :; do
    handled=$(wc -l <"$work/consumed")
    [ "$handled" -ge "$MESSAGES" ] && break
    kill -0 "$consumer" 2>/dev/null || { cat "$work/consume.err" >&2; exit 1; }
    sleep 0.01
  done
  ended=$(date +%s.%N)
  kill -INT "$consumer"
  wait "$consumer" || true
  consumer=""
  drop_last
  record "$2" "rowbus CLI consume, 8 workers" \
    "{\"drain_msgs_per_s\": $(python3 -c "import sys; print($MESSAGES / (float(sys.argv[2]) - float(sys.argv[1])))" "$started" "$ended")}"
}

rowbus_lib() { # URL DB
  local url
  fresh "$1"
  url=$fresh_url
  "$rowbus" --database-url "$url" deploy >/dev/null
  local pub drain
  pub=$("$rowbus" --database-url "$url" bench broker --only publish1 --rounds 1 --messages "$PUBLISHES" --json)
  drain=$("$rowbus" --database-url "$url" bench broker --only drain8,raw16,latency --rounds 1 \
    --messages "$MESSAGES" --latency-samples "$LATENCY_SAMPLES" --json)
  drop_last
  local lines
  lines=$(python3 -c '
import json, sys
pub, drain = json.loads(sys.argv[1]), json.loads(sys.argv[2])
t, l = drain["throughput"], drain["latency"]["latency"]
print(json.dumps({"drain_msgs_per_s": t["drain8"]["msgs_per_s"], "publish_msgs_per_s": pub["throughput"]["publish1"]["msgs_per_s"],
                  "latency_p50_ms": l["p50_ms"], "latency_p99_ms": l["p99_ms"]}))
print(json.dumps({"drain_msgs_per_s": t["raw16"]["msgs_per_s"]}))' "$pub" "$drain")
  record "$2" "rowbus library run, 8 workers" "$(sed -n 1p <<<"$lines")"
  record "$2" "raw16 claim loop (ceiling)" "$(sed -n 2p <<<"$lines")"
}

peer() { # URL DB WHO COMMAND... (the command gets --database-url URL appended)
  local base=$1 db=$2 who=$3 url out
  shift 3
  fresh "$base"
  url=$fresh_url
  [[ $url == sqlite:* ]] && url="$url?mode=rwc"
  out=$("$@" --database-url "$url" | tail -1)
  drop_last
  record "$db" "$who" "$out"
}

node=(node)
for round in $(seq 1 "$ROUNDS"); do
  for url in "$@"; do
    case "$url" in
      postgres*) db=PostgreSQL ;;
      mysql* | mariadb*) db=MariaDB ;;
      sqlite*) db=SQLite ;;
    esac
    echo "== $db, round $round of $ROUNDS" >&2
    if want rowbus-cli; then rowbus_cli "$url" "$db"; fi
    if want rowbus-lib; then rowbus_lib "$url" "$db"; fi
    if [ "$db" = PostgreSQL ]; then
      if want graphile; then
        peer "$url" "$db" "graphile-worker defaults, 8" "${node[@]}" "$here/js/graphile.mjs" --messages "$MESSAGES" \
          --mode defaults --concurrency 8 --latency "$LATENCY_SAMPLES"
        peer "$url" "$db" "graphile-worker perf preset, 8" "${node[@]}" "$here/js/graphile.mjs" --messages "$MESSAGES" \
          --mode preset --concurrency 8 --latency "$LATENCY_SAMPLES"
        peer "$url" "$db" "graphile-worker perf preset, 24" "${node[@]}" "$here/js/graphile.mjs" --messages "$MESSAGES" \
          --mode preset --concurrency 24
        # Its publish rate: single addJob calls, in a run of their own.
        peer "$url" "$db" "graphile-worker addJob" "${node[@]}" "$here/js/graphile.mjs" --messages "$PUBLISHES" \
          --mode preset --concurrency 8 --publish
        # (that run's drain, of PUBLISHES jobs, is not the one in the table)
        sed -i '$ s/"drain": [0-9.e+-]*/"drain": null/' "$results"
      fi
      if want pgboss; then
        peer "$url" "$db" "pg-boss 1 worker x batch 8" "${node[@]}" "$here/js/pgboss.mjs" --messages "$MESSAGES" --workers 1 --batch 8
        peer "$url" "$db" "pg-boss 8 workers x batch 8" "${node[@]}" "$here/js/pgboss.mjs" --messages "$MESSAGES" --workers 8 --batch 8
        peer "$url" "$db" "pg-boss send" "${node[@]}" "$here/js/pgboss.mjs" --messages "$PUBLISHES" --workers 8 --batch 8 --publish
        sed -i '$ s/"drain": [0-9.e+-]*/"drain": null/' "$results"
      fi
      if want pgqueuer; then
        peer "$url" "$db" "PGQueuer batch 4, 8 tasks" "$here/.venv/bin/python" "$here/pgqueuer_bench.py" --messages "$MESSAGES" \
          --batch 4 --tasks 8 --latency "$LATENCY_SAMPLES"
        peer "$url" "$db" "PGQueuer enqueue" "$here/.venv/bin/python" "$here/pgqueuer_bench.py" --messages "$PUBLISHES" \
          --batch 4 --tasks 8 --publish
        sed -i '$ s/"drain": [0-9.e+-]*/"drain": null/' "$results"
      fi
    fi
    if want apalis; then
      case "$db" in
        MariaDB) apalis=("$target/release/rowbus-field-apalis-mysql"); fetch=$APALIS_FETCH_MYSQL ;;
        *) apalis=("$target/release/rowbus-field-apalis"); fetch=500 ;;
      esac
      peer "$url" "$db" "apalis fetch $fetch, 8 handlers" "${apalis[@]}" --messages "$MESSAGES" --workers 8 --fetch "$fetch"
      peer "$url" "$db" "apalis push" "${apalis[@]}" --messages "$PUBLISHES" --workers 8 --fetch "$fetch" --publish
      sed -i '$ s/"drain": [0-9.e+-]*/"drain": null/' "$results"
    fi
  done
done

# FIELD_RESULTS=FILE keeps the JSON lines (summary.py FILE MESSAGES PUBLISHES ROUNDS reprints the table).
if [ -n "${FIELD_RESULTS:-}" ]; then cp "$results" "$FIELD_RESULTS"; fi
python3 "$here/summary.py" "$results" "$MESSAGES" "$PUBLISHES" "$ROUNDS"
