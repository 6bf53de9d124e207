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
  # By the shared server's pid file: the throwaway servers the tests start (binlog.sh,
  # galera.sh) run the same binary, and are not it.
  mkdir -p /run/mysqld && chown mysql:mysql /run/mysqld 2>/dev/null || true
  start-stop-daemon --start --oknodo --background --pidfile /run/mysqld/mysqld.pid --exec /usr/sbin/mariadbd
  wait_for MariaDB maria_up
fi
mariadb -h 127.0.0.1 -P 3306 -u root -e "CREATE DATABASE IF NOT EXISTS test"
# Many tests run at once, each with listeners and pools.
mariadb -h 127.0.0.1 -P 3306 -u root -e "SET GLOBAL max_connections = GREATEST(@@GLOBAL.max_connections, 500)"
psql -h 127.0.0.1 -U postgres -d test -tAc "SHOW max_connections" >/dev/null

# The relay's tests (crates/rowbus-relay, crates/rowbus-cli/tests/relay_cli.rs) talk to the
# message brokers every development and CI machine runs: NATS with JetStream, RabbitMQ,
# Redis and Mosquitto. Each one that is down is started as the machine starts it; at the
# end, those still missing are named, and this fails.
port_up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
nats_up() { port_up 4222; }
rabbitmq_up() { port_up 5672; }
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping | grep -q PONG; }
mosquitto_up() { port_up 1883; }
missing=()
broker() { # name, check, binary, start command...
  local name=$1 check=$2 binary=$3; shift 3
  if "$check" >/dev/null 2>&1; then return 0; fi
  if ! command -v "$binary" >/dev/null && ! [ -x "$binary" ]; then
    echo "services: $name is down and not installed ($binary)" >&2
    missing+=("$name")
    return 0
  fi
  echo "services: starting $name" >&2
  "$@" >/dev/null 2>&1 || true
  wait_for "$name" "$check" || missing+=("$name")
}
mkdir -p /var/lib/redis /var/log/redis 2>/dev/null || true
broker "NATS (127.0.0.1:4222, JetStream)" nats_up /usr/sbin/nats-server \
  start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- \
  -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log
broker "Redis (127.0.0.1:6379)" redis_up redis-server \
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
  --dir /var/lib/redis --logfile /var/log/redis/ci.log
broker "RabbitMQ (127.0.0.1:5672)" rabbitmq_up rabbitmq-server rabbitmq-server -detached
broker "Mosquitto (127.0.0.1:1883)" mosquitto_up mosquitto mosquitto -d -c /etc/mosquitto/mosquitto.conf
if [ "${#missing[@]}" -gt 0 ]; then
  printf 'services: missing: %s\n' "${missing[@]}" >&2
  exit 1
fi
