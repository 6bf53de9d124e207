#!/usr/bin/env bash
# Fairness between consumers in several processes: PROCESSES `rowbus consume --workers WORKERS`
# (with CONSUME_FLAGS, e.g. --listen-notify) and MESSAGES published from stdin (1,000 a
# statement). ORDER=consumers-first (the default) starts the consumers on an empty queue and
# then publishes; ORDER=backlog-first publishes first and then starts the consumers together.
# Once every message was handled, each process's share is printed, with the largest share over
# the smallest.
#
#   benches/fairness/run.sh [URL...]   (default: the PostgreSQL, MariaDB and SQLite below)
#   MESSAGES=20000 PROCESSES=3 WORKERS=8 ROWBUS=target/release/rowbus benches/fairness/run.sh
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
MESSAGES=${MESSAGES:-20000}
PROCESSES=${PROCESSES:-3}
WORKERS=${WORKERS:-8}
ORDER=${ORDER:-consumers-first}
CONSUME_FLAGS=${CONSUME_FLAGS:-}
rowbus=${ROWBUS:-$root/target/release/rowbus}
if [ $# -eq 0 ]; then
  set -- postgres://postgres@127.0.0.1:5432/test mysql://root@127.0.0.1:3306/test sqlite:///tmp/rowbus-fairness.sqlite
fi

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

for url in "$@"; do
  table="rowbus_fairness_$$"
  "$rowbus" --database-url "$url" deploy --queue "$table" >/dev/null
  pids=()
  consumers() {
    for p in $(seq 1 "$PROCESSES"); do
      # shellcheck disable=SC2086
      "$rowbus" --database-url "$url" consume "$table" --workers "$WORKERS" $CONSUME_FLAGS >"$work/$p" 2>"$work/$p.err" &
      pids+=($!)
    done
  }
  if [ "$ORDER" = backlog-first ]; then
    seq 1 "$MESSAGES" | "$rowbus" --database-url "$url" publish "$table" - >/dev/null
    started=$(date +%s.%N)
    consumers
  else
    consumers
    sleep 1
    started=$(date +%s.%N)
    seq 1 "$MESSAGES" | "$rowbus" --database-url "$url" publish "$table" - >/dev/null
  fi
  while :; do
    handled=$(cat "$work"/[0-9]* | wc -l)
    [ "$handled" -ge "$MESSAGES" ] && break
    sleep 0.05
  done
  ended=$(date +%s.%N)
  for pid in "${pids[@]}"; do kill -INT "$pid" 2>/dev/null || true; done
  wait "${pids[@]}" 2>/dev/null || true
  pids=()
  shares=$(for p in $(seq 1 "$PROCESSES"); do wc -l <"$work/$p"; done | paste -sd' ')
  python3 - "$url" "$started" "$ended" $shares <<'PY'
import sys
url, started, ended, shares = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), [int(s) for s in sys.argv[4:]]
total = sum(shares)
print(f"{url}: {total} messages in {ended - started:.2f} s ({total / (ended - started):,.0f}/s); "
      f"shares {' '.join(str(s) for s in shares)}; largest / smallest {max(shares) / max(min(shares), 1):.2f}")
PY
  "$rowbus" --database-url "$url" undeploy --queue "$table" >/dev/null
done
