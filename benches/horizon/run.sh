#!/usr/bin/env bash
# A queue while another connection holds the database's horizon open, on throwaway
# servers with production settings (docs/performance.md, "A held horizon").
#
#   benches/horizon/run.sh postgres   `rowbus bench horizon` (RATE msgs/s: CLEAN, then the
#                                     horizon held for HELD, then AFTER), and beside it in
#                                     the same run a plain SKIP LOCKED table under pgbench at
#                                     the same rate (a producer, 8 consumers that mark a row
#                                     and delete it, as rowbus's claims and acknowledgements
#                                     do); a line per 10 s for each
#   benches/horizon/run.sh mariadb    `rowbus bench horizon` with a consistent snapshot held,
#                                     then, still held, drains of DRAIN messages from the
#                                     churned queue and a fresh one
#   benches/horizon/run.sh soak       SOAK of RATE msgs/s with nothing held (PostgreSQL):
#                                     the first and last five minutes side by side
#
#   RATE=1000 CLEAN=2m HELD=10m AFTER=3m DRAIN=20000 SOAK=30m ROWBUS=target/release/rowbus
#   PLAIN=beside   the plain table beside rowbus (PLAIN=none: rowbus alone on its server; on
#                  two cores the plain table's consumers, slowing as its dead rows pile up,
#                  take the CPU that rowbus's claims need, so the held run measures them both)
#
# PostgreSQL: scripts/pg-throwaway.sh on 127.0.0.1:PG_PORT (5444; autovacuum on, naptime 10 s).
# MariaDB: scripts/binlog.sh on 127.0.0.1:3362 (a server of its own with a binary log, as
# production servers run). Both are stopped at the end, however the run ends. Needs root.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
RATE=${RATE:-1000}
CLEAN=${CLEAN:-2m}
HELD=${HELD:-10m}
AFTER=${AFTER:-3m}
DRAIN=${DRAIN:-20000}
SOAK=${SOAK:-30m}
rowbus=${ROWBUS:-$root/target/release/rowbus}
PG_PORT=${PG_PORT:-5444}
PLAIN=${PLAIN:-beside}
MY_PORT=3362
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)

work=$(mktemp -d)
pids=()
stop() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  # Only the server this run started: another run may use the other.
  case "${1:-}" in
    postgres | soak) "$root/scripts/pg-throwaway.sh" down "$PG_PORT" >/dev/null 2>&1 || true ;;
    mariadb) BINLOG_PORT=$MY_PORT BINLOG_DIR=/tmp/rowbus-horizon-mariadb "$root/scripts/binlog.sh" down >/dev/null 2>&1 || true ;;
  esac
  rm -rf "$work"
}
trap 'stop "${1:-}"' EXIT

# Seconds in a duration such as 10m, 90s, 1h.
seconds() {
  case "$1" in
    *h) echo $(( ${1%h} * 3600 )) ;;
    *m) echo $(( ${1%m} * 60 )) ;;
    *s) echo "${1%s}" ;;
    *) echo "$1" ;;
  esac
}

plain() {
  local psql=(psql -X -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -d test -tA)
  "${psql[@]}" -c "CREATE TABLE plain_jobs (id BIGSERIAL PRIMARY KEY, payload TEXT NOT NULL,
    run_at TIMESTAMPTZ NOT NULL DEFAULT now(), locked_by INTEGER, locked_at TIMESTAMPTZ);
    CREATE INDEX plain_jobs_ready ON plain_jobs (run_at, id) WHERE locked_by IS NULL"
  cat >"$work/produce.sql" <<'EOF'
INSERT INTO plain_jobs (payload) VALUES ('job');
EOF
  cat >"$work/consume.sql" <<'EOF'
UPDATE plain_jobs SET locked_by = pg_backend_pid(), locked_at = now()
 WHERE id = (SELECT id FROM plain_jobs WHERE locked_by IS NULL ORDER BY run_at, id LIMIT 1 FOR UPDATE SKIP LOCKED);
DELETE FROM plain_jobs WHERE locked_by = pg_backend_pid();
EOF
  local total=$(( $(seconds "$CLEAN") + $(seconds "$HELD") + $(seconds "$AFTER") ))
  # The consumers poll a little faster than the producer publishes, so the table drains.
  (cd "$work" && "$bin/pgbench" -n -h 127.0.0.1 -p "$PG_PORT" -U postgres -c 2 -j 1 -R "$RATE" -T "$total" \
    -f produce.sql test >produce.out 2>&1) &
  pids+=($!)
  (cd "$work" && "$bin/pgbench" -n -h 127.0.0.1 -p "$PG_PORT" -U postgres -c 8 -j 2 -R $(( RATE * 11 / 10 )) \
    -T "$total" -l --log-prefix=consume -f consume.sql test >consume.out 2>&1) &
  pids+=($!)
  # The plain table's figures every 10 s: deleted so far, dead tuples, size.
  (
    start=$(date +%s.%N)
    while :; do
      sleep 10
      echo "$(echo "$(date +%s.%N) - $start" | bc) $("${psql[@]}" -F ' ' -c "SELECT n_tup_del, n_dead_tup,
        pg_total_relation_size('plain_jobs') FROM pg_stat_user_tables WHERE relname = 'plain_jobs'")"
    done
  ) >"$work/plain.txt" &
  pids+=($!)
}

postgres() {
  "$root/scripts/pg-throwaway.sh" up "$PG_PORT"
  local url="postgres://postgres@127.0.0.1:$PG_PORT/test"
  if [ "$PLAIN" = beside ]; then plain; fi
  "$rowbus" --database-url "$url" bench horizon --rate "$RATE" --clean "$CLEAN" --held "$HELD" --after "$AFTER" \
    | tee "$work/rowbus.txt"
  if [ "$PLAIN" = beside ]; then
    sleep 2
    python3 "$here/plain.py" "$work" "$RATE"
  fi
}

mariadb() {
  BINLOG_PORT=$MY_PORT BINLOG_DIR=/tmp/rowbus-horizon-mariadb "$root/scripts/binlog.sh" up
  "$rowbus" --database-url "mysql://root@127.0.0.1:$MY_PORT/test" bench horizon --rate "$RATE" \
    --clean "$CLEAN" --held "$HELD" --after 0s --drain "$DRAIN"
}

soak() {
  "$root/scripts/pg-throwaway.sh" up "$PG_PORT"
  "$rowbus" --database-url "postgres://postgres@127.0.0.1:$PG_PORT/test" bench horizon --rate "$RATE" \
    --clean "$SOAK" --held 0s --after 0s
}

case "${1:-}" in
  postgres) postgres ;;
  mariadb) mariadb ;;
  soak) soak ;;
  *) echo "usage: benches/horizon/run.sh postgres|mariadb|soak" >&2; exit 2 ;;
esac
