#!/usr/bin/env bash
# Starts PostgreSQL and MariaDB when they are down and makes sure the `test` databases
# exist, so the tests run on a fresh machine. Safe to run again.
set -euo pipefail
# CI has no terminal: packages install without asking.
export DEBIAN_FRONTEND=noninteractive

# A test writes to a queue through the system's own sqlite3 (older than the bundled SQLite).
if ! command -v /usr/bin/sqlite3 >/dev/null; then
  echo "services: installing sqlite3" >&2
  apt-get install -y sqlite3 || { apt-get update && apt-get install -y sqlite3; }
fi

# The dashboard's test renders the page in headless Chromium (Debian's `chromium`).
if ! command -v chromium >/dev/null; then
  echo "services: installing chromium" >&2
  apt-get update && apt-get install -y chromium
fi

# The PgBouncer tests start a PgBouncer of their own (Debian's `pgbouncer`) in front of
# PostgreSQL; nothing here starts one.
if ! command -v pgbouncer >/dev/null && ! [ -x /usr/sbin/pgbouncer ]; then
  echo "services: installing pgbouncer" >&2
  apt-get install -y pgbouncer || { apt-get update && apt-get install -y pgbouncer; }
fi

wait_for() { # name, command...
  local name=$1; shift
  for _ in $(seq 1 60); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    sleep 1
  done
  echo "services: $name did not come up within 60 s" >&2
  return 1
}

pg_up() { pg_isready -q -h 127.0.0.1 -p 5432; }
if ! pg_up; then
  echo "services: starting PostgreSQL" >&2
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n 1)" main start
  wait_for PostgreSQL pg_up
fi
if ! psql -h 127.0.0.1 -U postgres -d postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'test'" | grep -q 1; then
  createdb -h 127.0.0.1 -U postgres test
fi

maria_up() { mariadb-admin -h 127.0.0.1 -P 3306 -u root ping; }
if ! maria_up >/dev/null 2>&1; then
  echo "services: starting MariaDB" >&2
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd
  wait_for MariaDB maria_up
fi
mariadb -h 127.0.0.1 -P 3306 -u root -e "CREATE DATABASE IF NOT EXISTS test"
# Many tests run at once, each with listeners and pools.
mariadb -h 127.0.0.1 -P 3306 -u root -e "SET GLOBAL max_connections = GREATEST(@@GLOBAL.max_connections, 500)"
psql -h 127.0.0.1 -U postgres -d test -tAc "SHOW max_connections" >/dev/null
