#!/usr/bin/env bash
# A throwaway PostgreSQL primary (127.0.0.1:5441) and streaming standby (127.0.0.1:5442)
# for the failover tests, data under $PG_STANDBY_DIR (/tmp/rowbus-pg), trust
# authentication, a `test` database. Needs root (the servers run as `postgres`).
#
#   scripts/pg-standby.sh up            a new primary and standby (pg_basebackup -R), or
#                                       nothing when both run; waits until the standby streams
#   scripts/pg-standby.sh down          stop both and remove the data
#   scripts/pg-standby.sh stop-primary  stop the primary hard (immediate: a crash)
#   scripts/pg-standby.sh promote       make the standby a primary and wait until it takes writes
#   scripts/pg-standby.sh status        each server: running or not, primary or standby
set -euo pipefail

DIR=${PG_STANDBY_DIR:-/tmp/rowbus-pg}
PRIMARY=5441
STANDBY=5442
WAIT=${PG_STANDBY_WAIT:-60}

die() { echo "pg-standby: $*" >&2; exit 1; }

bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$bin" ] || die "no PostgreSQL server under /usr/lib/postgresql (Debian's postgresql)"

as_pg() { runuser -u postgres -- "$@"; }
ctl() { as_pg "$bin/pg_ctl" "$@"; }
running() { ctl status -D "$DIR/$1" >/dev/null 2>&1; }
psql_at() { # port, statement
  psql -X -h 127.0.0.1 -p "$1" -U postgres -d postgres -tA -c "$2" 2>/dev/null
}
in_recovery() { psql_at "$1" "SELECT pg_is_in_recovery()"; }

start() { # name, port
  ctl start -w -t "$WAIT" -D "$DIR/$1" -l "$DIR/$1.log" \
    -o "-p $2 -k $DIR -c listen_addresses=127.0.0.1" >/dev/null ||
    { tail -n 20 "$DIR/$1.log" >&2; die "the $1 did not start"; }
}

up() {
  if running primary && running standby; then
    echo "pg-standby: primary on $PRIMARY and standby on $STANDBY already run" >&2
    return 0
  fi
  down quiet
  mkdir -p "$DIR"
  chown postgres:postgres "$DIR"
  as_pg "$bin/initdb" -D "$DIR/primary" -U postgres --auth=trust --no-sync >"$DIR/initdb.log" 2>&1 ||
    { cat "$DIR/initdb.log" >&2; die "initdb failed"; }
  cat >>"$DIR/primary/postgresql.conf" <<EOF
shared_buffers = 32MB
max_connections = 200
wal_level = replica
max_wal_senders = 5
hot_standby = on
fsync = off
EOF
  echo "host replication all 127.0.0.1/32 trust" >>"$DIR/primary/pg_hba.conf"
  start primary "$PRIMARY"
  psql_at "$PRIMARY" "CREATE DATABASE test" >/dev/null || die "cannot create the test database"
  # -c fast: without it the backup waits for the next spread checkpoint (90 s here).
  as_pg "$bin/pg_basebackup" -h 127.0.0.1 -p "$PRIMARY" -U postgres -D "$DIR/standby" -R -X stream -c fast --no-sync \
    >"$DIR/basebackup.log" 2>&1 || { cat "$DIR/basebackup.log" >&2; die "pg_basebackup failed"; }
  start standby "$STANDBY"
  for _ in $(seq 1 "$WAIT"); do
    if [ "$(psql_at "$PRIMARY" "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")" = 1 ]; then
      echo "pg-standby: primary on 127.0.0.1:$PRIMARY, standby streaming on 127.0.0.1:$STANDBY" >&2
      return 0
    fi
    sleep 1
  done
  tail -n 20 "$DIR/standby.log" >&2
  die "the standby did not start streaming within $WAIT s"
}

down() {
  local name
  for name in primary standby; do
    if running "$name"; then ctl stop -m immediate -D "$DIR/$name" >/dev/null || true; fi
  done
  rm -rf "$DIR"
  [ "${1:-}" = quiet ] || echo "pg-standby: stopped" >&2
}

stop_primary() {
  running primary || die "the primary is not running"
  ctl stop -m immediate -D "$DIR/primary" >/dev/null
  echo "pg-standby: primary stopped (immediate)" >&2
}

promote() {
  running standby || die "the standby is not running"
  ctl promote -w -t "$WAIT" -D "$DIR/standby" >/dev/null
  for _ in $(seq 1 "$WAIT"); do
    [ "$(in_recovery "$STANDBY")" = f ] && { echo "pg-standby: the standby on $STANDBY is the primary" >&2; return 0; }
    sleep 0.5
  done
  die "the standby did not leave recovery within $WAIT s"
}

status() {
  local name port
  for name in primary standby; do
    port=$PRIMARY; [ "$name" = standby ] && port=$STANDBY
    if running "$name"; then
      case "$(in_recovery "$port")" in
        t) echo "$name (port $port): running, standby" ;;
        f) echo "$name (port $port): running, primary" ;;
        *) echo "$name (port $port): running, not answering" ;;
      esac
    else
      echo "$name (port $port): down"
    fi
  done
}

[ "$(id -u)" = 0 ] || die "run as root (the servers run as the postgres user)"
case "${1:-}" in
  up) up ;;
  down) down ;;
  stop-primary) stop_primary ;;
  promote) promote ;;
  status) status ;;
  *) die "usage: scripts/pg-standby.sh up|down|stop-primary|promote|status" ;;
esac
