#!/usr/bin/env bash
# A throwaway PostgreSQL with production settings (autovacuum on, naptime 10 s): what the
# shared server (autovacuum off) cannot show, such as a queue under a horizon held open by
# another transaction. Data under $PG_THROWAWAY_DIR (/tmp/rowbus-pgx), one directory per
# port, trust authentication, a `test` database. Needs root (the server runs as `postgres`).
#
#   scripts/pg-throwaway.sh up PORT     a new server on 127.0.0.1:PORT, or nothing when it runs
#   scripts/pg-throwaway.sh down PORT   stop it and remove its data
#   scripts/pg-throwaway.sh status PORT running or not
set -euo pipefail

BASE=${PG_THROWAWAY_DIR:-/tmp/rowbus-pgx}
WAIT=${PG_THROWAWAY_WAIT:-60}

die() { echo "pg-throwaway: $*" >&2; exit 1; }

bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
[ -n "$bin" ] || die "no PostgreSQL server under /usr/lib/postgresql (Debian's postgresql)"

as_pg() { runuser -u postgres -- "$@"; }
ctl() { as_pg "$bin/pg_ctl" "$@"; }

up() { # port
  local dir=$BASE/$1
  if ctl status -D "$dir/data" >/dev/null 2>&1; then
    echo "pg-throwaway: already running on 127.0.0.1:$1" >&2
    return 0
  fi
  down "$1" quiet
  mkdir -p "$dir"
  chown postgres:postgres "$BASE" "$dir"
  as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth=trust --no-sync >"$dir/initdb.log" 2>&1 ||
    { cat "$dir/initdb.log" >&2; die "initdb failed"; }
  # What a production server runs with, as far as a queue is concerned: autovacuum on and
  # looking every 10 s (PostgreSQL's default naptime is a minute), durable commits.
  cat >>"$dir/data/postgresql.conf" <<EOF
autovacuum = on
autovacuum_naptime = 10s
shared_buffers = 128MB
max_connections = 100
EOF
  ctl start -w -t "$WAIT" -D "$dir/data" -l "$dir/server.log" \
    -o "-p $1 -k $dir -c listen_addresses=127.0.0.1" >/dev/null ||
    { tail -n 20 "$dir/server.log" >&2; die "the server did not start"; }
  psql -X -q -h 127.0.0.1 -p "$1" -U postgres -d postgres -c "CREATE DATABASE test" >/dev/null ||
    die "cannot create the test database"
  echo "pg-throwaway: running on 127.0.0.1:$1" >&2
}

down() { # port [quiet]
  local dir=$BASE/$1
  if ctl status -D "$dir/data" >/dev/null 2>&1; then
    ctl stop -m immediate -D "$dir/data" >/dev/null || true
  fi
  rm -rf "$dir"
  [ "${2:-}" = quiet ] || echo "pg-throwaway: stopped 127.0.0.1:$1" >&2
}

status() { # port
  if ctl status -D "$BASE/$1/data" >/dev/null 2>&1; then echo "running on 127.0.0.1:$1"; else echo "down"; fi
}

[ "$(id -u)" = 0 ] || die "run as root (the server runs as the postgres user)"
[ -n "${2:-}" ] || die "usage: scripts/pg-throwaway.sh up|down|status PORT"
case "$2" in *[!0-9]*) die "PORT must be a number: $2" ;; esac
case "$1" in
  up) up "$2" ;;
  down) down "$2" ;;
  status) status "$2" ;;
  *) die "usage: scripts/pg-throwaway.sh up|down|status PORT" ;;
esac
